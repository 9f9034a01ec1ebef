"""Multimodal rotary (Qwen2-VL / Qwen2.5-VL chunked sections, Qwen3-VL interleaved): the
stream map, the rotation and its gradient against a NumPy oracle, text-only positions against
the 1-D rotary's bits, the module, bad input, and transformers' rotary modules.

Kernel-backed cases run on the CPU and on CUDA (Numba's simulator without a GPU, tiny
shapes); transformers' cases skip cleanly when it is not installed.
"""

import numpy as np
import pytest
import reference as ref
import reference as ref_mrope
from conftest import FLOAT_DTYPES, host, on

import numbapos
import numbapos.functional as F
from numbapos import nn
from numbapos.functional.rope import mrope_streams

# (q shape, head_axis, rotated channels, mrope_section, interleaved sections, channel pairs)
CASES = [
    ((2, 3, 5, 16), 1, 16, (2, 3, 3), False, "half"),       # Qwen2-VL's chunks
    ((2, 3, 5, 16), 1, 16, (4, 2, 2), True, "half"),        # Qwen3-VL's interleaving
    ((1, 2, 4, 24), 1, 24, (6, 3, 3), True, "half"),
    ((2, 4, 3, 20), 2, 12, (2, 2, 2), False, "half"),       # (B, L, H, D), partial rotary
    ((2, 4, 3, 12), 2, 12, (2, 0, 4), True, "interleaved"),  # an empty section, GPT-J pairs
    ((2, 5, 12), 1, 12, (3, 2, 1), False, "half"),           # (B, L, D): one head
]


def _seq_len(shape, head_axis):
    return shape[1] if len(shape) == 3 else shape[3 - head_axis]


def _as_bhld(x, head_axis):
    """``x`` as the oracle's ``(B, H, L, D)``."""
    if x.ndim == 3:
        return x[:, None]
    return x if head_axis == 1 else x.transpose(0, 2, 1, 3)


def _from_bhld(y, shape, head_axis):
    if len(shape) == 3:
        return y[:, 0]
    return y if head_axis == 1 else y.transpose(0, 2, 1, 3)


def _streams(rng, batch, seq_len, rows):
    """Three distinct position streams ``(3, rows, L)``: text then an image grid, per row."""
    t = np.arange(seq_len) + 5 * np.arange(rows)[:, None]
    h = t + rng.integers(0, 4, (rows, seq_len))
    w = t + rng.integers(0, 7, (rows, seq_len)) + 1000
    return np.stack([t, h, w]).astype(np.int64)


# ---------------------------------------------------------------- the stream map


@pytest.mark.parametrize("section, interleaved, want", [
    ((2, 3, 3), False, [0, 0, 1, 1, 1, 2, 2, 2]),
    ((4, 2, 2), True, [0, 1, 2, 0, 1, 2, 0, 0]),
    ((3, 2, 1), True, [0, 1, 2, 0, 1, 0]),
    ((0, 0, 4), False, [2, 2, 2, 2]),
])
def test_stream_map(section, interleaved, want):
    np.testing.assert_array_equal(mrope_streams(section, interleaved), want)


@pytest.mark.parametrize("section, interleaved", [((16, 24, 24), False), ((24, 20, 20), True),
                                                  ((11, 11, 10), True), ((8, 12, 12), False)])
def test_stream_map_is_the_oracles_recomposition(section, interleaved):
    marks = np.arange(1, 4).reshape(3, 1, 1)  # stream s at position s + 1
    angles = ref_mrope.mrope_angles(marks, np.ones(sum(section)), section, interleaved)
    np.testing.assert_array_equal(mrope_streams(section, interleaved), angles[0, 0] - 1)


