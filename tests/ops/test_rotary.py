"""Rotary embeddings: frequencies, the rotation and its gradient, the module, transformers parity.

Kernel-backed cases run on the CPU and on CUDA (Numba's simulator without a
GPU, tiny shapes); transformers' cases skip cleanly when it is not installed.
"""

import numpy as np
import pytest
import reference as ref
from conftest import FLOAT_DTYPES, host, on

import numbapos
import numbapos.functional as F
from numbapos import nn
from numbapos.kernels.cpu import rotary as cpu_rotary

# (shape, head_axis, half, layout)
CASES = [
    ((2, 3, 5, 8), 1, 4, "half"),
    ((2, 3, 5, 8), 1, 4, "interleaved"),
    ((1, 2, 4, 10), 1, 2, "half"),          # partial rotary: 4 of 10 channels
    ((2, 4, 3, 12), 2, 3, "interleaved"),   # (B, L, H, D), partial
    ((2, 5, 6), 1, 3, "half"),              # (B, L, D): one head
]


def _positions(kind, batch, seq_len):
    if kind == "offset":
        return 7, np.arange(7, 7 + seq_len)[None]
    if kind == "shared":
        ids = np.array([3, 1, 4, 1, 5, 9][:seq_len] + [2] * max(0, seq_len - 6))
        return ids, ids[None]
    ids = np.stack([np.arange(seq_len) + 11 * b - 2 for b in range(batch)])  # per row, < 0 too
    return ids, ids


def _seq_len(shape, head_axis):
    return shape[1] if len(shape) == 3 else shape[3 - head_axis]


def _as_ref4(x, head_axis):
    return x[:, None] if x.ndim == 3 else x


# ---------------------------------------------------------------- frequencies


def test_default_frequencies():
    inv_freq, scale = F.rope_frequencies(8, 100.0)
    np.testing.assert_allclose(inv_freq, 100.0 ** (-np.arange(0, 8, 2) / 8), rtol=1e-15)
    assert scale == 1.0 and inv_freq.dtype == np.float64


def test_partial_rotary_factor():
    inv_freq, _ = F.rope_frequencies(64, partial_rotary_factor=0.25)
    np.testing.assert_allclose(inv_freq, ref.rope_inv_freq(16), rtol=1e-15)


@pytest.mark.parametrize("kwargs, match", [
    (dict(head_dim=0), "head_dim"),
    (dict(head_dim=8, base=-1.0), "base"),
    (dict(head_dim=8, partial_rotary_factor=0.0), "partial_rotary_factor"),
    (dict(head_dim=10, partial_rotary_factor=0.3), "even"),
    (dict(head_dim=8, scaling={"rope_type": "sideways"}), "unknown rope_type"),
    (dict(head_dim=8, scaling={"rope_type": "linear"}), "'factor'"),
    (dict(head_dim=8, scaling={"rope_type": "dynamic", "factor": 2.0}), "max_position"),
    (dict(head_dim=8, scaling={"rope_type": "longrope", "short_factor": [1, 1],
                               "long_factor": [1] * 4, "factor": 2.0},
          max_position_embeddings=16), "short_factor"),
])
def test_frequency_errors_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        F.rope_frequencies(**kwargs)
    with pytest.raises(TypeError, match="scaling"):
        F.rope_frequencies(8, scaling=[("rope_type", "linear")])


HF_SCALINGS = [
    {"rope_type": "default"},
    {"rope_type": "linear", "factor": 4.0},
    {"type": "linear", "factor": 2.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    {"rope_type": "yarn", "factor": 8.0, "beta_fast": 16, "beta_slow": 2, "mscale": 0.707,
     "mscale_all_dim": 1.0, "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.5, "truncate": False,
     "original_max_position_embeddings": 32},
    {"rope_type": "longrope", "short_factor": [1.0, 1.1, 1.3, 1.7, 2.0, 2.5, 3.0, 4.0],
     "long_factor": [1.0, 1.5, 2.0, 3.0, 5.0, 8.0, 13.0, 21.0],
     "original_max_position_embeddings": 32},
    {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8,
     "factor": 3.0, "attention_factor": 1.2, "original_max_position_embeddings": 32},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
]


def _hf_config(scaling, theta=500.0, partial=None):
    transformers = pytest.importorskip("transformers")
    params = dict(scaling, rope_theta=theta)
    if partial is not None:
        params["partial_rotary_factor"] = partial
    return transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                    max_position_embeddings=128, rope_parameters=params)


@pytest.mark.parametrize("seq_len", [None, 20, 300])
@pytest.mark.parametrize("scaling", HF_SCALINGS, ids=lambda s: s.get("rope_type", s.get("type")))
def test_frequencies_match_transformers(scaling, seq_len):
    pytest.importorskip("torch")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = _hf_config(dict(scaling))
    kind = config.rope_parameters["rope_type"]
    if kind == "default":
        want, want_scale = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        want, want_scale = ROPE_INIT_FUNCTIONS[kind](config, None, seq_len=seq_len)
    got, scale = F.rope_frequencies(16, 500.0, scaling=scaling, max_position_embeddings=128,
                                    seq_len=seq_len)
    np.testing.assert_allclose(got, want.double().numpy(), rtol=2e-6)  # theirs: float32
    assert scale == pytest.approx(float(want_scale), rel=1e-12)


