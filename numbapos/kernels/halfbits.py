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
  For both formats that is a compare of integers: the random bits against the
  float32 bits the rounding drops (:func:`bf16_from_f32_bits_stochastic`,
  :func:`f16_from_f32_bits_stochastic`).

The conversions in the hot loops of the kernels (widening, rounding to
nearest and stochastically) are Python functions, which the simulator runs,
with jitted implementations in 32-bit LLVM operations for both targets
(``_*_i32`` intrinsics, branch-free): Numba's int64 arithmetic would halve
the lanes of the vectorised loops, and its branches kept some of them scalar.

Kernels that need the value read it through the float32 bits
(``f32_from_bits(half_to_f32_bits(h, fmt))``, exact, vectorised). The CUDA
max-norm kernel uses :func:`half_value` / :func:`f32_value_bits`, exact
conversions through ``math.ldexp`` / ``math.frexp`` that need no bit cast;
on the CPU they cost 30x a float32 max-norm, so its kernel reads bits.
"""

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload, register_jitable

from .._args import TableFormat
from .rowwise import _from_bits, _to_bits
from .scalar import f32_bits, f32_from_bits

# The 16-bit formats (numbapos._args.TableFormat), as the kernel sources compare them:
# plain ints, which Numba types as literals (the functions they are passed to are
# specialised on them and their branches pruned, as before the enum); an IntEnum member
# would be a run-time IntEnum<int64> argument, another specialisation.
BF16 = int(TableFormat.BF16)
F16 = int(TableFormat.F16)
_TWO_M14 = np.float32(2.0 ** -14)
_I32, _I16, _F32 = ir.IntType(32), ir.IntType(16), ir.FloatType()


def _i32(value):
    """An i32 constant of the intrinsics' code."""
    return ir.Constant(_I32, value)


@register_jitable
def bf16_to_f32_bits(h):
    """The float32 bits of the bfloat16 bits ``h``: a 16-bit shift."""
    return np.uint32(np.int64(h) << 16)


