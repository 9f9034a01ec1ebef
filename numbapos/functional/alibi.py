"""ALiBi: per-head attention biases linear in the query-key distance (BLOOM, MPT, encoders)."""

from __future__ import annotations

import math

import numpy as np

from .. import _checks
from .._args import AlibiMode
from ._common import backend_for
from .blocks import _mask_to_positions

MODES = {"symmetric": AlibiMode.SYMMETRIC, "mpt": AlibiMode.MPT, "bloom": AlibiMode.BLOOM}


RECIPES = ("paper", "bloom", "mpt")


def alibi_slopes(num_heads, max_bias=8.0, dtype=np.float32, *, recipe="paper"):
    """ALiBi's head slopes, for any number of heads: the paper's, or BLOOM's / MPT's bits.

    For ``n`` heads, a power of two, the slopes are ``2 ** (-max_bias * k / n)``
    for ``k = 1 .. n``. Otherwise the ``m`` slopes of the largest power of two
    ``m < n`` come first, then every other slope of ``2 * m`` heads
    (``2 ** (-max_bias * (2j - 1) / (2m))``) up to ``n``. The recipes give these
    values with different roundings:

    - ``"paper"``: computed in float64 and rounded once to ``dtype`` (the exact
      values, to the format's precision);
    - ``"bloom"``: as transformers' BLOOM (``_get_alibi_slopes``, used by
      ``build_alibi_tensor``): the base ``2 ** (-max_bias / m)`` rounded to
      float32, then ``base ** k`` rounded to float32 (correctly, from the exact
      power); from 11 heads on some slopes are 1 ulp from the paper's
      (``0.49999997`` for ``0.5``);
    - ``"mpt"``: as transformers' ``build_mpt_alibi_tensor``: in float32,
      ``1 / 2 ** (k * (max_bias / m2))`` with ``m2`` the power of two ``>= n``,
      each operation rounded to float32 (from 65 heads on, some 1 ulp from the
      paper's).

    The ``"bloom"`` and ``"mpt"`` slopes are float32 values (widened exactly
    when ``dtype`` is float64). They are PyTorch's wherever its float32 ``pow``
    is correctly rounded, which it is not always: measured on the CPU for 1 to
    128 heads (PyTorch 2.13), MPT's (``max_bias=8``) are equal on every
    dispatch; BLOOM's are equal with ``ATEN_CPU_CAPABILITY=default``, while
    the vectorised ``pow`` (SLEEF, 1 ulp) rounds one slope the other way for 33
    head counts with AVX-512 and 65 with AVX2. To reproduce those bits, pass
    transformers' own slopes to the ops.

    Parameters
    ----------
    num_heads : int
        Number of heads (> 0).
    max_bias : float, default 8.0
        The paper's 8 (MPT's ``alibi_bias_max``; BLOOM's is always 8); > 0.
    dtype : float32 or float64, default float32
    recipe : {"paper", "bloom", "mpt"}, default "paper"
        Whose rounding (see above).

    Returns
    -------
    ndarray, shape (num_heads,)

    Raises
    ------
    TypeError
        A non-integer ``num_heads`` or non-real ``max_bias``.
    ValueError
        ``num_heads < 1``, ``max_bias <= 0`` or an unknown ``recipe``.

    Examples
    --------
    >>> import numbapos.functional as F
    >>> F.alibi_slopes(4)
    array([0.25      , 0.0625    , 0.015625  , 0.00390625], dtype=float32)
    >>> float(F.alibi_slopes(16)[1]), float(F.alibi_slopes(16, recipe="bloom")[1])
    (0.5, 0.4999999701976776)
    """
    num_heads = _checks.check_int(num_heads, "num_heads", minimum=1)
    max_bias = _checks.check_positive(max_bias, "max_bias")
    dtype = _checks.check_float_dtype(dtype)
    if not isinstance(recipe, str) or recipe not in RECIPES:
        raise ValueError(f"recipe: expected one of {list(RECIPES)}, got {_checks.quote(recipe)}")
    if recipe == "bloom":
        return _bloom_slopes(num_heads, max_bias).astype(dtype)
    if recipe == "mpt":
        return _mpt_slopes(num_heads, max_bias).astype(dtype)
    closest = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = 2.0 ** (-max_bias * np.arange(1, closest + 1) / closest)
    if closest != num_heads:
        extra = 2.0 ** (-max_bias * np.arange(1, 2 * (num_heads - closest), 2) / (2 * closest))
        slopes = np.concatenate([slopes, extra])
    return slopes.astype(dtype)


def _round_to_float32(numerator: int, exponent: int) -> float:
    """The float32 nearest ``numerator * 2**exponent`` (``numerator >= 0``), ties to even."""
    if numerator == 0:
        return 0.0
    top = numerator.bit_length() - 1 + exponent  # floor(log2(value))
    quantum = max(top - 23, -149)  # float32's spacing there (subnormals below 2**-126)
    shift = quantum - exponent
    if shift <= 0:
        return math.ldexp(numerator, exponent)
    q = numerator >> shift
    rest = numerator - (q << shift)
    half = 1 << (shift - 1)
    if rest > half or (rest == half and q & 1):
        q += 1
    return math.ldexp(q, quantum)


