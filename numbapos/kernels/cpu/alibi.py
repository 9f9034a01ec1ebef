"""CPU kernels for ALiBi: attention biases linear in the query-key distance, and the
gradient of their slopes.

Launchers (``__all__``, twinned in ``kernels/cuda/alibi.py``) take validated
arrays. The bias of head ``h`` at query ``i`` and key ``j`` (batch row ``b``) is
``slopes[h] * dist``, where ``dist`` is an integer:

- mode 0 (symmetric, flash-attention's bidirectional form): ``-|i + shift - j|``
  with ``shift = Lk - Lq``;
- mode 1 (MPT): ``j - shift`` with ``shift = Lk - 1``;
- mode 2 (BLOOM): ``positions[b, j]``, the key's position from the attention mask.

The product is formed in float64, where it is exact for float32 slopes
(``|dist| < 2**29``), then rounded once to the data's dtype: the bits of a
float32 ``slope * dist``. The slope gradient ``sum over b, i, j of grad * dist``
is summed in float64 in a fixed order (per head and key column over ``b, i``,
then over the columns), the same on every thread count and on the GPU.
"""

import numpy as np
from numba import prange

from .arrays import pick
from .jit import kernel

__all__ = ["alibi_add_", "alibi_fill", "alibi_slope_grad"]

# ---------------------------------------------------------------- launchers


def alibi_fill(slopes, positions, mode, shift, out):
    """``out[b, h, i, j] = slopes[h] * dist(b, i, j)`` for ``out`` of shape ``(Bb, H, Q, Lk)``.

    ``positions`` is an ``(Bb, Lk)`` int64 array (mode 2) or None.
    """
    if out.size:
        pick(_fill, out.size)(slopes, positions, mode, shift, out)


def alibi_add_(scores, slopes, positions, mode, shift):
    """``scores[b, h, i, j] += slopes[h] * dist(b, i, j)`` (the bias rounded to the dtype first).

    ``positions`` is ``(1 or B, Lk)`` int64 (mode 2) or None.
    """
    if scores.size:
        pick(_add, scores.size)(scores, slopes, positions, mode, shift)


def alibi_slope_grad(grad, positions, mode, shift, partial, out):
    """``out[h] = sum over b, i, j of grad[b, h, i, j] * dist(b, i, j)``.

    ``partial`` is float64 scratch of shape ``(H, Lk)``: column sums over
    ``(b, i)`` in order, then added over ``j`` in order into ``out`` (``(H,)``).
    """
    if out.size:
        pick(_slope_grad, grad.size)(grad, positions, mode, shift, partial, out)


# ---------------------------------------------------------------- kernels


@kernel(inline="always")
def _distance(positions, mode, shift, pb, i, j):
    if positions is not None:
        return positions[pb, j]
    if mode == 0:
        return -abs(i + shift - j)
    return j - shift


@kernel(parallel=True)
def _fill(slopes, positions, mode, shift, out):
    """One ``(b, h)`` plane per iteration, the planes split across threads."""
    heads = out.shape[1]
    for k in prange(out.shape[0] * heads):
        b = k // heads
        h = k - b * heads
        pb = 0 if positions is None or positions.shape[0] == 1 else b
        slope = np.float64(slopes[h])
        for i in range(out.shape[2]):
            row = out[b, h, i]
            for j in range(row.size):
                row[j] = slope * np.float64(_distance(positions, mode, shift, pb, i, j))


@kernel(parallel=True)
def _add(scores, slopes, positions, mode, shift):
    """One ``(b, h)`` plane per iteration, the planes split across threads."""
    heads = scores.shape[1]
    for k in prange(scores.shape[0] * heads):
        b = k // heads
        h = k - b * heads
        pb = 0 if positions is None or positions.shape[0] == 1 else b
        slope = np.float64(slopes[h])
        for i in range(scores.shape[2]):
            row = scores[b, h, i]
            for j in range(row.size):
                bias = row.dtype.type(slope * np.float64(_distance(positions, mode, shift, pb,
                                                                    i, j)))
                row[j] += bias


@kernel(parallel=True)
def _slope_grad(grad, positions, mode, shift, partial, out):
    """One head per iteration, the heads split across threads."""
    for h in prange(grad.shape[1]):
        acc = partial[h]
        for j in range(acc.size):
            acc[j] = 0.0
        for b in range(grad.shape[0]):
            pb = 0 if positions is None or positions.shape[0] == 1 else b
            for i in range(grad.shape[2]):
                row = grad[b, h, i]
                for j in range(acc.size):
                    acc[j] += np.float64(row[j]) * np.float64(_distance(positions, mode, shift,
                                                                        pb, i, j))
        total = 0.0
        for j in range(acc.size):
            total += acc[j]
        out[h] = total
