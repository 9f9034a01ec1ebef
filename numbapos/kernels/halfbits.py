"""Exact bfloat16 / float16 bit conversions, written once for both devices.

Numba cannot read bfloat16 (``ml_dtypes.bfloat16``), nor float16 on the CPU,
so kernels see a 16-bit table as its ``uint16`` bits and a float32 array as
its ``uint32`` bits where they only move numbers: these helpers turn 16-bit
patterns into float32 patterns and back with integer operations alone (int64
arithmetic, so the same source types the same way in ``@njit`` kernels, in
``@cuda.jit`` kernels and, unchanged, on the CUDA simulator), and every
device stores the same bits.

- bfloat16 -> float32 is a 16-bit shift (exact, NaN payloads kept).
- float32 -> bfloat16 rounds to nearest, ties to even, as ``ml_dtypes`` (and
  PyTorch's scalar cast) do: overflow gives an infinity, subnormals are kept,
  and a NaN becomes the quiet NaN ``0x7fc0`` with its sign.
- float16 <-> float32 is NumPy's ``npy_halfbits_to_floatbits`` /
  ``npy_floatbits_to_halfbits`` (round to nearest even, overflow to
  infinity, float16 subnormals exact; a NaN keeps the top of its payload).

- :func:`half_from_f32_bits_stochastic` rounds with 16 random bits instead
  (stochastic rounding, for optimiser updates): away from zero with
  probability (distance from the 16-bit value below) / (its step), to within
  2**-16 of a step, so the rounded value's expectation is the float32 value.
  Its bfloat16 case (:func:`bf16_from_f32_bits_stochastic`) is the hot one
  of every bfloat16 optimiser step: jitted, it runs in 32-bit operations (an
  LLVM intrinsic; int64 arithmetic would halve the lanes of the vectorised
  loops), and in Python on the simulator.

Kernels that need the value (max-norm, optimiser updates) use
:func:`half_value` / :func:`f32_value_bits`, exact conversions through
``math.ldexp`` / ``math.frexp`` that need no bit cast.
"""

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload, register_jitable

from .rowwise import _from_bits, _to_bits
from .scalar import f32_bits, f32_from_bits

BF16 = 0  # format codes of the launchers
F16 = 1
_TWO_M14 = np.float32(2.0 ** -14)


@register_jitable
def bf16_to_f32_bits(h):
    """The float32 bits of the bfloat16 bits ``h``: a 16-bit shift."""
    return np.uint32(np.int64(h) << 16)


@register_jitable
def f16_to_f32_bits(h):
    """The float32 bits of the float16 bits ``h`` (exact, as NumPy's conversion).

    Branch-free, so the loops that widen float16 rows vectorise (Giesen's
    ``half_to_float``): the exponent is rebased by 112; an infinity or NaN
    (payload kept) by 112 more; a zero or subnormal ``m * 2**-24`` is made the
    normal float32 ``2**-14 * (1 + m / 1024)``, from which an exact float32
    subtraction of ``2**-14`` leaves ``m * 2**-24``.
    """
    h = np.int64(h)
    magnitude = (h & 0x7FFF) << 13
    exponent = magnitude & 0x0F800000
    bits = magnitude + 0x38000000
    if exponent == 0x0F800000:  # infinity or NaN
        bits += 0x38000000
    elif exponent == 0:  # zero or subnormal
        bits = np.int64(f32_bits(f32_from_bits(bits + 0x00800000) - _TWO_M14))
    return np.uint32(bits | ((h & 0x8000) << 16))


@register_jitable
def half_to_f32_bits(h, fmt):
    """The float32 bits of the 16-bit pattern ``h`` of format ``fmt`` (BF16 or F16)."""
    if fmt == BF16:
        return bf16_to_f32_bits(h)
    return f16_to_f32_bits(h)


def f32_bits_to_bf16(u):
    """The bfloat16 nearest the float32 with bits ``u`` (ties to even; NaN -> quiet NaN).
    Jitted, it runs in 32-bit operations (:func:`_bf16_nearest_i32`)."""
    u = np.int64(u)
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return np.uint16(((u >> 16) & 0x8000) | 0x7FC0)
    return np.uint16(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)


