"""Scalar helpers of the fused row-wise quantised formats, written once for both devices.

FBGEMM's fused row-wise tables (``torch.ops.quantized.embedding_bag_byte_prepack``
and ``embedding_bag_4bit_prepack``) keep each row's scale and bias in the
row's own bytes: two float32 after the 8-bit codes, two float16 after the
packed 4-bit codes, at byte offsets that need not be aligned. Kernels read
and write those numbers as bits: these helpers turn bits into values and
back, exactly, with integer and power-of-two float64 arithmetic only
(``math.frexp`` / ``math.ldexp`` / ``math.floor``), so the same source runs
in ``@njit`` kernels, in ``@cuda.jit`` kernels and, unchanged, on the CUDA
simulator, and every device stores and reads the same bits.

The quantisers refuse NaN and infinities, and rows whose scale or bias
would overflow (:func:`row_overflows`), so every number stored is finite; an
infinite or NaN pattern read back decodes to inf / NaN.
"""

import math

import numpy as np
from numba.extending import register_jitable

HALF_MAX = 65504.0  # the largest finite float16


@register_jitable
def round_half_even(y):
    """``y`` (a float64 below 2**52 in magnitude) rounded to an integer, ties to even.

    C's ``lrintf`` in the default rounding mode, written with ``floor`` so it
    means the same on every target.
    """
    low = math.floor(y)
    rest = y - low  # exact
    if rest > 0.5 or (rest == 0.5 and low - 2.0 * math.floor(low * 0.5) == 1.0):
        low += 1.0
    return low


@register_jitable
def _sign_and_magnitude(x):
    v = float(x)
    negative = v < 0.0 or (v == 0.0 and math.copysign(1.0, v) < 0.0)
    return negative, abs(v)


@register_jitable
def _to_bits(x, exponent_bits, fraction_bits):
    """The IEEE-754 bits of ``x``, exactly representable in a binary format with
    ``exponent_bits`` and ``fraction_bits`` (float32: 8, 23; float16: 5, 10)."""
    bias = (1 << (exponent_bits - 1)) - 1
    negative, v = _sign_and_magnitude(x)
    sign = (1 << (exponent_bits + fraction_bits)) if negative else 0
    if v == 0.0:
        return sign
    m, e = math.frexp(v)  # v = m * 2**e, 0.5 <= m < 1
    if e - 1 < 1 - bias:  # subnormal: v = k * 2**(1 - bias - fraction_bits)
        return sign | int(math.ldexp(v, bias - 1 + fraction_bits))
    return (sign | ((e - 1 + bias) << fraction_bits)
            | (int(math.ldexp(m, fraction_bits + 1)) - (1 << fraction_bits)))


@register_jitable
def _from_bits(u, exponent_bits, fraction_bits):
    """The value of IEEE-754 bits ``u`` of that binary format, as a float32 (exact for
    float32 and float16)."""
    bias = (1 << (exponent_bits - 1)) - 1
    top = (1 << exponent_bits) - 1
    u = int(u)
    exponent = (u >> fraction_bits) & top
    fraction = u & ((1 << fraction_bits) - 1)
    if exponent == top:
        v = math.inf if fraction == 0 else math.nan
    elif exponent == 0:
        v = math.ldexp(float(fraction), 1 - bias - fraction_bits)
    else:
        v = math.ldexp(float(fraction | (1 << fraction_bits)), exponent - bias - fraction_bits)
    if (u >> (exponent_bits + fraction_bits)) & 1:
        v = -v
    return np.float32(v)


@register_jitable
def f32_to_bits(x):
    """The IEEE-754 bits (as an int64 in ``[0, 2**32)``) of a finite float32 value."""
    return _to_bits(x, 8, 23)


@register_jitable
def f32_from_bits(u):
    """The float32 value of IEEE-754 bits ``u`` (an integer in ``[0, 2**32)``)."""
    return _from_bits(u, 8, 23)


