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

Above it, a onesweep radix sort (:func:`_group_by_onesweep`) takes
``ceil(bit_length(V) / 8) + 3`` launches: 5 for V < 65,536 (BERT-base's
30,522), 6 for V < 2**24. One launch makes the keys (the ids checked) and
zeroes the counters and look-back words the later ones use; one counts the
digits of every pass at once (into counts zeroed by the first: blocks of one
launch cannot share counters that no earlier launch set); each 8-bit pass is
one scatter launch with a decoupled look-back across tiles (:func:`_onesweep`);
one launch cuts the segments, with a look-back too (:func:`_segments`). Two allocations: the
result's five arrays and one scratch block. A sparse backward is then six
launches (the sum included). Both paths give the same arrays (rows past
``used`` excepted: nothing reads them).
"""

from __future__ import annotations

import numpy as np
from numba import config as numba_config
from numba import cuda, int32, int64

from ..._args import RowGroups
from ..._gpuhost.launch import launch
from . import arrays, errors

__all__ = []  # helpers of the embedding and optimiser launchers

# Positions per block of the sort and segment kernels (a tile: one per thread, so 256
# digits and 256 keys a tile on a GPU). Numba's simulator runs every thread as a Python
# thread: there, smaller tiles of two warps keep the tests fast, and small inputs make
# many tiles, so the cross-tile and cross-warp paths are tested.
_SIMULATED = bool(numba_config.ENABLE_CUDASIM)
TILE = 64 if _SIMULATED else 256
RADIX_BITS = 8
BINS = 1 << RADIX_BITS
WARP = 32
WARPS = TILE // WARP
MATCH_LANES = TILE if _SIMULATED else 1  # shared memory of _match_any on the simulator
FULL_MASK = np.int32(-1)  # every lane of a warp
# The look-back words: ``status << STATUS_SHIFT | value``, written by one atomic exchange,
# read by an atomic add of 0 (see _look_back). Pass p of the sort publishes AGGREGATE =
# 2p + 1 (a tile's count alone) then PREFIX = 2p + 2 (the tiles up to it): one array of
# words serves every pass, as what an earlier pass left there (0 from the first launch, or
# at most 2p) reads as "not yet". The segments' words use 1 and 2.
STATUS_SHIFT = 58
VALUE_MASK = (1 << STATUS_SHIFT) - 1
MAX_PASSES = 8  # of 64-bit keys; their statuses (up to 16) fit above bit 58 of an int64
ALL_BINS = MAX_PASSES * BINS  # shared arrays take a constant size, not an expression
WARP_BINS = WARPS * BINS

# The one-block path: up to SMALL_MAX positions, each a packed int64 ``row << POSITION_BITS
# | position`` in shared memory (32 KB on a GPU, plus 8 KB of per-thread counts: within
# the 48 KB a block may have statically), SMALL_THREADS threads at most (two
# compare-exchanges a thread per bitonic step). The simulator's smaller bound leaves
# the multi-launch path to moderate test sizes.
SMALL_MAX = 256 if _SIMULATED else 4096
SMALL_THREADS = 32 if _SIMULATED else 1024
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
    return _group_by_onesweep(flat, padding_idx, num_rows, which)


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
    return _int64_views(arrays.empty((sum(sizes),), np.int64), _spans(sizes))


def _spans(sizes):
    """``(start, size)`` of consecutive parts of ``sizes``."""
    spans, start = [], 0
    for size in sizes:
        spans.append((start, size))
        start += size
    return spans


def _int64_views(block, spans):
    """Views ``block[start:start + size]`` of an int64 device array, per ``(start, size)``."""
    if _SIMULATED:
        return [block[start:start + size] for start, size in spans]
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    return [DeviceNDArray((size,), (8,), block.dtype, stream=block.stream,
                          gpu_data=block.gpu_data.view(8 * start, 8 * (start + size)))
            for start, size in spans]


def _group_by_onesweep(flat, padding_idx, num_rows, which):
    """:func:`group_rows` by a onesweep radix sort, then the segments (any size):
    ``passes + 3`` launches, two allocations."""
    n = int(flat.size)
    tiles = -(-n // TILE)
    passes = max(1, -(-int(num_rows).bit_length() // RADIX_BITS))
    sentinel = int(num_rows)
    pad = int(padding_idx) if padding_idx is not None and padding_idx >= 0 else -1
    word, host = errors.words()
    rows, starts, counts, order, used = _int64_parts((n, n, n, n, 2))
    # The scratch, one allocation: two key buffers, the positions between passes (none
    # for one pass), then what the first launch zeroes: the histograms, the ticket
    # counters (one per scatter pass, one for the segments), the digits' look-back words
    # (one array for every pass: see STATUS_SHIFT) and the segments' (two a tile).
    spare = [n] if passes > 1 else []
    zeroed = [passes * BINS, passes + 1, tiles * BINS, 2 * tiles]
    spans = _spans([n, n, *spare, *zeroed])
    end = spans[-1][0] + spans[-1][1]
    views = _int64_views(arrays.empty((end,), np.int64),
                         [*spans, (end - sum(zeroed), sum(zeroed))])
    keys_a, keys_b = views[:2]
    moved = views[2] if spare else order  # one pass writes order only
    hist, tickets, flags, heads, zero = views[-5:]
    launch(_keys_and_zeros, tiles, TILE, flat, pad, sentinel, word, host, which, keys_a, zero)
    launch(_histograms, tiles, TILE, keys_a, passes, hist)
    keys, spare_keys, positions = keys_a, keys_b, order  # pass 0 reads no positions
    for p in range(passes):
        out = order if (passes - 1 - p) % 2 == 0 else moved  # the last pass writes order
        launch(_onesweep, tiles, TILE, keys, positions, p == 0, p, hist, tickets, flags,
               spare_keys, out)
        keys, spare_keys, positions = spare_keys, keys, out
    launch(_segments, tiles, TILE, keys, sentinel, tickets, passes, heads, rows, starts,
           counts, used)
    return RowGroups(rows, starts, counts, order, used)


# ---------------------------------------------------------------- kernels


@cuda.jit(device=True)
def _digit(key, shift):
    return (key >> shift) & (BINS - 1)


@cuda.jit
def _keys_and_zeros(flat, pad, sentinel, word, host, which, keys, zero):
    """Launch 1: the keys (bad ids recorded; they and padding become ``sentinel``, which
    sorts after every row) and ``zero`` (histograms, tickets, look-back words) zeroed.
    The later launches start after this one ends, so they see the zeros."""
    i = cuda.grid(1)
    if i < flat.size:
        key = errors.checked(word, host, flat[i], i, sentinel, which)
        if key < 0 or key == pad:
            key = sentinel
        keys[i] = key
    for z in range(i, zero.size, cuda.gridsize(1)):
        zero[z] = 0


@cuda.jit
def _histograms(keys, passes, hist):
    """Launch 2: every pass's digit counts at once, ``hist[p * BINS + digit]`` (shared
    counts first; integer atomics give the same counts in any order)."""
    counts = cuda.shared.array(ALL_BINS, int32)
    tid = cuda.threadIdx.x
    bins = passes * BINS
    for b in range(tid, bins, cuda.blockDim.x):
        counts[b] = 0
    cuda.syncthreads()
    i = cuda.grid(1)
    if i < keys.size:
        key = keys[i]
        for p in range(passes):
            cuda.atomic.add(counts, p * BINS + _digit(key, p * RADIX_BITS), 1)
    cuda.syncthreads()
    for b in range(tid, bins, cuda.blockDim.x):
        if counts[b]:
            cuda.atomic.add(hist, b, int64(counts[b]))


@cuda.jit(device=True)
def _publish(words, index, status, value):
    cuda.atomic.exch(words, index, (int64(status) << STATUS_SHIFT) | value)


@cuda.jit(device=True)
def _look_back(words, base, stride, tile, aggregate, prefix, use_max):
    """The sum (the max if ``use_max``) of the values of tiles ``0 .. tile - 1``, read
    from ``words[base + t * stride]``: from tile - 1 backwards, adding aggregates, up to
    the first inclusive prefix.

    Memory order: nothing but these words passes between the blocks of one launch
    (keys and positions are read by the next launch), and each word carries its value
    and status together (one atomic exchange writes it, an atomic add of 0 reads it,
    again on each spin: a plain load could be hoisted out of the loop), so relaxed
    atomics suffice, with no fence. Progress: a block waits only for tiles of smaller
    tickets, handed to blocks already running, which publish their aggregate before
    they look back themselves (tile 0 its prefix at once), so every wait ends.
    """
    total = int64(0)
    t = tile - 1
    while t >= 0:
        word = cuda.atomic.add(words, base + t * stride, int64(0))
        status = word >> STATUS_SHIFT
        if status < aggregate:
            continue  # not yet published by tile t in this pass: read again
        value = word & VALUE_MASK
        total = max(total, value) if use_max else total + value
        if status == prefix:
            break
        t -= 1
    return total


@cuda.jit(device=True)
def _match_any(value, lanes, tid):
    """The lanes of this thread's warp holding the same ``value`` (a bit each), as
    ``match_any_sync`` gives; every thread of the block calls it."""
    if _SIMULATED:  # the simulator has no warp functions: through shared memory
        lanes[tid] = value
        cuda.syncthreads()
        first = tid - tid % WARP
        mask = int64(0)
        for lane in range(WARP):
            if first + lane < cuda.blockDim.x and lanes[first + lane] == value:
                mask |= int64(1) << lane
        cuda.syncthreads()
        return mask
    return int64(cuda.match_any_sync(FULL_MASK, value)) & 0xFFFFFFFF


@cuda.jit(device=True)
def _exclusive_scan_bins(values, sums, tid, threads):
    """Exclusive prefix sums of shared ``values[:BINS]`` in place (every thread calls
    it); ``sums``: shared scratch of ``threads`` values."""
    cuda.syncthreads()
    chunk = (BINS + threads - 1) // threads
    begin = min(tid * chunk, BINS)
    end = min(begin + chunk, BINS)
    acc = int64(0)
    for b in range(begin, end):
        acc += values[b]
    sums[tid] = acc
    block_exclusive_scan(sums, tid, threads)  # synchronises first and last
    acc = sums[tid]
    for b in range(begin, end):
        v = values[b]
        values[b] = acc
        acc += v
    cuda.syncthreads()


@cuda.jit
def _onesweep(keys, positions, first, p, hist, tickets, flags, keys_out, positions_out):
    """One stable scatter pass of digit ``p`` in one launch (Merrill and Garland's
    decoupled look-back; Adinets and Merrill, "Onesweep", 2022).

    Each block takes the next tile from the pass's ticket counter, so tiles begin in
    ticket order whatever order the hardware starts blocks in. Ranks in the tile: the
    lanes of a warp with the same digit find each other (``match_any_sync``), and a
    key's rank is its such lanes below plus the keys of its digit in earlier warps. Then
    per digit the tile publishes its count, adds up the tiles before it
    (:func:`_look_back`) and publishes its inclusive prefix; tile 0 adds each digit's
    start (the exclusive scan of the pass's histogram) to its prefix, so every tile's
    look-back includes it. Each key goes to that base plus its rank: stable.
    """
    per_warp = cuda.shared.array(WARP_BINS, int32)  # digit counts, then offsets
    base = cuda.shared.array(BINS, int64)  # the tile's count of a digit, then its slot
    starts = cuda.shared.array(BINS, int64)  # tile 0: the digits' starts
    sums = cuda.shared.array(TILE, int64)
    lanes = cuda.shared.array(MATCH_LANES, int64)
    ticket = cuda.shared.array(1, int64)
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    if tid == 0:
        ticket[0] = cuda.atomic.add(tickets, p, 1)
    for b in range(tid, WARPS * BINS, threads):
        per_warp[b] = 0
    cuda.syncthreads()
    tile = ticket[0]
    i = tile * TILE + tid
    valid = i < keys.size
    key = int64(0)
    digit = int64(-1)
    if valid:
        key = keys[i]
        digit = _digit(key, p * RADIX_BITS)
    peers = _match_any(digit, lanes, tid)
    below = peers & ((int64(1) << (tid % WARP)) - 1)
    warp = tid // WARP
    if valid and below == 0:
        per_warp[warp * BINS + digit] = cuda.popc(peers)
    cuda.syncthreads()
    for b in range(tid, BINS, threads):
        count = int32(0)
        for w in range(WARPS):
            c = per_warp[w * BINS + b]
            per_warp[w * BINS + b] = count
            count += c
        base[b] = count
    cuda.syncthreads()
    aggregate = 2 * p + 1
    prefix = 2 * p + 2
    if tile == 0:  # the same for the whole block
        for b in range(tid, BINS, threads):
            starts[b] = hist[p * BINS + b]
        _exclusive_scan_bins(starts, sums, tid, threads)
        for b in range(tid, BINS, threads):
            _publish(flags, b, prefix, starts[b] + base[b])
            base[b] = starts[b]
    else:
        for b in range(tid, BINS, threads):
            _publish(flags, tile * BINS + b, aggregate, base[b])
        for b in range(tid, BINS, threads):
            before = _look_back(flags, b, BINS, tile, aggregate, prefix, False)
            _publish(flags, tile * BINS + b, prefix, before + base[b])
            base[b] = before
    cuda.syncthreads()
    if valid:
        dest = base[digit] + per_warp[warp * BINS + digit] + cuda.popc(below)
        keys_out[dest] = key
        positions_out[dest] = i if first else positions[i]


@cuda.jit
def _segments(keys, sentinel, tickets, which, words, rows, starts, counts, used):
    """The segments of the sorted ``keys`` in one launch: ``rows`` / ``starts`` written at
    each row's first position, ``counts`` at its last, ``used`` at the last grouped one.

    Two inclusive scans run over the positions in ticket order with a decoupled
    look-back (words ``2 * tile`` and ``2 * tile + 1``): the number of heads (a row's
    first position), which numbers the segments, and the latest head (its position
    plus one, 0 for none), where the segment of a row's last position starts.
    """
    heads = cuda.shared.array(TILE, int64)
    latest = cuda.shared.array(TILE, int64)
    before = cuda.shared.array(2, int64)
    ticket = cuda.shared.array(1, int64)
    tid = cuda.threadIdx.x
    threads = cuda.blockDim.x
    if tid == 0:
        ticket[0] = cuda.atomic.add(tickets, which, 1)
    cuda.syncthreads()
    tile = ticket[0]
    n = keys.size
    i = tile * TILE + tid
    key = int64(sentinel)
    if i < n:
        key = keys[i]
    grouped = key < sentinel
    head = grouped and (i == 0 or keys[i - 1] != key)
    heads[tid] = 1 if head else 0
    latest[tid] = i + 1 if head else 0
    offset = 1
    while offset < threads:
        cuda.syncthreads()
        h = int64(0)
        m = int64(0)
        if tid >= offset:
            h = heads[tid - offset]
            m = latest[tid - offset]
        cuda.syncthreads()
        heads[tid] += h
        latest[tid] = max(latest[tid], m)
        offset *= 2
    cuda.syncthreads()
    if tid < 2:  # thread 0 scans the heads' count, thread 1 the latest head
        mine = heads[threads - 1] if tid == 0 else latest[threads - 1]
        earlier = int64(0)
        if tile > 0:
            _publish(words, 2 * tile + tid, 1, mine)
            earlier = _look_back(words, tid, 2, tile, 1, 2, tid == 1)
        _publish(words, 2 * tile + tid, 2, earlier + mine if tid == 0 else max(earlier, mine))
        before[tid] = earlier
    cuda.syncthreads()
    if grouped:
        j = before[0] + heads[tid] - 1
        if head:
            rows[j] = key
            starts[j] = i
        following = keys[i + 1] if i + 1 < n else sentinel
        if following != key:
            counts[j] = i + 1 - (max(before[1], latest[tid]) - 1)
            if following >= sentinel:
                used[0] = j + 1
                used[1] = i + 1
    elif i == 0:
        used[0] = 0  # nothing grouped
        used[1] = 0


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
