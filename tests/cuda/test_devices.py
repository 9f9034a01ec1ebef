"""One API on two devices: every public op and module on the CPU and on CUDA.

Without a GPU the CUDA cases run on Numba's CUDA simulator (set in
conftest.py), so shapes stay tiny. Each test runs the op on ``device`` and
compares it with the NumPy reference or with the CPU result: bit for bit for
pure copies, ordered sums and dropout masks, to a few ulp for reductions.
"""

import ast
import inspect
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import reference as ref
from conftest import host, on
from cuda_counts import deferred_raises

import numbapos
from numbapos import _device, nn, optim
from numbapos import functional as F
from numbapos.kernels import area_names
from numbapos.sparse import SparseRows

ROOT = pathlib.Path(__file__).resolve().parents[2]
AREAS = area_names()  # read from the backends' folders, as the backends read them


def _close(got, want, dtype=np.float64):
    rtol, atol = (2e-5, 2e-6) if np.dtype(dtype) == np.float32 else (1e-12, 1e-12)
    np.testing.assert_allclose(host(got), want, rtol=rtol, atol=atol)


def _on_device(x, device):
    assert _device.device_of(x) == device, f"result on {_device.device_of(x)}, not {device}"


# ------------------------------------------------------------------ the seam


@pytest.mark.parametrize("area", AREAS)
def test_backends_export_the_same_launchers(area):
    import importlib

    cpu = importlib.import_module(f"numbapos.kernels.cpu.{area}")
    gpu = importlib.import_module(f"numbapos.kernels.cuda.{area}")
    assert sorted(cpu.__all__) == sorted(gpu.__all__)
    for name in cpu.__all__:
        a, b = getattr(cpu, name), getattr(gpu, name)
        if callable(a):
            params_a = inspect.signature(a).parameters.values()
            params_b = inspect.signature(b).parameters.values()
            assert [(p.name, p.default) for p in params_a] == \
                   [(p.name, p.default) for p in params_b], name


def test_namespaces_export_the_same_names():
    from numbapos.kernels import cpu, cuda

    assert cpu.__all__ == cuda.__all__


def test_no_kernel_import_outside_kernels_and_device():
    pattern = re.compile(r"^\s*(from|import)\s+[.a-z_]*kernels", re.MULTILINE)
    leaks = [str(p.relative_to(ROOT)) for p in (ROOT / "numbapos").rglob("*.py")
             if "kernels" not in p.parts and p.name != "_device.py"
             and pattern.search(p.read_text())]
    assert leaks == []


# Where a kernel backend may be looked up (numbapos._device.kernels_for / backend): the
# functional ops, the backends, _device itself and the modules that drive the devices
# (streams and captures, the warm-up, the bench, and the command line's `info`, which
# reports the CPU backend's prefetch settings). nn, optim, io, distributed, sparse and
# demo go through numbapos.functional.
BACKEND_USERS = ("numbapos/functional/", "numbapos/kernels/", "numbapos/_device.py",
                 "numbapos/cuda.py", "numbapos/_warmup.py", "numbapos/bench/",
                 "numbapos/__main__.py")
BACKEND_LOOKUPS = frozenset({"kernels_for", "backend"})


def backend_lookups(source: str) -> list[str]:
    """``"line: code"`` of each place ``source`` looks a kernel backend up: ``kernels_for`` /
    ``backend`` read from the ``_device`` module (however it was imported or named) or
    imported from it."""
    tree = ast.parse(source)
    names = {"_device"}  # what the _device module is called here
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if (node.module or "").rpartition(".")[2] == "_device":
                found += [f"{node.lineno}: from {'.' * node.level}{node.module} import {alias.name}"
                          for alias in node.names if alias.name in BACKEND_LOOKUPS]
            else:
                names |= {alias.asname or alias.name for alias in node.names
                          if alias.name == "_device"}
        elif isinstance(node, ast.Import):
            names |= {alias.asname for alias in node.names
                      if alias.name.endswith("._device") and alias.asname}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in BACKEND_LOOKUPS:
            owner = node.value
            owner = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", None)
            if owner in names:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return sorted(found, key=lambda where: int(where.split(":")[0]))


