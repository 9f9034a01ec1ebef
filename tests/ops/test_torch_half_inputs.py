"""16-bit PyTorch tensors in: bfloat16 read through its bits (no float32 detour), float16 as is.

Every call here is compared bit for bit with the same call on the tensor's NumPy
bits (``t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)``). Tensors are on
the CPU (the simulator cannot adopt another library's memory; a CUDA tensor goes
through the same int16 view and Numba's ``as_cuda_array``); modules and tables
run on both devices. Skipped without PyTorch.
"""

import numpy as np
import pytest
import reference as ref
from conftest import host, on

import numbapos
import numbapos.functional as F
from numbapos import _checks, nn

torch = pytest.importorskip("torch")

BF16 = _checks.bfloat16_dtype()
HALVES = [("bfloat16", BF16), ("float16", np.dtype(np.float16))]


def _numpy_bits(t):
    """What numbapos should see of the tensor ``t``: its own memory, as NumPy."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(BF16)
    return t.numpy()


def _u16(x):
    return host(x).view(np.uint16)


def _tensor(rng, shape, name, scale=1.0):
    return torch.from_numpy((scale * rng.standard_normal(shape)).astype(np.float32)).to(
        getattr(torch, name))


# ---------------------------------------------------------------- the conversion


@pytest.mark.parametrize("name, dtype", HALVES)
def test_tensors_are_viewed_not_converted(name, dtype, rng):
    t = _tensor(rng, (4, 6), name)
    for x in (t, t.T, t[:, 1::2]):  # strided views too
        view = _checks.as_array(x, "x")
        assert view.dtype == dtype and view.shape == tuple(x.shape)
        np.testing.assert_array_equal(view.view(np.uint16), _numpy_bits(x).view(np.uint16))
        assert np.shares_memory(view.view(np.uint16), t.view(torch.int16).numpy())
        np.testing.assert_array_equal(numbapos.to_host(x).view(np.uint16), view.view(np.uint16))
    t[0, 0] = 3.0  # a view: what the tensor holds now is what numbapos reads
    assert float(_checks.as_array(t, "x")[0, 0]) == 3.0


def test_bfloat16_where_only_float32_or_float64_is_taken_is_named():
    t = torch.ones(2, 3, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="x: expected dtype float32 or float64, got bfloat16"):
        F.layer_norm(t, None)
    with pytest.raises(TypeError, match=r"t: got a torch\.Tensor that requires grad; .*"
                                        r"t\.detach\(\)"):
        _checks.as_array(t.clone().requires_grad_(), "t")
    if numbapos.cuda_available():  # a bfloat16 tensor goes to CUDA as its bits
        back = numbapos.to_host(numbapos.to_device(t, "cuda"))
        np.testing.assert_array_equal(back.view(np.int16), t.view(torch.int16).numpy())


def test_parameters_take_16_bit_tensors():
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3).to(torch.bfloat16)
    param = nn.Parameter(t)
    assert param.dtype == BF16
    np.testing.assert_array_equal(param.data.view(np.uint16), _numpy_bits(t).view(np.uint16))


# ---------------------------------------------------------------- rotary


@pytest.mark.parametrize("name, dtype", HALVES)
def test_apply_rotary_on_a_tensor_is_the_call_on_its_bits(name, dtype, rng):
    t = _tensor(rng, (2, 3, 5, 16), name, 4.0)
    inv_freq, _ = F.rope_frequencies(16, partial_rotary_factor=0.5)
    opts = dict(partial_rotary_factor=0.5, attention_scaling=1.1)
    got = F.apply_rotary(t, 9, inv_freq, **opts)
    assert type(got) is np.ndarray and got.dtype == dtype
    np.testing.assert_array_equal(got.view(np.uint16),
                                  F.apply_rotary(_numpy_bits(t), 9, inv_freq,
                                                 **opts).view(np.uint16))
    wide = F.apply_rotary(t.float().numpy(), 9, inv_freq, **opts).astype(dtype)
    np.testing.assert_array_equal(got.view(np.uint16), wide.view(np.uint16))
    back = F.apply_rotary_backward(t, 9, inv_freq, **opts)
    np.testing.assert_array_equal(back.view(np.uint16), F.apply_rotary_backward(
        _numpy_bits(t), 9, inv_freq, **opts).view(np.uint16))
    out = torch.zeros_like(t)
    F.apply_rotary(t, 9, inv_freq, out=out, **opts)  # written into the tensor's memory
    assert torch.equal(out.view(torch.int16), torch.from_numpy(got.view(np.int16)))


@pytest.mark.parametrize("name, dtype", HALVES)
def test_rotary_module_on_tensors_is_the_module_on_their_bits(device, name, dtype, rng):
    q, k = _tensor(rng, (2, 4, 3, 8), name), _tensor(rng, (2, 2, 3, 8), name)
    ids = torch.tensor([[4, 0, 9], [1, 2, 3]])
    rope = nn.RotaryEmbedding(8, device="cpu")
    q_rot, k_rot = rope(q, k, position_ids=ids)
    assert q_rot.dtype == dtype and k_rot.dtype == dtype
    mine = nn.RotaryEmbedding(8, device="cpu")
    want_q, want_k = mine(_numpy_bits(q), _numpy_bits(k), position_ids=ids.numpy())
    np.testing.assert_array_equal(q_rot.view(np.uint16), want_q.view(np.uint16))
    np.testing.assert_array_equal(k_rot.view(np.uint16), want_k.view(np.uint16))
    gq, gk = rope.backward(torch.from_numpy(q_rot.view(np.int16)).view(q.dtype),
                           torch.from_numpy(k_rot.view(np.int16)).view(k.dtype))
    want_gq, want_gk = mine.backward(want_q, want_k)
    np.testing.assert_array_equal(gq.view(np.uint16), want_gq.view(np.uint16))
    np.testing.assert_array_equal(gk.view(np.uint16), want_gk.view(np.uint16))
    if device == "cuda":  # the same bits from the module on the GPU (float16 as a device array)
        if dtype == BF16:
            from conftest import dev
            qd, kd = dev(_numpy_bits(q)), dev(_numpy_bits(k))
        else:
            qd, kd = on(device, _numpy_bits(q)), on(device, _numpy_bits(k))
        gpu_q, gpu_k = nn.RotaryEmbedding(8, device=device)(qd, kd, position_ids=ids.numpy())
        np.testing.assert_array_equal(_u16(gpu_q), q_rot.view(np.uint16))
        np.testing.assert_array_equal(_u16(gpu_k), k_rot.view(np.uint16))


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_16_bit_rotary_against_transformers(name, rng):
    """transformers rotates in the activation's dtype (cos, sin, each product and the sum
    rounded to it); numbapos rounds the float32 rotation once: at most 2 units in the last
    place of the pair's larger input apart, and on average closer to the exact rotation."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    heads, seq, dim = 4, 64, 32
    config = transformers.LlamaConfig(hidden_size=heads * dim, num_attention_heads=heads,
                                      max_position_embeddings=4096)
    theirs_rope = LlamaRotaryEmbedding(config)
    q = _tensor(rng, (2, heads, seq, dim), name, 3.0)
    ids = torch.arange(seq)[None].expand(2, -1) + 1000
    cos, sin = theirs_rope(q, ids)
    theirs, _ = apply_rotary_pos_emb(q, q, cos, sin)
    rope = nn.RotaryEmbedding.from_hf_config(config, float32_angle=True)
    rope.inv_freq = theirs_rope.inv_freq.double().numpy()  # the same float32 cos / sin
    ours = rope(q, position_ids=ids.numpy())
    dtype = ours.dtype
    ours64, theirs64 = ours.astype(np.float64), theirs.double().numpy()
    x = q.double().numpy()
    larger = np.maximum(np.abs(x), np.abs(np.roll(x, dim // 2, axis=-1))).astype(dtype)
    ulps = np.abs(ours64 - theirs64) / np.spacing(larger).astype(np.float64)
    assert ulps.max() <= 2 and (ulps > 0).any()
    # The exact rotation of x by the float32 cos / sin both start from.
    cos32, sin32 = (c.double().numpy() for c in theirs_rope(q.float(), ids))
    halves = np.concatenate([-x[..., dim // 2:], x[..., :dim // 2]], axis=-1)
    exact = x * cos32[:, None] + halves * sin32[:, None]
    assert np.abs(ours64 - exact).mean() < 0.8 * np.abs(theirs64 - exact).mean()


# ---------------------------------------------------------------- tables and loads


@pytest.mark.parametrize("source", ["bfloat16", "float16"])
@pytest.mark.parametrize("target", ["float32", "float64", "bfloat16", "float16"])
def test_load_state_dict_of_a_tensor_is_the_load_of_its_bits(device, source, target, rng):
    t = _tensor(rng, (5, 3), source, 100.0)
    loaded = nn.Embedding(5, 3, dtype=target, device=device)
    loaded.load_state_dict({"weight": t})
    want = nn.Embedding(5, 3, dtype=target, device=device)
    want.load_state_dict({"weight": _numpy_bits(t)})
    got, expected = host(loaded.weight.data), host(want.weight.data)
    assert got.dtype == expected.dtype and got.tobytes() == expected.tobytes()
    # PyTorch's copy_ into the target's dtype, bit for bit
    theirs = torch.empty(5, 3, dtype=getattr(torch, target)).copy_(t)
    np.testing.assert_array_equal(got.view(np.uint8),
                                  _numpy_bits(theirs).view(np.uint8) if target == "bfloat16"
                                  else theirs.numpy().view(np.uint8))


def test_load_state_dict_of_a_bfloat16_device_array(device, rng):
    """What a PyTorch CUDA bfloat16 tensor becomes (a Numba array of bfloat16) loads as
    its host bits do, into a module on either device."""
    if not numbapos.cuda_available():
        pytest.skip("CUDA is not available")
    from conftest import dev

    bits = _numpy_bits(_tensor(rng, (5, 3), "bfloat16", 10.0))
    for target in ("float32", "float16"):
        loaded = nn.Embedding(5, 3, dtype=target, device=device)
        loaded.load_state_dict({"weight": dev(bits)})
        want = nn.Embedding(5, 3, dtype=target, device=device)
        want.load_state_dict({"weight": bits})
        assert host(loaded.weight.data).tobytes() == host(want.weight.data).tobytes()


def test_a_failed_load_of_tensors_changes_nothing(rng):
    emb = nn.Embedding(5, 3, dtype="bfloat16")
    before = emb.weight.data.copy()
    with pytest.raises(ValueError, match=r"'weight' has shape \(4, 3\)"):
        emb.load_state_dict({"weight": _tensor(rng, (4, 3), "bfloat16")})
    with pytest.raises(TypeError, match="requires grad"):
        emb.load_state_dict({"weight": _tensor(rng, (5, 3), "bfloat16").requires_grad_()})
    assert emb.weight.data.tobytes() == before.tobytes()


@pytest.mark.parametrize("name, dtype", HALVES)
def test_from_pretrained_keeps_the_tensors_memory(name, dtype, rng):
    t = _tensor(rng, (6, 4), name)
    emb = nn.Embedding.from_pretrained(t, freeze=False)
    assert emb.weight.dtype == dtype
    assert np.shares_memory(emb.weight.data.view(np.uint16), t.view(torch.int16).numpy())
    ids = np.array([[5, 0], [2, 2]])
    mine = nn.Embedding.from_pretrained(_numpy_bits(t).copy())
    assert emb(ids).tobytes() == mine(ids).tobytes()
    np.testing.assert_array_equal(emb(ids), torch.nn.functional.embedding(
        torch.from_numpy(ids), t).float().numpy())


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_quantising_16_bit_tables_and_pytorch_embeddings(name, bits, rng):
    table = _tensor(rng, (7, 6), name)
    want = ref.quantize_rowwise(table.float().numpy(), bits)
    assert F.quantize_rowwise(table, bits).tobytes() == want.tobytes()
    theirs = torch.nn.Embedding(7, 6, padding_idx=3).to(getattr(torch, name))  # requires grad
    quantised = nn.QuantizedEmbedding.from_float(theirs, bits=bits)
    assert quantised.padding_idx == 3
    assert quantised.packed.tobytes() == ref.quantize_rowwise(
        theirs.weight.detach().float().numpy(), bits).tobytes()
    ours = nn.Embedding.from_pretrained(table)
    assert nn.QuantizedEmbedding.from_float(ours, bits).packed.tobytes() == want.tobytes()


# ---------------------------------------------------------------- PyTorch CUDA tensors


def test_cuda_tensors_take_the_same_path_through_their_int16_view(rng):
    """A CUDA tensor is adopted through ``t.view(torch.int16)`` and Numba's
    ``as_cuda_array`` (no copy), then viewed as bfloat16: the GPU's twin of the
    CPU path. Needs a GPU and a CUDA build of PyTorch (the simulator cannot adopt
    another library's memory)."""
    if numbapos._device.simulator_enabled() or not torch.cuda.is_available() \
            or not numbapos.cuda_available():
        pytest.skip("needs a GPU, numba-cuda and a CUDA build of PyTorch")
    t = _tensor(rng, (2, 3, 5, 8), "bfloat16").cuda()
    adopted = _checks.as_array(t, "t")
    assert numbapos.device_of(adopted) == "cuda" and adopted.dtype == BF16
    cpu_bits = _numpy_bits(t.cpu())
    np.testing.assert_array_equal(numbapos.to_host(t).view(np.uint16), cpu_bits.view(np.uint16))
    inv_freq, _ = F.rope_frequencies(8)
    got = F.apply_rotary(t, 3, inv_freq)
    np.testing.assert_array_equal(_u16(got), F.apply_rotary(cpu_bits, 3, inv_freq).view(np.uint16))
    table = _tensor(rng, (5, 3), "bfloat16").cuda()
    emb = nn.Embedding(5, 3)
    emb.load_state_dict({"weight": table})
    np.testing.assert_array_equal(emb.weight.data, table.float().cpu().numpy())
    on_gpu = nn.Embedding.from_pretrained(table)
    assert numbapos.device_of(on_gpu.weight.data) == "cuda" and on_gpu.weight.dtype == BF16
    np.testing.assert_array_equal(host(on_gpu([4, 0])), emb([4, 0]))
    assert nn.QuantizedEmbedding.from_float(table).packed.copy_to_host().tobytes() == \
        ref.quantize_rowwise(table.float().cpu().numpy(), 8).tobytes()
