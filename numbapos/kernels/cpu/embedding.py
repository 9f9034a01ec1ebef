"""CPU launchers and kernels for embedding lookup, its gradient, max-norm clipping
and the padding mask.

Launchers (the names in ``__all__``, twinned in ``kernels/cuda/embedding.py``)
take validated arrays and caller-owned outputs; index arrays arrive flat.
The ``@njit`` bodies below them trust their inputs and never allocate.
"""

import threading

import numpy as np
from numba import njit, prange

from ..._args import RowGroups
from .arrays import pick
from .prefetch import AHEAD, prefetch_listed, prefetch_listed_for_write

__all__ = ["gather_rows", "gather_rows_checked", "group_rows", "index_bounds", "not_equal_mask",
           "renorm_used_rows_", "scatter_rows", "scatter_rows_sparse", "sum_row_groups"]

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


def unique_rows(flat):
    """The distinct values of ``flat`` in order of first occurrence (int64).

    A hash pass over the indices: O(len(flat)) time and scratch, whatever the
    table's size, so lookups into a table of 1e8 rows cost what they cost in
    one of 1e3.
    """
    first = _number_rows(flat)[0]
    return first.copy()


def renorm_used_rows_(weight, flat, max_norm, norm_type):
    """Clip each distinct row of ``weight`` named in ``flat`` to ``max_norm``, in place.

    A row whose ``norm_type``-norm exceeds ``max_norm`` is scaled by
    ``max_norm / (norm + 1e-7)``, once however often it repeats.
    """
    if flat.size:
        _renorm_rows_(weight, unique_rows(flat), float(max_norm), float(norm_type))


def group_by_row(flat, padding_idx):
    """Positions of ``flat`` grouped by row, in the compact space of the rows used.

    Returns ``(rows, starts, counts, order)``: ``rows`` (int64) are the distinct
    values of ``flat`` in ascending order, ``padding_idx`` left out; positions
    ``order[starts[j]:starts[j] + counts[j]]`` hold ``rows[j]``, in increasing
    order (a stable sort). Costs O(N + U log U) for N indices naming U rows,
    never O(table rows): a hash pass numbers the rows in order of first
    occurrence, the U rows are sorted, the hash gives each number its rank
    among them, and a counting sort over the ranks groups the positions.
    """
    first, slot_of, table, shift = _number_rows(flat)
    used = first.size
    rows = np.sort(first)
    rank = _scratch("rank", used)
    _rank_rows(rows, table, shift, first, rank)
    counts = np.zeros(used, dtype=np.int64)
    starts = np.empty(used, dtype=np.int64)
    order = np.empty(flat.size, dtype=np.int64)
    _bucket_by_rank(slot_of, rank, counts, starts, order, _scratch("cursor", used))
    if padding_idx is not None:
        at = int(np.searchsorted(rows, padding_idx))
        if at < used and rows[at] == padding_idx:
            keep = np.arange(used) != at
            rows, starts, counts = rows[keep], starts[keep], counts[keep]
    return rows, starts, counts, order


def scatter_rows(grad, flat, padding_idx, scale_grad_by_freq, out):
    """Dense gradient of a lookup: ``out[r] = sum of grad[i] where flat[i] == r``.

    ``out`` (``(V, D)``) arrives zero-filled (``zeros``: on the CPU the OS's
    lazily zeroed pages, so rows no index names cost nothing); only the rows
    that indices name (padding left out) are written. Positions are grouped by
    row with a stable sort (:func:`group_by_row`) and each row is summed by one
    thread in input order, so the result is bit-identical for any thread count.
    With ``scale_grad_by_freq`` each contribution is divided by its row's count.
    """
    if flat.size == 0:
        return
    rows, starts, counts, order = group_by_row(flat, padding_idx)
    if rows.size:
        _sum_row_segments(grad, order, starts, counts, rows, bool(scale_grad_by_freq), out)


def scatter_rows_sparse(grad, flat, num_rows, padding_idx, scale_grad_by_freq):
    """Row-sparse gradient of a lookup: ``(rows, values)``.

    ``rows`` (int64, unique, ascending) are the rows ``flat`` names, padding
    left out; ``values[j]`` is the sum for ``rows[j]``, as in :func:`scatter_rows`.
    Time and scratch are O(indices + rows used), independent of ``num_rows``.
    """
    groups = group_rows(flat, padding_idx)
    values = np.empty((groups.rows.size, grad.shape[1]), dtype=grad.dtype)
    sum_row_groups(grad, groups, scale_grad_by_freq, values)
    return groups.rows, values


