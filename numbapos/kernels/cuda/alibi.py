"""CUDA launchers and kernels for ALiBi biases and the gradient of their slopes.

Twin of :mod:`numbapos.kernels.cpu.alibi` (same ``__all__``, signatures and
bits). The fill and the in-place add give one thread to each element, threads
along the key axis (coalesced). The slope gradient sums in the CPU's order:
one thread per (head, key column) adds ``grad * dist`` over ``b, i`` in float64
(the product through an uncontracted multiply, so no FMA changes a bit), then
one thread per head adds its columns in order; no atomics.
"""

import numpy as np
from numba import cuda, float64

from ..._args import AlibiMode
from ..._gpuhost.launch import launch
from .arrays import THREADS, absent, grid
from .fpmath import cast_like, mul_f64

__all__ = ["alibi_add_", "alibi_fill", "alibi_slope_grad"]

_SYMMETRIC = int(AlibiMode.SYMMETRIC)  # the kernels' (see numbapos._args)


def _positions(positions):
    """The kernels' ``positions``: an empty array when there are none (modes other than
    BLOOM's)."""
    return absent(np.int64, 2) if positions is None else positions


# ---------------------------------------------------------------- launchers


def alibi_fill(slopes, positions, mode, shift, out):
    """``out[b, h, i, j] = slopes[h] * dist(b, i, j)`` for ``out`` of shape ``(Bb, H, Q, Lk)``.

    ``positions`` is an ``(Bb, Lk)`` int64 array (``AlibiMode.BLOOM``) or None.
    """
    if out.size:
        launch(_fill, grid(out.size), THREADS, slopes, _positions(positions), np.int64(mode),
               np.int64(shift), out)


def alibi_add_(scores, slopes, positions, mode, shift):
    """``scores[b, h, i, j] += slopes[h] * dist(b, i, j)`` (the bias rounded to the dtype first).

    ``positions`` is ``(1 or B, Lk)`` int64 (``AlibiMode.BLOOM``) or None.
    """
    if scores.size:
        launch(_add, grid(scores.size), THREADS, scores, slopes, _positions(positions),
               np.int64(mode), np.int64(shift))


def alibi_slope_grad(grad, positions, mode, shift, partial, out):
    """``out[h] = sum over b, i, j of grad[b, h, i, j] * dist(b, i, j)``.

    ``partial`` is float64 scratch of shape ``(H, Lk)``: column sums over
    ``(b, i)`` in order, then added over ``j`` in order into ``out`` (``(H,)``).
    """
    if out.size:
        launch(_column_sums, grid(partial.size), THREADS, grad, _positions(positions),
               np.int64(mode), np.int64(shift), partial)
        launch(_head_sums, grid(out.size), THREADS, partial, out)


# ---------------------------------------------------------------- kernels


@cuda.jit(device=True)
def _distance(positions, mode, shift, b, i, j):
    if positions.size:
        pb = 0 if positions.shape[0] == 1 else b
        return positions[pb, j]
    if mode == _SYMMETRIC:
        return -abs(i + shift - j)
    return j - shift


@cuda.jit(device=True)
def _unravel(k, heads, rows, cols):
    """``(b, h, i, j)`` of flat element ``k`` of a ``(B, heads, rows, cols)`` array."""
    j = k % cols
    t = k // cols
    i = t % rows
    t = t // rows
    h = t % heads
    return t // heads, h, i, j


@cuda.jit
def _fill(slopes, positions, mode, shift, out):
    heads, rows, cols = out.shape[1], out.shape[2], out.shape[3]
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        b, h, i, j = _unravel(k, heads, rows, cols)
        dist = float64(_distance(positions, mode, shift, b, i, j))
        out[b, h, i, j] = float64(slopes[h]) * dist


@cuda.jit
def _add(scores, slopes, positions, mode, shift):
    heads, rows, cols = scores.shape[1], scores.shape[2], scores.shape[3]
    for k in range(cuda.grid(1), scores.size, cuda.gridsize(1)):
        b, h, i, j = _unravel(k, heads, rows, cols)
        dist = float64(_distance(positions, mode, shift, b, i, j))
        value = scores[b, h, i, j]
        # The product rounded on its own (as the CPU's), not fused into the add.
        scores[b, h, i, j] = value + cast_like(mul_f64(float64(slopes[h]), dist), value)


@cuda.jit
def _column_sums(grad, positions, mode, shift, partial):
    """One thread per (head, key column): the sum over ``b, i`` in order."""
    cols = partial.shape[1]
    for k in range(cuda.grid(1), partial.size, cuda.gridsize(1)):
        h = k // cols
        j = k - h * cols
        acc = float64(0.0)
        for b in range(grad.shape[0]):
            for i in range(grad.shape[2]):
                dist = float64(_distance(positions, mode, shift, b, i, j))
                acc += mul_f64(float64(grad[b, h, i, j]), dist)
        partial[h, j] = acc


@cuda.jit
def _head_sums(partial, out):
    """One thread per head: its columns added in order."""
    for h in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        total = float64(0.0)
        for j in range(partial.shape[1]):
            total += partial[h, j]
        out[h] = total
