"""CUDA embedding launchers against the CPU launchers and NumPy oracles.

Runs on Numba's CUDA simulator where no GPU is present (conftest sets
NUMBA_ENABLE_CUDASIM=1); shapes are tiny because the simulator runs every
thread as a Python thread.
"""

import inspect

import numpy as np
import pytest
from conftest import FLOAT_DTYPES, INDEX_DTYPES, dev, dtype_pairs_in_turn, nan_device

from numbapos.kernels import cpu as cpu_arrays
from numbapos.kernels import cuda as gpu_arrays
from numbapos.kernels.cpu import embedding as cpu
from numbapos.kernels.cuda import embedding as gpu


def test_same_launchers_and_signatures():
    assert gpu.__all__ == cpu.__all__
    for name in cpu.__all__:
        assert inspect.signature(getattr(gpu, name)) == inspect.signature(getattr(cpu, name))


# ---------------------------------------------------------------- deferred index checks


def _sparse_via_groups(backend, grad, flat, num, padding_idx, scale):
    """``(rows, values)`` of the sparse gradient: group_rows then sum_row_groups, trimmed
    to the rows used (on the GPU the count stays on the device: read it here)."""
    groups = backend.group_rows(flat, padding_idx, num)
    values = backend.empty((groups.rows.shape[0], grad.shape[1]), grad.dtype)
    backend.sum_row_groups(grad, groups, scale, values)
    if backend is cpu_arrays:
        return groups.rows, values
    used = int(groups.used.copy_to_host()[0])
    return groups.rows.copy_to_host()[:used], values.copy_to_host()[:used]


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_check_indices_defers_on_the_gpu(index_dtype):
    import numbapos

    flat = np.array([2, 9, -1, 7, 0], dtype=index_dtype)
    assert cpu.check_indices(flat, 5) == 1
    assert cpu.check_indices(flat[[0, 4]], 5) == -1
    assert gpu.check_indices(dev(flat), 5, "ids", "vocab") == -1  # queued, not waited for
    with pytest.raises(IndexError, match=r"ids: index 9 \(at flat position 1\) is out of "
                                         r"range for vocab=5; valid indices are 0 <= index < 5"):
        numbapos.synchronize()
    numbapos.synchronize()  # cleared: the context lives on
    assert gpu.check_indices(dev(flat[[0, 4]]), 5) == -1
    numbapos.synchronize()


def test_gather_records_the_first_bad_position_and_zero_fills_it(rng):
    import numbapos

    weight = rng.normal(size=(4, 3)).astype(np.float32)
    flat = np.array([1, 3, 7, 0, -2, 2], np.int64)
    out = nan_device((6, 3), np.float32)
    gpu.gather_rows(dev(flat), dev(weight), out)
    with pytest.raises(IndexError, match=r"index 7 \(at flat position 2\).*num_embeddings=4"):
        numbapos.synchronize()
    got = out.copy_to_host()
    np.testing.assert_array_equal(got[[0, 1, 3, 5]], weight[[1, 3, 0, 2]])
    np.testing.assert_array_equal(got[[2, 4]], 0)  # never read out of bounds


@pytest.mark.parametrize("num", [1, 5, 300, 70_000])  # one, two and three radix passes
def test_group_rows_matches_the_cpu(rng, num):
    n = 300  # two blocks of the sort
    flat = rng.integers(0, num, size=n).astype(np.int64)
    flat[:40] = flat[0]  # a hot row
    padding_idx = int(flat[7]) if num > 1 else None
    groups = gpu.group_rows(dev(flat), padding_idx, num)
    expected = cpu.group_rows(flat, padding_idx, num)
    used = groups.used.copy_to_host()
    assert used[0] == expected.used
    assert used[1] == expected.counts.sum()
    m = expected.used
    np.testing.assert_array_equal(groups.rows.copy_to_host()[:m], expected.rows)
    np.testing.assert_array_equal(groups.counts.copy_to_host()[:m], expected.counts)
    # Each row's positions, in increasing order (the CPU's order also holds the padding
    # positions, so only the segments compare, not where they start).
    starts, order = groups.starts.copy_to_host(), groups.order.copy_to_host()
    for j in range(m):
        got = order[starts[j]:starts[j] + expected.counts[j]]
        want = expected.order[expected.starts[j]:expected.starts[j] + expected.counts[j]]
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, np.flatnonzero(flat == expected.rows[j]))


def test_group_rows_leaves_bad_indices_out_and_records_them():
    import numbapos

    flat = np.array([3, 1, 8, 3, -1, 1], np.int64)
    groups = gpu.group_rows(dev(flat), None, 4)
    used = groups.used.copy_to_host()
    assert tuple(used) == (2, 4)
    np.testing.assert_array_equal(groups.rows.copy_to_host()[:2], [1, 3])
    np.testing.assert_array_equal(groups.order.copy_to_host()[:4], [1, 5, 0, 3])
    with pytest.raises(IndexError, match=r"index 8 \(at flat position 2\)"):
        numbapos.synchronize()


