"""ModuleList, ModuleDict and Sequential (PyTorch's interfaces), and the warning for plain
lists, tuples and dicts of modules or parameters assigned to a module."""

import warnings
from collections import OrderedDict

import numpy as np
import pytest
from conftest import host, on

from numbapos import nn, optim


def _layers():
    return [nn.Embedding(6, 4, seed=1), nn.LayerNorm(4), nn.Dropout(0.0, seed=0)]


# ------------------------------------------------------------------ ModuleList


def test_module_list_is_a_list_of_registered_children():
    a, b, c = _layers()
    layers = nn.ModuleList([a, b])
    assert len(layers) == 2 and layers[0] is a and layers[-1] is b and list(layers) == [a, b]
    assert layers.append(c) is layers and layers[2] is c
    assert list(layers.state_dict()) == ["0.weight", "1.weight", "1.bias", "2.seed",
                                         "2.counter"]
    assert [p for p in layers.parameters()] == [a.weight, b.weight, b.bias]
    sliced = layers[1:]
    assert isinstance(sliced, nn.ModuleList) and list(sliced) == [b, c]
    assert list(sliced.state_dict())[:2] == ["0.weight", "0.bias"]  # renumbered, as PyTorch
    layers.insert(0, c)
    assert list(layers) == [c, a, b, c] and list(layers._modules) == ["0", "1", "2", "3"]
    assert layers.pop(0) is c and list(layers) == [a, b, c]
    del layers[0]
    assert list(layers) == [b, c] and list(layers._modules) == ["0", "1"]
    layers[1] = a
    assert list(layers) == [b, a]
    layers += [c]
    layers.extend(nn.ModuleList([a]))
    assert list(layers) == [b, a, c, a]
    assert list(layers + nn.ModuleList([b])) == [b, a, c, a, b]
    assert len(list(layers.parameters())) == 3  # a appears twice, its weight once
    del layers[1:3]
    assert list(layers) == [b, a]


def test_module_list_reaches_to_train_and_zero_grad(device):
    model = nn.Module()
    model.layers = nn.ModuleList(_layers())
    model.to(device, np.float64).eval()
    assert all(not m.training for m in model.layers)
    assert all(p.device == device and p.dtype == np.float64 for p in model.parameters())
    emb = model.layers[0]
    emb(on(device, np.array([1, 2])))
    emb.backward(on(device, np.ones((2, 4))))
    assert emb.weight.grad is not None
    model.zero_grad()
    assert emb.weight.grad is None
    assert list(model.state_dict())[:3] == ["layers.0.weight", "layers.1.weight",
                                            "layers.1.bias"]


@pytest.mark.parametrize("call, error, message", [
    (lambda m: m.append(np.ones(3)), TypeError, "ModuleList.append: expected a numbapos Module"),
    (lambda m: m.extend([nn.LayerNorm(2), "x"]), TypeError, "extend: item 1: expected"),
    (lambda m: m.extend(nn.LayerNorm(2)), TypeError, "expected an iterable of modules"),
    (lambda m: m[5], IndexError, "index 5 is out of range for 2"),
    (lambda m: m["0"], TypeError, "indices must be integers or slices"),
    (lambda m: m.__setitem__(0, 3), TypeError, r"ModuleList\[0\]: expected a numbapos Module"),
])
def test_module_list_errors_change_nothing(call, error, message):
    layers = nn.ModuleList(_layers()[:2])
    before = list(layers)
    with pytest.raises(error, match=message):
        call(layers)
    assert list(layers) == before


# ------------------------------------------------------------------ ModuleDict


