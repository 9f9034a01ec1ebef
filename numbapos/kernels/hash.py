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

The functions are ``register_jitable``: callable from ``@njit`` and
``@cuda.jit`` code (and, unchanged, from Python on the CUDA simulator).
"""

import math

import numpy as np
from numba.extending import register_jitable

GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX_M1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S32 = np.uint64(32)
_S11 = np.uint64(11)
_TWO_M53 = 2.0 ** -53
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
