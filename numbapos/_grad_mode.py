"""Whether training-mode forwards record what their backward needs (``numbapos.no_grad``)."""

from __future__ import annotations

import contextlib
import threading


class _GradState(threading.local):
    enabled = True


_STATE = _GradState()


def is_grad_enabled() -> bool:
    """Whether forwards on this thread record for a backward (False inside :class:`no_grad`).

    Returns
    -------
    bool
    """
    return _STATE.enabled


class no_grad(contextlib.ContextDecorator):  # noqa: N801 (PyTorch's spelling)
    """Context manager (and decorator) in which module forwards record nothing.

    Inside it a module computes its output as usual (dropout still draws its
    mask in training mode) but keeps nothing for a :meth:`~numbapos.nn.Module.backward`,
    which saves the copies of the inputs and the bookkeeping: use it for
    inference and evaluation loops, as ``torch.no_grad()``. The setting is per
    thread and nests; the previous state comes back on exit, also after an
    exception.

    Examples
    --------
    >>> import numpy as np, numbapos
    >>> emb = numbapos.nn.Embedding(10, 4, seed=0)
    >>> with numbapos.no_grad():
    ...     y = emb(np.array([1, 2]))
    >>> numbapos.is_grad_enabled()
    True

    As a decorator::

        @numbapos.no_grad()
        def evaluate(model, batch):
            return model(batch)
    """

    def __init__(self):
        self._previous: list[bool] = []

    def __enter__(self):
        self._previous.append(_STATE.enabled)
        _STATE.enabled = False
        return self

    def __exit__(self, *exc):
        _STATE.enabled = self._previous.pop()
        return False

    def _recreate_cm(self):
        return type(self)()  # a decorated function may run on several threads at once
