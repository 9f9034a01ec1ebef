"""Modules reuse their large CPU output once no one else holds it, and never otherwise.

Ownership is tracked with a weak reference to the array handed out (see
numbapos/nn/_outputs.py), not with reference counts: .ci/run runs this file on
every Python from 3.10 to 3.13 as well.
"""

import numpy as np
import pytest

from numbapos import nn
from numbapos.nn import _outputs

VOCAB, DIM = 1000, 256
BATCH = (8, 160)  # 8 * 160 * 256 float32 = 1.25 MiB: above the reuse threshold


def address(a):
    return a.__array_interface__["data"][0]


def make(kind):
    """(module, call(ids) -> output, reference(ids) -> expected output)."""
    rng = np.random.default_rng(0)
    if kind == "embedding":
        emb = nn.Embedding(VOCAB, DIM, seed=0)
        return emb, emb, lambda ids: emb.weight.data[ids]
    if kind == "gpt2":
        block = nn.GPT2Embeddings(VOCAB, 200, DIM, embd_pdrop=0.0, seed=0)
        return block, block, lambda ids: (block.wte.weight.data[ids]
                                          + block.wpe.weight.data[np.arange(ids.shape[1])])
    if kind == "bert":
        block = nn.BertEmbeddings(VOCAB, DIM, 200, 2, hidden_dropout_prob=0.0, seed=0)
        frozen = nn.BertEmbeddings(VOCAB, DIM, 200, 2, hidden_dropout_prob=0.0, seed=0)
        return block, block, lambda ids: frozen(ids).copy()
    layer = nn.LayerNorm(DIM)
    inputs = {}

    def call(ids):
        x = inputs.setdefault(ids.tobytes(), rng.normal(size=ids.shape + (DIM,)).astype(np.float32))
        return layer(x)

    def expected(ids):
        x = inputs[ids.tobytes()]
        centred = x - x.mean(-1, keepdims=True)
        return centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + layer.eps)

    return layer, call, expected


KINDS = ["embedding", "gpt2", "bert", "layer_norm"]


def batches(n):
    rng = np.random.default_rng(1)
    return [rng.integers(0, VOCAB, size=BATCH) for _ in range(n)]


def check(got, want):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_a_dropped_output_is_reused_with_the_right_values(kind):
    module, call, expected = make(kind)
    module.eval()
    a, b = batches(2)
    # First, a call that compiles: on a cold cache Python 3.10's Numba keeps the
    # frames of the call that compiled (and so that call's output) alive a while,
    # which only means that output is not reused (safe); that is not tested here.
    call(b)
    first = call(a)
    where = address(first)
    del first
    second = call(b)
    assert address(second) == where
    check(second, expected(b))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("holder", ["array", "view", "torch", "list", "transpose", "dtype_view",
                                    "memoryview", "frombuffer", "cycle"])
def test_an_output_someone_holds_is_never_overwritten(kind, holder):
    module, call, expected = make(kind)
    module.eval()
    a, b, c = batches(3)
    first = call(a)
    snapshot = first.copy()
    if holder == "view":
        kept = first[1:]
    elif holder == "torch":
        torch = pytest.importorskip("torch")
        kept = torch.from_numpy(first)
    elif holder == "list":
        kept = [first]
    elif holder == "transpose":
        kept = first.T
    elif holder == "dtype_view":
        kept = first.view(np.uint8)
    elif holder == "memoryview":
        kept = memoryview(first)
    elif holder == "frombuffer":
        kept = np.frombuffer(first, np.uint8)
    elif holder == "cycle":  # only the cyclic garbage collector could free it
        kept = None
        loop = {"output": first}
        loop["self"] = loop
    else:
        kept = first
    del first
    second, third = call(b), call(c)
    if holder == "cycle":
        held = loop["output"]
    elif holder == "list":
        held = kept[0]
    elif holder == "transpose":
        held = kept.T
    elif holder in ("dtype_view", "memoryview", "frombuffer"):
        held = np.frombuffer(kept, snapshot.dtype).reshape(snapshot.shape)
    else:
        held = kept
    np.testing.assert_array_equal(np.asarray(held), snapshot[1:] if holder == "view" else snapshot)
    check(second, expected(b))
    check(third, expected(c))
    assert not np.shares_memory(second, third)


def test_small_outputs_are_not_kept():
    emb = nn.Embedding(VOCAB, 8, seed=0)
    emb(np.arange(4))
    assert emb._outputs.capacity == 0
    assert _outputs.OutputBuffer().take((4, 8), np.float32) is None


