"""CPU launchers and kernels for pooled lookups (``embedding_bag``) and their gradients.

Launchers (the names in ``__all__``, twinned in ``kernels/cuda/bag.py``) take
validated arrays and caller-owned outputs; ids arrive flat. A bag is described
by ``offsets`` and ``width``: with ``width > 0`` (2-D input) bag ``b`` holds
positions ``b * width .. (b + 1) * width``; with ``width == 0`` it holds
``offsets[b] .. offsets[b + 1]`` (the input's length for the last one).
``padding`` is the padding row or -1 for none; ``mode`` is :data:`SUM`,
:data:`MEAN` or :data:`MAX`.

The bits are PyTorch 2.13's CPU ones: sums in index order from zero, a mean
that divides the sum by the bag's length, weighted sums a fused multiply-add per
entry without padding (FBGEMM's kernel) and a rounded product added with it, a
max that keeps the first entry on ties. The table gradient groups positions by
row (the grouping of ``kernels/cpu/embedding.py``) and sums each row in input
order, one thread per row: bit-identical for any thread count.
"""

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..widen import widen
from .arrays import option, pick
from .jit import kernel
from .prefetch import AHEAD, half_prefetch_listed

__all__ = ["bag_positions", "bag_table_grad", "bag_weights_grad", "check_bag_offsets",
           "pool_bags"]

# The pooling modes as the kernels see them (numbapos.functional.bag maps the names).
SUM, MEAN, MAX = 0, 1, 2


# ---------------------------------------------------------------- launchers


def check_bag_offsets(offsets, size, exact_end):
    """The first problem of 1-D ``offsets`` for an input of ``size`` ids, or None.

    Returns ``(position, value)`` of the first offset that is not 0 (position 0),
    decreases, or passes ``size`` (or, with ``exact_end``, a last offset other
    than ``size``); the caller raises. The CUDA twin checks in the pooling
    kernel instead and returns None.
    """
    if offsets.size == 0:
        return None
    bad = _first_bad_offset(offsets, np.int64(size), exact_end)
    return None if bad < 0 else (int(bad), int(offsets[bad]))


def pool_bags(flat, offsets, width, weight, mode, padding, per_sample_weights, out, argmax,
              fmt):
    """``out[b]``: the sum, mean or max of the rows ``weight[flat[i]]`` of bag ``b``.

    ``weight`` is float32 / float64, or a 16-bit table's ``uint16`` bits of
    format ``fmt`` (pooled in float32 into a float32 ``out``). Padding entries
    are left out; a bag with no other entry gives zeros. ``per_sample_weights``
    (sum only) or None. ``argmax`` (max only, ``(B, D)`` int64, or None)
    receives the position in ``flat`` of each column's winner, -1 for none.
    """
    bags, dim = out.shape
    if bags == 0 or dim == 0:
        return
    kernel = pick(_pool, flat.size * dim + out.size)
    kernel(flat, offsets, np.int64(width), weight, np.int64(mode), np.int64(padding),
           per_sample_weights, out, argmax, np.int64(fmt))


def bag_positions(flat, offsets, width, padding, bag_of, sizes):
    """``bag_of[i]``: the bag of position ``i`` of ``flat``; ``sizes[b]``: the number of
    entries of bag ``b`` other than padding (both int64)."""
    if sizes.size:
        pick(_bag_of, flat.size)(flat, offsets, np.int64(width), np.int64(padding), bag_of,
                                 sizes)


