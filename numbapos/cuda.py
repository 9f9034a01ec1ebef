"""GPU streams and captured training steps.

Streams
-------
numbapos queues GPU work on Numba's legacy default stream unless a
:func:`stream` context chooses another: inside it every kernel, allocation
and copy of every numbapos op goes to that stream (ops take no ``stream=``
argument; the context is the one way, as ``torch.cuda.stream`` is)::

    s = numba.cuda.stream()               # or a cuda.core Stream, a CuPy or PyTorch stream
    with numbapos.cuda.stream(s):
        y = numbapos.functional.embedding(ids, weight)   # queued on s

The choice is per thread; contexts nest and restore the stream that was
current before them. Work on different streams is ordered only as you order
it (events, or :func:`numbapos.synchronize`, which waits for every stream).
An array made under one stream and used on another must stay alive until
that other stream's work is done, as with PyTorch's allocator: numbapos's
caching allocator hands a freed block only to the stream it was made on.
Deferred index errors (see :func:`numbapos.synchronize`) are recorded by
kernels on any stream and raised as usual.

Captured steps
--------------
:func:`capture` records one call of a whole training step (forward,
backward, optimiser step) as a CUDA graph and returns a
:class:`CapturedStep` whose :meth:`~CapturedStep.replay` runs it again for
a fraction of the launch cost. See :func:`capture`.

``import numbapos`` imports this module but never ``numba.cuda``: that happens
at the first call here.
"""

from __future__ import annotations

import contextlib

from . import _device

__all__ = ["current_stream", "stream"]


def _backend():
    return _device.kernels_for(_device.check_device("cuda"))


@contextlib.contextmanager
def stream(s):
    """Run numbapos's GPU work inside the ``with`` block on stream ``s``.

    Parameters
    ----------
    s : stream or None
        A ``numba.cuda`` stream, a ``cuda.core`` ``Stream``, or any object that
        exposes a stream handle: ``__cuda_stream__()`` (the CUDA stream
        protocol), a CuPy stream (``.ptr``) or a PyTorch stream
        (``.cuda_stream``), wrapped with ``numba.cuda.external_stream``.
        ``None`` selects Numba's legacy default stream (numbapos's default).

    Yields
    ------
    object
        The stream as Numba launches on it (``0`` for the legacy default).

    Raises
    ------
    TypeError
        ``s`` is none of the above (the error names ``stream``).
    RuntimeError
        CUDA cannot be used.

    Examples
    --------
    >>> from numba import cuda                              # doctest: +SKIP
    >>> with numbapos.cuda.stream(cuda.stream()):           # doctest: +SKIP
    ...     out = numbapos.functional.embedding(ids, weight)
    """
    K = _backend()
    with K.streams.using(K.streams.as_numba_stream(s, "stream")) as chosen:
        yield chosen


def current_stream():
    """The stream numbapos's GPU work goes to in this thread (``0``: the legacy default)."""
    return _backend().streams.current()


def __getattr__(name):
    # The capture API lives beside the backend; imported on first use.
    if name in ("CapturedStep", "capture"):
        from .kernels.cuda import graphs

        return getattr(graphs, name)
    raise AttributeError(f"module 'numbapos.cuda' has no attribute {name!r}")
