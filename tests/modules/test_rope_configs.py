"""RotaryEmbedding.from_hf_config against transformers: every rope_type, the configs of real
model families (built from transformers' config classes, no downloads), per-layer-type rope,
and the errors of keys or layer types it cannot honour."""

import numpy as np
import pytest

from numbapos import functional as F
from numbapos import nn

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
from transformers import modeling_rope_utils  # noqa: E402

ROPE_INIT_FUNCTIONS = modeling_rope_utils.ROPE_INIT_FUNCTIONS
# transformers 5 nests rope settings in rope_parameters; 4 spreads them over rope_scaling,
# rope_theta and per-family keys (rope_local_base_freq, global_rope_theta, ...).
NESTED_LAYOUT = hasattr(modeling_rope_utils, "RotaryEmbeddingConfigMixin")


def config_of(class_name, rope=None, **kwargs):
    """transformers.<class_name>(...) with the flat rope dict ``rope`` in the installed
    version's layout (skipped where the class does not exist)."""
    cls = getattr(transformers, class_name, None)
    if cls is None:
        pytest.skip(f"transformers {transformers.__version__} has no {class_name}")
    rope = dict(rope or {})
    if NESTED_LAYOUT:
        return cls(rope_parameters=rope or None, **kwargs)
    theta = rope.pop("rope_theta", None)
    if theta is not None:
        kwargs["rope_theta"] = theta
    if set(rope) - {"rope_type", "type"} or rope.get("rope_type", "default") != "default":
        kwargs["rope_scaling"] = rope
    return cls(**kwargs)


def theirs_of(config, kind, seq_len=None):
    """transformers' (inv_freq float64, attention scaling) for ``kind``."""
    if kind == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        inv_freq, scale = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        if kind not in ROPE_INIT_FUNCTIONS:
            pytest.skip(f"transformers {transformers.__version__} has no rope_type {kind!r}")
        inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](config, None, seq_len=seq_len)
    return inv_freq.double().numpy(), float(scale)


def check_frequencies(ours, inv_freq, scale, seq_len=None):
    """``ours`` (a RotaryEmbedding) gives transformers' float32 frequencies within 1e-6."""
    got, got_scale = ours.frequencies(seq_len) if seq_len is not None else (
        ours.inv_freq, ours.attention_scaling)
    assert got.shape == inv_freq.shape  # integer-equal: the count of frequencies
    np.testing.assert_array_equal(got == 0, inv_freq == 0)  # and which are zero
    np.testing.assert_allclose(got, inv_freq, rtol=1e-6, atol=0)
    assert got_scale == pytest.approx(scale, rel=1e-6)


# ---------------------------------------------------------------- every rope_type

LONG = {"short_factor": [1.0, 1.1, 1.3, 1.7, 2.0, 2.5, 3.0, 4.0],
        "long_factor": [1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0]}
EVERY_TYPE = [
    ({"rope_type": "default"}, None),
    ({"rope_type": "linear", "factor": 4.0}, None),
    ({"rope_type": "dynamic", "factor": 2.0}, 300),
    ({"rope_type": "yarn", "factor": 8.0, "beta_fast": 16, "beta_slow": 2, "mscale": 0.707,
      "mscale_all_dim": 1.0, "original_max_position_embeddings": 64}, None),
    ({"rope_type": "yarn", "factor": 4.0, "truncate": False,
      "original_max_position_embeddings": 32}, None),
    ({"rope_type": "longrope", **LONG, "original_max_position_embeddings": 32}, 20),
    ({"rope_type": "longrope", **LONG, "original_max_position_embeddings": 32}, 100),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 64}, None),
    ({"rope_type": "proportional", "partial_rotary_factor": 0.25}, None),
    ({"rope_type": "proportional", "partial_rotary_factor": 0.4, "factor": 2.0}, None),
    ({"rope_type": "proportional"}, None),
]


@pytest.mark.parametrize("rope, seq_len", EVERY_TYPE,
                         ids=lambda v: v["rope_type"] if isinstance(v, dict) else str(v))
