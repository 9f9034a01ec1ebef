"""Positions grouped by row on the GPU: a stable radix sort, then segments, no host round trip.

The CUDA twin of the CPU's :func:`~numbapos.kernels.cpu.embedding.group_by_row`,
done with device kernels and nothing read back (PyTorch's
``embedding_dense_backward`` sorts on the device too). Positions are sorted
by the row they name with a least-significant-digit radix sort of 8-bit
digits over ``bit_length(V)`` bits only (FBGEMM also sorts only the bits a
table needs); every pass is stable, so the positions of one row stay in
input order and the sums made from them have the CPU's bits. Then the
sorted keys are cut into segments, one per distinct row.

Sizes that depend on the data stay on the device: the row list, starts and
counts are sized by their upper bound N, and ``used`` (a 2-element device
array: distinct rows, grouped positions) tells consumers where they end;
their kernels read it and skip the rest.

Index checking happens here too: a bad index is recorded in the deferred
error word (:mod:`.errors`) and grouped nowhere, like padding (key ``V``,
which sorts after every row).

Up to :data:`SMALL_MAX` positions (4,096; a BERT-base batch) one launch of one
block does it all (:func:`_group_in_block`): it reads and checks the ids,
sorts ``(row, position)`` pairs packed into one int64 each with a bitonic sort
in shared memory (the pairs are distinct, so any sort of them is a stable sort
by row), cuts the segments and writes every array of the result: no scratch,
and one allocation holds the five arrays. A sparse backward is then two
launches (group, sum) and a dense one three (zero fill, group, sum).

Above it, ``3 * ceil(bit_length(V) / 8)`` launches for the sort (histogram,
scan, scatter per pass; 2 passes for V < 65536) and 4 for the segments.
Both give the same arrays (rows past ``used`` excepted: nothing reads them).
"""

from __future__ import annotations

import numpy as np
from numba import config as numba_config
from numba import cuda, int64

from ..._args import RowGroups
from ..._gpuhost.launch import launch
from . import arrays, errors

__all__ = []  # helpers of the embedding and optimiser launchers

# Positions per block of the sort and segment kernels (one per thread) and threads
# of the one-block scan. Numba's simulator runs every thread as a Python thread:
# there, small blocks keep the tests fast and still make several blocks of small
# inputs, so the cross-block paths are tested.
_SIMULATED = bool(numba_config.ENABLE_CUDASIM)
TILE = 32 if _SIMULATED else 256
SCAN_THREADS = 32 if _SIMULATED else 1024
RADIX_BITS = 8
BINS = 1 << RADIX_BITS

# The one-block path: up to SMALL_MAX positions, each a packed int64 ``row << POSITION_BITS
# | position`` in shared memory (32 KB on a GPU, plus 8 KB of per-thread counts: within
# the 48 KB a block may have statically), SMALL_THREADS threads at most (two
# compare-exchanges a thread per bitonic step). The simulator's smaller bound leaves
# the multi-launch path to moderate test sizes.
SMALL_MAX = 256 if _SIMULATED else 4096
SMALL_THREADS = 32 if _SIMULATED else 1024
WARP = 32
SMALL_MIN_THREADS = 1 if _SIMULATED else WARP  # whole warps on a GPU (see _warp_barrier)
POSITION_BITS = (SMALL_MAX - 1).bit_length()
# Rows (and the sentinel, num_rows itself) take at most this many bits in the packed keys,
# which then stay below the sort's filler, int64's largest value.
SMALL_ROW_BITS = 62 - POSITION_BITS
_FILLER = np.iinfo(np.int64).max


def group_rows(flat, padding_idx, num_rows, which):
    """:class:`~numbapos._args.RowGroups` of the flat indices ``flat`` (device arrays).

    Rows ``rows[:used[0]]`` (ascending, padding ``padding_idx`` (-1 for none)
    and bad indices left out) each own positions
    ``order[starts[j]:starts[j] + counts[j]]`` in increasing order. Indices
    outside ``[0, num_rows)`` are recorded as the deferred error tagged
    ``which``.
    """
    n = int(flat.size)
    if n == 0:
        empty = arrays.empty((0,), np.int64)
        return RowGroups(empty, empty, empty, empty, arrays.zeros((2,), np.int64))
    if n <= SMALL_MAX and int(num_rows).bit_length() <= SMALL_ROW_BITS:
        return _group_in_one_block(flat, padding_idx, num_rows, which)
    return _group_by_radix_passes(flat, padding_idx, num_rows, which)


