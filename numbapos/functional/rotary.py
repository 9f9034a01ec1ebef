"""Rotary position embeddings (RoPE): rotate channel pairs of q and k by position-dependent angles.

The op builds a cos / sin table of one row per position (float64 angles and a
float64 sine and cosine, the same code and bits on the CPU and the GPU), then
rotates every head's pairs with it; q and k share one table (:func:`rotary_qk`).
Multimodal rotary (``mrope_section``: Qwen2-VL / Qwen2.5-VL chunked, Qwen3-VL
interleaved) is the same op whose table reads, for each frequency, the position
of its stream out of three (temporal, height, width).
A bfloat16 / float16 ``x`` is read by the kernel as its bits, widened to
float32 (exactly), rotated with a float32 table and rounded back to its dtype,
to nearest even, once: no float32 copy.
"""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from .._args import RotaryAngles, TableFormat
from ._common import backend_for, on_backend
from .half import half_format
from .rope import (
    MROPE_STREAMS,
    check_mrope_section,
    check_partial_factor,
    factor_for,
    mrope_streams,
)

LAYOUTS = ("half", "interleaved")
_FLOAT32, _UINT16 = np.dtype(np.float32), np.dtype(np.uint16)


def _check_x(x, name):
    return _checks.check_float_or_half_array(x, name, ndim=(3, 4))


def _as_4d(K, x, head_axis):
    """``x`` (C-contiguous) as ``(B, A, C, D)``: a 3-D ``(B, L, D)`` is one head."""
    x = K.contiguous(x)
    if x.ndim == 3:
        return x.reshape((x.shape[0], 1) + tuple(x.shape[1:])), 1
    return x, head_axis


def check_rotary_options(layout, head_axis, float32_angle):
    """Validate the layout options of a rotary call (for modules checking at construction)."""
    _check_options(layout, head_axis, 1.0, float32_angle)


def _check_options(layout, head_axis, attention_scaling, float32_angle):
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {list(LAYOUTS)}, got {_checks.quote(layout)}")
    head_axis = _checks.check_int(head_axis, "head_axis")
    if head_axis not in (1, 2):
        raise ValueError(f"head_axis: expected 1 (x is (B, H, L, D)) or 2 (x is (B, L, H, D)), "
                         f"got {head_axis}")
    scale = _checks.check_real(attention_scaling, "attention_scaling")
    if not np.isfinite(scale):
        raise ValueError(f"attention_scaling: expected a finite number, got {scale}")
    if not isinstance(float32_angle, (bool, np.bool_)):
        raise TypeError(f"float32_angle: expected a bool, got {_checks.quote(float32_angle)}")
    return layout == "interleaved", head_axis, scale


def _seq_len(x, head_axis):
    return x.shape[1] if x.ndim == 3 else x.shape[3 - head_axis]


def _check_inv_freq(K, inv_freq, dim, factor, x_name):
    """``inv_freq`` as a float64 array on K's device, of ``int(dim * factor) / 2`` entries."""
    if _device.is_cuda_array(inv_freq):
        freq = _checks.check_float_array(inv_freq, "inv_freq", ndim=1)
        if K.DEVICE != "cuda":
            raise TypeError("inv_freq: is a CUDA array but the data is on 'cpu'; move them to "
                            "one device first (numbapos.to_device)")
    else:
        freq = _checks.check_float_array(inv_freq, "inv_freq", ndim=1)
    factor = check_partial_factor(factor)
    rotated = int(dim * factor)
    if freq.shape[0] < 1 or 2 * freq.shape[0] != rotated:
        raise ValueError(_width_message(freq.shape[0], dim, factor, rotated, x_name))
    if K.DEVICE == "cpu":
        return np.ascontiguousarray(freq, dtype=np.float64)
    if _device.is_cuda_array(freq):
        return K.contiguous(freq, np.float64)
    return K.asarray(np.ascontiguousarray(freq, dtype=np.float64))


def _width_message(count, dim, factor, rotated, x_name):
    text = (f"inv_freq: {count} frequencies rotate {2 * count} channels, but {x_name} has "
            f"last dimension {dim}")
    if factor != 1.0:
        text += f", of which partial_rotary_factor={factor} rotates int({dim} * {factor}) = " \
                f"{rotated}"
    if rotated >= 2 and rotated % 2 == 0:
        text += f"; expected {rotated // 2} frequencies"
    else:
        text += "; rotary turns channel pairs, so it needs an even number >= 2 of them"
    if 0 < 2 * count < dim:
        text += (f". Rotating part of each head is a configuration, never a consequence of a "
                 f"shape: pass partial_rotary_factor={factor_for(2 * count, dim)!r} to rotate "
                 f"the first {2 * count} of {dim} channels and pass the rest through (Hugging "
                 "Face's partial_rotary_factor)")
    return text