def test_every_rope_type_matches_rope_init_functions(rope, seq_len):
    kind = rope["rope_type"]
    if kind == "proportional" and not NESTED_LAYOUT:
        pytest.skip("proportional rope needs transformers 5")
    config = config_of("LlamaConfig", {**rope, "rope_theta": 500.0}, hidden_size=64,
                       num_attention_heads=4, max_position_embeddings=128)
    inv_freq, scale = theirs_of(config, kind, seq_len)
    check_frequencies(nn.RotaryEmbedding.from_hf_config(config), inv_freq, scale, seq_len)


def test_proportional_rotation_matches_transformers(rng):
    """Gemma 4's full-attention rope: every channel rotated, the zero frequencies pass their
    pairs through; equal to transformers' cos / sin applied to q."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    config = config_of("LlamaConfig", {"rope_type": "proportional", "rope_theta": 1e6,
                                       "partial_rotary_factor": 0.25},
                       hidden_size=128, num_attention_heads=4)
    if "proportional" not in ROPE_INIT_FUNCTIONS:
        pytest.skip("no proportional rope in this transformers")
    inv_freq, _ = theirs_of(config, "proportional")
    ids = np.arange(5, 12)[None]
    angles = torch.from_numpy(ids).double()[..., None] * torch.from_numpy(inv_freq)
    emb = torch.cat([angles, angles], dim=-1)
    q = rng.standard_normal((1, 2, 7, 32)).astype(np.float32)
    want, _ = apply_rotary_pos_emb(torch.from_numpy(q).double(), torch.from_numpy(q).double(),
                                   emb.cos(), emb.sin())
    rope = nn.RotaryEmbedding.from_hf_config(config)
    got = rope(q, position_ids=ids)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
    half = 4  # int(0.25 * 32 // 2) rotated frequencies of 16
    np.testing.assert_array_equal(got[..., half:16], q[..., half:16])
    np.testing.assert_array_equal(got[..., 16 + half:], q[..., 16 + half:])


# ---------------------------------------------------------------- real model families


@pytest.mark.parametrize("name, hidden, heads, factor", [
    ("llama-3.1-8b", 4096, 32, 8.0), ("llama-3.2-1b", 2048, 32, 32.0)])
def test_llama_3_configs(name, hidden, heads, factor):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = config_of("LlamaConfig", {
        "rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192, "rope_theta": 500000.0},
        hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=8,
        max_position_embeddings=131072, num_hidden_layers=1, intermediate_size=64)
    theirs = LlamaRotaryEmbedding(config)
    ours = nn.RotaryEmbedding.from_hf_config(config)
    assert ours.rope_type == "llama3" and ours.head_dim == hidden // heads
    check_frequencies(ours, theirs.inv_freq.double().numpy(), theirs.attention_scaling)


@pytest.mark.parametrize("rope", [
    {"rope_theta": 1e6},  # Qwen2.5-7B
    {"rope_theta": 1e6, "type": "yarn", "factor": 4.0,  # its 128k-token model card setting
     "original_max_position_embeddings": 32768}])
def test_qwen2_5_configs(rope):
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    config = config_of("Qwen2Config", rope, hidden_size=3584, num_attention_heads=28,
                       num_key_value_heads=4, max_position_embeddings=32768,
                       num_hidden_layers=1, intermediate_size=64)
    theirs = Qwen2RotaryEmbedding(config)
    ours = nn.RotaryEmbedding.from_hf_config(config)
    assert ours.base == 1e6 and ours.rope_type == rope.get("type", "default")
    check_frequencies(ours, theirs.inv_freq.double().numpy(), theirs.attention_scaling)


def _vl_parity(config, theirs, ours, rng, head_dim):
    """Our module's rotation of three position streams against transformers' rotary module
    (its float32 angle, from its own float32 frequencies) + apply_rotary_pos_emb."""
    from transformers.models.qwen2_vl.modeling_qwen2_vl import apply_rotary_pos_emb

    ours.inv_freq = theirs.inv_freq.double().numpy()
    q = rng.standard_normal((1, 2, 5, head_dim)).astype(np.float32)
    ids = rng.integers(0, 4096, (3, 1, 5))
    cos, sin = theirs(torch.from_numpy(q), torch.from_numpy(ids))
    want, _ = apply_rotary_pos_emb(torch.from_numpy(q), torch.from_numpy(q), cos, sin)
    np.testing.assert_allclose(ours(q, position_ids=ids), want.numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("class_name, module_path, rope, interleaved", [
    ("Qwen2VLConfig", "qwen2_vl.modeling_qwen2_vl.Qwen2VLRotaryEmbedding",
     {"type": "mrope", "mrope_section": [16, 24, 24]}, False),
    ("Qwen2_5_VLConfig", "qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VLRotaryEmbedding",
     {"type": "mrope", "mrope_section": [16, 24, 24]}, False),
    ("Qwen2_5_VLConfig", "qwen2_5_vl.modeling_qwen2_5_vl.Qwen2_5_VLRotaryEmbedding",
     {"rope_type": "default"}, False),  # no sections: the model's default [16, 24, 24]
    ("Qwen3VLConfig", "qwen3_vl.modeling_qwen3_vl.Qwen3VLTextRotaryEmbedding",
     {"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True}, True),
    ("Qwen3VLConfig", "qwen3_vl.modeling_qwen3_vl.Qwen3VLTextRotaryEmbedding",
     {"rope_type": "default"}, True),  # the model's default [24, 20, 20], interleaved
])
def test_qwen_vl_mrope_configs(class_name, module_path, rope, interleaved):
    """Qwen2-VL / Qwen2.5-VL / Qwen3-VL: the sections and their layout are read, the
    frequencies are transformers', and the rotation of three streams equals its module's."""
    import importlib

    cls = getattr(transformers, class_name, None)
    if cls is None or not NESTED_LAYOUT:
        pytest.skip(f"transformers {transformers.__version__}: no {class_name} with "
                    "rope_parameters")
    path, name = module_path.rsplit(".", 1)
    module = getattr(importlib.import_module(f"transformers.models.{path}"), name, None)
    if module is None:
        pytest.skip(f"transformers {transformers.__version__} has no {name}")
    config = cls(text_config=dict(hidden_size=512, num_attention_heads=4, num_key_value_heads=2,
                                  head_dim=128, rope_parameters={"rope_theta": 1e6, **rope}))
    theirs = module(config.text_config)
    ours = nn.RotaryEmbedding.from_hf_config(config, float32_angle=True)
    assert ours.mrope_section == tuple(theirs.mrope_section)
    assert ours.mrope_interleaved is interleaved and ours.base == 1e6
    check_frequencies(ours, theirs.inv_freq.double().numpy(), theirs.attention_scaling)
    _vl_parity(config, theirs, ours, np.random.default_rng(0), 128)


def test_qwen_vl_hub_dicts():
    """The hub's config.json layouts (dicts): transformers 4's rope_scaling with
    type="mrope", Qwen3-VL's nested text_config."""
    text = {"hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
            "rope_theta": 1e6, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}}
    rope = nn.RotaryEmbedding.from_hf_config({"model_type": "qwen2_5_vl", **text})
    assert rope.mrope_section == (16, 24, 24) and not rope.mrope_interleaved
    assert rope.rope_type == "default" and rope.head_dim == 128
    qwen3 = {"model_type": "qwen3_vl", "text_config": {
        "hidden_size": 4096, "num_attention_heads": 32, "head_dim": 128, "rope_theta": 5e6,
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [24, 20, 20],
                         "rope_type": "default"}}}
    rope = nn.RotaryEmbedding.from_hf_config(qwen3)
    assert rope.mrope_section == (24, 20, 20) and rope.mrope_interleaved and rope.base == 5e6
    # Another model type reads mrope_interleaved as it is (default False).
    other = {"hidden_size": 64, "num_attention_heads": 4,
             "rope_parameters": {"rope_type": "default", "mrope_section": [4, 2, 2]}}
    assert not nn.RotaryEmbedding.from_hf_config(other).mrope_interleaved
    # The constructor reads the keys from its scaling dict too.
    rope = nn.RotaryEmbedding(128, 1e6, scaling={"rope_type": "default",
                                                 "mrope_section": [16, 24, 24]})
    assert rope.mrope_section == (16, 24, 24)


