"""CUDA embedding launchers against the CPU launchers and NumPy oracles.

Runs on Numba's CUDA simulator where no GPU is present (conftest sets
NUMBA_ENABLE_CUDASIM=1); shapes are tiny because the simulator runs every
thread as a Python thread.
"""

import inspect

import numpy as np
import pytest
from conftest import FLOAT_DTYPES, INDEX_DTYPES, dev, nan_device

from numbapos.kernels.cpu import embedding as cpu
from numbapos.kernels.cuda import embedding as gpu


def test_same_launchers_and_signatures():
    assert gpu.__all__ == cpu.__all__
    for name in cpu.__all__:
        assert inspect.signature(getattr(gpu, name)) == inspect.signature(getattr(cpu, name))


# ---------------------------------------------------------------- index_bounds


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("values", [
    [4],
    [-3],
    [5, 5, 5],
    [2, 9, -1, 7, 0],
])
def test_index_bounds_small(index_dtype, values):
    flat = np.array(values, dtype=index_dtype)
    got = gpu.index_bounds(dev(flat))
    assert got == (flat.min(), flat.max()) == cpu.index_bounds(flat)
    assert all(type(v) is int for v in got)


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("where", ["first", "last", "middle"])
def test_index_bounds_several_blocks(rng, index_dtype, where):
    # 300 values: three blocks, the last one partly idle.
    flat = rng.integers(10, 1000, size=300).astype(index_dtype)
    low_at, high_at = {"first": (0, 1), "last": (299, 298), "middle": (150, 151)}[where]
    flat[low_at], flat[high_at] = -7, 2**31 - 1
    assert gpu.index_bounds(dev(flat)) == (-7, 2**31 - 1) == cpu.index_bounds(flat)


def test_index_bounds_grid_stride(rng, monkeypatch):
    # Fewer blocks than the data needs: each thread walks several elements.
    monkeypatch.setattr(gpu, "BOUNDS_BLOCKS", 2)
    flat = rng.integers(-50, 50, size=700).astype(np.int64)
    flat[613] = -2**40
    flat[677] = 2**40
    assert gpu.index_bounds(dev(flat)) == (-2**40, 2**40)


def test_index_bounds_refuses_empty():
    with pytest.raises(ValueError, match="non-empty"):
        gpu.index_bounds(dev(np.zeros(0, np.int64)))


# ---------------------------------------------------------------- gather_rows


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("num, dim, n", [(5, 3, 7), (1, 1, 1), (4, 130, 3), (6, 33, 0), (3, 0, 4)])
def test_gather_rows(rng, dtype, index_dtype, num, dim, n):
    weight = rng.normal(size=(num, dim)).astype(dtype)
    flat = rng.integers(0, num, size=n).astype(index_dtype)
    if n > 2:
        flat[1] = flat[2]  # a repeated index
    out = nan_device((n, dim), dtype)
    gpu.gather_rows(dev(flat), dev(weight), out)
    got = out.copy_to_host()
    expected = np.empty((n, dim), dtype)
    cpu.gather_rows(flat, weight, expected)
    np.testing.assert_array_equal(got, weight[flat])
    np.testing.assert_array_equal(got, expected)


# ---------------------------------------------------------------- renorm_used_rows_


def _row_norms(weight, p):
    w = np.abs(weight.astype(np.float64))
    if p == np.inf:
        return w.max(axis=1)
    return (w ** p).sum(axis=1) ** (1.0 / p)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("norm_type, dim", [(2.0, 40), (2.0, 200), (1.0, 40), (np.inf, 200),
                                            (3.0, 40), (0.5, 200)])