def test_reuse_does_not_read_reference_counts(monkeypatch):
    """Python 3.14 may report fewer references than there are: nothing may depend on it."""
    import sys

    monkeypatch.setattr(sys, "getrefcount", lambda obj: 1)
    emb = nn.Embedding(VOCAB, DIM, seed=0)
    a, b = batches(2)
    first = emb(a)
    snapshot = first.copy()
    second = emb(b)
    np.testing.assert_array_equal(first, snapshot)
    assert not np.shares_memory(first, second)


def test_memory_is_reused_for_a_smaller_output_but_not_a_much_smaller_one():
    buffer = _outputs.OutputBuffer()
    big = buffer.take((4, 1 << 18), np.float32)  # 4 MiB
    where = address(big)
    del big
    smaller = buffer.take((3, 1 << 18), np.float32)
    assert address(smaller) == where and smaller.shape == (3, 1 << 18)
    del smaller
    assert address(buffer.take((1, 1 << 18), np.float32)) != where  # under half: new memory


def test_moving_a_module_forgets_its_output(device):
    emb = nn.Embedding(VOCAB, DIM, seed=0)
    emb(batches(1)[0])
    assert emb._outputs.capacity > 0
    emb.to(device)
    assert emb._outputs.capacity == 0


def test_layer_norm_input_copies_are_reused_only_once_consumed():
    rng = np.random.default_rng(5)
    layer = nn.LayerNorm(DIM)
    xs = [rng.normal(size=BATCH + (DIM,)).astype(np.float32) for _ in range(2)]
    gys = [rng.normal(size=BATCH + (DIM,)).astype(np.float32) for _ in range(2)]
    expected = []
    for x, gy in zip(xs, gys, strict=True):
        layer(x)
        expected.append(layer.backward(gy))
    # Two forwards pending at once, inputs overwritten after each: each backward
    # must still see its own input.
    a, b = xs[0].copy(), xs[1].copy()
    layer(a)
    a[:] = 0
    layer(b)
    b[:] = 0
    np.testing.assert_array_equal(layer.backward(gys[1]), expected[1])
    np.testing.assert_array_equal(layer.backward(gys[0]), expected[0])


def test_sparse_gradient_values_reuse_the_dropped_gradient():
    import numbapos.functional as F

    rng = np.random.default_rng(6)
    emb = nn.Embedding(VOCAB, DIM, sparse=True, seed=0)
    a, b = batches(2)
    grads = [rng.normal(size=BATCH + (DIM,)).astype(np.float32) for _ in range(2)]
    emb(a)
    emb.backward(grads[0])
    kept = emb.weight.grad
    snapshot = kept.values.copy()
    emb.zero_grad()
    emb(b)
    emb.backward(grads[1])  # `kept` is still referenced: a new buffer
    np.testing.assert_array_equal(kept.values, snapshot)
    expected = F.embedding_backward(grads[1], b, VOCAB, sparse=True)
    np.testing.assert_array_equal(emb.weight.grad.values, expected.values)
    where = address(emb.weight.grad.values)
    del kept
    emb.zero_grad()
    emb(a)
    emb.backward(grads[0])
    assert address(emb.weight.grad.values) == where  # the dropped gradient's buffer
    np.testing.assert_array_equal(emb.weight.grad.values, snapshot)


def test_values_out_of_the_functional_backward():
    import numbapos.functional as F

    rng = np.random.default_rng(7)
    ids = np.array([[3, 1, 3], [2, 3, 1]])
    grad = rng.normal(size=(2, 3, 4))
    buf = np.full((6, 4), np.nan)
    got = F.embedding_backward(grad, ids, 5, sparse=True, values_out=buf)
    expected = F.embedding_backward(grad, ids, 5, sparse=True)
    np.testing.assert_array_equal(got.indices, expected.indices)
    np.testing.assert_array_equal(got.values, expected.values)
    assert np.shares_memory(got.values, buf)
    for bad, message in [
        (np.zeros((5, 4)), r"values_out: expected shape \(M, 4\) with M >= 6"),
        (np.zeros((6, 3)), r"expected shape \(M, 4\)"),
        (np.zeros((6, 4), np.float32), "dtype float64"),
    ]:
        with pytest.raises(ValueError, match=message):
            F.embedding_backward(grad, ids, 5, sparse=True, values_out=bad)
    with pytest.raises(ValueError, match="only for sparse=True without lazy"):
        F.embedding_backward(grad, ids, 5, values_out=buf)
    with pytest.raises(ValueError, match="only for sparse=True without lazy"):
        F.embedding_backward(grad, ids, 5, sparse=True, lazy=True, values_out=buf)
    with pytest.raises(ValueError, match="must not share memory"):
        F.embedding_backward(grad, ids, 5, sparse=True, values_out=grad.reshape(6, 4))


