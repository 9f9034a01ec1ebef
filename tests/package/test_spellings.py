"""PyTorch's device and dtype spellings: "cuda:N", torch.device, torch dtypes, dtype names.

Every place that takes a device or a dtype goes through ``_device.check_device``
and ``_checks.check_float_dtype``; ``Module.to`` tells a device from a dtype by
what the argument is. The CUDA cases run on Numba's CUDA simulator.
"""

import subprocess
import sys

import numpy as np
import pytest

import numbapos
from numbapos import _checks, _device, nn
from numbapos import functional as F

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("spelling", ["cpu", "cpu:0", torch.device("cpu")])
def test_cpu_spellings(spelling):
    assert _device.check_device(spelling) == "cpu"
    emb = nn.Embedding(3, 2, device=spelling)
    assert emb.device == "cpu" and isinstance(emb.weight.data, np.ndarray)


@pytest.mark.parametrize("spelling", ["cuda", "cuda:0", torch.device("cuda"),
                                      torch.device("cuda", 0)])
def test_cuda_spellings_on_the_current_device(spelling):
    assert _device.check_device(spelling) == "cuda"
    emb = nn.Embedding(3, 2, device=spelling)
    assert emb.device == "cuda"
    assert numbapos.device_of(numbapos.to_device(np.ones(2), spelling)) == "cuda"


@pytest.mark.parametrize("spelling", ["cuda:1", torch.device("cuda", 3)])
def test_another_cuda_device_is_refused_with_the_way_out(spelling):
    with pytest.raises(ValueError, match=r"device: got .*current CUDA device, cuda:0.*"
                                         r"select_device"):
        nn.Embedding(3, 2, device=spelling)


@pytest.mark.parametrize("spelling, error, message", [
    ("gpu", ValueError, "device: expected 'cpu' or 'cuda', got 'gpu'"),
    ("cuda:x", ValueError, "device: expected 'cpu' or 'cuda', got 'cuda:x'"),
    ("cpu:1", ValueError, "device: expected 'cpu' or 'cpu:0', got 'cpu:1'"),
    (torch.device("meta"), ValueError, "device: expected 'cpu' or 'cuda', got device"),
    (0, TypeError, "device: expected 'cpu' or 'cuda', got int 0"),
])
def test_bad_devices_name_the_device(spelling, error, message):
    with pytest.raises(error, match=message):
        nn.Embedding(3, 2, device=spelling)


@pytest.mark.parametrize("spelling, want", [
    (np.float64, np.float64), (np.dtype("float32"), np.float32), ("float64", np.float64),
    ("f4", np.float32), ("double", np.float64), (torch.float64, np.float64),
    (torch.float32, np.float32), (torch.double, np.float64),
])
def test_dtype_spellings(spelling, want):
    assert _checks.check_float_dtype(spelling) == np.dtype(want)
    assert nn.Embedding(3, 2, dtype=spelling).weight.dtype == want
    table = F.sinusoidal_pos_embedding(4, 6, dtype=spelling, device=torch.device("cpu"))
    assert table.dtype == want


@pytest.mark.parametrize("spelling, message", [
    (torch.int8, "dtype: expected float32, float64, bfloat16 or float16, got torch.int8"),
    (torch.int64, "dtype: expected float32, float64, bfloat16 or float16, got torch.int64"),
    ("float", "ambiguous"),
    ("cuda", "dtype: expected float32, float64, bfloat16 or float16, got the device 'cuda'"),
    (torch.device("cpu"), "dtype: expected float32, float64, bfloat16 or float16, got the device"),
    ("int32", "dtype: expected float32, float64, bfloat16 or float16, got int32"),
    ("nonsense", "dtype: expected float32, float64, bfloat16 or float16, got 'nonsense'"),
])
def test_bad_dtypes_name_the_dtype(spelling, message):
    with pytest.raises(TypeError, match=message):
        nn.Embedding(3, 2, dtype=spelling)


def test_functional_ops_that_create_arrays_take_the_spellings():
    want = F.dropout_mask((3, 4), 0.5, seed=1)
    got = F.dropout_mask((3, 4), 0.5, seed=1, device=torch.device("cuda", 0))
    assert numbapos.device_of(got) == "cuda"
    np.testing.assert_array_equal(numbapos.to_host(got), want)
    table = F.sinusoidal_pos_embedding(4, 6, device="cuda:0", dtype=torch.float64)
    assert numbapos.device_of(table) == "cuda" and table.dtype == np.float64
    with pytest.raises(ValueError, match="device: got 'cuda:1'"):
        F.dropout_mask((3, 4), 0.5, seed=1, device="cuda:1")


