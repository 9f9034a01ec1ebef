"""CPU kernels for resized tables and fractional positions: rows as weighted pairs of rows.

Launchers (``__all__``, twinned in ``kernels/cuda/resize.py``) take validated
arrays. ``blend_rows``: ``out[n] = w0[n] * table[i0[n]] + w1[n] * table[i1[n]]``,
formed in float64 and rounded once to the table's dtype; a zero ``w1`` copies
``table[i0[n]]`` exactly (and never reads row ``i1``). ``scale_rows``:
``out[n] = w[n] * values[n]`` (float64 product, rounded once): the weighted
gradient rows of fractional positions. Rows are independent, so results do
not depend on the thread count.
"""

import numpy as np
from numba import prange

from .arrays import pick
from .jit import kernel

__all__ = ["blend_rows", "fractional_rows", "scale_rows"]


def blend_rows(table, index0, index1, weight0, weight1, out):
    """``out[n] = weight0[n] * table[index0[n]] + weight1[n] * table[index1[n]]``.

    ``index0`` / ``index1`` are int64 and ``weight0`` / ``weight1`` float64, one
    entry per row of ``out``; every index lies in ``[0, len(table))``.
    """
    if out.size:
        pick(_blend, out.size)(table, index0, index1, weight0, weight1, out)


def fractional_rows(positions, num_positions, index0, index1, weight0, weight1):
    """The two rows and weights of float ``positions`` in a table of ``num_positions`` rows.

    Entry ``n`` of the outputs is for ``p = positions[n % positions.size]``:
    ``index0 = min(floor(p), M - 1)``, ``index1 = min(index0 + 1, M - 1)``,
    ``weight1 = p - index0``, ``weight0 = 1 - weight1``. Returns -1, or the first
    position (of ``positions``) outside ``[0, M - 1]`` (NaN included); the outputs
    are then not written.
    """
    flat = np.asarray(positions, dtype=np.float64).reshape(-1)
    bad = ~((flat >= 0) & (flat <= num_positions - 1))
    if bad.any():
        return int(np.argmax(bad))
    if index0.size:
        p = np.resize(flat, index0.size)
        i0 = np.minimum(np.floor(p).astype(np.int64), num_positions - 1)
        index0[:] = i0
        index1[:] = np.minimum(i0 + 1, num_positions - 1)
        weight1[:] = p - i0
        weight0[:] = 1.0 - (p - i0)
    return -1


def scale_rows(values, weights, out):
    """``out[n] = weights[n] * values[n]`` for ``(N, D)`` arrays and float64 ``weights``."""
    if out.size:
        pick(_scale, out.size)(values, weights, out)


@kernel(parallel=True)
def _scale(values, weights, out):
    """The rows split across threads."""
    for n in prange(out.shape[0]):
        w = weights[n]
        for d in range(out.shape[1]):
            out[n, d] = w * np.float64(values[n, d])


@kernel(parallel=True)
def _blend(table, index0, index1, weight0, weight1, out):
    """The rows split across threads; a zero ``weight1`` copies row ``index0`` as it is."""
    for n in prange(out.shape[0]):
        src0 = table[index0[n]]
        row = out[n]
        w1 = weight1[n]
        if w1 == 0.0:
            for d in range(row.size):
                row[d] = src0[d]
        else:
            src1 = table[index1[n]]
            w0 = weight0[n]
            for d in range(row.size):
                row[d] = w0 * np.float64(src0[d]) + w1 * np.float64(src1[d])
