"""RotaryEmbedding: rotary positions for q and k, with every Hugging Face frequency scaling."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping

import numpy as np

from .. import _checks, _device
from .. import functional as F
from ..functional import rope as _rope
from ..functional.capture import refuse_in_capture
from ..functional.rope import MULTIMODAL_KEYS, check_mrope_section, factor_for, rope_type_of
from ..functional.rotary import check_rotary_options
from ._outputs import OutputBuffer
from .module import Module

# Configurations whose attention pairs channels (2j, 2j + 1) instead of (j, j + R/2).
INTERLEAVED_MODEL_TYPES = ("gptj", "cohere", "cohere2")

# Multimodal rotary models: (transformers' default mrope_section, whether the sections are
# interleaved), as their rotary modules hold them: the model class decides the layout.
MROPE_MODEL_TYPES = {
    **dict.fromkeys(("qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text"),
                    ((16, 24, 24), False)),
    **dict.fromkeys(("qwen3_vl", "qwen3_vl_text", "qwen3_vl_moe", "qwen3_vl_moe_text"),
                    ((24, 20, 20), True)),
}


def _config_get(config, name, default=None):
    if isinstance(config, Mapping):
        value = config.get(name, default)
    else:
        value = getattr(config, name, default)
    return default if value is None else value


# transformers 4 layouts of configs whose rope differs by layer type (transformers 5 nests
# them in rope_parameters): (sliding layers' theta key, full layers' theta key, the full
# theta's default, whether rope_scaling applies to sliding layers too), as transformers 5's
# convert_rope_params_to_dict of Gemma 3 and ModernBERT read them.
_OLD_PER_LAYER = (
    ("rope_local_base_freq", None, 1_000_000.0, False),  # Gemma 3 (full: rope_theta)
    ("local_rope_theta", "global_rope_theta", 160_000.0, True),  # ModernBERT
)


def _per_layer_rope(config, raw):
    """``{layer_type: rope dict}`` of a per-layer-type config, or None for one rope."""
    if any(isinstance(value, Mapping) for value in raw.values()):
        stray = sorted(str(key) for key, value in raw.items()
                       if value is not None and not isinstance(value, Mapping))
        if stray:
            raise ValueError(f"config: rope_parameters mixes per-layer-type dicts "
                             f"({sorted(k for k, v in raw.items() if isinstance(v, Mapping))})"
                             f" with the keys {stray}")
        return raw
    for sliding_key, full_key, full_default, scaled_sliding in _OLD_PER_LAYER:
        sliding = _config_get(config, sliding_key)
        full = _config_get(config, full_key) if full_key else None
        if sliding is None and full is None:
            continue
        full = full or _config_get(config, "rope_theta") or full_default
        return {"full_attention": {"rope_theta": full, **raw},
                "sliding_attention": {**(raw if scaled_sliding else {}),
                                      "rope_theta": sliding or full}}
    return None


def _rope_parameters_of(config, layer_type):
    """The flat rope dict (``rope_parameters`` / ``rope_scaling``) of ``layer_type``'s layers."""
    raw = _config_get(config, "rope_parameters") or _config_get(config, "rope_scaling")
    raw = dict(raw) if raw else {}
    layers = _per_layer_rope(config, raw)
    declared = list(_config_get(config, "layer_types") or ())
    if layers is None:
        if layer_type is not None and declared and layer_type not in declared:
            raise ValueError(f"layer_type: {_checks.quote(layer_type)} is not a layer type of "
                             f"this config; expected one of {sorted(set(declared))}")
        return raw
    if layer_type is None:
        raise ValueError(f"layer_type: this config's rope differs by layer type "
                         f"{sorted(layers)}; pass layer_type= one of them")
    if layer_type not in layers:
        raise ValueError(f"layer_type: {_checks.quote(layer_type)} has no rope in this config;"
                         f" expected one of {sorted(layers)}")
    if layers[layer_type] is None:
        raise ValueError(f"layer_type: {layer_type!r} layers have no rotary (their "
                         "rope_parameters are None)")
    return dict(layers[layer_type])