@pytest.mark.parametrize("config, match", [
    ({"model_type": "qwen3_vl_text", "hidden_size": 64, "num_attention_heads": 4,
      "rope_parameters": {"mrope_section": [4, 2, 2], "mrope_interleaved": False}},
     r"config: mrope_interleaved=False, but 'qwen3_vl_text''s rotary interleaves"),
    ({"model_type": "qwen2_vl", "hidden_size": 64, "num_attention_heads": 4,
      "rope_scaling": {"type": "mrope", "mrope_section": [4, 2, 4]}},
     r"mrope_section: \[4, 2, 4\] sums to 10, but the rotary has 8 frequencies"),
    ({"model_type": "qwen2_vl", "hidden_size": 64, "num_attention_heads": 4},
     r"mrope_section: \[16, 24, 24\] sums to 64, but the rotary has 8 frequencies"),
    ({"hidden_size": 64, "num_attention_heads": 4,
      "rope_parameters": {"mrope_section": [4, -2, 6]}},
     r"mrope_section: expected non-negative section sizes, got \[4, -2, 6\]"),
    ({"hidden_size": 64, "num_attention_heads": 4,
      "rope_parameters": {"mrope_interleaved": True}},
     r"mrope_interleaved: True needs mrope_section"),
])
def test_mrope_config_errors_name_the_key_and_value(config, match):
    with pytest.raises(ValueError, match=match):
        nn.RotaryEmbedding.from_hf_config(config)


