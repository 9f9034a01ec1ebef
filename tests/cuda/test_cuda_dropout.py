"""CUDA dropout launchers against the CPU launchers and a NumPy SplitMix64, bit for bit."""

import numpy as np
import pytest
import reference
from conftest import FLOAT_DTYPES
from numba import cuda

from numbapos._args import NO_DROPOUT, DropoutArgs
from numbapos.kernels.cpu import dropout as cpu
from numbapos.kernels.cuda import dropout as gpu
from numbapos.kernels.cuda.arrays import THREADS

# The simulator runs the uint64 hash on NumPy scalars, which warn on (intended) wrap-around.
pytestmark = pytest.mark.filterwarnings("ignore:.*overflow encountered:RuntimeWarning")

SEEDS = [(0, 0), (12345, 7), (2**64 - 1, 2**64 - 2)]
PS = [0.1, 0.5, 1.0]

_M64 = np.uint64
_GAMMA = _M64(0x9E3779B97F4A7C15)


def _mix(z):
    """SplitMix64's finaliser on a uint64 array (array arithmetic wraps silently)."""
    z = (z ^ (z >> _M64(30))) * _M64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _M64(27))) * _M64(0x94D049BB133111EB)
    return z ^ (z >> _M64(31))


def numpy_bits(seed, counter, n):
    """The 32 hash bits of elements 0..n-1, vectorised (independent of numbapos)."""
    one = np.ones(1, dtype=np.uint64)
    key = _mix(_mix(one * _M64(seed) + _GAMMA) + one * _M64(counter) * _GAMMA)
    return _mix(key + np.arange(n, dtype=np.uint64) * _GAMMA) >> _M64(32)


def numpy_dropout(x, drop):
    keep = numpy_bits(drop.seed, drop.counter, x.size) >= drop.threshold
    return x * np.where(keep, x.dtype.type(drop.scale), x.dtype.type(0))


def run_gpu_apply(x, drop):
    out = cuda.device_array_like(x)
    gpu.dropout_apply(cuda.to_device(x), drop, out)
    return out.copy_to_host()


def run_cpu_apply(x, drop):
    out = np.empty_like(x)
    cpu.dropout_apply(x, drop, out)
    return out


def assert_bits_equal(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    uint = np.uint32 if a.dtype == np.float32 else np.uint64
    np.testing.assert_array_equal(a.view(uint), b.view(uint))


@pytest.fixture
def small_grid(monkeypatch):
    """Launch two blocks whatever the size, so that the grid-stride loops take several turns."""
    monkeypatch.setattr(gpu, "grid", lambda work, threads=THREADS: 2)


def test_same_names_as_cpu():
    assert gpu.__all__ == cpu.__all__


def test_numpy_hash_matches_python_reference():
    for seed, counter in SEEDS:
        got = numpy_bits(seed, counter, 20)
        want = [reference.dropout_bits(seed, counter, i) for i in range(20)]
        np.testing.assert_array_equal(got, np.array(want, dtype=np.uint64))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("seed, counter", SEEDS)
def test_apply_bit_identical(dtype, p, seed, counter, rng):
    x = rng.standard_normal(1031).astype(dtype)  # not a multiple of THREADS
    drop = DropoutArgs.make(p, seed, counter)
    got = run_gpu_apply(x, drop)
    assert_bits_equal(got, run_cpu_apply(x, drop))
    assert_bits_equal(got, numpy_dropout(x, drop))
    kept = got != 0
    if p == 1.0:
        assert not kept.any()
    else:
        assert 0 < kept.mean() < 1
        np.testing.assert_array_equal(got[kept], x[kept] * dtype(1.0 / (1.0 - p)))


@pytest.mark.parametrize("seed, counter", SEEDS)
def test_keep_mask_bit_identical(seed, counter):
    for p in PS:
        drop = DropoutArgs.make(p, seed, counter)
        out = cuda.device_array(777, dtype=np.bool_)
        gpu.dropout_keep_mask(drop, out)
        want = np.empty(777, dtype=np.bool_)
        cpu.dropout_keep_mask(drop, want)
        got = out.copy_to_host()
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got, numpy_bits(seed, counter, 777) >= drop.threshold)
        # the mask is the apply's support
        x = np.ones(777, dtype=np.float32)
        np.testing.assert_array_equal(run_gpu_apply(x, drop) != 0, got)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_grid_stride_loops(dtype, small_grid, rng):
    x = rng.standard_normal(3 * 2 * THREADS + 5).astype(dtype)
    drop = DropoutArgs.make(0.3, 99, 2**64 - 1)
    assert_bits_equal(run_gpu_apply(x, drop), run_cpu_apply(x, drop))
    mask = cuda.device_array(x.size, dtype=np.bool_)
    gpu.dropout_keep_mask(drop, mask)
    np.testing.assert_array_equal(mask.copy_to_host(),
                                  numpy_bits(99, 2**64 - 1, x.size) >= drop.threshold)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_inactive_is_a_copy(dtype, rng):
    x = rng.standard_normal(150).astype(dtype)
    x[:4] = [-0.0, np.inf, -np.inf, 5e-45 if dtype == np.float32 else 5e-324]
    for drop in (NO_DROPOUT, DropoutArgs.make(0.0, 3, 4), DropoutArgs.make(0.5, 3, 4, False)):
        assert not drop.active and drop.threshold == 0 and drop.scale == 1.0
        got = run_gpu_apply(x, drop)
        assert_bits_equal(got, x)
        assert_bits_equal(got, run_cpu_apply(x, drop))
        mask = cuda.device_array(x.size, dtype=np.bool_)
        gpu.dropout_keep_mask(drop, mask)
        assert mask.copy_to_host().all()


@pytest.mark.filterwarnings("ignore:.*invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_nan_and_inf_propagate(dtype):
    x = np.array([np.nan, np.inf, -np.inf, 1.0, -0.0] * 40, dtype=dtype)
    drop = DropoutArgs.make(0.5, 7, 1)
    got = run_gpu_apply(x, drop)
    want = run_cpu_apply(x, drop)
    # NaN == NaN here: a GPU writes its canonical NaN, whose bits differ from x86's.
    np.testing.assert_array_equal(got, want)
    dropped = ~(numpy_bits(7, 1, x.size) >= drop.threshold)
    assert np.isnan(got[dropped & np.isinf(x)]).all()
    assert np.isnan(got[np.isnan(x)]).all()


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_in_place(dtype, rng):
    x = rng.standard_normal(500).astype(dtype)
    drop = DropoutArgs.make(0.25, 2**63, 2**32 + 5)
    d_x = cuda.to_device(x)
    gpu.dropout_apply(d_x, drop, d_x)
    assert_bits_equal(d_x.copy_to_host(), run_cpu_apply(x, drop))


def test_empty():
    drop = DropoutArgs.make(0.5, 1, 2)
    x = cuda.device_array(0, dtype=np.float32)
    gpu.dropout_apply(x, drop, cuda.device_array(0, dtype=np.float32))
    gpu.dropout_keep_mask(drop, cuda.device_array(0, dtype=np.bool_))


def test_single_element():
    for seed in range(6):
        drop = DropoutArgs.make(0.5, seed, 0)
        x = np.array([2.5], dtype=np.float32)
        assert_bits_equal(run_gpu_apply(x, drop), run_cpu_apply(x, drop))
