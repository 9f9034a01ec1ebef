"""The concatenated sinusoid (fairseq, M2M100 / NLLB, Whisper) and diffusers' timestep embedding.

Both against float64 NumPy references (tests/reference.py), on the CPU and on
CUDA (the simulator without a GPU, small shapes), and against transformers'
M2M100 / Whisper code and diffusers' formula run in torch where they import.
"""

import math

import numba
import numpy as np
import pytest
import reference as ref
from conftest import FLOAT_DTYPES, device_cases, host, on, two_threads

import numbapos.functional as F
from numbapos import _device
from numbapos.kernels.cpu import positional as cpu_kernels

BOUND = {np.dtype(np.float32): 1e-6, np.dtype(np.float64): 1e-10}
CUDA_MAX_ELEMENTS = 10_000  # the simulator runs every thread as Python


def _small(*dims):
    return int(np.prod(dims)) <= CUDA_MAX_ELEMENTS


def _check(got, want, dtype, device=None):
    if device is not None:
        assert _device.device_of(got) == device
    got = host(got)
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=BOUND[np.dtype(dtype)])


def _torch():
    return pytest.importorskip("torch")


# ---------------------------------------------------------------- layout="concat"

CONCAT_SHAPES = [(1, 4), (5, 5), (9, 8), (3, 9), (600, 6), (300, 129), (64, 384), (4096, 64)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("device, seq_len, embed_dim", device_cases(CONCAT_SHAPES, _small),
                         indirect=["device"])
def test_concat_matches_formula(device, seq_len, embed_dim, dtype):
    table = F.sinusoidal_pos_embedding(seq_len, embed_dim, device=device, dtype=dtype,
                                       layout="concat")
    _check(table, ref.sinusoidal_table_concat(seq_len, embed_dim), dtype, device)


def test_concat_layout(device):
    # sin(p) | sin(p / base) | cos(p) | cos(p / base) and a zero channel for odd D: the
    # frequencies run from 1 to exactly 1 / base (H - 1 spacing).
    table = host(F.sinusoidal_pos_embedding(4, 5, device=device, dtype=np.float64, base=100.0,
                                            layout="concat"))
    p = np.arange(4.0)
    want = np.stack([np.sin(p), np.sin(p / 100), np.cos(p), np.cos(p / 100), 0 * p], axis=1)
    np.testing.assert_allclose(table, want, rtol=0, atol=1e-15)
    assert np.all(table[:, 4] == 0)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("offset", [1, 300, 60000])
def test_concat_offset_and_base(device, offset, dtype):
    table = F.sinusoidal_pos_embedding(40, 10, device=device, dtype=dtype, offset=offset,
                                       base=500.0, layout="concat")
    _check(table, ref.sinusoidal_table_concat(40, 10, base=500.0, offset=offset), dtype)


def test_default_layout_is_interleaved(device):
    default = host(F.sinusoidal_pos_embedding(7, 9, device=device))
    named = host(F.sinusoidal_pos_embedding(7, 9, device=device, layout="interleaved"))
    np.testing.assert_array_equal(default, named)
    np.testing.assert_allclose(default, ref.sinusoidal_table(7, 9), rtol=0, atol=1e-6)


def test_concat_into_out(device):
    out = on(device, np.full((6, 8), np.nan))
    assert F.sinusoidal_pos_embedding(6, 8, out=out, layout="concat") is out
    np.testing.assert_allclose(host(out), ref.sinusoidal_table_concat(6, 8), atol=1e-10)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_concat_error_bound_65536_positions(dtype):
    # CPU only: the recurrence's error stays bounded down a long table.
    table = F.sinusoidal_pos_embedding(65536, 20, dtype=dtype, layout="concat")
    err = np.max(np.abs(table.astype(np.float64) - ref.sinusoidal_table_concat(65536, 20)))
    assert err <= BOUND[np.dtype(dtype)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_concat_same_values_for_any_thread_count_and_kernel(dtype, parallel_threshold):
    two_threads()
    default = F.sinusoidal_pos_embedding(3000, 41, dtype=dtype, layout="concat")
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        single = F.sinusoidal_pos_embedding(3000, 41, dtype=dtype, layout="concat")
    finally:
        numba.set_num_threads(threads)
    np.testing.assert_array_equal(single, default)
    parallel_threshold(1 << 40)
    serial = F.sinusoidal_pos_embedding(3000, 41, dtype=dtype, layout="concat")
    np.testing.assert_array_equal(serial, default)


# ---------------------------------------------------------------- against transformers


def _float32_bound(max_angle):
    """How far a table computed in float32 may lie from the exact one. The angle ``p w``
    with ``w = exp(-x)`` carries the product's rounding (``eps / 2`` relative) and
    ``exp``'s of its rounded argument (``x eps / 2``, and ``x exp(-x) <= 1 / e``):
    below ``eps * p``; twice that, plus the final rounding."""
    return 2 * np.finfo(np.float32).eps * max_angle + 1e-6


@pytest.mark.parametrize("length, channels, max_timescale",
                         [(1, 4, 10000), (64, 8, 10000), (1500, 384, 10000), (200, 80, 30.0)])
def test_whisper_sinusoids(length, channels, max_timescale):
    torch = _torch()
    whisper = pytest.importorskip("transformers.models.whisper.modeling_whisper")
    default = torch.get_default_dtype()
    try:  # Whisper computes in the default dtype: float64 makes its table exact
        torch.set_default_dtype(torch.float64)
        exact = whisper.sinusoids(length, channels, max_timescale).numpy()
    finally:
        torch.set_default_dtype(default)
    as_run = whisper.sinusoids(length, channels, max_timescale).numpy()  # float32, as in use
    for dtype in FLOAT_DTYPES:
        got = F.sinusoidal_pos_embedding(length, channels, dtype=dtype, base=max_timescale,
                                         layout="concat")
        np.testing.assert_allclose(got, exact, rtol=0, atol=BOUND[np.dtype(dtype)])
    got = F.sinusoidal_pos_embedding(length, channels, base=max_timescale, layout="concat")
    np.testing.assert_allclose(got, as_run, rtol=0, atol=_float32_bound(length - 1))


@pytest.mark.parametrize("num_embeddings, embedding_dim, padding_idx",
                         [(10, 4, None), (66, 16, 1), (130, 33, 1), (1026, 64, 0)])
def test_m2m100_get_embedding(num_embeddings, embedding_dim, padding_idx):
    _torch()
    m2m = pytest.importorskip("transformers.models.m2m_100.modeling_m2m_100")
    want = m2m.M2M100SinusoidalPositionalEmbedding.get_embedding(
        num_embeddings, embedding_dim, padding_idx).numpy()
    got = F.sinusoidal_pos_embedding(num_embeddings, embedding_dim, dtype=np.float64,
                                     layout="concat")
    if padding_idx is not None:
        got[padding_idx] = 0  # the caller's part (see the docstring)
    np.testing.assert_allclose(got, want, rtol=0, atol=_float32_bound(num_embeddings - 1))
    # the float32 reference's error is what the bound allows for, not a layout slip: its
    # exact version (computed here in float64) is what numbapos gives
    np.testing.assert_allclose(got, _fairseq_float64(num_embeddings, embedding_dim,
                                                     padding_idx), rtol=0, atol=1e-10)


def _fairseq_float64(num_embeddings, embedding_dim, padding_idx):
    """fairseq's ``get_embedding`` (fairseq/modules/sinusoidal_positional_embedding.py), its
    ``torch.float`` replaced by float64."""
    torch = _torch()
    half_dim = embedding_dim // 2
    emb = math.log(10000) / (half_dim - 1)
    emb = torch.exp(torch.arange(half_dim, dtype=torch.float64) * -emb)
    emb = torch.arange(num_embeddings, dtype=torch.float64).unsqueeze(1) * emb.unsqueeze(0)
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1).view(num_embeddings, -1)
    if embedding_dim % 2 == 1:
        emb = torch.cat([emb, torch.zeros(num_embeddings, 1, dtype=torch.float64)], dim=1)
    if padding_idx is not None:
        emb[padding_idx, :] = 0
    return emb.numpy()


@pytest.mark.parametrize("cache_length", [0, 5])
def test_m2m100_module_recipe(cache_length):
    """The docstring's recipe (zeroed padding row, positions from padding_idx + 1) gives
    M2M100SinusoidalPositionalEmbedding's output for a left- and right-padded batch."""
    torch = _torch()
    m2m = pytest.importorskip("transformers.models.m2m_100.modeling_m2m_100")
    num_positions, dim, padding_idx = 32, 16, 1
    module = m2m.M2M100SinusoidalPositionalEmbedding(num_positions, dim, padding_idx)
    ids = np.array([[1, 1, 7, 8, 9, 4], [7, 8, 9, 4, 1, 1], [5, 6, 7, 8, 9, 10]])
    want = module(torch.from_numpy(ids), cache_length=cache_length).numpy()
    table = F.sinusoidal_pos_embedding(num_positions + padding_idx + 1, dim, layout="concat")
    table[padding_idx] = 0
    positions = F.positions_from_padding(ids, padding_idx,
                                         past_length=padding_idx + 1 + cache_length,
                                         pad_position=padding_idx)
    got = table[positions]
    np.testing.assert_allclose(got, want, rtol=0, atol=_float32_bound(num_positions + 2))
    assert np.all(got[0, :2] == 0) and np.all(got[1, 4:] == 0)


# ---------------------------------------------------------------- timestep_embedding

TIMESTEP_OPTIONS = [
    dict(),
    dict(flip_sin_to_cos=True, downscale_freq_shift=0),  # Stable Diffusion's UNet
    dict(flip_sin_to_cos=True, downscale_freq_shift=0, scale=1000.0),  # flow-matching t in [0, 1]
    dict(downscale_freq_shift=0.5, max_period=100),
    dict(flip_sin_to_cos=True, scale=-2.5, max_period=1e4),
]
TIMESTEP_DIMS = [1, 2, 5, 8, 33, 320]


def _timesteps(options, n=6, seed=0):
    """Fractional timesteps whose angles stay below 4096 (scale 1000: t in [0, 1])."""
    rng = np.random.default_rng(seed)
    top = 1.0 if abs(options.get("scale", 1.0)) > 100 else 999.0
    return np.concatenate([[0.0, top], rng.uniform(0, top, n - 2)])


# embedding_dim // 2 == downscale_freq_shift divides by zero: tested with the errors
TIMESTEP_CASES = [(options, dim) for options in TIMESTEP_OPTIONS for dim in TIMESTEP_DIMS
                  if dim // 2 != options.get("downscale_freq_shift", 1)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("options, embedding_dim", TIMESTEP_CASES, ids=str)
def test_timestep_matches_diffusers_formula(device, options, embedding_dim, dtype):
    t = _timesteps(options)
    got = F.timestep_embedding(on(device, t), embedding_dim, dtype=dtype, **options)
    _check(got, ref.timestep_embedding(t, embedding_dim, **options), dtype, device)


def test_timestep_defaults_and_concat_sinusoid(device):
    # the defaults (shift 1, scale 1) are the concat sinusoid at the given positions
    got = F.timestep_embedding(on(device, np.arange(5.0, 45.0)), 10, dtype=np.float64)
    assert got.dtype == np.float64
    want = F.sinusoidal_pos_embedding(40, 10, dtype=np.float64, offset=5, layout="concat")
    np.testing.assert_allclose(host(got), want, rtol=0, atol=1e-12)
    assert host(F.timestep_embedding(on(device, np.zeros(2)), 4)).dtype == np.float32


@pytest.mark.parametrize("timesteps", [
    np.array([0, 10, 999], dtype=np.int64), np.array([1, 500], dtype=np.int32),
    np.array([0.5, 999.0], dtype=np.float32), np.array([250.0, 3.25], dtype=np.float16),
], ids=lambda t: str(t.dtype))
def test_timestep_dtypes(device, timesteps):
    got = F.timestep_embedding(on(device, timesteps), 12)
    _check(got, ref.timestep_embedding(timesteps.astype(np.float64), 12), np.float32)


def test_timestep_lists_2d_and_empty(device):
    t = np.array([[1.0, 2.5, 999.0], [0.0, 7.0, 31.0]])
    got = F.timestep_embedding(on(device, t), 9, flip_sin_to_cos=True)
    assert got.shape == (2, 3, 9)
    _check(got, ref.timestep_embedding(t, 9, flip_sin_to_cos=True), np.float32)
    listed = F.timestep_embedding([1, 2.5, 999], 9, flip_sin_to_cos=True)  # on the CPU
    _check(listed, ref.timestep_embedding(t[0], 9, flip_sin_to_cos=True), np.float32, "cpu")
    empty = F.timestep_embedding(on(device, np.zeros(0)), 6)
    assert host(empty).shape == (0, 6)


def test_timestep_into_out(device):
    out = on(device, np.full((3, 7), np.nan))
    t = on(device, np.array([3.0, 4.0, 5.0]))
    assert F.timestep_embedding(t, 7, out=out) is out
    np.testing.assert_allclose(host(out), ref.timestep_embedding([3.0, 4.0, 5.0], 7),
                               rtol=0, atol=1e-10)


def test_timestep_same_values_for_any_kernel(parallel_threshold):
    t = np.linspace(0, 999, 3000)
    default = F.timestep_embedding(t, 64, flip_sin_to_cos=True)
    parallel_threshold(1 << 40)
    np.testing.assert_array_equal(F.timestep_embedding(t, 64, flip_sin_to_cos=True), default)


def _diffusers_torch(timesteps, embedding_dim, flip_sin_to_cos=False, downscale_freq_shift=1,
                     scale=1, max_period=10000, dtype=None):
    """diffusers' get_timestep_embedding (src/diffusers/models/embeddings.py) in torch,
    verbatim but for ``dtype`` (diffusers: torch.float32)."""
    torch = _torch()
    dtype = torch.float32 if dtype is None else dtype
    assert len(timesteps.shape) == 1, "Timesteps should be a 1d-array"
    half_dim = embedding_dim // 2
    exponent = -math.log(max_period) * torch.arange(start=0, end=half_dim, dtype=dtype)
    exponent = exponent / (half_dim - downscale_freq_shift)
    emb = torch.exp(exponent)
    emb = timesteps[:, None].to(dtype) * emb[None, :]
    emb = scale * emb
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[:, half_dim:], emb[:, :half_dim]], dim=-1)
    if embedding_dim % 2 == 1:
        emb = torch.nn.functional.pad(emb, (0, 1, 0, 0))
    return emb