@intrinsic
def _bf16_nearest_i32(typingctx, u):
    # f32_bits_to_bf16 in i32 lanes: with Numba's int64 arithmetic and its NaN branch the
    # loops that store bfloat16 rows to nearest (a bfloat16 momentum buffer, steps without
    # stochastic rounding) stayed scalar, 2-5x slower than with float32 state.
    # No overflow: a finite or infinite u is at most 0xFF800000, plus at most 0x8000.
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        bits = context.cast(builder, args[0], signature.args[0], types.uint32)
        nan = builder.icmp_unsigned(">", builder.and_(bits, ir.Constant(i32, 0x7FFFFFFF)),
                                    ir.Constant(i32, 0x7F800000))
        high = builder.lshr(bits, ir.Constant(i32, 16))
        tie_to_even = builder.add(ir.Constant(i32, 0x7FFF),
                                  builder.and_(high, ir.Constant(i32, 1)))
        rounded = builder.lshr(builder.add(bits, tie_to_even), ir.Constant(i32, 16))
        quiet = builder.or_(builder.and_(high, ir.Constant(i32, 0x8000)),
                            ir.Constant(i32, 0x7FC0))
        return builder.trunc(builder.select(nan, quiet, rounded), ir.IntType(16))

    return types.uint16(u), codegen


@overload(f32_bits_to_bf16, target="generic", inline="always")
def _f32_bits_to_bf16(u):
    return lambda u: _bf16_nearest_i32(u)


@register_jitable
def f32_bits_to_f16(u):
    """The float16 nearest the float32 with bits ``u``: NumPy's ``npy_floatbits_to_halfbits``."""
    u = np.int64(u)
    exponent = u & 0x7F800000
    sign = (u & 0x80000000) >> 16
    if exponent >= 0x47800000:  # overflow, infinity or NaN
        if exponent == 0x7F800000:
            fraction = u & 0x007FFFFF
            if fraction != 0:
                nan = 0x7C00 + (fraction >> 13)
                if nan == 0x7C00:
                    nan += 1
                return np.uint16(sign + nan)
        return np.uint16(sign + 0x7C00)
    if exponent <= 0x38000000:  # a float16 subnormal or zero
        if exponent < 0x33000000:
            return np.uint16(sign)
        fraction = (0x00800000 + (u & 0x007FFFFF)) >> (113 - (exponent >> 23))
        if (fraction & 0x3FFF) != 0x1000 or (u & 0x7FF) != 0:
            fraction += 0x1000
        return np.uint16(sign + (fraction >> 13))
    fraction = u & 0x007FFFFF
    if (fraction & 0x3FFF) != 0x1000:
        fraction += 0x1000
    # A carry out of the fraction bumps the exponent (to infinity at the top): correct.
    return np.uint16(sign + ((exponent - 0x38000000) >> 13) + (fraction >> 13))


@register_jitable
def half_from_f32_bits(u, fmt):
    """The 16-bit pattern of format ``fmt`` nearest the float32 with bits ``u`` (ties to even)."""
    if fmt == BF16:
        return f32_bits_to_bf16(u)
    return f32_bits_to_f16(u)