def test_backend_lookups_are_found():
    assert backend_lookups("from .. import _device\nK = _device.backend(x)\n") == \
        ["2: _device.backend"]
    assert backend_lookups("import numbapos\nnumbapos._device.kernels_for('cuda').clock\n") \
        == ["2: numbapos._device.kernels_for"]
    assert backend_lookups("from numbapos import _device as d\nf = d.kernels_for\n") == \
        ["2: d.kernels_for"]
    assert backend_lookups("from .._device import backend as b, to_host\n") == \
        ["1: from .._device import backend"]
    assert backend_lookups("from .. import _device\n_device.to_host(x)\nK.backend(x)\n") == []


def test_only_functional_and_device_modules_look_up_kernel_backends():
    leaks = []
    for path in sorted((ROOT / "numbapos").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if not name.startswith(BACKEND_USERS):
            leaks += [f"{name}:{where}" for where in backend_lookups(path.read_text())]
    assert leaks == [], ("modules above numbapos.functional reach a kernel backend; call a "
                         "functional op instead")


def test_import_does_not_load_numba_cuda():
    code = "import sys, numbapos; print('numba.cuda' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "False"


def test_mixed_devices_raise_type_error_naming_both():
    weight = np.ones((4, 3), np.float32)
    with pytest.raises(TypeError, match="out: is on 'cuda' but weight is on 'cpu'"):
        F.embedding([1, 2], weight, out=on("cuda", np.empty((2, 3), np.float32)))
    with pytest.raises(TypeError, match="arrays on different devices"):
        _device.backend(weight, on("cuda", weight))
    with pytest.raises(TypeError, match="indices: is a CUDA array but the data is on 'cpu'"):
        F.embedding(on("cuda", np.array([1])), weight)


def test_device_argument_is_checked():
    with pytest.raises(ValueError, match="device: expected 'cpu' or 'cuda', got 'gpu'"):
        nn.Embedding(3, 2, device="gpu")
    with pytest.raises(TypeError, match="device: expected 'cpu' or 'cuda'"):
        numbapos.to_device(np.ones(2), 1)


def test_cuda_unavailable_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(_device, "_CUDA_CHECKED", True)
    monkeypatch.setattr(_device, "_CUDA_ERROR", "no CUDA driver or GPU was found")
    assert not numbapos.cuda_available()
    with pytest.raises(RuntimeError, match=r'pip install "numbapos\[cuda\]".*NUMBA_ENABLE_CUDASIM'):
        nn.Embedding(3, 2, device="cuda")


def test_adopt_wraps_cuda_array_interface_objects(monkeypatch):
    """Foreign CUDA arrays go through one function; here with a stand-in object."""
    from numba import cuda

    class StandIn:
        __cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "data": (0, False),
                                    "version": 3}

    wrapped = object()
    monkeypatch.setattr(cuda, "as_cuda_array", lambda x: wrapped, raising=False)
    stand_in = StandIn()
    assert _device.is_cuda_array(stand_in) and _device.device_of(stand_in) == "cuda"
    assert _device.adopt(stand_in) is wrapped
    plain = np.ones(2)
    assert _device.adopt(plain) is plain


def test_a_numpy_numba_cuda_cannot_compile_with_is_named_before_the_first_launch(monkeypatch):
    """numba-cuda 0.30 with NumPy 2.5 (no np.row_stack): one clear error, not an
    AttributeError from inside the first kernel's compilation (seen on an H100 image)."""
    import numba
    import numba_cuda

    from numbapos.kernels import cuda as backend

    def removed(name):
        raise AttributeError("module 'numpy' has no attribute 'row_stack'")

    def other(name):
        raise AttributeError("something else")

    monkeypatch.delattr(np, "row_stack", raising=False)
    monkeypatch.setattr(numba.config, "ENABLE_CUDASIM", 0)
    problem = backend.numpy_incompatibility(removed)
    assert f"numba-cuda {numba_cuda.__version__}" in problem
    assert f"NumPy {np.__version__}" in problem and "numpy<2.5" in problem
    with pytest.raises(AttributeError, match="something else"):
        backend.numpy_incompatibility(other)
    assert backend.numpy_incompatibility(lambda name: None) is None
    monkeypatch.setattr(np, "row_stack", np.vstack, raising=False)
    assert backend.numpy_incompatibility(removed) is None


