"""The cases of PyTorch's test/nn/test_embedding.py that apply to a CPU library without autograd.

Ported from ``TestEmbeddingNN`` / ``TestEmbeddingNNDeviceType`` (EmbeddingBag,
float16/bfloat16, forward-mode AD, double backward and large-tensor CUDA cases
left out). ``out.sum().backward()`` becomes ``module.backward(ones)``. Where
PyTorch accepts integer tables in ``from_pretrained`` numbapos refuses them
(a documented difference): the kernels compute in float32 or float64.
"""

import numpy as np
import pytest
import reference as ref
from conftest import host, on

import numbapos
from numbapos import functional as F
from numbapos import nn

torch = pytest.importorskip("torch")


def _sum_backward(module, out, device="cpu"):
    module.backward(on(device, np.ones(tuple(out.shape), out.dtype)))


def test_embedding_sparse_basic(device):
    embedding = nn.Embedding(10, 20, sparse=True, device=device)
    inp = on(device, np.array([[0, 2, 4, 5], [4, 3, 0, 9]]))
    _sum_backward(embedding, embedding(inp), device)
    assert isinstance(embedding.weight.grad, numbapos.SparseRows)
    assert embedding.weight.grad.shape == embedding.weight.shape


@pytest.mark.parametrize("num, dim, indices", [
    (0, 0, np.array([], dtype=np.int64)),
    (10, 0, np.array([[0, 2, 4, 5], [4, 3, 0, 9]])),
])
@pytest.mark.parametrize("sparse", [True, False])
def test_embedding_empty_tables(num, dim, indices, sparse, device):
    # test_embedding_sparse_empty_tensor, and the same for dense gradients.
    embedding = nn.Embedding(num, dim, sparse=sparse, device=device)
    out = embedding(on(device, indices))
    theirs = torch.nn.Embedding(num, dim, sparse=sparse)
    their_out = theirs(torch.from_numpy(indices))
    assert tuple(out.shape) == tuple(their_out.shape)
    _sum_backward(embedding, out, device)
    their_out.sum().backward()
    grad = embedding.weight.grad
    assert isinstance(grad, numbapos.SparseRows) == sparse
    assert grad.shape == embedding.weight.shape == tuple(theirs.weight.shape)
    dense = host(grad.to_dense() if sparse else grad)
    np.testing.assert_array_equal(dense, theirs.weight.grad.to_dense().numpy())


def test_empty_table_refuses_any_real_index():
    with pytest.raises(IndexError, match="num_embeddings=0"):
        nn.Embedding(0, 3)(np.array([0]))
        numbapos.synchronize()  # GPU index errors are deferred
    with pytest.raises(ValueError, match="padding_idx"):
        nn.Embedding(0, 0, padding_idx=0)


def test_embedding_max_norm(device):
    embedding = nn.Embedding(22, 5, max_norm=1.0, device=device)
    output = host(embedding(on(device, np.array([2, 8, 8, 6]))))
    np.testing.assert_array_equal(output[1], output[2])
    assert (np.linalg.norm(output, axis=1) <= 1 + 1e-6).all()


def test_embedding_max_norm_unsorted_repeating_indices(device):
    table = np.random.default_rng(0).standard_normal((20, 64)).astype(np.float32)
    # PyTorch's 4000 indices on the CPU; 300 on CUDA, where the simulator runs each
    # of the lookup's blocks (one per index) as Python threads: still more indices
    # than a block has threads, each row repeated 150 times.
    ix = np.tile(np.arange(2), 2000 if device == "cpu" else 150)
    cpu = nn.Embedding(20, 64, max_norm=1.0, _weight=table.copy())(ix)
    here = nn.Embedding(20, 64, max_norm=1.0, _weight=table.copy(), device=device)
    np.testing.assert_array_equal(host(here(on(device, ix))), cpu)


@pytest.mark.parametrize("tdtype", [torch.float32, torch.float64])
def test_embedding_from_pretrained(tdtype):
    a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=tdtype)
    embedding = nn.Embedding.from_pretrained(a)
    np.testing.assert_array_equal(embedding.weight.data, a.numpy())
    np.testing.assert_array_equal(embedding(torch.tensor([0, 1])), a.numpy())


@pytest.mark.parametrize("tdtype", [torch.uint8, torch.int8, torch.int16, torch.int32,
                                    torch.int64])
def test_embedding_from_pretrained_integer_tables_are_a_documented_difference(tdtype):
    a = torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=tdtype)
    torch.nn.Embedding.from_pretrained(a)  # PyTorch accepts a frozen integer table
    with pytest.raises(TypeError, match="embeddings: expected dtype float32, float64, bfloat16 "
                                        "or float16, got "):
        nn.Embedding.from_pretrained(a)


def test_embedding_from_pretrained_padding_idx():
    padding_idx = 2
    embeddings = torch.rand(4, 3, requires_grad=True)
    with torch.no_grad():
        embeddings[padding_idx] = torch.ones(3) * 7
    embedding = nn.Embedding.from_pretrained(embeddings.detach(), padding_idx=padding_idx)
    np.testing.assert_array_equal(embedding.weight.data[padding_idx], 7.0)