@pytest.mark.parametrize("embedding_dim", [5, 256, 321])
@pytest.mark.parametrize("options", TIMESTEP_OPTIONS, ids=str)
def test_timestep_matches_torch(options, embedding_dim):
    torch = _torch()
    t = _timesteps(options, n=16)
    exact = _diffusers_torch(torch.from_numpy(t), embedding_dim, dtype=torch.float64,
                             **options).numpy()
    as_run = _diffusers_torch(torch.from_numpy(t), embedding_dim, **options).numpy()
    np.testing.assert_allclose(F.timestep_embedding(t, embedding_dim, dtype=np.float64,
                                                    **options), exact, rtol=0, atol=1e-10)
    got = F.timestep_embedding(t, embedding_dim, **options)
    np.testing.assert_allclose(got, exact, rtol=0, atol=1e-6)
    max_angle = abs(options.get("scale", 1.0)) * t.max()
    np.testing.assert_allclose(got, as_run, rtol=0, atol=_float32_bound(max_angle))


# ---------------------------------------------------------------- the kernels themselves


def test_cuda_kernels_match_cpu_kernels_in_a_small_grid(monkeypatch):
    """The CUDA twins, one block walking the grid-stride loop, against the CPU launchers."""
    import numbapos

    if not numbapos.cuda_available():
        pytest.skip("CUDA is not available (no GPU and the simulator is off)")
    from conftest import dev, nan_device

    from numbapos.kernels.cuda import positional as gpu_kernels

    monkeypatch.setattr(gpu_kernels, "grid", lambda work, threads=None: 1)
    freq = np.exp(-np.log(1e4) * np.arange(4) / 3)
    for concat in (False, True):
        width = 9 if concat else 8
        cpu_out = np.empty((40, width))
        cpu_kernels.sinusoid_fill(freq, 3, cpu_out, concat=concat)
        gpu_out = nan_device((40, width), np.float64)
        gpu_kernels.sinusoid_fill(freq, 3, gpu_out, concat=concat)
        np.testing.assert_allclose(gpu_out.copy_to_host(), cpu_out, rtol=0, atol=1e-13)
    t = np.linspace(0, 999, 30)
    for flip in (False, True):
        cpu_out = np.empty((30, 9), np.float32)
        cpu_kernels.timestep_fill(t, freq, 2.0, flip, cpu_out)
        gpu_out = nan_device((30, 9), np.float32)
        gpu_kernels.timestep_fill(dev(t), freq, 2.0, flip, gpu_out)
        np.testing.assert_allclose(gpu_out.copy_to_host(), cpu_out, rtol=0, atol=1e-7)


