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
import importlib

from . import _device

__all__ = ["capture", "current_stream", "stream"]


def _backend():
    return _device.kernels_for(_device.check_device("cuda"))


def _host(name):
    """A module of the GPU host path (:mod:`numbapos._gpuhost`), once CUDA is started."""
    _backend()
    return importlib.import_module(f"numbapos._gpuhost.{name}")


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
    streams = _host("streams")
    with streams.using(streams.as_numba_stream(s, "stream")) as chosen:
        yield chosen


def current_stream():
    """The stream numbapos's GPU work goes to in this thread (``0``: the legacy default)."""
    return _host("streams").current()


def capture(step, *, warmup=1):
    """Capture one call of a training step as a CUDA graph, to replay it cheaply.

    PyTorch's recipe (``torch.cuda.graphs``) in one call: ``step`` (a function
    of no arguments running forward, backward and the optimiser step on
    CUDA arrays) runs ``warmup`` times eagerly on a side stream, so that every
    kernel is compiled and the caching allocator holds the blocks the step
    needs (a block it still lacks is allocated while capturing and kept by
    the graph); then one call is captured on that stream into a CUDA graph
    and executed. Each :meth:`CapturedStep.replay` runs the whole step again as
    one graph launch, on the current stream.

    Any memory manager works: numbapos's caching allocator, Numba's own (with
    ``NUMBAPOS_CUDA_MEMORY_POOL=0``, or where Numba made the CUDA context
    before numbapos could install the pool) or a ``NUMBA_CUDA_MEMORY_MANAGER``
    plugin. Outside the pool every array the captured call allocates comes
    from the manager (with the thread's capture mode relaxed around it) and
    stays allocated while the captured step lives, since every replay uses it.

    If the step fails while captured, the capture is ended before the error
    propagates: nothing is recorded, the stream no longer captures, and eager
    work or a new capture may follow at once.

    Inputs are static, as in PyTorch: the graph reads the arrays the captured
    call read, so copy each new batch into them (``ids.copy_to_device(batch)``)
    before a replay; outputs (``captured.outputs``, what ``step`` returned)
    are rewritten in place by each replay. What changes from step to step
    lives on the device and advances on each replay: the optimisers' step
    counts (Adam's bias correction, Adagrad's decay) and learning rates, the
    dropout counters of :class:`numbapos.nn.Dropout` and of the BERT / GPT-2
    blocks (each replay draws fresh masks), and the stochastic rounding steps
    of bfloat16 / float16 tables; a scheduler may set ``group["lr"]`` between
    replays (a replay copies it to the device), and a dropout ``counter`` or
    ``rounding_step`` set on the host between replays is copied likewise.
    The host counts draws and rounding steps itself (``Dropout.counter`` and
    the state dicts stay exact without reading the device). Results are
    bit-identical to running ``step`` eagerly the same number of times.

    On Numba's CUDA simulator (no graphs) the captured call runs eagerly while
    its launches and device copies are recorded, and each replay runs that
    record again, as a graph would (the step's Python code does not run).

    Parameters
    ----------
    step : callable
        The training step, called with no arguments. Its host code runs
        ``warmup + 1`` times here and never on a replay: keep per-step host
        logic (data loading, logging, schedulers) outside it.
    warmup : int, default 1
        Eager calls before the capture (at least 1). They are real steps:
        after ``capture`` returns the model has taken ``warmup + 1`` steps.

    Returns
    -------
    CapturedStep
        With ``replay()`` and ``outputs``.

    Raises
    ------
    TypeError, ValueError
        ``step`` is not callable, ``warmup`` is not an int >= 1.
    RuntimeError
        The step needs the host while captured: a copy between host and
        device (e.g. a SparseRows whose rows live on the host), a
        synchronisation, a dropout
        module's (or 16-bit table's) first CUDA use (its device counter is
        made then: let the warm-up make it), active
        :func:`numbapos.functional.dropout` with an integer ``counter`` or
        stochastic rounding with an integer ``rounding_step`` (host values a
        graph would bake in), dynamic NTK rotary scaling with CUDA
        ``position_ids`` and no ``seq_len``; or captures nested. The message
        names what was asked for. Also a CUDA call made in the step outside
        numbapos that stream capture refuses (``numba.cuda.synchronize``,
        ``numba.cuda.to_device``, ...): the message gives the driver's error,
        which names the call.
    IndexError
        A bad id found by the warm-up (raised as at any synchronising call).

    Examples
    --------
    >>> ids = numbapos.to_device(first_batch, "cuda")        # doctest: +SKIP
    >>> grad_y = numbapos.to_device(upstream_grad, "cuda")   # doctest: +SKIP
    >>> def step():  # doctest: +SKIP
    ...     y = model(ids)
    ...     model.backward(grad_y)
    ...     opt.step()
    ...     model.zero_grad()
    >>> captured = numbapos.cuda.capture(step)  # doctest: +SKIP
    >>> for batch in batches:  # doctest: +SKIP
    ...     ids.copy_to_device(batch)
    ...     captured.replay()
    """
    return _host("graphs").capture(step, warmup=warmup)


def __getattr__(name):
    if name == "CapturedStep":  # the class capture returns, imported with the backend
        return _host("graphs").CapturedStep
    raise AttributeError(f"module 'numbapos.cuda' has no attribute {name!r}")
