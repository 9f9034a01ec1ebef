"""CUDA positional launchers against the CPU launchers and NumPy expressions.

Elementwise ops and the batch sums (one thread per output element, batch order)
must match the CPU bit for bit; the sinusoid table within 1e-6 / 1e-10.
"""

import numpy as np
import pytest
import reference as ref
from conftest import FLOAT_DTYPES, INDEX_DTYPES, dev, nan_device

from numbapos.kernels.cpu import positional as cpu
from numbapos.kernels.cuda import positional as gpu
from numbapos.kernels.cuda.arrays import THREADS

SHAPES = [(1, 1, 1), (2, 3, 5), (3, 2, 129), (1, 2, 300)]  # (N, L, D); D > THREADS too


def assert_bits_equal(a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape
    uint = {4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    np.testing.assert_array_equal(a.view(uint), b.view(uint))


def sinusoid_bound(dtype):
    return 1e-6 if dtype == np.float32 else 1e-10


@pytest.fixture
def small_grid(monkeypatch):
    """Launch one block whatever the size, so that the grid-stride loops take several turns."""
    monkeypatch.setattr(gpu, "grid", lambda work, threads=THREADS: 1)


def inv_freq(dim, base=10000.0):
    return base ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)


def test_same_names_as_cpu():
    assert gpu.__all__ == cpu.__all__


# ---------------------------------------------------------------- sinusoid table


def gpu_sinusoid(rows, dim, dtype, offset=0):
    out = nan_device((rows, dim), dtype)
    gpu.sinusoid_fill(inv_freq(dim), offset, out)
    return out.copy_to_host()


def cpu_sinusoid(rows, dim, dtype, offset=0):
    out = np.empty((rows, dim), dtype=dtype)
    cpu.sinusoid_fill(inv_freq(dim), offset, out)
    return out


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("rows, dim, offset", [(1, 1, 0), (1, 2, 0), (5, 7, 0), (9, 8, 3),
                                               (3, 129, 0), (2, 300, 11)])
def test_sinusoid_matches_cpu_and_formula(rows, dim, offset, dtype):
    got = gpu_sinusoid(rows, dim, dtype, offset)
    bound = sinusoid_bound(dtype)
    np.testing.assert_allclose(got, cpu_sinusoid(rows, dim, dtype, offset), rtol=0, atol=bound)
    want = ref.sinusoidal_table(rows, dim, offset=offset)
    np.testing.assert_allclose(got, want, rtol=0, atol=bound)


def test_sinusoid_layout_and_odd_dim():
    got = gpu_sinusoid(3, 5, np.float64)
    w = inv_freq(5)
    for p in range(3):
        np.testing.assert_allclose(got[p, 0::2], np.sin(p * w), rtol=0, atol=1e-15)
        np.testing.assert_allclose(got[p, 1::2], np.cos(p * w[:2]), rtol=0, atol=1e-15)
    np.testing.assert_array_equal(got[0], [0, 1, 0, 1, 0])  # odd D ends with a sin


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("dim", [4, 33])
def test_sinusoid_tall_table_rows(dim, dtype):
    """The last rows of a 65536-row CPU table (its recurrence at its longest) against a
    GPU table of those rows, computed at the matching offset."""
    total, rows = 65536, 40
    tall = cpu_sinusoid(total, dim, dtype)
    got = gpu_sinusoid(rows, dim, dtype, offset=total - rows)
    bound = sinusoid_bound(dtype)
    np.testing.assert_allclose(got, tall[-rows:], rtol=0, atol=bound)
    want = ref.sinusoidal_table(rows, dim, offset=total - rows)
    np.testing.assert_allclose(got, want, rtol=0, atol=bound)


def test_sinusoid_large_offset():
    offset = 10**9 + 7
    got = gpu_sinusoid(3, 6, np.float64, offset=offset)
    np.testing.assert_allclose(got, ref.sinusoidal_table(3, 6, offset=offset), rtol=0,
                               atol=1e-9)


def test_sinusoid_grid_stride(small_grid):
    got = gpu_sinusoid(7, 50, np.float64, offset=2)  # 350 elements on one block
    np.testing.assert_allclose(got, ref.sinusoidal_table(7, 50, offset=2), rtol=0, atol=1e-10)


# ---------------------------------------------------------------- x + P


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_add_rows(shape, dtype, rng):
    n, l, d = shape
    start = 2
    x = rng.standard_normal(shape).astype(dtype)
    table = rng.standard_normal((l + start + 1, d)).astype(dtype)
    out = nan_device(shape, dtype)
    gpu.add_rows(dev(x), dev(table), start, out)
    want = np.empty_like(x)
    cpu.add_rows(x, table, start, want)
    assert_bits_equal(out.copy_to_host(), want)
    assert_bits_equal(out.copy_to_host(), x + table[start:start + l])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_add_rows_in_place_and_grid_stride(dtype, small_grid, rng):
    x = rng.standard_normal((3, 4, 50)).astype(dtype)
    table = rng.standard_normal((4, 50)).astype(dtype)
    d_x = dev(x)
    gpu.add_rows(d_x, dev(table), 0, d_x)
    assert_bits_equal(d_x.copy_to_host(), x + table)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("shared", [False, True])
def test_add_gathered_rows(shape, shared, index_dtype, dtype, rng):
    n, l, d = shape
    m = 4
    x = rng.standard_normal(shape).astype(dtype)
    table = rng.standard_normal((m, d)).astype(dtype)
    positions = rng.integers(0, m, size=(1 if shared else n, l)).astype(index_dtype)
    positions[0, 0] = m - 1  # the last row of the table
    out = nan_device(shape, dtype)
    gpu.add_gathered_rows(dev(x), dev(table), dev(positions), out)
    want = np.empty_like(x)
    cpu.add_gathered_rows(x, table, positions, want)
    assert_bits_equal(out.copy_to_host(), want)
    assert_bits_equal(out.copy_to_host(), x + table[positions])


def test_add_gathered_rows_repeated_and_grid_stride(small_grid, rng):
    x = rng.standard_normal((3, 5, 40))
    table = rng.standard_normal((6, 40))
    positions = np.array([[5, 5, 0, 5, 1]] * 3, dtype=np.int64)
    out = nan_device(x.shape, x.dtype)
    gpu.add_gathered_rows(dev(x), dev(table), dev(positions), out)
    assert_bits_equal(out.copy_to_host(), x + table[positions])


def ordered_batch_sum(grad):
    """Sum over axis 0 one row at a time, in order, in grad's dtype."""
    acc = np.zeros(grad.shape[1:], dtype=grad.dtype)
    for n in range(grad.shape[0]):
        acc = acc + grad[n]
    return acc


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES + [(7, 3, 2), (0, 3, 4), (2, 0, 4)])
def test_sum_over_batch(shape, dtype, rng):
    n, l, d = shape
    start, m = 1, l + 3
    grad = (rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, size=shape)).astype(dtype)
    out = nan_device((m, d), dtype)
    gpu.sum_over_batch(dev(grad), start, out)
    want = np.full((m, d), np.nan, dtype=dtype)
    cpu.sum_over_batch(grad, start, want)
    got = out.copy_to_host()
    assert_bits_equal(got, want)
    expected = np.zeros((m, d), dtype=dtype)
    expected[start:start + l] = ordered_batch_sum(grad)
    assert_bits_equal(got, expected)