def _check_positions(K, position_ids, batch, seq_len, section):
    """``(ids, offset)``: ids None (positions offset .. offset + L - 1) or int64 (S, P, L):
    one stream (S = 1) without ``section``, three with it (multimodal rotary)."""
    if position_ids is None:
        return None, 0
    if isinstance(position_ids, (int, np.integer)) and not isinstance(position_ids,
                                                                      (bool, np.bool_)):
        return None, _checks.check_int64(position_ids, "position_ids")
    ids = on_backend(K, position_ids, "position_ids")
    shape = tuple(ids.shape)
    if section is not None:
        streams = MROPE_STREAMS
        allowed = [(streams, 1, seq_len), (streams, batch, seq_len)]
        if shape not in allowed:
            want = " or ".join(str(s) for s in dict.fromkeys(allowed))
            hint = (" (text-only positions: an int offset, or the one stream repeated, "
                    "np.broadcast_to(ids, (3,) + ids.shape))") if len(shape) < 3 else ""
            raise ValueError(f"position_ids: mrope_section={list(section)} rotates by 3 "
                             f"position streams (temporal, height, width); expected shape "
                             f"{want}, got {shape}{hint}")
        return K.contiguous(ids, np.int64), 0
    allowed = [(seq_len,), (1, seq_len), (batch, seq_len)]
    if shape not in allowed:
        want = " or ".join(str(s) for s in dict.fromkeys(allowed))
        hint = (" (3 position streams (3, B, L) are multimodal rotary: pass mrope_section=)"
                if len(shape) == 3 else "")
        raise ValueError(f"position_ids: expected shape {want} (an int offset, or positions of "
                         f"shape (L,) / (B, L)), got {shape}{hint}")
    ids = K.contiguous(ids, np.int64)
    rows = ids.shape[0] if ids.ndim == 2 else 1
    return ids.reshape(1, rows, seq_len), 0


# Stream maps (one stream index per frequency) by device and sections: tiny, kept for reuse
# (on a GPU: no copy per call, and none inside a captured step after the first).
_STREAM_MAPS: dict = {}


def _stream_map(K, section, interleaved):
    key = (K.DEVICE, section, interleaved)
    found = _STREAM_MAPS.get(key)
    if found is None:
        found = mrope_streams(section, interleaved)
        if K.DEVICE != "cpu":
            found = K.asarray(found)
            found._numbapos_persistent = True  # a plan may keep it
        if len(_STREAM_MAPS) >= 64:
            _STREAM_MAPS.clear()
        _STREAM_MAPS[key] = found
    return found


def _check_mrope(mrope_section, mrope_interleaved, frequencies):
    """``(section, interleaved)``: section None for the 1-D rotary, else 3 checked ints."""
    if not isinstance(mrope_interleaved, (bool, np.bool_)):
        raise TypeError(f"mrope_interleaved: expected a bool, got "
                        f"{_checks.quote(mrope_interleaved)}")
    if mrope_section is None:
        if mrope_interleaved:
            raise ValueError("mrope_interleaved: True needs mrope_section (the sections to "
                             "interleave), got mrope_section=None")
        return None, False
    return check_mrope_section(mrope_section, frequencies), bool(mrope_interleaved)


def _rotated_out(K, x, out, others, name):
    if out is None:
        return K.empty(x.shape, x.dtype)
    same = out is x or (_device.is_cuda_array(out) and _device.adopt(out) is x)
    return _checks.check_out(out, x.shape, x.dtype, name,
                             avoid=tuple(others) + (() if same else (x,)))


