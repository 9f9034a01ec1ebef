"""Array inputs of other libraries: PyTorch CPU tensors, DLPack and __array__ objects.

Every array input goes through one conversion (``_checks.as_array``): CPU
arrays NumPy can view are used without a copy, results are NumPy arrays, a
tensor that requires grad is refused with a hint to ``.detach()``, and errors
name the full type of a foreign object.
"""

import numpy as np
import pytest

import numbapos
from numbapos import functional as F
from numbapos import nn

torch = pytest.importorskip("torch")

FLOATS = [torch.float32, torch.float64]
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


class DLPackOnly:
    """A CPU array that only speaks DLPack (as JAX or CuPy host arrays may)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


class ArrayOnly:
    """An object with only ``__array__``."""

    def __init__(self, array):
        self._array = array

    def __array__(self, dtype=None, copy=None):
        return self._array


def _np_dtype(tdtype):
    return torch.empty(0, dtype=tdtype).numpy().dtype


@pytest.mark.parametrize("tdtype", FLOATS)
def test_float_tensors_into_functional_ops(tdtype, rng):
    dtype = _np_dtype(tdtype)
    table = rng.standard_normal((7, 4)).astype(dtype)
    x = rng.standard_normal((2, 3, 4)).astype(dtype)
    tt, tx = torch.from_numpy(table), torch.from_numpy(x)
    ids = np.array([[1, 2, 6]])
    checks = [
        (F.embedding(ids, tt), F.embedding(ids, table)),
        (F.layer_norm(tx, torch.ones(4, dtype=tdtype)), F.layer_norm(x, np.ones(4, dtype))),
        (F.dropout(tx, 0.5, 3), F.dropout(x, 0.5, 3)),
        (F.add_positional(tx, tt), F.add_positional(x, table)),
        (F.embedding_backward(tx, torch.tensor([[1, 2, 6], [0, 0, 1]]), 7),
         F.embedding_backward(x, np.array([[1, 2, 6], [0, 0, 1]]), 7)),
    ]
    for got, want in checks:
        assert type(got) is np.ndarray and got.dtype == dtype
        np.testing.assert_array_equal(got, want)
    out = torch.empty(1, 3, 4, dtype=tdtype)
    F.embedding(ids, tt, out=out)  # an out tensor is written in place
    np.testing.assert_array_equal(out.numpy(), table[ids])


@pytest.mark.parametrize("tdtype", FLOATS)
@pytest.mark.parametrize("make", [
    lambda dt: nn.LayerNorm(4, dtype=dt),
    lambda dt: nn.Dropout(0.5, seed=1),
    lambda dt: nn.SinusoidalPosEmbedding(),
    lambda dt: nn.LearnedPosEmbedding(3, 4, dtype=dt, seed=0),
    lambda dt: nn.PositionalEmbedding(3, 4, type="learnable_mult_addition", dtype=dt, seed=0),
], ids=["LayerNorm", "Dropout", "Sinusoidal", "Learned", "NeoML"])
def test_float_tensors_into_modules(tdtype, make, rng):
    dtype = _np_dtype(tdtype)
    x = rng.standard_normal((2, 3, 4)).astype(dtype)
    g = rng.standard_normal((2, 3, 4)).astype(dtype)
    ours, ref = make(dtype), make(dtype)
    y = ours(torch.from_numpy(x))
    assert type(y) is np.ndarray
    np.testing.assert_array_equal(y, ref(x))
    gx = ours.backward(torch.from_numpy(g))
    assert type(gx) is np.ndarray
    np.testing.assert_array_equal(gx, ref.backward(g))


@pytest.mark.parametrize("tdtype", INTS)
def test_integer_tensors_as_ids_everywhere(tdtype, rng):
    ids = rng.integers(0, 5, (2, 3))
    tids = torch.from_numpy(ids).to(tdtype)
    grad = torch.ones(2, 3, 4)
    for make, extra in [
        (lambda: nn.Embedding(6, 4, seed=0), {}),
        (lambda: nn.GPT2Embeddings(6, 8, 4, seed=0),
         {"attention_mask": torch.ones(2, 3, dtype=tdtype)}),
        (lambda: nn.BertEmbeddings(6, 4, 8, 2, seed=0),
         {"token_type_ids": torch.zeros(2, 3, dtype=tdtype),
          "position_ids": torch.arange(3, dtype=tdtype)}),
    ]:
        ours, ref = make(), make()
        numpy_extra = {k: v.numpy() for k, v in extra.items()}
        y = ours(tids, **extra)
        assert type(y) is np.ndarray
        np.testing.assert_array_equal(y, ref(ids, **numpy_extra))
        ours.backward(grad)
        ref.backward(grad.numpy())
        for (name, p), q in zip(ours.named_parameters(), ref.parameters(), strict=True):
            np.testing.assert_array_equal(np.asarray(p.grad), np.asarray(q.grad), err_msg=name)
    np.testing.assert_array_equal(F.padding_mask(tids, 0), ids != 0)


def test_float_tensor_ids_are_refused():
    with pytest.raises(TypeError, match="expected integer indices.*float32"):
        nn.Embedding(4, 2)(torch.tensor([1.0]))


def test_requires_grad_tensors_get_a_detach_hint():
    weight = torch.nn.Parameter(torch.ones(4, 2))
    with pytest.raises(TypeError, match=r"torch\.nn\.parameter\.Parameter that requires "
                                        r"grad.*\.detach\(\)"):
        F.embedding(np.array([1]), weight)
    with pytest.raises(TypeError, match=r"embeddings: got a torch\.nn\.parameter\.Parameter"):
        nn.Embedding.from_pretrained(weight)
    with pytest.raises(TypeError, match=r"x: got a torch\.Tensor that requires grad"):
        nn.LayerNorm(2)(torch.ones(3, 2, requires_grad=True))
    e = nn.Embedding.from_pretrained(weight.detach())
    assert np.shares_memory(e.weight.data, weight.detach().numpy())


def test_other_protocols_dlpack_and_array(rng):
    x = rng.standard_normal((2, 4)).astype(np.float32)
    for wrapped in (DLPackOnly(x), ArrayOnly(x)):
        np.testing.assert_array_equal(F.layer_norm(wrapped, None), F.layer_norm(x, None))
    ids = np.array([0, 3])
    np.testing.assert_array_equal(F.embedding(DLPackOnly(ids), x.T.copy()), x.T[ids])


def test_foreign_objects_are_named_by_full_type():
    with pytest.raises(TypeError, match=r"x: cannot view the torch\.Tensor .*meta"):
        F.layer_norm(torch.ones(2, 2, device="meta"), None)
    with pytest.raises(TypeError, match=r"weight: expected .*got collections\.OrderedDict"):
        F.embedding(np.array([0]), __import__("collections").OrderedDict())
    with pytest.raises(TypeError, match="state: expected a mapping|got list"):
        nn.Embedding(2, 2).load_state_dict([1])


def test_parameter_inputs(rng):
    source = nn.Embedding(5, 3, seed=0)
    tied = nn.Embedding.from_pretrained(source.weight, freeze=False)
    assert tied.weight.data is source.weight.data
    np.testing.assert_array_equal(F.embedding(np.array([1]), source.weight),
                                  source.weight.data[[1]])
    assert nn.Parameter(source.weight).data is source.weight.data


@pytest.mark.parametrize("tdtype", FLOATS)
def test_from_pretrained_keeps_dtype_and_memory_like_pytorch(tdtype):
    table = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=tdtype)
    ours = nn.Embedding.from_pretrained(table)
    theirs = torch.nn.Embedding.from_pretrained(table)
    assert ours.weight.dtype == _np_dtype(theirs.weight.dtype)
    assert np.shares_memory(ours.weight.data, table.numpy())
    np.testing.assert_array_equal(ours(torch.tensor([0, 1])), theirs(torch.tensor([0, 1])))


def test_from_pretrained_lists_become_float32_and_other_dtypes_are_refused():
    assert nn.Embedding.from_pretrained([[1.0, 2.0]]).weight.dtype == np.float32
    # (float16 and bfloat16 tensors are viewed as 16-bit tables: tests/ops/test_half.py)
    for table in (torch.ones(2, 2, dtype=torch.int64), np.ones((2, 2), np.int32)):
        with pytest.raises(TypeError, match="embeddings: expected dtype float32, float64, "
                                            "bfloat16 or float16"):
            nn.Embedding.from_pretrained(table)
    with pytest.raises(ValueError, match="embeddings: expected a 2-D array"):
        nn.Embedding.from_pretrained(torch.ones(3))


def test_device_arrays_are_unchanged_by_the_conversion():
    # CUDA arrays keep their own path (tests/cuda/test_devices.py covers them on both devices).
    x = np.ones((2, 3), np.float32)
    assert numbapos._checks.as_array(x, "x") is x
    assert numbapos.device_of(numbapos._checks.as_array(torch.ones(2), "x")) == "cpu"


def test_checkpoint_helpers_take_tensors(tmp_path):
    block = nn.GPT2Embeddings(9, 6, 4, seed=0)
    tensors = {k: torch.from_numpy(v.copy()) for k, v in block.state_dict().items()}
    rebuilt = nn.GPT2Embeddings.from_hf_state_dict(tensors)
    np.testing.assert_array_equal(rebuilt.wte.weight.data, block.wte.weight.data)
    pytest.importorskip("safetensors")
    numbapos.io.save_state(tensors, tmp_path / "t.safetensors")
    loaded = numbapos.io.load_state(tmp_path / "t.safetensors")
    np.testing.assert_array_equal(loaded["wpe.weight"], block.wpe.weight.data)