# ---------------------------------------------------------------- the rotation


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("shape, head_axis, rotated, section, interleaved, pairs", CASES)
def test_matches_reference(device, shape, head_axis, rotated, section, interleaved, pairs,
                           per_row, dtype, rng):
    x = rng.standard_normal(shape).astype(dtype)
    seq_len = _seq_len(shape, head_axis)
    ids = _streams(rng, shape[0], seq_len, shape[0] if per_row else 1)
    inv_freq = ref.rope_inv_freq(rotated, 50.0)
    opts = dict(attention_scaling=1.25, layout=pairs, head_axis=head_axis,
                partial_rotary_factor=rotated / shape[-1], mrope_section=section,
                mrope_interleaved=interleaved)
    got = F.apply_rotary(on(device, x), on(device, ids), inv_freq, **opts)
    want = ref_mrope.mrope_rotary(_as_bhld(x, head_axis), ids, inv_freq, section, interleaved,
                                  1.25, pairs=pairs)
    rtol, atol = (2e-6, 2e-6) if dtype == np.float32 else (1e-13, 1e-13)
    np.testing.assert_allclose(host(got), _from_bhld(want, shape, head_axis), rtol=rtol,
                               atol=atol)
    back = F.apply_rotary_backward(got, on(device, ids), inv_freq, **opts)
    want_back = ref_mrope.mrope_rotary(want, ids, inv_freq, section, interleaved, 1.25, -1.0,
                                       pairs=pairs)
    np.testing.assert_allclose(host(back), _from_bhld(want_back, shape, head_axis),
                               rtol=4 * rtol, atol=4 * atol)
    if device == "cuda":  # the CPU's bits, table included
        np.testing.assert_array_equal(host(got), F.apply_rotary(x, ids, inv_freq, **opts))
        np.testing.assert_array_equal(host(back), F.apply_rotary_backward(host(got), ids,
                                                                          inv_freq, **opts))