# ---------------------------------------------------------------- the rotation


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("kind", ["offset", "shared", "per_row"])
@pytest.mark.parametrize("shape, head_axis, half, layout", CASES)
def test_apply_matches_reference(device, shape, head_axis, half, layout, kind, dtype, rng):
    x = rng.standard_normal(shape).astype(dtype)
    seq_len = _seq_len(shape, head_axis)
    ids, ref_ids = _positions(kind, shape[0], seq_len)
    inv_freq = ref.rope_inv_freq(2 * half, 50.0)
    partial = dict(partial_rotary_factor=2 * half / shape[-1])
    got = F.apply_rotary(on(device, x), on(device, ids) if kind == "per_row" else ids,
                         inv_freq, attention_scaling=1.25, layout=layout, head_axis=head_axis,
                         **partial)
    want = ref.rotary(_as_ref4(x, head_axis), ref_ids, inv_freq, 1.25,
                      layout == "interleaved", head_axis if x.ndim == 4 else 1)
    rtol, atol = (2e-6, 2e-6) if dtype == np.float32 else (1e-13, 1e-13)
    np.testing.assert_allclose(host(got), want.reshape(shape), rtol=rtol, atol=atol)
    back = F.apply_rotary_backward(got, ids, inv_freq, attention_scaling=1.25, layout=layout,
                                   head_axis=head_axis, **partial)
    if device == "cuda":  # the CPU's bits, table included (one sincos for both devices)
        cpu = F.apply_rotary(x, ids, inv_freq, attention_scaling=1.25, layout=layout,
                             head_axis=head_axis, **partial)
        np.testing.assert_array_equal(host(got), cpu)
    twice = x.copy()
    twice[..., :2 * half] *= 1.25 ** 2  # the passed-through channels are not scaled
    np.testing.assert_allclose(host(back), twice, rtol=rtol * 4, atol=atol * 4)


def test_in_place_and_out(device, rng):
    x = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)
    inv_freq = ref.rope_inv_freq(8)
    want = host(F.apply_rotary(on(device, x), 5, inv_freq))
    xd = on(device, x.copy())
    assert F.apply_rotary(xd, 5, inv_freq, out=xd) is xd
    np.testing.assert_array_equal(host(xd), want)
    buf = on(device, np.zeros_like(x))
    assert F.apply_rotary(on(device, x), 5, inv_freq, out=buf) is buf
    np.testing.assert_array_equal(host(buf), want)


