"""Row operations written as explicit 16-lane vectors, for the CPU kernels.

LLVM's loop vectoriser uses 256-bit vectors on Intel processors with AVX-512
(their ``prefer-256-bit`` tuning), and Numba has no per-kernel switch to
change that. An operation written on 16-lane vectors in the IR is not
subject to that preference: it is lowered to one 512-bit instruction where
the processor has AVX-512 and split into narrower ones elsewhere (two 256-bit
halves with AVX2, NEON on Arm). The result is the same, lane by lane, on
every processor: these are the scalar operations of the kernels' loops,
applied to 16 elements at once.

Where it pays: decoding int8 rows into a float32 output that does not fit
in the second-level cache. A 512-bit store fills a whole cache line, so a
row takes half as many stores waiting on their lines (``docs/performance.rst``).
The int4 decode, which shuffles nibbles, gained nothing and keeps its loop.

Callers guarantee contiguous rows (column stride equal to the item size) and
16 elements inside both rows; the scalar loop does the rest of a row.
"""

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .rowaddress import row_address

__all__ = ["LANES", "decode8_block"]

LANES = 16
"""Elements per vector operation."""

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_FLOATS = ir.VectorType(ir.FloatType(), LANES)
_BYTES = ir.VectorType(ir.IntType(8), LANES)


def _element_address(context, builder, array_type, array, row, row_type, column):
    """The address of ``array[row, column]`` (i64) for contiguous rows."""
    start = row_address(context, builder, array_type, array, row, row_type)
    return builder.add(start, builder.mul(column,
                                          ir.Constant(_I64, array_type.dtype.bitwidth // 8)))


def _splat(builder, value):
    """A vector of ``LANES`` copies of a float32 value."""
    one = builder.insert_element(ir.Constant(_FLOATS, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(_FLOATS, ir.Undefined),
                                  ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))


@intrinsic
def decode8_block(typingctx, packed, r, out, i, d, scale, bias):
    """``out[i, d + k] = fma(float32(packed[r, d + k]), scale, bias)`` for ``k < LANES``.

    ``packed`` is a 2-D uint8 array, ``out`` a 2-D float32 one, ``scale`` and
    ``bias`` float32; one rounding per element, as ``llvm.fma.f32``.
    """
    if not (isinstance(packed, types.Array) and packed.ndim == 2 and packed.dtype == types.uint8
            and isinstance(out, types.Array) and out.ndim == 2 and out.dtype == types.float32
            and all(isinstance(x, types.Integer) for x in (r, i, d))
            and scale == types.float32 and bias == types.float32):
        return None

    def codegen(context, builder, signature, args):
        packed_t, r_t, out_t, i_t, d_t = signature.args[:5]
        column = context.cast(builder, args[4], d_t, types.int64)
        source = _element_address(context, builder, packed_t, args[0], args[1], r_t, column)
        target = _element_address(context, builder, out_t, args[2], args[3], i_t, column)
        codes = builder.load(builder.inttoptr(source, _BYTES.as_pointer()), align=1)
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_FLOATS, [_FLOATS] * 3), f"llvm.fma.v{LANES}f32")
        values = builder.call(fma, [builder.uitofp(codes, _FLOATS), _splat(builder, args[5]),
                                    _splat(builder, args[6])])
        builder.store(values, builder.inttoptr(target, _FLOATS.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.void(packed, r, out, i, d, scale, bias), codegen