def test_sum_over_batch_grid_stride(small_grid, rng):
    grad = rng.standard_normal((5, 6, 30)).astype(np.float32)
    out = nan_device((9, 30), np.float32)
    gpu.sum_over_batch(dev(grad), 3, out)
    expected = np.zeros((9, 30), dtype=np.float32)
    expected[3:9] = ordered_batch_sum(grad)
    assert_bits_equal(out.copy_to_host(), expected)


# ---------------------------------------------------------------- A * X + B


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_mult_add(shape, dtype, rng):
    n, l, d = shape
    m = l + 2
    x = rng.standard_normal(shape).astype(dtype)
    a = rng.standard_normal((m, d)).astype(dtype)
    b = rng.standard_normal((m, d)).astype(dtype)
    out = nan_device(shape, dtype)
    gpu.mult_add(dev(x), dev(a), dev(b), out)
    want = np.empty_like(x)
    cpu.mult_add(x, a, b, want)
    got = out.copy_to_host()
    assert_bits_equal(got, want)
    assert_bits_equal(got, a[:l] * x + b[:l])  # product and sum rounded separately


def test_mult_add_in_place_and_grid_stride(small_grid, rng):
    x = rng.standard_normal((2, 5, 30)).astype(np.float32)
    a = rng.standard_normal((5, 30)).astype(np.float32)
    b = rng.standard_normal((5, 30)).astype(np.float32)
    d_x = dev(x)
    gpu.mult_add(d_x, dev(a), dev(b), d_x)
    assert_bits_equal(d_x.copy_to_host(), a * x + b)


