"""CPU launchers and kernels for embedding lookup, its gradient, max-norm clipping
and the padding mask.

Launchers (the names in ``__all__``, twinned in ``kernels/cuda/embedding.py``)
take validated arrays and caller-owned outputs; index arrays arrive flat.
The ``@njit`` bodies below them trust their inputs and never allocate.
"""

import numpy as np
from numba import njit, prange

from .arrays import pick

__all__ = ["gather_rows", "index_bounds", "not_equal_mask", "renorm_used_rows_",
           "scatter_rows", "scatter_rows_sparse"]

NO_PADDING = -1


# ---------------------------------------------------------------- launchers


def index_bounds(flat):
    """``(min, max)`` of a non-empty 1-D integer array, as Python ints."""
    low, high = _index_bounds(flat)
    return int(low), int(high)


def gather_rows(flat, weight, out):
    """``out[i] = weight[flat[i]]`` for a flat index array and an ``(N, D)`` ``out``."""
    if flat.size:
        pick(_gather_rows, _gather_rows_parallel, out.size)(flat, weight, out)


def unique_rows(flat, num_rows):
    """Sorted unique values of ``flat`` (a mark pass over ``num_rows`` flags)."""
    seen = np.zeros(num_rows, dtype=np.bool_)
    _mark_rows(flat, seen)
    return np.flatnonzero(seen)


def renorm_used_rows_(weight, flat, max_norm, norm_type):
    """Clip each distinct row of ``weight`` named in ``flat`` to ``max_norm``, in place.

    A row whose ``norm_type``-norm exceeds ``max_norm`` is scaled by
    ``max_norm / (norm + 1e-7)``, once however often it repeats.
    """
    if flat.size:
        _renorm_rows_(weight, unique_rows(flat, weight.shape[0]), float(max_norm),
                      float(norm_type))


def _group_by_row(flat, num_rows):
    """Counts per row, segment starts, and positions grouped by row in input order."""
    counts = np.zeros(num_rows, dtype=np.int64)
    _count_rows(flat, counts)
    seg_start = np.empty(num_rows, dtype=np.int64)
    seg_start[0] = 0
    np.cumsum(counts[:-1], out=seg_start[1:])
    order = np.empty(flat.size, dtype=np.int64)
    _bucket_by_row(flat, seg_start.copy(), order)
    return counts, seg_start, order


def _present_rows(counts, padding_idx):
    present = counts > 0
    if padding_idx is not None:
        present[padding_idx] = False
    return np.flatnonzero(present).astype(np.int64, copy=False)


def scatter_rows(grad, flat, padding_idx, scale_grad_by_freq, out):
    """Dense gradient of a lookup: ``out[r] = sum of grad[i] where flat[i] == r``.

    ``out`` (``(V, D)``) arrives zero-filled (``zeros``: on the CPU the OS's
    lazily zeroed pages, so rows no index names cost nothing); only the rows
    that indices name (padding left out) are written. Positions are grouped by
    row with a stable counting sort and each row is summed by one thread in
    input order, so the result is bit-identical for any thread count. With
    ``scale_grad_by_freq`` each contribution is divided by its row's count.
    """
    if flat.size == 0:
        return
    counts, seg_start, order = _group_by_row(flat, out.shape[0])
    rows = _present_rows(counts, padding_idx)
    if rows.size:
        _sum_row_segments(grad, order, seg_start, counts, rows, rows, bool(scale_grad_by_freq),
                          out)


def scatter_rows_sparse(grad, flat, num_rows, padding_idx, scale_grad_by_freq):
    """Row-sparse gradient of a lookup: ``(rows, values)``.

    ``rows`` (int64, unique, ascending) are the rows ``flat`` names, padding
    left out; ``values[j]`` is the sum for ``rows[j]``, as in :func:`scatter_rows`.
    """
    dim = grad.shape[1]
    if flat.size == 0:
        return np.empty(0, np.int64), np.empty((0, dim), grad.dtype)
    counts, seg_start, order = _group_by_row(flat, num_rows)
    rows = _present_rows(counts, padding_idx)
    values = np.empty((rows.size, dim), dtype=grad.dtype)
    if rows.size:
        dest = np.arange(rows.size, dtype=np.int64)
        _sum_row_segments(grad, order, seg_start, counts, rows, dest, bool(scale_grad_by_freq),
                          values)
    return rows, values


def not_equal_mask(flat, value, out):
    """``out[i] = flat[i] != value`` (``out`` flat bool)."""
    _not_equal_mask(flat, value, out)


# ---------------------------------------------------------------- kernels


@njit(cache=True, nogil=True)
def _index_bounds(flat_idx):
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
def _gather_rows(flat_idx, weight, out):
    """``out[i, :] = weight[flat_idx[i], :]`` (serial, for small lookups)."""
    dim = weight.shape[1]
    for i in range(flat_idx.size):
        row = flat_idx[i]
        for d in range(dim):
            out[i, d] = weight[row, d]


@njit(cache=True, nogil=True, parallel=True)
def _gather_rows_parallel(flat_idx, weight, out):
    """``out[i, :] = weight[flat_idx[i], :]``, output rows split across threads."""
    dim = weight.shape[1]
    for i in prange(flat_idx.size):
        row = flat_idx[i]
        for d in range(dim):
            out[i, d] = weight[row, d]


@njit(cache=True, nogil=True)
def _mark_rows(flat_idx, seen):
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
def _renorm_rows_(weight, rows, max_norm, norm_type):
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
def _count_rows(flat_idx, counts):
    """``counts[r]`` += the number of times row ``r`` occurs in ``flat_idx``."""
    for i in range(flat_idx.size):
        counts[flat_idx[i]] += 1


@njit(cache=True, nogil=True)
def _bucket_by_row(flat_idx, cursor, order):
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
def _sum_row_segments(grad, order, seg_start, counts, rows, dest, scale_by_freq, out):
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
def _not_equal_mask(flat_idx, value, out):
    """``out[i] = flat_idx[i] != value``."""
    for i in range(flat_idx.size):
        out[i] = flat_idx[i] != value
