"""CPU launchers and kernels for embedding lookup, its gradient, max-norm clipping
and the padding mask.

Launchers (the names in ``__all__``, twinned in ``kernels/cuda/embedding.py``)
take validated arrays and caller-owned outputs; index arrays arrive flat.
The ``@njit`` bodies below them trust their inputs and never allocate.

Numba reads neither bfloat16 nor (on the CPU) float16, so a 16-bit table
arrives as its ``uint16`` bits with its format (``fmt``,
:class:`~numbapos._args.TableFormat`), and a float32 output as its ``uint32``
bits: a lookup into float32 is then integer work alone (a bfloat16 row widens
with a 16-bit shift, which LLVM vectorises), and one into the table's own
dtype a plain row copy. The conversions are the exact ones of
:mod:`numbapos.kernels.halfbits`, as on the GPU (same bits); their kernels
are the ``_half_*`` ones.
"""

import threading

import numpy as np
from numba import prange

from ..._args import RowGroups, TableFormat
from ..halfbits import BF16, F16, f16_to_f32_bits, half_from_f32_bits
from ..scalar import f32_bits
from ..widen import widen
from .arrays import option, pick
from .jit import kernel
from .prefetch import (
    AHEAD,
    half_prefetch_listed,
    half_prefetch_listed_for_write,
    prefetch_listed,
    prefetch_listed_for_write,
    prefetch_output_ahead,
)
from .rowcopy import copy_row, put_row, streams

__all__ = ["check_indices", "gather_rows", "gather_rows_checked", "group_rows",
           "not_equal_mask", "renorm_used_rows_", "scatter_rows", "sum_row_groups"]

NO_PADDING = -1


# ---------------------------------------------------------------- launchers


def index_bounds(flat):
    """``(min, max)`` of a non-empty 1-D integer array, as Python ints."""
    low, high = _index_bounds(flat)
    return int(low), int(high)


def check_indices(flat, size, name="indices", size_name="num_embeddings"):
    """The first position of ``flat`` whose value lies outside ``[0, size)``, or -1.

    ``name`` / ``size_name`` are for the CUDA twin, which records them with a
    bad index for the error it raises later; here the caller raises.
    """
    if flat.size == 0:
        return -1
    low, high = index_bounds(flat)
    if low >= 0 and high < size:
        return -1
    return int(np.flatnonzero((flat < 0) | (flat >= size))[0])


def gather_rows(flat, weight, out, fmt=TableFormat.FLOAT, snapshot=None):
    """``out[i] = weight[flat[i]]`` for a flat index array and an ``(N, D)`` ``out``.

    A 16-bit ``weight`` (``uint16`` bits of format ``fmt``) is copied into a
    ``uint16`` ``out``, or widened into a ``uint32`` one (a float32 array's bits).
    An ``out`` of config's ``stream_min_bytes`` (32 MiB) or more (larger than the
    last-level cache) is copied into with non-temporal stores. ``snapshot``: an array of
    ``flat``'s shape that gets a copy of it (as the CUDA twin's kernel writes it), or None.
    """
    if snapshot is not None:
        snapshot[...] = flat
    if not flat.size:
        return
    if fmt == TableFormat.FLOAT or out.dtype == np.uint16:
        copy = _gather_rows if fmt == TableFormat.FLOAT else _half_copy_rows
        pick(copy, out.size)(flat, weight, out, option(streams(out.nbytes)))
    else:
        pick(_half_widen, out.size)(flat, weight, out, option(fmt == TableFormat.F16))


def unique_rows(flat):
    """The distinct values of ``flat`` in ascending order (int64).

    O(len(flat)) time and scratch, whatever the table's size (see
    :func:`group_by_row`), so lookups into a table of 1e8 rows cost what they
    cost in one of 1e3.
    """
    return group_by_row(flat, None)[0]


def renorm_used_rows_(weight, flat, max_norm, norm_type, fmt=TableFormat.FLOAT):
    """Clip each distinct row of ``weight`` named in ``flat`` to ``max_norm``, in place.

    A row whose ``norm_type``-norm exceeds ``max_norm`` is scaled by
    ``max_norm / (norm + 1e-7)``, once however often it repeats. A 16-bit
    ``weight`` (``uint16`` bits of format ``fmt``): the norm in float64 from the
    float32 values, the scale ``float32(max_norm / (norm + 1e-7))`` applied in
    float32 and the row written back rounded to nearest even.
    """
    if not flat.size:
        return
    rows = unique_rows(flat)
    work = rows.size * weight.shape[1]
    if fmt == TableFormat.FLOAT:
        pick(_renorm_rows_, work)(weight, rows, float(max_norm), float(norm_type))
    else:
        pick(_half_renorm, work)(weight, rows, float(max_norm), float(norm_type),
                                 option(fmt == TableFormat.F16))


