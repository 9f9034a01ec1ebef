"""Rotary frequencies: ``inv_freq`` and the attention scaling of every Hugging Face ``rope_type``.

Host arithmetic in float64 (a few dozen values), transcribed from transformers'
``modeling_rope_utils`` (which computes the same formulas in float32).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from .. import _checks, _device

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional")

# The keys each rope_type reads, besides rope_type (or the older type), rope_theta and
# partial_rotary_factor: transformers' _validate_<type>_rope_parameters lists, and
# proportional's "factor", which _compute_proportional_rope_parameters reads though its
# validator does not list it. Any other key is refused (nothing is dropped silently).
ROPE_KEYS = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast",
             "beta_slow", "mscale", "mscale_all_dim", "truncate"),
    "longrope": ("short_factor", "long_factor", "factor", "attention_factor",
                 "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    "proportional": ("factor",),
}
# Multimodal rotary (Qwen2-VL, Qwen2.5-VL, Qwen3-VL sections of the frequencies): read by
# the rotary module (which position stream each frequency reads), not by the frequencies.
MULTIMODAL_KEYS = ("mrope_section", "mrope_interleaved")
COMMON_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor") + MULTIMODAL_KEYS
# Position streams of multimodal rotary: temporal, height, width.
MROPE_STREAMS = 3


def rope_type_of(scaling) -> str:
    """The ``rope_type`` of a ``rope_scaling`` / ``rope_parameters`` dict (or None): its
    ``rope_type`` key, else the older ``type`` key, else ``"default"``.

    Raises ValueError for an unknown type, ``type`` and ``rope_type`` that disagree, or a
    key the type does not read. The older ``type="mrope"`` (Qwen2-VL / Qwen2.5-VL's
    ``rope_scaling``) only marks multimodal rotary: the type is ``rope_type``, else
    ``"default"``, as transformers reads it; ``mrope_section`` /
    ``mrope_interleaved`` are accepted with every type (they say which position stream
    each frequency reads, see :func:`mrope_streams`)."""
    if scaling is None:
        return "default"
    older = scaling.get("type")
    older = None if older == "mrope" else older  # a multimodal marker, not a frequency type
    kind = scaling.get("rope_type", older if older is not None else "default")
    if kind not in ROPE_TYPES:
        raise ValueError(f"scaling: unknown rope_type {_checks.quote(kind)}; expected one of "
                         f"{list(ROPE_TYPES)}")
    if (older if older is not None else kind) != kind:
        raise ValueError(f"scaling: type={_checks.quote(scaling['type'])} and rope_type="
                         f"{_checks.quote(kind)} disagree")
    unknown = sorted(str(key) for key in scaling
                     if key not in COMMON_KEYS and key not in ROPE_KEYS[kind])
    if unknown:
        raise ValueError(f"scaling: rope_type {kind!r} does not use the key(s) {unknown}; it "
                         f"reads {sorted(COMMON_KEYS + ROPE_KEYS[kind])}")
    return kind


def check_partial_factor(partial_rotary_factor) -> float:
    """``partial_rotary_factor`` as a float in (0, 1]."""
    factor = _checks.check_real(partial_rotary_factor, "partial_rotary_factor")
    if not 0.0 < factor <= 1.0:
        raise ValueError(f"partial_rotary_factor: expected a number in (0, 1], got {factor}")
    return factor


def factor_for(rotated: int, head_dim: int) -> float:
    """The ``partial_rotary_factor`` that rotates exactly ``rotated`` of ``head_dim`` channels
    (``rotated / head_dim``, one ulp up where the product would round below ``rotated``)."""
    factor = rotated / head_dim
    return factor if int(head_dim * factor) == rotated else math.nextafter(factor, 2.0)


def _need(scaling, key, kind):
    if scaling.get(key) is None:
        raise ValueError(f"scaling: rope_type {kind!r} needs the key {key!r}, got keys "
                         f"{sorted(scaling)}")
    return scaling[key]


def _original_length(scaling, max_position_embeddings, kind):
    value = scaling.get("original_max_position_embeddings", max_position_embeddings)
    if value is None:
        raise ValueError(f"scaling: rope_type {kind!r} needs original_max_position_embeddings "
                         "(in scaling) or max_position_embeddings")
    return _checks.check_int(value, "original_max_position_embeddings", minimum=1)


def rope_frequencies(head_dim, base=10000.0, *, partial_rotary_factor=1.0, scaling=None,
                     max_position_embeddings=None, seq_len=None):
    """Inverse frequencies and attention scaling of rotary embeddings, as transformers makes them.

    ``inv_freq[i] = base ** (-2i / R)`` for ``i < R / 2``, with ``R =
    int(head_dim * partial_rotary_factor)`` rotated channels, then changed by
    the ``scaling`` dict exactly as ``transformers.modeling_rope_utils`` does
    (computed here in float64; transformers rounds to float32):

    - ``"default"``: unchanged, scaling 1.
    - ``"linear"``: ``inv_freq / factor`` (position interpolation).
    - ``"dynamic"``: NTK-aware, ``base * (factor * s / M - (factor - 1)) ** (R / (R - 2))``
      with ``s = max(seq_len, M)``, ``M = max_position_embeddings``.
    - ``"yarn"``: interpolation and extrapolation blended over a linear ramp
      between the correction dimensions of ``beta_fast`` (32) and ``beta_slow``
      (1), ``truncate`` (True) rounding them outwards; attention scaling
      ``attention_factor`` or ``0.1 * ln(factor) + 1`` (``mscale`` /
      ``mscale_all_dim`` as DeepSeek's ratio). ``factor`` defaults to
      ``M / original_max_position_embeddings``.
    - ``"longrope"``: ``inv_freq / long_factor`` when ``seq_len`` exceeds
      ``original_max_position_embeddings``, else ``/ short_factor``; attention
      scaling ``attention_factor`` or ``sqrt(1 + ln(factor) / ln(original))``.
    - ``"llama3"``: wavelengths beyond ``original / low_freq_factor`` divided by
      ``factor``, those below ``original / high_freq_factor`` kept, a smooth
      blend between.
    - ``"proportional"`` (Gemma 4): ``head_dim / 2`` frequencies, the first
      ``int(partial_rotary_factor * head_dim // 2)`` of them ``base ** (-2i /
      head_dim)``, the rest 0 (those channel pairs pass unrotated), all divided
      by ``factor`` (default 1). Here ``partial_rotary_factor`` sets how many
      frequencies are not zero, and every channel of the head is rotated.

    Parameters
    ----------
    head_dim : int
        Channels per head (> 0).
    base : float, default 10000.0
        ``rope_theta`` (> 0).
    partial_rotary_factor : float, default 1.0
        Fraction of the channels rotated, in (0, 1] (GPT-NeoX's ``rotary_pct``,
        Phi's ``partial_rotary_factor``); ``int(head_dim * factor)`` must be even.
    scaling : dict, optional
        A ``rope_scaling`` / ``rope_parameters`` dict: ``rope_type`` (or ``type``)
        and the keys that type reads (``functional.rope.ROPE_KEYS``, as transformers'
        validators list them); any other key raises. None is ``"default"``.
        ``rope_theta`` / ``partial_rotary_factor`` keys in it must equal
        ``base`` / ``partial_rotary_factor`` (pass them as arguments, as
        :meth:`numbapos.nn.RotaryEmbedding.from_hf_config` does).
        ``original_max_position_embeddings`` defaults to ``max_position_embeddings``.
        ``mrope_section`` / ``mrope_interleaved`` (multimodal rotary) do not
        change the frequencies: they are accepted here and read by
        :class:`~numbapos.nn.RotaryEmbedding` (or passed to the rotary ops).
    max_position_embeddings : int, optional
        The model's ``max_position_embeddings``: needed by ``"dynamic"``, and by
        ``"yarn"`` / ``"longrope"`` / ``"llama3"`` without
        ``original_max_position_embeddings`` or ``factor``.
    seq_len : int, optional
        Current sequence length (``"dynamic"``, ``"longrope"``; ignored otherwise).

    Returns
    -------
    inv_freq : ndarray, shape (R // 2,), float64
        (``head_dim // 2`` for ``"proportional"``)
    attention_scaling : float
        The factor transformers multiplies cos and sin by (1.0 but for yarn and longrope).

    Raises
    ------
    TypeError
        A non-integer ``head_dim`` / ``seq_len``, a non-real ``base``, a
        ``scaling`` that is not a mapping.
    ValueError
        ``head_dim <= 0``, ``base <= 0``, a factor outside (0, 1] or giving an
        odd or zero rotary width, an unknown ``rope_type``, a key the type
        needs missing or one it does not read, ``rope_theta`` /
        ``partial_rotary_factor`` in ``scaling`` that differ from the
        arguments, ``short_factor`` / ``long_factor`` not of length R / 2.

    Examples
    --------
    >>> import numbapos.functional as F
    >>> inv_freq, scale = F.rope_frequencies(8)
    >>> inv_freq
    array([1.   , 0.1  , 0.01 , 0.001])
    >>> F.rope_frequencies(8, scaling={"rope_type": "linear", "factor": 2.0})[0][:2]
    array([0.5 , 0.05])
    """
    head_dim = _checks.check_int(head_dim, "head_dim", minimum=1)
    base = _checks.check_positive(base, "base")
    factor_p = check_partial_factor(partial_rotary_factor)
    if scaling is not None and not isinstance(scaling, Mapping):
        raise TypeError(f"scaling: expected a dict (rope_scaling / rope_parameters) or None, "
                        f"got {_checks.quote(scaling)}")
    kind = rope_type_of(scaling)
    for key, value in (("rope_theta", base), ("partial_rotary_factor", factor_p)):
        if scaling is not None and scaling.get(key) is not None and scaling[key] != value:
            name = "base" if key == "rope_theta" else key
            raise ValueError(f"scaling: {key}={_checks.quote(scaling[key])} differs from "
                             f"{name}={value}; pass it as {name}=")
    dim = int(head_dim * factor_p)
    if kind == "proportional":
        if head_dim % 2:
            raise ValueError(f"head_dim: rope_type 'proportional' rotates every channel, "
                             f"expected an even head_dim, got {head_dim}")
    elif dim < 2 or dim % 2:
        raise ValueError(f"partial_rotary_factor: int(head_dim * partial_rotary_factor) = "
                         f"int({head_dim} * {factor_p}) = {dim} rotated channels; expected an "
                         "even number >= 2")
    if max_position_embeddings is not None:
        max_position_embeddings = _checks.check_int(max_position_embeddings,
                                                    "max_position_embeddings", minimum=1)
    if seq_len is not None:
        seq_len = _checks.check_int(seq_len, "seq_len", minimum=0)
    exponents = np.arange(0, dim, 2, dtype=np.float64) / dim
    if kind == "default":
        return 1.0 / base ** exponents, 1.0
    factor = scaling.get("factor")
    if factor is not None:
        factor = _checks.check_positive(factor, "scaling['factor']")
    if kind == "proportional":
        return _proportional(base, head_dim, factor_p, 1.0 if factor is None else factor), 1.0
    if kind == "linear":
        return 1.0 / base ** exponents / _need(scaling, "factor", kind), 1.0
    if kind == "dynamic":
        return _dynamic(base, exponents, dim, _need(scaling, "factor", kind),
                        max_position_embeddings, seq_len), 1.0
    original = _original_length(scaling, max_position_embeddings, kind)
    if kind == "llama3":
        return _llama3(1.0 / base ** exponents, _need(scaling, "factor", kind), scaling,
                       original), 1.0
    if factor is None:
        if max_position_embeddings is None:
            raise ValueError(f"scaling: rope_type {kind!r} without 'factor' needs "
                             "max_position_embeddings (factor = max / original)")
        factor = max_position_embeddings / original
    if kind == "yarn":
        return _yarn(base, exponents, dim, factor, scaling, original)
    return _longrope(base, exponents, dim, factor, scaling, original, seq_len)


def _proportional(base, head_dim, proportion, factor):
    # Gemma 4: the first int(proportion * head_dim // 2) frequencies of a head_dim-wide rope
    # (exponents over head_dim, not over the rotated width), the rest zero (not rotated).
    angles = int(proportion * head_dim // 2)
    inv_freq = np.zeros(head_dim // 2, np.float64)
    inv_freq[:angles] = 1.0 / base ** (np.arange(0, 2 * angles, 2, dtype=np.float64) / head_dim)
    return inv_freq / factor


def _dynamic(base, exponents, dim, factor, max_position_embeddings, seq_len):
    if max_position_embeddings is None:
        raise ValueError("max_position_embeddings: rope_type 'dynamic' needs it, got None")
    length = max_position_embeddings if seq_len is None else max(seq_len,
                                                                 max_position_embeddings)
    grown = base * ((factor * length / max_position_embeddings) - (factor - 1)) ** (
        dim / (dim - 2))
    return 1.0 / grown ** exponents


def _yarn(base, exponents, dim, factor, scaling, original):
    def get_mscale(scale, mscale=1.0):
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = scaling.get("attention_factor")
    mscale = scaling.get("mscale")
    mscale_all_dim = scaling.get("mscale_all_dim")
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)
    beta_fast = scaling.get("beta_fast") or 32
    beta_slow = scaling.get("beta_slow") or 1

    def correction_dim(rotations):
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # as transformers: no division by zero
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    pos_freqs = base ** exponents
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    extrapolation_factor = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor
    return inv_freq, float(attention_factor)


def _longrope(base, exponents, dim, factor, scaling, original, seq_len):
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = (1.0 if factor <= 1.0
                            else math.sqrt(1 + math.log(factor) / math.log(original)))
    key = "long_factor" if seq_len and seq_len > original else "short_factor"
    ext = np.asarray(_need(scaling, key, "longrope"), dtype=np.float64)
    if ext.shape != (dim // 2,):
        raise ValueError(f"scaling: {key} has shape {ext.shape}, expected ({dim // 2},) (one "
                         "factor per frequency)")
    return 1.0 / (ext * base ** exponents), float(attention_factor)


def _llama3(inv_freq, factor, scaling, original):
    low_freq_factor = _need(scaling, "low_freq_factor", "llama3")
    high_freq_factor = _need(scaling, "high_freq_factor", "llama3")
    low_freq_wavelen = original / low_freq_factor
    high_freq_wavelen = original / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, scaled)


def check_mrope_section(mrope_section, frequencies: int | None = None) -> tuple[int, int, int]:
    """``mrope_section`` as three ints ``(temporal, height, width)`` summing to ``frequencies``.

    Raises TypeError for a value that is not a sequence of integers, ValueError
    for a length other than 3, a negative section or a sum other than
    ``frequencies`` (the rotary's ``R/2``; not checked when None), each naming
    the value.
    """
    try:
        values = list(mrope_section)
    except TypeError:
        raise TypeError(f"mrope_section: expected 3 integers (temporal, height, width "
                        f"frequencies), got {_checks.quote(mrope_section)}") from None
    if len(values) != MROPE_STREAMS:
        raise ValueError(f"mrope_section: expected 3 integers (temporal, height, width "
                         f"frequencies), got {_checks.quote(mrope_section)}")
    section = tuple(_checks.check_int(value, f"mrope_section[{i}]")
                    for i, value in enumerate(values))
    if min(section) < 0:
        raise ValueError(f"mrope_section: expected non-negative section sizes, got "
                         f"{list(section)}")
    if frequencies is not None and sum(section) != frequencies:
        raise ValueError(f"mrope_section: {list(section)} sums to {sum(section)}, but the "
                         f"rotary has {frequencies} frequencies (R/2 for R rotated channels); "
                         f"the sections split the frequencies, expected a sum of {frequencies}")
    return section


def mrope_streams(mrope_section, mrope_interleaved=False):
    """The position stream each frequency of multimodal rotary reads (0 temporal, 1 height,
    2 width), as transformers' ``recomposition_frequencies`` picks them.

    - Chunked (``mrope_interleaved=False``; Qwen2-VL, Qwen2.5-VL): the first
      ``t`` frequencies read stream 0, the next ``h`` stream 1, the last ``w``
      stream 2.
    - Interleaved (``mrope_interleaved=True``; Qwen3-VL): frequency ``i`` reads
      stream 1 if ``i % 3 == 1`` and ``i < 3 h``, stream 2 if ``i % 3 == 2``
      and ``i < 3 w``, else stream 0 (``Qwen3VLTextRotaryEmbedding``).

    Parameters
    ----------
    mrope_section : sequence of 3 int
        ``(t, h, w)``, non-negative, summing to the number of frequencies.
    mrope_interleaved : bool, default False

    Returns
    -------
    ndarray, int64, shape (t + h + w,)
    """
    t, h, w = check_mrope_section(mrope_section)
    if not isinstance(mrope_interleaved, (bool, np.bool_)):
        raise TypeError(f"mrope_interleaved: expected a bool, got "
                        f"{_checks.quote(mrope_interleaved)}")
    if not mrope_interleaved:
        return np.repeat(np.arange(MROPE_STREAMS, dtype=np.int64), (t, h, w))
    streams = np.zeros(t + h + w, np.int64)
    streams[1:3 * h:3] = 1
    streams[2:3 * w:3] = 2
    return streams


def _pick_frequencies(position_ids, threshold, short, long):
    """``long`` if ``max(position_ids) + 1 > threshold`` else ``short`` (float64 vectors on
    the positions' device), in a new array, decided where the positions live: on CUDA
    by a kernel, with no copy to the host (LongRoPE's choice of factors by the length,
    :class:`numbapos.nn.RotaryEmbedding`)."""
    ids = _checks.check_index_array(position_ids, "position_ids")
    K = _device.kernels_for(_device.device_of(ids))
    out = K.empty((short.shape[0],), np.float64)
    K.rotary_pick_frequencies(K.contiguous(ids).reshape(ids.size), int(threshold), short, long,
                              out)
    return out
