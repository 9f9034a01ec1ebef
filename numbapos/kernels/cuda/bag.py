"""CUDA launchers and kernels for pooled lookups (``embedding_bag``) and their gradients.

The twin of ``kernels/cpu/bag.py`` (same ``__all__``, signatures and bits). One
block per bag (or per row group), grid-stride over them, the threads of a block
along D: loads and stores of a row coalesce, and each thread adds its column's
terms in index order, as the CPU does. The block stages a chunk of the bag's ids
(the group's positions) in shared memory, each read and checked once; each thread
then owns one column, or one 16-byte vector of columns where :func:`.vector.aligned`
allows, and loads four entries' rows before it adds them (four loads in flight).
Ids are checked as they are read and a bad one is recorded in the deferred
error word (:mod:`.errors`); bad offsets are recorded there too (as a position
error naming ``offsets``). The gradient kernels, which write caller-visible
state, return while an error is pending.
Rows are grouped on the device (``group_rows`` of :mod:`.embedding`) and each
row summed in input order: no float atomics, the CPU's bits.

Products that feed a sum go through :func:`.fpmath.mul_rn` (NVVM would fuse
them) and the fused multiply-adds through :func:`fma`, so the GPU rounds where
the CPU does.
"""

import math
from fractions import Fraction
from functools import cache

import numpy as np
from numba import config, cuda, float64, int64

from ..._gpuhost.launch import launch
from ..widen import widen
from . import errors, vector
from .arrays import MAX_BLOCKS, THREADS, absent, empty, grid
from .fpmath import cast_like, mul_rn
from .vector import load_lanes, per_lane, row_threads, store_lanes

__all__ = ["bag_positions", "bag_table_grad", "bag_weights_grad", "bags_of_groups",
           "check_bag_offsets", "pool_bags"]

SUM, MEAN, MAX = 0, 1, 2  # as kernels/cpu/bag.py


if config.ENABLE_CUDASIM:
    def _fma_exact(a, b, c):
        """``a * b + c`` rounded once to the operands' type (exact rationals)."""
        if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
            return type(c)(float(a) * float(b) + float(c))
        exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
        if isinstance(c, np.float32):
            return np.float32(_round_to_f32(exact))
        return type(c)(float(exact))

    def _round_to_f32(exact):
        # Nearest float32 of a rational: round to a float64 to odd, then to float32.
        near = float(exact)
        if Fraction(near) != exact and not int(np.float64(near).view(np.int64)) & 1:
            near = float(np.nextafter(near, math.inf if Fraction(near) < exact else -math.inf))
        return near

    fma = cuda.jit(device=True)(_fma_exact)
else:  # pragma: no cover - compiled for real GPUs only
    @cuda.jit(device=True)
    def fma(a, b, c):
        return cuda.fma(a, b, c)


# ---------------------------------------------------------------- launchers


def check_bag_offsets(offsets, size, exact_end):
    """Record the first bad offset (see the CPU twin) in the deferred error word: None."""
    if offsets.size:
        word, host = errors.words()
        launch(_check_offsets, grid(offsets.size), THREADS, offsets, int64(size),
               1 if exact_end else 0, word, host,
               errors.tag("offsets", "len(input) + 1 (offsets start at 0, never decrease; "
                          "the error's size)", "position"))
        errors.after_launch()
    return None


