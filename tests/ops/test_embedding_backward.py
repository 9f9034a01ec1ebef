"""Gradient of the embedding lookup: dense, sparse, padding, frequency scaling, determinism.

Tests of the ops take the ``device`` fixture (conftest): they run on the CPU and
on CUDA (Numba's simulator without a GPU, so CUDA shapes stay tiny). The
thread-count test and lists of floats stay on the CPU.
"""

import itertools

import numba
import numpy as np
import pytest
import reference as ref
from conftest import FLOAT_DTYPES, INDEX_DTYPES, device_cases, host, on, two_threads

import numbapos
import numbapos.functional as F
from numbapos import SparseRows, _device

PADDING = [None, 0, 3, -1]
SHAPES = [(), (0,), (9,), (4, 6), (2, 3, 4)]
_ALL = list(itertools.product(PADDING, (False, True), SHAPES))
# CUDA: every padding, scaling and shape, with the four dtype pairs in turn.
_DTYPE_PAIRS = list(itertools.product(FLOAT_DTYPES, INDEX_DTYPES))
DENSE_CASES = device_cases(
    [(d, i, *rest) for d, i in _DTYPE_PAIRS for rest in _ALL],
    [(*_DTYPE_PAIRS[k % 4], *rest) for k, rest in enumerate(_ALL)])


@pytest.mark.parametrize("device, dtype, index_dtype, padding_idx, scale, shape", DENSE_CASES,
                         indirect=["device"])