def bag_table_grad(grad_output, groups, bag_of, bag_sizes, mode, per_sample_weights, argmax,
                   scale_grad_by_freq, out, dense):
    """The table gradient of a pooled lookup, row by row in input order.

    ``groups`` (:class:`~numbapos._args.RowGroups` of the ids, padding left out):
    group ``j``'s gradient is written to ``out[groups.rows[j]]`` when ``dense``
    (``out`` ``(V, D)``, zero-filled), else to ``out[j]``. Each position ``i``
    adds ``grad_output[bag_of[i]]``: as it is (sum), times ``per_sample_weights[i]``
    (weighted sum) or ``float(1 / bag_sizes[bag])`` (mean), column by column where
    ``argmax`` names it (max); with ``scale_grad_by_freq`` the scale is also
    divided by the group's size (the id's count over the whole input). The
    scaled terms are fused multiply-adds, as PyTorch's ``axpy``.
    """
    if groups.rows.size == 0 or out.shape[1] == 0:
        return
    kernel = pick(_table_grad, groups.order.size * out.shape[1])
    kernel(grad_output, groups.rows, groups.starts, groups.counts, groups.order, bag_of,
           bag_sizes, np.int64(mode), per_sample_weights, argmax, option(scale_grad_by_freq),
           out, option(dense))


def bag_weights_grad(grad_output, flat, bag_of, weight, padding, out, fmt):
    """``out[i] = dot(grad_output[bag_of[i]], weight[flat[i]])`` (0 at padding), in
    column order, accumulated in the output's dtype."""
    if flat.size:
        kernel = pick(_weights_grad, flat.size * weight.shape[1])
        kernel(grad_output, flat, bag_of, weight, np.int64(padding), out, np.int64(fmt))


# ---------------------------------------------------------------- kernels


@intrinsic
def fused_multiply_add(typingctx, a, b, c):
    """``a * b + c`` with one rounding, for float32 or float64 (``llvm.fma``)."""
    if not (a == b == c and a in (types.float32, types.float64)):
        return None

    def codegen(context, builder, signature, args):
        kind = ir.FloatType() if a == types.float32 else ir.DoubleType()
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(kind, [kind] * 3),
                                            f"llvm.fma.{'f32' if a == types.float32 else 'f64'}")
        return builder.call(fn, args)

    return a(a, a, a), codegen


@kernel()
def _first_bad_offset(offsets, size, exact_end):
    if offsets[0] != 0:
        return 0
    for k in range(1, offsets.size):
        if offsets[k] < offsets[k - 1]:
            return k
    last = offsets.size - 1
    if offsets[last] > size or (exact_end and offsets[last] != size):
        return last
    return -1


@kernel(inline="always")
def _prefetch_row_ahead(weight, flat, i):
    # Whole rows, twice the lookups' lookahead, on every CPU (the 16-bit kernels' line
    # count): a bag's sum does more work per row than a copy, and on the Intel VM that
    # leaves the lookups without prefetch it took 2.9 ms to 1.8 ms for 2,048 bags of
    # 20 rows of 128 floats (lookahead 8: 2.0 ms, 32: 1.9 ms).
    half_prefetch_listed(weight, flat, i + 2 * AHEAD)


@kernel(inline="always")
def _bag_bounds(offsets, width, size, b):
    if width > 0:
        return b * width, (b + 1) * width
    end = np.int64(offsets[b + 1]) if b + 1 < offsets.size else size
    return np.int64(offsets[b]), end


@kernel(parallel=True)
def _pool(flat, offsets, width, weight, mode, padding, psw, out, argmax, fmt):
    bags, dim = out.shape
    for b in prange(bags):
        start, end = _bag_bounds(offsets, width, np.int64(flat.size), b)
        acc = out[b]
        for d in range(dim):
            acc[d] = 0
        if mode == MAX:
            _max_bag(flat, start, end, weight, padding, acc, argmax, b, fmt)
            continue
        rest = start
        if psw is None and padding < 0:
            rest = _sum_fours(flat, start, end, weight, acc, fmt)
        used = rest - start
        for i in range(rest, end):
            _prefetch_row_ahead(weight, flat, i)  # runs on into the next bags
            r = flat[i]
            if r == padding:
                continue
            used += 1
            if psw is None:
                for d in range(dim):
                    acc[d] += widen(weight[r, d], fmt)
            else:
                s = acc.dtype.type(psw[i])
                if padding < 0:  # FBGEMM's kernel: one rounding per entry
                    for d in range(dim):
                        acc[d] = fused_multiply_add(s, acc.dtype.type(widen(weight[r, d], fmt)),
                                                    acc[d])
                else:  # PyTorch's own loop, taken with padding_idx: product, then sum
                    for d in range(dim):
                        acc[d] += s * widen(weight[r, d], fmt)
        if mode == MEAN and used > 1:
            count = acc.dtype.type(used)
            for d in range(dim):
                acc[d] /= count