@pytest.mark.parametrize("shape, head_axis, layout", [
    ((2, 3, 16, 10), 1, "half"), ((1, 2, 40, 8), 1, "interleaved"),
    ((2, 9, 3, 12), 2, "half"), ((2, 64, 4, 16), 1, "half"), ((1, 2, 37, 8), 1, "half"),
])
def test_streamed_output_has_the_same_bits(monkeypatch, shape, head_axis, layout, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    rotated = 8 if shape[3] >= 10 else 6
    inv_freq = ref.rope_inv_freq(rotated)
    ids = rng.integers(0, 5000, (shape[0], shape[3 - head_axis]))
    kwargs = dict(layout=layout, head_axis=head_axis, partial_rotary_factor=rotated / shape[3])
    in_place = F.apply_rotary(x.copy(), ids, inv_freq, out=None, **kwargs)
    monkeypatch.setattr(cpu_rotary, "MIN_STREAM_TILE", 2)
    with numbapos.config.override(stream_min_bytes=0):  # non-temporal stores, tiles
        streamed = F.apply_rotary(x, ids, inv_freq, **kwargs)
    np.testing.assert_array_equal(streamed, in_place)
    y = x.copy()
    np.testing.assert_array_equal(F.apply_rotary(y, ids, inv_freq, out=y, **kwargs), in_place)


def test_cuda_rotation_is_the_cpu_rotation_for_the_same_table(rng):
    pytest.importorskip("numba.cuda")
    import numbapos
    from numbapos.kernels.cuda import rotary as gpu_rotary

    if not numbapos.cuda_available():
        pytest.skip("CUDA is not available")
    x = rng.standard_normal((2, 3, 4, 10)).astype(np.float32)
    cos = rng.standard_normal((2, 4, 4)).astype(np.float32)
    sin = rng.standard_normal((2, 4, 4)).astype(np.float32)
    for interleaved in (False, True):
        want = np.empty_like(x)
        cpu_rotary.rotary_apply(x, cos, sin, interleaved, 1, want)
        out = on("cuda", np.full_like(x, np.nan))
        gpu_rotary.rotary_apply(on("cuda", x), on("cuda", cos), on("cuda", sin), interleaved, 1,
                                out)
        np.testing.assert_array_equal(host(out).view(np.uint32), want.view(np.uint32))


def test_gradient_is_the_adjoint_and_matches_finite_differences(device, rng):
    shape = (1, 2, 3, 6)
    x = rng.standard_normal(shape)
    g = rng.standard_normal(shape)
    ids = np.array([[4, 0, 9]])
    inv_freq = ref.rope_inv_freq(4)
    opts = dict(attention_scaling=0.7, partial_rotary_factor=4 / 6)
    y = host(F.apply_rotary(on(device, x), ids, inv_freq, **opts))
    gx = host(F.apply_rotary_backward(on(device, g), ids, inv_freq, **opts))
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


def test_float32_is_within_1e6_of_the_exact_rotation_up_to_2_pow_20():
    rng = np.random.default_rng(5)
    x = rng.uniform(-1, 1, (1, 1, 64, 128)).astype(np.float32)
    ids = np.concatenate([np.arange(32) + (1 << 20) - 32, rng.integers(0, 1 << 20, 32)])
    inv_freq = ref.rope_inv_freq(128)
    got = F.apply_rotary(x, ids, inv_freq)
    want = ref.rotary(x, ids[None], inv_freq)
    assert np.abs(got - want).max() < 1e-6


def test_sincos_is_within_one_ulp_of_libm():
    from numbapos.kernels.sincos import sincos

    rng = np.random.default_rng(3)
    for bound in (1.0, 100.0, 2.0 ** 20, 1.6e6):
        xs = np.concatenate([rng.uniform(-bound, bound, 2000), [0.0, -0.0, np.pi / 4]])
        got = np.array([sincos(x) for x in xs])  # the Python path: the simulator's
        for value, want in ((got[:, 0], np.sin(xs)), (got[:, 1], np.cos(xs))):
            assert np.all(np.abs(value - want) <= np.spacing(np.abs(want)))


def test_float32_angle_follows_transformers_rounding():
    x = np.ones((1, 1, 1, 128), np.float32)
    inv_freq = ref.rope_inv_freq(128)
    pos = 32767
    exact = F.apply_rotary(x, [pos], inv_freq)
    rounded = F.apply_rotary(x, [pos], inv_freq, float32_angle=True)
    angle32 = np.float32(pos) * inv_freq.astype(np.float32)
    c, s = np.cos(angle32.astype(np.float64)), np.sin(angle32.astype(np.float64))
    np.testing.assert_allclose(rounded[0, 0, 0, :64], c - s, atol=3e-7)
    assert np.abs(exact - rounded).max() > 5e-4  # the float32 angle is off at 32k


@pytest.mark.parametrize("call, error, match", [
    (lambda x, f: F.apply_rotary(x, 0, f, layout="rotated"), ValueError, "layout"),
    (lambda x, f: F.apply_rotary(x, 0, f, head_axis=3), ValueError, "head_axis"),
    (lambda x, f: F.apply_rotary(x, 0, np.ones(5)), ValueError, "inv_freq"),
    (lambda x, f: F.apply_rotary(x, np.zeros(4, np.int64), f), ValueError, "position_ids"),
    (lambda x, f: F.apply_rotary(x, np.zeros(3), f), TypeError, "position_ids"),
    (lambda x, f: F.apply_rotary(x.astype(np.int32), 0, f), TypeError, "x"),
    (lambda x, f: F.apply_rotary(x[0], 0, f, attention_scaling=np.inf), ValueError,
     "attention_scaling"),
    (lambda x, f: F.apply_rotary(x, 0, f, out=x[:, :, :, ::-1]), ValueError, "out"),
    (lambda x, f: F.apply_rotary(x, 0, f, out=np.empty((2, 2, 3, 8), np.float64)), ValueError,
     "out"),
    (lambda x, f: F.rotary_qk(x, x[:, :, :2], 0, f), ValueError, "k"),
])
def test_bad_input_raises_and_changes_nothing(call, error, match):
    x = np.arange(2 * 2 * 3 * 8, dtype=np.float32).reshape(2, 2, 3, 8)
    before = x.copy()
    with pytest.raises(error, match=match):
        call(x, ref.rope_inv_freq(8))
    np.testing.assert_array_equal(x, before)


def test_strided_cpu_input_is_copied(rng):
    x = rng.standard_normal((2, 5, 3, 8)).astype(np.float32)
    inv_freq = ref.rope_inv_freq(8)
    got = F.apply_rotary(x.transpose(0, 2, 1, 3), 0, inv_freq)
    want = F.apply_rotary(np.ascontiguousarray(x.transpose(0, 2, 1, 3)), 0, inv_freq)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(F.apply_rotary(x, 0, inv_freq, head_axis=2),
                                  want.transpose(0, 2, 1, 3))


# ---------------------------------------------------------------- widths: partial is configured


def test_a_width_other_than_the_frequencies_raises_and_names_the_factor(rng):
    x = rng.standard_normal((1, 2, 3, 128)).astype(np.float32)
    before = x.copy()
    inv_freq, _ = F.rope_frequencies(64)
    with pytest.raises(ValueError, match=r"inv_freq: 32 frequencies rotate 64 channels, but x "
                                         r"has last dimension 128; expected 64 frequencies\. "
                                         r".*partial_rotary_factor=0\.5 to rotate the first 64"):
        F.apply_rotary(x, 0, inv_freq)
    with pytest.raises(ValueError, match=r"q has last dimension 32; expected 16 frequencies$"):
        F.rotary_qk(x[..., :32], x[..., :32], 0, inv_freq)
    with pytest.raises(ValueError, match=r"of which partial_rotary_factor=0\.25 rotates "
                                         r"int\(128 \* 0\.25\) = 32; expected 16"):
        F.apply_rotary(x, 0, inv_freq, partial_rotary_factor=0.25)
    with pytest.raises(ValueError, match="grad has last dimension 128"):
        F.apply_rotary_backward(x, 0, inv_freq)
    with pytest.raises(ValueError, match=r"partial_rotary_factor: expected a number in \(0, 1\]"):
        F.apply_rotary(x, 0, inv_freq, partial_rotary_factor=1.5)
    with pytest.raises(ValueError, match="needs an even number >= 2"):
        F.apply_rotary(x[..., :7], 0, inv_freq[:3])
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("rotated, dim", [(64, 128), (4, 6), (30, 44), (2, 49)])
def test_partial_rotary_rotates_the_first_channels_and_passes_the_rest(device, rotated, dim,
                                                                         rng):
    x = rng.standard_normal((1, 2, 3, dim)).astype(np.float32)
    inv_freq, _ = F.rope_frequencies(rotated)
    with pytest.raises(ValueError) as raised:
        F.apply_rotary(x, 0, inv_freq)
    factor = float(str(raised.value).split("partial_rotary_factor=")[1].split(" ")[0])
    assert int(dim * factor) == rotated  # the factor the message suggests is the one
    got = host(F.apply_rotary(on(device, x), 4, inv_freq, partial_rotary_factor=factor))
    want = ref.rotary(x, np.arange(4, 7)[None], inv_freq)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(got[..., rotated:], x[..., rotated:])
    rope = nn.RotaryEmbedding(dim, partial_rotary_factor=factor, device=device)
    np.testing.assert_array_equal(host(rope(on(device, x), offset=4)), got)
    assert len(nn.RotaryEmbedding.from_hf_config(
        {"model_type": "gptj", "n_embd": 2 * dim, "n_head": 2, "rotary_dim": rotated}
    ).inv_freq) == rotated // 2


def test_module_refuses_a_head_of_another_width(rng):
    rope = nn.RotaryEmbedding(64, scaling={"rope_type": "dynamic", "factor": 2.0},
                              max_position_embeddings=16)
    wide = rng.standard_normal((1, 2, 40, 128)).astype(np.float32)
    with pytest.raises(ValueError, match=r"q: last dimension 128 differs from head_dim=64 .*"
                                         r"RotaryEmbedding\(128, partial_rotary_factor=0\.5\)"):
        rope(wide, wide)
    with pytest.raises(ValueError, match=r"q: last dimension 32 differs from head_dim=64 .*"
                                         r"build RotaryEmbedding\(32\)$"):
        rope(wide[..., :32])
    with pytest.raises(ValueError, match="k: shape"):
        rope(wide[..., :64], wide)
    assert rope.max_seq_len_cached == 16 and rope.pending_backwards() == 0
    partial = nn.RotaryEmbedding(128, partial_rotary_factor=0.25)
    with pytest.raises(ValueError, match=r"q: last dimension 64 differs from head_dim=128 .*"
                                         r"RotaryEmbedding\(64, partial_rotary_factor=0\.5\)"):
        partial(wide[..., :64])


# ---------------------------------------------------------------- 16-bit activations

HALF_DTYPES = ["bfloat16", "float16"]


def _half(name):
    return numbapos._checks.check_table_dtype(name)


def _half_on(device, x):
    """A 16-bit host array on ``device`` (bfloat16 as a Numba device array, as a PyTorch
    CUDA tensor is adopted: numbapos.to_device keeps bfloat16 on the CPU)."""
    if device == "cpu":
        return x
    from conftest import dev

    return dev(x)


def _bits(x):
    return host(x).view(np.uint16)


def _assert_same_bits(got, want_bits, dtype, device):
    """``got``'s bits are ``want_bits``, except that on a GPU a NaN may be the GPU's own:
    its float32 arithmetic returns the canonical NaN, not the input's sign and payload
    (PyTorch CUDA's does the same), so there NaNs are compared as NaNs."""
    got = _bits(got)
    if device == "cuda":
        nan = np.isnan(want_bits.view(dtype).astype(np.float32))
        np.testing.assert_array_equal(np.isnan(got.view(dtype).astype(np.float32)), nan)
        got, want_bits = got[~nan], want_bits[~nan]
    np.testing.assert_array_equal(got, want_bits)


@pytest.mark.parametrize("half", HALF_DTYPES)
@pytest.mark.parametrize("shape, head_axis, rotated, layout", [
    ((2, 3, 5, 8), 1, 8, "half"), ((2, 4, 3, 12), 2, 6, "interleaved"), ((2, 5, 6), 1, 4, "half"),
])
def test_16_bit_rotation_is_the_float32_rotation_rounded_once(device, half, shape, head_axis,
                                                              rotated, layout, rng):
    dtype = _half(half)
    x = (4 * rng.standard_normal(shape)).astype(dtype)
    ids = np.stack([np.arange(shape[3 - head_axis if len(shape) == 4 else 1]) + 7 * b + 300
                    for b in range(shape[0])])
    inv_freq = ref.rope_inv_freq(rotated, 50.0)
    opts = dict(attention_scaling=1.25, layout=layout, head_axis=head_axis,
                partial_rotary_factor=rotated / shape[-1])
    wide = x.astype(np.float32)
    for op in (F.apply_rotary, F.apply_rotary_backward):
        got = op(_half_on(device, x), ids, inv_freq, **opts)
        assert got.dtype == dtype and numbapos.device_of(got) == device
        want = op(wide, ids, inv_freq, **opts).astype(dtype)
        np.testing.assert_array_equal(_bits(got), want.view(np.uint16))
        np.testing.assert_array_equal(host(got)[..., rotated:].view(np.uint16),
                                      x[..., rotated:].view(np.uint16))
    want = F.apply_rotary(wide, ids, inv_freq, **opts).astype(dtype)
    k = x[:, :1].copy() if head_axis == 1 and x.ndim == 4 else x.copy()
    q_rot, k_rot = F.rotary_qk(_half_on(device, x), _half_on(device, k), ids, inv_freq,
                               **opts)
    np.testing.assert_array_equal(_bits(q_rot), want.view(np.uint16))
    np.testing.assert_array_equal(
        _bits(k_rot), F.apply_rotary(k.astype(np.float32), ids, inv_freq,
                                     **opts).astype(dtype).view(np.uint16))
    in_place = _half_on(device, x.copy())
    assert F.apply_rotary(in_place, ids, inv_freq, out=in_place, **opts) is in_place
    np.testing.assert_array_equal(_bits(in_place), want.view(np.uint16))
    out = _half_on(device, np.zeros_like(x))
    assert F.apply_rotary(_half_on(device, x), ids, inv_freq, out=out, **opts) is out
    np.testing.assert_array_equal(_bits(out), want.view(np.uint16))


@pytest.mark.parametrize("half", HALF_DTYPES)
def test_16_bit_module_forward_backward_and_empty_inputs(device, half, rng):
    dtype = _half(half)
    q = rng.standard_normal((2, 4, 3, 8)).astype(dtype)
    k = rng.standard_normal((2, 2, 3, 8)).astype(dtype)
    rope = nn.RotaryEmbedding(8, base=100.0, device=device)
    q_rot, k_rot = rope(_half_on(device, q), _half_on(device, k), offset=5)
    wide = nn.RotaryEmbedding(8, base=100.0)
    want_q, want_k = wide(q.astype(np.float32), k.astype(np.float32), offset=5)
    np.testing.assert_array_equal(_bits(q_rot), want_q.astype(dtype).view(np.uint16))
    np.testing.assert_array_equal(_bits(k_rot), want_k.astype(dtype).view(np.uint16))
    gq, gk = rope.backward(q_rot, k_rot)
    assert gq.dtype == dtype and gk.dtype == dtype
    want_gq, _ = wide.backward(host(q_rot).astype(np.float32), host(k_rot).astype(np.float32))
    np.testing.assert_array_equal(_bits(gq), want_gq.astype(dtype).view(np.uint16))
    empty = rope(_half_on(device, np.zeros((0, 4, 3, 8), dtype)))
    assert empty.shape == (0, 4, 3, 8) and empty.dtype == dtype
    assert F.apply_rotary(_half_on(device, np.zeros((2, 0, 8), dtype)), 0,
                          rope.inv_freq).shape == (2, 0, 8)


@pytest.mark.parametrize("half", HALF_DTYPES)
def test_strided_16_bit_input_is_copied(half, rng):
    x = rng.standard_normal((2, 5, 3, 8)).astype(_half(half))
    inv_freq = ref.rope_inv_freq(8)
    got = F.apply_rotary(x.transpose(0, 2, 1, 3), 0, inv_freq)
    want = F.apply_rotary(np.ascontiguousarray(x.transpose(0, 2, 1, 3)), 0, inv_freq)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    np.testing.assert_array_equal(F.apply_rotary(x, 0, inv_freq, head_axis=2).view(np.uint16),
                                  want.transpose(0, 2, 1, 3).view(np.uint16))


def _special_16_bit(half, shape, rng):
    """16-bit values with infinities, subnormals, overflow after rotation, signed zeros and
    NaNs (one per channel pair at most: which of two NaNs a sum returns is the compiler's)."""
    dtype = _half(half)
    x = (4 * rng.standard_normal(shape)).astype(np.float32)
    flat = x.reshape(-1)
    flat[::7] = np.inf
    flat[1::11] = -0.0
    flat[3::13] = 3e-39 if half == "bfloat16" else 3e-6  # subnormal in the format
    flat[5::17] = 6.5e4 if half == "float16" else 3e38  # rotated past the largest value
    bits = x.astype(dtype).view(np.uint16)
    rows = bits.reshape(-1, shape[-1])
    quiet, signalling = (0xFFC1, 0x7F81) if half == "bfloat16" else (0xFE01, 0x7C01)
    # NaNs with payloads in channels 0 and D - 1, never both channels of one pair.
    rows[::5, 0] = quiet
    rows[3::7, -1] = signalling
    return bits.view(dtype)


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the simulator's inf - inf
@pytest.mark.parametrize("half", HALF_DTYPES)
@pytest.mark.parametrize("shape, head_axis, rotated, layout", [
    ((2, 3, 40, 16), 1, 16, "half"), ((2, 16, 3, 12), 2, 6, "interleaved"),
    ((1, 2, 33, 10), 1, 4, "half"),
])
def test_16_bit_special_values_and_streamed_rows_have_the_float32_bits(
        monkeypatch, device, half, shape, head_axis, rotated, layout, rng):
    """The kernel reads 16-bit bits and rounds once: the float32 rotation's bits, cast back,
    for special values, partial rotary (the passed-through channels round trip through
    float32 too), in place, new outputs, and the non-temporal path of large outputs."""
    from numbapos.functional.half import store_nearest_, widened

    dtype = _half(half)
    x = _special_16_bit(half, shape, rng)
    ids = rng.integers(0, 5000, (shape[0], shape[3 - head_axis]))
    inv_freq = ref.rope_inv_freq(rotated)
    opts = dict(layout=layout, head_axis=head_axis, partial_rotary_factor=rotated / shape[3],
                attention_scaling=1.5)
    K = numbapos._device.kernels_for("cpu")
    for op in (F.apply_rotary, F.apply_rotary_backward):
        wide = op(widened(K, x), ids, inv_freq, **opts)  # the float32 path, then rounding
        want = store_nearest_(K, np.empty_like(x), wide).view(np.uint16)
        assert np.isnan(wide).any() and np.isinf(wide).any()
        _assert_same_bits(op(_half_on(device, x), ids, inv_freq, **opts), want, dtype, device)
        y = _half_on(device, x.copy())
        _assert_same_bits(op(y, ids, inv_freq, out=y, **opts), want, dtype, device)
        if device == "cpu":
            monkeypatch.setattr(cpu_rotary, "MIN_STREAM_TILE", 2)
            with numbapos.config.override(stream_min_bytes=0):  # non-temporal stores, tiles
                np.testing.assert_array_equal(op(x, ids, inv_freq, **opts).view(np.uint16),
                                              want)
    assert x.dtype == dtype


def test_16_bit_bad_input_raises_and_changes_nothing():
    x = np.arange(2 * 2 * 3 * 8).reshape(2, 2, 3, 8).astype(np.float16)
    before = x.copy()
    inv_freq = ref.rope_inv_freq(8)
    with pytest.raises(TypeError, match=r"k: dtype float16 differs from q's dtype bfloat16"):
        F.rotary_qk(x.astype(_half("bfloat16")), x, 0, inv_freq)
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 2, 3, 8\) and dtype float16"):
        F.apply_rotary(x, 0, inv_freq, out=np.empty(x.shape, np.float32))
    with pytest.raises(ValueError, match="out: expected a C-contiguous"):
        F.apply_rotary(x, 0, inv_freq, out=x[..., ::-1])
    with pytest.raises(TypeError, match="x: expected dtype float32, float64, bfloat16 or "
                                        "float16, got int16"):
        F.apply_rotary(x.view(np.int16), 0, inv_freq)
    with pytest.raises(ValueError, match="x: expected a 3-D or 4-D array"):
        F.apply_rotary(x[0, 0], 0, inv_freq)
    with pytest.raises(ValueError, match="inv_freq: 2 frequencies rotate 4 channels"):
        F.apply_rotary(x, 0, inv_freq[:2])
    np.testing.assert_array_equal(x, before)