# ---------------------------------------------------------------- bad input

LAYOUT_ERRORS = [
    (dict(layout="concatenated"), ValueError,
     "layout: expected 'interleaved' or 'concat', got 'concatenated'"),
    (dict(layout="Concat"), ValueError, "layout: expected .* got 'Concat'"),
    (dict(layout=None), TypeError, "layout: expected 'interleaved' or 'concat', got NoneType"),
    (dict(layout=1), TypeError, "layout: expected"),
    (dict(layout="concat", embed_dim=3), ValueError,
     r"embed_dim: layout='concat' .* needs embed_dim >= 4, got 3"),
    (dict(layout="concat", embed_dim=2), ValueError, "embed_dim: .* got 2"),
    (dict(layout="concat", embed_dim=0), ValueError, "embed_dim: expected an integer >= 1, got 0"),
    (dict(layout="concat", embed_dim=-4), ValueError, "embed_dim: expected an integer >= 1"),
    (dict(layout="concat", base=0.0), ValueError, "base: expected a finite positive"),
    (dict(layout="concat", base=float("inf")), ValueError, "base: expected a finite positive"),
]


@pytest.mark.parametrize("device, kwargs, exc, match", device_cases(LAYOUT_ERRORS),
                         indirect=["device"])
def test_layout_errors(device, kwargs, exc, match):
    kwargs = dict(dict(seq_len=3, embed_dim=4), **kwargs)
    out = on(device, np.full((3, max(kwargs["embed_dim"], 1)), 7.0))
    if kwargs["embed_dim"] > 0:
        kwargs["out"] = out  # a buffer of the right shape, left unchanged
    else:
        kwargs["device"] = device
    with pytest.raises(exc, match=match):
        F.sinusoidal_pos_embedding(**kwargs)
    assert np.all(host(out) == 7.0)