def test_to_device_and_back(device):
    x = np.arange(6.0).reshape(2, 3)
    y = numbapos.to_device(x, device)
    _on_device(y, device)
    np.testing.assert_array_equal(numbapos.to_host(y), x)
    assert numbapos.to_device(y, device) is y


# ------------------------------------------------------------------ embedding


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_lookup(device, rng, dtype):
    weight = rng.standard_normal((11, 5)).astype(dtype)
    ids = rng.integers(0, 11, (3, 4)).astype(np.int32)
    y = F.embedding(on(device, ids), on(device, weight))
    _on_device(y, device)
    np.testing.assert_array_equal(host(y), weight[ids])
    out = on(device, np.zeros((3, 4, 5), dtype))
    assert F.embedding(ids, on(device, weight), out=out) is out  # host ids are moved
    np.testing.assert_array_equal(host(out), weight[ids])
    np.testing.assert_array_equal(host(F.embedding(on(device, np.array(7)), on(device, weight))),
                                  weight[7])
    assert host(F.embedding(on(device, np.zeros((0, 2), np.int64)),
                            on(device, weight))).shape == (0, 2, 5)


def test_bad_index_raises_index_error_and_device_stays_usable(device):
    weight = on(device, np.ones((4, 3), np.float32))
    for bad, value in (([1, 4, 2], 4), ([0, -1], -1)):
        with deferred_raises(device, IndexError,  # on CUDA: at the next synchronising call
                             f"index {value} .* valid indices are 0 <= index < 4"):
            F.embedding(on(device, np.array(bad)), weight)
    np.testing.assert_array_equal(host(weight), 1.0)  # nothing was written
    np.testing.assert_array_equal(host(F.embedding(on(device, np.array([3])), weight)), 1.0)