# ---------------------------------------------------------------- the module


def test_module_rotates_q_and_k_with_different_head_counts(device, rng):
    rope = nn.RotaryEmbedding(8, base=100.0, device=device)
    q = rng.standard_normal((2, 4, 3, 8)).astype(np.float32)
    k = rng.standard_normal((2, 2, 3, 8)).astype(np.float32)
    q_rot, k_rot = rope(on(device, q), on(device, k), offset=5)
    inv_freq = ref.rope_inv_freq(8, 100.0)
    ids = np.arange(5, 8)[None]
    np.testing.assert_allclose(host(q_rot), ref.rotary(q, ids, inv_freq), atol=2e-6)
    np.testing.assert_allclose(host(k_rot), ref.rotary(k, ids, inv_freq), atol=2e-6)
    gq, gk = rope.backward(q_rot, k_rot)
    np.testing.assert_allclose(host(gq), q, atol=4e-6)
    np.testing.assert_allclose(host(gk), k, atol=4e-6)
    assert rope.pending_backwards() == 0


def test_module_backward_checks_and_keeps_the_record(rng):
    rope = nn.RotaryEmbedding(8)
    q = rng.standard_normal((1, 2, 3, 8)).astype(np.float32)
    rope(q, position_ids=np.array([[0, 2, 1]]))
    with pytest.raises(ValueError, match="grad_q"):
        rope.backward(q[:, :1])
    with pytest.raises(ValueError, match="grad_k"):
        rope.backward(q, q)
    assert rope.pending_backwards() == 1
    rope.backward(q)
    with pytest.raises(RuntimeError):
        rope.backward(q)
    with pytest.raises(ValueError, match="offset"):
        rope(q, position_ids=[0, 1, 2], offset=3)