def test_embedding_from_pretrained_options():
    a = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    opts = {"max_norm": 2.0, "norm_type": 0.5, "scale_grad_by_freq": False, "sparse": True}
    embedding = nn.Embedding.from_pretrained(a, **opts)
    output = embedding(torch.tensor([0, 1]))
    np.testing.assert_array_equal(output, a.numpy())  # a was renormalised in place
    assert (a != torch.arange(1, 7, dtype=a.dtype).view(2, 3)).all()
    norms = (np.abs(output) ** 0.5).sum(axis=1) ** 2
    assert (norms <= opts["max_norm"] + 1e-9).all()


def test_embedding_functional():
    a = np.array([[1, 3, 2], [0, 2, 1]])
    embeddings = np.random.default_rng(1).random((4, 3)).astype(np.float32)
    module = nn.Embedding(4, 3)
    module.weight.data = embeddings
    np.testing.assert_array_equal(module(a), F.embedding(a, embeddings))
    module = nn.Embedding.from_pretrained(embeddings, padding_idx=2)
    np.testing.assert_array_equal(module(a), F.embedding(a, embeddings, padding_idx=2))


def test_embedding_dense_grad(device):
    # _assertGradAndGradgradChecks: the gradient against finite differences (float64).
    weight = np.random.default_rng(2).standard_normal((20, 20))
    inp = np.array([[0, 1, 1, 2], [3, 5, 7, 11]])
    probe = np.random.default_rng(3).standard_normal((2, 4, 20))
    embedding = nn.Embedding(20, 20, _weight=weight.copy(), device=device)
    embedding(on(device, inp))
    embedding.backward(on(device, probe))

    def loss():
        return float(np.sum(ref.embedding(inp, weight) * probe))

    np.testing.assert_allclose(host(embedding.weight.grad), ref.finite_difference(loss, weight),
                               rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("weight", [np.array(1.0), np.ones((1, 1, 1))])
def test_embedding_scalar_weight_error(weight):
    with pytest.raises(ValueError, match="weight: expected a 2-D array"):
        F.embedding(np.zeros((2, 2), np.int64), weight)


def test_embedding_backward(device):
    embedding = nn.Embedding(10, 3, sparse=True, dtype=np.float64, device=device)
    tensor = np.array([[7, 1, 3]])
    ones = np.ones((3, 3))

    def grad():
        g = embedding.weight.grad
        return host(g.indices), host(g.values)

    embedding.zero_grad()
    _sum_backward(embedding, embedding(on(device, tensor[0])), device)
    rows, values = grad()
    np.testing.assert_array_equal(rows, np.sort(tensor[0]))  # numbapos keeps rows sorted
    np.testing.assert_array_equal(values, ones)

    embedding.zero_grad()
    _sum_backward(embedding, embedding(on(device, tensor[0])), device)
    _sum_backward(embedding, embedding(on(device, tensor[0])), device)
    rows, values = grad()  # duplicates merged: the same rows, twice the values
    np.testing.assert_array_equal(rows, np.sort(tensor[0]))
    np.testing.assert_array_equal(values, 2 * ones)

    embedding.zero_grad()
    _sum_backward(embedding, embedding(on(device, tensor[0])), device)
    tensor[0, 0] = 8
    _sum_backward(embedding, embedding(on(device, tensor[0])), device)
    rows, values = grad()
    np.testing.assert_array_equal(rows, [1, 3, 7, 8])
    np.testing.assert_array_equal(values, [[2] * 3, [2] * 3, [1] * 3, [1] * 3])


def test_embedding_max_norm_backward(device):
    weight = np.random.default_rng(4).standard_normal((4, 4)).astype(np.float32) * 2
    embedding = nn.Embedding(4, 4, max_norm=1.0, _weight=weight, device=device)
    out = embedding(on(device, np.array([0, 1, 2, 2])))
    _sum_backward(embedding, out, device)
    expected = np.broadcast_to(np.array([[1.0, 1.0, 2.0, 0.0]]).T, (4, 4))
    np.testing.assert_array_equal(host(embedding.weight.grad), expected)


@pytest.mark.parametrize("sparse", [False, True])
def test_embedding_padding_idx(sparse, device):
    embedding = nn.Embedding(10, 20, padding_idx=0, sparse=sparse, device=device)
    output = host(embedding(on(device, np.array([[0, 2, 4, 5], [4, 3, 0, 9]]))))
    assert output[0][0].sum() == 0 and output[1][2].sum() == 0
    embedding = nn.Embedding(10, 20, padding_idx=-2, sparse=sparse, device=device)
    output = host(embedding(on(device, np.array([[0, 2, 8, 5], [4, 8, 0, 9]]))))
    assert output[0][2].sum() == 0 and output[1][1].sum() == 0
    embedding = nn.Embedding(10, 20, padding_idx=2, sparse=sparse, device=device)
    embedding.weight.data = on(device, np.ones((10, 20), np.float32))
    output = host(embedding(on(device, np.array([0, 2]))))
    np.testing.assert_array_equal(output[1], 1.0)
    for bad in (25, -25):
        with pytest.raises(ValueError, match="padding_idx"):
            nn.Embedding(10, 20, padding_idx=bad)


@pytest.mark.parametrize("n", [1, 2, 1000])
@pytest.mark.parametrize("other", [[], [1, 3], [2]])
def test_embedding_padding_row_gets_no_gradient(n, other):
    embedding = nn.Embedding(5, 2, padding_idx=0)
    before = embedding.weight.data[0].copy()
    indices = np.array(other + [0] * n, dtype=np.int64)
    _sum_backward(embedding, embedding(indices))
    np.testing.assert_array_equal((embedding.weight.data + embedding.weight.grad)[0], before)