def test_state_writing_kernels_do_nothing_while_an_error_is_pending(rng):
    import numbapos

    weight = rng.normal(size=(5, 4))
    grad = rng.normal(size=(3, 4))
    out = dev(np.zeros((5, 4)))
    table = dev(weight)
    gpu.check_indices(dev(np.array([9])), 5)  # an error, not raised yet
    gpu.scatter_rows(dev(grad), dev(np.array([0, 1, 1])), None, False, out)
    gpu.renorm_used_rows_(table, dev(np.array([0, 1])), 1e-3, 2.0)
    with pytest.raises(IndexError, match="index 9"):
        numbapos.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), 0)
    np.testing.assert_array_equal(table.copy_to_host(), weight)
    gpu.scatter_rows(dev(grad), dev(np.array([0, 1, 1])), None, False, out)  # usable again
    assert out.copy_to_host()[1].any()


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
# Every padding, scaling and shape, with the four (dtype, index dtype) pairs in turn;
# the other pairs of each under the exhaustive marker (the simulator runs each case).
SCATTER_PARAMS = dtype_pairs_in_turn([(padding_idx, scale, *case) for padding_idx in (None, 0)
                                      for scale in (False, True) for case in SCATTER_CASES])


@pytest.mark.parametrize("dtype, index_dtype, padding_idx, scale, num, dim, n", SCATTER_PARAMS)
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


@pytest.mark.parametrize("dtype, index_dtype, padding_idx, scale, num, dim, n", SCATTER_PARAMS)
def test_scatter_rows_sparse_bit_identical(rng, dtype, index_dtype, padding_idx, scale, num,
                                           dim, n):
    flat = rng.integers(0, num, size=n).astype(index_dtype)
    grad = rng.normal(size=(n, dim)).astype(dtype)
    rows, values = _sparse_via_groups(gpu_arrays, dev(grad), dev(flat), num, padding_idx, scale)
    expected_rows, expected_values = _sparse_via_groups(cpu_arrays, grad, flat, num,
                                                        padding_idx, scale)
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
        rows, values = _sparse_via_groups(gpu_arrays, dev(grad), dev(flat), 4, None, False)
        np.testing.assert_array_equal(rows, [1, 3])
        np.testing.assert_array_equal(values, [[2.0], [0.0]])
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
    rows, values = _sparse_via_groups(gpu_arrays, dev(grad), dev(flat), 5, 2, False)
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


@pytest.mark.parametrize("dtype", [np.int64, np.float64])
def test_contiguous_casts_on_the_device(dtype):
    # arrays.contiguous with another dtype: an elementwise cast kernel, no host copy.
    x = np.array([[3, -1], [7, 2]], np.int32)
    got = gpu_arrays.contiguous(dev(x), dtype)
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    np.testing.assert_array_equal(got.copy_to_host(), x.astype(dtype))
    same = dev(x)
    assert gpu_arrays.contiguous(same, np.int32) is same  # no copy when nothing changes


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("which", ["Embedding", "BertEmbeddings"])
def test_module_keeps_the_ids_its_lookup_kernel_read(which, index_dtype, device):
    # A recorded forward on CUDA ids: the lookup kernel writes the backward's copy of them
    # as it reads them, so a caller overwriting its id buffer (on the device) before the
    # backward changes nothing; the gradients are those of a module whose ids stay put.
    import numbapos
    from numbapos import nn

    rng = np.random.default_rng(3)
    ids = rng.integers(0, 7, size=(2, 5)).astype(index_dtype)
    grads = {}
    for overwrite in (False, True):
        if which == "Embedding":
            module = nn.Embedding(7, 8, padding_idx=1, dtype=np.float64, seed=0, device=device)
        else:
            module = nn.BertEmbeddings(7, 8, 16, hidden_dropout_prob=0.2, seed=0,
                                       dtype=np.float64, device=device).train()
        given = numbapos.to_device(ids, device)
        y = module(given)
        if overwrite:
            numbapos._device.copy_into(given, numbapos.to_device(np.zeros_like(ids), device)) \
                if device == "cuda" else given.fill(0)
        module.backward(numbapos.to_device(np.ones(tuple(y.shape)), device))
        grads[overwrite] = {name: numbapos.to_host(p.grad)
                            for name, p in module.named_parameters()}
    for name, grad in grads[False].items():
        np.testing.assert_array_equal(grads[True][name], grad, err_msg=name)
    assert np.count_nonzero(grads[False]["weight" if which == "Embedding"
                                         else "word_embeddings.weight"])