GEMMA3 = dict(head_dim=256, hidden_size=2560, num_attention_heads=8, num_key_value_heads=4,
              max_position_embeddings=131072, num_hidden_layers=6, intermediate_size=64)


def test_gemma_3_per_layer_type():
    """Gemma 3 (4B and up): full attention linear x8 at 1e6, sliding attention default at
    1e4; the transformers 4 keys of its config.json give the same."""
    cls = getattr(transformers, "Gemma3TextConfig", None)
    if cls is None or not NESTED_LAYOUT:
        pytest.skip("per-layer-type rope_parameters need transformers 5's Gemma3TextConfig")
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

    config = cls(rope_parameters={
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}, **GEMMA3)
    theirs = Gemma3RotaryEmbedding(config)
    old_json = {"model_type": "gemma3_text", **GEMMA3, "rope_theta": 1e6,
                "rope_local_base_freq": 1e4, "rope_scaling": {"rope_type": "linear",
                                                              "factor": 8.0}}
    for layer_type, kind, base in [("full_attention", "linear", 1e6),
                                   ("sliding_attention", "default", 1e4)]:
        want = (getattr(theirs, f"{layer_type}_inv_freq").double().numpy(),
                getattr(theirs, f"{layer_type}_attention_scaling"))
        for source in (config, config.to_dict(), old_json):
            ours = nn.RotaryEmbedding.from_hf_config(source, layer_type=layer_type)
            assert (ours.rope_type, ours.base, ours.head_dim) == (kind, base, 256)
            check_frequencies(ours, *want)
    # The multimodal Gemma3Config is read through its text_config.
    top = transformers.Gemma3Config(text_config=config.to_dict())
    np.testing.assert_array_equal(
        nn.RotaryEmbedding.from_hf_config(top, layer_type="full_attention").inv_freq,
        nn.RotaryEmbedding.from_hf_config(config, layer_type="full_attention").inv_freq)


def test_modernbert_per_layer_type():
    cls = getattr(transformers, "ModernBertConfig", None)
    if cls is None:
        pytest.skip("no ModernBertConfig in this transformers")
    config = cls(hidden_size=768, num_attention_heads=12, global_rope_theta=160000.0,
                 local_rope_theta=10000.0)
    old_json = {"model_type": "modernbert", "hidden_size": 768, "num_attention_heads": 12,
                "global_rope_theta": 160000.0, "local_rope_theta": 10000.0}
    for layer_type, base in [("full_attention", 160000.0), ("sliding_attention", 10000.0)]:
        want = 1.0 / base ** (torch.arange(0, 64, 2, dtype=torch.int64).float() / 64)
        for source in (config, config.to_dict(), old_json):
            ours = nn.RotaryEmbedding.from_hf_config(source, layer_type=layer_type)
            assert ours.base == base
            check_frequencies(ours, want.double().numpy(), 1.0)
        if NESTED_LAYOUT:
            from transformers.models.modernbert.modeling_modernbert import (
                ModernBertRotaryEmbedding,
            )
            theirs = ModernBertRotaryEmbedding(config)
            check_frequencies(ours, getattr(theirs, f"{layer_type}_inv_freq").double().numpy(),
                              getattr(theirs, f"{layer_type}_attention_scaling"))


