"""``row_address``: the address of a 2-D array's row, for the CPU intrinsics' code.

The intrinsics that copy, prefetch or decode whole rows (:mod:`.rowcopy`,
:mod:`.prefetch`, :mod:`.wide`) work on raw addresses; this is the one place
that computes them from a Numba array (its data pointer and row stride).
"""

from llvmlite import ir
from numba import types

__all__ = []  # a code generation helper, not a launcher

I64 = ir.IntType(64)


def row_address(context, builder, array_type, array, row, row_type):
    """The address (i64) of ``array[row, 0]`` for the 2-D Numba array value ``array``."""
    data = context.make_array(array_type)(context, builder, array)
    row = context.cast(builder, row, row_type, types.int64)
    return builder.add(builder.ptrtoint(data.data, I64),
                       builder.mul(row, builder.extract_value(data.strides, 0)))
