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
order, one thread per row: bit-identical for any thread count. A plain sum's
row starts from its first term, not from +0.0, as ``embedding``'s gradient
and the fused optimiser updates do (only the sign of a zero whose terms are
all -0.0 differs from PyTorch's dense gradient); :func:`bags_of_groups` lets
those updates sum a bag's gradient without storing it.

Float32 sums and means pool 128, 64, 32 or 16 columns at a time in registers
(:class:`Lanes`, also used by :mod:`.quantized`): every column still takes
its entries in index order with the same operations, so the bits are those
of the column-by-column loop, which does the other tables and the last
columns.
"""

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

from ..widen import widen
from .arrays import option, pick
from .jit import kernel
from .prefetch import AHEAD, half_prefetch_listed
from .rowaddress import row_address

__all__ = ["bag_positions", "bag_table_grad", "bag_weights_grad", "bags_of_groups",
           "check_bag_offsets", "pool_bags"]

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
    lanes = option(weight.dtype == np.float32 and weight.flags.c_contiguous
                   and out.flags.c_contiguous)
    kernel(flat, offsets, np.int64(width), weight, np.int64(mode), np.int64(padding),
           per_sample_weights, out, argmax, np.int64(fmt), lanes)


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


def bags_of_groups(groups, bag_of):
    """``groups`` (:class:`~numbapos._args.RowGroups`) with each position replaced by its
    bag: a plain sum's row groups as rows of ``grad_output``, for the fused optimiser
    updates (``order`` past the grouped positions is never read)."""
    return groups._replace(order=bag_of[groups.order])


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


# ---------------------------------------------------------------- register vectors


class Lanes(types.Type):
    """A float32 vector of ``count`` lanes (16 to 128) that LLVM keeps in registers.

    A bag's sum of 128 columns held in a local of this type stays in eight
    512-bit registers (sixteen 256-bit ones) across the bag's entries, where
    the column loop re-read and re-wrote the output row for every entry (the
    table's width is not known when a kernel is compiled, so LLVM cannot keep
    that loop's accumulators in registers). Each lane runs the scalar
    operation of that column: the same bits.
    """

    def __init__(self, count):
        self.count = count
        super().__init__(name=f"Lanes({count})")


@register_model(Lanes)
class _LanesModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, ir.VectorType(ir.FloatType(), fe_type.count))


_I8, _I32, _I64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)


def _element_address(context, builder, array_type, array, row, row_type, byte):
    """The address (i64) of byte ``byte`` (i64) of ``array``'s row ``row``."""
    return builder.add(row_address(context, builder, array_type, array, row, row_type), byte)


def _column_bytes(context, builder, column, column_type, item_bytes):
    column = context.cast(builder, column, column_type, types.int64)
    return builder.mul(column, ir.Constant(_I64, item_bytes))


def _vector(builder, value, value_type, lanes):
    """``value`` as ``lanes``: as it is when it is one, else a float32 splat."""
    if isinstance(value_type, Lanes):
        return value
    vector = ir.VectorType(ir.FloatType(), lanes)
    one = builder.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vector, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes))


def _lanes_of(*operands):
    """The :class:`Lanes` type among ``operands`` (the others float32), or None."""
    found = [t for t in operands if isinstance(t, Lanes)]
    if not found or any(t != found[0] for t in found):
        return None
    if any(t != types.float32 for t in operands if not isinstance(t, Lanes)):
        return None
    return found[0]


def _make_zeros(count):
    # zeros<count>(): Lanes(count) of +0.0, a bag's start (the column loop's acc[d] = 0).
    def zeros(typingctx):
        def codegen(context, builder, signature, args):
            return ir.Constant(ir.VectorType(ir.FloatType(), count), [0.0] * count)
        return Lanes(count)(), codegen
    zeros.__name__ = zeros.__qualname__ = f"zeros{count}"
    return intrinsic(zeros)


zeros128, zeros64, zeros32, zeros16 = (_make_zeros(n) for n in (128, 64, 32, 16))