def test_dynamic_ntk_grows_and_resets_as_transformers():
    torch = pytest.importorskip("torch")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    scaling = {"rope_type": "dynamic", "factor": 2.0}
    config = _hf_config(dict(scaling), theta=10000.0)
    theirs = LlamaRotaryEmbedding(config)
    ours = nn.RotaryEmbedding.from_hf_config(config)
    stateless = nn.RotaryEmbedding.from_hf_config(config, stateless=True)
    x = torch.zeros(1, 1)
    for length in (16, 200, 150, 300, 100, 140, 64):
        theirs(x, torch.arange(length)[None])
        got, _ = ours.frequencies(length)
        np.testing.assert_allclose(got, theirs.inv_freq.double().numpy(), rtol=2e-6)
        fresh = F.rope_frequencies(16, 10000.0, scaling=scaling, max_position_embeddings=128,
                                   seq_len=length)[0]
        np.testing.assert_array_equal(stateless.frequencies(length)[0], fresh)
    assert ours.max_seq_len_cached == theirs.max_seq_len_cached


def test_bad_input_leaves_the_dynamic_state_unchanged():
    rope = nn.RotaryEmbedding(8, scaling={"rope_type": "dynamic", "factor": 2.0},
                              max_position_embeddings=16)
    q = np.ones((1, 1, 40, 8), np.float32)
    with pytest.raises(ValueError, match="k"):
        rope(q, np.ones((1, 1, 39, 8), np.float32))
    assert rope.max_seq_len_cached == 16
    np.testing.assert_array_equal(rope.inv_freq, rope.original_inv_freq)
    rope(q)
    assert rope.max_seq_len_cached == 40