TIMESTEP_ERRORS = [
    (dict(embedding_dim=0), ValueError, "embedding_dim: expected an integer >= 1, got 0"),
    (dict(embedding_dim=-3), ValueError, "embedding_dim: expected an integer >= 1, got -3"),
    (dict(embedding_dim=4.0), TypeError, "embedding_dim: expected an integer"),
    (dict(embedding_dim=2, downscale_freq_shift=1), ValueError,
     "downscale_freq_shift: .* division by zero for embedding_dim=2 and downscale_freq_shift=1"),
    (dict(embedding_dim=8, downscale_freq_shift=4.0), ValueError, "downscale_freq_shift: "),
    (dict(downscale_freq_shift=float("nan")), ValueError,
     "downscale_freq_shift: expected a number"),
    (dict(downscale_freq_shift=float("inf")), ValueError,
     "downscale_freq_shift: expected a finite"),
    (dict(scale=float("inf")), ValueError, "scale: expected a finite number, got inf"),
    (dict(scale="2"), TypeError, "scale: expected a real number"),
    (dict(max_period=0), ValueError, "max_period: expected a finite positive number, got 0"),
    (dict(max_period=-10), ValueError, "max_period: expected a finite positive"),
    (dict(flip_sin_to_cos=1), TypeError, "flip_sin_to_cos: expected a bool, got int 1"),
    (dict(flip_sin_to_cos="yes"), TypeError, "flip_sin_to_cos: expected a bool"),
    (dict(dtype=np.float16), TypeError, "dtype: expected float32"),
    (dict(timesteps=np.zeros((2, 2, 2))), ValueError,
     r"timesteps: expected a 1-D or 2-D array, got shape \(2, 2, 2\)"),
    (dict(timesteps=np.float64(3.0)), ValueError,
     r"timesteps: expected a 1-D or 2-D array, got shape \(\)"),
    (dict(timesteps=np.array([True, False])), TypeError,
     "timesteps: expected integer or float numbers.*got dtype bool"),
    (dict(timesteps=np.array([1j])), TypeError, "timesteps: expected integer or float"),
    (dict(out=np.empty((3, 5), np.float32)), ValueError, "out: expected shape"),
]
# Host timesteps only: CUDA timesteps are not read back.
TIMESTEP_HOST_ERRORS = [
    (dict(timesteps=np.array([0.0, np.nan, 1.0])), ValueError,
     r"timesteps: expected finite numbers, got nan \(at flat position 1\)"),
    (dict(timesteps=[1.0, -np.inf]), ValueError,
     r"timesteps: expected finite numbers, got -inf \(at flat position 1\)"),
    (dict(timesteps=["a"]), TypeError, "timesteps: expected integer or float numbers"),
    (dict(timesteps=[[1.0], [2.0, 3.0]]), ValueError, "timesteps: cannot make an array"),
]