def test_renorm_matches_cpu_and_oracle(rng, dtype, norm_type, dim):
    num = 7
    weight = rng.normal(size=(num, dim)).astype(dtype)
    weight *= np.arange(1, num + 1, dtype=dtype)[:, None]  # rows of growing norm
    flat = np.array([5, 1, 3, 5, 1, 1, 6], dtype=np.int64)
    norms = _row_norms(weight, norm_type)
    max_norm = float(np.median(norms[[1, 3, 5, 6]]))  # some used rows clipped, some not

    got_d = dev(weight)
    gpu.renorm_used_rows_(got_d, dev(flat), max_norm, norm_type)
    got = got_d.copy_to_host()
    expected = weight.copy()
    cpu.renorm_used_rows_(expected, flat, max_norm, norm_type)

    clipped = [r for r in (1, 3, 5, 6) if norms[r] > max_norm]
    assert 0 < len(clipped) < 4
    oracle = weight.copy()
    for r in clipped:
        oracle[r] *= dtype(max_norm / (norms[r] + 1e-7))
    # The row norm is a float64 tree sum here and a serial one on the CPU, ~1e-16
    # apart: casting the scale to float32 rounds that away (unless it falls within
    # 1e-16 of a rounding boundary), while float64 results keep a few ulp of it.
    if dtype == np.float32:
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(got, oracle)
    else:
        np.testing.assert_allclose(got, expected, rtol=1e-14, atol=0)
        np.testing.assert_allclose(got, oracle, rtol=1e-14, atol=0)
    for r in sorted(set(range(num)) - set(clipped)):
        np.testing.assert_array_equal(got[r], weight[r])  # untouched rows keep their bits


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_renorm_pytorch_case_each_row_scaled_once(rng, dtype):
    # PyTorch's test_embedding_max_norm: repeated indices must not scale a row twice.
    weight = rng.normal(size=(20, 64)).astype(dtype)
    flat = np.tile(np.arange(2), 3)
    got_d = dev(weight)
    gpu.renorm_used_rows_(got_d, dev(flat), 1.0, 2.0)
    got = got_d.copy_to_host()
    np.testing.assert_allclose(np.linalg.norm(got[:2].astype(np.float64), axis=1), 1.0,
                               rtol=1e-6)
    expected = weight.copy()
    cpu.renorm_used_rows_(expected, flat, 1.0, 2.0)
    # The norms are summed in different orders (the GPU's tree, the CPU's vector
    # lanes): a few float64 ulps apart, which the scale carries into the row.
    np.testing.assert_array_max_ulp(got, expected, maxulp=4)
    np.testing.assert_array_equal(got[2:], weight[2:])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_renorm_edge_cases(rng, dtype, index_dtype):
    # A single row of one column, and no indices at all.
    weight = np.array([[-3.0], [0.5]], dtype=dtype)
    got_d = dev(weight)
    gpu.renorm_used_rows_(got_d, dev(np.array([0], dtype=index_dtype)), 1.0, 2.0)
    got = got_d.copy_to_host()
    assert got[0, 0] == dtype(-3.0) * dtype(1.0 / (3.0 + 1e-7))
    assert got[1, 0] == dtype(0.5)
    gpu.renorm_used_rows_(got_d, dev(np.zeros(0, index_dtype)), 1e-3, 2.0)
    np.testing.assert_array_equal(got_d.copy_to_host(), got)


# ---------------------------------------------------------------- scatter_rows


def _oracle_scatter(grad, flat, num, padding_idx, scale):
    """np.add.at sums in input order: the same float additions as the kernels."""
    out = np.zeros((num, grad.shape[1]), grad.dtype)
    if scale and flat.size:
        counts = np.bincount(flat, minlength=num)
        inv = np.ones(num, grad.dtype) / np.maximum(counts, 1).astype(grad.dtype)
        grad = grad * inv[flat][:, None]
    np.add.at(out, flat, grad)
    if padding_idx is not None:
        out[padding_idx] = 0
    return out