def test_longrope_switches_factors_with_the_length():
    scaling = HF_SCALINGS[7]
    rope = nn.RotaryEmbedding(16, 500.0, scaling=scaling, max_position_embeddings=128)
    short = rope.frequencies(32)[0]
    long = rope.frequencies(33)[0]
    base = ref.rope_inv_freq(16, 500.0)
    np.testing.assert_allclose(short, base / scaling["short_factor"], rtol=1e-14)
    np.testing.assert_allclose(long, base / scaling["long_factor"], rtol=1e-14)
    x = np.ones((1, 1, 40, 16), np.float32)
    rope(x)  # 40 positions: the long factors
    np.testing.assert_array_equal(rope.inv_freq, long)


def test_from_hf_config_dicts():
    neox = nn.RotaryEmbedding.from_hf_config({"hidden_size": 256, "num_attention_heads": 4,
                                              "rotary_pct": 0.25, "rotary_emb_base": 500,
                                              "max_position_embeddings": 64})
    assert neox.head_dim == 64 and len(neox.inv_freq) == 8 and neox.base == 500.0
    gptj = nn.RotaryEmbedding.from_hf_config({"model_type": "gptj", "n_embd": 256, "n_head": 4,
                                              "rotary_dim": 16, "n_positions": 64})
    assert gptj.layout == "interleaved" and len(gptj.inv_freq) == 8
    phi3 = nn.RotaryEmbedding.from_hf_config({
        "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 128,
        "original_max_position_embeddings": 32, "rope_scaling": dict(HF_SCALINGS[7])})
    assert phi3.rope_type == "longrope" and phi3.attention_scaling > 1