def rotary_qk(q, k, position_ids, inv_freq, *, attention_scaling=1.0, layout="half",
              head_axis=1, float32_angle=False, partial_rotary_factor=1.0, backward=False,
              mrope_section=None, mrope_interleaved=False, out_q=None, out_k=None):
    """Rotate ``q`` and ``k`` (or their gradients) with one shared cos / sin table.

    What :class:`numbapos.nn.RotaryEmbedding` runs: :func:`apply_rotary` on
    ``q`` and on ``k`` (whose head count may differ: grouped-query and
    multi-query attention), with the table built once.

    Parameters
    ----------
    q : ndarray, shape (B, Hq, L, D) or (B, L, Hq, D) (or (B, L, D))
        float32, float64, bfloat16 or float16.
    k : ndarray or None
        Same layout, batch, length, width and dtype as ``q``; any head count.
    position_ids, inv_freq, attention_scaling, layout, head_axis, float32_angle
        As for :func:`apply_rotary`.
    partial_rotary_factor : float, default 1.0
        As for :func:`apply_rotary`.
    backward : bool, default False
        Rotate by minus the angle (the gradient of the forward rotation).
    mrope_section, mrope_interleaved
        Multimodal rotary, as for :func:`apply_rotary`.
    out_q, out_k : ndarray, optional
        Result buffers (each may be its input itself).

    Returns
    -------
    (q_rot, k_rot)
        ``k_rot`` is None when ``k`` is None.

    Raises
    ------
    TypeError, ValueError
        As for :func:`apply_rotary`, or ``k`` not matching ``q``.
    """
    return _rotary(q, k, position_ids, inv_freq, attention_scaling, layout, head_axis,
                   float32_angle, partial_rotary_factor, backward, mrope_section,
                   mrope_interleaved, out_q, out_k, ("q", "k", "out_q", "out_k"))


def _rotary(q, k, position_ids, inv_freq, attention_scaling, layout, head_axis, float32_angle,
            factor, backward, mrope_section, mrope_interleaved, out_q, out_k, names):
    q_name, k_name, out_q_name, out_k_name = names
    q = _check_x(q, q_name)
    interleaved, head_axis, scale = _check_options(layout, head_axis, attention_scaling,
                                                   float32_angle)
    if k is not None:
        k = _check_x(k, k_name)
        if k.dtype != q.dtype:
            raise TypeError(f"k: dtype {k.dtype} differs from q's dtype {q.dtype}")
        if k.ndim != q.ndim or _seq_len(k, head_axis) != _seq_len(q, head_axis) \
                or k.shape[0] != q.shape[0] or k.shape[k.ndim - 1] != q.shape[q.ndim - 1]:
            raise ValueError(f"k: shape {tuple(k.shape)} does not match q's shape "
                             f"{tuple(q.shape)} (same rank, batch, length and width; the head "
                             f"count may differ; head_axis={head_axis})")
    K = backend_for((q, k, out_q, out_k), names)
    seq_len = _seq_len(q, head_axis)
    freq = _check_inv_freq(K, inv_freq, q.shape[q.ndim - 1], factor, q_name)
    section, interleaved_streams = _check_mrope(mrope_section, mrope_interleaved,
                                                freq.shape[0])
    ids, offset = _check_positions(K, position_ids, q.shape[0], seq_len, section)
    # One position stream (the 1-D rotary, or multimodal rotary at an int offset, whose three
    # streams are equal): stream 0 for every frequency, the 1-D kernel's bits.
    streams = None if section is None or ids is None else _stream_map(K, section,
                                                                      interleaved_streams)
    out_q = _rotated_out(K, q, out_q, (ids, k, out_k), out_q_name)
    if k is not None:
        out_k = _rotated_out(K, k, out_k, (ids, q, out_q), out_k_name)
    elif out_k is not None:
        raise ValueError("out_k: given without k")
    half = _checks.is_half_dtype(q.dtype)
    rows = 1 if ids is None else ids.shape[1]
    cos = K.empty((rows, seq_len, freq.shape[0]), _FLOAT32 if half else q.dtype)
    sin = K.empty((rows, seq_len, freq.shape[0]), _FLOAT32 if half else q.dtype)
    angles = RotaryAngles(float(scale), -1.0 if backward else 1.0, bool(float32_angle))
    K.rotary_table(ids, streams, offset, freq, angles, cos, sin)
    fmt = half_format(q.dtype) if half else TableFormat.FLOAT
    for x, out in ((q, out_q), (k, out_k)):
        if x is None:
            continue
        x4, axis = _as_4d(K, x, head_axis)
        o4, _ = _as_4d(K, out, head_axis)
        if half:  # the kernel reads the bits, rotates in float32, rounds once
            x4, o4 = x4.view(_UINT16), o4.view(_UINT16)
        K.rotary_apply(x4, cos, sin, interleaved, axis, o4, fmt)
    return out_q, (out_k if k is not None else None)