@intrinsic
def load_lanes(typingctx, like, table, row, column):
    """``table[row, column:column + n]`` as float32 lanes (``n`` the lanes of ``like``):
    float32 elements as they are, uint8 ones as the integers they are (8-bit codes).
    The row must be contiguous (a C-contiguous 2-D table) and hold the ``n`` columns."""
    if not (isinstance(like, Lanes) and isinstance(table, types.Array) and table.ndim == 2
            and table.dtype in (types.float32, types.uint8)
            and isinstance(row, types.Integer) and isinstance(column, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        _, table_type, row_type, column_type = signature.args
        size = table_type.dtype.bitwidth // 8
        address = _element_address(context, builder, table_type, args[1], args[2], row_type,
                                    _column_bytes(context, builder, args[3], column_type, size))
        floats = ir.VectorType(ir.FloatType(), like.count)
        if table_type.dtype == types.float32:
            return builder.load(builder.inttoptr(address, floats.as_pointer()), align=4)
        codes = ir.VectorType(_I8, like.count)
        return builder.uitofp(builder.load(builder.inttoptr(address, codes.as_pointer()),
                                           align=1), floats)

    return like(like, table, row, column), codegen


@intrinsic
def load_nibble_lanes(typingctx, like, packed, row, column):
    """The 4-bit codes of columns ``column .. column + n`` (``column`` even) of the uint8
    ``packed`` row ``row`` as float32 lanes: byte ``column // 2 + k`` holds column
    ``column + 2k`` in its low nibble and ``column + 2k + 1`` in its high one."""
    if not (isinstance(like, Lanes) and isinstance(packed, types.Array) and packed.ndim == 2
            and packed.dtype == types.uint8
            and isinstance(row, types.Integer) and isinstance(column, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        _, packed_type, row_type, column_type = signature.args
        half = builder.ashr(context.cast(builder, args[3], column_type, types.int64),
                            ir.Constant(_I64, 1))
        address = _element_address(context, builder, packed_type, args[1], args[2], row_type,
                                   half)
        count = like.count
        byte_vector = ir.VectorType(_I8, count // 2)
        bytes_ = builder.load(builder.inttoptr(address, byte_vector.as_pointer()), align=1)
        low = builder.and_(bytes_, ir.Constant(byte_vector, [15] * (count // 2)))
        high = builder.lshr(bytes_, ir.Constant(byte_vector, [4] * (count // 2)))
        interleave = [k // 2 + (count // 2 if k % 2 else 0) for k in range(count)]
        codes = builder.shuffle_vector(low, high,
                                       ir.Constant(ir.VectorType(_I32, count), interleave))
        return builder.uitofp(codes, ir.VectorType(ir.FloatType(), count))

    return like(like, packed, row, column), codegen


@intrinsic
def store_lanes(typingctx, out, row, column, value):
    """``out[row, column:column + n] = value`` (a float32 C-contiguous 2-D ``out``)."""
    if not (isinstance(value, Lanes) and isinstance(out, types.Array) and out.ndim == 2
            and out.dtype == types.float32
            and isinstance(row, types.Integer) and isinstance(column, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        out_type, row_type, column_type, _ = signature.args
        address = _element_address(context, builder, out_type, args[0], args[1], row_type,
                                   _column_bytes(context, builder, args[2], column_type, 4))
        floats = ir.VectorType(ir.FloatType(), value.count)
        builder.store(args[3], builder.inttoptr(address, floats.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(out, row, column, value), codegen


def _lane_codegen(lanes, emit):
    def codegen(context, builder, signature, args):
        vectors = [_vector(builder, v, t, lanes.count)
                   for v, t in zip(args, signature.args, strict=True)]
        return emit(builder, lanes.count, *vectors)
    return codegen


def _make_lane_op(name, arity, emit):
    if arity == 2:
        def op(typingctx, a, b):
            lanes = _lanes_of(a, b)
            return None if lanes is None else (lanes(a, b), _lane_codegen(lanes, emit))
    else:
        def op(typingctx, a, b, c):
            lanes = _lanes_of(a, b, c)
            return None if lanes is None else (lanes(a, b, c), _lane_codegen(lanes, emit))
    op.__name__ = op.__qualname__ = name
    return intrinsic(op)


def _fma_lanes(builder, count, a, b, c):
    kind = ir.VectorType(ir.FloatType(), count)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(kind, [kind] * 3),
                                        f"llvm.fma.v{count}f32")
    return builder.call(fn, [a, b, c])


def _greater_lanes(builder, count, acc, value):
    return builder.select(builder.fcmp_ordered(">", value, acc), value, acc)


add_lanes = _make_lane_op("add_lanes", 2, lambda builder, count, a, b: builder.fadd(a, b))
add_lanes.__doc__ = "``a + b`` lane by lane (either may be a float32 scalar)."
mul_lanes = _make_lane_op("mul_lanes", 2, lambda builder, count, a, b: builder.fmul(a, b))
mul_lanes.__doc__ = "``a * b`` lane by lane (either may be a float32 scalar)."
fma_lanes = _make_lane_op("fma_lanes", 3, _fma_lanes)
fma_lanes.__doc__ = "``a * b + c`` lane by lane with one rounding (scalars are splat)."
greater_lanes = _make_lane_op("greater_lanes", 2, _greater_lanes)
greater_lanes.__doc__ = "``value`` where ``value > acc``, else ``acc`` (ties and NaN keep ``acc``)."


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
def _pool(flat, offsets, width, weight, mode, padding, psw, out, argmax, fmt, lanes):
    # lanes (True or None): weight and out are C-contiguous float32 (sums in Lanes).
    bags, dim = out.shape
    for b in prange(bags):
        start, end = _bag_bounds(offsets, width, np.int64(flat.size), b)
        acc = out[b]
        if mode == MAX:
            for d in range(dim):
                acc[d] = 0
            _max_bag(flat, start, end, weight, padding, acc, argmax, b, fmt)
            continue
        done = 0
        if lanes is not None:
            done = sum_in_lanes(flat, start, end, weight, padding, psw, out, b, 0, dim)
        if done < dim:
            _sum_columns(flat, start, end, weight, padding, psw, acc, done, fmt)
        if mode == MEAN:
            used = count_entries(flat, start, end, padding)
            if used > 1:
                count = acc.dtype.type(used)
                for d in range(dim):
                    acc[d] /= count


@kernel(inline="always")
def count_entries(flat, start, end, padding):
    """The entries of ``flat[start:end]`` other than ``padding`` (-1: none)."""
    if padding < 0:
        return end - start
    used = 0
    for i in range(start, end):
        used += flat[i] != padding
    return used


@kernel()
def sum_in_lanes(flat, start, end, weight, padding, psw, out, b, out_column, dim):
    # Sums the leading columns of one bag, rows weight[flat[i]], into out[b, out_column:]
    # in Lanes (C-contiguous float32 weight and out); returns how many columns, a
    # multiple of 16, of the dim to do. Not inlined into _pool: registers are then
    # allocated for these loops alone (inlined, the loop reloaded the table's address and
    # stride from the stack for every entry, and cache-resident bags took 0.16 instead of
    # 0.10-0.14 ms). The collections' kernel calls it per (table, feature) bag.
    done = 0
    while dim - done >= 128:
        _sum_block(flat, start, end, weight, padding, psw, out, b, done, out_column,
                   zeros128())
        done += 128
    if dim - done >= 64:
        _sum_block(flat, start, end, weight, padding, psw, out, b, done, out_column,
                   zeros64())
        done += 64
    if dim - done >= 32:
        _sum_block(flat, start, end, weight, padding, psw, out, b, done, out_column,
                   zeros32())
        done += 32
    if dim - done >= 16:
        _sum_block(flat, start, end, weight, padding, psw, out, b, done, out_column,
                   zeros16())
        done += 16
    return done


@kernel(inline="always")
def _sum_block(flat, start, end, weight, padding, psw, out, b, column, out_column, acc):
    # Columns column .. + lanes of bag b, each lane the column loop's operations in order.
    for i in range(start, end):
        _prefetch_row_ahead(weight, flat, i)
        r = flat[i]
        if r == padding:
            continue
        row = load_lanes(acc, weight, r, column)
        if psw is None:
            acc = add_lanes(acc, row)
        elif padding < 0:
            acc = fma_lanes(np.float32(psw[i]), row, acc)
        else:
            acc = add_lanes(acc, mul_lanes(np.float32(psw[i]), row))
    store_lanes(out, b, out_column + column, acc)


@kernel(inline="always")
def _sum_columns(flat, start, end, weight, padding, psw, acc, first, fmt):
    # Columns first .. D of one bag, column by column: FBGEMM's / PyTorch's operations.
    dim = acc.size
    for d in range(first, dim):
        acc[d] = 0
    rest = start
    if psw is None and padding < 0:
        rest = _sum_fours(flat, start, end, weight, acc, first, fmt)
    for i in range(rest, end):
        _prefetch_row_ahead(weight, flat, i)  # runs on into the next bags
        r = flat[i]
        if r == padding:
            continue
        if psw is None:
            for d in range(first, dim):
                acc[d] += widen(weight[r, d], fmt)
        else:
            s = acc.dtype.type(psw[i])
            if padding < 0:  # FBGEMM's kernel: one rounding per entry
                for d in range(first, dim):
                    acc[d] = fused_multiply_add(s, acc.dtype.type(widen(weight[r, d], fmt)),
                                                acc[d])
            else:  # PyTorch's own loop, taken with padding_idx: product, then sum
                for d in range(first, dim):
                    acc[d] += s * widen(weight[r, d], fmt)


@kernel(inline="always")
def _sum_fours(flat, start, end, weight, acc, first, fmt):
    # The entries four at a time, each element still summed in index order: one pass
    # over acc per four rows, four rows' loads in flight (2.5 -> 2.2 ms for the bags of
    # _prefetch_row_ahead). Returns where the remaining (fewer than four) entries start.
    i = start
    while i + 4 <= end:
        for k in range(4):
            _prefetch_row_ahead(weight, flat, i + k)
        r0, r1, r2, r3 = flat[i], flat[i + 1], flat[i + 2], flat[i + 3]
        for d in range(first, acc.size):
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
    plain = argmax is None and scale_by_freq is None and mode == SUM and psw is None
    # -0.0 + g is g: a plain sum starts from its first term, as the fused optimiser
    # updates' sums do (sum_segment), so fused and unfused steps give the same bits.
    start = -0.0 if plain else 0.0
    for j in prange(rows.size):
        acc = out[rows[j]] if dense is not None else out[j]
        for d in range(dim):
            acc[d] = start
        count = counts[j]
        for k in range(starts[j], starts[j] + count):
            i = order[k]
            b = bag_of[i]
            if argmax is not None:  # max mode
                for d in range(dim):
                    if argmax[b, d] == i:
                        acc[d] += grad[b, d]
                continue
            if plain:
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