def _float32_powers(base: float, powers) -> np.ndarray:
    """``base ** k`` for each k, correctly rounded to float32 from the exact product of the
    float32 ``base`` (PyTorch's float32 ``pow`` where it is correctly rounded)."""
    mantissa, exponent = math.frexp(float(np.float32(base)))
    mantissa, exponent = int(mantissa * 2 ** 24), exponent - 24  # base = mantissa * 2**exponent
    return np.array([_round_to_float32(mantissa ** int(k), exponent * int(k)) for k in powers],
                    np.float32)


def _bloom_slopes(num_heads: int, max_bias: float) -> np.ndarray:
    # transformers: base = float32(2 ** -(2 ** -(log2(m) - 3))), i.e. 2 ** (-8 / m) for
    # the powers of two m; slopes = torch.pow(base, arange(1, m + 1)), all in float32.
    closest = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = _float32_powers(2.0 ** (-max_bias / closest), range(1, closest + 1))
    if closest != num_heads:
        extra = _float32_powers(2.0 ** (-max_bias / (2 * closest)),
                                range(1, 2 * (num_heads - closest), 2))
        slopes = np.concatenate([slopes, extra])
    return slopes


def _mpt_slopes(num_heads: int, max_bias: float) -> np.ndarray:
    # transformers: base = arange(1, m2 + 1).float() * (alibi_bias_max / m2);
    # slopes = 1.0 / torch.pow(2, base), then the odd k before the even ones.
    m2 = 1 << (num_heads - 1).bit_length()
    exponents = np.arange(1, m2 + 1, dtype=np.float32) * np.float32(max_bias / m2)
    powers = np.array([2.0 ** float(e) for e in exponents]).astype(np.float32)
    slopes = np.float32(1.0) / powers
    if m2 != num_heads:
        slopes = np.concatenate([slopes[1::2], slopes[::2]])[:num_heads]
    return slopes


def _check_mode(mode) -> int:
    """The launchers' mode: the :class:`AlibiMode`'s int (the CPU kernels are compiled for an
    int64 mode; an IntEnum argument would be typed, and compiled, apart)."""
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"mode: expected one of {list(MODES)}, got {_checks.quote(mode)}")
    return int(MODES[mode])


def _mask_positions(K, mode, attention_mask, batch, key_length):
    """BLOOM's key positions ``(cumsum(mask) - 1) * mask`` as ``(1 or B, Lk)`` int64, or None."""
    if mode != AlibiMode.BLOOM:
        if attention_mask is not None:
            raise ValueError("attention_mask: only mode='bloom' reads it (symmetric and mpt "
                             "biases do not depend on padding)")
        return None
    if attention_mask is None:
        return K.asarray(np.arange(key_length, dtype=np.int64).reshape(1, key_length))
    mask = _checks.check_attention_mask(attention_mask)
    mask = mask.reshape(1, mask.shape[0]) if mask.ndim == 1 else mask
    if mask.shape[1] != key_length or (batch is not None and mask.shape[0] not in (1, batch)):
        rows = "B" if batch is None else batch
        raise ValueError(f"attention_mask: expected shape ({key_length},), (1, {key_length})"
                         f" or ({rows}, {key_length}) (batch, key length), got "
                         f"{tuple(mask.shape)}")
    return _mask_to_positions(K, mask, key_length, 0)  # (cumsum(mask) - 1) * mask


def _shift(mode, query_length, key_length):
    return key_length - query_length if mode == AlibiMode.SYMMETRIC else key_length - 1


def _check_slopes(slopes):
    return _checks.check_float_array(slopes, "slopes", ndim=1)


