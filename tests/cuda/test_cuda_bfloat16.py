"""bfloat16 tables on CUDA (Numba's simulator without a GPU): the CPU's bits.

A bfloat16 table on the GPU is a Numba device array of dtype ``ml_dtypes.bfloat16``;
kernels get its ``uint16`` view. Checked here against the same calls on the CPU, bit
for bit: moves to and from the device, modules, ``state_dict`` / ``load_state_dict``,
checkpoints, lookups, max-norm, the backwards, every optimiser (dense, sparse, fused
into the backward, a bfloat16 momentum, a captured step) with stochastic rounding,
the GPT-2 block (the BERT block against its float32 twin on the widened tables, on
the GPU: its LayerNorm sums in the GPU's order for any dtype), and the errors for
bfloat16 arrays where float32 is needed.

The simulator would run a kernel given a bfloat16 array (in Python, with ml_dtypes'
arithmetic), which a GPU's Numba cannot compile: every test here fails such a
launch (``no_bfloat16_launch``). The last test runs the ops through numbapos's real
CUDA host path and Numba's typing, against the stub driver of tests/hostcost.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import host
from numba import cuda

import numbapos
from numbapos import functional as F
from numbapos import io, nn, optim
from numbapos.sparse import SparseRows

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)

pytestmark = [
    pytest.mark.skipif(not numbapos.cuda_available(), reason="needs CUDA or its simulator"),
    # The simulator evaluates the uint64 hashes on NumPy scalars, which warn on wrap-around.
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

V, D = 11, 4
IDS = np.array([[1, 4, 4, 0], [7, 4, 10, 1]])


def _bfloat16_in(arg) -> bool:
    if getattr(getattr(arg, "dtype", None), "name", None) == "bfloat16":
        return True
    return isinstance(arg, tuple) and any(map(_bfloat16_in, arg))  # numbapos._args records


@pytest.fixture(autouse=True)
def no_bfloat16_launch(monkeypatch):
    """On the simulator, a kernel launched with a bfloat16 array (also inside a record)
    fails the test."""
    if not numbapos._device.simulator_enabled():
        return  # a GPU's Numba refuses such a launch itself
    from numba.cuda.simulator import kernel as simulator

    launch = simulator.FakeCUDAKernel.__call__

    def checked(self, *args):
        if not self._device and not simulator._kernel_context:
            assert not any(map(_bfloat16_in, args)), \
                f"{self.fn.__qualname__} was launched with a bfloat16 array"
        return launch(self, *args)

    monkeypatch.setattr(simulator.FakeCUDAKernel, "__call__", checked)


@cuda.jit
def _copy(src, dst):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = src[i]


def _bits(x):
    """A host copy's bytes (a SparseRows gradient's dense form), for bit-for-bit equality."""
    if isinstance(x, SparseRows):
        x = x.to_dense()
    x = host(x)
    return x.dtype, x.shape, x.tobytes()


def _table(seed=0, shape=(V, D), scale=1.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(BF16)


def _on(device, x):
    return numbapos.to_device(x, device)


# ------------------------------------------------------------------ arrays


@pytest.mark.skipif(not numbapos._device.simulator_enabled(), reason="the simulator's check")
def test_a_launch_with_a_bfloat16_array_fails_the_test():
    table = numbapos.to_device(np.ones(4, BF16), "cuda")
    out = numbapos.to_device(np.zeros(4, np.uint16), "cuda")
    _copy[1, 4](table.view(np.uint16), out)
    assert _bits(out) == _bits(np.ones(4, BF16).view(np.uint16))
    with pytest.raises(AssertionError, match="_copy was launched with a bfloat16 array"):
        _copy[1, 4](table, table)


def test_to_device_and_to_host_keep_every_bit_pattern():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(BF16).reshape(256, 256)
    on_gpu = numbapos.to_device(every, "cuda")
    assert numbapos.device_of(on_gpu) == "cuda" and on_gpu.dtype == BF16
    assert on_gpu.shape == every.shape
    back = numbapos.to_host(on_gpu)
    assert back.dtype == BF16 and back.tobytes() == every.tobytes()  # NaNs included
    assert host(on_gpu.view(np.uint16)).tobytes() == every.tobytes()
    assert numbapos.to_device(on_gpu, "cuda") is on_gpu
    assert numbapos.to_device(on_gpu, "cpu").tobytes() == every.tobytes()
    for x in (every[3:9:2, 5::7], np.array(1.5, BF16), np.zeros((0, 3), BF16)):
        got = numbapos.to_host(numbapos.to_device(x, "cuda"))
        assert (got.dtype, got.shape, got.tobytes()) == (BF16, x.shape, x.tobytes())
    copied = numbapos._device.copy(on_gpu)
    assert copied.dtype == BF16 and numbapos.to_host(copied).tobytes() == every.tobytes()


@pytest.mark.parametrize("value", [0, -0.0, 1, 0.1, -3.25, np.inf])
def test_filled_device_arrays_hold_the_values_bits(value):
    want = np.full((3, 5), value, BF16)
    for made in (numbapos._device.full((3, 5), value, BF16, "cuda"),
                 numbapos._device.zeros((3, 5), BF16, "cuda")
                 if value == 0 and not np.signbit(value) else None):
        if made is not None:
            assert made.dtype == BF16 and _bits(made) == _bits(want)


def test_pytorch_bfloat16_tensors_go_to_the_device_as_their_bits():
    torch = pytest.importorskip("torch")
    t = torch.linspace(-3, 3, 24).reshape(4, 6).to(torch.bfloat16)
    got = numbapos.to_device(t, "cuda")
    assert got.dtype == BF16
    np.testing.assert_array_equal(host(got).view(np.uint16), t.view(torch.int16).numpy()
                                  .view(np.uint16))


def test_a_bfloat16_device_array_goes_to_pytorch_without_a_copy():
    """The route gpu.rst gives: the int16 view through ``__cuda_array_interface__``."""
    torch = pytest.importorskip("torch")
    if numbapos._device.simulator_enabled() or not torch.cuda.is_available():
        pytest.skip("needs a GPU and PyTorch with CUDA")
    table = numbapos.to_device(_table(), "cuda")
    tensor = torch.as_tensor(table.view(np.int16), device="cuda").view(torch.bfloat16)
    assert tensor.data_ptr() == table.device_ctypes_pointer.value
    np.testing.assert_array_equal(tensor.view(torch.int16).cpu().numpy().view(np.uint16),
                                  _table().view(np.uint16))
    again = numbapos._device.adopt(tensor)  # and back, still the same memory
    assert again.dtype == BF16 and again.device_ctypes_pointer.value == tensor.data_ptr()


# ------------------------------------------------------------------ functional ops


@pytest.mark.parametrize("kwargs", [dict(), dict(out_dtype=np.float32), dict(out_dtype=BF16),
                                    dict(padding_idx=4), dict(out_dtype=BF16, padding_idx=-1)],
                         ids=str)
def test_lookups_give_the_cpu_bits(kwargs):
    table = _table()
    want = F.embedding(IDS, table, **kwargs)
    got = F.embedding(_on("cuda", IDS), _on("cuda", table), **kwargs)
    assert numbapos.device_of(got) == "cuda" and _bits(got) == _bits(want)
    out = _on("cuda", np.full(IDS.shape + (D,), np.nan, want.dtype))
    assert F.embedding(_on("cuda", IDS), _on("cuda", table), out=out, **kwargs) is out
    assert _bits(out) == _bits(want)


@pytest.mark.parametrize("norm_type", [2.0, 1.0])
def test_max_norm_clips_the_table_as_the_cpu(norm_type):
    table, gpu = _table(scale=3.0), _on("cuda", _table(scale=3.0))
    want = F.embedding(IDS, table, max_norm=1.5, norm_type=norm_type)
    got = F.embedding(_on("cuda", IDS), gpu, max_norm=1.5, norm_type=norm_type)
    assert _bits(got) == _bits(want)
    assert _bits(gpu) == _bits(table) and _bits(table) != _bits(_table(scale=3.0))


def test_widening_and_rounded_stores_give_the_cpu_bits():
    rows = np.array([0, 3, 9])
    values = np.random.default_rng(3).standard_normal((V, D)).astype(np.float32)
    assert _bits(F.widen_table(_on("cuda", _table()))) == _bits(F.widen_table(_table()))
    wide = host(F.widen_table(_on("cuda", _table()), rows=_on("cuda", rows)))
    np.testing.assert_array_equal(wide[rows], _table()[rows].astype(np.float32))
    for kwargs in (dict(seed=5, step=7), dict(stochastic_rounding=False), dict(rows=rows)):
        table, gpu = _table(), _on("cuda", _table())
        F.store_rounded_(table, values, **kwargs)
        gpu_kwargs = {k: _on("cuda", v) if k == "rows" else v for k, v in kwargs.items()}
        assert F.store_rounded_(gpu, _on("cuda", values), **gpu_kwargs) is gpu
        assert _bits(gpu) == _bits(table)


def test_rotary_bfloat16_activations_give_the_cpu_bits():
    q = (np.random.default_rng(4).standard_normal((1, 2, 3, 8)) * 2).astype(BF16)
    ids = np.array([[0, 5, 2]])
    inv_freq = (1.0 / 10000 ** (np.arange(0, 8, 2) / 8)).astype(np.float32)
    for op in (F.apply_rotary, F.apply_rotary_backward):
        want = op(q, ids, inv_freq)
        got = op(_on("cuda", q), _on("cuda", ids), _on("cuda", inv_freq))
        assert want.dtype == BF16 and _bits(got) == _bits(want)


def test_bfloat16_activations_and_gradients_are_refused_as_on_the_cpu():
    table = _on("cuda", _table())
    grad = _on("cuda", np.ones(IDS.shape + (D,), BF16))
    expected = "expected dtype float32 or float64, got bfloat16"
    with pytest.raises(TypeError, match=f"grad_output: {expected}"):
        F.embedding_backward(grad, _on("cuda", IDS), V)
    with pytest.raises(TypeError, match=f"x: {expected}"):
        F.layer_norm(grad, None)
    with pytest.raises(ValueError, match="out: expected shape .* and dtype float32, got .* "
                                         "bfloat16"):
        F.embedding(_on("cuda", IDS), _on("cuda", _table().astype(np.float32)), out=grad)
    module = nn.Embedding.from_pretrained(table, freeze=False)
    module(_on("cuda", IDS))
    with pytest.raises(TypeError, match=f"grad_output: {expected}"):
        module.backward(grad)
    assert module.weight.grad is None and _bits(table) == _bits(_table())


# ------------------------------------------------------------------ modules


def test_modules_are_made_and_moved_with_the_cpus_bits():
    cpu = nn.Embedding(V, D, dtype="bfloat16", seed=2)
    gpu = nn.Embedding(V, D, dtype="bfloat16", seed=2, device="cuda")
    assert gpu.weight.device == "cuda" and _bits(gpu.weight.data) == _bits(cpu.weight.data)
    wide = nn.Embedding(V, D, seed=2)
    rounded = wide.weight.data.astype(BF16)
    for made in (nn.Embedding(V, D, seed=2).to("cuda", "bfloat16"),
                 nn.Embedding(V, D, seed=2, device="cuda").bfloat16()):
        assert made.weight.device == "cuda" and made.weight.dtype == BF16
        assert _bits(made.weight.data) == _bits(rounded)
    assert "device='cuda'" in repr(gpu.weight) and "bfloat16" in repr(gpu.weight)
    assert _bits(gpu.to("cpu").weight.data) == _bits(cpu.weight.data)
    assert isinstance(gpu.weight.data, np.ndarray)
    gpu.to("cuda").float()
    assert gpu.weight.device == "cuda" and _bits(gpu.weight.data) == _bits(
        cpu.weight.data.astype(np.float32))
    loaded = nn.Embedding.from_pretrained(_on("cuda", cpu.weight.data), freeze=False)
    assert loaded.weight.dtype == BF16 and _bits(loaded(_on("cuda", IDS))) == _bits(cpu(IDS))


@pytest.mark.parametrize("sparse", [False, True])
def test_gradients_are_float32_as_on_the_cpu_and_move_with_the_table(sparse):
    grad = np.random.default_rng(1).standard_normal(IDS.shape + (D,)).astype(np.float32)
    grads = {}
    for device in ("cpu", "cuda"):
        module = nn.Embedding(V, D, dtype="bfloat16", seed=2, sparse=sparse, padding_idx=0,
                              scale_grad_by_freq=True, device=device)
        y = module(_on(device, IDS))
        module.backward(_on(device, grad))
        assert y.dtype == np.float32 and module.weight.grad.dtype == np.float32
        assert isinstance(module.weight.grad, SparseRows) == sparse
        grads[device] = module.weight.grad, _bits(y)
        if device == "cuda":
            module.to("cpu")  # the gradient moves too
            moved = module.weight.grad
            assert numbapos.device_of(moved.values if sparse else moved) == "cpu"
            assert _bits(moved) == _bits(grads["cpu"][0])
            module.to("cuda")
            moved = module.weight.grad
            assert numbapos.device_of(moved.values if sparse else moved) == "cuda"
    (want, y_cpu), (got, y_gpu) = grads["cpu"], grads["cuda"]
    assert y_gpu == y_cpu and _bits(got) == _bits(want)
    if sparse:
        assert got.device == "cuda" and got.values.dtype == np.float32
        np.testing.assert_array_equal(host(got.indices), want.indices)
        assert host(got.values).tobytes() == want.values.tobytes()


def test_state_dicts_and_loads_keep_the_bits():
    values = np.random.default_rng(6).standard_normal((V, D)).astype(np.float32)
    rounded = values.astype(BF16)
    gpu = nn.Embedding(V, D, dtype="bfloat16", device="cuda")
    sources = [values, rounded, _on("cuda", rounded)]
    try:
        import torch

        sources.append(torch.from_numpy(values).to(torch.bfloat16))
    except ImportError:
        pass
    for source in sources:
        gpu.load_state_dict({"weight": source})
        assert gpu.weight.device == "cuda"
        assert _bits(gpu.weight.data) == _bits(rounded), type(source)
        state = gpu.state_dict()["weight"]
        assert isinstance(state, np.ndarray) and _bits(state) == _bits(rounded)


def test_checkpoints_are_bf16_tensors_and_load_back_bit_for_bit(tmp_path):
    pytest.importorskip("safetensors")
    gpu = nn.Embedding(V, D, dtype="bfloat16", seed=9, device="cuda")
    path = str(tmp_path / "table.safetensors")
    io.save_state(gpu, path)
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        assert json.loads(f.read(size))["weight"]["dtype"] == "BF16"
    for keep_dtype in (True, False):  # as bfloat16, or widened to float32 (exact)
        loaded = nn.Embedding(V, D, dtype="bfloat16", device="cuda")
        loaded.load_state_dict(io.load_state(path, keep_dtype=keep_dtype))
        assert _bits(loaded.weight.data) == _bits(gpu.weight.data)


# ------------------------------------------------------------------ training

OPTIMISERS = {
    "sgd_momentum": lambda p: optim.SGD(p, lr=0.1, momentum=0.9, seed=3),
    "sgd_bf16_momentum": lambda p: optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True,
                                             momentum_dtype="bfloat16", seed=3),
    "sgd_nearest": lambda p: optim.SGD(p, lr=0.1, weight_decay=0.01,
                                       stochastic_rounding=False),
    "adam": lambda p: optim.Adam(p, lr=0.05, seed=3),
    "adam_bf16_momentum": lambda p: optim.Adam(p, lr=0.05, betas=(0.8, 0.99),
                                               momentum_dtype="bfloat16", seed=3),
    "adamw": lambda p: optim.AdamW(p, lr=0.05, weight_decay=0.1, seed=3),
    "adagrad": lambda p: optim.Adagrad(p, lr=0.1, lr_decay=0.01, seed=3),
    "rowwise_adagrad": lambda p: optim.RowWiseAdagrad(p, lr=0.1, seed=3),
}


def _train(device, make_opt, sparse, fused, steps=2, module=None, opt=None, seed=5):
    """``steps`` steps of a bfloat16 table on ``device``: (module, optimiser, outputs)."""
    if module is None:
        module = nn.Embedding(V, D, dtype="bfloat16", seed=2, sparse=sparse, device=device)
        opt = make_opt(module.parameters())
        if fused:
            opt.fuse_with_backward()
    rng = np.random.default_rng(seed)
    outputs = []
    for _ in range(steps):
        y = module(_on(device, rng.integers(0, V, (2, 3))))
        module.backward(_on(device, rng.standard_normal((2, 3, D)).astype(np.float32)))
        if not fused:
            opt.step()
            opt.zero_grad()
        outputs.append(_bits(y))
    return module, opt, outputs


def _same_state(got: dict, want: dict):
    assert got["param_groups"] == want["param_groups"]
    assert got["state"].keys() == want["state"].keys()
    for key, state in want["state"].items():
        assert got["state"][key].keys() == state.keys()
        for name, value in state.items():
            if isinstance(value, np.ndarray):
                assert _bits(got["state"][key][name]) == _bits(value), name
            else:
                assert got["state"][key][name] == value, name


@pytest.mark.parametrize("fused", [False, True], ids=["step", "fused"])
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("name", sorted(OPTIMISERS))
def test_every_optimiser_trains_a_bfloat16_table_with_the_cpus_bits(name, sparse, fused):
    cpu, cpu_opt, want = _train("cpu", OPTIMISERS[name], sparse, fused)
    gpu, gpu_opt, got = _train("cuda", OPTIMISERS[name], sparse, fused)
    assert got == want
    assert gpu.weight.device == "cuda" and gpu.weight.dtype == BF16
    assert _bits(gpu.weight.data) == _bits(cpu.weight.data)
    assert _bits(gpu.weight.data) != _bits(nn.Embedding(V, D, dtype="bfloat16", seed=2)
                                           .weight.data)
    _same_state(gpu_opt.state_dict(), cpu_opt.state_dict())


@pytest.mark.parametrize("name", ["sgd_bf16_momentum", "adam"])
def test_training_resumes_on_the_gpu_from_the_cpus_checkpoint(name):
    make_opt = OPTIMISERS[name]
    cpu, cpu_opt, _ = _train("cpu", make_opt, True, False)
    gpu = nn.Embedding(V, D, dtype="bfloat16", sparse=True, device="cuda")
    gpu_opt = make_opt(gpu.parameters())
    gpu.load_state_dict(cpu.state_dict())
    gpu_opt.load_state_dict(cpu_opt.state_dict())
    assert all(numbapos.device_of(v) == "cuda" for v in gpu_opt.state[id(gpu.weight)].values()
               if hasattr(v, "dtype") and getattr(v, "ndim", 0))
    _, _, want = _train("cpu", make_opt, True, False, module=cpu, opt=cpu_opt, seed=8)
    _, _, got = _train("cuda", make_opt, True, False, module=gpu, opt=gpu_opt, seed=8)
    assert got == want and _bits(gpu.weight.data) == _bits(cpu.weight.data)
    _same_state(gpu_opt.state_dict(), cpu_opt.state_dict())


def test_a_captured_step_replays_with_the_eager_bits_and_the_cpus():
    batches = np.random.default_rng(12).integers(0, V, (4, 5))
    grad = np.linspace(-1.0, 1.0, 5 * D, dtype=np.float32).reshape(5, D)

    def setup(device):
        module = nn.Embedding(V, D, dtype="bfloat16", seed=4, sparse=True, device=device)
        opt = OPTIMISERS["adam_bf16_momentum"](module.parameters())
        ids, g = _on(device, batches[0].copy()), _on(device, grad)

        def step():
            y = module(ids)
            module.backward(g)
            opt.step()
            module.zero_grad()
            return y

        return module, opt, ids, step

    module, opt, ids, step = setup("cuda")
    captured = numbapos.cuda.capture(step, warmup=1)  # steps batches[0] twice
    outputs = []
    for batch in batches[1:]:
        ids.copy_to_device(batch)
        captured.replay()
        outputs.append(_bits(captured.outputs))
    assert opt.state_dict()["state"][0]["rounding_step"] == len(batches) + 1
    for device in ("cuda", "cpu"):
        twin, twin_opt, twin_ids, twin_step = setup(device)
        expected = []
        for batch in [batches[0], *batches]:
            if device == "cpu":
                twin_ids[...] = batch
            else:
                twin_ids.copy_to_device(batch)
            expected.append(_bits(twin_step()))
        assert outputs == expected[2:], device
        assert _bits(module.weight.data) == _bits(twin.weight.data), device
        _same_state(opt.state_dict(), twin_opt.state_dict())


# ------------------------------------------------------------------ blocks

BV, BD, BP, TV = 12, 6, 10, 3  # vocab, hidden, positions, token types


def test_gpt2_block_with_bfloat16_tables_gives_the_cpus_bits():
    results = {}
    for device in ("cpu", "cuda"):
        block = nn.GPT2Embeddings(BV, BP, BD, embd_pdrop=0.3, seed=0, dtype="bfloat16",
                                  device=device)
        opt = optim.SGD(block.parameters(), lr=0.5, momentum=0.9, seed=3)
        rng = np.random.default_rng(1)
        seen = []
        for kwargs in (dict(past_length=2), dict(position_ids=rng.integers(0, BP, (2, 3)))):
            kwargs = {k: _on(device, v) if isinstance(v, np.ndarray) else v
                      for k, v in kwargs.items()}
            y = block(_on(device, rng.integers(0, BV, (2, 3))), **kwargs)
            block.backward(_on(device, rng.standard_normal((2, 3, BD)).astype(np.float32)))
            seen += [_bits(y), *(_bits(p.grad) for p in block.parameters())]
            opt.step()
            block.zero_grad()
        seen += [_bits(p.data) for p in block.parameters()]
        assert [p.dtype for p in block.parameters()] == [BF16, BF16]
        results[device] = seen
    assert results["cuda"] == results["cpu"]


def test_bert_block_with_bfloat16_tables_is_the_float32_block_on_the_widened_tables():
    def make(dtype):
        block = nn.BertEmbeddings(BV, BD, BP, TV, hidden_dropout_prob=0.3, seed=0,
                                  dtype=dtype, device="cuda")
        block.word_embeddings.sparse = True
        return block

    half, wide = make("bfloat16"), make(np.float32)
    assert half.word_embeddings.weight.device == "cuda"
    assert half.word_embeddings.weight.dtype == BF16 and half.LayerNorm.weight.dtype == np.float32
    params = dict(wide.named_parameters())
    for name, param in half.named_parameters():
        params[name].data = _on("cuda", host(param.data).astype(np.float32))
    rng = np.random.default_rng(2)
    ids, types = rng.integers(0, BV, (2, 3)), rng.integers(0, TV, (2, 3))
    y = half(_on("cuda", ids), token_type_ids=_on("cuda", types), past_length=1)
    assert _bits(y) == _bits(wide(_on("cuda", ids), token_type_ids=_on("cuda", types),
                                  past_length=1))
    probe = _on("cuda", rng.standard_normal((2, 3, BD)).astype(np.float32))
    half.backward(probe)
    wide.backward(probe)
    for name, param in half.named_parameters():
        assert param.grad.dtype == np.float32, name
        assert _bits(param.grad) == _bits(params[name].grad), name
    before = host(half.word_embeddings.weight.data)
    optim.Adam(half.parameters(), lr=0.05, seed=1).step()
    after = host(half.word_embeddings.weight.data)
    assert after.dtype == BF16 and _bits(after) != _bits(before)


def test_blocks_convert_their_tables_to_bfloat16_on_the_gpu():
    on_gpu = nn.GPT2Embeddings(BV, BP, BD, seed=0, device="cuda").bfloat16()
    on_cpu = nn.GPT2Embeddings(BV, BP, BD, seed=0).bfloat16()
    for (name, got), (_, want) in zip(on_gpu.named_parameters(), on_cpu.named_parameters(),
                                      strict=True):
        assert got.device == "cuda" and _bits(got.data) == _bits(want.data), name


# ------------------------------------------------------------------ the real host path

STUB_CODE = r'''
import json
import numpy as np, ml_dtypes
import numbapos
from numbapos import functional as F, nn, optim

BF16 = np.dtype(ml_dtypes.bfloat16)
done, on = [], lambda x: numbapos.to_device(x, "cuda")
bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
table = on(bits.view(BF16).reshape(4096, 16))
done.append(numbapos.to_host(table).view(np.uint16).tobytes() == bits.tobytes())
done.append(numbapos.to_host(numbapos._device.copy(table)).view(np.uint16).tobytes()
            == bits.tobytes())
ids = on(np.array([[1, 2, 2, 9]]))
for kwargs in (dict(), dict(out_dtype=BF16), dict(max_norm=1.0)):
    F.embedding(ids, table, **kwargs)
F.store_rounded_(table, F.widen_table(table), seed=1, step=2)
numbapos._device.zeros((3, 4), BF16, "cuda")
makes = [lambda p: optim.SGD(p, lr=0.1, momentum=0.9, momentum_dtype="bfloat16"),
         lambda p: optim.Adam(p, lr=0.1, momentum_dtype="bfloat16"),
         lambda p: optim.AdamW(p, lr=0.1), lambda p: optim.Adagrad(p, lr=0.1),
         lambda p: optim.RowWiseAdagrad(p, lr=0.1)]
for k, make in enumerate(makes):
    for sparse in (False, True):
        m = nn.Embedding(20, 16, dtype="bfloat16", sparse=sparse, device="cuda", seed=0)
        opt = make(m.parameters())
        if k % 2:
            opt.fuse_with_backward()
        m(ids)
        m.backward(on(np.ones((1, 4, 16), np.float32)))
        if not k % 2:
            opt.step()
start = nn.Embedding(20, 16, dtype="bfloat16", seed=3).weight.data
m = nn.Embedding(20, 16, dtype="bfloat16", seed=3, device="cuda").to("cpu").to("cuda")
done.append(m.state_dict()["weight"].tobytes() == start.tobytes())
for block in (nn.BertEmbeddings(12, 8, 10, 2, seed=0, dtype="bfloat16", device="cuda"),
              nn.GPT2Embeddings(12, 10, 8, seed=0, dtype="bfloat16", device="cuda")):
    block(on(np.array([[1, 2, 3]])))
    block.backward(on(np.ones((1, 3, 8), np.float32)))
    optim.SGD(block.parameters(), lr=0.1).step()
q = on(np.ones((1, 2, 3, 8), BF16))
F.apply_rotary(q, on(np.array([[0, 1, 2]])), on(np.ones(4, np.float32)))
numbapos.synchronize()
print(json.dumps({"bits_kept": done, "launches": numbapos._device.cuda_launches()}))
'''


@pytest.mark.slow
def test_the_real_host_path_never_types_a_bfloat16_array(request, tmp_path_factory):
    """Numba's own launch path (typing, packing) on the stub driver: kernels compile with
    NVVM but do not run, so only the copies' bits are checked."""
    pytest.importorskip("cuda.bindings")
    hostcost = str(Path(__file__).resolve().parent.parent / "hostcost")
    if hostcost not in sys.path:
        sys.path.insert(0, hostcost)
    import stub

    folder = stub.built_for(request, tmp_path_factory)
    found = stub.run("from numba.cuda.cudadrv import nvvm\n"
                     "print(__import__('json').dumps(nvvm.is_available()))", folder)
    if not found:
        pytest.skip("NVVM (the CUDA compiler numba-cuda uses) is not installed")
    result = stub.run(STUB_CODE, folder)
    assert result["bits_kept"] == [True, True, True]
    assert result["launches"] > 40