def test_module_dict_is_a_mapping_of_registered_children():
    a, b, c = _layers()
    heads = nn.ModuleDict({"emb": a, "norm": b})
    assert list(heads) == ["emb", "norm"] and heads["emb"] is a and "norm" in heads
    assert len(heads) == 2 and list(heads.values()) == [a, b]
    heads["drop"] = c
    assert list(heads.items()) == [("emb", a), ("norm", b), ("drop", c)]
    assert list(heads.state_dict()) == ["emb.weight", "norm.weight", "norm.bias", "drop.seed",
                                        "drop.counter"]
    assert heads.pop("norm") is b and list(heads.keys()) == ["emb", "drop"]
    del heads["emb"]
    assert list(heads) == ["drop"] and list(heads.parameters()) == []
    heads.update([("x", a), ("y", b)])
    heads.update(nn.ModuleDict({"z": c}))
    assert list(heads) == ["drop", "x", "y", "z"]
    heads.clear()
    assert len(heads) == 0 and list(heads.state_dict()) == []
    with pytest.raises(KeyError):
        heads["missing"]


@pytest.mark.parametrize("call, error, message", [
    (lambda d: d.update({"ok": nn.LayerNorm(2), "bad": 3}), TypeError,
     r"ModuleDict\['bad'\]: expected a numbapos Module"),
    (lambda d: d.update({"ok": nn.LayerNorm(2), "a.b": nn.LayerNorm(2)}), KeyError,
     "without dots"),
    (lambda d: d.update({"ok": nn.LayerNorm(2), "to": nn.LayerNorm(2)}), KeyError,
     "'to' is an attribute"),
    (lambda d: d.update({1: nn.LayerNorm(2)}), TypeError, "key: expected a str, got int"),
    (lambda d: d.update([("ok", nn.LayerNorm(2)), "x"]), TypeError, "item 1: expected a"),
    (lambda d: d.update(nn.LayerNorm(2)), TypeError, "expected a mapping"),
])
def test_module_dict_errors_change_nothing(call, error, message):
    heads = nn.ModuleDict({"first": nn.LayerNorm(2)})
    with pytest.raises(error, match=message):
        call(heads)
    assert list(heads) == ["first"]


# ------------------------------------------------------------------ Sequential


def _pair(dtype=np.float64):
    """A Sequential and the same modules (same values) built separately."""
    def build():
        return [nn.Embedding(7, 4, dtype=dtype, seed=3),
                nn.LearnedPosEmbedding(5, 4, dtype=dtype, seed=4),
                nn.LayerNorm(4, dtype=dtype), nn.Dropout(0.3, seed=9)]
    return nn.Sequential(*build()), build()


def test_sequential_chains_forward_and_runs_backwards_in_reverse(device):
    model, parts = _pair()
    model.to(device)
    for part in parts:
        part.to(device)
    rng = np.random.default_rng(0)
    ids = on(device, rng.integers(0, 7, size=(2, 5)))
    grad = on(device, rng.standard_normal((2, 5, 4)))
    got = model(ids)
    want = ids
    for part in parts:
        want = part(want)
    np.testing.assert_array_equal(host(got), host(want))
    assert model.backward(grad) is None  # the ids have no gradient
    g = grad
    for part in reversed(parts):
        g = part.backward(g)
    for (name, p), q in zip(model.named_parameters(), [q for m in parts for q in m.parameters()],
                            strict=True):
        np.testing.assert_array_equal(host(p.grad), host(q.grad), err_msg=name)


def test_sequential_returns_the_input_gradient():
    norm = nn.LayerNorm(3, dtype=np.float64)
    drop = nn.Dropout(0.5, seed=2)
    model = nn.Sequential(norm, drop)
    x = np.random.default_rng(1).standard_normal((4, 3))
    gy = np.random.default_rng(2).standard_normal((4, 3))
    model(x)
    gx = model.backward(gy)
    norm2, drop2 = nn.LayerNorm(3, dtype=np.float64), nn.Dropout(0.5, seed=2)
    drop2(norm2(x))
    want = norm2.backward(drop2.backward(gy))
    assert np.abs(want).sum() > 0
    np.testing.assert_array_equal(gx, want)