def run_mult_add_backward(mod, grad, x, a, to_dev):
    m, d = a.shape
    grad_x = nan_device(x.shape, x.dtype) if to_dev else np.full(x.shape, np.nan, x.dtype)
    grad_a = nan_device((m, d), x.dtype) if to_dev else np.full((m, d), np.nan, x.dtype)
    grad_b = nan_device((m, d), x.dtype) if to_dev else np.full((m, d), np.nan, x.dtype)
    args = (dev(grad), dev(x), dev(a)) if to_dev else (grad, x, a)
    mod.mult_add_backward(*args, grad_x, grad_a, grad_b)
    if to_dev:
        return grad_x.copy_to_host(), grad_a.copy_to_host(), grad_b.copy_to_host()
    return grad_x, grad_a, grad_b


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES + [(6, 3, 2), (0, 3, 4)])
def test_mult_add_backward(shape, dtype, rng):
    n, l, d = shape
    m = l + 2
    grad = rng.standard_normal(shape).astype(dtype)
    x = rng.standard_normal(shape).astype(dtype)
    a = rng.standard_normal((m, d)).astype(dtype)
    got = run_mult_add_backward(gpu, grad, x, a, True)
    want = run_mult_add_backward(cpu, grad, x, a, False)
    for g, w in zip(got, want, strict=True):
        assert_bits_equal(g, w)
    grad_x, grad_a, grad_b = got
    assert_bits_equal(grad_x, grad * a[:l])
    expected_a = np.zeros((m, d), dtype=dtype)
    expected_a[:l] = ordered_batch_sum(grad * x)
    expected_b = np.zeros((m, d), dtype=dtype)
    expected_b[:l] = ordered_batch_sum(grad)
    assert_bits_equal(grad_a, expected_a)
    assert_bits_equal(grad_b, expected_b)


def test_mult_add_backward_grid_stride(small_grid, rng):
    grad, x = rng.standard_normal((2, 2, 3, 70))
    a = rng.standard_normal((4, 70))
    got = run_mult_add_backward(gpu, grad, x, a, True)
    want = run_mult_add_backward(cpu, grad, x, a, False)
    for g, w in zip(got, want, strict=True):
        assert_bits_equal(g, w)


# ---------------------------------------------------------------- positions from padding


def run_positions(ids, padding_idx, past, pad_position):
    out = nan_device(ids.shape, np.int64)
    gpu.positions_from_padding(dev(ids), padding_idx, dev(past.astype(np.int64)), pad_position,
                               out)
    want = np.full(ids.shape, -7, dtype=np.int64)
    cpu.positions_from_padding(ids, padding_idx, past.astype(np.int64), pad_position, want)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, ref.positions_from_padding(ids, padding_idx, past,
                                                                  pad_position))
    return got


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_positions_from_padding(index_dtype, rng):
    ids = rng.integers(0, 4, size=(5, 9)).astype(index_dtype)
    ids[0] = 0  # all padding
    ids[1] = 3  # no padding
    past = np.array([0, 2, 0, 7, 2**40])
    got = run_positions(ids, 0, past, 1)
    assert (got[0] == 1).all()
    np.testing.assert_array_equal(got[1], 2 + np.arange(9))


def test_positions_from_padding_example():
    ids = np.array([[0, 0, 7, 8], [7, 8, 0, 0]])
    got = run_positions(ids, 0, np.zeros(2, dtype=np.int64), 0)
    np.testing.assert_array_equal(got, [[0, 0, 0, 1], [0, 1, 0, 0]])


def test_positions_from_padding_many_long_rows(rng):
    ids = rng.integers(0, 3, size=(THREADS + 5, 130)).astype(np.int32)
    past = rng.integers(0, 1000, size=THREADS + 5)
    run_positions(ids, 1, past, -1)
    run_positions(ids, 2**40, past, 5)  # padding_idx beyond int32: no padding


def test_positions_from_padding_grid_stride(small_grid, rng):
    ids = rng.integers(0, 3, size=(THREADS + 3, 4))
    run_positions(ids, 0, np.arange(THREADS + 3), 0)


def test_empty_inputs():
    gpu.add_rows(dev(np.zeros((0, 2, 3))), dev(np.zeros((2, 3))), 0, nan_device((0, 2, 3), float))
    gpu.mult_add(dev(np.zeros((2, 0, 3))), dev(np.zeros((1, 3))), dev(np.zeros((1, 3))),
                 nan_device((2, 0, 3), float))
    gpu.positions_from_padding(dev(np.zeros((0, 3), dtype=np.int64)), 0,
                               dev(np.zeros(0, dtype=np.int64)), 0, nan_device((0, 3), np.int64))