def group_rows(flat, padding_idx):
    """:class:`~numbapos._args.RowGroups` of ``flat`` (see :func:`group_by_row`)."""
    if flat.size == 0:
        empty = np.empty(0, np.int64)
        return RowGroups(empty, empty, empty, empty)
    return RowGroups(*group_by_row(flat, padding_idx))


def sum_row_groups(grad, groups, scale_grad_by_freq, out):
    """``out[j] = sum of grad[i]`` over the positions of group ``j``, in input order.

    ``out`` is ``(len(groups.rows), D)``; with ``scale_grad_by_freq`` each term
    is divided by its group's size. The bits of :func:`scatter_rows`'s rows.
    """
    if groups.rows.size:
        dest = np.arange(groups.rows.size, dtype=np.int64)
        _sum_row_segments(grad, groups.order, groups.starts, groups.counts, dest,
                          bool(scale_grad_by_freq), out)


def _number_rows(flat):
    """``(first, slot_of, table, shift)``: the distinct rows in order of first
    occurrence, the number (index into ``first``) of each position's row, and
    the hash table that maps a row to its number (see :func:`_hash_unique`).

    All are views of this thread's scratch, valid until its next call.
    """
    bits = max(4, (2 * flat.size - 1).bit_length())  # load factor <= 1/2
    table = _scratch("table", 1 << bits)
    table.fill(-1)
    first = _scratch("first", flat.size)
    slot_of = _scratch("slot_of", flat.size)
    shift = np.uint64(64 - bits)
    count = _hash_unique(flat, table, shift, first, slot_of)
    return first[:count], slot_of, table, shift


# Per-thread int64 scratch of the grouping pass, kept between calls: fresh
# arrays of a few hundred KB are mmap'ed and page-faulted anew on every call
# (glibc), which cost as much as the hashing and counting sort themselves.
_SCRATCH_MAX = 1 << 22  # elements (32 MB); larger requests get a fresh array
_scratch_of_thread = threading.local()


def _scratch(name, size):
    """An int64 array of ``size`` elements, reused by this thread for ``name``."""
    if size > _SCRATCH_MAX:
        return np.empty(size, dtype=np.int64)
    buffers = _scratch_of_thread.__dict__
    buffer = buffers.get(name)
    if buffer is None or buffer.size < size:
        buffer = buffers[name] = np.empty(max(size, 1024), dtype=np.int64)
    return buffer[:size]


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


# A launcher that is its own kernel: small lookups cannot afford a Python frame more.
@njit(cache=True, nogil=True)
def gather_rows_checked(indices, weight, out):
    """:func:`gather_rows` for indices not range-checked yet, in one serial pass (small lookups).

    ``indices`` (C-contiguous, any shape) and ``out`` (C-contiguous,
    ``indices.shape + (D,)``) are flattened inside the kernel. Returns -1 when
    every index lies in ``[0, V)`` (``out`` then holds the rows), else the
    first flat position holding a bad one (``out`` partly written: give it a
    fresh buffer). Saves the separate bounds pass a small call cannot afford.
    """
    num_rows, dim = weight.shape
    flat_idx = indices.reshape(indices.size)
    rows = out.reshape(indices.size, dim)
    for i in range(flat_idx.size):
        row = flat_idx[i]
        if row < 0 or row >= num_rows:
            return i
        for d in range(dim):
            rows[i, d] = weight[row, d]
    return -1


@njit(cache=True, nogil=True, parallel=True)
def _gather_rows_parallel(flat_idx, weight, out):
    """``out[i, :] = weight[flat_idx[i], :]``, output rows split across threads."""
    dim = weight.shape[1]
    for i in prange(flat_idx.size):
        prefetch_listed(weight, flat_idx, i + AHEAD)
        row = flat_idx[i]
        for d in range(dim):
            out[i, d] = weight[row, d]


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
        prefetch_listed_for_write(weight, rows, j + AHEAD)
        row = rows[j]
        norm = _row_norm(weight, row, norm_type)
        if norm > max_norm:
            scale = weight.dtype.type(max_norm / (norm + 1e-7))
            for d in range(dim):
                weight[row, d] *= scale