def test_sharded_embedding_takes_torch_dtypes():
    from numbapos.distributed import ShardedEmbedding

    table = ShardedEmbedding(5, 2, 2, dtype=torch.float64, optimizer_kwargs={"lr": 0.1},
                             backend="local")
    assert table.dtype == np.float64
    assert table.to_embedding().weight.dtype == np.float64


def test_the_reported_bugs():
    # Each of these raised before: a torch.device taken for a dtype, "cuda:0" and
    # torch.float64 refused, a dtype name taken for a device.
    assert nn.Embedding(3, 2, device=torch.device("cpu")).device == "cpu"
    assert nn.Embedding(3, 2, device="cuda:0").device == "cuda"
    assert nn.Embedding(3, 2, dtype=torch.float64).weight.dtype == np.float64
    emb = nn.Embedding(3, 2)
    assert emb.to("float64") is emb and emb.weight.dtype == np.float64


def test_to_tells_devices_from_dtypes():
    emb = nn.Embedding(4, 3, seed=0)
    want = emb.weight.data.astype(np.float64)
    emb.to(torch.device("cuda"), torch.float64)
    assert emb.device == "cuda" and emb.weight.dtype == np.float64
    emb.to(torch.float32, "cpu")  # either order, as PyTorch
    assert emb.device == "cpu" and emb.weight.dtype == np.float32
    emb.to("cuda:0", dtype="float64")
    np.testing.assert_array_equal(numbapos.to_host(emb.weight.data), want)
    emb.to(device=torch.device("cpu"), dtype=np.float32)
    assert emb.device == "cpu" and emb.weight.dtype == np.float32


def test_cpu_cuda_float_double():
    block = nn.BertEmbeddings(10, 4, max_position_embeddings=6, type_vocab_size=2, seed=1)
    assert block.double() is block
    assert {p.dtype for p in block.parameters()} == {np.dtype(np.float64)}
    assert block.cuda() is block and block.device == "cuda"
    assert {p.device for p in block.parameters()} == {"cuda"}
    block.cpu().float()
    assert block.device == "cpu"
    assert {p.dtype for p in block.parameters()} == {np.dtype(np.float32)}
    assert block.cuda(0).device == "cuda"
    assert block.cuda(torch.device("cuda:0")).device == "cuda"
    with pytest.raises(ValueError, match="device: got 'cuda:2'"):
        block.cuda(2)
    with pytest.raises(ValueError, match="cuda\\(\\) expects a CUDA device"):
        block.cuda("cpu")


@pytest.mark.parametrize("args, kwargs, error, message", [
    (("gpu",), {}, ValueError, "to: expected a device .* or a dtype .*, got 'gpu'"),
    (("cuda:7",), {}, ValueError, "device: got 'cuda:7'"),
    ((torch.int64,), {}, TypeError,
     "dtype: expected float32, float64, bfloat16 or float16, got torch.int64"),
    ((), {"dtype": "cpu"}, TypeError, "dtype: .*got the device 'cpu'"),
    ((), {"device": np.float64}, TypeError, "device: expected 'cpu' or 'cuda'"),
    (("cpu", "cuda"), {}, TypeError, "to: got two devices"),
    ((np.float32, "float64"), {}, TypeError, "to: got two dtypes"),
    (("cpu",), {"device": "cpu"}, TypeError, "to: got two devices"),
    (("cpu", np.float32, np.float64), {}, TypeError, "at most a device and a dtype"),
])
def test_to_errors_change_nothing(args, kwargs, error, message):
    emb = nn.Embedding(4, 3, seed=0)
    before = emb.weight.data
    with pytest.raises(error, match=message):
        emb.to(*args, **kwargs)
    assert emb.weight.data is before and emb.device == "cpu" and before.dtype == np.float32


def test_spellings_do_not_import_torch():
    code = ("import sys, numpy as np\n"
            "from numbapos import nn\n"
            "e = nn.Embedding(3, 2, device='cpu:0', dtype='float64').to('cpu', np.float32)\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)