def test_dense_backward_matches_reference(rng, device, dtype, index_dtype, padding_idx, scale,
                                          shape):
    num, dim = 7, 5
    indices = rng.integers(0, num, size=shape).astype(index_dtype)
    grad = rng.normal(size=shape + (dim,)).astype(dtype)
    got = F.embedding_backward(on(device, grad), on(device, indices), num,
                               padding_idx=padding_idx, scale_grad_by_freq=scale)
    pad = None if padding_idx is None else padding_idx % num
    expected = ref.embedding_backward(grad, indices, num, pad, scale)
    assert got.shape == (num, dim) and got.dtype == dtype
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(host(got), expected, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("padding_idx", [None, 2])
@pytest.mark.parametrize("scale", [False, True])
def test_sparse_backward_equals_dense(rng, device, padding_idx, scale):
    indices = on(device, np.array([[5, 2, 5], [0, 2, 9]]))
    grad = on(device, rng.normal(size=(2, 3, 4)))
    dense = F.embedding_backward(grad, indices, 10, padding_idx, scale)
    sparse = F.embedding_backward(grad, indices, 10, padding_idx, scale, sparse=True)
    assert isinstance(sparse, SparseRows) and sparse.device == device
    expected_rows = [0, 5, 9] if padding_idx == 2 else [0, 2, 5, 9]
    np.testing.assert_array_equal(host(sparse.indices), expected_rows)
    assert sparse.indices.dtype == np.int64
    assert sparse.shape == (10, 4)
    np.testing.assert_array_equal(host(sparse.to_dense()), host(dense))


@pytest.mark.parametrize("ids", [
    [7, 3, 7, 7, 0, 3],
    list(range(0, 1 << 20, 1 << 12)) * 2,            # strided ids: hash-collision prone
    [2**62 + 5, 17, 2**62 + 5, 2**40, 17],           # ids far beyond any hash table
    [5] * 100,
    [9],
])
@pytest.mark.parametrize("padding_idx", [None, 17, 5, 123456])
def test_group_by_row_is_a_stable_sort_by_row(ids, padding_idx):
    from numbapos.kernels.cpu.embedding import group_by_row

    flat = np.array(ids, dtype=np.int64)
    rows, starts, counts, order = group_by_row(flat, padding_idx)
    expected_rows = [r for r in np.unique(flat) if r != padding_idx]
    np.testing.assert_array_equal(rows, expected_rows)
    assert rows.dtype == np.int64
    stable = np.argsort(flat, kind="stable")
    for row, start, count in zip(rows, starts, counts, strict=True):
        np.testing.assert_array_equal(order[start:start + count], stable[flat[stable] == row])


@pytest.mark.parametrize("dtype", INDEX_DTYPES)
@pytest.mark.parametrize("size", [2, 15, 16, 17, 300, 5000, 70_000])
@pytest.mark.parametrize("spread", [
    lambda rng, n: rng.integers(0, 3, n),                  # one narrow digit
    lambda rng, n: rng.integers(10**6, 10**6 + 2**20, n),  # an offset: sorted by id - min
    lambda rng, n: rng.integers(0, 2**9, n) << 11,         # low digit the same for all
    lambda rng, n: rng.integers(0, 2**24, n),              # 10^7 rows: two 12-bit digits
    lambda rng, n: rng.integers(0, 2**12, n) << 12,        # a whole 12-bit digit the same
    lambda rng, n: rng.integers(0, 2**31 - 1, n),          # three or more passes
    lambda rng, n: rng.integers(0, 2**31, n) | (np.arange(n) % 2 << 31),  # 32-bit keys
    lambda rng, n: rng.integers(-2**40, 2**40, n),         # keys wider than 32 bits
    lambda rng, n: np.full(n, 77),                         # every id equal
], ids=["narrow", "offset", "constant-low-digit", "24-bit", "constant-12-bit-digit", "wide",
        "32-bit", "41-bit", "equal"])
def test_radix_grouping_equals_a_stable_argsort(rng, dtype, size, spread):
    # The grouping's radix sort: any digit width, skipped passes, odd and even
    # numbers of moving passes all give NumPy's stable argsort.
    from numbapos.kernels.cpu.embedding import group_by_row

    flat = spread(rng, size).astype(dtype)
    rows, starts, counts, order = group_by_row(flat, None)
    np.testing.assert_array_equal(order, np.argsort(flat, kind="stable"))
    values, first, number = np.unique(flat, return_index=True, return_counts=True)
    np.testing.assert_array_equal(rows, values)
    np.testing.assert_array_equal(counts, number)
    np.testing.assert_array_equal(starts, np.concatenate([[0], np.cumsum(number)[:-1]]))


def test_grouping_scratch_is_per_thread_and_never_escapes():
    # The grouping pass reuses per-thread scratch: results from threads running at
    # once, and results kept from earlier calls, must stay intact.
    from concurrent.futures import ThreadPoolExecutor

    from numbapos.kernels.cpu.embedding import group_by_row, unique_rows

    rng = np.random.default_rng(3)
    batches = [rng.integers(0, 50 + 40 * k, size=300 + 97 * k) for k in range(12)]

    def expected(flat):
        stable = np.argsort(flat, kind="stable")
        return np.unique(flat), stable

    def check(flat):
        got = group_by_row(flat, None)
        uniq = unique_rows(flat)
        return flat, [a.copy() for a in got], got, uniq

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(check, batches * 3))
    for flat, snapshot, kept, uniq in results:
        rows, stable = expected(flat)
        np.testing.assert_array_equal(snapshot[0], rows)
        np.testing.assert_array_equal(snapshot[3], stable)
        for now, then in zip(kept, snapshot, strict=True):
            np.testing.assert_array_equal(now, then)  # later calls did not overwrite it
        np.testing.assert_array_equal(uniq, rows)


def test_sparse_backward_cost_does_not_depend_on_the_table_size(device):
    # A table of 10**15 rows could never be allocated: the sparse gradient only ever
    # works in the space of the rows the indices name.
    indices = on(device, np.array([[10**15 - 1, 3], [3, 10**12]]))
    grad = on(device, np.arange(8.0).reshape(2, 2, 2))
    got = F.embedding_backward(grad, indices, 10**15, sparse=True)
    assert got.shape == (10**15, 2)
    np.testing.assert_array_equal(host(got.indices), [3, 10**12, 10**15 - 1])
    np.testing.assert_array_equal(host(got.values), [[2 + 4, 3 + 5], [6, 7], [0, 1]])