def test_gemma_4_proportional_full_attention_head():
    """Gemma 4: sliding layers default rope on 256-wide heads, full-attention layers
    proportional rope (a quarter of the frequencies) on global_head_dim-wide heads."""
    cls = getattr(transformers, "Gemma4TextConfig", None)
    if cls is None:
        pytest.skip("no Gemma4TextConfig in this transformers")
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextRotaryEmbedding

    config = cls(num_hidden_layers=6, hidden_size=64, num_attention_heads=2, head_dim=16,
                 global_head_dim=32)
    theirs = Gemma4TextRotaryEmbedding(config)
    for layer_type, kind, head_dim in [("full_attention", "proportional", 32),
                                       ("sliding_attention", "default", 16)]:
        want = (getattr(theirs, f"{layer_type}_inv_freq").double().numpy(),
                getattr(theirs, f"{layer_type}_attention_scaling"))
        for source in (config, config.to_dict()):
            ours = nn.RotaryEmbedding.from_hf_config(source, layer_type=layer_type)
            assert (ours.rope_type, ours.head_dim) == (kind, head_dim)
            check_frequencies(ours, *want)


PHI = [  # (name, hidden, heads, partial): Phi-3-mini-128k, Phi-4-mini (3 / 4 of each head)
    ("phi-3-mini-128k", 3072, 32, None), ("phi-4-mini", 3072, 24, 0.75)]


