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

The gather and the segment sums move rows by 16-byte loads and stores
(:mod:`.vector`: ``ld.global.v4.f32``, several vectors in flight per thread)
where :func:`.vector.aligned` holds for the arrays they read and write
(16-byte aligned pointers and row strides, whole vectors per row: D % 4 == 0
for float32), and by elements otherwise: each kernel factory compiles both
from one body, the lane count a compile-time argument. Both give the same
bits (the segment sums add the same terms in the same order, lane by lane).
The vector segment sum is float32 only.

A bfloat16 / float16 table (``fmt`` :class:`~numbapos._args.TableFormat` ``BF16`` /
``F16``, a compile-time argument of the gather) arrives as its ``uint16`` bits, a
float32 output as ``uint32`` bits; the conversions are the exact ones of
:mod:`numbapos.kernels.halfbits`. A lookup copies 16-bit rows (by the vector gather,
8 values a vector) or widens them (8 columns a thread where aligned: one 16-byte
load, two 16-byte stores of their float32 bits). Its max-norm sums each row in
column order in every thread (the CPU's bits) and stores the clipped float32 values
rounded to nearest even.
"""

import math
from functools import cache

import numpy as np
from numba import cuda, float64, int64

from ..._args import NormKind, TableFormat
from ..._gpuhost.launch import launch
from ..halfbits import f32_value_bits, half_from_f32_bits, half_to_f32_bits, half_value
from . import errors, grouping, vector
from .arrays import MAX_BLOCKS, THREADS, absent, copy_into, grid
from .fpmath import cast_like, mul_rn
from .reduce import block_max, block_sum, tree_threads
from .vector import load_lanes, per_lane, row_threads, store_lanes

__all__ = ["check_indices", "gather_rows", "gather_rows_checked", "group_rows",
           "not_equal_mask", "renorm_used_rows_", "scatter_rows", "sum_row_groups"]

# The renorm kernels' branches on norm_type (NormKind), as ints for the kernel sources.
_NORM_INF = int(NormKind.INF)
_NORM_2 = int(NormKind.L2)
_NORM_1 = int(NormKind.L1)
_NORM_P = int(NormKind.P)

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


def gather_rows(flat, weight, out, fmt=TableFormat.FLOAT, snapshot=None):
    """``out[i] = weight[flat[i]]`` for a flat index array and an ``(N, D)`` ``out``.

    With ``fmt`` ``BF16`` / ``F16`` ``weight`` is the table's ``uint16`` bits: a
    ``uint16`` ``out`` gets the rows copied, a ``uint32`` one their float32 bits.
    Indices are checked as they are read: a bad one is recorded as the
    deferred error and its output row is zero-filled. ``snapshot``: a ``(N,)`` array of
    ``flat``'s dtype that gets each index as the kernel reads it (a backward's copy of
    them, written by the same launch), or None.
    """
    if flat.size == 0:
        return
    if weight.shape[1] == 0:
        if snapshot is not None:
            copy_into(snapshot, flat)  # no rows to gather: no kernel to write it
        return
    word, host = errors.words()
    if fmt != TableFormat.FLOAT and out.dtype != weight.dtype:  # 16-bit rows widened
        lanes, unroll = (8 if vector.aligned(weight, out) else 1), 1  # 8: 1 load, 2 stores
    else:  # rows copied (16-bit ones too)
        fmt = TableFormat.FLOAT
        vectors = out.dtype == weight.dtype and vector.aligned(weight, out)
        lanes, unroll = (vector.lanes(weight.dtype), 2) if vectors else (1, 4)
    launch(_gather_kernel(int(fmt), lanes, unroll), min(flat.size, MAX_BLOCKS),
           row_threads(weight.shape[1] // lanes, unroll), flat, weight, out,
           absent(flat.dtype) if snapshot is None else snapshot, word, host, errors.tag())
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
        launch(_renorm_half_rows, blocks, row_threads(dim), weight, *args, int64(fmt),
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


def _launch_sum(grad, groups, dense, scale_grad_by_freq, out):
    """One block per group sums its positions into ``out`` (row ``rows[j]`` when ``dense``),
    by float32 vectors (4 columns a thread) where :func:`.vector.aligned` allows."""
    n, dim = groups.order.size, grad.shape[1]
    if n and dim:
        vectors = (grad.dtype == np.float32 and out.dtype == np.float32
                   and vector.aligned(grad, out))
        lanes = 4 if vectors else 1
        launch(_sum_kernel(lanes), min(n, MAX_BLOCKS), row_threads(dim // lanes), grad, groups,
               bool(dense), bool(scale_grad_by_freq), out, errors.device_word())


# ---------------------------------------------------------------- kernels


@cuda.jit
def _check_indices(flat_idx, size, word, host, which):
    """Record the first index of ``flat_idx`` outside ``[0, size)`` (elementwise)."""
    for i in range(cuda.grid(1), flat_idx.size, cuda.gridsize(1)):
        errors.checked(word, host, flat_idx[i], i, size, which)


@cuda.jit(device=True)
def _copied(lane, values, fmt):
    return values[lane]


@cuda.jit(device=True)
def _widened(lane, values, fmt):
    return half_to_f32_bits(values[lane], fmt)


@cache
def _gather_kernel(fmt, lanes, unroll):
    """``out[i, :] = weight[flat_idx[i], :]``, each thread moving ``lanes`` adjacent columns
    at a time (1, or one 16-byte vector: the launcher checked :func:`.vector.aligned`) and
    loading ``unroll`` such groups, ``blockDim`` groups apart, before it stores them
    (Numba must assume ``out`` may alias ``weight``, and would otherwise wait for each
    load's store). ``fmt`` FLOAT copies the rows; BF16 / F16 widens a 16-bit table's
    bits into a ``uint32`` ``out`` (their float32 bits)."""
    convert = _copied if fmt == int(TableFormat.FLOAT) else _widened

    @cuda.jit(device=True)
    def load(g, weight, row, v, step):
        return load_lanes(weight, row, (v + g * step) * lanes, lanes)

    @cuda.jit(device=True)
    def store(g, out, i, v, step, groups):
        store_lanes(out, i, (v + g * step) * lanes, per_lane(convert, lanes, groups[g], fmt))
        return g

    @cuda.jit
    def _gather_rows(flat_idx, weight, out, snapshot, word, host, which):
        """One block per output row, threads along D. The id is read once per row and
        checked (a bad one is recorded and its row zero-filled); a non-empty ``snapshot``
        gets it (thread 0), bad ones too."""
        dim = weight.shape[1]
        vectors = dim // lanes
        step = cuda.blockDim.x
        for i in range(cuda.blockIdx.x, flat_idx.size, cuda.gridDim.x):
            if cuda.threadIdx.x == 0 and snapshot.size:
                snapshot[i] = flat_idx[i]
            row = errors.checked(word, host, flat_idx[i], i, weight.shape[0], which)
            if row < 0:
                for d in range(cuda.threadIdx.x, dim, step):
                    out[i, d] = 0
                continue
            if unroll == 1:  # a counted loop, which NVVM unrolls as it sees fit
                for v in range(cuda.threadIdx.x, vectors, step):
                    store(0, out, i, v, step, (load(0, weight, row, v, step),))
                continue
            v = cuda.threadIdx.x
            while v + (unroll - 1) * step < vectors:
                groups = per_lane(load, unroll, weight, row, v, step)
                per_lane(store, unroll, out, i, v, step, groups)
                v += unroll * step
            while v < vectors:  # the last (fewer than unroll) groups
                store(0, out, i, v, step, (load(0, weight, row, v, step),))
                v += step

    return _gather_rows


@cuda.jit(device=True)
def _norm(total, kind, norm_type):
    """The ``norm_type``-norm from its row total (the sum of powers, or the maximum)."""
    if kind == _NORM_2:
        return math.sqrt(total)
    if kind == _NORM_P:
        return total ** (1.0 / norm_type)
    return total


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
        norm = _norm(total, kind, norm_type)
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
        norm = _norm(acc, kind, norm_type)
        cuda.syncthreads()  # every thread has read the row before any writes it
        if norm > max_norm:
            scale = np.float32(max_norm / (norm + 1e-7))
            for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
                value = np.float32(half_value(table[row, d], fmt) * scale)
                table[row, d] = half_from_f32_bits(f32_value_bits(value), fmt)
        cuda.syncthreads()


@cache
def _sum_kernel(lanes):
    """:func:`_sum_row_segments` with each thread owning ``lanes`` adjacent columns (1, or 4
    by 16-byte float32 vectors: the launcher checked :func:`.vector.aligned`)."""

    @cuda.jit
    def _sum_row_segments(grad, groups, dense, scale_by_freq, out, word):
        """Deterministic scatter-add, the CPU's ``_sum_row_segments`` by blocks, over the
        :class:`~numbapos._args.RowGroups` ``groups``.

        Present row ``j`` (output row ``rows[j]`` when ``dense``, else ``j``) is owned by
        one block; each thread owns some columns and sums them over the row's segment
        with :func:`segment_sums`: the same additions in the same order as the CPU,
        hence the same bits. ``used[0]`` groups are real; nothing is written while an
        index error is pending.
        """
        if errors.is_pending(word):
            return
        for j in range(cuda.blockIdx.x, groups.used[0], cuda.gridDim.x):
            target = groups.rows[j] if dense else j
            for v in range(cuda.threadIdx.x, grad.shape[1] // lanes, cuda.blockDim.x):
                store_lanes(out, target, v * lanes, segment_sums(
                    grad, groups.order, groups.starts[j], groups.counts[j], scale_by_freq,
                    v * lanes, lanes))

    return _sum_row_segments


@cuda.jit(device=True)
def segment_sum(grad, order, start, count, scale_by_freq, d):
    """Column ``d`` of the sum of ``grad[order[k]]`` over ``k`` in ``start .. start + count``
    (:func:`segment_sums` of one lane): the fused optimiser updates' gradient rows."""
    return segment_sums(grad, order, start, count, scale_by_freq, d, 1)[0]


@cuda.jit(device=True)
def _term(lane, g, scale, scaled):
    """One term of a segment sum: ``g[lane] * scale`` rounded once when ``scaled``, else
    ``g[lane]``."""
    return mul_rn(g[lane], scale) if scaled else g[lane]


@cuda.jit(device=True)
def _plus_term(lane, acc, g, scale, scaled):
    return acc[lane] + _term(lane, g, scale, scaled)


@cuda.jit(device=True)
def segment_sums(grad, order, start, count, scale_by_freq, d, lanes):
    """Columns ``d .. d + lanes`` of the sum of ``grad[order[k]]`` over ``k`` in
    ``start .. start + count`` (``lanes`` 1, or 4 by 16-byte loads), as a tuple.

    The CPU's ``sum_segment`` for those columns: input order, the gradient's dtype,
    each term times ``1 / count`` (never fused into the add) with ``scale_by_freq``.
    Four rows are loaded before they are added (in order), so a row that occurs
    hundreds of times keeps several loads in flight.
    """
    first = load_lanes(grad, order[start], d, lanes)
    one = cast_like(1, first[0])
    scale = one / cast_like(count, one)
    acc = per_lane(_term, lanes, first, scale, scale_by_freq)
    end = start + count
    k = start + 1
    while k + 3 < end:
        g0 = load_lanes(grad, order[k], d, lanes)
        g1 = load_lanes(grad, order[k + 1], d, lanes)
        g2 = load_lanes(grad, order[k + 2], d, lanes)
        g3 = load_lanes(grad, order[k + 3], d, lanes)
        acc = per_lane(_plus_term, lanes, acc, g0, scale, scale_by_freq)
        acc = per_lane(_plus_term, lanes, acc, g1, scale, scale_by_freq)
        acc = per_lane(_plus_term, lanes, acc, g2, scale, scale_by_freq)
        acc = per_lane(_plus_term, lanes, acc, g3, scale, scale_by_freq)
        k += 4
    while k < end:
        acc = per_lane(_plus_term, lanes, acc, load_lanes(grad, order[k], d, lanes), scale,
                       scale_by_freq)
        k += 1
    return acc


@cuda.jit
def _not_equal_mask(flat_idx, value, out):
    """``out[i] = flat_idx[i] != value`` (elementwise)."""
    for i in range(cuda.grid(1), flat_idx.size, cuda.gridsize(1)):
        out[i] = flat_idx[i] != value