# Fibonacci hashing: the top bits of key * 2^64 / golden ratio spread runs of
# consecutive ids over the table.
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True, nogil=True)
def _hash_unique(flat_idx, table, shift, first, slot_of):
    """Number the distinct values of ``flat_idx`` in order of first occurrence.

    ``table`` (``2 ** (64 - shift)`` long, filled with -1) maps a value to its
    number by linear probing; ``first[u]`` receives the value numbered ``u`` and
    ``slot_of[i]`` the number of ``flat_idx[i]``. Returns how many there are.
    """
    mask = np.uint64(table.size - 1)
    count = 0
    for i in range(flat_idx.size):
        key = np.int64(flat_idx[i])
        h = np.int64((np.uint64(key) * _GOLDEN) >> shift)
        while True:
            number = table[h]
            if number < 0:
                table[h] = count
                first[count] = key
                slot_of[i] = count
                count += 1
                break
            if first[number] == key:
                slot_of[i] = number
                break
            h = np.int64((np.uint64(h) + np.uint64(1)) & mask)
    return count


@njit(cache=True, nogil=True)
def _rank_rows(rows, table, shift, first, rank):
    """``rank[u] = j`` where ``rows[j]`` is the row numbered ``u`` by :func:`_hash_unique`.

    ``rows`` holds the distinct rows in ascending order; each is looked up in
    the hash ``table`` that numbered them.
    """
    mask = np.uint64(table.size - 1)
    for j in range(rows.size):
        key = rows[j]
        h = np.int64((np.uint64(key) * _GOLDEN) >> shift)
        while first[table[h]] != key:
            h = np.int64((np.uint64(h) + np.uint64(1)) & mask)
        rank[table[h]] = j


@njit(cache=True, nogil=True)
def _bucket_by_rank(slot_of, rank, counts, starts, order, cursor):
    """Stable counting sort of positions by the rank of their row among the rows used.

    ``rank[u]`` is the rank (in ascending row order) of the row numbered ``u``
    by :func:`_hash_unique`; afterwards ``order[starts[j]:starts[j] + counts[j]]``
    are the positions of the j-th smallest row, in increasing order. ``cursor``
    (as long as ``rank``) is scratch.
    """
    used = rank.size
    for i in range(slot_of.size):
        counts[rank[slot_of[i]]] += 1
    total = 0
    for j in range(used):
        starts[j] = total
        cursor[j] = total  # an explicit loop: slice assignment takes seconds to compile
        total += counts[j]
    for i in range(slot_of.size):
        j = rank[slot_of[i]]
        order[cursor[j]] = i
        cursor[j] += 1


@njit(cache=True, nogil=True, parallel=True)
def _sum_row_segments(grad, order, starts, counts, dest, scale_by_freq, out):
    """Deterministic scatter-add: ``out[dest[j]] = sum of grad[order[k]]`` over segment ``j``.

    Segment ``j`` is ``k`` in ``starts[j] .. starts[j] + counts[j]`` (never
    empty). Each output row is owned by one thread and summed in input order,
    so the result is bit-identical for any thread count. With ``scale_by_freq``
    every contribution is multiplied by ``1 / counts[j]`` (PyTorch's
    ``scale_grad_by_freq``). The rows named in ``dest`` are overwritten (they
    need no zeroing).
    """
    for j in prange(dest.size):
        prefetch_listed_for_write(out, dest, j + AHEAD)
        sum_segment(grad, order, starts[j], counts[j], scale_by_freq, out[dest[j]])


@njit(cache=True, nogil=True, inline="always")
def sum_segment(grad, order, start, count, scale_by_freq, acc):
    """``acc[:] = sum of grad[order[k]]`` for ``k`` in ``start .. start + count`` (count >= 1).

    In input order, in ``acc``'s dtype; with ``scale_by_freq`` each term is
    multiplied by ``1 / count`` first. The one definition of a row's gradient
    sum, shared by the scatter and the fused optimiser updates (same bits).
    """
    dim = grad.shape[1]
    one = acc.dtype.type(1)
    scale = one / acc.dtype.type(count) if scale_by_freq else one
    first = order[start]
    prefetch_listed(grad, order, start + AHEAD)  # positions run on into the next segments
    for d in range(dim):
        acc[d] = grad[first, d] * scale if scale_by_freq else grad[first, d]
    for k in range(start + 1, start + count):
        prefetch_listed(grad, order, k + AHEAD)
        i = order[k]
        if scale_by_freq:
            for d in range(dim):
                acc[d] += grad[i, d] * scale
        else:
            for d in range(dim):
                acc[d] += grad[i, d]


@njit(cache=True, nogil=True)
def _not_equal_mask(flat_idx, value, out):
    """``out[i] = flat_idx[i] != value``."""
    for i in range(flat_idx.size):
        out[i] = flat_idx[i] != value
