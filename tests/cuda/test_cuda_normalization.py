"""CUDA LayerNorm launchers against the CPU launchers and the NumPy reference.

Runs on Numba's CUDA simulator when there is no GPU (conftest sets
NUMBA_ENABLE_CUDASIM). The simulator runs the THREADS threads of a block as
Python threads, about 0.3 s per row of a per-row kernel, so the inputs are
small; D = 150 is still larger than a block and not a multiple of 32.
"""


import numpy as np
import pytest
import reference
from conftest import FLOAT_DTYPES, dev, nan_device, tolerance

from numbapos._args import chunk_rows, num_chunks
from numbapos.kernels.cpu import normalization as cpu
from numbapos.kernels.cuda import normalization as gpu
from numbapos.kernels.cuda.arrays import THREADS

DIM = 150  # > THREADS and not a multiple of 32
assert DIM > THREADS and DIM % 32


def _cpu_forward(x, w, b, eps):
    rows, dtype = x.shape[0], x.dtype
    y, mean, rstd = np.empty_like(x), np.empty(rows, dtype), np.empty(rows, dtype)
    cpu.layer_norm_rows(x, w, b, eps, y, mean, rstd)
    return y, mean, rstd


def _gpu_forward(x, w, b, eps):
    rows, dtype = x.shape[0], x.dtype
    y, mean, rstd = nan_device(x.shape, dtype), nan_device(rows, dtype), nan_device(rows, dtype)
    gpu.layer_norm_rows(dev(x), dev(w), dev(b), eps, y, mean, rstd)
    return y.copy_to_host(), mean.copy_to_host(), rstd.copy_to_host()


def _cpu_backward(gy, x, mean, rstd, w, want_w, want_b):
    dim, dtype = x.shape[1], x.dtype
    gx = np.empty_like(x)
    gw = np.empty(dim, dtype) if want_w else None
    gb = np.empty(dim, dtype) if want_b else None
    cpu.layer_norm_backward_rows(gy, x, mean, rstd, w, gx, gw, gb)
    return gx, gw, gb


def _gpu_backward(gy, x, mean, rstd, w, want_w, want_b):
    dim, dtype = x.shape[1], x.dtype
    gx = nan_device(x.shape, dtype)
    gw = nan_device(dim, dtype) if want_w else None
    gb = nan_device(dim, dtype) if want_b else None
    gpu.layer_norm_backward_rows(dev(gy), dev(x), dev(mean), dev(rstd), dev(w), gx, gw, gb)
    return tuple(None if a is None else a.copy_to_host() for a in (gx, gw, gb))


def _close(actual, desired, dtype):
    rtol, atol = tolerance(dtype)
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol)


def test_same_launchers_as_cpu():
    assert gpu.__all__ == cpu.__all__


# ------------------------------------------------------------------ forward


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward_matches_cpu_and_reference(rng, dtype):
    # A mean large next to the spread: the corrected two-pass moments keep float32 accurate.
    x = (rng.standard_normal((5, DIM)) * 2 + 30).astype(dtype)
    w = rng.standard_normal(DIM).astype(dtype)
    b = rng.standard_normal(DIM).astype(dtype)
    y, mean, rstd = _gpu_forward(x, w, b, 1e-5)
    assert y.dtype == dtype and mean.dtype == dtype and rstd.dtype == dtype
    for got, want in zip((y, mean, rstd), _cpu_forward(x, w, b, 1e-5), strict=True):
        _close(got, want, dtype)
    ref_y, ref_mean, ref_rstd = reference.layer_norm(x, w, b, eps=1e-5)
    ref_tol = 1e-4 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(y, ref_y, rtol=ref_tol, atol=ref_tol)
    np.testing.assert_allclose(mean, ref_mean, rtol=ref_tol)
    np.testing.assert_allclose(rstd, ref_rstd, rtol=ref_tol)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("affine", ["none", "weight", "bias"])