def _group_in_one_block(flat, padding_idx, num_rows, which):
    """:func:`group_rows` in one launch of one block (``flat.size <= SMALL_MAX``)."""
    n = int(flat.size)
    rows, starts, counts, order, used = _int64_parts((n, n, n, n, 2))
    word, host = errors.words()
    pad = int(padding_idx) if padding_idx is not None and padding_idx >= 0 else -1
    pairs = 1 << max(0, (n - 1).bit_length() - 1)  # half the sort's power-of-two size
    threads = min(SMALL_THREADS, max(SMALL_MIN_THREADS, pairs))
    launch(_group_in_block, 1, threads, flat, pad, int(num_rows), word, host, which, rows,
           starts, counts, order, used)
    return RowGroups(rows, starts, counts, order, used)


def _int64_parts(sizes):
    """Consecutive int64 device arrays of ``sizes``, views of one allocation (a view costs
    less host time than a block of the pool)."""
    block = arrays.empty((sum(sizes),), np.int64)
    parts, start = [], 0
    for size in sizes:
        if _SIMULATED:
            parts.append(block[start:start + size])
        else:
            from numba.cuda.cudadrv.devicearray import DeviceNDArray

            view = block.gpu_data.view(8 * start, 8 * (start + size))
            parts.append(DeviceNDArray((size,), (8,), block.dtype, stream=block.stream,
                                       gpu_data=view))
        start += size
    return parts