def f16_to_f32_bits(h):
    """The float32 bits of the float16 bits ``h`` (exact, as NumPy's conversion).

    Branch-free, so the loops that widen float16 rows vectorise (Giesen's
    ``half_to_float``): the exponent is rebased by 112; an infinity or NaN
    (payload kept) by 112 more; a zero or subnormal ``m * 2**-24`` is made the
    normal float32 ``2**-14 * (1 + m / 1024)``, from which an exact float32
    subtraction of ``2**-14`` leaves ``m * 2**-24``. Jitted, it runs in 32-bit
    operations (:func:`_f16_widen_i32`; Numba's int64 arithmetic put the loops in
    64-bit lanes).
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


@intrinsic
def _f16_widen_i32(typingctx, h):
    # f16_to_f32_bits in i32 lanes, the same selects and float32 subtraction.
    if not isinstance(h, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        bits16 = builder.and_(context.cast(builder, args[0], signature.args[0], types.uint32),
                              _i32(0xFFFF))
        magnitude = builder.shl(builder.and_(bits16, _i32(0x7FFF)), _i32(13))
        exponent = builder.and_(magnitude, _i32(0x0F800000))
        bits = builder.add(magnitude, _i32(0x38000000))
        special = builder.add(bits, _i32(0x38000000))
        normalised = builder.bitcast(builder.add(bits, _i32(0x00800000)), _F32)
        subnormal = builder.bitcast(builder.fsub(normalised, ir.Constant(_F32, 2.0 ** -14)), _I32)
        bits = builder.select(builder.icmp_unsigned("==", exponent, _i32(0x0F800000)),
                              special, bits)
        bits = builder.select(builder.icmp_unsigned("==", exponent, _i32(0)), subnormal, bits)
        return builder.or_(bits, builder.shl(builder.and_(bits16, _i32(0x8000)), _i32(16)))

    return types.uint32(h), codegen


@overload(f16_to_f32_bits, target="generic", inline="always")
def _f16_to_f32_bits(h):
    return lambda h: _f16_widen_i32(h)


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
    # f32_bits_to_bf16 in i32 lanes: in Numba's int64 arithmetic, with its NaN branch, the
    # loops that store bfloat16 rows to nearest (a bfloat16 momentum buffer, steps without
    # stochastic rounding) were slower: a bfloat16-momentum SGD step in L2 took 0.66-0.68
    # instead of 0.58-0.61 ns an element.
    # No overflow: a finite or infinite u is at most 0xFF800000, plus at most 0x8000.
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        bits = context.cast(builder, args[0], signature.args[0], types.uint32)
        nan = builder.icmp_unsigned(">", builder.and_(bits, _i32(0x7FFFFFFF)),
                                    _i32(0x7F800000))
        high = builder.lshr(bits, _i32(16))
        tie_to_even = builder.add(_i32(0x7FFF),
                                  builder.and_(high, _i32(1)))
        rounded = builder.lshr(builder.add(bits, tie_to_even), _i32(16))
        quiet = builder.or_(builder.and_(high, _i32(0x8000)),
                            _i32(0x7FC0))
        return builder.trunc(builder.select(nan, quiet, rounded), _I16)

    return types.uint16(u), codegen


@overload(f32_bits_to_bf16, target="generic", inline="always")
def _f32_bits_to_bf16(u):
    return lambda u: _bf16_nearest_i32(u)


def f32_bits_to_f16(u):
    """The float16 nearest the float32 with bits ``u``: NumPy's ``npy_floatbits_to_halfbits``.
    Jitted, it runs branch-free in 32-bit operations (:func:`_f16_nearest_i32`)."""
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


@intrinsic
def _f16_nearest_i32(typingctx, u):
    # f32_bits_to_f16 in i32 lanes: its three ranges computed and selected (the shift of
    # the subnormal case clamped: only 1..11 is ever selected). With this and
    # _f16_widen_i32, a float16 SGD step rounding to nearest took 0.94 instead of 1.5 ns
    # an element in L2 (Numba's int64 arithmetic halves the lanes).
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        def round_up_unless_even_tie(fraction, sticky):
            # fraction + 0x1000 unless its low 14 bits are exactly the even tie 0x1000
            # and no bit below them (sticky) was set.
            tie = builder.and_(builder.icmp_unsigned("==", builder.and_(fraction, _i32(0x3FFF)),
                                                     _i32(0x1000)),
                               builder.icmp_unsigned("==", sticky, _i32(0)))
            return builder.add(fraction, builder.select(tie, _i32(0), _i32(0x1000)))

        bits = context.cast(builder, args[0], signature.args[0], types.uint32)
        exponent = builder.and_(bits, _i32(0x7F800000))
        fraction = builder.and_(bits, _i32(0x007FFFFF))
        sign = builder.and_(builder.lshr(bits, _i32(16)), _i32(0x8000))
        # normal
        rounded = round_up_unless_even_tie(fraction, _i32(0))
        normal = builder.add(builder.lshr(builder.sub(exponent, _i32(0x38000000)), _i32(13)),
                             builder.lshr(rounded, _i32(13)))
        # subnormal: shift by 113 - e, in 1..11 where selected
        e = builder.lshr(exponent, _i32(23))
        shift = builder.sub(_i32(113), e)
        shift = builder.select(builder.icmp_unsigned("<", shift, _i32(31)), shift, _i32(31))
        significand = builder.lshr(builder.add(_i32(0x00800000), fraction), shift)
        sub = builder.lshr(round_up_unless_even_tie(significand,
                                                    builder.and_(bits, _i32(0x7FF))),
                           _i32(13))
        sub = builder.select(builder.icmp_unsigned("<", exponent, _i32(0x33000000)),
                             _i32(0), sub)
        # infinity, overflow and NaN (at least one payload bit kept)
        top = builder.lshr(fraction, _i32(13))
        payload = builder.select(builder.icmp_unsigned("!=", top, _i32(0)), top, _i32(1))
        nan = builder.and_(builder.icmp_unsigned("==", exponent, _i32(0x7F800000)),
                           builder.icmp_unsigned("!=", fraction, _i32(0)))
        special = builder.add(_i32(0x7C00), builder.select(nan, payload, _i32(0)))
        magnitude = builder.select(builder.icmp_unsigned(">=", exponent, _i32(0x47800000)),
                                   special, normal)
        magnitude = builder.select(builder.icmp_unsigned("<=", exponent, _i32(0x38000000)),
                                   sub, magnitude)
        return builder.trunc(builder.add(sign, magnitude), _I16)

    return types.uint16(u), codegen


@overload(f32_bits_to_f16, target="generic", inline="always")
def _f32_bits_to_f16(u):
    return lambda u: _f16_nearest_i32(u)


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
    lo)`` rounded up to a multiple of 2**-16. Values that are exact stay;
    infinities and NaN round as :func:`half_from_f32_bits`; above the largest
    finite 16-bit value the step up is to infinity (as if the next binade
    existed), so a finite value never becomes infinite unless it lies beyond
    that value. Both formats compare integers (:func:`bf16_from_f32_bits_stochastic`,
    :func:`f16_from_f32_bits_stochastic`), in 32-bit lanes when jitted.
    """
    if fmt == BF16:
        return bf16_from_f32_bits_stochastic(u, random16)
    return f16_from_f32_bits_stochastic(u, random16)


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


