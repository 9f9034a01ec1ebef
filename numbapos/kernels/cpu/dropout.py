"""CPU launchers and kernels for inverted dropout with a counter-based mask.

The mask bit of element ``i`` is :func:`numbapos.kernels.hash.keeps` of
``(key(seed, counter), i)``; see :mod:`numbapos.kernels.hash`.
"""

from numba import prange

from ..hash import dropout_key, keeps
from .arrays import pick
from .jit import kernel

__all__ = ["dropout_apply", "dropout_keep_mask"]


def dropout_apply(x, drop, out):
    """``out[i] = x[i] * (scale if kept(i) else 0)`` over flat ``x`` / ``out``.

    Forward and backward alike (the gradient of ``x * m`` is ``grad * m``).
    Dropped elements are multiplied by zero, so NaN and inf propagate as in
    PyTorch; ``out`` may be ``x`` itself. ``drop`` is a
    :class:`~numbapos.kernels.args.DropoutArgs`.
    """
    if x.size:
        pick(_dropout_apply, x.size)(x, drop.seed, drop.counter, drop.threshold, drop.scale,
                                     out)


def dropout_keep_mask(drop, out):
    """``out[i] = kept(i)`` over a flat bool ``out``."""
    if out.size:
        pick(_dropout_keep_mask, out.size)(drop.seed, drop.counter, drop.threshold, out)


@kernel(parallel=True)
def _dropout_apply(x, seed, counter, threshold, scale, out):
    key = dropout_key(seed, counter)
    s = out.dtype.type(scale)
    zero = out.dtype.type(0)
    for i in prange(x.size):
        out[i] = x[i] * (s if keeps(key, i, threshold) else zero)


@kernel(parallel=True)
def _dropout_keep_mask(seed, counter, threshold, out):
    key = dropout_key(seed, counter)
    for i in prange(out.size):
        out[i] = keeps(key, i, threshold)