def test_forward_optional_affine_single_row(rng, dtype, affine):
    dim = 37  # below THREADS: most threads of the block hold nothing
    x = rng.standard_normal((1, dim)).astype(dtype)
    w = rng.standard_normal(dim).astype(dtype) if affine == "weight" else None
    b = rng.standard_normal(dim).astype(dtype) if affine == "bias" else None
    got = _gpu_forward(x, w, b, 1e-5)
    for g, want in zip(got, _cpu_forward(x, w, b, 1e-5), strict=True):
        _close(g, want, dtype)
    np.testing.assert_allclose(got[0], reference.layer_norm(x, w, b, eps=1e-5)[0],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # simulator
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward_zero_variance_with_zero_eps(rng, dtype):
    """var + eps == 0: rstd is inf and the row NaN (as PyTorch), without an exception."""
    x = np.stack([np.full(DIM, 3.5), rng.standard_normal(DIM)]).astype(dtype)
    y, mean, rstd = _gpu_forward(x, None, None, 0.0)
    cpu_y, cpu_mean, cpu_rstd = _cpu_forward(x, None, None, 0.0)
    assert mean[0] == dtype(3.5) and np.isposinf(rstd[0]) and np.isnan(y[0]).all()
    np.testing.assert_array_equal(np.isnan(y), np.isnan(cpu_y))
    np.testing.assert_array_equal(rstd[0], cpu_rstd[0])
    _close(y[1], cpu_y[1], dtype)
    _close(rstd[1], cpu_rstd[1], dtype)


def test_forward_empty():
    x = np.empty((0, DIM), np.float32)
    y, mean, rstd = _gpu_forward(x, None, None, 1e-5)
    assert y.shape == (0, DIM) and mean.shape == (0,) and rstd.shape == (0,)


# ------------------------------------------------------------------ backward


def _backward_inputs(rng, rows, dim, dtype):
    x = (rng.standard_normal((rows, dim)) + 1).astype(dtype)
    w = rng.standard_normal(dim).astype(dtype)
    gy = rng.standard_normal((rows, dim)).astype(dtype)
    _, mean, rstd = _cpu_forward(x, w, None, 1e-5)
    return gy, x, mean, rstd, w


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward_matches_cpu_bitwise(rng, dtype):
    rows = 20  # two chunks of 16 and 4 rows
    assert chunk_rows(rows) == 16 and num_chunks(rows) == 2
    gy, x, mean, rstd, w = _backward_inputs(rng, rows, DIM, dtype)
    gx, gw, gb = _gpu_backward(gy, x, mean, rstd, w, True, True)
    cpu_gx, cpu_gw, cpu_gb = _cpu_backward(gy, x, mean, rstd, w, True, True)
    _close(gx, cpu_gx, dtype)
    # The weight / bias gradients add the same terms in the same order as the CPU.
    np.testing.assert_array_equal(gw, cpu_gw)
    np.testing.assert_array_equal(gb, cpu_gb)
    # ... and that order matters: one running sum over all rows gives other bits.
    assert not np.array_equal(np.cumsum(gy, axis=0, dtype=dtype)[-1], gb)
    ref_gx, ref_gw, ref_gb = reference.layer_norm_backward(gy, x, w, eps=1e-5)
    ref_tol = 1e-4 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(gx, ref_gx, rtol=ref_tol, atol=ref_tol)
    np.testing.assert_allclose(gw, ref_gw, rtol=ref_tol, atol=ref_tol)
    np.testing.assert_allclose(gb, ref_gb, rtol=ref_tol, atol=ref_tol)


@pytest.mark.parametrize(("want_w", "want_b", "weight"),
                         [(True, False, True), (False, True, False), (False, False, True)])
def test_backward_optional_outputs(rng, want_w, want_b, weight):
    dtype = np.float32
    gy, x, mean, rstd, w = _backward_inputs(rng, 3, 40, dtype)
    w = w if weight else None
    got = _gpu_backward(gy, x, mean, rstd, w, want_w, want_b)
    want = _cpu_backward(gy, x, mean, rstd, w, want_w, want_b)
    _close(got[0], want[0], dtype)
    for g, c in zip(got[1:], want[1:], strict=True):
        assert (g is None) == (c is None)
        if g is not None:
            np.testing.assert_array_equal(g, c)
    # Same inputs, same bits: run again.
    for g, again in zip(got, _gpu_backward(gy, x, mean, rstd, w, want_w, want_b), strict=True):
        if g is not None:
            np.testing.assert_array_equal(g, again)


def test_backward_empty_zero_fills():
    x = np.empty((0, DIM), np.float64)
    mean = np.empty(0, np.float64)
    gx, gw, gb = _gpu_backward(x, x, mean, mean, None, True, True)
    assert gx.shape == (0, DIM)
    np.testing.assert_array_equal(gw, np.zeros(DIM))
    np.testing.assert_array_equal(gb, np.zeros(DIM))