@pytest.mark.parametrize("device, kwargs, exc, match",
                         device_cases(TIMESTEP_ERRORS)
                         + device_cases(TIMESTEP_HOST_ERRORS, cuda=()),
                         indirect=["device"])
def test_timestep_errors(device, kwargs, exc, match):
    kwargs = dict(dict(timesteps=np.array([1.0, 2.0, 3.0]), embedding_dim=4), **kwargs)
    if isinstance(kwargs["timesteps"], np.ndarray) and kwargs["timesteps"].ndim:
        kwargs["timesteps"] = on(device, kwargs["timesteps"])
    if "out" in kwargs:
        kwargs["out"] = on(device, kwargs["out"])
    with pytest.raises(exc, match=match):
        F.timestep_embedding(**kwargs)


def test_timestep_error_leaves_out_untouched(device):
    out = on(device, np.full((2, 4), 7.0, dtype=np.float32))
    with pytest.raises(ValueError):
        F.timestep_embedding(on(device, np.array([1.0, 2.0])), 4, max_period=-1.0, out=out)
    if device == "cpu":
        with pytest.raises(ValueError, match="finite"):
            F.timestep_embedding(np.array([1.0, np.inf]), 4, out=out)
    assert np.all(host(out) == 7.0)


def test_timestep_out_on_another_device():
    import numbapos

    if not numbapos.cuda_available():
        pytest.skip("CUDA is not available (no GPU and the simulator is off)")
    with pytest.raises(TypeError, match="timesteps"):
        F.timestep_embedding(np.array([1.0]), 4, out=on("cuda", np.empty((1, 4), np.float32)))