def _layer_view(config, layer_type):
    """``config`` as the layers of ``layer_type`` see it: transformers 5's ``per_layer_config``
    overrides (Gemma 4's full-attention ``head_dim`` is ``global_head_dim``)."""
    if layer_type is None:
        return config
    if not isinstance(config, Mapping):
        try:
            return config.per_layer_config[layer_type]
        except (AttributeError, KeyError, TypeError, ValueError):  # no per-layer config
            return config
    # A saved config keys its per_layer_config by layer index, as a string ("05").
    per_layer = {int(key): dict(value or {})
                 for key, value in (config.get("per_layer_config") or {}).items()}
    types = config.get("layer_types") or []
    overrides = [per_layer.get(index, {}) for index, kind in enumerate(types)
                 if kind == layer_type]
    if not overrides or not any(overrides):
        return config
    if any(entry != overrides[0] for entry in overrides):
        raise ValueError(f"config: per_layer_config differs between {layer_type!r} layers; "
                         "build each layer's RotaryEmbedding from its own values")
    return {**config, **overrides[0]}


class RotaryEmbedding(Module):
    """Rotary position embeddings (RoPE) of q and k, as Llama, Mistral, Qwen, GPT-NeoX, Phi use.

    ``forward(q, k)`` rotates both with one cos / sin table (see
    :func:`numbapos.functional.apply_rotary`); ``backward(grad_q, grad_k)``
    rotates the gradients back. The module has no parameters.

    Frequencies come from :func:`numbapos.functional.rope_frequencies`. The
    ``"dynamic"`` (NTK) and ``"longrope"`` types depend on the sequence length
    ``s = max(position) + 1`` of each call, as in transformers:

    - by default the module keeps transformers' state: dynamic NTK recomputes
      its frequencies when ``s`` exceeds the longest length seen so far, and
      returns to the original ones when ``s`` falls below
      ``max_position_embeddings`` after having grown (so a short call after a
      long one may still use grown frequencies, exactly as transformers does);
    - ``stateless=True`` uses the frequencies of ``s`` itself, whatever came
      before.

    LongRoPE uses ``long_factor`` when ``s`` exceeds
    ``original_max_position_embeddings``, else ``short_factor`` (both modes).
    No cos / sin table is kept between calls (each call makes one row per
    position, shared by q, k and every head); the frequency vectors in use are
    kept on the device, at most :attr:`cache_size` of them.

    q and k must have exactly ``head_dim`` channels: a head of another width
    raises (a wider one is never rotated in part silently); rotating only the
    first channels of each head is ``partial_rotary_factor``'s job.

    Activations may be float32, float64, bfloat16 or float16 (NumPy, CUDA,
    PyTorch tensors: a bfloat16 one read through its bits); a 16-bit q / k is
    rotated in float32 and rounded back to its dtype (see
    :func:`numbapos.functional.apply_rotary`).

    Multimodal rotary (``mrope_section``): ``position_ids`` are three streams
    ``(3, B, L)`` (temporal, height, width) and each frequency turns by the
    position of its stream, the sections chunked (Qwen2-VL, Qwen2.5-VL) or,
    with ``mrope_interleaved=True``, interleaved (Qwen3-VL): transformers'
    ``Qwen2VLRotaryEmbedding`` / ``Qwen2_5_VLRotaryEmbedding`` /
    ``Qwen3VLTextRotaryEmbedding``. Text-only positions (three equal streams,
    or an ``offset``) give exactly the 1-D rotary's bits.

    Parameters
    ----------
    head_dim : int
        Channels per head D: the last dimension of q and k.
    base : float, default 10000.0
        ``rope_theta``.
    partial_rotary_factor : float, default 1.0
        Fraction of the channels rotated, as Hugging Face's: the first
        ``int(head_dim * partial_rotary_factor)`` (even), the rest passed through.
        With ``rope_type="proportional"`` (Gemma 4) every channel is rotated and
        the factor sets how many frequencies are not zero instead (see
        :func:`~numbapos.functional.rope_frequencies`).
    scaling : dict, optional
        A Hugging Face ``rope_scaling`` / ``rope_parameters`` dict.
    max_position_embeddings : int, default 2048
        The model's trained length (dynamic NTK's reference length; the default
        ``original_max_position_embeddings``).
    layout : {"half", "interleaved"}, default "half"
        Channel pairing (see :func:`~numbapos.functional.apply_rotary`).
    head_axis : {1, 2}, default 1
        q and k are ``(B, H, L, D)`` (1) or ``(B, L, H, D)`` (2).
    float32_angle : bool, default False
        Round angles, cos and sin in float32 as transformers does.
    stateless : bool, default False
        Dynamic NTK from each call's own length (see above).
    mrope_section : sequence of 3 int, optional
        Frequencies per position stream ``(t, h, w)``, summing to the number
        of frequencies (``[16, 24, 24]`` in Qwen2-VL / Qwen2.5-VL, ``[24, 20,
        20]`` in Qwen3-VL); default: ``scaling``'s ``mrope_section``, else
        None (the 1-D rotary).
    mrope_interleaved : bool, optional
        Interleave the sections (Qwen3-VL) instead of chunking them;
        default: ``scaling``'s ``mrope_interleaved``, else False.
    device : {"cpu", "cuda"}, default "cpu"

    Attributes
    ----------
    inv_freq : ndarray
        The frequencies the next call of the current length uses (float64, host).
    attention_scaling : float
    rope_type : str
    cache_size : int
        How many frequency vectors are kept on the device (LRU).
    mrope_section : tuple of 3 int or None
    mrope_interleaved : bool

    Examples
    --------
    >>> import numpy as np
    >>> from numbapos.nn import RotaryEmbedding
    >>> rope = RotaryEmbedding(8)
    >>> q = np.ones((1, 4, 3, 8), np.float32)
    >>> k = np.ones((1, 2, 3, 8), np.float32)
    >>> q_rot, k_rot = rope(q, k)
    >>> q_rot.shape, k_rot.shape
    ((1, 4, 3, 8), (1, 2, 3, 8))
    """

    cache_size = 16

    def __init__(self, head_dim, base=10000.0, *, partial_rotary_factor=1.0, scaling=None,
                 max_position_embeddings=2048, layout="half", head_axis=1,
                 float32_angle=False, stateless=False, mrope_section=None,
                 mrope_interleaved=None, device="cpu"):
        super().__init__()
        self.max_position_embeddings = _checks.check_int(
            max_position_embeddings, "max_position_embeddings", minimum=1)
        inv_freq, scale = F.rope_frequencies(head_dim, base,
                                             partial_rotary_factor=partial_rotary_factor,
                                             scaling=scaling,
                                             max_position_embeddings=max_position_embeddings)
        self.scaling = None if scaling is None else dict(scaling)
        self.head_dim = int(head_dim)
        self.base = float(base)
        self.partial_rotary_factor = float(partial_rotary_factor)
        self.rope_type = rope_type_of(self.scaling)
        check_rotary_options(layout, head_axis, float32_angle)
        self.layout = layout
        self.head_axis = int(head_axis)
        self.float32_angle = bool(float32_angle)
        self.stateless = bool(stateless)
        self.mrope_section, self.mrope_interleaved = _mrope_options(
            self.scaling, mrope_section, mrope_interleaved, inv_freq.shape[0])
        self.original_inv_freq = inv_freq
        self.inv_freq = inv_freq
        self.attention_scaling = scale
        self.max_seq_len_cached = self.max_position_embeddings
        self._on_device = OrderedDict()
        object.__setattr__(self, "_outputs_k", OutputBuffer())  # k's (q's: Module._outputs)
        self._place(device)

    # ------------------------------------------------------------ frequencies

    def _frequencies_for(self, seq_len):
        return F.rope_frequencies(self.head_dim, self.base,
                                  partial_rotary_factor=self.partial_rotary_factor,
                                  scaling=self.scaling,
                                  max_position_embeddings=self.max_position_embeddings,
                                  seq_len=seq_len)

    def frequencies(self, seq_len):
        """``(inv_freq, attention_scaling)`` for a call whose longest position is ``seq_len - 1``.

        In the default (stateful) mode this updates the dynamic-NTK state as a
        forward of that length does.

        Parameters
        ----------
        seq_len : int
            ``max(position) + 1`` (>= 0).

        Returns
        -------
        inv_freq : ndarray, float64
        attention_scaling : float
        """
        seq_len = _checks.check_int(seq_len, "seq_len", minimum=0)
        if self.rope_type == "longrope":
            self.inv_freq, self.attention_scaling = self._frequencies_for(seq_len)
        elif self.rope_type == "dynamic":
            if self.stateless:
                return self._frequencies_for(seq_len)
            original = self.max_position_embeddings
            if seq_len > self.max_seq_len_cached:  # growth
                self.inv_freq, self.attention_scaling = self._frequencies_for(seq_len)
                self.max_seq_len_cached = seq_len
            elif seq_len < original < self.max_seq_len_cached:  # reset
                self.inv_freq = self.original_inv_freq
                self.max_seq_len_cached = original
        return self.inv_freq, self.attention_scaling

    def _device_freq(self, inv_freq, device):
        key = (inv_freq.tobytes(), device)
        freq = self._on_device.get(key)
        if freq is None:
            freq = _device.to_device(np.ascontiguousarray(inv_freq, np.float64), device)
            self._on_device[key] = freq
            while len(self._on_device) > max(1, int(self.cache_size)):
                self._on_device.popitem(last=False)
        else:
            self._on_device.move_to_end(key)
        return freq

    def _on_device_change(self) -> None:
        super()._on_device_change()
        self._on_device.clear()
        self._outputs_k.clear()

    # ------------------------------------------------------------ forward / backward

    def _seq_len_of(self, q, position_ids, offset, seq_len):
        if seq_len is not None:
            return _checks.check_int(seq_len, "seq_len", minimum=0)
        length = q.shape[1] if q.ndim == 3 else q.shape[3 - self.head_axis]
        if position_ids is None:
            return offset + length
        ids = _checks.check_index_array(position_ids, "position_ids")
        if ids.size == 0:
            return 0
        if _device.device_of(ids) == "cuda":
            refuse_in_capture(
                "dynamic NTK scaling with CUDA position_ids and no seq_len (max(position_ids) "
                "is read on the host); pass seq_len=")
        return int(_device.to_host(ids).max()) + 1  # dynamic only; a copy from a GPU

    def _longrope_on_device(self, position_ids, device):
        """LongRoPE's frequencies for CUDA ``position_ids`` without ``seq_len``: short or
        long factors picked on the device by the largest position (no copy to the host;
        :attr:`inv_freq` is not updated, the host never learns the length)."""
        pair = self.__dict__.get("_longrope_pair")
        if pair is None:
            original = self._longrope_original()
            pair = (self._frequencies_for(0)[0], self._frequencies_for(original + 1)[0],
                    original)
            self.__dict__["_longrope_pair"] = pair
        short, long, original = pair
        return _rope._pick_frequencies(position_ids, original,
                                       self._device_freq(short, device),
                                       self._device_freq(long, device))

    def _longrope_original(self) -> int:
        """The length above which LongRoPE uses its long factors."""
        scaling = self.scaling or {}
        value = scaling.get("original_max_position_embeddings", self.max_position_embeddings)
        return int(value)

    @property
    def _rotated_factor(self) -> float:
        """The fraction of each head the rotation covers: all of it for proportional rope,
        whose zero frequencies leave the unrotated pairs as they are."""
        return 1.0 if self.rope_type == "proportional" else self.partial_rotary_factor

    def _check_width(self, q) -> None:
        """ValueError unless ``q`` has ``head_dim`` channels, naming both and the fix."""
        width = q.shape[q.ndim - 1]
        if width == self.head_dim:
            return
        rotated = int(self.head_dim * self._rotated_factor)
        text = (f"q: last dimension {width} differs from head_dim={self.head_dim} of this "
                f"RotaryEmbedding, which rotates heads of exactly head_dim channels")
        if width > rotated:
            text += (f"; to rotate only the first {rotated} of {width} channels and pass the "
                     f"rest through, say so: RotaryEmbedding({width}, partial_rotary_factor="
                     f"{factor_for(rotated, width)!r}) (Hugging Face's partial_rotary_factor)")
        else:
            text += f"; for heads of {width} channels build RotaryEmbedding({width})"
        raise ValueError(text)

    def forward(self, q, k=None, position_ids=None, offset=0, seq_len=None):
        """Rotate ``q`` (and ``k``) by their positions.

        Parameters
        ----------
        q : ndarray, float32, float64, bfloat16 or float16
            ``(B, Hq, L, D)`` (or ``(B, L, Hq, D)`` with ``head_axis=2``, or
            ``(B, L, D)``), ``D == head_dim``.
        k : ndarray, optional
            Keys in the same layout; the head count may differ (GQA / MQA).
        position_ids : array_like of int, optional
            ``(L,)``, ``(1, L)`` or ``(B, L)`` positions (left padding: any per row);
            with ``mrope_section``, three streams ``(3, B, L)`` or ``(3, 1, L)``
            (temporal, height, width: transformers' ``get_rope_index``).
        offset : int, default 0
            First position when ``position_ids`` is None (the cache length).
        seq_len : int, optional
            ``max(position) + 1`` for dynamic / longrope scaling; by default it is
            computed from the positions. With CUDA ``position_ids``, LongRoPE
            picks its short or long factors on the device (no copy to the host;
            :attr:`inv_freq` then keeps its value), but dynamic NTK reads the
            largest position back to the host (a synchronisation, refused in a
            captured step): pass ``seq_len`` to avoid it.

        Returns
        -------
        q_rot : ndarray, or (q_rot, k_rot) when ``k`` is given

        Raises
        ------
        TypeError, ValueError
            As for :func:`numbapos.functional.rotary_qk`; ``offset`` with
            ``position_ids``; a last dimension other than ``head_dim``.
        """
        offset = _checks.check_int64(offset, "offset")
        if position_ids is not None:
            _checks.check_offset_only(offset, position_ids)
        q_checked = _checks.check_float_or_half_array(q, "q", ndim=(3, 4))
        self._check_width(q_checked)
        state = (self.inv_freq, self.attention_scaling, self.max_seq_len_cached)
        try:
            device = _device.device_of(q_checked)
            freq = None
            if (self.rope_type == "longrope" and seq_len is None and position_ids is not None
                    and _device.is_cuda_array(position_ids) and device == "cuda"):
                freq = self._longrope_on_device(position_ids, device)
                scale = self.attention_scaling  # LongRoPE's does not depend on the length
            elif self.rope_type in ("dynamic", "longrope"):
                inv_freq, scale = self.frequencies(self._seq_len_of(q_checked, position_ids,
                                                                    offset, seq_len))
            else:
                inv_freq, scale = self.inv_freq, self.attention_scaling
            if freq is None:
                freq = self._device_freq(inv_freq, device)
            positions = offset if position_ids is None else position_ids
            out_q = self._output_buffer(q_checked, q_checked.shape, q_checked.dtype)
            out_k = None
            if out_q is not None and type(k) is np.ndarray and k.dtype == q_checked.dtype:
                out_k = self._outputs_k.take(k.shape, k.dtype)
            q_rot, k_rot = F.rotary_qk(q_checked, k, positions, freq, attention_scaling=scale,
                                       layout=self.layout, head_axis=self.head_axis,
                                       float32_angle=self.float32_angle,
                                       partial_rotary_factor=self._rotated_factor,
                                       mrope_section=self.mrope_section,
                                       mrope_interleaved=self.mrope_interleaved,
                                       out_q=out_q, out_k=out_k)
        except Exception:  # bad input changes no state (the dynamic-NTK lengths)
            self.inv_freq, self.attention_scaling, self.max_seq_len_cached = state
            raise
        if self._recording():
            if position_ids is not None:
                positions = _device.copy(_checks.check_index_array(position_ids,
                                                                   "position_ids"))
            self._save_for_backward((positions, freq, scale, tuple(q_rot.shape),
                                     None if k_rot is None else tuple(k_rot.shape)))
        return q_rot if k_rot is None else (q_rot, k_rot)

    def backward(self, grad_q, grad_k=None):
        """Gradients wrt ``q`` (and ``k``) of the matching forward: the inverse rotation.

        Returns
        -------
        grad_q : ndarray, or (grad_q, grad_k) when the forward was given ``k``

        Raises
        ------
        RuntimeError
            No recorded forward is left.
        TypeError, ValueError
            Gradients not of the forward outputs' shapes, or ``grad_k`` missing
            or extra (the record is kept).
        """
        positions, freq, scale, q_shape, k_shape = self._saved_context()
        grad_q = _checks.check_float_or_half_array(grad_q, "grad_q")
        _checks.check_same_shape(grad_q, q_shape, "grad_q", "the shape of the forward's q")
        if (k_shape is None) != (grad_k is None):
            raise ValueError("grad_k: expected " + ("None (the forward had no k)"
                                                    if k_shape is None else
                                                    "the gradient of the forward's k, got None"))
        if grad_k is not None:
            grad_k = _checks.check_float_or_half_array(grad_k, "grad_k")
            _checks.check_same_shape(grad_k, k_shape, "grad_k", "the shape of the forward's k")
        gq, gk = F.rotary_qk(grad_q, grad_k, positions, freq, attention_scaling=scale,
                             layout=self.layout, head_axis=self.head_axis,
                             float32_angle=self.float32_angle,
                             partial_rotary_factor=self._rotated_factor, backward=True,
                             mrope_section=self.mrope_section,
                             mrope_interleaved=self.mrope_interleaved)
        self._release()
        return gq if gk is None else (gq, gk)

    # ------------------------------------------------------------ Hugging Face

    @classmethod
    def from_hf_config(cls, config, layer_type=None, **kwargs):
        """The rotary embedding of a transformers config (object or dict), of one layer type.

        Reads ``rope_parameters`` (transformers 5) or ``rope_scaling`` (4),
        ``rope_theta`` (or GPT-NeoX's ``rotary_emb_base``), the rotated fraction
        (``partial_rotary_factor``, GPT-NeoX's ``rotary_pct`` or GPT-J's
        ``rotary_dim``), ``head_dim`` (or ``hidden_size // num_attention_heads``),
        ``max_position_embeddings`` and Phi-3's top-level
        ``original_max_position_embeddings``. DeepSeek's ``qk_rope_head_dim``
        is the head size. GPT-J, Cohere and ``rope_interleave=True`` (DeepSeek-V3)
        get ``layout="interleaved"`` (DeepSeek's attention returns the rotated
        pairs de-interleaved, ours in place: the same q . k). A multimodal config
        is read through its ``text_config``.

        Multimodal rotary: ``mrope_section`` (and ``mrope_interleaved``) of the
        rope dict make a module taking ``(3, B, L)`` position streams. As in
        transformers, the model type decides the layout and the default
        sections: Qwen2-VL and Qwen2.5-VL chunk them (default ``[16, 24,
        24]``), Qwen3-VL (and its MoE) interleaves them (default ``[24, 20,
        20]``); an ``mrope_interleaved`` that contradicts the model type
        raises. Other model types read ``mrope_interleaved`` (default False).

        Configs whose rope differs by layer type (transformers 5's Gemma 2 / 3 /
        4 and ModernBERT: ``rope_parameters={"sliding_attention": {...},
        "full_attention": {...}}``; transformers 4's Gemma 3
        ``rope_local_base_freq`` and ModernBERT ``local_rope_theta`` /
        ``global_rope_theta``) need ``layer_type``; so does Gemma 4's wider
        full-attention head (``per_layer_config``). Every key of the rope dict is
        read or refused (see :func:`~numbapos.functional.rope_frequencies`).

        Parameters
        ----------
        config : transformers.PretrainedConfig or dict
        layer_type : str, optional
            The layer type whose rope to build (an entry of the config's
            ``layer_types``, such as ``"full_attention"`` or
            ``"sliding_attention"``); needed where the rope differs by type.
        **kwargs
            Override any constructor argument (``device``, ``stateless``,
            ``head_axis``, ...).

        Returns
        -------
        RotaryEmbedding

        Raises
        ------
        ValueError
            A per-layer-type config without ``layer_type``, a ``layer_type`` the
            config does not have (both naming the types), an unknown
            ``rope_type`` or a key the type does not read, no head size, an
            ``mrope_section`` that does not split the frequencies (3
            non-negative ints summing to ``head_dim * partial_rotary_factor / 2``)
            or an ``mrope_interleaved`` the model type contradicts.

        Examples
        --------
        >>> from numbapos import nn
        >>> config = {"hidden_size": 64, "num_attention_heads": 4,
        ...           "rope_parameters": {
        ...               "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        ...               "full_attention": {"rope_type": "linear", "factor": 8.0,
        ...                                  "rope_theta": 1e6}}}
        >>> rope = nn.RotaryEmbedding.from_hf_config(config, layer_type="full_attention")
        >>> rope.base, rope.rope_type
        (1000000.0, 'linear')
        """
        model_type = _config_get(config, "model_type")
        text = _config_get(config, "text_config")
        if text is not None:
            config = text
            model_type = _config_get(config, "model_type") or model_type
        params = _rope_parameters_of(config, layer_type)
        layer = _layer_view(config, layer_type)
        base = (params.get("rope_theta") or _config_get(config, "rope_theta")
                or _config_get(config, "rotary_emb_base") or 10000.0)
        hidden = _config_get(layer, "hidden_size") or _config_get(layer, "n_embd")
        heads = _config_get(layer, "num_attention_heads") or _config_get(layer, "n_head")
        head_dim = (_config_get(layer, "qk_rope_head_dim")  # DeepSeek's rotated part of q / k
                    or _config_get(layer, "head_dim")
                    or (hidden // heads if hidden and heads else None))
        if head_dim is None:
            raise ValueError("config: needs head_dim, or hidden_size and num_attention_heads")
        partial = (params.get("partial_rotary_factor")
                   or _config_get(config, "partial_rotary_factor")
                   or _config_get(config, "rotary_pct"))
        rotary_dim = _config_get(config, "rotary_dim")
        if partial is None and rotary_dim:
            partial = factor_for(int(rotary_dim), int(head_dim))  # int(head_dim * it) == rotary_dim
        max_len = (_config_get(config, "max_position_embeddings")
                   or _config_get(config, "n_positions") or 2048)
        original = _config_get(config, "original_max_position_embeddings")
        scaling = {key: value for key, value in params.items()
                   if key not in ("rope_theta", "partial_rotary_factor") + MULTIMODAL_KEYS}
        if original is not None and rope_type_of(scaling) in ("llama3", "yarn", "longrope"):
            scaling["original_max_position_embeddings"] = original
        options = dict(base=base, partial_rotary_factor=partial or 1.0,
                       scaling=scaling or None, max_position_embeddings=max_len)
        if (_config_get(config, "model_type") in INTERLEAVED_MODEL_TYPES
                or _config_get(config, "rope_interleave")):
            options["layout"] = "interleaved"
        options.update(_mrope_of(params, model_type))
        options.update(kwargs)
        return cls(head_dim, **options)

    def extra_repr(self) -> str:
        text = (f"{self.head_dim}, base={self.base}, rope_type={self.rope_type!r}, "
                f"layout={self.layout!r}")
        if self.mrope_section is not None:
            text += (f", mrope_section={list(self.mrope_section)}, "
                     f"mrope_interleaved={self.mrope_interleaved}")
        return text


def _mrope_options(scaling, section, interleaved, frequencies):
    """``(mrope_section, mrope_interleaved)`` of the constructor: the arguments, else the
    ``scaling`` dict's keys (both given and different: ValueError)."""
    scaling = scaling or {}
    for name, value in (("mrope_section", section), ("mrope_interleaved", interleaved)):
        given = scaling.get(name)
        if value is not None and given is not None and (
                list(np.atleast_1d(value)) != list(np.atleast_1d(given))):
            raise ValueError(f"{name}: {_checks.quote(value)} differs from scaling's "
                             f"{name}={_checks.quote(given)}; give it once")
    section = section if section is not None else scaling.get("mrope_section")
    interleaved = interleaved if interleaved is not None else scaling.get("mrope_interleaved",
                                                                           False)
    if not isinstance(interleaved, (bool, np.bool_)):
        raise TypeError(f"mrope_interleaved: expected a bool, got {_checks.quote(interleaved)}")
    if section is None:
        if interleaved:
            raise ValueError("mrope_interleaved: True needs mrope_section (the sections to "
                             "interleave), got mrope_section=None")
        return None, False
    return check_mrope_section(section, frequencies), bool(interleaved)


def _mrope_of(params, model_type):
    """The ``mrope_section`` / ``mrope_interleaved`` options of a config's rope dict, with
    transformers' defaults for the multimodal model types (which always use them)."""
    section = params.get("mrope_section")
    interleaved = params.get("mrope_interleaved")
    known = MROPE_MODEL_TYPES.get(model_type)
    if known is not None:
        default_section, layout = known
        if interleaved is not None and bool(interleaved) != layout:
            raise ValueError(f"config: mrope_interleaved={interleaved!r}, but "
                             f"{model_type!r}'s rotary {'interleaves' if layout else 'chunks'}"
                             " its sections (transformers decides by the model type)")
        section = default_section if section is None else section
        interleaved = layout
    if section is None:
        return {} if interleaved is None else {"mrope_interleaved": interleaved}
    return {"mrope_section": section, "mrope_interleaved": bool(interleaved)}