# ---------------------------------------------------------------- transformers parity


def _torch_pair(rng, shape_q, shape_k):
    torch = pytest.importorskip("torch")
    q = rng.standard_normal(shape_q).astype(np.float32)
    k = rng.standard_normal(shape_k).astype(np.float32)
    return torch, q, k


def _check_against(torch, q, k, q_t, k_t, q_rot, k_rot, rope, ours, gq_np, gk_np):
    """Forward values and autograd gradients of (q_t, k_t) -> (q_rot, k_rot) against ours."""
    got_q, got_k = ours(q, k)
    np.testing.assert_allclose(got_q, q_rot.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_k, k_rot.detach().numpy(), rtol=1e-5, atol=1e-5)
    loss = (q_rot * torch.from_numpy(gq_np)).sum() + (k_rot * torch.from_numpy(gk_np)).sum()
    loss.backward()
    grad_q, grad_k = rope.backward(gq_np, gk_np)
    np.testing.assert_allclose(grad_q, q_t.grad.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad_k, k_t.grad.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("positions", ["contiguous", "offset", "left_padded"])
@pytest.mark.parametrize("scaling", [HF_SCALINGS[0], HF_SCALINGS[4], HF_SCALINGS[9]],
                         ids=["default", "yarn", "llama3"])
def test_llama_parity(scaling, positions, rng):
    torch, q, k = _torch_pair(rng, (2, 4, 6, 16), (2, 2, 6, 16))
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = _hf_config(dict(scaling))
    if positions == "contiguous":
        ids = np.tile(np.arange(6), (2, 1))
    elif positions == "offset":
        ids = np.tile(np.arange(4000, 4006), (2, 1))
    else:
        mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
        ids = np.where(mask == 1, np.cumsum(mask, axis=1) - 1, 1)
    theirs = LlamaRotaryEmbedding(config)
    rope = nn.RotaryEmbedding.from_hf_config(config, float32_angle=positions == "offset")
    if positions == "offset":
        # At position 4000 transformers' float32 angle is off by up to 1e-4: reproduce its
        # rounding, from its own float32 frequencies.
        rope.inv_freq = theirs.inv_freq.double().numpy()
    q_t = torch.from_numpy(q).requires_grad_()
    k_t = torch.from_numpy(k).requires_grad_()
    cos, sin = theirs(q_t, torch.from_numpy(ids))
    q_rot, k_rot = apply_rotary_pos_emb(q_t, k_t, cos, sin)
    gq, gk = rng.standard_normal(q.shape), rng.standard_normal(k.shape)

    def ours(a, b):
        if positions == "offset":
            return rope(a, b, offset=4000)
        return rope(a, b, position_ids=ids)

    _check_against(torch, q, k, q_t, k_t, q_rot, k_rot, rope, ours, gq.astype(np.float32),
                   gk.astype(np.float32))


def test_gpt_neox_partial_rotary_parity(rng):
    torch, q, k = _torch_pair(rng, (2, 4, 5, 32), (2, 4, 5, 32))
    transformers = pytest.importorskip("transformers")
    from transformers.models.gpt_neox import modeling_gpt_neox as neox

    config = transformers.GPTNeoXConfig(hidden_size=128, num_attention_heads=4, rotary_pct=0.25,
                                        max_position_embeddings=64)
    ids = torch.arange(3, 8)[None].expand(2, -1)
    q_t = torch.from_numpy(q).requires_grad_()
    k_t = torch.from_numpy(k).requires_grad_()
    cos, sin = neox.GPTNeoXRotaryEmbedding(config)(q_t, ids)
    q_rot, k_rot = neox.apply_rotary_pos_emb(q_t, k_t, cos, sin)
    rope = nn.RotaryEmbedding.from_hf_config(config)
    assert len(rope.inv_freq) == 4
    _check_against(torch, q, k, q_t, k_t, q_rot, k_rot, rope,
                   lambda a, b: rope(a, b, position_ids=ids.numpy()),
                   rng.standard_normal(q.shape).astype(np.float32),
                   rng.standard_normal(k.shape).astype(np.float32))


def test_cohere_interleaved_parity(rng):
    torch, q, k = _torch_pair(rng, (1, 4, 5, 16), (1, 1, 5, 16))
    transformers = pytest.importorskip("transformers")
    from transformers.models.cohere import modeling_cohere as cohere

    config = transformers.CohereConfig(hidden_size=64, num_attention_heads=4,
                                       num_key_value_heads=1, max_position_embeddings=64)
    ids = torch.tensor([[9, 2, 4, 4, 30]])
    q_t = torch.from_numpy(q).requires_grad_()
    k_t = torch.from_numpy(k).requires_grad_()
    cos, sin = cohere.CohereRotaryEmbedding(config)(q_t, ids)
    q_rot, k_rot = cohere.apply_rotary_pos_emb(q_t, k_t, cos, sin)
    rope = nn.RotaryEmbedding.from_hf_config(config)
    assert rope.layout == "interleaved"
    _check_against(torch, q, k, q_t, k_t, q_rot, k_rot, rope,
                   lambda a, b: rope(a, b, position_ids=ids.numpy()),
                   rng.standard_normal(q.shape).astype(np.float32),
                   rng.standard_normal(k.shape).astype(np.float32))


def test_gptj_interleaved_partial_heads_last_parity(rng):
    torch, q, k = _torch_pair(rng, (2, 5, 4, 16), (2, 5, 4, 16))  # (B, L, H, D)
    transformers = pytest.importorskip("transformers")
    from transformers.models.gptj import modeling_gptj as gptj

    config = transformers.GPTJConfig(n_embd=64, n_head=4, rotary_dim=8, n_positions=64)
    ids = torch.arange(2, 7)[None].expand(2, -1)
    q_t = torch.from_numpy(q).requires_grad_()
    k_t = torch.from_numpy(k).requires_grad_()
    sin, cos = gptj.GPTJRotaryEmbedding(config)(q_t, ids)

    def apply(t):
        return torch.cat([gptj.apply_rotary_pos_emb(t[..., :8], sin, cos), t[..., 8:]], dim=-1)

    q_rot, k_rot = apply(q_t), apply(k_t)
    rope = nn.RotaryEmbedding.from_hf_config(config, head_axis=2)
    _check_against(torch, q, k, q_t, k_t, q_rot, k_rot, rope,
                   lambda a, b: rope(a, b, position_ids=ids.numpy()),
                   rng.standard_normal(q.shape).astype(np.float32),
                   rng.standard_normal(k.shape).astype(np.float32))


def test_phi3_longrope_config_object_parity():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    scaling = dict(HF_SCALINGS[7])
    scaling.pop("original_max_position_embeddings")
    scaling["type"] = scaling.pop("rope_type")  # the older key
    config = transformers.Phi3Config(hidden_size=64, num_attention_heads=4,
                                     num_key_value_heads=4, max_position_embeddings=128,
                                     original_max_position_embeddings=32, rope_scaling=scaling)
    theirs = Phi3RotaryEmbedding(config)
    ours = nn.RotaryEmbedding.from_hf_config(config)
    for length in (16, 40, 20):
        theirs(torch.zeros(1), torch.arange(length)[None])
        inv_freq, scale = ours.frequencies(length)
        np.testing.assert_allclose(inv_freq, theirs.inv_freq.double().numpy(), rtol=2e-6)
        assert scale == pytest.approx(theirs.attention_scaling, rel=1e-12)
