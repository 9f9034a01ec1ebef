"""CUDA launchers and kernels for embedding lookup, its gradient, max-norm clipping
and the padding mask.

The twin of ``kernels/cpu/embedding.py`` (same ``__all__``, same signatures and
semantics, on Numba device arrays). Per-row kernels run one block per row
(grid-stride over rows by blocks) with the threads of a block along D, so
loads and stores coalesce.

Nothing here reads data back to the host. Kernels that read indices check
them as they go and record a bad one in the deferred error word
(:mod:`.errors`) instead of reading out of bounds; kernels that modify a
table or a gradient return at once while an error is pending. Rows are
grouped on the device (:mod:`.grouping`: a stable radix sort), the number of
distinct rows stays there, and the kernels that consume the groups read it
and exit early: each row is then summed in input order, exactly as the CPU
does, so gradients are bit-identical to the CPU's, with no float atomics.

The gather and the segment sums have a vector twin (``_gather_rows_vec``,
``_sum_row_segments_vec``) that moves rows by 16-byte loads and stores
(:mod:`.vector`: ``ld.global.v4.f32``, several vectors in flight per thread).
The launcher takes it when :func:`.vector.aligned` holds for the arrays it
reads and writes (16-byte aligned pointers and row strides, whole vectors per
row: D % 4 == 0 for float32) and falls back to the scalar kernel otherwise;
both give the same bits (the segment sums add the same terms in the same
order, lane by lane). The vector segment sum is float32 only.

A bfloat16 / float16 table (``fmt`` :class:`~numbapos._args.TableFormat` ``BF16`` /
``F16``) arrives as its ``uint16`` bits, a float32 output as ``uint32`` bits; the
conversions are the exact ones of :mod:`numbapos.kernels.halfbits`. A lookup copies
16-bit rows (by the vector gather, 8 values a vector) or widens them
(``_widen_rows_vec``: one 16-byte load of 8 values, two 16-byte stores of their
float32 bits; by elements when not aligned or D % 8 != 0). Its max-norm sums each
row in column order in every thread (the CPU's bits) and stores the clipped float32
values rounded to nearest even.
"""

import math

import numpy as np
from numba import cuda, float64, int64

from ..._args import NormKind, TableFormat
from ..halfbits import f32_value_bits, half_from_f32_bits, half_to_f32_bits, half_value
from . import errors, grouping, vector
from .arrays import MAX_BLOCKS, THREADS, grid
from .fpmath import cast_like, mul_rn
from .launch import launch
from .reduce import block_max, block_sum, tree_threads
from .vector import load16, store16

__all__ = ["check_indices", "gather_rows", "gather_rows_checked", "group_rows",
           "not_equal_mask", "renorm_used_rows_", "scatter_rows", "sum_row_groups"]

# The renorm kernels' branches on norm_type (NormKind), as ints for the kernel sources.
_NORM_INF = int(NormKind.INF)
_NORM_2 = int(NormKind.L2)
_NORM_1 = int(NormKind.L1)
_NORM_P = int(NormKind.P)

# How many columns each thread of a row copy keeps in flight (loads before stores).
_UNROLL = 4


# ---------------------------------------------------------------- launchers


def check_indices(flat, size, name="indices", size_name="num_embeddings"):
    """Check that every value of ``flat`` lies in ``[0, size)``: -1 here, always.

    The CPU twin returns the first bad position; on the GPU a bad one is
    recorded in the deferred error word (raised by a later call) and this
    returns -1 without waiting for the kernel.
    """
    if flat.size:
        word, host = errors.words()
        launch(_check_indices, grid(flat.size), THREADS, flat, int64(size), word, host,
               errors.tag(name, size_name))
        errors.after_launch()
    return -1