def f16_from_f32_bits_stochastic(u, random16):
    """:func:`half_from_f32_bits_stochastic` for float16, in integer operations.

    Within float16's normal range a step is 2**13 float32 units, so ``(|x| -
    lo) / (hi - lo)`` is the 13 dropped bits over 2**13: up iff ``random16 <
    dropped * 8``. Below it (float16 subnormals, steps of 2**-24) the float32
    significand is shifted right by ``s = 126 - exponent`` (14 or more): the
    bits shifted out over ``2**s``, so up iff ``random16 * 2**s < dropped *
    2**16``, which integers decide exactly. From 65,536 on, infinity. The same
    decisions as the float64 comparison the docstring above states (tested
    against it). Jitted, it runs in 32-bit operations (:func:`_f16_stochastic_i32`).
    """
    u = int(u) & 0xFFFFFFFF
    magnitude = u & 0x7FFFFFFF
    if magnitude >= 0x7F800000:
        return f32_bits_to_f16(u)
    sign = (u >> 16) & 0x8000
    if magnitude >= 0x47800000:  # 65,536 or more
        return np.uint16(sign | 0x7C00)
    exponent = magnitude >> 23
    if exponent >= 113:  # float16 normal range (a carry reaches the next binade)
        low = (magnitude - 0x38000000) >> 13
        threshold = (magnitude & 0x1FFF) << 3
    else:
        significand = (magnitude & 0x7FFFFF) | (0x800000 if exponent else 0)
        shift = 126 - max(exponent, 1)
        low = significand >> shift
        dropped = significand & ((1 << shift) - 1)
        excess = shift - 16
        if excess <= 0:
            threshold = dropped << -excess
        else:  # random16 * 2**excess < dropped, with random16 an integer
            threshold = (dropped + (1 << excess) - 1) >> excess
    up = 1 if (int(random16) & 0xFFFF) < threshold else 0
    return np.uint16(sign | (low + up))


