"""The counter-based dropout hash, written once and compiled for both devices.

Whether element ``index`` of a call is kept depends only on
``(seed, counter, index)``: :func:`dropout_bits` hashes the triple to 32
random bits and the element survives iff those bits are ``>= threshold``
(see :func:`numbapos._args.keep_threshold`). Nothing is stored between forward and backward,
the mask does not depend on the thread count or on how the loop is split, and
the CPU and the GPU draw the same mask bit for bit.

The hash is SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom
number generators", OOPSLA 2014), used as a counter-based generator::

    key  = mix64(mix64(seed + G) + counter * G)
    bits = mix64(key + index * G) >> 32

with ``G = 0x9E3779B97F4A7C15`` and ``mix64`` Stafford's "variant 13"
finaliser, all arithmetic modulo 2**64. For a fixed key the values
``mix64(key + index * G)`` are exactly SplitMix64's output stream, which
passes BigCrush; seeds and counters each go through a full ``mix64`` first, so
neighbouring seeds or counters give unrelated keys.

The keyed initialiser draws its normal values from the same generator:
:func:`keyed_normal` turns two 53-bit uniforms of the stream
``key(seed, row)``, at indices ``2 d`` and ``2 d + 1``, into one N(0, 1)
value by the Box-Muller transform, so element ``(row, d)`` of a table depends
on nothing else.

Stochastic rounding (16-bit tables) draws 16 bits per element from a
cheaper stream: one ``mix64`` per row and a 32-bit finaliser per element,
whose multiplies vectorise in 32-bit lanes on the CPU (four times the
elements of SplitMix64's 64-bit ones per instruction)::

    row_key = mix64(key + row * G) >> 32                  (once per row)
    bits16  = mix32(row_key + column * G32 mod 2**32) >> 16

with ``key = dropout_key(seed, step)``, ``G32 = 0x9E3779B9`` and ``mix32``
Wellons' ``lowbias32`` finaliser (hash-prospector: xorshift 16, multiply by
``0x7FEB352D``, xorshift 15, multiply by ``0x846CA68B``, xorshift 16; bias
0.17 per thousand). Each row gets its own 32-bit Weyl sequence, so element
``(row, column)`` depends on nothing else (any thread count, either device).

The functions are ``register_jitable`` (callable from ``@njit`` and
``@cuda.jit`` code, and, unchanged, from Python on the CUDA simulator), or,
for :func:`rounding_bits16`, a Python function with an implementation in
32-bit LLVM operations for both targets.
"""

import math

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload, register_jitable

GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX_M1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S32 = np.uint64(32)
_S11 = np.uint64(11)
_TWO_M53 = 2.0 ** -53
GOLDEN_GAMMA32 = 0x9E3779B9
_MIX32_M1 = 0x7FEB352D
_MIX32_M2 = 0x846CA68B
_MASK32 = 0xFFFFFFFF
_TWO_PI = 2.0 * math.pi



@register_jitable
def mix64(z):
    """Stafford's variant-13 64-bit finaliser (SplitMix64's output function)."""
    z = (z ^ (z >> _S30)) * _MIX_M1
    z = (z ^ (z >> _S27)) * _MIX_M2
    return z ^ (z >> _S31)


@register_jitable
def dropout_key(seed, counter):
    """The 64-bit stream key of one dropout call, from ``(seed, counter)``."""
    return mix64(mix64(np.uint64(seed) + GOLDEN_GAMMA) + np.uint64(counter) * GOLDEN_GAMMA)


@register_jitable
def dropout_bits_keyed(key, index):
    """32 random bits for element ``index`` of the stream ``key``, as a uint64 < 2**32."""
    return mix64(key + np.uint64(index) * GOLDEN_GAMMA) >> _S32


@register_jitable
def dropout_bits(seed, counter, index):
    """32 random bits for element ``index`` of call ``counter`` under ``seed``.

    Element ``index`` is kept iff the result is ``>= numbapos._args.keep_threshold(p)``.
    """
    return dropout_bits_keyed(dropout_key(seed, counter), index)


@register_jitable
def keeps(key, index, threshold):
    """True iff element ``index`` of stream ``key`` survives (``threshold`` a uint64)."""
    return dropout_bits_keyed(key, index) >= threshold