@kernel(inline="always")
def _sum_fours(flat, start, end, weight, acc, fmt):
    # The entries four at a time, each element still summed in index order: one pass
    # over acc per four rows, four rows' loads in flight (2.5 -> 2.2 ms for the bags of
    # _prefetch_row_ahead). Returns where the remaining (fewer than four) entries start.
    i = start
    while i + 4 <= end:
        for k in range(4):
            _prefetch_row_ahead(weight, flat, i + k)
        r0, r1, r2, r3 = flat[i], flat[i + 1], flat[i + 2], flat[i + 3]
        for d in range(acc.size):
            acc[d] = (((acc[d] + widen(weight[r0, d], fmt)) + widen(weight[r1, d], fmt))
                      + widen(weight[r2, d], fmt)) + widen(weight[r3, d], fmt)
        i += 4
    return i


@kernel(inline="always")
def _max_bag(flat, start, end, weight, padding, acc, argmax, b, fmt):
    dim = acc.size
    first = True
    for i in range(start, end):
        _prefetch_row_ahead(weight, flat, i)
        r = flat[i]
        if r == padding:
            continue
        if first:
            for d in range(dim):
                acc[d] = widen(weight[r, d], fmt)
                if argmax is not None:
                    argmax[b, d] = i
            first = False
        else:
            for d in range(dim):
                value = widen(weight[r, d], fmt)
                if value > acc[d]:
                    acc[d] = value
                    if argmax is not None:
                        argmax[b, d] = i
    if first and argmax is not None:
        for d in range(dim):
            argmax[b, d] = -1


@kernel(parallel=True)
def _bag_of(flat, offsets, width, padding, bag_of, sizes):
    for b in prange(sizes.size):
        start, end = _bag_bounds(offsets, width, np.int64(flat.size), b)
        used = 0
        for i in range(start, end):
            bag_of[i] = b
            used += flat[i] != padding
        sizes[b] = used


@kernel(parallel=True)
def _table_grad(grad, rows, starts, counts, order, bag_of, bag_sizes, mode, psw, argmax,
                scale_by_freq, out, dense):
    dim = out.shape[1]
    for j in prange(rows.size):
        acc = out[rows[j]] if dense is not None else out[j]
        for d in range(dim):
            acc[d] = 0
        count = counts[j]
        for k in range(starts[j], starts[j] + count):
            i = order[k]
            b = bag_of[i]
            if argmax is not None:  # max mode
                for d in range(dim):
                    if argmax[b, d] == i:
                        acc[d] += grad[b, d]
                continue
            if scale_by_freq is None and mode == SUM and psw is None:
                for d in range(dim):
                    acc[d] += grad[b, d]
                continue
            scale = 1.0  # in double, then rounded: PyTorch's scale
            if scale_by_freq is not None:
                scale /= count
            if mode == MEAN:
                scale /= bag_sizes[b]
            if psw is not None:
                scale *= np.float64(psw[i])
            s = acc.dtype.type(scale)
            for d in range(dim):
                acc[d] = fused_multiply_add(s, grad[b, d], acc[d])


@kernel(parallel=True)
def _weights_grad(grad, flat, bag_of, weight, padding, out, fmt):
    dim = grad.shape[1]
    for i in prange(flat.size):
        r = flat[i]
        acc = out.dtype.type(0)
        if r != padding:
            b = bag_of[i]
            for d in range(dim):
                acc += grad[b, d] * widen(weight[r, d], fmt)
        out[i] = acc