@pytest.mark.parametrize("name, hidden, heads, partial", PHI, ids=[p[0] for p in PHI])
def test_phi_long_context_longrope(name, hidden, heads, partial):
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    half = int(hidden // heads * (partial or 1.0)) // 2
    # Published factors are per-model lists of this length; these keep their shape (short
    # near 1, long growing to ~50).
    scaling = {"type": "longrope", "short_factor": list(np.linspace(1.0, 1.2, half)),
               "long_factor": list(np.geomspace(1.0, 50.0, half))}
    extra = {} if partial is None else {"partial_rotary_factor": partial}
    config = config_of("Phi3Config", dict(scaling, rope_theta=10000.0), hidden_size=hidden,
                       num_attention_heads=heads, num_key_value_heads=8,
                       max_position_embeddings=131072, original_max_position_embeddings=4096,
                       num_hidden_layers=1, intermediate_size=64, **extra)
    theirs = Phi3RotaryEmbedding(config)
    ours = nn.RotaryEmbedding.from_hf_config(config)
    assert ours.rope_type == "longrope" and len(ours.inv_freq) == half
    for length in (100, 5000, 300):
        theirs(torch.zeros(1), torch.arange(length)[None])
        check_frequencies(ours, theirs.inv_freq.double().numpy(), theirs.attention_scaling,
                          seq_len=length)


def test_deepseek_v3_yarn_mscale_all_dim():
    cls = getattr(transformers, "DeepseekV3Config", None)
    if cls is None:
        pytest.skip("no DeepseekV3Config in this transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding

    rope = {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
            "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096,
            "rope_theta": 10000.0}
    config = config_of("DeepseekV3Config", rope, hidden_size=7168, num_attention_heads=128,
                       qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
                       max_position_embeddings=163840, num_hidden_layers=1)
    theirs = DeepseekV3RotaryEmbedding(config)
    ours = nn.RotaryEmbedding.from_hf_config(config)
    assert (ours.head_dim, ours.rope_type, ours.layout) == (64, "yarn", "interleaved")
    assert ours.attention_scaling == 1.0  # mscale / mscale_all_dim equal: their ratio is 1
    check_frequencies(ours, theirs.inv_freq.double().numpy(), theirs.attention_scaling)
    as_json = {"model_type": "deepseek_v3", "hidden_size": 7168, "num_attention_heads": 128,
               "qk_rope_head_dim": 64, "max_position_embeddings": 163840,
               "rope_theta": 10000.0, "rope_scaling": {k: v for k, v in rope.items()
                                                       if k != "rope_theta"}}
    np.testing.assert_array_equal(nn.RotaryEmbedding.from_hf_config(as_json).inv_freq,
                                  ours.inv_freq)


def test_gpt_oss_yarn():
    cls = getattr(transformers, "GptOssConfig", None)
    if cls is None:
        pytest.skip("no GptOssConfig in this transformers")
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    rope = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": False, "original_max_position_embeddings": 4096, "rope_theta": 150000.0}
    config = config_of("GptOssConfig", rope, hidden_size=2880, num_attention_heads=64,
                       head_dim=64, max_position_embeddings=131072, num_hidden_layers=2)
    theirs = GptOssRotaryEmbedding(config)
    ours = nn.RotaryEmbedding.from_hf_config(config)
    assert ours.attention_scaling > 1 and ours.scaling["truncate"] is False
    check_frequencies(ours, theirs.inv_freq.double().numpy(), theirs.attention_scaling)


# ---------------------------------------------------------------- errors

PER_LAYER = {"hidden_size": 64, "num_attention_heads": 4, "rope_parameters": {
    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}}


@pytest.mark.parametrize("config, layer_type, error, match", [
    ({**PER_LAYER}, None, ValueError,
     r"layer_type: .*differs by layer type \['full_attention', 'sliding_attention'\]"),
    ({**PER_LAYER}, "chunked_attention", ValueError,
     r"layer_type: 'chunked_attention' .*\['full_attention', 'sliding_attention'\]"),
    ({"hidden_size": 64, "num_attention_heads": 4, "rope_local_base_freq": 1e4}, None,
     ValueError, r"layer_type: .*full_attention"),
    ({"hidden_size": 64, "num_attention_heads": 4, "layer_types": ["full_attention"]},
     "sliding", ValueError, r"layer_type: 'sliding'.*\['full_attention'\]"),
    ({"hidden_size": 64, "num_attention_heads": 4,
      "rope_scaling": {"rope_type": "sideways", "factor": 2.0}}, None, ValueError,
     r"unknown rope_type 'sideways'"),
    ({"hidden_size": 64, "num_attention_heads": 4,
      "rope_scaling": {"rope_type": "linear", "factor": 2.0, "llama_4_scaling_beta": 0.1}},
     None, ValueError, r"'linear' does not use the key\(s\) \['llama_4_scaling_beta'\]"),
    ({"hidden_size": 64, "num_attention_heads": 4,
      "rope_scaling": {"rope_type": "default", "factor": 2.0}}, None, ValueError,
     r"'default' does not use the key\(s\) \['factor'\]"),
    ({"hidden_size": 64, "num_attention_heads": 4,
      "rope_scaling": {"type": "linear", "rope_type": "dynamic", "factor": 2.0}}, None,
     ValueError, r"type='linear' and rope_type='dynamic' disagree"),
])
def test_config_errors_name_the_argument_and_value(config, layer_type, error, match):
    with pytest.raises(error, match=match):
        nn.RotaryEmbedding.from_hf_config(config, layer_type=layer_type)


def test_constructor_refuses_keys_it_would_drop():
    with pytest.raises(ValueError, match=r"'yarn' does not use the key\(s\) \['low_freq_factor'\]"):
        nn.RotaryEmbedding(16, scaling={"rope_type": "yarn", "factor": 2.0,
                                        "low_freq_factor": 1.0})
    with pytest.raises(ValueError, match=r"rope_theta=1000000.0 differs from base=10000.0"):
        F.rope_frequencies(16, scaling={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6})
    got, _ = F.rope_frequencies(16, 1e6, scaling={"rope_type": "linear", "factor": 2.0,
                                                  "rope_theta": 1e6})
    np.testing.assert_allclose(got, F.rope_frequencies(16, 1e6)[0] / 2, rtol=1e-15)


def test_a_layer_type_of_a_one_rope_config_is_accepted():
    config = {"hidden_size": 64, "num_attention_heads": 4, "rope_theta": 5e5,
              "layer_types": ["sliding_attention", "full_attention"]}
    for layer_type in (None, "sliding_attention", "full_attention"):
        assert nn.RotaryEmbedding.from_hf_config(config, layer_type=layer_type).base == 5e5
