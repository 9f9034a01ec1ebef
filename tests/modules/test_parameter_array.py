"""Array-like parameters: indexing, ufuncs and operators, numpy(), shape/dtype/ndim/size;
SparseRows refuses an implicit conversion to a NumPy array."""

import numpy as np
import pytest
from conftest import host, on

import numbapos
from numbapos import nn
from numbapos.sparse import SparseRows


def _param(device="cpu"):
    return nn.Parameter(on(device, np.arange(12, dtype=np.float32).reshape(4, 3)))


def test_metadata_like_numpy():
    p = _param()
    assert (p.shape, p.dtype, p.ndim, p.size, len(p)) == ((4, 3), np.float32, 2, 12, 4)
    assert p.numpy() is p.data
    np.testing.assert_array_equal([row for row in p], p.data)


def test_indexing_gives_views_and_writes_bump_the_version():
    p = _param()
    row = p[1]
    assert isinstance(row, np.ndarray) and np.shares_memory(row, p.data)
    np.testing.assert_array_equal(p[1:3, ::2], p.data[1:3, ::2])
    assert p[2, 1] == 7.0
    np.testing.assert_array_equal(p[[0, 3]], p.data[[0, 3]])
    version = p.version
    p[0] = [-1, -2, -3]
    p[1, 1] = nn.Parameter(np.array(9.5, np.float32)).data
    assert p.version == version + 2
    np.testing.assert_array_equal(p.data[:2], [[-1, -2, -3], [3, 9.5, 5]])


def test_ufuncs_and_operators_return_numpy_arrays():
    p, q = _param(), _param()
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    for got, want in [(p + 1, x + 1), (1 - p, 1 - x), (p * q, x * x), (p / 2, x / 2),
                      (-p, -x), (p ** 2, x ** 2), (p @ x.T, x @ x.T), (x @ q.T, x @ x.T),
                      (np.exp(p), np.exp(x)), (np.maximum(p, 5), np.maximum(x, 5)),
                      (p == q, x == x), (p > 4, x > 4), (np.add.reduce(p, axis=0), x.sum(0))]:
        assert type(got) is np.ndarray
        np.testing.assert_array_equal(got, want)
    assert np.sum(p) == x.sum() and np.mean(p) == x.mean()
    # Hashing stays by identity (parameters are dict keys and set members).
    assert len({p, q}) == 2 and {p: 1}[p] == 1
    # Nothing above changed the parameters.
    np.testing.assert_array_equal(p.data, x)
    assert p.version == 0


def test_in_place_operators_keep_the_parameter_and_bump_the_version():
    emb = nn.Embedding(4, 3, seed=0)
    weight, data = emb.weight, emb.weight.data
    want = data * 0.5 + 1
    emb.weight *= 0.5
    emb.weight += 1
    assert emb.weight is weight and emb.weight.data is data
    assert list(emb.parameters()) == [weight] and weight.version == 2
    np.testing.assert_array_equal(weight.data, want)
    np.add(weight, 1, out=weight)
    np.add.at(weight, [0, 0], 1)
    assert weight.version == 4
    np.testing.assert_array_equal(weight.data[0], want[0] + 3)


def test_a_changed_table_is_noticed_by_a_pending_backward():
    norm = nn.LayerNorm(3)
    norm(np.ones((2, 3), np.float32))
    norm.weight *= 2
    with pytest.raises(RuntimeError, match="'weight' was modified after the forward"):
        norm.backward(np.ones((2, 3), np.float32))


def test_on_the_gpu_indexing_stays_on_the_device_and_numpy_maths_raises():
    p = _param("cuda")
    row = p[1]
    assert numbapos.device_of(row) == "cuda"
    np.testing.assert_array_equal(host(p[1:3]), np.arange(3, 9).reshape(2, 3))
    assert p[2, 1] == 7.0
    p[0] = np.array([-1, -2, -3], np.float32)
    np.testing.assert_array_equal(host(p.data)[0], [-1, -2, -3])
    assert p.version == 1
    for call in (lambda: p + 1, lambda: np.exp(p), lambda: p.numpy(), lambda: list(p),
                 lambda: np.add(np.ones((4, 3), np.float32), 1, out=p)):
        with pytest.raises(TypeError, match="the Parameter lives on 'cuda'.*numbapos.to_host"):
            call()
    with pytest.raises(TypeError, match="lives on 'cuda'"):
        p += 1
    assert p.version == 1
    np.testing.assert_array_equal(np.asarray(p), host(p.data))  # the documented host copy


def test_sparse_rows_refuse_an_implicit_numpy_array(device):
    grad = SparseRows(on(device, np.array([1, 3])), on(device, np.ones((2, 2), np.float32)), 5)
    for convert in (np.asarray, np.array, np.sum, lambda g: np.add(g, 1)):
        with pytest.raises(TypeError, match=r"SparseRows cannot be converted.*\.to_dense\(\)"):
            convert(grad)
    np.testing.assert_array_equal(host(grad.to_dense())[[1, 3]], np.ones((2, 2)))