def group_by_row(flat, padding_idx):
    """Positions of ``flat`` grouped by row, in the compact space of the rows used.

    Returns ``(rows, starts, counts, order)``: ``rows`` (int64) are the distinct
    values of ``flat`` in ascending order, ``padding_idx`` left out; positions
    ``order[starts[j]:starts[j] + counts[j]]`` hold ``rows[j]``, in increasing
    order. A stable least-significant-digit radix sort of the positions by
    ``flat - min(flat)``: at most ``ceil(bits / 12)`` passes over the N indices
    (two for 16k ids into 50,000 or 10^7 rows, at most six for any int64
    ids), each with a histogram of at most 4,096 buckets, so it costs O(N)
    and never O(table rows); a pass whose digit is the same for every id
    moves nothing.
    """
    size = flat.size
    if size == 0:
        return tuple(np.empty(0, dtype=np.int64) for _ in range(4))
    positions = np.empty((2, size), dtype=np.int64)
    runs = np.empty((3, size), dtype=np.int64)
    keys = _scratch("keys", 2 * size).reshape(2, size)
    used, last = _radix_group(flat, _scratch("histograms", _HISTOGRAMS), keys, positions, runs)
    rows, starts, counts = runs[0, :used], runs[1, :used], runs[2, :used]
    if padding_idx is not None:
        at = int(np.searchsorted(rows, padding_idx))
        if at < used and rows[at] == padding_idx:
            keep = np.arange(used) != at
            rows, starts, counts = rows[keep], starts[keep], counts[keep]
    return rows, starts, counts, positions[last]


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
        _sum_segments(grad, order, starts, counts, rows, scale_grad_by_freq, out)


def group_rows(flat, padding_idx, num_rows):
    """:class:`~numbapos._args.RowGroups` of ``flat`` (see :func:`group_by_row`).

    ``flat`` is range-checked against ``num_rows`` already (the CUDA twin
    checks it itself); ``used`` is the number of distinct rows.
    """
    if flat.size == 0:
        empty = np.empty(0, np.int64)
        return RowGroups(empty, empty, empty, empty, 0)
    rows, starts, counts, order = group_by_row(flat, padding_idx)
    return RowGroups(rows, starts, counts, order, int(rows.size))


def sum_row_groups(grad, groups, scale_grad_by_freq, out):
    """``out[j] = sum of grad[i]`` over the positions of group ``j``, in input order.

    ``out`` is ``(len(groups.rows), D)``; with ``scale_grad_by_freq`` each term
    is divided by its group's size. The bits of :func:`scatter_rows`'s rows.
    """
    if groups.rows.size:
        dest = np.arange(groups.rows.size, dtype=np.int64)
        _sum_segments(grad, groups.order, groups.starts, groups.counts, dest,
                      scale_grad_by_freq, out)


def _sum_segments(grad, order, starts, counts, dest, scale_grad_by_freq, out):
    """``_sum_row_segments`` serial or parallel by the number of elements summed."""
    kernel = pick(_sum_row_segments, order.size * grad.shape[1])
    kernel(grad, order, starts, counts, dest, option(scale_grad_by_freq), out)


# Per-thread int64 scratch of the grouping pass, kept between calls: fresh
# arrays of a few hundred KB are mmap'ed and page-faulted anew on every call
# (glibc), which cost as much as the sort itself.
_SCRATCH_MAX = 1 << 22  # elements (32 MB); larger requests get a fresh array
_scratch_of_thread = threading.local()

# The radix sort's digits are at most 12 bits wide (a 32 KB histogram, L1-sized), so
# ids into 10^7 rows (24 bits) take two passes, not three, and int64 keys at most six;
# the histograms of all passes are kept at once.
_DIGIT_BITS = 12
_HISTOGRAMS = 6 << _DIGIT_BITS
_POSITION_MASK = (1 << 32) - 1


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


@kernel()
def _index_bounds(flat_idx):
    """Smallest and largest value of a non-empty integer array."""
    # min / max rather than branches: LLVM vectorises them (every lookup's range check).
    low = flat_idx[0]
    high = flat_idx[0]
    for i in range(1, flat_idx.size):
        v = flat_idx[i]
        low = min(low, v)
        high = max(high, v)
    return low, high