def pool_bags(flat, offsets, width, weight, mode, padding, per_sample_weights, out, argmax,
              fmt):
    """See the CPU twin; a bad id is recorded and left out of its bag.

    One block per bag, its threads along D, by 16-byte vectors where the table and
    the result (and ``argmax``) allow them (:func:`.vector.aligned`, same dtype)."""
    bags, dim = out.shape
    if bags == 0 or dim == 0:
        return
    word, host = errors.words()
    # (absent arrays, made once: a plan may keep them, see _gpuhost/plans.py)
    psw = per_sample_weights if per_sample_weights is not None else absent(out.dtype)
    winners = argmax if argmax is not None else absent(np.int64, 2)
    whole = (weight, out) if argmax is None else (weight, out, argmax)
    lanes = (vector.lanes(weight.dtype)
             if weight.dtype == out.dtype and vector.aligned(*whole) else 1)
    launch(_pool_kernel(lanes, int(mode), argmax is not None), min(bags, MAX_BLOCKS),
           row_threads(dim // lanes), flat, _offsets(offsets, width), int64(width), weight,
           int64(padding), psw, 1 if per_sample_weights is not None else 0, out, winners,
           int64(fmt), out.dtype.type(0), weight.dtype.type(0), word, host, errors.tag("input"))
    errors.after_launch()


def _offsets(offsets, width):
    """The offsets a kernel gets: with 2-D input (``width`` > 0) none are read, and an absent
    array (made once, which a plan may keep) stands for them."""
    return absent(np.int64) if width else offsets


def bag_positions(flat, offsets, width, padding, bag_of, sizes):
    """See the CPU twin."""
    if sizes.size:
        launch(_bag_of, grid(sizes.size), THREADS, flat, _offsets(offsets, width),
               int64(width), int64(padding), bag_of, sizes)


def bag_table_grad(grad_output, groups, bag_of, bag_sizes, mode, per_sample_weights, argmax,
                   scale_grad_by_freq, out, dense):
    """See the CPU twin; the groups' count is read on the device (``groups.used``).

    One block per row group, its threads along D (by 16-byte vectors where the
    gradients' rows allow it), the group's positions staged in shared memory."""
    if groups.rows.shape[0] == 0 or out.shape[1] == 0:
        return
    psw = per_sample_weights if per_sample_weights is not None else absent(out.dtype)
    winners = argmax if argmax is not None else absent(np.int64, 2)
    lanes = (vector.lanes(out.dtype) if grad_output.dtype == out.dtype
             and vector.aligned(grad_output, out) else 1)
    launch(_table_grad_kernel(lanes, int(mode)), min(groups.rows.shape[0], MAX_BLOCKS),
           row_threads(out.shape[1] // lanes), grad_output, groups.rows, groups.starts,
           groups.counts, groups.order, groups.used, bag_of, bag_sizes, psw,
           1 if per_sample_weights is not None else 0, winners,
           1 if scale_grad_by_freq else 0, out, 1 if dense else 0, out.dtype.type(0),
           errors.device_word())


def bags_of_groups(groups, bag_of):
    """See the CPU twin: one launch over the grouped positions (``groups.used[1]``)."""
    order = empty(groups.order.shape, np.int64)
    if order.shape[0]:
        launch(_bags_of_positions, grid(order.shape[0]), THREADS, groups.order, groups.used,
               bag_of, order)
    return groups._replace(order=order)


def bag_weights_grad(grad_output, flat, bag_of, weight, padding, out, fmt):
    """See the CPU twin (one thread per entry, columns in order)."""
    if flat.size:
        launch(_weights_grad, grid(flat.size), THREADS, grad_output, flat, bag_of, weight,
               int64(padding), out, int64(fmt), out.dtype.type(0), errors.device_word())


# ---------------------------------------------------------------- kernels


@cuda.jit
def _check_offsets(offsets, size, exact_end, word, host, which):
    """Each thread checks one offset; the error word keeps the first bad position."""
    last = offsets.size - 1
    for k in range(cuda.grid(1), offsets.size, cuda.gridsize(1)):
        value = int64(offsets[k])
        if ((k == 0 and value != 0) or (k > 0 and value < offsets[k - 1]) or value > size
                or (k == last and exact_end and value != size)):
            errors.record(word, host, int64(k), value, size + 1, which)


@cuda.jit(device=True)
def _bounds(offsets, width, size, b):
    """Bag ``b``'s positions ``[start, end)`` in ``flat`` (of ``size`` ids), kept inside
    ``[0, size]``: bad offsets are recorded by the kernel that checks them, never read past."""
    if width > 0:
        return b * width, (b + 1) * width
    start = int64(offsets[b])
    end = int64(offsets[b + 1]) if b + 1 < offsets.size else size
    return min(max(start, 0), size), min(max(end, 0), size)


@cuda.jit(device=True)
def _same(lane, x):
    return x


@cache
def _pool_kernel(lanes, mode, winners):
    """The pooling kernel of ``mode`` whose threads own ``lanes`` adjacent columns (1, or one
    16-byte vector: the launcher checked :func:`.vector.aligned`), keeping the winners
    of max mode when ``winners``.

    One block per bag (grid-stride), its threads along D. The block stages
    ``blockDim`` of the bag's ids at a time in shared memory, each read and checked
    once (a bad id is recorded and skipped, as padding is), with their weights;
    then every thread loads the rows of four entries before it adds them, in input
    order: the CPU's operations per column, so its bits, with four row loads in
    flight per thread (one 16-byte vector each where aligned).
    """

    @cuda.jit(device=True)
    def fetch(weight, r, d, blank):
        """``weight[r, d : d + lanes]`` (one element or one 16-byte vector), ``blank`` for
        a skipped entry (``r`` < 0)."""
        if r >= 0:
            return load_lanes(weight, r, d, lanes)
        return blank

    @cuda.jit(device=True)
    def plus(k, acc, x, p, weighted, padding, fmt):
        value = widen(x[k], fmt)
        if weighted == 0:
            return acc[k] + value
        if padding < 0:
            return fma(p, value, acc[k])
        return acc[k] + mul_rn(p, value)

    @cuda.jit(device=True)
    def winner(k, best, acc, x, i, fmt):
        return i if best[k] < 0 or widen(x[k], fmt) > acc[k] else best[k]

    @cuda.jit(device=True)
    def maximum(k, best, acc, x, fmt):
        value = widen(x[k], fmt)
        return value if best[k] < 0 or value > acc[k] else acc[k]

    @cuda.jit(device=True)
    def mean(k, acc, used):
        return acc[k] / cast_like(used, acc[k])

    @cuda.jit(device=True)
    def add(acc, best, used, x, r, i, p, weighted, padding, fmt):
        """One entry's terms added to the thread's columns (nothing for ``r`` < 0)."""
        if r < 0:
            return acc, best, used
        if mode == MAX:
            return (per_lane(maximum, lanes, best, acc, x, fmt),
                    per_lane(winner, lanes, best, acc, x, i, fmt), used + 1)
        return per_lane(plus, lanes, acc, x, p, weighted, padding, fmt), best, used + 1

    @cuda.jit
    def _pool(flat, offsets, width, weight, padding, psw, weighted, out, argmax, fmt, zero,
              blank_value, word, host, which):
        rows_s = cuda.shared.array(THREADS, int64)
        weights_s = cuda.shared.array(THREADS, float64)
        bags, dim = out.shape
        size = int64(flat.size)
        t = cuda.threadIdx.x
        step = cuda.blockDim.x
        vectors = dim // lanes
        blank = per_lane(_same, lanes, blank_value)
        for b in range(cuda.blockIdx.x, bags, cuda.gridDim.x):
            start, end = _bounds(offsets, width, size, b)
            for v0 in range(0, vectors, step):  # every thread, so the barriers are uniform
                d = (v0 + t) * lanes
                active = d < dim
                acc = per_lane(_same, lanes, zero)
                best = per_lane(_same, lanes, int64(-1))
                used = 0
                for base in range(start, end, step):
                    cuda.syncthreads()  # the previous ids were read
                    i = base + t
                    r = int64(-1)
                    if i < end:
                        r = errors.checked(word, host, flat[i], i, weight.shape[0], which)
                        if r == padding:
                            r = -1
                    if weighted:  # past the bag too: the unrolled loop reads 4 at a time
                        weights_s[t] = float64(psw[i]) if i < end else float64(0.0)
                    rows_s[t] = r
                    cuda.syncthreads()
                    if not active:
                        continue
                    for j in range(0, min(step, end - base), 4):
                        r0, r1, r2, r3 = rows_s[j], rows_s[j + 1], rows_s[j + 2], rows_s[j + 3]
                        x0 = fetch(weight, r0, d, blank)
                        x1 = fetch(weight, r1, d, blank)
                        x2 = fetch(weight, r2, d, blank)
                        x3 = fetch(weight, r3, d, blank)
                        p0 = p1 = p2 = p3 = zero
                        if weighted:
                            p0 = cast_like(weights_s[j], zero)
                            p1 = cast_like(weights_s[j + 1], zero)
                            p2 = cast_like(weights_s[j + 2], zero)
                            p3 = cast_like(weights_s[j + 3], zero)
                        i = base + j
                        acc, best, used = add(acc, best, used, x0, r0, i, p0, weighted,
                                              padding, fmt)
                        acc, best, used = add(acc, best, used, x1, r1, i + 1, p1, weighted,
                                              padding, fmt)
                        acc, best, used = add(acc, best, used, x2, r2, i + 2, p2, weighted,
                                              padding, fmt)
                        acc, best, used = add(acc, best, used, x3, r3, i + 3, p3, weighted,
                                              padding, fmt)
                if not active:
                    continue
                if mode == MEAN and used > 1:
                    acc = per_lane(mean, lanes, acc, used)
                store_lanes(out, b, d, acc)
                if winners:
                    store_lanes(argmax, b, d, best)

    return _pool


@cuda.jit
def _bag_of(flat, offsets, width, padding, bag_of, sizes):
    size = int64(flat.size)
    for b in range(cuda.grid(1), sizes.size, cuda.gridsize(1)):
        start, end = _bounds(offsets, width, size, b)
        used = 0
        for i in range(start, end):
            bag_of[i] = b
            if flat[i] != padding:
                used += 1
        sizes[b] = used


@cuda.jit
def _bags_of_positions(order, used, bag_of, out):
    k = cuda.grid(1)
    if k < used[1]:
        out[k] = bag_of[order[k]]


@cache
def _table_grad_kernel(lanes, mode):
    """The table gradient of ``mode`` whose threads own ``lanes`` adjacent columns (1, or one
    16-byte vector: the launcher checked :func:`.vector.aligned`).

    One block per present row (grid-stride over ``used[0]`` of them), its threads
    along D. The block stages ``blockDim`` of the row's positions at a time in
    shared memory, each position's bag and scale worked out once (in float64, then
    cast, as the CPU); then every thread loads four gradient rows before it adds
    them in input order: the CPU's operations per column, four loads in flight.
    Nothing is written while an error is pending.
    """

    @cuda.jit(device=True)
    def fetch(grad, b, d, blank):
        if b >= 0:
            return load_lanes(grad, b, d, lanes)
        return blank

    @cuda.jit(device=True)
    def term(k, acc, g, scale, plain):
        if plain:
            return acc[k] + g[k]
        return fma(scale, g[k], acc[k])

    @cuda.jit(device=True)
    def won(k, acc, g, argmax, b, d, i):
        return acc[k] + g[k] if argmax[b, d + k] == i else acc[k]

    @cuda.jit(device=True)
    def add(acc, g, b, i, scale, plain, argmax, d):
        if b < 0:
            return acc
        if mode == MAX:
            return per_lane(won, lanes, acc, g, argmax, b, d, i)
        return per_lane(term, lanes, acc, g, scale, plain)

    @cuda.jit
    def _table_grad(grad, rows, starts, counts, order, used, bag_of, bag_sizes, psw, weighted,
                    argmax, scale_by_freq, out, dense, zero, word):
        bags_s = cuda.shared.array(THREADS, int64)
        positions_s = cuda.shared.array(THREADS, int64)
        scales_s = cuda.shared.array(THREADS, float64)
        if errors.is_pending(word):  # (the same answer in every thread: no kernel sets it)
            return
        dim = out.shape[1]
        t = cuda.threadIdx.x
        step = cuda.blockDim.x
        vectors = dim // lanes
        plain = scale_by_freq == 0 and mode == SUM and weighted == 0
        blank = per_lane(_same, lanes, zero)
        start = per_lane(_same, lanes, -zero) if plain else blank  # the CPU's -0.0 start
        for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
            target = rows[j] if dense else j
            count = counts[j]
            first = starts[j]
            last = first + count
            for v0 in range(0, vectors, step):  # every thread, so the barriers are uniform
                d = (v0 + t) * lanes
                active = d < dim
                acc = start
                for base in range(first, last, step):
                    cuda.syncthreads()  # the previous positions were read
                    k = base + t
                    b = int64(-1)
                    scale = 1.0  # (unused where plain, in max mode and past the group)
                    if k < last:
                        i = order[k]
                        b = bag_of[i]
                        positions_s[t] = i
                        if not plain and mode != MAX:
                            if scale_by_freq:
                                scale /= count
                            if mode == MEAN:
                                scale /= bag_sizes[b]
                            if weighted:
                                scale *= float(psw[i])
                    else:  # past the group: read (not used) by the loop's groups of 4
                        positions_s[t] = 0
                    scales_s[t] = float64(cast_like(scale, zero))
                    bags_s[t] = b
                    cuda.syncthreads()
                    if not active:
                        continue
                    for m in range(0, min(step, last - base), 4):
                        b0, b1, b2, b3 = bags_s[m], bags_s[m + 1], bags_s[m + 2], bags_s[m + 3]
                        g0 = fetch(grad, b0, d, blank)
                        g1 = fetch(grad, b1, d, blank)
                        g2 = fetch(grad, b2, d, blank)
                        g3 = fetch(grad, b3, d, blank)
                        acc = add(acc, g0, b0, positions_s[m], cast_like(scales_s[m], zero),
                                  plain, argmax, d)
                        acc = add(acc, g1, b1, positions_s[m + 1],
                                  cast_like(scales_s[m + 1], zero), plain, argmax, d)
                        acc = add(acc, g2, b2, positions_s[m + 2],
                                  cast_like(scales_s[m + 2], zero), plain, argmax, d)
                        acc = add(acc, g3, b3, positions_s[m + 3],
                                  cast_like(scales_s[m + 3], zero), plain, argmax, d)
                if active:
                    store_lanes(out, target, d, acc)

    return _table_grad


@cuda.jit
def _weights_grad(grad, flat, bag_of, weight, padding, out, fmt, zero, word):
    if errors.is_pending(word):
        return
    dim = grad.shape[1]
    for i in range(cuda.grid(1), flat.size, cuda.gridsize(1)):
        r = flat[i]
        acc = zero
        if r != padding and 0 <= r < weight.shape[0]:
            b = bag_of[i]
            for d in range(dim):
                acc += mul_rn(grad[b, d], widen(weight[r, d], fmt))
        out[i] = acc