@intrinsic
def _f16_stochastic_i32(typingctx, u, random16):
    # f16_from_f32_bits_stochastic in i32 lanes, branch-free (both ranges computed and
    # selected, shifts clamped below 32: a significand has 24 bits, so a shift of 24 or
    # more gives what any larger one gives).
    if not (isinstance(u, types.Integer) and isinstance(random16, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        def smaller(a, b):
            return builder.select(builder.icmp_unsigned("<", a, b), a, b)

        bits = context.cast(builder, args[0], signature.args[0], types.uint32)
        random = builder.and_(context.cast(builder, args[1], signature.args[1], types.uint32),
                              _i32(0xFFFF))
        magnitude = builder.and_(bits, _i32(0x7FFFFFFF))
        sign = builder.and_(builder.lshr(bits, _i32(16)), _i32(0x8000))
        exponent = builder.lshr(magnitude, _i32(23))
        fraction = builder.and_(magnitude, _i32(0x7FFFFF))
        # float16 normal range
        normal_low = builder.lshr(builder.sub(magnitude, _i32(0x38000000)), _i32(13))
        normal_threshold = builder.shl(builder.and_(magnitude, _i32(0x1FFF)), _i32(3))
        # float16 subnormals and below
        significand = builder.or_(fraction, builder.select(
            builder.icmp_unsigned("!=", exponent, _i32(0)), _i32(0x800000), _i32(0)))
        shift = builder.sub(_i32(126), builder.select(
            builder.icmp_unsigned("<", exponent, _i32(1)), _i32(1), exponent))
        clamped = smaller(shift, _i32(31))
        sub_low = builder.lshr(significand, clamped)
        dropped = builder.and_(significand, builder.sub(builder.shl(_i32(1), clamped),
                                                          _i32(1)))
        excess = smaller(builder.sub(shift, _i32(16)), _i32(30))  # shift >= 14
        widened = builder.shl(dropped, builder.sub(_i32(16), smaller(shift, _i32(16))))
        ceiling = builder.lshr(builder.add(dropped, builder.sub(builder.shl(_i32(1), excess),
                                                                _i32(1))), excess)
        sub_threshold = builder.select(builder.icmp_unsigned("<=", shift, _i32(16)),
                                       widened, ceiling)
        is_normal = builder.icmp_unsigned(">=", exponent, _i32(113))
        low = builder.select(is_normal, normal_low, sub_low)
        threshold = builder.select(is_normal, normal_threshold, sub_threshold)
        up = builder.zext(builder.icmp_unsigned("<", random, threshold), _I32)
        rounded = builder.or_(sign, builder.add(low, up))
        # 65,536 or more: infinity; infinity or NaN: as to nearest (NaN keeps the top of
        # its payload, at least one bit of it).
        top = builder.lshr(fraction, _i32(13))
        payload = builder.select(builder.icmp_unsigned("!=", fraction, _i32(0)),
                                 builder.select(builder.icmp_unsigned("!=", top, _i32(0)),
                                                top, _i32(1)), _i32(0))
        special = builder.or_(sign, builder.or_(_i32(0x7C00), payload))
        infinite = builder.or_(sign, _i32(0x7C00))
        out = builder.select(builder.icmp_unsigned(">=", magnitude, _i32(0x47800000)),
                             infinite, rounded)
        out = builder.select(builder.icmp_unsigned(">=", magnitude, _i32(0x7F800000)),
                             special, out)
        return builder.trunc(out, _I16)

    return types.uint16(u, random16), codegen


@overload(f16_from_f32_bits_stochastic, target="generic", inline="always")
def _f16_from_f32_bits_stochastic(u, random16):
    return lambda u, random16: _f16_stochastic_i32(u, random16)


@intrinsic
def _bf16_stochastic_i32(typingctx, u, random16):
    # bf16_from_f32_bits_stochastic in i32 lanes (Numba's int64 arithmetic would put the
    # compares of a vectorised loop in 64-bit lanes, twice the instructions).
    if not (isinstance(u, types.Integer) and isinstance(random16, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        bits = context.cast(builder, args[0], signature.args[0], types.uint32)
        random = builder.and_(context.cast(builder, args[1], signature.args[1], types.uint32),
                              _i32(0xFFFF))
        nan = builder.icmp_unsigned(">", builder.and_(bits, _i32(0x7FFFFFFF)),
                                    _i32(0x7F800000))
        high = builder.lshr(bits, _i32(16))
        up = builder.icmp_unsigned("<", random, builder.and_(bits, _i32(0xFFFF)))
        rounded = builder.add(high, builder.zext(up, _I32))
        quiet = builder.or_(builder.and_(high, _i32(0x8000)),
                            _i32(0x7FC0))
        return builder.trunc(builder.select(nan, quiet, rounded), _I16)

    return types.uint16(u, random16), codegen


@overload(bf16_from_f32_bits_stochastic, target="generic", inline="always")
def _bf16_from_f32_bits_stochastic(u, random16):
    return lambda u, random16: _bf16_stochastic_i32(u, random16)