def gather_rows(flat, weight, out, fmt=TableFormat.FLOAT):
    """``out[i] = weight[flat[i]]`` for a flat index array and an ``(N, D)`` ``out``.

    With ``fmt`` ``BF16`` / ``F16`` ``weight`` is the table's ``uint16`` bits: a
    ``uint16`` ``out`` gets the rows copied, a ``uint32`` one their float32 bits.
    Indices are checked as they are read: a bad one is recorded as the
    deferred error and its output row is zero-filled.
    """
    if flat.size == 0 or weight.shape[1] == 0:
        return
    word, host = errors.words()
    blocks, dim = min(flat.size, MAX_BLOCKS), weight.shape[1]
    if weight.dtype == out.dtype and vector.aligned(weight, out):
        width = vector.lanes(weight.dtype)
        launch(_gather_rows_vec, blocks, _row_threads(dim // width, 2), flat, weight, out,
               width, word, host, errors.tag())
    elif fmt == TableFormat.FLOAT or out.dtype == weight.dtype:  # (16-bit rows copied)
        launch(_gather_rows, blocks, _row_threads(dim, _UNROLL), flat, weight, out, word, host,
               errors.tag())
    elif vector.aligned(weight, out):
        launch(_widen_rows_vec, blocks, _row_threads(dim // 8), flat, weight, int64(fmt), out,
               word, host, errors.tag())
    else:
        launch(_widen_rows, blocks, _row_threads(dim), flat, weight, int64(fmt), out, word,
               host, errors.tag())
    errors.after_launch()


def gather_rows_checked(indices, weight, out):
    """:func:`gather_rows` for indices not range-checked yet: -1 (always, on the GPU).

    ``indices`` (any shape) and ``out`` (``indices.shape + (D,)``) are
    C-contiguous. The CPU twin returns the first bad position; here the
    check happens in the gather itself, deferred, in one launch.
    """
    flat = indices.reshape(indices.size)
    gather_rows(flat, weight, out.reshape(flat.size, weight.shape[1]))
    return -1


def renorm_used_rows_(weight, flat, max_norm, norm_type, fmt=TableFormat.FLOAT):
    """Clip each distinct row of ``weight`` named in ``flat`` to ``max_norm``, in place.

    A row whose ``norm_type``-norm exceeds ``max_norm`` is scaled by
    ``max_norm / (norm + 1e-7)``, once however often it repeats. The distinct
    rows are found on the device (:func:`group_rows`, which also checks the
    indices); with a bad index nothing is clipped. With ``fmt`` ``BF16`` / ``F16``
    ``weight`` is the table's ``uint16`` bits: as the CPU, the norm in float64 from
    the float32 values, then ``value * float32(max_norm / (norm + 1e-7))`` in
    float32, rounded to nearest even.
    """
    if flat.size == 0 or weight.shape[1] == 0:
        return
    groups = group_rows(flat, None, weight.shape[0])
    norm_type = float(norm_type)
    blocks, dim = min(flat.size, MAX_BLOCKS), weight.shape[1]
    args = (groups.rows, groups.used, float(max_norm), norm_kind(norm_type), norm_type)
    if fmt == TableFormat.FLOAT:
        launch(_renorm_rows_, blocks, tree_threads(dim), weight, *args, errors.device_word())
    else:
        launch(_renorm_half_rows, blocks, _row_threads(dim), weight, *args, int64(fmt),
               errors.device_word())


def scatter_rows(grad, flat, padding_idx, scale_grad_by_freq, out):
    """Dense gradient of a lookup: ``out[r] = sum of grad[i] where flat[i] == r``.

    ``out`` (``(V, D)``) arrives zero-filled; only the rows that indices name
    (padding left out) are written. Positions are grouped by row on the
    device with a stable sort and each row is summed in input order, so the
    result is bit-identical to the CPU's. With ``scale_grad_by_freq`` each
    contribution is divided by its row's count.
    """
    groups = group_rows(flat, padding_idx, out.shape[0])
    _launch_sum(grad, groups, True, scale_grad_by_freq, out)


def group_rows(flat, padding_idx, num_rows):
    """:class:`~numbapos._args.RowGroups` of ``flat``, on the device, nothing read back.

    The arrays are sized by ``flat.size`` and ``used`` (a device array) says
    how many rows are real (see :mod:`.grouping`). Indices outside
    ``[0, num_rows)`` are recorded as the deferred error and grouped nowhere.
    """
    pad = -1 if padding_idx is None else int(padding_idx)
    groups = grouping.group_rows(flat, pad, num_rows, errors.tag())
    errors.after_launch()
    return groups


def sum_row_groups(grad, groups, scale_grad_by_freq, out):
    """``out[j] = sum of grad[i]`` over the positions of group ``j``, in input order.

    ``out`` has at least as many rows as the groups can have; rows past
    ``groups.used[0]`` are left as they are.
    """
    _launch_sum(grad, groups, False, scale_grad_by_freq, out)


def not_equal_mask(flat, value, out):
    """``out[i] = flat[i] != value`` (``out`` flat bool)."""
    if flat.size:
        launch(_not_equal_mask, grid(flat.size), THREADS, flat, np.int64(value), out)


# ---------------------------------------------------------------- launcher helpers


def norm_kind(norm_type: float) -> np.int64:
    """The renorm kernels' branch for a p-norm (a :class:`~numbapos._args.NormKind`, as the
    int64 kernels take): the CPU's branches on ``norm_type``."""
    if norm_type == math.inf:
        kind = NormKind.INF
    elif norm_type == 2.0:
        kind = NormKind.L2
    elif norm_type == 1.0:
        kind = NormKind.L1
    else:
        kind = NormKind.P
    return np.int64(kind)


def _row_threads(dim: int, per_thread: int = 1) -> int:
    """Threads of a per-row block without reductions: whole warps covering ``dim`` with
    ``per_thread`` columns each, at most THREADS."""
    return min(THREADS, -(-dim // (32 * per_thread)) * 32)


def _launch_sum(grad, groups, dense, scale_grad_by_freq, out):
    """One block per group sums its positions into ``out`` (row ``rows[j]`` when ``dense``)."""
    n = groups.order.size
    if n and grad.shape[1] and _vector_sum(grad, out):
        launch(_sum_row_segments_vec, min(n, MAX_BLOCKS), _row_threads(grad.shape[1] // 4),
               grad, groups, bool(dense), bool(scale_grad_by_freq), out, errors.device_word())
    elif n and grad.shape[1]:
        launch(_sum_row_segments, min(n, MAX_BLOCKS), _row_threads(grad.shape[1]), grad, groups,
               bool(dense), bool(scale_grad_by_freq), out, errors.device_word())


def _vector_sum(grad, out) -> bool:
    """Whether the segment sums can run by float32 vectors (:func:`.vector.aligned`)."""
    return (grad.dtype == np.float32 and out.dtype == np.float32
            and vector.aligned(grad, out))


# ---------------------------------------------------------------- kernels


@cuda.jit
def _check_indices(flat_idx, size, word, host, which):
    """Record the first index of ``flat_idx`` outside ``[0, size)`` (elementwise)."""
    for i in range(cuda.grid(1), flat_idx.size, cuda.gridsize(1)):
        errors.checked(word, host, flat_idx[i], i, size, which)


@cuda.jit
def _gather_rows(flat_idx, weight, out, word, host, which):
    """``out[i, :] = weight[flat_idx[i], :]``: one block per output row, threads along D.

    The id is read once per row and checked (a bad one is recorded and its
    row zero-filled). Each thread loads up to ``_UNROLL`` columns before it
    stores them, so several loads are in flight (Numba must assume ``out``
    may alias ``weight``, and would otherwise wait for each load's store).
    """
    dim = weight.shape[1]
    step = cuda.blockDim.x
    for i in range(cuda.blockIdx.x, flat_idx.size, cuda.gridDim.x):
        row = errors.checked(word, host, flat_idx[i], i, weight.shape[0], which)
        if row < 0:
            for d in range(cuda.threadIdx.x, dim, step):
                out[i, d] = 0
            continue
        d = cuda.threadIdx.x
        while d + 3 * step < dim:
            a = weight[row, d]
            b = weight[row, d + step]
            c = weight[row, d + 2 * step]
            e = weight[row, d + 3 * step]
            out[i, d] = a
            out[i, d + step] = b
            out[i, d + 2 * step] = c
            out[i, d + 3 * step] = e
            d += 4 * step
        while d < dim:
            out[i, d] = weight[row, d]
            d += step


@cuda.jit
def _gather_rows_vec(flat_idx, weight, out, width, word, host, which):
    """:func:`_gather_rows` by 16-byte vectors of ``width`` elements (the launcher checked
    :func:`.vector.aligned`): each thread loads two vectors (32 bytes) before it stores
    them. The id is read and checked once per row, as there."""
    dim = weight.shape[1]
    vectors = dim // width
    step = cuda.blockDim.x
    for i in range(cuda.blockIdx.x, flat_idx.size, cuda.gridDim.x):
        row = errors.checked(word, host, flat_idx[i], i, weight.shape[0], which)
        if row < 0:
            for d in range(cuda.threadIdx.x, dim, step):
                out[i, d] = 0
            continue
        v = cuda.threadIdx.x
        while v + step < vectors:
            a = load16(weight, row, v * width)
            b = load16(weight, row, (v + step) * width)
            store16(out, i, v * width, a)
            store16(out, i, (v + step) * width, b)
            v += 2 * step
        if v < vectors:
            store16(out, i, v * width, load16(weight, row, v * width))


@cuda.jit
def _widen_rows(flat_idx, table, fmt, out, word, host, which):
    """``out[i, :] = f32 bits of table[flat_idx[i], :]``: a block per output row."""
    dim = out.shape[1]
    for i in range(cuda.blockIdx.x, flat_idx.size, cuda.gridDim.x):
        row = errors.checked(word, host, flat_idx[i], i, table.shape[0], which)
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            if row < 0:
                out[i, d] = 0
            else:
                out[i, d] = half_to_f32_bits(table[row, d], fmt)


@cuda.jit
def _widen_rows_vec(flat_idx, table, fmt, out, word, host, which):
    """:func:`_widen_rows` by vectors (the launcher checked :func:`.vector.aligned`):
    8 columns a thread, one 16-byte load and two 16-byte stores."""
    dim = out.shape[1]
    for i in range(cuda.blockIdx.x, flat_idx.size, cuda.gridDim.x):
        row = errors.checked(word, host, flat_idx[i], i, table.shape[0], which)
        if row < 0:
            for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
                out[i, d] = 0
            continue
        for v in range(cuda.threadIdx.x, dim // 8, cuda.blockDim.x):
            d = 8 * v
            h = load16(table, row, d)
            store16(out, i, d, (half_to_f32_bits(h[0], fmt), half_to_f32_bits(h[1], fmt),
                                half_to_f32_bits(h[2], fmt), half_to_f32_bits(h[3], fmt)))
            store16(out, i, d + 4, (half_to_f32_bits(h[4], fmt), half_to_f32_bits(h[5], fmt),
                                    half_to_f32_bits(h[6], fmt), half_to_f32_bits(h[7], fmt)))


@cuda.jit
def _renorm_rows_(weight, rows, used, max_norm, kind, norm_type, word):
    """Scale each listed (unique) row whose norm exceeds ``max_norm`` by
    ``max_norm / (norm + 1e-7)``, cast to the weight's dtype first (as the CPU).

    One block per row (a power of two of threads, at most THREADS): each thread
    accumulates a strided part of the row in float64 (as the CPU), then the
    shared-memory tree of :mod:`.reduce` combines the parts. Every thread of a
    block runs the same row loop, so the barriers are reached uniformly.
    ``used[0]`` rows are listed; nothing is clipped while an index error is
    pending.
    """
    if errors.is_pending(word):
        return
    acc_s = cuda.shared.array((1, THREADS), float64)
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    dim = weight.shape[1]
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        row = rows[j]
        acc = 0.0
        for d in range(tid, dim, threads):
            a = abs(float64(weight[row, d]))
            if kind == _NORM_INF:
                if a > acc:
                    acc = a
            elif kind == _NORM_2:
                acc += a * a
            elif kind == _NORM_1:
                acc += a
            else:
                acc += a ** norm_type
        if kind == _NORM_INF:
            total = block_max(acc_s, acc, tid, threads)
        else:
            total = block_sum(acc_s, acc, tid, threads)
        if kind == _NORM_2:
            norm = math.sqrt(total)
        elif kind == _NORM_P:
            norm = total ** (1.0 / norm_type)
        else:
            norm = total
        if norm > max_norm:
            scale = cast_like(max_norm / (norm + 1e-7), weight[row, 0])
            for d in range(tid, dim, threads):
                weight[row, d] *= scale


@cuda.jit
def _renorm_half_rows(table, rows, used, max_norm, kind, norm_type, fmt, word):
    """Clip each listed (unique) row of a 16-bit table: one block per row, threads along D
    for the write."""
    if errors.is_pending(word):
        return
    dim = table.shape[1]
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        row = rows[j]
        acc = 0.0
        for d in range(dim):
            a = abs(float64(half_value(table[row, d], fmt)))
            if kind == _NORM_INF:
                acc = max(acc, a)
            elif kind == _NORM_2:
                acc += mul_rn(a, a)  # never fused into the add: the CPU's bits
            elif kind == _NORM_1:
                acc += a
            else:
                acc += a ** norm_type
        if kind == _NORM_2:
            norm = math.sqrt(acc)
        elif kind == _NORM_P:
            norm = acc ** (1.0 / norm_type)
        else:
            norm = acc
        cuda.syncthreads()  # every thread has read the row before any writes it
        if norm > max_norm:
            scale = np.float32(max_norm / (norm + 1e-7))
            for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
                value = np.float32(half_value(table[row, d], fmt) * scale)
                table[row, d] = half_from_f32_bits(f32_value_bits(value), fmt)
        cuda.syncthreads()


@cuda.jit
def _sum_row_segments(grad, groups, dense, scale_by_freq, out, word):
    """Deterministic scatter-add, the CPU's ``_sum_row_segments`` by blocks, over the
    :class:`~numbapos._args.RowGroups` ``groups``.

    Present row ``j`` (output row ``rows[j]`` when ``dense``, else ``j``) is
    owned by one block; each thread owns some columns and sums
    ``grad[order[k], d]`` for ``k`` in the row's segment, in input order, in
    the gradient's dtype: the same additions in the same order as the CPU,
    hence the same bits. With ``scale_by_freq`` every term is multiplied by
    ``1 / count`` computed in the dtype (the product never fused into the add).
    ``used[0]`` groups are real; nothing is written while an index error is
    pending.
    """
    if errors.is_pending(word):
        return
    dim = grad.shape[1]
    for j in range(cuda.blockIdx.x, groups.used[0], cuda.gridDim.x):
        target = groups.rows[j] if dense else j
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            out[target, d] = segment_sum(grad, groups.order, groups.starts[j], groups.counts[j],
                                         scale_by_freq, d)


@cuda.jit(device=True)
def segment_sum(grad, order, start, count, scale_by_freq, d):
    """Column ``d`` of the sum of ``grad[order[k]]`` over ``k`` in ``start .. start + count``.

    The CPU's ``sum_segment`` for one column: input order, the gradient's
    dtype, each term times ``1 / count`` (never fused into the add) with
    ``scale_by_freq``. Shared by the scatter and the fused optimiser updates.
    Four terms are loaded before they are added (in order), so a row that
    occurs hundreds of times keeps several loads in flight.
    """
    first = order[start]
    end = start + count
    k = start + 1
    if scale_by_freq:
        one = cast_like(1, grad[first, 0])
        scale = one / cast_like(count, one)
        acc = mul_rn(grad[first, d], scale)
        while k + 3 < end:
            g0 = grad[order[k], d]
            g1 = grad[order[k + 1], d]
            g2 = grad[order[k + 2], d]
            g3 = grad[order[k + 3], d]
            acc = acc + mul_rn(g0, scale)
            acc = acc + mul_rn(g1, scale)
            acc = acc + mul_rn(g2, scale)
            acc = acc + mul_rn(g3, scale)
            k += 4
        while k < end:
            acc = acc + mul_rn(grad[order[k], d], scale)
            k += 1
        return acc
    acc = grad[first, d]
    while k + 3 < end:
        g0 = grad[order[k], d]
        g1 = grad[order[k + 1], d]
        g2 = grad[order[k + 2], d]
        g3 = grad[order[k + 3], d]
        acc = acc + g0
        acc = acc + g1
        acc = acc + g2
        acc = acc + g3
        k += 4
    while k < end:
        acc = acc + grad[order[k], d]
        k += 1
    return acc


@cuda.jit
def _sum_row_segments_vec(grad, groups, dense, scale_by_freq, out, word):
    """:func:`_sum_row_segments` by float32 vectors: each thread owns 4 adjacent columns
    and sums them lane by lane (:func:`segment_sum4`), so the bits are the scalar ones."""
    if errors.is_pending(word):
        return
    vectors = grad.shape[1] // 4
    for j in range(cuda.blockIdx.x, groups.used[0], cuda.gridDim.x):
        target = groups.rows[j] if dense else j
        for v in range(cuda.threadIdx.x, vectors, cuda.blockDim.x):
            store16(out, target, 4 * v, segment_sum4(grad, groups.order, groups.starts[j],
                                                     groups.counts[j], scale_by_freq, 4 * v))


@cuda.jit(device=True)
def _term(g, scale, scaled):
    """One term of a segment sum: ``g * scale`` rounded once when ``scaled``, else ``g``."""
    return mul_rn(g, scale) if scaled else g


@cuda.jit(device=True)
def _add4(acc, g, scale, scaled):
    """``acc + term(g)`` lane by lane (4-tuples)."""
    return (acc[0] + _term(g[0], scale, scaled), acc[1] + _term(g[1], scale, scaled),
            acc[2] + _term(g[2], scale, scaled), acc[3] + _term(g[3], scale, scaled))


@cuda.jit(device=True)
def segment_sum4(grad, order, start, count, scale_by_freq, d):
    """Columns ``d .. d + 3`` of :func:`segment_sum` at once, by 16-byte loads.

    The same terms added in the same order in each lane as :func:`segment_sum`
    (hence the same bits); four rows' vectors (64 bytes) are loaded before
    they are added, so a row that occurs hundreds of times keeps several loads
    in flight.
    """
    first = order[start]
    end = start + count
    g = load16(grad, first, d)
    one = cast_like(1, g[0])
    scale = one / cast_like(count, one)
    acc = (_term(g[0], scale, scale_by_freq), _term(g[1], scale, scale_by_freq),
           _term(g[2], scale, scale_by_freq), _term(g[3], scale, scale_by_freq))
    k = start + 1
    while k + 3 < end:
        g0 = load16(grad, order[k], d)
        g1 = load16(grad, order[k + 1], d)
        g2 = load16(grad, order[k + 2], d)
        g3 = load16(grad, order[k + 3], d)
        acc = _add4(acc, g0, scale, scale_by_freq)
        acc = _add4(acc, g1, scale, scale_by_freq)
        acc = _add4(acc, g2, scale, scale_by_freq)
        acc = _add4(acc, g3, scale, scale_by_freq)
        k += 4
    while k < end:
        acc = _add4(acc, load16(grad, order[k], d), scale, scale_by_freq)
        k += 1
    return acc


@cuda.jit
def _not_equal_mask(flat_idx, value, out):
    """``out[i] = flat_idx[i] != value`` (elementwise)."""
    for i in range(cuda.grid(1), flat_idx.size, cuda.gridsize(1)):
        out[i] = flat_idx[i] != value
