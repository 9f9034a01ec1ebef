"""Module basics PyTorch users reach for: traversal, apply, buffers, zero_grad, to(dtype), repr,
state dicts with prefixes and dtype casts, and checkpoints that resume bit for bit."""

import numpy as np
import pytest
from conftest import host, on

import numbapos
from numbapos import nn, optim


class Head(nn.Module):
    """A small composite: tokens, learned positions with dropout, LayerNorm, tied output."""

    def __init__(self, seed=0, dtype=np.float32, device=None):
        super().__init__()
        self.tok = nn.Embedding(13, 6, seed=seed, dtype=dtype, device=device)
        self.pos = nn.LearnedPosEmbedding(8, 6, dropout=0.25, seed=seed + 1, dtype=dtype,
                                          device=device or "cpu")
        self.norm = nn.LayerNorm(6, dtype=dtype, device=device or "cpu")
        self.register_buffer("scale", np.array([0.5, 2.0], dtype=dtype))

    def forward(self, ids):
        return self.norm(self.pos(self.tok(ids)))

    def backward(self, grad):
        self.tok.backward(self.pos.backward(self.norm.backward(grad)))


def test_modules_children_and_apply():
    head = Head()
    assert [name for name, _ in head.named_children()] == ["tok", "pos", "norm"]
    assert list(head.children()) == [head.tok, head.pos, head.norm]
    kinds = [type(m).__name__ for m in head.modules()]
    assert kinds == ["Head", "Embedding", "LearnedPosEmbedding", "Dropout", "LayerNorm"]
    visited = []
    assert head.apply(lambda m: visited.append(type(m).__name__)) is head
    assert visited == ["Embedding", "Dropout", "LearnedPosEmbedding", "LayerNorm", "Head"]


def test_shared_child_listed_once():
    shared = nn.Embedding(3, 2, seed=0)
    outer = nn.Module()
    outer.a, outer.b = shared, shared
    assert [name for name, _ in outer.named_modules()] == ["", "a"]
    assert list(outer.state_dict()) == ["a.weight"]


def test_requires_grad_and_zero_grad(rng):
    head = Head()
    assert head.requires_grad_(False) is head
    assert not any(p.requires_grad for p in head.parameters())
    head.requires_grad_()
    ids = rng.integers(0, 13, (2, 5))
    head.backward(np.ones(head(ids).shape, np.float32))
    grad = head.norm.weight.grad
    head.zero_grad(set_to_none=False)
    assert head.norm.weight.grad is grad and not grad.any()  # zeroed in place
    head.zero_grad()
    assert all(p.grad is None for p in head.parameters())


def test_zero_grad_keeps_sparse_gradients_sparse(device, rng):
    e = nn.Embedding(7, 3, sparse=True, seed=0, device=device)
    e(on(device, np.array([1, 4])))
    e.backward(on(device, np.ones((2, 3), np.float32)))
    e.zero_grad(set_to_none=False)
    grad = e.weight.grad
    assert isinstance(grad, numbapos.SparseRows) and grad.shape == (7, 3)
    assert grad.indices.shape == (0,) and grad.device == device
    e(on(device, np.array([2])))
    e.backward(on(device, np.ones((1, 3), np.float32)))
    np.testing.assert_array_equal(host(e.weight.grad.to_dense())[2], 1.0)


def test_buffers_state_dict_and_persistence():
    head = Head()
    head.register_buffer("step", np.array(3, dtype=np.int64), persistent=False)
    names = list(head.state_dict())
    assert names == ["scale", "tok.weight", "pos.weight", "pos.dropout.seed",
                     "pos.dropout.counter", "norm.weight", "norm.bias"]
    assert dict(head.named_buffers())["step"] == 3  # kept, not saved
    prefixed = head.state_dict(prefix="model.")
    assert list(prefixed) == ["model." + n for n in names]
    kept = head.state_dict(keep_vars=True)
    assert kept["tok.weight"] is head.tok.weight and kept["scale"] is head.scale
    head.scale = np.array([1.0, 1.0], np.float32)  # assigning replaces the buffer
    assert head.state_dict()["scale"] is head.scale
    with pytest.raises(KeyError, match="already exists"):
        head.register_buffer("tok", np.zeros(1))
    with pytest.raises(KeyError, match="without dots"):
        head.register_buffer("a.b", np.zeros(1))
    with pytest.raises(TypeError, match="name: expected a str"):
        head.register_buffer(3, np.zeros(1))
    with pytest.raises(TypeError, match="expected a NumPy or CUDA array"):
        head.register_buffer("bad", [1.0])