def test_sequential_matches_pytorch():
    torch = pytest.importorskip("torch")
    model = nn.Sequential(nn.Embedding(7, 4, dtype=np.float64, seed=3),
                          nn.LayerNorm(4, dtype=np.float64))
    peer = torch.nn.Sequential(torch.nn.Embedding(7, 4), torch.nn.LayerNorm(4)).double()
    assert list(model.state_dict()) == list(peer.state_dict())
    peer.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in model.state_dict().items()})
    ids = np.array([[1, 2, 2, 6]])
    gy = np.random.default_rng(0).standard_normal((1, 4, 4))
    y = model(ids)
    model.backward(gy)
    ty = peer(torch.from_numpy(ids))
    ty.backward(torch.from_numpy(gy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(model[0].weight.grad, peer[0].weight.grad.numpy(), rtol=1e-12,
                               atol=1e-12)
    np.testing.assert_allclose(model[1].weight.grad, peer[1].weight.grad.numpy(), rtol=1e-12,
                               atol=1e-12)


def test_sequential_trains_with_an_optimiser_and_keeps_names_from_a_mapping():
    model = nn.Sequential(OrderedDict([("emb", nn.Embedding(5, 3, seed=0)),
                                       ("norm", nn.LayerNorm(3))]))
    assert list(model.state_dict()) == ["emb.weight", "norm.weight", "norm.bias"]
    assert model[0] is model.emb and isinstance(model[1:], nn.Sequential)
    assert list(model[1:].state_dict()) == ["norm.weight", "norm.bias"]
    opt = optim.SGD(model.parameters(), lr=0.1)
    before = model.emb.weight.data.copy()
    y = model(np.array([1, 1, 4]))
    model.backward(np.random.default_rng(0).standard_normal(y.shape).astype(np.float32))
    opt.step()
    assert not np.array_equal(before[1], model.emb.weight.data[1])
    np.testing.assert_array_equal(before[0], model.emb.weight.data[0])
    model.append(nn.Dropout(0.0, seed=0))
    assert list(model._modules) == ["emb", "norm", "2"]


def test_sequential_backward_errors():
    model = nn.Sequential(nn.LayerNorm(3), nn.Embedding(4, 3, seed=0))
    with pytest.raises(RuntimeError, match="called before forward"):
        model.backward(np.ones((2, 3), np.float32))
    model[1](np.array([0, 1]))
    with pytest.raises(RuntimeError, match="module 1 \\(Embedding\\) returned no input gradient"):
        model.backward(np.ones((2, 3), np.float32))
    with pytest.raises(TypeError, match="Sequential: argument 1: expected a numbapos Module"):
        nn.Sequential(nn.LayerNorm(2), [nn.LayerNorm(2)])


# ------------------------------------------------------------------ the warning


def test_plain_containers_of_modules_warn_once_per_class_and_attribute():
    class Model(nn.Module):
        pass

    model = Model()
    with pytest.warns(UserWarning, match=r"Model\.layers: a list of modules or parameters is a "
                                         r"plain attribute.*nn\.ModuleList"):
        model.layers = [nn.LayerNorm(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.layers = [nn.LayerNorm(2)]  # once per class and attribute
        Model().layers = (nn.LayerNorm(2),)
        model.sizes = [1, 2, 3]  # no modules or parameters: no warning
        model.names = {"a": "b"}
        model.empty = []
    with pytest.warns(UserWarning, match=r"Model\.heads: a dict .*nn\.ModuleDict"):
        model.heads = {"a": nn.LayerNorm(2)}
    with pytest.warns(UserWarning, match=r"Model\.weights: a tuple"):
        model.weights = (nn.Parameter(np.ones(2)),)
    assert list(model.parameters()) == []  # as PyTorch: not registered


def test_library_modules_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nn.BertEmbeddings(10, 4, max_position_embeddings=6, type_vocab_size=2, seed=0)
        nn.GPT2Embeddings(10, 6, 4, seed=0)
        nn.PositionalEmbedding(6, 4, seed=0)
        nn.Sequential(*_layers())