def alibi_bias(slopes, query_length, key_length=None, *, mode="symmetric", attention_mask=None):
    """The ALiBi bias ``slopes[h] * dist``, broadcastable to scores of shape ``(B, H, Lq, Lk)``.

    - ``"symmetric"``: ``-slope * |i + Lk - Lq - j|``, flash-attention's
      ALiBi for bidirectional encoders (queries aligned to the last keys);
      shape ``(1, H, Lq, Lk)``.
    - ``"mpt"``: ``slope * (j - Lk + 1)``, MPT's ``build_mpt_alibi_tensor``
      (equal along queries; softmax makes it the causal distance); shape
      ``(1, H, 1, Lk)``, whose ``[0]`` is MPT's tensor.
    - ``"bloom"``: ``slope * p_j`` with the key positions
      ``p = (cumsum(mask) - 1) * mask`` of the attention mask (left padding
      included), BLOOM's ``build_alibi_tensor``; shape ``(B, H, 1, Lk)``, whose
      ``reshape(B * H, 1, Lk)`` is BLOOM's tensor.

    The product is rounded once to the slopes' dtype, as transformers' float32
    multiply rounds it.

    Parameters
    ----------
    slopes : ndarray, shape (H,), float32 or float64
        E.g. :func:`alibi_slopes` (``recipe="bloom"`` or ``"mpt"`` for
        transformers' bits); the result is made on their device, in their dtype.
    query_length : int
        Lq (> 0).
    key_length : int, optional
        Lk (>= Lq for ``"symmetric"`` with a cache); default ``query_length``.
    mode : {"symmetric", "mpt", "bloom"}, default "symmetric"
    attention_mask : array_like of 0 / 1, shape (Lk,) or (B, Lk), optional
        ``"bloom"`` only (default: no padding).

    Returns
    -------
    ndarray, 4-D

    Raises
    ------
    TypeError
        Non-float ``slopes``, non-integer lengths, a mask of another dtype.
    ValueError
        Lengths < 1, an unknown ``mode``, a mask of the wrong shape, values
        other than 0 and 1, or a mask for another mode.

    Examples
    --------
    >>> import numbapos.functional as F
    >>> F.alibi_bias(F.alibi_slopes(2), 3)[0, 0]
    array([[ 0.    , -0.0625, -0.125 ],
           [-0.0625,  0.    , -0.0625],
           [-0.125 , -0.0625,  0.    ]], dtype=float32)
    """
    slopes = _check_slopes(slopes)
    query_length = _checks.check_int(query_length, "query_length", minimum=1)
    key_length = query_length if key_length is None else _checks.check_int(
        key_length, "key_length", minimum=1)
    code = _check_mode(mode)
    K = backend_for((slopes,), ("slopes",))
    positions = _mask_positions(K, code, attention_mask, None, key_length)
    rows = 1 if positions is None else positions.shape[0]
    queries = query_length if code == AlibiMode.SYMMETRIC else 1
    out = K.empty((rows, slopes.shape[0], queries, key_length), slopes.dtype)
    K.alibi_fill(K.contiguous(slopes), positions, code, _shift(code, query_length, key_length),
                 out)
    return out


def add_alibi_(scores, slopes, *, mode="symmetric", attention_mask=None):
    """Add the ALiBi bias to attention scores in place: ``scores += alibi_bias(...)``.

    Parameters
    ----------
    scores : ndarray, shape (B, H, Lq, Lk), float32 or float64
        C-contiguous and writeable; modified in place.
    slopes : ndarray, shape (H,)
        Cast to the scores' dtype.
    mode, attention_mask
        As for :func:`alibi_bias` (the mask of shape ``(Lk,)``, ``(1, Lk)`` or ``(B, Lk)``).

    Returns
    -------
    ndarray
        ``scores``.

    Raises
    ------
    TypeError, ValueError
        As for :func:`alibi_bias`; ``scores`` not 4-D, strided or read-only,
        ``slopes`` not of length H.
    """
    scores = _checks.check_float_array(scores, "scores", ndim=4)
    scores = _checks.check_out(scores, tuple(scores.shape), scores.dtype, "scores")
    slopes = _check_slopes(slopes)
    K = backend_for((scores, slopes), ("scores", "slopes"))
    batch, heads, query_length, key_length = (int(n) for n in scores.shape)
    if slopes.shape[0] != heads:
        raise ValueError(f"slopes: {slopes.shape[0]} slopes for scores with {heads} heads "
                         f"(scores.shape={tuple(scores.shape)})")
    code = _check_mode(mode)
    positions = _mask_positions(K, code, attention_mask, batch, key_length)
    K.alibi_add_(scores, K.contiguous(slopes, scores.dtype), positions, code,
                 _shift(code, query_length, key_length))
    return scores


def alibi_slopes_grad(grad_scores, *, mode="symmetric", attention_mask=None):
    """Gradient of the loss with respect to the slopes of :func:`add_alibi_`.

    ``grad_slopes[h] = sum over b, i, j of grad_scores[b, h, i, j] * dist(b, i, j)``,
    summed in float64 in a fixed order (per key column over the batch and
    queries, then over the columns): the same bits for any thread count and
    on either device. The gradient with respect to the scores is
    ``grad_scores`` itself.

    Parameters
    ----------
    grad_scores : ndarray, shape (B, H, Lq, Lk), float32 or float64
    mode, attention_mask
        As given to the forward call.

    Returns
    -------
    ndarray, shape (H,), dtype of ``grad_scores``

    Raises
    ------
    TypeError, ValueError
        As for :func:`add_alibi_`.
    """
    grad = _checks.check_float_array(grad_scores, "grad_scores", ndim=4)
    K = backend_for((grad,), ("grad_scores",))
    grad = K.contiguous(grad)
    batch, heads, query_length, key_length = (int(n) for n in grad.shape)
    code = _check_mode(mode)
    positions = _mask_positions(K, code, attention_mask, batch, key_length)
    if grad.size == 0:
        return K.zeros((heads,), grad.dtype)
    partial = K.empty((heads, key_length), np.float64)
    out = K.empty((heads,), grad.dtype)
    K.alibi_slope_grad(grad, positions, code, _shift(code, query_length, key_length), partial,
                       out)
    return out
