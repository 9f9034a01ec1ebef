"""CPU kernels for embedding lookup, its gradient, max-norm clipping and the padding mask.

Kernels trust their inputs (``numbapos._checks`` has validated them) and write
into buffers the caller allocated. Index arrays are flat; row-major ``(N, D)``
views carry the embedding vectors.
"""

import numpy as np
from numba import njit, prange


@njit(cache=True, nogil=True)
def index_bounds(flat_idx):
    """Smallest and largest value of a non-empty integer array."""
    low = flat_idx[0]
    high = flat_idx[0]
    for i in range(1, flat_idx.size):
        v = flat_idx[i]
        if v < low:
            low = v
        elif v > high:
            high = v
    return low, high


@njit(cache=True, nogil=True)
def gather_rows(flat_idx, weight, out):
    """``out[i, :] = weight[flat_idx[i], :]`` (serial, for small lookups)."""
    dim = weight.shape[1]
    for i in range(flat_idx.size):
        row = flat_idx[i]
        for d in range(dim):
            out[i, d] = weight[row, d]


@njit(cache=True, nogil=True, parallel=True)
def gather_rows_parallel(flat_idx, weight, out):
    """``out[i, :] = weight[flat_idx[i], :]``, output rows split across threads."""
    dim = weight.shape[1]
    for i in prange(flat_idx.size):
        row = flat_idx[i]
        for d in range(dim):
            out[i, d] = weight[row, d]


@njit(cache=True, nogil=True)
def mark_rows(flat_idx, seen):
    """``seen[r] = True`` for every row ``r`` that ``flat_idx`` references."""
    for i in range(flat_idx.size):
        seen[flat_idx[i]] = True


@njit(cache=True, nogil=True)
def _row_norm(weight, row, norm_type):
    # Accumulated in float64: renorm touches each row once, so accuracy is free here,
    # and PyTorch's CPU norm accumulates float32 in double as well.
    dim = weight.shape[1]
    acc = 0.0
    if norm_type == np.inf:
        for d in range(dim):
            a = abs(np.float64(weight[row, d]))
            if a > acc:
                acc = a
        return acc
    if norm_type == 2.0:
        for d in range(dim):
            v = np.float64(weight[row, d])
            acc += v * v
        return np.sqrt(acc)
    if norm_type == 1.0:
        for d in range(dim):
            acc += abs(np.float64(weight[row, d]))
        return acc
    for d in range(dim):
        acc += abs(np.float64(weight[row, d])) ** norm_type
    return acc ** (1.0 / norm_type)


@njit(cache=True, nogil=True, parallel=True)
def renorm_rows_(weight, rows, max_norm, norm_type):
    """Scale each listed row whose norm exceeds ``max_norm`` by ``max_norm / (norm + 1e-7)``.

    ``rows`` must be unique, so each row is scaled once and threads never share a row.
    """
    dim = weight.shape[1]
    for j in prange(rows.size):
        row = rows[j]
        norm = _row_norm(weight, row, norm_type)
        if norm > max_norm:
            scale = weight.dtype.type(max_norm / (norm + 1e-7))
            for d in range(dim):
                weight[row, d] *= scale


@njit(cache=True, nogil=True)
def count_rows(flat_idx, counts):
    """``counts[r]`` += the number of times row ``r`` occurs in ``flat_idx``."""
    for i in range(flat_idx.size):
        counts[flat_idx[i]] += 1


@njit(cache=True, nogil=True)
def bucket_by_row(flat_idx, cursor, order):
    """Stable counting sort: positions of ``flat_idx`` grouped by row, in input order.

    ``cursor`` starts as the exclusive prefix sum of the row counts and is advanced
    in place; afterwards ``order[start[r]:start[r] + count[r]]`` lists the positions
    holding row ``r`` in increasing order.
    """
    for i in range(flat_idx.size):
        row = flat_idx[i]
        order[cursor[row]] = i
        cursor[row] += 1


@njit(cache=True, nogil=True, parallel=True)
def sum_row_segments(grad, order, seg_start, counts, rows, dest, scale_by_freq, out):
    """Deterministic scatter-add: ``out[dest[j]] = sum of grad[i] over positions i of rows[j]``.

    Each output row is owned by one thread and summed in input order, so the
    result is bit-identical for any thread count. With ``scale_by_freq`` every
    contribution is multiplied by ``1 / count`` (PyTorch's ``scale_grad_by_freq``).
    The rows named in ``dest`` are overwritten (they need no zeroing); every
    listed row must occur at least once.
    """
    dim = grad.shape[1]
    one = out.dtype.type(1)
    for j in prange(rows.size):
        row = rows[j]
        target = dest[j]
        start = seg_start[row]
        stop = start + counts[row]
        scale = one / out.dtype.type(counts[row]) if scale_by_freq else one
        first = order[start]
        for d in range(dim):
            out[target, d] = grad[first, d] * scale if scale_by_freq else grad[first, d]
        for k in range(start + 1, stop):
            i = order[k]
            if scale_by_freq:
                for d in range(dim):
                    out[target, d] += grad[i, d] * scale
            else:
                for d in range(dim):
                    out[target, d] += grad[i, d]


@njit(cache=True, nogil=True)
def not_equal_mask(flat_idx, value, out):
    """``out[i] = flat_idx[i] != value``."""
    for i in range(flat_idx.size):
        out[i] = flat_idx[i] != value