# A launcher that is its own kernel: small lookups cannot afford a Python frame more.
@kernel()
def gather_rows_checked(indices, weight, out):
    """:func:`gather_rows` for indices not range-checked yet, in one serial pass (small lookups).

    ``indices`` (any shape and layout, read in C order) and ``out``
    (C-contiguous, ``indices.shape + (D,)``) are flattened inside the kernel.
    Returns -1 when every index lies in ``[0, V)`` (``out`` then holds the
    rows), else the first flat position holding a bad one (``out`` partly
    written: give it a fresh buffer). Saves the separate bounds pass a small
    call cannot afford.
    """
    num_rows, dim = weight.shape
    rows = out.reshape(indices.size, dim)
    i = 0
    for row in indices.flat:  # any layout: the caller need not test contiguity
        if row < 0 or row >= num_rows:
            return i
        copy_row(rows, i, weight, row)
        i += 1
    return -1


@kernel(parallel=True)
def _gather_rows(flat_idx, weight, out, stream):
    """``out[i, :] = weight[flat_idx[i], :]``, output rows split across threads
    (``stream``: :func:`.rowcopy.put_row`)."""
    for i in prange(flat_idx.size):
        prefetch_listed(weight, flat_idx, i + AHEAD)
        put_row(out, i, weight, flat_idx[i], stream)


@kernel()
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
        return np.sqrt(_sum_of_squares(weight, row))
    if norm_type == 1.0:
        return _sum_of_magnitudes(weight, row)
    for d in range(dim):
        acc += abs(np.float64(weight[row, d])) ** norm_type
    return acc ** (1.0 / norm_type)


# The 1- and 2-norms' sums may be reassociated (``fastmath={"reassoc"}``, no other
# fast-math flag: infinities and NaNs keep their meaning), so LLVM sums in vector
# lanes as PyTorch's vectorised norm does. Summed in order, one running sum is a
# chain of D dependent additions, three times slower (docs/performance.rst).
@kernel(fastmath={"reassoc"})
def _sum_of_squares(weight, row):
    acc = 0.0
    for d in range(weight.shape[1]):
        v = np.float64(weight[row, d])
        acc += v * v
    return acc


@kernel(fastmath={"reassoc"})
def _sum_of_magnitudes(weight, row):
    acc = 0.0
    for d in range(weight.shape[1]):
        acc += abs(np.float64(weight[row, d]))
    return acc


@kernel(parallel=True)
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