def test_buffers_move_with_to(device):
    head = Head().to(device)
    assert numbapos.device_of(head.scale) == device
    seed = head.pos.dropout._buffers["seed"]
    assert isinstance(seed, np.ndarray) and seed.ndim == 0  # scalar buffers stay on the host
    np.testing.assert_array_equal(host(head.state_dict()["scale"]), [0.5, 2.0])


def test_to_dtype_casts_parameters_grads_and_float_buffers(rng):
    head = Head()
    ids = rng.integers(0, 13, (2, 5))
    head.backward(np.ones(head(ids).shape, np.float32))
    seed = head.pos.dropout.seed
    assert head.to(np.float64) is head
    for name, param in head.named_parameters():
        assert param.dtype == np.float64 and param.grad.dtype == np.float64, name
    assert head.scale.dtype == np.float64 and head.norm.dtype == np.float64
    assert head.pos.dropout.seed == seed  # integer buffers keep their dtype
    assert head(ids).dtype == np.float64
    head.to("cpu", dtype=np.float32)
    assert head.tok.weight.dtype == np.float32
    with pytest.raises(TypeError, match="float32, float64, bfloat16 or float16"):
        head.to(np.int64)
    with pytest.raises(TypeError, match="two devices"):
        head.to("cpu", "cpu")


def test_to_dtype_matches_pytorch_move_sparse_half_case():
    # PyTorch's test_move_sparse_half_embedding, with float64 (numbapos has no float16).
    embedding = nn.Embedding(10, 3, sparse=True)
    assert embedding.weight.dtype == np.float32 and embedding.device == "cpu"
    embedding.to(np.float64)
    assert embedding.weight.dtype == np.float64
    assert (embedding.num_embeddings, embedding.embedding_dim) == (10, 3)


def test_nested_repr_matches_pytorch_layout():
    head = Head()
    assert repr(head) == (
        "Head(\n"
        "  (tok): Embedding(13, 6)\n"
        "  (pos): LearnedPosEmbedding(\n"
        "    8, 6\n"
        f"    (dropout): Dropout(p=0.25, seed={head.pos.dropout.seed})\n"
        "  )\n"
        "  (norm): LayerNorm((6,), eps=1e-05, elementwise_affine=True)\n"
        ")"
    )
    torch = pytest.importorskip("torch")
    outer = torch.nn.Module()
    outer.inner = torch.nn.Sequential(torch.nn.Dropout(0.25))
    mine = nn.Module()
    mine.inner = nn.Module()
    mine.inner.add = nn.Module()
    assert repr(mine).count("\n") == repr(outer).count("\n")


def test_parameter_array_protocol_and_repr():
    e = nn.Embedding(4, 3, seed=0)
    view = np.asarray(e.weight)
    assert view.shape == (4, 3) and np.shares_memory(view, e.weight.data)
    assert np.asarray(e.weight, dtype=np.float64).dtype == np.float64
    assert not np.shares_memory(np.array(e.weight, copy=True), e.weight.data)
    text = repr(e.weight)
    assert text.startswith("Parameter containing:\narray([[") and "dtype=float32" in text
    e.weight.requires_grad = False
    assert "requires_grad=False" in repr(e.weight)


# ------------------------------------------------------------------ state dict dtypes


