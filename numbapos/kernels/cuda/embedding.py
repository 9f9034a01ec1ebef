"""CUDA launchers and kernels for embedding lookup, its gradient, max-norm clipping
and the padding mask.

The twin of ``kernels/cpu/embedding.py`` (same ``__all__``, same signatures and
semantics, on Numba device arrays). Per-row kernels run one block per row
(grid-stride over rows by blocks) with the threads of a block along D, so
loads and stores coalesce.

Three launchers copy the flat index array (N integers, small next to the
``N * D`` floats they move) to the host and do the data-dependent bookkeeping
there, with the CPU backend's helpers:

- :func:`renorm_used_rows_` takes the distinct rows (``np.unique``);
- :func:`scatter_rows` / :func:`scatter_rows_sparse` group positions by row
  with the CPU's stable :func:`~numbapos.kernels.cpu.embedding.group_by_row`
  (O(indices), whatever the table's size), then one block per output row sums that
  row's contributions in input order, exactly as the CPU does: the gradient is
  bit-identical to the CPU's, with no atomics.
"""

import math
import threading

import numpy as np
from numba import cuda, float64, int64

from ..._args import RowGroups
from ..cpu.embedding import group_by_row
from . import arrays
from .arrays import THREADS, grid
from .fpmath import cast_like, mul_rn

__all__ = ["gather_rows", "gather_rows_checked", "group_rows", "index_bounds", "not_equal_mask",
           "renorm_used_rows_", "scatter_rows", "scatter_rows_sparse", "sum_row_groups"]

# index_bounds reduces over at most BOUNDS_BLOCKS blocks (a number that depends on
# the array's size only, never on the GPU): one partial (min, max) pair per block,
# combined on the host.
BOUNDS_BLOCKS = 64

# Norm kinds of renorm_used_rows_ (the CPU's branches on norm_type).
_NORM_INF, _NORM_2, _NORM_1, _NORM_P = 0, 1, 2, 3


# ---------------------------------------------------------------- launchers


_BOUNDS_SCRATCH: dict = {}
_BOUNDS_LOCK = threading.Lock()


def _bounds_scratch():
    """The partials buffer of index_bounds and its pinned host twin, made once per context.

    Every call would otherwise pay a device allocation and a free (hundreds of
    microseconds through Numba's default memory manager) for 1 KiB.
    """
    context = cuda.current_context()
    scratch = _BOUNDS_SCRATCH.get(id(context))
    if scratch is None or scratch[0] is not context:
        device = arrays.empty((2, BOUNDS_BLOCKS), np.int64)
        host = cuda.pinned_array((2, BOUNDS_BLOCKS), np.int64)
        scratch = _BOUNDS_SCRATCH[id(context)] = (context, device, host)
    return scratch[1], scratch[2]