def test_a_sparse_bag_reuses_the_dropped_gradient_values():
    import numbapos.functional as F

    rng = np.random.default_rng(8)
    bag = nn.EmbeddingBag(VOCAB, DIM, mode="sum", sparse=True, seed=0)
    a, b = batches(2)  # one bag per row of 160 ids: 1,280 ids, values above the threshold
    grads = [rng.normal(size=(BATCH[0], DIM)).astype(np.float32) for _ in range(2)]
    bag(a)
    bag.backward(grads[0])
    kept = bag.weight.grad
    snapshot = kept.values.copy()
    bag.zero_grad()
    bag(b)
    bag.backward(grads[1])  # `kept` is still referenced: a new buffer
    np.testing.assert_array_equal(kept.values, snapshot)
    expected, _ = F.embedding_bag_backward(grads[1], b, bag.weight.data, mode="sum",
                                           sparse=True)
    np.testing.assert_array_equal(bag.weight.grad.values, expected.values)
    where = address(bag.weight.grad.values)
    del kept
    bag.zero_grad()
    bag(a)
    bag.backward(grads[0])
    assert address(bag.weight.grad.values) == where  # the dropped gradient's buffer
    np.testing.assert_array_equal(bag.weight.grad.values, snapshot)


def test_values_out_of_the_functional_bag_backward():
    import numbapos.functional as F

    rng = np.random.default_rng(9)
    ids, offsets = np.array([3, 1, 3, 2, 3, 1]), np.array([0, 2])
    weight = rng.normal(size=(8, 4))
    grad = rng.normal(size=(2, 4))
    buf = np.full((6, 4), np.nan)
    got, _ = F.embedding_bag_backward(grad, ids, weight, offsets, mode="mean", sparse=True,
                                      values_out=buf)
    expected, _ = F.embedding_bag_backward(grad, ids, weight, offsets, mode="mean",
                                           sparse=True)
    np.testing.assert_array_equal(got.indices, expected.indices)
    np.testing.assert_array_equal(got.values, expected.values)
    assert np.shares_memory(got.values, buf)
    for bad, message in [
        (np.zeros((5, 4)), r"values_out: expected shape \(M, 4\) with M >= 6"),
        (np.zeros((6, 3)), r"expected shape \(M, 4\)"),
        (np.zeros((6, 4), np.float32), "dtype float64"),
    ]:
        with pytest.raises(ValueError, match=message):
            F.embedding_bag_backward(grad, ids, weight, offsets, sparse=True, values_out=bad)
    with pytest.raises(ValueError, match="only for sparse=True without lazy"):
        F.embedding_bag_backward(grad, ids, weight, offsets, values_out=buf)
    with pytest.raises(ValueError, match="only for sparse=True without lazy"):
        F.embedding_bag_backward(grad, ids, weight, offsets, sparse=True, lazy=True,
                                 values_out=buf)
    with pytest.raises(ValueError, match="must not share memory"):
        F.embedding_bag_backward(grad, ids, weight, offsets, sparse=True, values_out=weight[:6])


def test_a_collection_reuses_the_dropped_gradient_values():
    from numbapos.jagged import KeyedJaggedArray

    rng = np.random.default_rng(10)
    rows = 100_000  # 2,560 ids, nearly all distinct: values above the reuse threshold
    ebc = nn.EmbeddingBagCollection([nn.EmbeddingBagConfig("a", rows, DIM, ["x"]),
                                     nn.EmbeddingBagConfig("b", rows, 64, ["y"])], seed=0)
    lengths = np.full(16, 160)  # 8 samples x 2 keys
    grad = rng.normal(size=(8, DIM + 64)).astype(np.float32)

    def step(seed):
        ids = np.random.default_rng(seed).integers(0, rows, 2560)
        ebc(KeyedJaggedArray(["x", "y"], ids, lengths=lengths))
        ebc.backward(grad)
        return [p.grad for p in ebc.parameters()]

    kept = step(0)
    snapshot = [g.values.copy() for g in kept]
    ebc.zero_grad()
    again = step(0)  # `kept` is still referenced: new memory
    for g, values in zip(kept, snapshot, strict=True):
        np.testing.assert_array_equal(g.values, values)
    where = address(again[0].values)
    ebc.zero_grad()
    del kept, again, g
    grads = step(0)
    assert address(grads[0].values) == where  # the dropped gradient's memory
    for g, values in zip(grads, snapshot, strict=True):
        np.testing.assert_array_equal(g.values, values)