def test_load_state_dict_casts_into_the_parameter_dtype_like_pytorch(rng):
    torch = pytest.importorskip("torch")
    values = rng.standard_normal((4, 3))  # float64
    ours, theirs = nn.Embedding(4, 3), torch.nn.Embedding(4, 3)
    before = ours.weight.data
    ours.load_state_dict({"weight": values})
    theirs.load_state_dict({"weight": torch.from_numpy(values)})
    assert ours.weight.data is before and ours.weight.dtype == np.float32
    np.testing.assert_array_equal(ours.weight.data, theirs.weight.detach().numpy())
    ints = np.arange(12).reshape(4, 3)
    ours.load_state_dict({"weight": torch.from_numpy(ints)})  # a CPU tensor works too
    theirs.load_state_dict({"weight": torch.from_numpy(ints)})
    np.testing.assert_array_equal(ours.weight.data, theirs.weight.detach().numpy())
    with pytest.raises(TypeError, match="requires grad.*detach"):
        ours.load_state_dict({"weight": theirs.weight})
    ours.load_state_dict(theirs.state_dict())  # torch's state_dict holds detached tensors


def test_dropout_checkpoint_restores_the_mask_stream(rng):
    x = rng.standard_normal((4, 5))
    first = nn.Dropout(0.5, seed=7)
    for _ in range(3):
        first(x)
    saved = {k: v.copy() for k, v in first.state_dict().items()}
    later = [first(x) for _ in range(2)]
    resumed = nn.Dropout(0.5, seed=99)
    resumed.load_state_dict(saved)
    assert (resumed.seed, resumed.counter) == (7, 3)
    for want in later:
        np.testing.assert_array_equal(resumed(x), want)


def _train(model, opt, batches, start, stop):
    for step in range(start, stop):
        ids = batches[step]
        y = model(ids)
        model.backward(np.asarray(y - 0.1, dtype=y.dtype))  # d/dy of 0.5 * |y - 0.1|^2
        opt.step()
        model.zero_grad()


def test_checkpointed_training_resumes_bit_identically(tmp_path, rng):
    pytest.importorskip("safetensors")
    batches = [rng.integers(0, 13, (3, 6)) for _ in range(10)]
    straight = Head(seed=3)
    _train(straight, optim.SGD(straight.parameters(), lr=0.05), batches, 0, 10)

    first = Head(seed=3)
    _train(first, optim.SGD(first.parameters(), lr=0.05), batches, 0, 5)
    path = tmp_path / "mid.safetensors"
    numbapos.io.save_state(first, path)
    resumed = Head(seed=11)  # other initial values and another dropout seed
    resumed.load_state_dict(numbapos.io.load_state(path))
    _train(resumed, optim.SGD(resumed.parameters(), lr=0.05), batches, 5, 10)
    for (name, want), got in zip(straight.state_dict().items(), resumed.state_dict().values(),
                                 strict=True):
        np.testing.assert_array_equal(got, want, err_msg=name)


def test_checkpointed_training_with_momentum_resumes_bit_identically(rng):
    # Needs SGD.state_dict() / load_state_dict() (momentum buffers); skips until they exist.
    if not hasattr(optim.SGD, "state_dict"):
        pytest.skip("SGD has no state_dict() in this build")
    import copy

    batches = [rng.integers(0, 13, (3, 6)) for _ in range(10)]
    straight = Head(seed=3)
    _train(straight, optim.SGD(straight.parameters(), lr=0.05, momentum=0.9), batches, 0, 10)
    first = Head(seed=3)
    opt = optim.SGD(first.parameters(), lr=0.05, momentum=0.9)
    _train(first, opt, batches, 0, 5)
    model_state = {k: v.copy() for k, v in first.state_dict().items()}
    opt_state = copy.deepcopy(opt.state_dict())
    resumed = Head(seed=11)
    resumed.load_state_dict(model_state)
    resumed_opt = optim.SGD(resumed.parameters(), lr=0.05, momentum=0.9)
    resumed_opt.load_state_dict(opt_state)
    _train(resumed, resumed_opt, batches, 5, 10)
    for (name, want), got in zip(straight.state_dict().items(), resumed.state_dict().values(),
                                 strict=True):
        np.testing.assert_array_equal(got, want, err_msg=name)