def test_renorm_repeated_unsorted_indices_pytorch_case(device, rng):
    # PyTorch's test: a 20 x 64 table, max_norm = 1, indices arange(2) repeated.
    table = rng.standard_normal((20, 64)).astype(np.float32) * 3
    ids = np.tile(np.arange(2), 5)
    expected = table.copy()
    ref.embedding_renorm_(expected, ids, 1.0, 2.0)
    weight = on(device, table)
    y = F.embedding(on(device, ids), weight, max_norm=1.0)
    _close(weight, expected, np.float32)
    _close(y, expected[ids], np.float32)
    np.testing.assert_allclose(np.linalg.norm(host(weight)[:2], axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(host(weight)[2:], table[2:])
    cpu = table.copy()
    F.embedding_renorm_(cpu, ids, 1.0, 2.0)
    np.testing.assert_allclose(host(weight), cpu, rtol=1e-6, atol=0)


@pytest.mark.parametrize("norm_type", [1.0, 2.0, 3.5, np.inf])
def test_renorm_norm_types(device, rng, norm_type):
    table = rng.standard_normal((6, 7)) * 2
    ids = np.array([5, 0, 5, 2])
    expected = table.copy()
    ref.embedding_renorm_(expected, ids, 1.5, norm_type)
    weight = on(device, table)
    assert F.embedding_renorm_(weight, on(device, ids), 1.5, norm_type) is weight
    _close(weight, expected)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("scale", [False, True])
def test_backward_is_the_cpu_result_bit_for_bit(device, rng, sparse, scale):
    ids = rng.integers(0, 9, (4, 6))
    ids[0, :3] = 2  # padding, repeated
    grad = rng.standard_normal((4, 6, 5)).astype(np.float32)
    cpu = F.embedding_backward(grad, ids, 9, padding_idx=2, scale_grad_by_freq=scale,
                               sparse=sparse)
    got = F.embedding_backward(on(device, grad), on(device, ids), 9, padding_idx=2,
                               scale_grad_by_freq=scale, sparse=sparse)
    if sparse:
        assert isinstance(got, SparseRows) and got.device == device
        np.testing.assert_array_equal(host(got.indices), cpu.indices)
        np.testing.assert_array_equal(host(got.values), cpu.values)
        got = got.to_dense()
        cpu = cpu.to_dense()
    _on_device(got, device)
    np.testing.assert_array_equal(host(got), cpu)
    expected = ref.embedding_backward(grad.astype(np.float64), ids, 9, padding_idx=2,
                                      scale_grad_by_freq=scale)
    np.testing.assert_allclose(host(got), expected, rtol=1e-5, atol=1e-6)


def test_padding_mask(device):
    ids = np.array([[0, 3, 0], [1, 2, 0]])
    mask = F.padding_mask(on(device, ids), 0)
    _on_device(mask, device)
    np.testing.assert_array_equal(host(mask), ids != 0)


# ------------------------------------------------------------------ dropout


@pytest.mark.parametrize("p", [0.1, 0.5, 1.0])
def test_dropout_masks_are_bit_identical_to_the_cpu(device, rng, p):
    x = rng.standard_normal((7, 33)).astype(np.float32)
    seed, counter = 2**64 - 5, 12345
    cpu = F.dropout(x, p, seed, counter=counter)
    got = F.dropout(on(device, x), p, seed, counter=counter)
    _on_device(got, device)
    np.testing.assert_array_equal(host(got), cpu)
    mask = F.dropout_mask(x.shape, p, seed, counter=counter, device=device)
    np.testing.assert_array_equal(host(mask), F.dropout_mask(x.shape, p, seed, counter=counter))
    back = F.dropout_backward(on(device, x), p, seed, counter=counter)
    np.testing.assert_array_equal(host(back), cpu)
    inplace = on(device, x)
    assert F.dropout(inplace, p, seed, counter=counter, out=inplace) is inplace
    np.testing.assert_array_equal(host(inplace), cpu)


# ------------------------------------------------------------------ LayerNorm


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_layer_norm(device, rng, dtype):
    x = (rng.standard_normal((5, 37)) * 3 + 10).astype(dtype)
    w = rng.standard_normal(37).astype(dtype)
    b = rng.standard_normal(37).astype(dtype)
    gy = rng.standard_normal((5, 37)).astype(dtype)
    y, mean, rstd = F.layer_norm_forward(on(device, x), on(device, w), on(device, b))
    _on_device(y, device)
    _close(y, ref.layer_norm(x.astype(np.float64), w, b, 1e-5)[0], dtype)
    gx, gw, gb = F.layer_norm_backward(on(device, gy), on(device, x), mean, rstd,
                                       on(device, w), on(device, b))
    cgx, cgw, cgb = F.layer_norm_backward(gy, x, *F.layer_norm_forward(x, w, b)[1:], w, b)
    _close(gx, cgx, dtype)
    _close(gw, cgw, dtype)
    _close(gb, cgb, dtype)
    _, gw, gb = F.layer_norm_backward(on(device, gy), on(device, x), mean, rstd,
                                      on(device, w), on(device, b), output_mask=(False, True))
    assert gw is None and gb is not None


# ------------------------------------------------------------------ positions


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sinusoid_table(device, dtype):
    table = F.sinusoidal_pos_embedding(50, 7, device=device, dtype=dtype, offset=65000)
    _on_device(table, device)
    bound = 1e-6 if dtype == np.float32 else 1e-10
    assert np.max(np.abs(host(table) - ref.sinusoidal_table(50, 7, offset=65000))) <= bound
    out = on(device, np.empty((50, 7), dtype))
    assert F.sinusoidal_pos_embedding(50, 7, out=out, offset=65000) is out


def test_add_positional_and_backward(device, rng):
    x = rng.standard_normal((2, 4, 3))
    table = rng.standard_normal((6, 3))
    y = F.add_positional(on(device, x), on(device, table), offset=2)
    np.testing.assert_array_equal(host(y), x + table[2:6])
    g = F.add_positional_backward(on(device, x), 6, offset=2)
    expected = np.zeros((6, 3))
    expected[2:6] = x[0] + x[1]
    np.testing.assert_array_equal(host(g), expected)
    pos = np.array([5, 0, 5, 1])
    y = F.add_positional(on(device, x), on(device, table), position_ids=pos)
    np.testing.assert_array_equal(host(y), x + table[pos])
    g = F.add_positional_backward(on(device, x), 6, position_ids=pos)
    np.testing.assert_array_equal(host(g), F.add_positional_backward(x, 6, position_ids=pos))
    with deferred_raises(device, IndexError, "position_ids: index 6"):
        F.add_positional(on(device, x), on(device, table), position_ids=[0, 1, 2, 6])


def test_mult_add_and_backward(device, rng):
    x, gy = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    a, b = rng.standard_normal((5, 4)), rng.standard_normal((5, 4))
    y = F.positional_mult_add(on(device, x), on(device, a), on(device, b))
    np.testing.assert_array_equal(host(y), a[:3] * x + b[:3])
    got = F.positional_mult_add_backward(on(device, gy), on(device, x), on(device, a))
    for g, want in zip(got, F.positional_mult_add_backward(gy, x, a), strict=True):
        np.testing.assert_array_equal(host(g), want)


def test_positions_from_padding(device):
    ids = np.array([[0, 0, 7, 8], [7, 8, 0, 9]])
    got = F.positions_from_padding(on(device, ids), 0, past_length=[3, 1])
    np.testing.assert_array_equal(host(got), F.positions_from_padding(ids, 0, past_length=[3, 1]))


# ------------------------------------------------------------------ blocks


def _bert_arrays(rng, V=13, P=9, T=2, D=40):
    return [rng.standard_normal(s) for s in ((V, D), (P, D), (T, D), (D,), (D,))]


def test_bert_block(device, rng):
    arrays = _bert_arrays(rng)
    ids = rng.integers(0, 13, (2, 5))
    types = rng.integers(0, 2, (2, 5))
    kw = dict(token_type_ids=types, p=0.3, seed=7, counter=4, eps=1e-5)
    cpu = F.bert_embeddings_forward(ids, *arrays, **kw)
    got = F.bert_embeddings_forward(on(device, ids), *[on(device, a) for a in arrays], **kw)
    for g, c in zip(got, cpu, strict=True):
        _on_device(g, device)
        _close(g, c)
    gy = rng.standard_normal(cpu[0].shape)
    kw.pop("eps")
    cpu_grads = F.bert_embeddings_backward(gy, ids, *arrays[:3], *cpu[1:], *arrays[3:], **kw,
                                           padding_idx=0, sparse=True)
    grads = F.bert_embeddings_backward(on(device, gy), on(device, ids),
                                       *[on(device, a) for a in arrays[:3]], *got[1:],
                                       *[on(device, a) for a in arrays[3:]], **kw,
                                       padding_idx=0, sparse=True)
    assert isinstance(grads.word_embeddings, SparseRows)
    np.testing.assert_array_equal(host(grads.word_embeddings.indices),
                                  cpu_grads.word_embeddings.indices)
    _close(grads.word_embeddings.values, cpu_grads.word_embeddings.values)
    for g, c in zip(grads[1:], cpu_grads[1:], strict=True):
        _close(g, c)


def test_gpt2_block(device, rng):
    wte, wpe = rng.standard_normal((11, 6)), rng.standard_normal((8, 6))
    ids = rng.integers(0, 11, (2, 3))
    mask = np.array([[0, 1, 1, 1], [1, 1, 1, 0]])
    kw = dict(past_length=1, attention_mask=mask, p=0.5, seed=3, counter=2)
    y = F.gpt2_embeddings(on(device, ids), on(device, wte), on(device, wpe), **kw)
    np.testing.assert_array_equal(host(y), F.gpt2_embeddings(ids, wte, wpe, **kw))
    gy = rng.standard_normal((2, 3, 6))
    got = F.gpt2_embeddings_backward(on(device, gy), on(device, ids), 11, 8, **kw)
    want = F.gpt2_embeddings_backward(gy, ids, 11, 8, **kw)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(host(g), w)


# ------------------------------------------------------------------ SGD and modules


@pytest.mark.parametrize("sparse", [False, True])
def test_embedding_training_matches_the_cpu(device, rng, sparse):
    ids = [rng.integers(0, 10, (3, 4)) for _ in range(3)]
    grads = [rng.standard_normal((3, 4, 6)).astype(np.float32) for _ in range(3)]
    models = []
    for dev in ("cpu", device):
        emb = nn.Embedding(10, 6, padding_idx=1, sparse=sparse, seed=0, device=dev)
        opt = optim.SGD(emb.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                        weight_decay=0.01)
        for step_ids, grad in zip(ids, grads, strict=True):
            emb(on(dev, step_ids))
            emb.backward(on(dev, grad))
            opt.step()
            emb.zero_grad()
        assert emb.device == dev and _device.device_of(emb.weight.data) == dev
        models.append(emb)
    np.testing.assert_array_equal(host(models[1].weight.data), models[0].weight.data)


def test_bert_module_training_step_matches_the_cpu(device, rng):
    ids = rng.integers(0, 20, (2, 4))
    gy = rng.standard_normal((2, 4, 24)).astype(np.float32)
    blocks = []
    for dev in ("cpu", device):
        block = nn.BertEmbeddings(20, 24, 8, 2, hidden_dropout_prob=0.2, seed=1, device=dev)
        opt = optim.SGD(block.parameters(), lr=0.05, momentum=0.5)
        block(ids)
        block.backward(on(dev, gy))
        opt.step()
        blocks.append(block)
    for (name, a), (_, b) in zip(blocks[0].state_dict().items(),
                                 blocks[1].state_dict().items(), strict=True):
        assert isinstance(b, np.ndarray)
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6, err_msg=name)


def test_modules_run_on_the_device(device, rng):
    x = on(device, rng.standard_normal((2, 3, 8)).astype(np.float32))
    for module in (nn.LayerNorm(8, device=device), nn.SinusoidalPosEmbedding(device=device),
                   nn.LearnedPosEmbedding(5, 8, dropout=0.1, seed=0, device=device),
                   nn.PositionalEmbedding(4, 8, type="learnable_mult_addition", seed=0,
                                          device=device),
                   nn.PositionalEmbedding(4, 8, type="transformers", device=device),
                   nn.Dropout(0.5, seed=1, device=device)):
        y = module(x)
        _on_device(y, device)
        _on_device(module.backward(y), device)
        assert module.device == device
        for param in module.parameters():
            assert param.grad is None or _device.device_of(param.grad) == device
    gpt2 = nn.GPT2Embeddings(10, 6, 8, seed=0, device=device)
    y = gpt2(rng.integers(0, 10, (2, 3)))
    gpt2.backward(y)
    _on_device(gpt2.wte.weight.grad, device)


def test_module_to_and_state_dict_round_trip(device, rng):
    cpu_model = nn.BertEmbeddings(12, 8, 6, 2, seed=3)
    state = {k: v.copy() for k, v in cpu_model.state_dict().items()}
    model = nn.BertEmbeddings(12, 8, 6, 2, seed=4).to(device)
    assert model.device == device
    model.load_state_dict(state)  # host arrays into a module on the device
    for name, value in model.state_dict().items():
        assert isinstance(value, np.ndarray)
        np.testing.assert_array_equal(value, state[name])
    ids = rng.integers(0, 12, (2, 3))
    model.eval()
    cpu_model.eval()
    _close(model(ids), cpu_model(ids), np.float32)
    back = model.to("cpu")
    assert back is model and model.device == "cpu"
    assert isinstance(model.word_embeddings.weight.data, np.ndarray)


# ------------------------------------------------------------------ other libraries' arrays


def _real_gpu() -> bool:
    return numbapos.cuda_available() and not _device.simulator_enabled()


def _foreign(lib, array):
    if lib == "cupy":
        cupy = pytest.importorskip("cupy")
        return cupy.asarray(array)
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("PyTorch without CUDA")
    return torch.from_numpy(array).cuda()


@pytest.mark.skipif(not _real_gpu(), reason="needs a real GPU (the simulator adopts no memory)")
@pytest.mark.parametrize("lib", ["cupy", "torch"])
def test_cupy_and_torch_arrays_are_used_in_place(lib, rng):
    table = rng.standard_normal((10, 8)).astype(np.float32) * 3
    weight = _foreign(lib, table)
    ids = _foreign(lib, np.array([[1, 4], [4, 9]]))
    y = F.embedding(ids, weight, max_norm=1.0)  # clips rows 1, 4, 9 of the foreign array
    expected = table.copy()
    ref.embedding_renorm_(expected, np.array([1, 4, 9]), 1.0, 2.0)
    np.testing.assert_allclose(host(y), expected[[[1, 4], [4, 9]]], rtol=1e-6)
    adopted = _device.adopt(weight)
    assert (adopted.__cuda_array_interface__["data"][0]
            == weight.__cuda_array_interface__["data"][0])  # no copy was made
    back = weight.get() if lib == "cupy" else weight.cpu().numpy()
    np.testing.assert_allclose(back, expected, rtol=1e-6)  # written in place
    grad = F.embedding_backward(_foreign(lib, np.ones((2, 2, 8), np.float32)), ids, 10)
    np.testing.assert_array_equal(host(grad)[4], 2.0)


def test_readme_gpu_example_runs_as_written(capsys):
    """The README's GPU example, pasted as is (on the simulator here: device 'cuda')."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### On the GPU"):]
    block = section[section.index("```python") + len("```python"):]
    block = block[:block.index("```")]
    exec(compile(block, "README.md (On the GPU)", "exec"), {})
    device = "cuda" if numbapos.cuda_available() else "cpu"
    assert capsys.readouterr().out.split() == [device, "(1,", "4,", "64)", "(1000,", "64)"]


def test_memory_pool_bucket_sizes():
    from numbapos._gpuhost.memory import bucket_size

    assert bucket_size(1) == 512 and bucket_size(513) == 1024
    assert bucket_size(1 << 20) == 1 << 20
    big = 100 * (1 << 20) + 1
    assert big <= bucket_size(big) <= big * 1.25


@pytest.mark.skipif(not _real_gpu(), reason="the pool manages real device memory")
def test_memory_pool_reuses_blocks_and_empties():
    from numba import cuda

    manager = cuda.current_context().memory_manager
    if not hasattr(manager, "empty_cache"):
        pytest.skip("another memory manager was configured")
    first = cuda.device_array(1000, np.float32)
    address = first.__cuda_array_interface__["data"][0]
    del first
    again = cuda.device_array(1000, np.float32)  # same bucket: the cached block
    assert again.__cuda_array_interface__["data"][0] == address
    again.copy_to_device(np.arange(1000, dtype=np.float32))
    np.testing.assert_array_equal(again.copy_to_host(), np.arange(1000))
    del again
    numbapos.cuda_empty_cache()
    assert manager.pools.cached() == 0


def test_checkpoint_of_a_module_on_the_device(device, tmp_path):
    pytest.importorskip("safetensors")
    from numbapos import io

    model = nn.GPT2Embeddings(9, 5, 4, seed=2, device=device)
    io.save_state(model, tmp_path / "m.safetensors")
    io.save_state({"wte": model.wte.weight.data}, tmp_path / "t.safetensors")  # a device array
    state = io.load_state(tmp_path / "m.safetensors")
    np.testing.assert_array_equal(state["wte.weight"], host(model.wte.weight.data))
    np.testing.assert_array_equal(io.load_state(tmp_path / "t.safetensors")["wte"],
                                  state["wte.weight"])
    other = nn.GPT2Embeddings(9, 5, 4, seed=3, device=device)
    other.load_state_dict(state)
    np.testing.assert_array_equal(host(other.wpe.weight.data), state["wpe.weight"])


def test_to_device_gives_standard_strides_to_size_one_axes():
    # NumPy calls x[None] (stride 0 on the new axis) C-contiguous; a device array keeping
    # that stride is refused as non-contiguous on a real GPU (the simulator hides it).
    x = np.ones((4, 3), np.float32)
    y = numbapos.to_device(x[None], "cuda")
    assert tuple(y.strides) == (48, 12, 4)
    assert numbapos.to_device(np.array(3), "cuda").shape == ()
    np.testing.assert_array_equal(host(F.embedding(np.arange(3)[None], on("cuda", x))), x[:3][None])


def test_is_bfloat16_tells_bfloat16_from_everything_else_every_time():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    for _ in range(2):  # the second answers come from the per-dtype cache
        assert _device.is_bfloat16(bf16)
        assert _device.is_bfloat16(np.zeros(3, bf16))
        assert not _device.is_bfloat16(np.dtype(np.float16))
        assert not _device.is_bfloat16(np.zeros(3, np.float32))
        assert not _device.is_bfloat16(np.dtype([("bfloat16", np.float32)]))
        assert not _device.is_bfloat16("bfloat16")  # a name, not a dtype
        assert _device.is_bfloat16(ml_dtypes.bfloat16)  # the scalar type carries its dtype
        assert not _device.is_bfloat16(None)
