"""CPU kernels for inverted dropout whose mask is a counter-based hash.

Whether element ``index`` of a call is kept depends only on
``(seed, counter, index)``: :func:`dropout_bits` hashes the triple to 32
random bits and the element survives iff those bits are ``>= threshold``
(see :func:`keep_threshold`). Nothing is stored between forward and backward,
the mask does not depend on the thread count or on how the loop is split, and
a ``@cuda.jit`` kernel can call the same function and draw the same mask.

The hash is SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom
number generators", OOPSLA 2014), used as a counter-based generator:

    key  = mix64(mix64(seed + G) + counter * G)
    bits = mix64(key + index * G) >> 32

with ``G = 0x9E3779B97F4A7C15`` and ``mix64`` Stafford's "variant 13"
finaliser, all arithmetic modulo 2**64. For a fixed key the values
``mix64(key + index * G)`` are exactly SplitMix64's output stream, which
passes BigCrush; seeds and counters each go through a full ``mix64`` first, so
neighbouring seeds or counters give unrelated keys.
"""

import numpy as np
from numba import njit, prange

GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX_M1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_M2 = np.uint64(0x94D049BB133111EB)
_S30 = np.uint64(30)
_S27 = np.uint64(27)
_S31 = np.uint64(31)
_S32 = np.uint64(32)

_TWO_32 = 1 << 32


@njit(inline="always", cache=True)
def mix64(z):
    """Stafford's variant-13 64-bit finaliser (SplitMix64's output function)."""
    z = (z ^ (z >> _S30)) * _MIX_M1
    z = (z ^ (z >> _S27)) * _MIX_M2
    return z ^ (z >> _S31)


@njit(inline="always", cache=True)
def dropout_key(seed, counter):
    """The 64-bit stream key of one dropout call, from ``(seed, counter)``."""
    return mix64(mix64(np.uint64(seed) + GOLDEN_GAMMA) + np.uint64(counter) * GOLDEN_GAMMA)


@njit(inline="always", cache=True)
def dropout_bits_keyed(key, index):
    """32 random bits for element ``index`` of the stream ``key`` (see :func:`dropout_key`)."""
    return np.uint32(mix64(key + np.uint64(index) * GOLDEN_GAMMA) >> _S32)


@njit(inline="always", cache=True)
def dropout_bits(seed, counter, index):
    """32 random bits (uint32) for element ``index`` of call ``counter`` under ``seed``.

    Pure integer arithmetic on uint64 (wrapping), so it runs unchanged in a
    ``@cuda.jit`` kernel. Element ``index`` is kept iff the result is
    ``>= keep_threshold(p)``.
    """
    return dropout_bits_keyed(dropout_key(seed, counter), index)


def keep_threshold(p):
    """The threshold ``t`` with ``P(dropout_bits >= t) = 1 - p`` (to within 2**-33).

    Parameters
    ----------
    p : float
        Drop probability in ``[0, 1]`` (not validated here).

    Returns
    -------
    int
        ``round(p * 2**32)`` as a Python int in ``[0, 2**32]``: 0 keeps every
        element, and ``2**32`` (p == 1) keeps none. ``2**32`` does not fit a
        uint32, so kernels compare in uint64, where ``bits >= 2**32`` is always
        false; a p just below 1 is capped at ``2**32 - 1`` so that it still
        keeps (very rarely) what it scales.
    """
    if p >= 1.0:
        return _TWO_32
    return min(int(round(p * _TWO_32)), _TWO_32 - 1)


@njit(cache=True, nogil=True)
def dropout_forward(x_flat, seed, counter, threshold, scale, out_flat):
    """``out[i] = x[i] * (scale if bits(i) >= threshold else 0)`` (serial, for small inputs).

    ``threshold`` is compared in uint64, so ``2**32`` drops everything. Dropped
    elements are multiplied by zero, not overwritten, so NaN and inf propagate
    as in PyTorch. ``out_flat`` may be ``x_flat`` itself (in place).
    """
    key = dropout_key(seed, counter)
    t = np.uint64(threshold)
    s = out_flat.dtype.type(scale)
    zero = out_flat.dtype.type(0)
    for i in range(x_flat.size):
        m = s if np.uint64(dropout_bits_keyed(key, i)) >= t else zero
        out_flat[i] = x_flat[i] * m


@njit(cache=True, nogil=True, parallel=True)
def dropout_forward_parallel(x_flat, seed, counter, threshold, scale, out_flat):
    """:func:`dropout_forward` with the elements split across threads (same result)."""
    key = dropout_key(seed, counter)
    t = np.uint64(threshold)
    s = out_flat.dtype.type(scale)
    zero = out_flat.dtype.type(0)
    for i in prange(x_flat.size):
        m = s if np.uint64(dropout_bits_keyed(key, i)) >= t else zero
        out_flat[i] = x_flat[i] * m


# The gradient of y = x * m is grad * m with the same m: backward is the forward
# kernel applied to the gradient, the mask regenerated from (seed, counter, index).
dropout_backward = dropout_forward
dropout_backward_parallel = dropout_forward_parallel


@njit(cache=True, nogil=True)
def dropout_keep_mask(seed, counter, threshold, out_flat):
    """``out[i] = bits(i) >= threshold``: the boolean keep-mask (serial)."""
    key = dropout_key(seed, counter)
    t = np.uint64(threshold)
    for i in range(out_flat.size):
        out_flat[i] = np.uint64(dropout_bits_keyed(key, i)) >= t


@njit(cache=True, nogil=True, parallel=True)
def dropout_keep_mask_parallel(seed, counter, threshold, out_flat):
    """:func:`dropout_keep_mask` with the elements split across threads (same result)."""
    key = dropout_key(seed, counter)
    t = np.uint64(threshold)
    for i in prange(out_flat.size):
        out_flat[i] = np.uint64(dropout_bits_keyed(key, i)) >= t