def _group_by_radix_passes(flat, padding_idx, num_rows, which):
    """:func:`group_rows` by a multi-block radix sort, then the segments (any size)."""
    n = int(flat.size)
    used = arrays.empty((2,), np.int64)  # both entries are written below
    word, host = errors.words()
    blocks = -(-n // TILE)
    passes = max(1, -(-int(num_rows).bit_length() // RADIX_BITS))
    keys = [arrays.empty((n,), np.int64), arrays.empty((n,), np.int64)]
    positions = [arrays.empty((n,), np.int64), arrays.empty((n,), np.int64)]
    hist = arrays.empty((BINS * blocks,), np.int64)
    total = arrays.empty((1,), np.int64)
    sentinel = int(num_rows)
    pad = int(padding_idx) if padding_idx is not None and padding_idx >= 0 else -1
    for p in range(passes):
        src, dst = p % 2, (p + 1) % 2
        shift = p * RADIX_BITS
        if p == 0:
            launch(_first_histogram, blocks, TILE, flat, pad, sentinel, word, host, which,
                   keys[src], hist)
        else:
            launch(_histogram, blocks, TILE, keys[src], shift, hist)
        exclusive_scan(hist, hist, total)
        launch(_scatter_digit, blocks, TILE, keys[src], positions[src], p == 0, shift, hist,
               keys[dst], positions[dst])
    keys, order = keys[passes % 2], positions[passes % 2]
    rows = arrays.empty((n,), np.int64)
    starts = arrays.empty((n,), np.int64)
    counts = arrays.empty((n,), np.int64)
    heads = arrays.empty((blocks,), np.int64)
    launch(_count_heads, blocks, TILE, keys, sentinel, heads)
    exclusive_scan(heads, heads, used)
    launch(_write_heads, blocks, TILE, keys, sentinel, heads, rows, starts, used)
    launch(_segment_counts, arrays.grid(n), arrays.THREADS, starts, used, counts)
    return RowGroups(rows, starts, counts, order, used)


def exclusive_scan(x, out, total):
    """``out[i] = x[0] + ... + x[i - 1]`` (``out`` may be ``x``), ``total[0] = sum(x)``.

    One block: each thread scans a contiguous chunk, a shared-memory scan
    joins the chunks.
    """
    launch(_exclusive_scan, 1, SCAN_THREADS, x, out, total)


# ---------------------------------------------------------------- kernels


@cuda.jit(device=True)
def _digit(key, shift):
    return (key >> shift) & (BINS - 1)


@cuda.jit(device=True)
def _block_histogram(key, valid, shift, hist):
    """Add this block's digits to ``hist[digit * blocks + block]`` (shared counts first)."""
    counts = cuda.shared.array(BINS, int64)
    tid = cuda.threadIdx.x
    for b in range(tid, BINS, cuda.blockDim.x):
        counts[b] = 0
    cuda.syncthreads()
    if valid:
        cuda.atomic.add(counts, _digit(key, shift), 1)
    cuda.syncthreads()
    for b in range(tid, BINS, cuda.blockDim.x):
        hist[b * cuda.gridDim.x + cuda.blockIdx.x] = counts[b]


@cuda.jit
def _first_histogram(flat, pad, sentinel, word, host, which, keys, hist):
    """Keys from the indices (bad ones recorded, they and padding become ``sentinel``),
    written to ``keys``, and the histogram of their lowest digit."""
    i = cuda.grid(1)
    key = int64(0)
    valid = i < flat.size
    if valid:
        key = errors.checked(word, host, flat[i], i, sentinel, which)
        if key < 0 or key == pad:
            key = sentinel
        keys[i] = key
    _block_histogram(key, valid, 0, hist)


@cuda.jit
def _histogram(keys, shift, hist):
    i = cuda.grid(1)
    key = int64(0)
    valid = i < keys.size
    if valid:
        key = keys[i]
    _block_histogram(key, valid, shift, hist)


@cuda.jit
def _scatter_digit(keys, positions, first, shift, offsets, keys_out, positions_out):
    """Stable scatter of one digit: each key goes to its digit's offset for this block
    plus its rank among the block's earlier keys of the same digit."""
    tile = cuda.shared.array(TILE, int64)
    tid = cuda.threadIdx.x
    i = cuda.grid(1)
    valid = i < keys.size
    d = int64(-1)
    if valid:
        d = _digit(keys[i], shift)
    tile[tid] = d
    cuda.syncthreads()
    if valid:
        rank = 0
        for t in range(tid):
            if tile[t] == d:
                rank += 1
        dest = offsets[d * cuda.gridDim.x + cuda.blockIdx.x] + rank
        keys_out[dest] = keys[i]
        positions_out[dest] = i if first else positions[i]


@cuda.jit(device=True)
def block_exclusive_scan(values, tid, count):
    """Exclusive prefix sums of shared ``values[:count]`` in place (one block, all threads
    call it); returns the total. ``count`` is at most the block's threads."""
    cuda.syncthreads()
    total = int64(0)
    offset = 1
    while offset < count:
        add = int64(0)
        if tid < count and tid >= offset:
            add = values[tid - offset]
        cuda.syncthreads()
        if tid < count:
            values[tid] += add
        cuda.syncthreads()
        offset *= 2
    total = values[count - 1]
    mine = int64(0)
    if 0 < tid < count:
        mine = values[tid - 1]
    cuda.syncthreads()
    if tid < count:
        values[tid] = mine
    cuda.syncthreads()
    return total


@cuda.jit
def _exclusive_scan(x, out, total):
    sums = cuda.shared.array(SCAN_THREADS, int64)
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    chunk = (x.size + threads - 1) // threads
    begin = min(tid * chunk, x.size)
    end = min(begin + chunk, x.size)
    acc = int64(0)
    for k in range(begin, end):
        acc += x[k]
    sums[tid] = acc
    whole = block_exclusive_scan(sums, tid, threads)
    acc = sums[tid]
    for k in range(begin, end):
        v = x[k]
        out[k] = acc
        acc += v
    if tid == 0:
        total[0] = whole


@cuda.jit(device=True)
def _is_head(keys, i, sentinel):
    key = keys[i]
    return key < sentinel and (i == 0 or keys[i - 1] != key)


@cuda.jit
def _count_heads(keys, sentinel, heads):
    """Segments (distinct rows) starting in each block's tile."""
    flags = cuda.shared.array(TILE, int64)
    tid = cuda.threadIdx.x
    i = cuda.grid(1)
    flags[tid] = 1 if i < keys.size and _is_head(keys, i, sentinel) else 0
    total = block_exclusive_scan(flags, tid, TILE)
    if tid == 0:
        heads[cuda.blockIdx.x] = total


@cuda.jit
def _write_heads(keys, sentinel, offsets, rows, starts, used):
    """``rows[j]`` / ``starts[j]`` of segment ``j``, and ``used[1]``: the grouped positions."""
    flags = cuda.shared.array(TILE, int64)
    tid = cuda.threadIdx.x
    i = cuda.grid(1)
    n = keys.size
    head = i < n and _is_head(keys, i, sentinel)
    flags[tid] = 1 if head else 0
    block_exclusive_scan(flags, tid, TILE)
    if head:
        j = offsets[cuda.blockIdx.x] + flags[tid]
        rows[j] = keys[i]
        starts[j] = i
    if i < n:
        key = keys[i]
        if key < sentinel and (i + 1 == n or keys[i + 1] >= sentinel):
            used[1] = i + 1
        elif i == 0 and key >= sentinel:
            used[1] = 0


@cuda.jit
def _segment_counts(starts, used, counts):
    distinct = used[0]
    for j in range(cuda.grid(1), distinct, cuda.gridsize(1)):
        end = starts[j + 1] if j + 1 < distinct else used[1]
        counts[j] = end - starts[j]


def _block_barrier_after(k, j, size):
    """Whether bitonic step ``(k, j)`` of a ``size``-value sort needs a block-wide barrier
    after it (else a warp's): pair ``t`` of a step with ``j <= WARP`` compares values
    inside ``2 * WARP``-aligned run ``t // WARP`` (threads a multiple of ``WARP`` apart
    take the same runs), so from one such step to the next each warp only touches
    values it wrote itself. The last step is followed by reads in another layout."""
    following = j // 2 if j > 1 else k  # the next step's j (of the next k after j == 1)
    return j > WARP or following > WARP or (k == size and j == 1)


_device_block_barrier_after = cuda.jit(device=True)(_block_barrier_after)


@cuda.jit(device=True)
def _warp_barrier():
    if _SIMULATED:  # its simulator has no syncwarp (and runs SMALL_THREADS: one warp)
        cuda.syncthreads()
    else:
        cuda.syncwarp()


@cuda.jit
def _group_in_block(flat, pad, sentinel, word, host, which, rows, starts, counts, order,
                    used):
    """The whole :class:`~numbapos._args.RowGroups` of ``flat`` (at most SMALL_MAX ids) in
    one block.

    Each id is checked (a bad one recorded, it and padding get key ``sentinel``) and
    packed with its position as ``key << POSITION_BITS | position``; the packed values
    are distinct, so sorting them (a bitonic sort in shared memory, the power-of-two
    tail filled with int64's largest value) orders positions by row and, within a row,
    by position: the stable sort of the radix passes, the same ``order``. Its steps
    are separated by a warp's barrier where both stay inside each warp's values
    (:func:`_block_barrier_after`), by the block's otherwise. Then each
    thread takes a contiguous run of the sorted values: one scan of its segment heads
    numbers the segments, heads write ``rows`` / ``starts``, and once they are all
    written, ``counts`` are the gaps between starts (the last one ends at the grouped
    positions, ``used[1]``).
    """
    packed = cuda.shared.array(SMALL_MAX, int64)
    sums = cuda.shared.array(SMALL_THREADS, int64)
    grouped = cuda.shared.array(1, int64)
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    n = flat.size
    size = 1
    while size < n:
        size *= 2
    for i in range(tid, size, threads):
        value = int64(_FILLER)
        if i < n:
            key = errors.checked(word, host, flat[i], i, sentinel, which)
            if key < 0 or key == pad:
                key = sentinel
            value = (key << POSITION_BITS) | i
        packed[i] = value
    cuda.syncthreads()
    half = size // 2
    k = 2
    while k <= size:
        j = k // 2
        while j > 0:
            for t in range(tid, half, threads):
                low = ((t & ~(j - 1)) << 1) | (t & (j - 1))  # bit j of low is clear
                a = packed[low]
                b = packed[low + j]
                if (a > b) == ((low & k) == 0):  # ascending where bit k of low is clear
                    packed[low] = b
                    packed[low + j] = a
            if _device_block_barrier_after(k, j, size):
                cuda.syncthreads()
            else:
                _warp_barrier()
            j //= 2
        k *= 2
    for i in range(tid, n, threads):
        order[i] = packed[i] & (SMALL_MAX - 1)
    chunk = (n + threads - 1) // threads
    begin = min(tid * chunk, n)
    end = min(begin + chunk, n)
    heads = int64(0)
    for i in range(begin, end):
        key = packed[i] >> POSITION_BITS
        if key < sentinel:
            if i == 0 or packed[i - 1] >> POSITION_BITS != key:
                heads += 1
            if i + 1 == n or packed[i + 1] >> POSITION_BITS >= sentinel:
                grouped[0] = i + 1  # one thread: the last grouped position
        elif i == 0:
            grouped[0] = 0  # nothing grouped (then no thread writes it above)
    sums[tid] = heads
    distinct = block_exclusive_scan(sums, tid, threads)  # synchronises first and last
    segment = sums[tid]
    for i in range(begin, end):
        key = packed[i] >> POSITION_BITS
        if key < sentinel and (i == 0 or packed[i - 1] >> POSITION_BITS != key):
            rows[segment] = key
            starts[segment] = i
            segment += 1
    cuda.syncthreads()  # every start written (global memory: visible to the block now)
    last = grouped[0]
    for s in range(tid, distinct, threads):
        counts[s] = (starts[s + 1] if s + 1 < distinct else last) - starts[s]
    if tid == 0:
        used[0] = distinct
        used[1] = last