@register_jitable
def keyed_normal(seed, row, d):
    """A standard normal value (float64) for element ``d`` of row ``row`` under ``seed``.

    Box-Muller on two uniforms of the stream ``dropout_key(seed, row)``:
    ``u1`` in (0, 1] from index ``2 d``, ``u2`` in [0, 1) from ``2 d + 1``.
    """
    key = dropout_key(seed, row)
    index = np.uint64(d) * np.uint64(2)
    high = mix64(key + index * GOLDEN_GAMMA) >> _S11
    low = mix64(key + (index + np.uint64(1)) * GOLDEN_GAMMA) >> _S11
    u1 = (np.float64(high) + 1.0) * _TWO_M53
    u2 = np.float64(low) * _TWO_M53
    return math.sqrt(-2.0 * math.log(u1)) * math.cos(_TWO_PI * u2)


# ---------------------------------------------------------------- stochastic rounding


@register_jitable
def rounding_row_key(key, row):
    """The 32-bit key of row ``row``'s rounding stream under the call key ``key``
    (:func:`dropout_key` of the seed and the rounding step), as a uint32."""
    return np.uint32(mix64(key + np.uint64(row) * GOLDEN_GAMMA) >> _S32)


def rounding_bits16(row_key, column):
    """16 random bits (an integer in ``[0, 2**16)``) for element ``column`` of the row
    whose :func:`rounding_row_key` is ``row_key``: the top half of ``lowbias32(row_key +
    column * G32)``, all modulo 2**32."""
    return rounding_bits16_at(int(row_key) + int(column) * GOLDEN_GAMMA32)


def rounding_bits16_at(column_key):
    """:func:`rounding_bits16` of the element whose ``row_key + column * G32`` is
    ``column_key`` (an integer; only its low 32 bits count).

    A loop over a row's columns starts at ``np.uint64(row_key)`` and steps the key with
    :func:`next_column_key`: one addition per element where ``rounding_bits16`` multiplies.
    """
    x = int(column_key) & _MASK32
    x ^= x >> 16
    x = (x * _MIX32_M1) & _MASK32
    x ^= x >> 15
    x = (x * _MIX32_M2) & _MASK32
    x ^= x >> 16
    return np.uint32(x >> 16)


@register_jitable
def next_column_key(column_key):
    """The :func:`rounding_bits16_at` key of the next column (``column_key`` a uint64)."""
    return column_key + np.uint64(GOLDEN_GAMMA32)


@register_jitable
def rounding_bits(key, row, column):
    """:func:`rounding_bits16` of element ``(row, column)`` under the call key ``key``."""
    return rounding_bits16(rounding_row_key(key, row), column)


def _top16_of_lowbias32(builder, x):
    # lowbias32 of the i32 ``x``, shifted right by 16: its top 16 bits.
    i32 = ir.IntType(32)
    for shift, multiplier in ((16, _MIX32_M1), (15, _MIX32_M2)):
        x = builder.xor(x, builder.lshr(x, ir.Constant(i32, shift)))
        x = builder.mul(x, ir.Constant(i32, multiplier))
    x = builder.xor(x, builder.lshr(x, ir.Constant(i32, 16)))
    return builder.lshr(x, ir.Constant(i32, 16))


# rounding_bits16 and rounding_bits16_at in i32 operations: Numba would widen uint32
# arithmetic to 64 bits, and 64-bit lanes (and their multiplies) cost the vectorised
# loops two to three times.
@intrinsic
def _rounding_bits16_i32(typingctx, row_key, column):
    if not (isinstance(row_key, types.Integer) and isinstance(column, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        key = context.cast(builder, args[0], signature.args[0], types.uint32)
        col = context.cast(builder, args[1], signature.args[1], types.uint32)
        x = builder.add(key, builder.mul(col, ir.Constant(ir.IntType(32), GOLDEN_GAMMA32)))
        return _top16_of_lowbias32(builder, x)

    return types.uint32(row_key, column), codegen


@intrinsic
def _rounding_bits16_at_i32(typingctx, column_key):
    if not isinstance(column_key, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        x = context.cast(builder, args[0], signature.args[0], types.uint32)  # the low 32 bits
        return _top16_of_lowbias32(builder, x)

    return types.uint32(column_key), codegen


@overload(rounding_bits16, target="generic", inline="always")
def _rounding_bits16(row_key, column):
    return lambda row_key, column: _rounding_bits16_i32(row_key, column)


@overload(rounding_bits16_at, target="generic", inline="always")
def _rounding_bits16_at(column_key):
    return lambda column_key: _rounding_bits16_at_i32(column_key)