SCATTER_CASES = [  # (num, dim, n)
    (7, 5, 20),
    (4, 130, 9),  # D larger than a block
    (1, 1, 5),  # a single row
    (6, 33, 1),  # a single index
    (5, 3, 0),  # empty
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("padding_idx", [None, 0])
@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("num, dim, n", SCATTER_CASES)
def test_scatter_rows_dense_bit_identical(rng, dtype, index_dtype, padding_idx, scale, num, dim,
                                          n):
    flat = rng.integers(0, num, size=n).astype(index_dtype)
    grad = rng.normal(size=(n, dim)).astype(dtype)
    out = dev(np.zeros((num, dim), dtype))  # the contract: out arrives zero-filled
    gpu.scatter_rows(dev(grad), dev(flat), padding_idx, scale, out)
    got = out.copy_to_host()
    expected = np.zeros((num, dim), dtype)
    cpu.scatter_rows(grad, flat, padding_idx, scale, expected)
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got, _oracle_scatter(grad, flat, num, padding_idx, scale))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("padding_idx", [None, 0])
@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("num, dim, n", SCATTER_CASES)
def test_scatter_rows_sparse_bit_identical(rng, dtype, index_dtype, padding_idx, scale, num,
                                           dim, n):
    flat = rng.integers(0, num, size=n).astype(index_dtype)
    grad = rng.normal(size=(n, dim)).astype(dtype)
    rows_d, values_d = gpu.scatter_rows_sparse(dev(grad), dev(flat), num, padding_idx, scale)
    rows, values = rows_d.copy_to_host(), values_d.copy_to_host()
    expected_rows, expected_values = cpu.scatter_rows_sparse(grad, flat, num, padding_idx, scale)
    assert rows.dtype == np.int64 and values.dtype == dtype
    assert values.shape == (rows.size, dim)
    np.testing.assert_array_equal(rows, expected_rows)
    np.testing.assert_array_equal(values, expected_values)
    dense = _oracle_scatter(grad, flat, num, padding_idx, scale)
    present = np.unique(flat)
    if padding_idx is not None:
        present = present[present != padding_idx]
    np.testing.assert_array_equal(rows, present)
    np.testing.assert_array_equal(values, dense[present])


@pytest.mark.parametrize("sparse", [False, True])
def test_scatter_sums_in_input_order(sparse):
    # float32: (1e8 + 1) - 1e8 == 0 but (1e8 - 1e8) + 1 == 1; input order gives 0 + 2.
    grad = np.array([[1e8], [1.0], [-1e8], [2.0]], np.float32)
    flat = np.array([3, 3, 3, 1], np.int32)
    if sparse:
        rows, values = gpu.scatter_rows_sparse(dev(grad), dev(flat), 4, None, False)
        np.testing.assert_array_equal(rows.copy_to_host(), [1, 3])
        np.testing.assert_array_equal(values.copy_to_host(), [[2.0], [0.0]])
    else:
        out = dev(np.zeros((4, 1), np.float32))
        gpu.scatter_rows(dev(grad), dev(flat), None, False, out)
        np.testing.assert_array_equal(out.copy_to_host(), [[0.0], [2.0], [0.0], [0.0]])


def test_scatter_scale_grad_by_freq_pytorch_case():
    grad = np.array([[1.0, 2.0], [3.0, 5.0], [7.0, 11.0]])
    out = dev(np.zeros((3, 2), np.float64))
    gpu.scatter_rows(dev(grad), dev(np.array([1, 1, 2])), None, True, out)
    np.testing.assert_array_equal(out.copy_to_host(), [[0, 0], [2, 3.5], [7, 11]])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_scatter_all_padding(rng, dtype):
    flat = np.full(4, 2, np.int64)
    grad = rng.normal(size=(4, 3)).astype(dtype)
    out = dev(np.zeros((5, 3), dtype))
    gpu.scatter_rows(dev(grad), dev(flat), 2, True, out)
    np.testing.assert_array_equal(out.copy_to_host(), np.zeros((5, 3), dtype))
    rows, values = gpu.scatter_rows_sparse(dev(grad), dev(flat), 5, 2, False)
    assert rows.shape == (0,) and values.shape == (0, 3) and values.dtype == dtype


# ---------------------------------------------------------------- not_equal_mask


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("n", [0, 1, 300])
def test_not_equal_mask(rng, index_dtype, n):
    flat = rng.integers(0, 4, size=n).astype(index_dtype)
    out = dev(np.zeros(n, np.bool_)) if n == 0 else dev(np.arange(n) % 2 == 0)
    gpu.not_equal_mask(dev(flat), 2, out)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got, flat != 2)
    expected = np.empty(n, np.bool_)
    cpu.not_equal_mask(flat, 2, expected)
    np.testing.assert_array_equal(got, expected)