def apply_rotary(x, position_ids, inv_freq, *, attention_scaling=1.0, layout="half",
                 head_axis=1, float32_angle=False, partial_rotary_factor=1.0,
                 mrope_section=None, mrope_interleaved=False, out=None):
    """Rotary position embedding: rotate channel pairs of ``x`` by ``position * inv_freq``.

    With ``R = 2 * len(inv_freq)`` and ``theta = pos * inv_freq[i]``, each pair
    ``(a, b)`` of the first R channels becomes ``s * (a cos theta - b sin theta,
    b cos theta + a sin theta)`` (``s`` the attention scaling). R is the whole
    last dimension D unless ``partial_rotary_factor`` says otherwise: then
    ``R = int(D * partial_rotary_factor)`` and the channels from R on pass
    through unchanged (partial rotary: GPT-NeoX, Phi, GPT-J). A width that
    does not match raises; it never rotates part of ``x`` silently.

    Angles are formed in float64 and reduced to about 2**-100 by a float64
    sine and cosine within one ulp (once per position and frequency, shared
    by all heads; fdlibm's algorithm, the same bits on the CPU and the GPU),
    so a float32 result is within about 1e-6 of the exact rotation at any
    position up to 2**20; transformers' float32 angle errs by 2e-3 at
    position 32768.
    ``float32_angle=True`` rounds the angle as transformers does instead.

    Multimodal rotary (``mrope_section``; Qwen2-VL, Qwen2.5-VL, Qwen3-VL):
    ``position_ids`` holds three position streams ``(3, B, L)`` (temporal,
    height, width, as transformers' ``get_rope_index`` makes them) and
    frequency ``i`` turns by the position of its stream (see
    :func:`~numbapos.functional.rope.mrope_streams`): the first ``t``
    frequencies read the temporal stream, the next ``h`` the height, the last
    ``w`` the width (chunked: Qwen2-VL, Qwen2.5-VL), or, with
    ``mrope_interleaved=True``, the streams alternate over the frequencies
    (Qwen3-VL). This equals transformers' ``Qwen2VLRotaryEmbedding`` /
    ``Qwen2_5_VLRotaryEmbedding`` / ``Qwen3VLTextRotaryEmbedding`` followed by
    ``apply_rotary_pos_emb``. Three equal streams (text only) give exactly
    the 1-D rotary's bits.

    A bfloat16 or float16 ``x`` (a PyTorch bfloat16 tensor is read through
    its bits, without a copy) gives a result of its dtype: the kernel reads
    each element's bits, widens it exactly to float32, rotates it there with
    a float32 table and rounds to nearest even once (no float32 copy: half
    the bytes of a float32 call), so the result is bit for bit the float32
    call on ``x.astype(float32)`` cast back to ``x``'s dtype (where both
    channels of a pair are NaN, the NaN that comes out may be either one, as
    IEEE 754 leaves it; on a GPU every NaN comes out as the GPU's canonical
    NaN, whose sign and payload float32 arithmetic there does not keep, as
    in PyTorch CUDA). transformers rotates a
    16-bit ``x`` in its dtype (cos and sin, each product and the sum rounded
    to it): its result differs from this one, rounded once, in about 40 % of
    the elements, by up to two units in the last place of the larger input of
    the pair, and is on average farther from the exact rotation.

    Parameters
    ----------
    x : ndarray, float32, float64, bfloat16 or float16
        ``(B, H, L, D)`` as transformers' attention holds q and k
        (``head_axis=1``), ``(B, L, H, D)`` (``head_axis=2``), or ``(B, L, D)``
        (one head). CPU arrays of any strides (copied when not C-contiguous),
        CUDA arrays C-contiguous.
    position_ids : int or array_like of int
        An int offset (positions ``offset .. offset + L - 1``, e.g. the length of
        a cache; None is 0), or positions of shape ``(L,)``, ``(1, L)`` or
        ``(B, L)`` (left-padded batches: any positions per row). With
        ``mrope_section``: an int offset (the three streams equal) or three
        streams of shape ``(3, B, L)`` or ``(3, 1, L)``; 2-D positions are
        refused there (``(3, L)`` would read as a batch of 3).
    inv_freq : array_like, shape (R/2,)
        Frequencies, e.g. from :func:`rope_frequencies` (cast to float64), for
        ``R = int(D * partial_rotary_factor)`` channels.
    attention_scaling : float, default 1.0
        Multiplies cos and sin (yarn, longrope: the second value of
        :func:`rope_frequencies`).
    layout : {"half", "interleaved"}, default "half"
        ``"half"`` pairs channel ``j`` with ``j + R/2`` (transformers'
        ``rotate_half``: Llama, Mistral, Qwen, GPT-NeoX); ``"interleaved"``
        pairs ``2j`` with ``2j + 1`` (GPT-J, Cohere, Meta's original Llama).
    head_axis : {1, 2}, default 1
        Where the heads are in a 4-D ``x``.
    float32_angle : bool, default False
        Form the angle, cos and sin in float32 as transformers'
        ``LlamaRotaryEmbedding`` does (bit-for-bit agreement up to the last
        bit of float32 cos / sin, instead of accuracy at long range).
    partial_rotary_factor : float, default 1.0
        Fraction of each head's channels rotated, in (0, 1], as Hugging Face's
        ``partial_rotary_factor``: the first ``int(D * factor)`` (even)
        channels; the same value :func:`rope_frequencies` made ``inv_freq`` with.
    mrope_section : sequence of 3 int, optional
        Multimodal rotary's ``(t, h, w)`` frequencies per position stream
        (Hugging Face's ``mrope_section``: ``[16, 24, 24]`` in Qwen2-VL and
        Qwen2.5-VL, ``[24, 20, 20]`` in Qwen3-VL), non-negative, summing to
        ``len(inv_freq)``. None (default): the 1-D rotary.
    mrope_interleaved : bool, default False
        Interleave the sections over the frequencies (Qwen3-VL's
        ``mrope_interleaved``) instead of chunking them (Qwen2-VL,
        Qwen2.5-VL); needs ``mrope_section``.
    out : ndarray, optional
        C-contiguous result buffer of ``x``'s shape and dtype; ``out=x`` rotates
        in place.

    Returns
    -------
    ndarray, shape and dtype of ``x``

    Raises
    ------
    TypeError
        Non-float ``x`` or ``inv_freq``, non-integer ``position_ids``, arrays on
        different devices.
    ValueError
        ``x`` not 3-D or 4-D, ``position_ids`` of the wrong shape (with
        ``mrope_section``: not ``(3, 1 or B, L)``), an ``mrope_section`` that
        is not 3 non-negative ints summing to ``len(inv_freq)``,
        ``mrope_interleaved`` without ``mrope_section``,
        ``2 * len(inv_freq)`` not ``int(D * partial_rotary_factor)`` (the message
        names both and the factor that would rotate that many channels), a
        factor outside (0, 1] or rotating an odd number of channels, an unknown
        ``layout``, ``head_axis`` not 1 or 2, a non-finite
        ``attention_scaling``, ``out`` of the wrong shape or overlapping an
        input.

    Examples
    --------
    >>> import numpy as np
    >>> import numbapos.functional as F
    >>> inv_freq, _ = F.rope_frequencies(4)
    >>> x = np.ones((1, 1, 2, 4), np.float32)
    >>> F.apply_rotary(x, 0, inv_freq)[0, 0, 0]
    array([1., 1., 1., 1.], dtype=float32)
    """
    out_x, _ = _rotary(x, None, position_ids, inv_freq, attention_scaling, layout, head_axis,
                       float32_angle, partial_rotary_factor, False, mrope_section,
                       mrope_interleaved, out, None, ("x", "k", "out", "out_k"))
    return out_x


