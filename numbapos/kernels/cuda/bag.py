"""CUDA launchers and kernels for pooled lookups (``embedding_bag``) and their gradients.

The twin of ``kernels/cpu/bag.py`` (same ``__all__``, signatures and bits). One
block per bag (or per row group), grid-stride over them, the threads of a block
along D: loads and stores of a row coalesce, and each thread adds its column's
terms in index order, as the CPU does. Ids are checked as they are read and a
bad one is recorded in the deferred error word (:mod:`.errors`); bad offsets
are recorded there too (as a position error naming ``offsets``). The gradient
kernels, which write caller-visible state, return while an error is pending.
Rows are grouped on the device (``group_rows`` of :mod:`.embedding`) and each
row summed in input order: no float atomics, the CPU's bits.

Products that feed a sum go through :func:`.fpmath.mul_rn` (NVVM would fuse
them) and the fused multiply-adds through :func:`fma`, so the GPU rounds where
the CPU does.
"""

import math
from fractions import Fraction

import numpy as np
from numba import config, cuda, int64

from ..._gpuhost.launch import launch
from ..widen import widen
from . import errors
from .arrays import MAX_BLOCKS, THREADS, empty, grid
from .fpmath import cast_like, mul_rn
from .vector import row_threads

__all__ = ["bag_positions", "bag_table_grad", "bag_weights_grad", "check_bag_offsets",
           "pool_bags"]

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
        launch(_check_offsets, 1, 1, offsets, int64(size), 1 if exact_end else 0, word, host,
               errors.tag("offsets", "len(input) + 1 (offsets start at 0, never decrease; "
                          "the error's size)", "position"))
        errors.after_launch()
    return None


def pool_bags(flat, offsets, width, weight, mode, padding, per_sample_weights, out, argmax,
              fmt):
    """See the CPU twin; a bad id is recorded and left out of its bag."""
    bags, dim = out.shape
    if bags == 0 or dim == 0:
        return
    word, host = errors.words()
    psw = per_sample_weights if per_sample_weights is not None else out[:0, 0]
    winners = argmax if argmax is not None else empty((0, 1), np.int64)
    launch(_pool, min(bags, MAX_BLOCKS), row_threads(dim), flat, offsets, int64(width),
           weight, int64(mode), int64(padding), psw, 1 if per_sample_weights is not None else 0,
           out, winners, 1 if argmax is not None else 0, int64(fmt), out.dtype.type(0), word,
           host, errors.tag("input"))
    errors.after_launch()


def bag_positions(flat, offsets, width, padding, bag_of, sizes):
    """See the CPU twin."""
    if sizes.size:
        launch(_bag_of, grid(sizes.size), THREADS, flat, offsets, int64(width), int64(padding),
               bag_of, sizes)


def bag_table_grad(grad_output, groups, bag_of, bag_sizes, mode, per_sample_weights, argmax,
                   scale_grad_by_freq, out, dense):
    """See the CPU twin; the groups' count is read on the device (``groups.used``)."""
    if groups.rows.shape[0] == 0 or out.shape[1] == 0:
        return
    psw = per_sample_weights if per_sample_weights is not None else out[:0, 0]
    winners = argmax if argmax is not None else empty((0, 1), np.int64)
    launch(_table_grad, min(groups.rows.shape[0], MAX_BLOCKS), row_threads(out.shape[1]),
           grad_output, groups.rows, groups.starts, groups.counts, groups.order, groups.used,
           bag_of, bag_sizes, int64(mode), psw, 1 if per_sample_weights is not None else 0,
           winners, 1 if scale_grad_by_freq else 0, out, 1 if dense else 0,
           out.dtype.type(0), errors.device_word())


def bag_weights_grad(grad_output, flat, bag_of, weight, padding, out, fmt):
    """See the CPU twin (one thread per entry, columns in order)."""
    if flat.size:
        launch(_weights_grad, grid(flat.size), THREADS, grad_output, flat, bag_of, weight,
               int64(padding), out, int64(fmt), out.dtype.type(0), errors.device_word())


# ---------------------------------------------------------------- kernels


@cuda.jit
def _check_offsets(offsets, size, exact_end, word, host, which):
    last = offsets.size - 1
    for k in range(offsets.size):
        value = int64(offsets[k])
        if ((k == 0 and value != 0) or (k > 0 and value < offsets[k - 1]) or value > size
                or (k == last and exact_end and value != size)):
            errors.record(word, host, int64(k), value, size + 1, which)
            return


@cuda.jit(device=True)
def _bounds(offsets, width, size, b):
    """Bag ``b``'s positions ``[start, end)`` in ``flat`` (of ``size`` ids), kept inside
    ``[0, size]``: bad offsets are recorded by the kernel that checks them, never read past."""
    if width > 0:
        return b * width, (b + 1) * width
    start = int64(offsets[b])
    end = int64(offsets[b + 1]) if b + 1 < offsets.size else size
    return min(max(start, 0), size), min(max(end, 0), size)


@cuda.jit
def _pool(flat, offsets, width, weight, mode, padding, psw, weighted, out, argmax, winners,
          fmt, zero, word, host, which):
    bags, dim = out.shape
    size = int64(flat.size)
    for b in range(cuda.blockIdx.x, bags, cuda.gridDim.x):
        start, end = _bounds(offsets, width, size, b)
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            acc = zero
            used = 0
            best = -1
            for i in range(start, end):
                r = errors.checked(word, host, flat[i], i, weight.shape[0], which)
                if r < 0 or r == padding:
                    continue
                value = widen(weight[r, d], fmt)
                if mode == MAX:
                    if best < 0 or value > acc:
                        acc = value
                        best = i
                elif weighted == 0:
                    acc += value
                elif padding < 0:
                    acc = fma(psw[i], value, acc)
                else:
                    acc += mul_rn(psw[i], value)
                used += 1
            if mode == MEAN and used > 1:
                acc /= cast_like(used, zero)
            out[b, d] = acc
            if winners:
                argmax[b, d] = best


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
def _table_grad(grad, rows, starts, counts, order, used, bag_of, bag_sizes, mode, psw,
                weighted, argmax, scale_by_freq, out, dense, zero, word):
    if errors.is_pending(word):
        return
    dim = out.shape[1]
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        target = rows[j] if dense else j
        count = counts[j]
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            acc = zero
            for k in range(starts[j], starts[j] + count):
                i = order[k]
                b = bag_of[i]
                if mode == MAX:
                    if argmax[b, d] == i:
                        acc += grad[b, d]
                elif scale_by_freq == 0 and mode == SUM and weighted == 0:
                    acc += grad[b, d]
                else:
                    scale = 1.0
                    if scale_by_freq:
                        scale /= count
                    if mode == MEAN:
                        scale /= bag_sizes[b]
                    if weighted:
                        scale *= float(psw[i])
                    acc = fma(cast_like(scale, zero), grad[b, d], acc)
            out[target, d] = acc


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