@register_jitable
def f16_round(x):
    """The float16 nearest to the float32 ``x`` (ties to even), as a float32.

    C's ``cpu_half2float(cpu_float2half_rn(x))``: infinite beyond float16's
    range (from 65520 on), NaN stays NaN.
    """
    negative, v = _sign_and_magnitude(x)
    if v == 0.0 or math.isinf(v) or math.isnan(v):
        return np.float32(x)
    m, e = math.frexp(v)
    exponent = e - 1
    if exponent < -14:  # float16 subnormals: multiples of 2**-24
        q = math.ldexp(round_half_even(math.ldexp(v, 24)), -24)
    else:  # 11 significant bits
        q = math.ldexp(round_half_even(math.ldexp(v, 10 - exponent)), exponent - 10)
        if q > HALF_MAX:
            q = math.inf
    return np.float32(-q if negative else q)


@register_jitable
def f16_to_bits(q):
    """The float16 bits (an int in ``[0, 2**16)``) of a float32 value float16 holds exactly."""
    return _to_bits(q, 5, 10)


@register_jitable
def f16_from_bits(h):
    """The value of float16 bits ``h`` as a float32 (exact: float32 holds every float16)."""
    return _from_bits(h, 5, 10)


@register_jitable
def scale_bias_8bit(low, high):
    """Scale, bias and inverse scale of a row with minimum ``low`` and maximum ``high``.

    FBGEMM's ``FloatOrHalfToFused8BitRowwiseQuantizedSBFloat``, in float32:
    ``scale = (high - low) / 255``, ``bias = low`` and the codes' multiplier
    ``255 / (range + 1e-8)``.
    """
    span = np.float32(high - low)
    scale = np.float32(span / np.float32(255.0))
    inverse = np.float32(np.float32(255.0) / np.float32(span + np.float32(1e-8)))
    return scale, np.float32(low), inverse


@register_jitable
def scale_bias_4bit(low, high):
    """Scale, bias and inverse scale (float32 holding float16 values) of a 4-bit row.

    FBGEMM's ``FloatOrHalfToFusedNBitRowwiseQuantizedSBHalf`` with 4 bits: the
    minimum is rounded to float16 first (the stored bias), the scale is
    ``(high - bias) / 15`` rounded to float16 (1 for a constant row, or when
    it rounds to 0 or its inverse overflows).
    """
    bias = f16_round(low)
    span = np.float32(high - bias)
    scale = np.float32(1.0)
    if span != np.float32(0.0):
        scale = np.float32(span / np.float32(15.0))
    scale = f16_round(scale)
    if scale == np.float32(0.0):
        scale = np.float32(1.0)
    inverse = np.float32(np.float32(1.0) / scale)
    if math.isinf(inverse):
        scale = np.float32(1.0)
        inverse = np.float32(1.0)
    return scale, bias, inverse


@register_jitable
def code_8bit(x, low, inverse):
    """The 8-bit code of ``x``: ``lrintf((x - low) * inverse)`` in float32, no FMA."""
    y = np.float32(np.float32(x - low) * inverse)
    return int(round_half_even(float(y)))


@register_jitable
def code_4bit(x, bias, inverse):
    """The 4-bit code of ``x``: ``lrintf((x - bias) * inverse)`` clamped to ``[0, 15]``."""
    y = np.float32(np.float32(x - bias) * inverse)
    code = int(round_half_even(float(y)))
    return min(max(code, 0), 15)


@register_jitable
def unquantizable(x):
    """Whether a table value cannot be quantised: NaN or infinite."""
    return math.isnan(x) or math.isinf(x)


@register_jitable
def row_overflows(low, high, bits):
    """Whether a finite row from ``low`` to ``high`` overflows its format's scale or bias.

    8 bits: ``high - low`` overflows float32 (an infinite scale). 4 bits: the
    float16 bias (``low`` rounded) or the float16 scale is infinite: values
    need not lie within float16's range, but the minimum and a fifteenth of
    the row's span must.
    """
    if bits == 8:
        return math.isinf(np.float32(high - low))
    scale, bias, inverse = scale_bias_4bit(low, high)
    return math.isinf(bias) or math.isinf(scale)