@kernel()
def _radix_group(flat_idx, histograms, keys, positions, runs):
    """Group the positions of the non-empty ``flat_idx`` by value.

    A stable LSD radix sort of the positions by ``key = flat_idx - min``.
    Returns ``(used, last)``: ``positions[last]`` holds the positions in
    (key, position) order, and for the ``j``-th smallest of the ``used``
    values, ``runs[0, j]``, ``runs[1, j]`` and ``runs[2, j]`` are the value, the
    start and the length of its run there. ``histograms`` (_HISTOGRAMS long)
    and ``keys`` (``(2, N)``) are scratch; ``positions`` is ``(2, N)``.

    Keys of at most 31 bits (ids of any table under 2**31 rows) travel with
    their position in one int64, ``key << 32 | position``, so each pass moves
    one array, not two; wider keys
    move keys and positions side by side.
    """
    n = flat_idx.size
    low = np.int64(flat_idx[0])
    high = low
    for i in range(1, n):
        value = np.int64(flat_idx[i])
        low = min(low, value)
        high = max(high, value)
    bits = 0
    while (high - low) >> bits:
        bits += 1
    widest = 4  # narrower digits for fewer keys: a histogram no larger than the keys
    while widest < _DIGIT_BITS and (1 << widest) < n:
        widest += 1
    passes = max(1, (bits + widest - 1) // widest)
    digit = max(1, (bits + passes - 1) // passes)
    for b in range(passes << digit):
        histograms[b] = 0
    if bits <= 31 and n <= _POSITION_MASK:
        return _radix_group_packed(flat_idx, low, passes, digit, histograms, keys, positions,
                                   runs)
    return _radix_group_wide(flat_idx, low, passes, digit, histograms, keys, positions, runs)


@kernel(inline="always")
def _radix_group_packed(flat_idx, low, passes, digit, histograms, keys, positions, runs):
    # _radix_group's sort of ``key << 32 | position`` values; the order lands in positions[0].
    n = flat_idx.size
    buckets = 1 << digit
    mask = buckets - 1
    for i in range(n):
        key = np.int64(flat_idx[i]) - low
        keys[0, i] = (key << 32) | i
        for p in range(passes):
            histograms[p * buckets + ((key >> (p * digit)) & mask)] += 1
    last = 0
    for p in range(passes):
        base = p * buckets
        shift = 32 + p * digit
        if _prefix_sums(histograms, base, buckets, (keys[0, 0] >> shift) & mask, n):
            continue
        target = 1 - last
        for i in range(n):
            packed = keys[last, i]
            b = base + ((packed >> shift) & mask)
            at = histograms[b]
            histograms[b] = at + 1
            keys[target, at] = packed
        last = target
    used = 0
    previous = np.int64(-1)
    for i in range(n):
        packed = keys[last, i]
        key = packed >> 32
        positions[0, i] = packed & _POSITION_MASK
        if key != previous:
            runs[0, used] = key + low
            runs[1, used] = i
            used += 1
            previous = key
    _run_lengths(runs, used, n)
    return used, 0


@kernel(inline="always")
def _radix_group_wide(flat_idx, low, passes, digit, histograms, keys, positions, runs):
    # _radix_group's sort of keys wider than 31 bits, each pass moving keys and positions.
    n = flat_idx.size
    buckets = 1 << digit
    mask = buckets - 1
    for i in range(n):
        key = np.int64(flat_idx[i]) - low
        keys[0, i] = key
        positions[0, i] = i
        for p in range(passes):
            histograms[p * buckets + ((key >> (p * digit)) & mask)] += 1
    last = 0
    for p in range(passes):
        base = p * buckets
        shift = p * digit
        if _prefix_sums(histograms, base, buckets, (keys[0, 0] >> shift) & mask, n):
            continue
        target = 1 - last
        for i in range(n):
            key = keys[last, i]
            b = base + ((key >> shift) & mask)
            at = histograms[b]
            histograms[b] = at + 1
            keys[target, at] = key
            positions[target, at] = positions[last, i]
        last = target
    used = 0
    for i in range(n):
        if i == 0 or keys[last, i] != keys[last, i - 1]:
            runs[0, used] = keys[last, i] + low
            runs[1, used] = i
            used += 1
    _run_lengths(runs, used, n)
    return used, last


@kernel(inline="always")
def _prefix_sums(histograms, base, buckets, first_digit, n):
    # A pass's histogram turned into its buckets' starts; True (and nothing changed) when
    # every key has the digit of the first one: the pass would move nothing.
    if histograms[base + first_digit] == n:
        return True
    total = 0
    for b in range(base, base + buckets):
        count = histograms[b]
        histograms[b] = total
        total += count
    return False


@kernel(inline="always")
def _run_lengths(runs, used, n):
    for j in range(used - 1):
        runs[2, j] = runs[1, j + 1] - runs[1, j]
    runs[2, used - 1] = n - runs[1, used - 1]


@kernel(parallel=True)
def _sum_row_segments(grad, order, starts, counts, dest, scale_by_freq, out):
    """Deterministic scatter-add: ``out[dest[j]] = sum of grad[order[k]]`` over segment ``j``.

    Segment ``j`` is ``k`` in ``starts[j] .. starts[j] + counts[j]`` (never
    empty). Each output row is owned by one thread and summed in input order,
    so the result is bit-identical for any thread count. With ``scale_by_freq``
    True (None is off: :func:`.arrays.option`) every contribution is multiplied
    by ``1 / counts[j]`` (PyTorch's ``scale_grad_by_freq``). The rows named in
    ``dest`` are overwritten (they need no zeroing).
    """
    for j in prange(dest.size):
        prefetch_listed_for_write(out, dest, j + AHEAD)
        sum_segment(grad, order, starts[j], counts[j], scale_by_freq, out[dest[j]])


@kernel(inline="always")
def sum_segment(grad, order, start, count, scale_by_freq, acc):
    """``acc[:] = sum of grad[order[k]]`` for ``k`` in ``start .. start + count`` (count >= 1).

    In input order, in ``acc``'s dtype; with ``scale_by_freq`` True (None is
    off) each term is multiplied by ``1 / count`` first. The one definition of a row's gradient
    sum, shared by the scatter and the fused optimiser updates (same bits).
    """
    dim = grad.shape[1]
    first = order[start]
    prefetch_listed(grad, order, start + AHEAD)  # positions run on into the next segments
    if scale_by_freq is None:
        for d in range(dim):
            acc[d] = grad[first, d]
        for k in range(start + 1, start + count):
            prefetch_listed(grad, order, k + AHEAD)
            i = order[k]
            for d in range(dim):
                acc[d] += grad[i, d]
    else:
        scale = acc.dtype.type(1) / acc.dtype.type(count)
        for d in range(dim):
            acc[d] = grad[first, d] * scale
        for k in range(start + 1, start + count):
            prefetch_listed(grad, order, k + AHEAD)
            i = order[k]
            for d in range(dim):
                acc[d] += grad[i, d] * scale


@kernel(inline="always")
def group_gradient(grad, groups, j, scale_by_freq, acc):
    """The gradient row of group ``j`` of :class:`~numbapos._args.RowGroups`: a 1-D row.

    A row named once gets its one row of ``grad`` itself (scaled by 1 / 1
    under ``scale_by_freq``, which changes nothing); otherwise the rows are
    summed into ``acc`` by :func:`sum_segment`, which is returned. Skipping the
    copy into ``acc`` for the many rows a batch names once saves a pass over
    them; the bits are the same.
    """
    start = groups.starts[j]
    count = groups.counts[j]
    if count == 1:
        prefetch_listed(grad, groups.order, start + AHEAD)
        return grad[groups.order[start]]
    sum_segment(grad, groups.order, start, count, scale_by_freq, acc)
    return acc


@kernel()
def _not_equal_mask(flat_idx, value, out):
    """``out[i] = flat_idx[i] != value``."""
    for i in range(flat_idx.size):
        out[i] = flat_idx[i] != value


# ---------------------------------------------------------------- 16-bit tables


@kernel(inline="always")
def _half_widen_row(table, r, out, i, f16):
    # The format as a constant of each compilation (``f16`` None for bfloat16): a
    # bfloat16 row widens by a 16-bit shift, which LLVM vectorises.
    if f16 is None:
        for d in range(out.shape[1]):
            out[i, d] = np.uint32(table[r, d]) << np.uint32(16)
    else:
        for d in range(out.shape[1]):
            out[i, d] = f16_to_f32_bits(table[r, d])


@kernel(parallel=True)
def _half_widen(flat_idx, table, out, f16):
    for i in prange(flat_idx.size):
        half_prefetch_listed(table, flat_idx, i + AHEAD)
        prefetch_output_ahead(out, i)
        _half_widen_row(table, flat_idx[i], out, i, f16)


@kernel(parallel=True)
def _half_copy_rows(flat_idx, table, out, stream):
    for i in prange(flat_idx.size):
        half_prefetch_listed(table, flat_idx, i + AHEAD)
        if stream is None:  # (non-temporal stores do not wait on their lines)
            prefetch_output_ahead(out, i)
        put_row(out, i, table, flat_idx[i], stream)


@kernel(inline="always")
def _half_renorm_row(table, row, max_norm, norm_type, fmt):
    """Clip one row (see :func:`renorm_used_rows_`); the norm summed in float64, in order.
    Elements are read by their bits (:func:`~numbapos.kernels.widen.widen`, vectorised),
    not through ``ldexp`` (``half_value``), which made the pass far slower."""
    dim = table.shape[1]
    acc = 0.0
    if norm_type == np.inf:
        for d in range(dim):
            acc = max(acc, abs(np.float64(widen(table[row, d], fmt))))
        norm = acc
    elif norm_type == 2.0:
        for d in range(dim):
            a = np.float64(widen(table[row, d], fmt))
            acc += a * a
        norm = np.sqrt(acc)
    elif norm_type == 1.0:
        for d in range(dim):
            acc += abs(np.float64(widen(table[row, d], fmt)))
        norm = acc
    else:
        for d in range(dim):
            acc += abs(np.float64(widen(table[row, d], fmt))) ** norm_type
        norm = acc ** (1.0 / norm_type)
    if norm > max_norm:
        scale = np.float32(max_norm / (norm + 1e-7))
        for d in range(dim):
            value = widen(table[row, d], fmt) * scale
            # A NaN (an infinity times a zero scale) as the positive quiet NaN, whatever
            # sign the processor gives it: the bits of the CUDA kernel (f32_value_bits).
            bits = f32_bits(value) if value == value else np.uint32(0x7FC00000)
            table[row, d] = half_from_f32_bits(bits, fmt)


@kernel(inline="always")
def _half_renorm_entry(table, rows, j, max_norm, norm_type, f16):
    # The format as a constant, so each loop is compiled for one format.
    if f16 is None:
        _half_renorm_row(table, rows[j], max_norm, norm_type, BF16)
    else:
        _half_renorm_row(table, rows[j], max_norm, norm_type, F16)


@kernel(parallel=True)
def _half_renorm(table, rows, max_norm, norm_type, f16):
    for j in prange(rows.size):
        half_prefetch_listed_for_write(table, rows, j + AHEAD)
        _half_renorm_entry(table, rows, j, max_norm, norm_type, f16)