def test_sparse_backward_of_empty_batch(device):
    result = F.embedding_backward(on(device, np.zeros((0, 3))),
                                  on(device, np.zeros(0, dtype=np.int64)), 4, sparse=True)
    assert result.indices.shape == (0,) and result.values.shape == (0, 3)
    assert result.device == device


def test_scale_grad_by_freq_pytorch_case(device):
    grad = on(device, np.array([[1.0, 2.0], [3.0, 5.0], [7.0, 11.0]]))
    got = F.embedding_backward(grad, on(device, np.array([1, 1, 2])), 3, scale_grad_by_freq=True)
    np.testing.assert_array_equal(host(got), [[0, 0], [2, 3.5], [7, 11]])


def test_scale_counts_padding_occurrences(device):
    # Row 1 occurs twice next to padding row 0 occurring three times: PyTorch divides
    # by each row's own count, padding included in the counting.
    grad = on(device, np.ones((5, 1)))
    got = F.embedding_backward(grad, on(device, np.array([0, 0, 0, 1, 1])), 2, padding_idx=0,
                               scale_grad_by_freq=True)
    np.testing.assert_array_equal(host(got), [[0.0], [1.0]])


# 1000 repeats of the padding id on the simulator take seconds per case: there 600 by
# default (still over the simulator's 512-thread grid stride and 19 tiles of its sort),
# 1000 under the exhaustive marker; the CPU takes 1000.
@pytest.mark.parametrize("device, repeats", [
    pytest.param(device, repeats, id=f"{device}-{repeats}",
                 marks=pytest.mark.exhaustive if (device, repeats) == ("cuda", 1000) else ())
    for device in ("cpu", "cuda") for repeats in (1, 2, 600, 1000)
    if (device, repeats) != ("cpu", 600)], indirect=["device"])
@pytest.mark.parametrize("sparse", [False, True])
def test_padding_row_gets_exactly_zero(rng, device, repeats, sparse):
    indices = np.array([4] * repeats + [1, 2])
    grad = rng.normal(size=(indices.size, 3))
    got = F.embedding_backward(on(device, grad), on(device, indices), 5, padding_idx=4,
                               sparse=sparse)
    dense = host(got.to_dense() if sparse else got)
    assert np.all(dense[4] == 0.0)
    np.testing.assert_allclose(dense[1], grad[repeats])


def test_padding_idx_minus_two_means_row_eight(device):
    indices = on(device, np.array([8, 8, 3]))
    got = host(F.embedding_backward(on(device, np.ones((3, 2))), indices, 10, padding_idx=-2))
    np.testing.assert_array_equal(got[8], [0, 0])
    np.testing.assert_array_equal(got[3], [1, 1])


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("scale", [False, True])
def test_bit_identical_across_thread_counts_and_runs(rng, sparse, scale):
    indices = rng.zipf(1.3, size=(64, 128)) % 300  # heavy repeats of the low rows
    grad = rng.normal(size=(64, 128, 48)).astype(np.float32)
    threads = numba.get_num_threads()
    results = []
    try:
        for n in sorted({1, two_threads(), threads}):
            numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
            for _ in range(2):
                g = F.embedding_backward(grad, indices, 300, padding_idx=0,
                                         scale_grad_by_freq=scale, sparse=sparse)
                results.append(g.to_dense() if sparse else g)
    finally:
        numba.set_num_threads(threads)
    for other in results[1:]:
        assert np.array_equal(results[0].view(np.uint32), other.view(np.uint32))