@register_jitable
def half_from_f32_bits_stochastic(u, fmt, random16):
    """The float32 with bits ``u`` rounded stochastically to format ``fmt``.

    ``random16`` (an integer in ``[0, 2**16)``) decides: a value between the
    16-bit neighbours ``lo`` and ``hi`` (magnitudes, ``lo`` nearer zero) goes
    to ``hi`` iff ``random16 * (hi - lo) < (|x| - lo) * 2**16``, so with
    uniform random bits it goes there with probability ``(|x| - lo) / (hi -
    lo)`` rounded up to a multiple of 2**-16. All in float64, exactly (the
    values are float32 and 16-bit numbers of one binade). Values that are
    exact stay; infinities and NaN round as :func:`half_from_f32_bits`; above
    the largest finite 16-bit value the step up is to infinity (as if the
    next binade existed), so a finite value never becomes infinite unless it
    lies beyond that value.
    """
    if fmt == BF16:
        return bf16_from_f32_bits_stochastic(u, random16)
    u = np.int64(u)
    nearest = np.int64(half_from_f32_bits(u, fmt))
    if (u & 0x7FFFFFFF) >= 0x7F800000:
        return np.uint16(nearest)
    x = abs(np.float64(_from_bits(u & 0x7FFFFFFF, 8, 23)))
    magnitude = nearest & 0x7FFF
    near = np.float64(half_value(magnitude, fmt))
    if near == x:
        return np.uint16(nearest)
    if near > x:
        low = magnitude - 1
    else:
        low = magnitude
    high = low + 1
    low_value = np.float64(half_value(low, fmt))
    high_value = np.float64(half_value(high, fmt))
    if math.isinf(high_value):  # the step past the largest finite value
        high_value = 2.0 ** 128 if fmt == BF16 else 65536.0
    up = np.float64(random16) * (high_value - low_value) < (x - low_value) * 65536.0
    sign = (u >> 16) & 0x8000
    return np.uint16(sign | (high if up else low))


@register_jitable
def half_value(h, fmt):
    """The float32 value of the 16-bit pattern ``h`` of format ``fmt`` (exact, no bit cast)."""
    if fmt == BF16:
        return _from_bits(h, 8, 7)
    return _from_bits(h, 5, 10)


@register_jitable
def f32_value_bits(x):
    """The float32 bits of the float32 value ``x``, infinities and NaN included (no bit cast)."""
    if math.isnan(x):
        return np.int64(0x7FC00000)
    if math.isinf(x):
        return np.int64(0x7F800000) if x > 0 else np.int64(0xFF800000)
    return np.int64(_to_bits(np.float32(x), 8, 23))


def bf16_from_f32_bits_stochastic(u, random16):
    """:func:`half_from_f32_bits_stochastic` for bfloat16, where the step is 2**16 float32
    units: up (away from zero) iff ``random16`` < the 16 dropped bits; NaN as to nearest.
    Jitted, it runs in 32-bit operations (:func:`_bf16_stochastic_i32`)."""
    u = int(u) & 0xFFFFFFFF
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return f32_bits_to_bf16(u)
    up = 1 if (int(random16) & 0xFFFF) < (u & 0xFFFF) else 0
    return np.uint16(((u >> 16) + up) & 0xFFFF)


@intrinsic
def _bf16_stochastic_i32(typingctx, u, random16):
    # bf16_from_f32_bits_stochastic in i32 lanes (Numba's int64 arithmetic would put the
    # compares of a vectorised loop in 64-bit lanes, twice the instructions).
    if not (isinstance(u, types.Integer) and isinstance(random16, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        bits = context.cast(builder, args[0], signature.args[0], types.uint32)
        random = builder.and_(context.cast(builder, args[1], signature.args[1], types.uint32),
                              ir.Constant(i32, 0xFFFF))
        nan = builder.icmp_unsigned(">", builder.and_(bits, ir.Constant(i32, 0x7FFFFFFF)),
                                    ir.Constant(i32, 0x7F800000))
        high = builder.lshr(bits, ir.Constant(i32, 16))
        up = builder.icmp_unsigned("<", random, builder.and_(bits, ir.Constant(i32, 0xFFFF)))
        rounded = builder.add(high, builder.zext(up, i32))
        quiet = builder.or_(builder.and_(high, ir.Constant(i32, 0x8000)),
                            ir.Constant(i32, 0x7FC0))
        return builder.trunc(builder.select(nan, quiet, rounded), ir.IntType(16))

    return types.uint16(u, random16), codegen


@overload(bf16_from_f32_bits_stochastic, target="generic", inline="always")
def _bf16_from_f32_bits_stochastic(u, random16):
    return lambda u, random16: _bf16_stochastic_i32(u, random16)