def index_bounds(flat):
    """``(min, max)`` of a non-empty 1-D integer array, as Python ints."""
    if flat.size == 0:
        raise ValueError("index_bounds: expected a non-empty array")
    blocks = min(BOUNDS_BLOCKS, -(-flat.size // THREADS))
    with _BOUNDS_LOCK:  # one scratch buffer per context, shared by the host threads
        device, host = _bounds_scratch()
        _index_bounds[blocks, THREADS](flat, device)
        device.copy_to_host(host)  # synchronous: the kernel has finished when it returns
        return int(host[0, :blocks].min()), int(host[1, :blocks].max())


def gather_rows(flat, weight, out):
    """``out[i] = weight[flat[i]]`` for a flat index array and an ``(N, D)`` ``out``."""
    if flat.size and weight.shape[1]:
        _gather_rows[grid(flat.size, 1), _row_threads(weight.shape[1])](flat, weight, out)


def gather_rows_checked(indices, weight, out):
    """:func:`gather_rows` for indices not range-checked yet: -1, or the first bad position.

    ``indices`` (any shape) and ``out`` (``indices.shape + (D,)``) are
    C-contiguous. On the GPU a bounds pass (one small copy back) runs first;
    nothing is gathered when an index is out of range.
    """
    flat = indices.reshape(indices.size)
    bad = first_out_of_range(flat, weight.shape[0])
    if bad < 0:
        gather_rows(flat, weight, out.reshape(flat.size, weight.shape[1]))
    return bad


def first_out_of_range(flat, size) -> int:
    """The first position of ``flat`` outside ``[0, size)``, or -1 (a bounds pass first)."""
    if flat.size == 0:
        return -1
    low, high = index_bounds(flat)
    if low >= 0 and high < size:
        return -1
    host = flat.copy_to_host()
    return int(np.flatnonzero((host < 0) | (host >= size))[0])


def renorm_used_rows_(weight, flat, max_norm, norm_type):
    """Clip each distinct row of ``weight`` named in ``flat`` to ``max_norm``, in place.

    A row whose ``norm_type``-norm exceeds ``max_norm`` is scaled by
    ``max_norm / (norm + 1e-7)``, once however often it repeats.
    """
    if flat.size == 0 or weight.shape[1] == 0:
        return
    # The distinct rows are found on the host, from a copy of the indices.
    rows = arrays.asarray(np.unique(flat.copy_to_host()).astype(np.int64, copy=False))
    norm_type = float(norm_type)
    if norm_type == math.inf:
        kind = _NORM_INF
    elif norm_type == 2.0:
        kind = _NORM_2
    elif norm_type == 1.0:
        kind = _NORM_1
    else:
        kind = _NORM_P
    _renorm_rows_[grid(rows.size, 1), _tree_threads(weight.shape[1])](
        weight, rows, float(max_norm), kind, norm_type)


def scatter_rows(grad, flat, padding_idx, scale_grad_by_freq, out):
    """Dense gradient of a lookup: ``out[r] = sum of grad[i] where flat[i] == r``.

    ``out`` (``(V, D)``) arrives zero-filled; only the rows that indices name
    (padding left out) are written. Positions are grouped by row with the
    CPU's stable grouping and each row is summed in input order, so the result
    is bit-identical to the CPU's. With ``scale_grad_by_freq`` each
    contribution is divided by its row's count.
    """
    groups = group_rows(flat, padding_idx)
    _launch_sum(grad, groups, True, scale_grad_by_freq, out)


def scatter_rows_sparse(grad, flat, num_rows, padding_idx, scale_grad_by_freq):
    """Row-sparse gradient of a lookup: ``(rows, values)``, both device arrays.

    ``rows`` (int64, unique, ascending) are the rows ``flat`` names, padding
    left out; ``values[j]`` is the sum for ``rows[j]``, as in :func:`scatter_rows`.
    """
    groups = group_rows(flat, padding_idx)
    values = arrays.empty((groups.rows.size, grad.shape[1]), grad.dtype)
    sum_row_groups(grad, groups, scale_grad_by_freq, values)
    return groups.rows, values


def group_rows(flat, padding_idx):
    """:class:`~numbapos._args.RowGroups` of ``flat``, as device arrays.

    The grouping runs on the host, on a copy of the indices, with the CPU's
    O(indices + rows used) :func:`~numbapos.kernels.cpu.embedding.group_by_row`;
    its four arrays go up in one copy.
    """
    if flat.size == 0:
        empty = arrays.empty((0,), np.int64)
        return RowGroups(empty, empty, empty, empty)
    rows, starts, counts, order = group_by_row(flat.copy_to_host(), padding_idx)
    m = rows.size
    packed = arrays.asarray(np.concatenate((rows, starts, counts, order)))
    return RowGroups(packed[:m], packed[m:2 * m], packed[2 * m:3 * m], packed[3 * m:])


def sum_row_groups(grad, groups, scale_grad_by_freq, out):
    """``out[j] = sum of grad[i]`` over the positions of group ``j``, in input order."""
    _launch_sum(grad, groups, False, scale_grad_by_freq, out)


def not_equal_mask(flat, value, out):
    """``out[i] = flat[i] != value`` (``out`` flat bool)."""
    if flat.size:
        _not_equal_mask[grid(flat.size), THREADS](flat, np.int64(value), out)


# ---------------------------------------------------------------- launcher helpers


def _row_threads(dim: int) -> int:
    """Threads of a per-row block without reductions: whole warps covering ``dim``, <= THREADS."""
    return min(THREADS, -(-dim // 32) * 32)


def _tree_threads(dim: int) -> int:
    """Threads of a per-row reduction block: a power of two from 32 to THREADS covering ``dim``."""
    threads = 32
    while threads < dim and threads < THREADS:
        threads *= 2
    return threads


def _launch_sum(grad, groups, dense, scale_grad_by_freq, out):
    """One block per group sums its positions into ``out`` (row ``rows[j]`` when ``dense``)."""
    m = groups.rows.size
    if m and grad.shape[1]:
        _sum_row_segments[grid(m, 1), _row_threads(grad.shape[1])](
            grad, groups.order, groups.starts, groups.counts, groups.rows, bool(dense),
            bool(scale_grad_by_freq), out)


# ---------------------------------------------------------------- kernels


@cuda.jit
def _index_bounds(flat_idx, partial):
    """Per-block ``(min, max)`` of ``flat_idx`` into ``partial[0, b]`` / ``partial[1, b]``.

    Launched with THREADS threads per block; every thread starts from
    ``flat_idx[0]`` (the array is non-empty), so idle threads are neutral.
    """
    low_s = cuda.shared.array(THREADS, int64)
    high_s = cuda.shared.array(THREADS, int64)
    tid = cuda.threadIdx.x
    low = int64(flat_idx[0])
    high = low
    for i in range(cuda.grid(1), flat_idx.size, cuda.gridsize(1)):
        v = int64(flat_idx[i])
        if v < low:
            low = v
        if v > high:
            high = v
    low_s[tid] = low
    high_s[tid] = high
    cuda.syncthreads()
    step = THREADS // 2
    while step > 0:
        if tid < step:
            if low_s[tid + step] < low_s[tid]:
                low_s[tid] = low_s[tid + step]
            if high_s[tid + step] > high_s[tid]:
                high_s[tid] = high_s[tid + step]
        cuda.syncthreads()
        step //= 2
    if tid == 0:
        partial[0, cuda.blockIdx.x] = low_s[0]
        partial[1, cuda.blockIdx.x] = high_s[0]


@cuda.jit
def _gather_rows(flat_idx, weight, out):
    """``out[i, :] = weight[flat_idx[i], :]``: one block per output row, threads along D."""
    dim = weight.shape[1]
    for i in range(cuda.blockIdx.x, flat_idx.size, cuda.gridDim.x):
        row = flat_idx[i]
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            out[i, d] = weight[row, d]


@cuda.jit
def _renorm_rows_(weight, rows, max_norm, kind, norm_type):
    """Scale each listed (unique) row whose norm exceeds ``max_norm`` by
    ``max_norm / (norm + 1e-7)``, cast to the weight's dtype first (as the CPU).

    One block per row (a power of two of threads, at most THREADS): each thread
    accumulates a strided part of the row in float64 (as the CPU), then a
    shared-memory tree combines the parts. Every thread of a block runs the
    same row loop, so the barriers are reached uniformly.
    """
    acc_s = cuda.shared.array(THREADS, float64)
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    dim = weight.shape[1]
    for j in range(cuda.blockIdx.x, rows.size, cuda.gridDim.x):
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
        acc_s[tid] = acc
        cuda.syncthreads()
        step = threads // 2
        while step > 0:
            if tid < step:
                if kind == _NORM_INF:
                    if acc_s[tid + step] > acc_s[tid]:
                        acc_s[tid] = acc_s[tid + step]
                else:
                    acc_s[tid] += acc_s[tid + step]
            cuda.syncthreads()
            step //= 2
        total = acc_s[0]
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
        cuda.syncthreads()  # everyone has read acc_s[0] before the next row overwrites it


@cuda.jit
def _sum_row_segments(grad, order, starts, counts, rows, dense, scale_by_freq, out):
    """Deterministic scatter-add, the CPU's ``_sum_row_segments`` by blocks.

    Present row ``j`` (output row ``rows[j]`` when ``dense``, else ``j``) is
    owned by one block; each thread owns some columns and sums
    ``grad[order[k], d]`` for ``k`` in the row's segment, in input order, in
    the gradient's dtype: the same additions in the same order as the CPU,
    hence the same bits. With ``scale_by_freq`` every term is multiplied by
    ``1 / count`` computed in the dtype (the product never fused into the add).
    """
    dim = grad.shape[1]
    for j in range(cuda.blockIdx.x, counts.size, cuda.gridDim.x):
        target = rows[j] if dense else j
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            out[target, d] = segment_sum(grad, order, starts[j], counts[j], scale_by_freq, d)


@cuda.jit(device=True)
def segment_sum(grad, order, start, count, scale_by_freq, d):
    """Column ``d`` of the sum of ``grad[order[k]]`` over ``k`` in ``start .. start + count``.

    The CPU's ``sum_segment`` for one column: input order, the gradient's
    dtype, each term times ``1 / count`` (never fused into the add) with
    ``scale_by_freq``. Shared by the scatter and the fused optimiser updates.
    """
    first = order[start]
    if scale_by_freq:
        one = cast_like(1, grad[first, 0])
        scale = one / cast_like(count, one)
        acc = mul_rn(grad[first, d], scale)
        for k in range(start + 1, start + count):
            acc = acc + mul_rn(grad[order[k], d], scale)
        return acc
    acc = grad[first, d]
    for k in range(start + 1, start + count):
        acc = acc + grad[order[k], d]
    return acc


@cuda.jit
def _not_equal_mask(flat_idx, value, out):
    """``out[i] = flat_idx[i] != value`` (elementwise)."""
    for i in range(cuda.grid(1), flat_idx.size, cuda.gridsize(1)):
        out[i] = flat_idx[i] != value