def test_sum_is_in_input_order(device):
    # 1e8 + 1 - 1e8 in float32: input order gives 0 + ... exactly as a serial loop.
    grad = np.array([[1e8], [1.0], [-1e8]], dtype=np.float32)
    got = host(F.embedding_backward(on(device, grad), on(device, np.array([0, 0, 0])), 1))
    expected = np.float32(0)
    for g in grad[:, 0]:
        expected = np.float32(expected + g)
    assert got[0, 0] == expected


def test_gradient_matches_finite_differences(rng, device):
    # The finite differences probe the CPU lookup (hundreds of calls); the gradient
    # under test is computed on ``device``.
    indices = np.array([[1, 3, 1], [0, 3, 3]])
    weight = rng.normal(size=(5, 4))
    probe = rng.normal(size=(2, 3, 4))

    def loss():
        return float(np.sum(np.sin(F.embedding(indices, weight)) * probe))

    grad_out = np.cos(F.embedding(indices, weight)) * probe
    got = F.embedding_backward(on(device, grad_out), on(device, indices), 5, padding_idx=0)
    numeric = ref.finite_difference(loss, weight)
    numeric[0] = 0  # padding row gets no gradient by definition
    np.testing.assert_allclose(host(got), numeric, rtol=1e-6, atol=1e-8)


# ------------------------------------------------------------------ errors


def test_grad_shape_mismatch(device):
    with pytest.raises(ValueError, match=r"grad_output: expected shape indices.shape \+ \(D,\)"):
        F.embedding_backward(on(device, np.zeros((3, 4))), on(device, np.array([[0, 1, 2]])), 5)
    with pytest.raises(ValueError, match="grad_output"):
        F.embedding_backward(on(device, np.zeros(3)), on(device, np.array([0, 1, 2])), 5)


def test_backward_index_errors(device):
    grad = on(device, np.zeros((2, 4)))
    with pytest.raises(IndexError, match=r"index 5 .*num_embeddings=5"):
        F.embedding_backward(grad, on(device, np.array([0, 5])), 5)
        numbapos.synchronize()  # GPU index errors are deferred
    with pytest.raises(IndexError, match=r"index -1"):
        F.embedding_backward(grad, on(device, np.array([-1, 0])), 5)
        numbapos.synchronize()  # GPU index errors are deferred
    with pytest.raises(TypeError, match="indices"):
        F.embedding_backward(grad, on(device, np.array([0.0, 1.0])), 5)


def test_backward_other_errors(device):
    indices = on(device, np.array([0, 1]))
    with pytest.raises(TypeError, match="grad_output"):
        F.embedding_backward(on(device, np.zeros((2, 4), dtype=np.int32)), indices, 5)
    with pytest.raises(ValueError, match="num_embeddings"):
        F.embedding_backward(on(device, np.zeros((2, 4))), indices, -1)
    with pytest.raises(ValueError, match="padding_idx"):
        F.embedding_backward(on(device, np.zeros((2, 4))), indices, 5, padding_idx=5)


def test_sparse_rows_merge_and_validation(device):
    a = SparseRows(np.array([1, 4]), on(device, np.ones((2, 2))), 6)
    b = SparseRows(np.array([0, 4]), on(device, np.full((2, 2), 2.0)), 6)
    assert a.device == device and _device.device_of(a.indices) == device  # host rows were moved
    merged = a + b
    assert merged.device == device
    np.testing.assert_array_equal(host(merged.indices), [0, 1, 4])
    np.testing.assert_array_equal(host(merged.to_dense()),
                                  host(a.to_dense()) + host(b.to_dense()))
    with pytest.raises(ValueError, match="indices"):
        SparseRows(np.array([1]), on(device, np.ones((2, 2))), 6)
    with pytest.raises(ValueError, match="shapes"):
        a + SparseRows(np.array([1]), on(device, np.ones((1, 2))), 7)