@pytest.mark.parametrize("shape, head_axis, rotated, section, interleaved, pairs", CASES)
def test_text_only_streams_give_the_1d_bits(device, shape, head_axis, rotated, section,
                                            interleaved, pairs, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    seq_len = _seq_len(shape, head_axis)
    ids = np.stack([np.arange(seq_len) + 7 * b + 3000 for b in range(shape[0])])
    streams = np.broadcast_to(ids, (3,) + ids.shape)
    inv_freq = ref.rope_inv_freq(rotated, 1e6)
    opts = dict(layout=pairs, head_axis=head_axis, partial_rotary_factor=rotated / shape[-1])
    mrope = dict(opts, mrope_section=section, mrope_interleaved=interleaved)
    for op in (F.apply_rotary, F.apply_rotary_backward):
        for angle in (False, True):
            want = host(op(on(device, x), on(device, ids), inv_freq, float32_angle=angle,
                           **opts))
            got = op(on(device, x), on(device, streams), inv_freq, float32_angle=angle, **mrope)
            np.testing.assert_array_equal(host(got), want)
        # An int offset: the three streams equal by construction.
        np.testing.assert_array_equal(host(op(on(device, x), 9, inv_freq, **mrope)),
                                      host(op(on(device, x), 9, inv_freq, **opts)))
    k = x[:, :1].copy() if len(shape) == 4 and head_axis == 1 else x.copy()
    want_q, want_k = F.rotary_qk(on(device, x), on(device, k), ids, inv_freq, **opts)
    got_q, got_k = F.rotary_qk(on(device, x), on(device, k), streams[:, :1], inv_freq, **mrope) \
        if shape[0] == 1 else F.rotary_qk(on(device, x), on(device, k), streams, inv_freq,
                                          **mrope)
    np.testing.assert_array_equal(host(got_q), host(want_q))
    np.testing.assert_array_equal(host(got_k), host(want_k))


def test_in_place_and_out(device, rng):
    x = rng.standard_normal((2, 3, 4, 16)).astype(np.float32)
    ids = _streams(rng, 2, 4, 2)
    inv_freq = ref.rope_inv_freq(16)
    opts = dict(mrope_section=(4, 2, 2), mrope_interleaved=True)
    want = host(F.apply_rotary(on(device, x), on(device, ids), inv_freq, **opts))
    xd = on(device, x.copy())
    assert F.apply_rotary(xd, on(device, ids), inv_freq, out=xd, **opts) is xd
    np.testing.assert_array_equal(host(xd), want)
    buf = on(device, np.zeros_like(x))
    assert F.apply_rotary(on(device, x), on(device, ids), inv_freq, out=buf, **opts) is buf
    np.testing.assert_array_equal(host(buf), want)
    q, k = on(device, x.copy()), on(device, x[:, :1].copy())
    got_q, got_k = F.rotary_qk(q, k, on(device, ids), inv_freq, out_q=q, out_k=k, **opts)
    assert got_q is q and got_k is k
    np.testing.assert_array_equal(host(q), want)
    np.testing.assert_array_equal(host(k), want[:, :1])


def test_streamed_output_has_the_same_bits(monkeypatch, rng):
    from numbapos.kernels.cpu import rotary as cpu_rotary

    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
    ids = _streams(rng, 2, 16, 2)
    inv_freq = ref.rope_inv_freq(16)
    opts = dict(mrope_section=(2, 3, 3))
    y = x.copy()
    in_place = F.apply_rotary(y, ids, inv_freq, out=y, **opts)
    monkeypatch.setattr(cpu_rotary, "MIN_STREAM_TILE", 2)
    with numbapos.config.override(stream_min_bytes=0):  # non-temporal stores, tiles
        np.testing.assert_array_equal(F.apply_rotary(x, ids, inv_freq, **opts), in_place)


def test_gradient_is_the_adjoint_and_matches_finite_differences(device, rng):
    shape = (1, 2, 3, 8)
    x = rng.standard_normal(shape)
    g = rng.standard_normal(shape)
    ids = np.array([[[4, 0, 9]], [[1, 2, 2]], [[7, 3, 0]]])
    inv_freq = ref.rope_inv_freq(8)
    opts = dict(attention_scaling=0.7, mrope_section=(2, 1, 1), mrope_interleaved=True)
    y = host(F.apply_rotary(on(device, x), on(device, ids), inv_freq, **opts))
    gx = host(F.apply_rotary_backward(on(device, g), on(device, ids), inv_freq, **opts))
    assert np.sum(y * g) == pytest.approx(np.sum(x * gx), rel=1e-12)
    eps = 1e-6
    numeric = np.zeros(shape)
    for i in np.ndindex(shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += eps
        xm[i] -= eps
        fp = np.sum(F.apply_rotary(xp, ids, inv_freq, **opts) * g)
        fm = np.sum(F.apply_rotary(xm, ids, inv_freq, **opts) * g)
        numeric[i] = (fp - fm) / (2 * eps)
    np.testing.assert_allclose(gx, numeric, rtol=1e-7, atol=1e-8)


def test_float32_is_within_1e6_of_the_exact_rotation():
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (2, 1, 32, 128)).astype(np.float32)
    ids = rng.integers(0, 1 << 20, (3, 2, 32))
    inv_freq = ref.rope_inv_freq(128, 1e6)
    for section, interleaved in (((16, 24, 24), False), ((24, 20, 20), True)):
        got = F.apply_rotary(x, ids, inv_freq, mrope_section=section,
                             mrope_interleaved=interleaved)
        want = ref_mrope.mrope_rotary(x, ids, inv_freq, section, interleaved)
        assert np.abs(got - want).max() < 1e-6


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_16_bit_is_the_float32_rotation_rounded_once(device, half, rng):
    from conftest import dev

    dtype = numbapos._checks.check_table_dtype(half)
    x = (4 * rng.standard_normal((2, 3, 4, 16))).astype(dtype)
    ids = _streams(rng, 2, 4, 2)
    inv_freq = ref.rope_inv_freq(16)
    opts = dict(mrope_section=(4, 2, 2), mrope_interleaved=True)
    for op in (F.apply_rotary, F.apply_rotary_backward):
        # bfloat16 on CUDA as a Numba device array (as a PyTorch CUDA tensor is adopted).
        got = op(x if device == "cpu" else dev(x), on(device, ids), inv_freq, **opts)
        want = op(x.astype(np.float32), ids, inv_freq, **opts).astype(dtype)
        assert got.dtype == dtype
        np.testing.assert_array_equal(host(got).view(np.uint16), want.view(np.uint16))


# ---------------------------------------------------------------- the module


def test_module_forward_backward(device, rng):
    q = rng.standard_normal((2, 4, 5, 16)).astype(np.float32)
    k = rng.standard_normal((2, 2, 5, 16)).astype(np.float32)
    ids = _streams(rng, 2, 5, 2)
    rope = nn.RotaryEmbedding(16, 1e4, mrope_section=[4, 2, 2], mrope_interleaved=True,
                              device=device)
    assert rope.mrope_section == (4, 2, 2) and rope.mrope_interleaved
    assert "mrope_section=[4, 2, 2], mrope_interleaved=True" in repr(rope)
    q_rot, k_rot = rope(on(device, q), on(device, k), position_ids=on(device, ids))
    inv_freq = ref.rope_inv_freq(16, 1e4)
    opts = dict(mrope_section=(4, 2, 2), mrope_interleaved=True)
    np.testing.assert_array_equal(host(q_rot), F.apply_rotary(q, ids, inv_freq, **opts))
    np.testing.assert_array_equal(host(k_rot), F.apply_rotary(k, ids, inv_freq, **opts))
    gq, gk = rope.backward(q_rot, k_rot)
    np.testing.assert_allclose(host(gq), q, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(host(gk), k, rtol=1e-5, atol=1e-6)
    # The sections may come in the scaling dict, as a config's rope_parameters hold them.
    same = nn.RotaryEmbedding(16, 1e4, scaling={"rope_type": "default",
                                                "mrope_section": [4, 2, 2],
                                                "mrope_interleaved": True})
    np.testing.assert_array_equal(same(q, position_ids=ids), host(q_rot))
    # Text only: an offset is the three streams equal, the 1-D module's bits.
    plain = nn.RotaryEmbedding(16, 1e4)
    np.testing.assert_array_equal(host(rope(on(device, q), offset=11)), plain(q, offset=11))


def test_module_dynamic_ntk_reads_the_largest_position_of_every_stream(rng):
    q = rng.standard_normal((1, 2, 4, 16)).astype(np.float32)
    ids = np.stack([np.arange(4), np.arange(4), np.arange(4) + 60])[:, None]
    scaling = {"rope_type": "dynamic", "factor": 2.0}
    rope = nn.RotaryEmbedding(16, scaling=scaling, max_position_embeddings=32,
                              mrope_section=(4, 2, 2), stateless=True)
    got = rope(q, position_ids=ids)
    inv_freq, _ = F.rope_frequencies(16, scaling=scaling, max_position_embeddings=32,
                                     seq_len=64)
    np.testing.assert_array_equal(got, F.apply_rotary(q, ids, inv_freq,
                                                      mrope_section=(4, 2, 2)))


# ---------------------------------------------------------------- bad input


_X = np.arange(2 * 2 * 3 * 8, dtype=np.float32).reshape(2, 2, 3, 8)
_IDS = np.zeros((3, 2, 3), np.int64)


@pytest.mark.parametrize("kwargs, ids, error, match", [
    (dict(mrope_section=(2, 1, 1)), _IDS[0], ValueError,
     r"position_ids: mrope_section=\[2, 1, 1\] rotates by 3 position streams .*expected "
     r"shape \(3, 1, 3\) or \(3, 2, 3\), got \(2, 3\) \(text-only positions"),
    (dict(mrope_section=(2, 1, 1)), _IDS[:2], ValueError,
     r"position_ids: .*got \(2, 2, 3\)"),
    (dict(mrope_section=(2, 1, 1)), np.zeros((3, 2, 4), np.int64), ValueError,
     r"position_ids: .*got \(3, 2, 4\)"),
    (dict(mrope_section=(2, 1, 1)), _IDS[0, 0], ValueError, r"position_ids: .*got \(3,\)"),
    (dict(), _IDS, ValueError, r"position_ids: expected shape .*got \(3, 2, 3\) \(3 position "
                               r"streams .*pass mrope_section="),
    (dict(mrope_section=(2, 1, 2)), _IDS, ValueError,
     r"mrope_section: \[2, 1, 2\] sums to 5, but the rotary has 4 frequencies"),
    (dict(mrope_section=(3, -1, 2)), _IDS, ValueError,
     r"mrope_section: expected non-negative section sizes, got \[3, -1, 2\]"),
    (dict(mrope_section=(2, 2)), _IDS, ValueError,
     r"mrope_section: expected 3 integers .*got \(2, 2\)"),
    (dict(mrope_section=(2.0, 1, 1)), _IDS, TypeError, r"mrope_section\[0\]: expected an int"),
    (dict(mrope_section=4), _IDS, TypeError, r"mrope_section: expected 3 integers"),
    (dict(mrope_interleaved=True), _IDS[0], ValueError,
     r"mrope_interleaved: True needs mrope_section"),
    (dict(mrope_section=(2, 1, 1), mrope_interleaved=1), _IDS, TypeError,
     r"mrope_interleaved: expected a bool, got 1"),
])
def test_bad_input_raises_and_changes_nothing(device, kwargs, ids, error, match):
    x = on(device, _X.copy())
    k = on(device, _X[:, :1].copy())
    inv_freq = ref.rope_inv_freq(8)
    for call in (lambda: F.apply_rotary(x, on(device, ids), inv_freq, out=x, **kwargs),
                 lambda: F.apply_rotary_backward(x, on(device, ids), inv_freq, out=x, **kwargs),
                 lambda: F.rotary_qk(x, k, on(device, ids), inv_freq, out_q=x, out_k=k,
                                     **kwargs)):
        with pytest.raises(error, match=match):
            call()
        np.testing.assert_array_equal(host(x), _X)
        np.testing.assert_array_equal(host(k), _X[:, :1])


def test_module_refuses_positions_of_the_wrong_shape_and_keeps_its_state(rng):
    q = rng.standard_normal((2, 2, 3, 8)).astype(np.float32)
    rope = nn.RotaryEmbedding(8, mrope_section=(2, 1, 1))
    with pytest.raises(ValueError, match=r"position_ids: mrope_section=\[2, 1, 1\].*got \(2, 3\)"):
        rope(q, q, position_ids=np.zeros((2, 3), np.int64))
    assert rope.pending_backwards() == 0
    with pytest.raises(ValueError, match=r"mrope_section: \[2, 2, 2\] sums to 6, but the "
                                         r"rotary has 4 frequencies"):
        nn.RotaryEmbedding(8, mrope_section=(2, 2, 2))
    with pytest.raises(ValueError, match=r"mrope_section: \[2, 1, 1\] differs from scaling's "
                                         r"mrope_section=\[1, 2, 1\]"):
        nn.RotaryEmbedding(8, mrope_section=[2, 1, 1], scaling={"mrope_section": [1, 2, 1]})
    with pytest.raises(ValueError, match=r"mrope_interleaved: True needs mrope_section"):
        nn.RotaryEmbedding(8, mrope_interleaved=True)


# ---------------------------------------------------------------- transformers


def _qwen_vl(family, rope, head_dim=16):
    """transformers' text rotary module of ``family`` from its config class, tiny sizes."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    if family == "qwen2_vl":
        from transformers.models.qwen2_vl import modeling_qwen2_vl as m
        cls, module = getattr(transformers, "Qwen2VLConfig", None), "Qwen2VLRotaryEmbedding"
    elif family == "qwen2_5_vl":
        from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as m
        cls, module = getattr(transformers, "Qwen2_5_VLConfig", None), \
            "Qwen2_5_VLRotaryEmbedding"
    else:
        from transformers.models.qwen3_vl import modeling_qwen3_vl as m
        cls, module = getattr(transformers, "Qwen3VLConfig", None), "Qwen3VLTextRotaryEmbedding"
    if cls is None or not hasattr(m, module):
        pytest.skip(f"transformers {transformers.__version__} has no {family} rotary module")
    config = cls(text_config=dict(hidden_size=4 * head_dim, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=head_dim,
                                  rope_parameters=dict(rope)))
    return config, getattr(m, module)(config.text_config), m


FAMILIES = [
    ("qwen2_vl", {"type": "mrope", "mrope_section": [2, 3, 3], "rope_theta": 1e6}),
    ("qwen2_5_vl", {"rope_type": "default", "mrope_section": [4, 2, 2], "rope_theta": 1e6}),
    ("qwen3_vl", {"rope_type": "default", "mrope_section": [4, 2, 2], "mrope_interleaved": True,
                  "rope_theta": 5e6}),
]


@pytest.mark.parametrize("text_only", [False, True])
@pytest.mark.parametrize("family, rope", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_matches_transformers(family, rope, text_only, rng):
    import torch

    config, theirs, m = _qwen_vl(family, rope)
    ours = nn.RotaryEmbedding.from_hf_config(config, float32_angle=True)
    # transformers' float32 angle, from its own float32 frequencies.
    ours.inv_freq = theirs.inv_freq.double().numpy()
    q = rng.standard_normal((2, 4, 6, 16)).astype(np.float32)
    k = rng.standard_normal((2, 2, 6, 16)).astype(np.float32)
    ids = rng.integers(0, 4096, (3, 2, 6))
    if text_only:
        ids = np.broadcast_to(ids[:1], ids.shape)
    q_t = torch.from_numpy(q).requires_grad_()
    k_t = torch.from_numpy(k).requires_grad_()
    cos, sin = theirs(q_t, torch.from_numpy(np.ascontiguousarray(ids)))
    q_rot, k_rot = m.apply_rotary_pos_emb(q_t, k_t, cos, sin)
    got_q, got_k = ours(q, k, position_ids=ids)
    np.testing.assert_allclose(got_q, q_rot.detach().numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(got_k, k_rot.detach().numpy(), rtol=0, atol=1e-6)
    gq = rng.standard_normal(q.shape).astype(np.float32)
    gk = rng.standard_normal(k.shape).astype(np.float32)
    ((q_rot * torch.from_numpy(gq)).sum() + (k_rot * torch.from_numpy(gk)).sum()).backward()
    grad_q, grad_k = ours.backward(gq, gk)
    np.testing.assert_allclose(grad_q, q_t.grad.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(grad_k, k_t.grad.numpy(), rtol=0, atol=1e-6)
    # The default float64 angle: the exact rotation of transformers' float32 frequencies.
    exact = nn.RotaryEmbedding.from_hf_config(config)
    exact.inv_freq = ours.inv_freq
    want = ref_mrope.mrope_rotary(q, ids, ours.inv_freq, ours.mrope_section,
                                  ours.mrope_interleaved)
    assert np.abs(exact(q, position_ids=ids) - want).max() < 1e-6
