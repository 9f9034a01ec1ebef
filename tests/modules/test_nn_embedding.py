"""Parameter, Module and nn.Embedding.

Tests that run kernels or copy state to a module's device take the ``device``
fixture (conftest): they run on the CPU and on CUDA (Numba's simulator without
a GPU). Module bookkeeping, initialisers and reprs stay on the CPU.
"""

import numpy as np
import pytest
import reference as ref
from conftest import host, on

from numbapos import SparseRows, _device, nn


class TwoTables(nn.Module):
    def __init__(self, device=None):
        super().__init__()
        self.words = nn.Embedding(6, 3, seed=0, device=device)
        self.extra = nn.Embedding(4, 3, seed=1, dtype=np.float64, device=device)
        self.scale = nn.Parameter(on(device or "cpu", np.ones(3, dtype=np.float32)))


# ------------------------------------------------------------------ Module


def test_named_parameters_and_state_dict():
    model = TwoTables()
    names = [name for name, _ in model.named_parameters()]
    assert names == ["scale", "words.weight", "extra.weight"]
    assert len(list(model.parameters())) == 3
    state = model.state_dict()
    assert list(state) == names
    assert state["words.weight"] is model.words.weight.data


def test_load_state_dict_round_trip_in_place(device):
    source, target = TwoTables(), TwoTables(device)  # host arrays into ``device``
    source.words.weight.data[:] = 7.0
    before = target.words.weight.data
    result = target.load_state_dict(source.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert target.words.weight.data is before  # copied in place
    assert _device.device_of(before) == device
    np.testing.assert_array_equal(host(target.words.weight.data), 7.0)
    np.testing.assert_array_equal(host(target.extra.weight.data), source.extra.weight.data)


def test_load_state_dict_errors_change_nothing(device):
    model = TwoTables(device)
    snapshot = {k: v.copy() for k, v in model.state_dict().items()}
    state = {k: v + 1 for k, v in snapshot.items()}
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "extra.weight"'):
        model.load_state_dict({k: v for k, v in state.items() if k != "extra.weight"})
    with pytest.raises(RuntimeError, match='Unexpected key\\(s\\) in state_dict: "bogus"'):
        model.load_state_dict({**state, "bogus": np.zeros(1)})
    with pytest.raises(ValueError, match=r"'words.weight' has shape \(5, 3\)"):
        model.load_state_dict({**state, "words.weight": np.zeros((5, 3), np.float32)})
    with pytest.raises(TypeError, match="'words.weight' has dtype complex128"):
        model.load_state_dict({**state, "words.weight": np.zeros((6, 3), np.complex128)})
    for name, value in model.state_dict().items():
        np.testing.assert_array_equal(value, snapshot[name])


def test_load_state_dict_non_strict_reports(device):
    model = TwoTables(device)
    state = {"scale": np.full(3, 2.0, np.float32), "bogus": np.zeros(2)}
    result = model.load_state_dict(state, strict=False)
    assert result.missing_keys == ["words.weight", "extra.weight"]
    assert result.unexpected_keys == ["bogus"]
    np.testing.assert_array_equal(host(model.scale.data), 2.0)


def test_train_eval_and_zero_grad(device):
    model = TwoTables(device)
    assert model.training and model.words.training
    model.eval()
    assert not model.training and not model.words.training
    model.train()
    assert model.words.training
    model.words(np.array([1, 2]))
    model.words.backward(on(device, np.ones((2, 3), np.float32)))
    assert _device.device_of(model.words.weight.grad) == device
    model.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_module_requires_super_init():
    class Broken(nn.Module):
        def __init__(self):
            self.x = 1

    with pytest.raises(AttributeError, match="super"):
        Broken()


def test_parameter_rejects_non_float():
    with pytest.raises(TypeError, match="data"):
        nn.Parameter(np.zeros(3, dtype=np.int64))


def test_parameter_accumulates_dense_and_sparse(device):
    def rows(indices, values):
        return SparseRows(np.array(indices), on(device, values), 4)

    p = nn.Parameter(on(device, np.zeros((4, 2))))
    p.accumulate_grad(rows([1], np.ones((1, 2))))
    p.accumulate_grad(rows([1, 3], np.ones((2, 2))))
    assert isinstance(p.grad, SparseRows) and p.grad.device == device
    np.testing.assert_array_equal(host(p.grad.to_dense()), [[0, 0], [2, 2], [0, 0], [1, 1]])
    user_grad = on(device, np.ones((4, 2)))
    p.accumulate_grad(user_grad)
    assert not isinstance(p.grad, SparseRows) and _device.device_of(p.grad) == device
    np.testing.assert_array_equal(host(p.grad), [[1, 1], [3, 3], [1, 1], [2, 2]])
    p.accumulate_grad(rows([0], np.ones((1, 2))))
    np.testing.assert_array_equal(host(p.grad)[0], [2, 2])
    np.testing.assert_array_equal(host(user_grad), 1.0)  # never aliased
    with pytest.raises(ValueError, match="shape"):
        p.accumulate_grad(on(device, np.ones((3, 2))))
    for bad in (np.ones((4, 2), np.int64), np.ones((4, 2), np.complex128)):
        with pytest.raises(TypeError, match="grad: expected"):
            p.accumulate_grad(on(device, bad))
    with pytest.raises(TypeError, match="grad: expected"):
        p.accumulate_grad([[1.0, 1.0]] * 4)
    np.testing.assert_array_equal(host(p.grad)[0], [2, 2])


# ------------------------------------------------------------------ Embedding


def test_default_init_is_standard_normal_and_padding_zeroed():
    emb = nn.Embedding(2000, 16, padding_idx=-1, seed=3)
    w = emb.weight.data
    assert w.dtype == np.float32 and emb.padding_idx == 1999
    np.testing.assert_array_equal(w[1999], 0)
    # 31984 values: 4 standard errors of the mean (1/sqrt(n)) and of the std (1/sqrt(2n)).
    assert abs(w[:-1].mean()) < 0.023 and abs(w[:-1].std() - 1.0) < 0.016
    np.testing.assert_array_equal(nn.Embedding(5, 3, seed=3).weight.data,
                                  nn.Embedding(5, 3, seed=3).weight.data)
    for seed in (None, np.random.default_rng(3)):  # numpy.random draws
        w = nn.Embedding(2000, 16, seed=seed).weight.data
        assert abs(w.mean()) < 0.023 and abs(w.std() - 1.0) < 0.016


def test_custom_init_and_dtype():
    emb = nn.Embedding(3, 2, init=lambda shape, rng: np.full(shape, 0.5), dtype=np.float64)
    assert emb.weight.dtype == np.float64
    np.testing.assert_array_equal(emb.weight.data, 0.5)
    emb = nn.Embedding(3, 2, init=nn.init.uniform(-1e-3, 1e-3), seed=0)
    assert np.abs(emb.weight.data).max() <= 1e-3
    with pytest.raises(ValueError, match="init: returned shape"):
        nn.Embedding(3, 2, init=lambda shape, rng: np.zeros(3))
    with pytest.raises(TypeError, match="init"):
        nn.Embedding(3, 2, init="normal")


@pytest.mark.parametrize("args", [(-1, 2), (3, -1)])
def test_negative_sizes(args):
    with pytest.raises(ValueError, match="num_embeddings|embedding_dim"):
        nn.Embedding(*args)


def test_bad_options(device):
    with pytest.raises(ValueError, match="padding_idx"):
        nn.Embedding(4, 2, padding_idx=4, device=device)
    with pytest.raises(ValueError, match="max_norm"):
        nn.Embedding(4, 2, max_norm=0, device=device)
    with pytest.raises(TypeError, match="dtype"):
        nn.Embedding(4, 2, dtype=np.int32, device=device)
    with pytest.raises(TypeError, match="num_embeddings"):
        nn.Embedding(4.0, 2, device=device)


def test_weight_argument_shape_checked(device):
    table = on(device, np.arange(6, dtype=np.float32).reshape(3, 2))
    emb = nn.Embedding(3, 2, _weight=table)
    assert emb.weight.data is table and emb.device == device  # the table's device
    with pytest.raises(ValueError, match=r"_weight: expected shape \(3, 2\)"):
        nn.Embedding(3, 2, _weight=on(device, np.zeros((2, 3), np.float32)))


def test_forward_backward_dense(device):
    emb = nn.Embedding(5, 3, padding_idx=0, seed=0, device=device)
    ids = np.array([[0, 2, 2], [4, 1, 0]])
    out = emb(ids)  # host ids go to the table's device
    np.testing.assert_array_equal(host(out), host(emb.weight.data)[ids])
    grad = np.ones((2, 3, 3), np.float32)
    assert emb.backward(on(device, grad)) is None
    expected = ref.embedding_backward(grad, ids, 5, padding_idx=0)
    np.testing.assert_array_equal(host(emb.weight.grad), expected)
    emb(ids)
    emb.backward(on(device, grad))  # accumulates
    np.testing.assert_array_equal(host(emb.weight.grad), 2 * expected)


def test_forward_backward_sparse_scale(device):
    emb = nn.Embedding(6, 2, sparse=True, scale_grad_by_freq=True, seed=0, device=device)
    emb(np.array([1, 1, 2]))
    emb.backward(on(device, np.array([[1.0, 2.0], [3.0, 5.0], [7.0, 11.0]], np.float32)))
    assert isinstance(emb.weight.grad, SparseRows) and emb.weight.grad.device == device
    np.testing.assert_array_equal(host(emb.weight.grad.indices), [1, 2])
    np.testing.assert_array_equal(host(emb.weight.grad.values), [[2, 3.5], [7, 11]])


def test_backward_before_forward(device):
    with pytest.raises(RuntimeError, match="before forward"):
        nn.Embedding(3, 2, device=device).backward(on(device, np.zeros((1, 2))))


def test_from_pretrained_pytorch_case(device):
    table = [[1, 2, 3], [4, 5, 6]]  # a list: converted to float32 on the CPU
    if device != "cpu":
        table = on(device, np.array(table, np.float32))
    emb = nn.Embedding.from_pretrained(table, max_norm=2, norm_type=0.5)
    assert emb.device == device
    out = emb(np.array([0, 1]))
    np.testing.assert_allclose(host(out), [[0.1163365, 0.2326730, 0.3490095],
                                           [0.1789842, 0.2237303, 0.2684763]], rtol=1e-6)


def test_from_pretrained_frozen_and_padding_kept(device):
    table = on(device, np.arange(8, dtype=np.float64).reshape(4, 2))
    emb = nn.Embedding.from_pretrained(table, padding_idx=1)
    assert emb.weight.data is table and not emb.weight.requires_grad
    np.testing.assert_array_equal(host(emb(np.array([1]))), [[2.0, 3.0]])  # not zeroed
    emb.backward(on(device, np.ones((1, 2))))
    assert emb.weight.grad is None
    trainable = nn.Embedding.from_pretrained(table, freeze=False)
    trainable(np.array([3]))
    trainable.backward(on(device, np.ones((1, 2))))
    np.testing.assert_array_equal(host(trainable.weight.grad)[3], [1, 1])
    with pytest.raises(ValueError, match="embeddings"):
        nn.Embedding.from_pretrained(on(device, np.zeros(3)))


def test_attend_tied_head(rng, device):
    emb = nn.Embedding(7, 4, dtype=np.float64, seed=1, device=device)
    weight = host(emb.weight.data)  # the finite differences run on the host
    h = rng.normal(size=(2, 3, 4))
    logits = emb.attend(on(device, h))
    assert _device.device_of(logits) == device
    np.testing.assert_allclose(host(logits), h @ weight.T)
    probe = rng.normal(size=(2, 3, 7))
    grad_h = emb.attend_backward(on(device, probe))

    def loss():
        return float(np.sum((h @ weight.T) * probe))

    np.testing.assert_allclose(host(grad_h), ref.finite_difference(loss, h), rtol=1e-6,
                               atol=1e-8)
    np.testing.assert_allclose(host(emb.weight.grad), ref.finite_difference(loss, weight),
                               rtol=1e-6, atol=1e-8)
    with pytest.raises(ValueError, match="embedding_dim=4"):
        emb.attend(on(device, np.zeros((2, 5))))
    emb.attend(on(device, h))
    with pytest.raises(ValueError, match="grad_logits"):
        emb.attend_backward(on(device, np.zeros((2, 3, 6))))


def test_repr():
    text = repr(nn.Embedding(5, 3, padding_idx=1, sparse=True))
    assert text == "Embedding(5, 3, padding_idx=1, sparse=True)"
    assert "(words): Embedding(6, 3)" in repr(TwoTables())


def test_gradient_dtype_must_match_parameter(device):
    emb = nn.Embedding(4, 2, seed=0, device=device)  # float32
    emb(np.array([1, 2]))
    with pytest.raises(TypeError, match="expected dtype float32 .*got float64"):
        emb.backward(on(device, np.ones((2, 2))))
    assert emb.weight.grad is None


def test_load_state_dict_needs_a_mapping():
    with pytest.raises(TypeError, match="expected a mapping of names to arrays, got list"):
        TwoTables().load_state_dict([("scale", np.ones(3))])