def apply_rotary_backward(grad, position_ids, inv_freq, *, attention_scaling=1.0,
                          layout="half", head_axis=1, float32_angle=False,
                          partial_rotary_factor=1.0, mrope_section=None,
                          mrope_interleaved=False, out=None):
    """Gradient of :func:`apply_rotary` with respect to ``x``: the rotation by minus the angle.

    A rotation is orthogonal, so its gradient is its transpose:
    ``grad_x = s * R(-theta) grad`` with the same table (``s`` the attention
    scaling). The arguments are those of the forward call.

    Parameters
    ----------
    grad : ndarray
        Gradient of the loss with respect to the rotated ``x`` (``x``'s shape);
        a bfloat16 / float16 one is rotated in float32 and rounded back, as
        :func:`apply_rotary` does.
    position_ids, inv_freq, attention_scaling, layout, head_axis, float32_angle
        As given to :func:`apply_rotary`.
    partial_rotary_factor : float, default 1.0
        As given to :func:`apply_rotary`.
    mrope_section : sequence of 3 int, optional
        As given to :func:`apply_rotary` (multimodal rotary: Qwen2-VL,
        Qwen2.5-VL chunked; Qwen3-VL with ``mrope_interleaved=True``).
    mrope_interleaved : bool, default False
        As given to :func:`apply_rotary`.
    out : ndarray, optional
        Result buffer (may be ``grad``).

    Returns
    -------
    ndarray, shape of ``grad``

    Raises
    ------
    TypeError, ValueError
        As for :func:`apply_rotary`.
    """
    out_g, _ = _rotary(grad, None, position_ids, inv_freq, attention_scaling, layout, head_axis,
                       float32_angle, partial_rotary_factor, True, mrope_section,
                       mrope_interleaved, out, None, ("grad", "k", "out", "out_k"))
    return out_g