def test_summing_two_backward_gradients_matches_numpy_on_each_device(rng, device):
    # Gradient accumulation of two sparse backwards: rows in one, the other, or both;
    # a value of -0.0 in one only keeps its sign (coalescing a concatenation).
    grad_a = rng.standard_normal((3, 4, 5)).astype(np.float32)
    grad_b = rng.standard_normal((2, 5)).astype(np.float32)
    ids_a, ids_b = np.array([[1, 7, 7, 0], [9, 1, 3, 3], [0, 0, 7, 2]]), np.array([7, 11])
    grad_a[1, 2] = -0.0  # row 3 gets -0.0 + x; row 9 alone: -0.0 only if its only term
    grad_a[1, 0] = -0.0
    a = F.embedding_backward(on(device, grad_a), on(device, ids_a), 12, sparse=True)
    b = F.embedding_backward(on(device, grad_b), on(device, ids_b), 12, sparse=True)
    merged = a + b
    want = np.zeros((12, 5), np.float32)
    np.add.at(want, ids_a.ravel(), grad_a.reshape(-1, 5))
    rows = np.union1d(ids_a, ids_b)
    np.testing.assert_array_equal(host(merged.indices), rows)
    got = host(merged.values)
    expected = {}
    for rows_of, grads in ((ids_a.ravel(), grad_a.reshape(-1, 5)), (ids_b, grad_b)):
        part = {}
        for r, g in zip(rows_of, grads, strict=True):
            part[r] = g.copy() if r not in part else part[r] + g
        for r, g in part.items():
            expected[r] = g if r not in expected else expected[r] + g
    for j, r in enumerate(rows):
        assert got[j].tobytes() == expected[r].tobytes(), r
    assert np.signbit(got[list(rows).index(9)]).all()  # -0.0 kept


def test_summing_gradients_checks_rows_a_caller_may_have_changed(device):
    a = F.embedding_backward(on(device, np.ones((2, 3), np.float32)), on(device, np.array([1, 4])),
                             6, sparse=True)
    b = SparseRows(np.array([0, 2]), on(device, np.ones((2, 3), np.float32)), 6)
    host_rows = b.indices  # handed out: b is checked again before it is merged
    if device == "cpu":
        host_rows[1] = 6
        with pytest.raises(IndexError, match="other.indices: index 6"):
            a + b
    np.testing.assert_array_equal(host((a + a).values), 2 * np.ones((2, 3), np.float32))


@pytest.mark.parametrize("indices, values, num_rows, error, match", [
    (np.array([6]), np.ones((1, 2)), 6, IndexError, "index 6 .* num_rows=6"),
    (np.array([10**9]), np.ones((1, 2)), 6, IndexError, "index 1000000000"),
    (np.array([-1]), np.ones((1, 2)), 6, IndexError, "index -1"),
    (np.array([2, 2]), np.ones((2, 2)), 6, ValueError, "unique and sorted.*2 before 2"),
    (np.array([3, 1]), np.ones((2, 2)), 6, ValueError, "unique and sorted.*3 before 1"),
    (np.array([1.0]), np.ones((1, 2)), 6, TypeError, "indices: expected integer"),
    (np.array([[1]]), np.ones((1, 2)), 6, ValueError, "indices: expected a 1-D"),
    (np.array([1]), np.ones((1, 2), np.int64), 6, TypeError, "values: expected dtype"),
    (np.array([1]), [[1.0, 2.0]], 6, TypeError, "values: expected a NumPy or CUDA array"),
    (np.array([1]), np.ones((1, 2)), -6, ValueError, "num_rows"),
])
def test_sparse_rows_rejects_rows_an_optimiser_would_write_out_of_bounds(device, indices, values,
                                                                         num_rows, error, match):
    # SGD writes the listed rows with an unchecked kernel: a row past the table was a
    # segfault, a repeated row a wrong momentum update.
    if isinstance(values, np.ndarray):
        values = on(device, values)
    with pytest.raises(error, match=match):
        SparseRows(on(device, indices), values, num_rows)
