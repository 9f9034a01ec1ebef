"""LayerNorm: functional forward/backward and nn.LayerNorm against the NumPy reference.

Tests of the ops run on the CPU and on CUDA (the ``device`` fixture; Numba's CUDA
simulator without a GPU, about 0.2 s per row there, so CUDA gets small shapes and
a subset of the combinations). Thread-count, serial/parallel-kernel,
non-contiguous-input, large-shape and finite-difference tests stay on the CPU.
"""

import numba
import numpy as np
import pytest
import reference
from conftest import FLOAT_DTYPES, device_cases, host, on, two_threads

from numbapos import _args, _device, nn
from numbapos import functional as F

SHAPES = [(5,), (3, 7), (2, 3, 16), (64, 600)]  # the last one takes the parallel kernels
AFFINES = ["none", "weight", "bias", "both"]

# The combinations that also run on CUDA: each small shape, each affine variant and
# each dtype at least once (the simulator is slow; (64, 600) stays on the CPU).
CUDA_FORWARD = [(np.float32, (5,), "none"), (np.float32, (3, 7), "both"),
                (np.float32, (2, 3, 16), "weight"), (np.float64, (3, 7), "bias"),
                (np.float64, (5,), "both")]
CUDA_BACKWARD = [(np.float32, (5,)), (np.float64, (3, 7)), (np.float32, (2, 3, 16))]


def _tol(dtype, device="cpu"):
    """(rtol, atol) against the float64 reference; CUDA sums a row in another order."""
    if np.dtype(dtype) == np.float32:
        return (1e-5 if device == "cpu" else 2e-5), 2e-5
    return 1e-12, 1e-12


def _affine(rng, dim, dtype):
    return (rng.standard_normal(dim).astype(dtype), rng.standard_normal(dim).astype(dtype))


def _assert_on(device, *arrays):
    for a in arrays:
        assert _device.device_of(a) == device, f"result on {_device.device_of(a)}, not {device}"


# ------------------------------------------------------------------ forward


@pytest.mark.parametrize(("device", "dtype", "shape", "affine"),
                         device_cases([(d, s, a) for a in AFFINES for s in SHAPES
                                       for d in FLOAT_DTYPES], CUDA_FORWARD),
                         indirect=["device"])
def test_forward_matches_reference(rng, device, dtype, shape, affine):
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    w, b = _affine(rng, shape[-1], dtype)
    w = w if affine in ("weight", "both") else None
    b = b if affine in ("bias", "both") else None
    y, mean, rstd = F.layer_norm_forward(on(device, x), on(device, w), on(device, b), eps=1e-5)
    _assert_on(device, y, mean, rstd)
    ref_y, ref_mean, ref_rstd = reference.layer_norm(x, w, b, eps=1e-5)
    rtol, atol = _tol(dtype, device)
    assert y.dtype == dtype and y.shape == shape
    assert mean.shape == shape[:-1] and rstd.shape == shape[:-1]
    np.testing.assert_allclose(host(y), ref_y, rtol=rtol, atol=atol)
    np.testing.assert_allclose(host(mean), ref_mean, rtol=rtol, atol=atol)
    np.testing.assert_allclose(host(rstd), ref_rstd, rtol=rtol, atol=atol)
    np.testing.assert_array_equal(
        host(F.layer_norm(on(device, x), on(device, w), on(device, b), eps=1e-5)), host(y))


def test_float32_within_1e5_of_float64_even_with_large_mean(rng, device):
    # The corrected two-pass statistics keep float32 close although mean >> std.
    rows = 33 if device == "cpu" else 4
    x = (rng.standard_normal((rows, 768)) * 0.5 + 10.0).astype(np.float32)
    y = F.layer_norm(on(device, x), eps=1e-12)
    ref = reference.layer_norm(x, eps=1e-12)[0]
    assert np.abs(host(y) - ref).max() <= 1e-5


def test_constant_rows_give_bias(rng, device):
    x = np.full((4, 9), 3.25, dtype=np.float32)
    w, b = _affine(rng, 9, np.float32)
    y = host(F.layer_norm(on(device, x), on(device, w), on(device, b), eps=1e-5))
    np.testing.assert_array_equal(y, np.broadcast_to(b, y.shape))


def test_non_contiguous_input_and_out_buffer(rng):
    # CPU only: a CUDA input must be C-contiguous (test_out_buffer covers out= there).
    base = rng.standard_normal((6, 20))
    x = base[:, ::2]
    out = np.empty((6, 10))
    y = F.layer_norm(x, eps=1e-5, out=out)
    assert y is out
    np.testing.assert_allclose(y, reference.layer_norm(x, eps=1e-5)[0], rtol=1e-12, atol=1e-12)


def test_out_buffer(rng, device):
    x = rng.standard_normal((2, 10))
    w = rng.standard_normal(10)
    out = on(device, np.full((2, 10), np.nan))
    assert F.layer_norm(on(device, x), on(device, w), eps=1e-5, out=out) is out
    np.testing.assert_allclose(host(out), reference.layer_norm(x, w, eps=1e-5)[0],
                               rtol=1e-12, atol=1e-12)
    gy = rng.standard_normal((2, 10))
    _, mean, rstd = F.layer_norm_forward(x, w, eps=1e-5)
    grad_out = on(device, np.full((2, 10), np.nan))
    gx, _, _ = F.layer_norm_backward(on(device, gy), on(device, x), on(device, mean),
                                     on(device, rstd), on(device, w), out=grad_out)
    assert gx is grad_out
    np.testing.assert_allclose(host(gx), reference.layer_norm_backward(gy, x, w, eps=1e-5)[0],
                               rtol=1e-10, atol=1e-10)


def test_empty_leading_dims(device):
    y, mean, rstd = F.layer_norm_forward(on(device, np.zeros((0, 4), dtype=np.float32)))
    _assert_on(device, y, mean, rstd)
    assert y.shape == (0, 4) and mean.shape == (0,) and rstd.shape == (0,)
    gx, gw, gb = F.layer_norm_backward(y, y, mean, rstd, on(device, np.ones(4, np.float32)))
    _assert_on(device, gx, gw, gb)
    assert gx.shape == (0, 4)
    np.testing.assert_array_equal(host(gw), np.zeros(4, np.float32))
    np.testing.assert_array_equal(host(gb), np.zeros(4, np.float32))


# ------------------------------------------------------------------ backward


@pytest.mark.parametrize(("device", "dtype", "shape"),
                         device_cases([(d, s) for s in SHAPES for d in FLOAT_DTYPES],
                                      CUDA_BACKWARD),
                         indirect=["device"])
def test_backward_matches_reference(rng, device, dtype, shape):
    x = rng.standard_normal(shape).astype(dtype)
    gy = rng.standard_normal(shape).astype(dtype)
    w, b = _affine(rng, shape[-1], dtype)
    dx, dw, db = on(device, x), on(device, w), on(device, b)
    _, mean, rstd = F.layer_norm_forward(dx, dw, db, eps=1e-5)
    gx, gw, gb = F.layer_norm_backward(on(device, gy), dx, mean, rstd, dw, db)
    _assert_on(device, gx, gw, gb)
    ref_gx, ref_gw, ref_gb = reference.layer_norm_backward(gy, x, w, eps=1e-5)
    rtol, atol = (1e-4, 1e-4) if np.dtype(dtype) == np.float32 else (1e-10, 1e-10)
    for got, want in ((gx, ref_gx), (gw, ref_gw), (gb, ref_gb)):
        assert got.dtype == dtype
        np.testing.assert_allclose(host(got), want, rtol=rtol, atol=atol)


def test_backward_which_gradients(rng, device):
    x = rng.standard_normal((2, 5))
    gy = rng.standard_normal((2, 5))
    w, b = _affine(rng, 5, np.float64)
    dx, dgy, dw, db = on(device, x), on(device, gy), on(device, w), on(device, b)
    _, mean, rstd = F.layer_norm_forward(dx, dw, db)
    assert F.layer_norm_backward(dgy, dx, mean, rstd)[1:] == (None, None)
    _, gw, gb = F.layer_norm_backward(dgy, dx, mean, rstd, dw)
    assert gw is not None and gb is not None
    _, gw, gb = F.layer_norm_backward(dgy, dx, mean, rstd, None, db)
    assert gw is None
    np.testing.assert_allclose(host(gb), gy.sum(0), rtol=1e-12)


@pytest.mark.parametrize("shape", [(3, 6), (2, 2, 5)])
def test_gradients_match_finite_differences(rng, shape):
    # CPU only: two forward passes per element (test_backward_matches_reference covers CUDA).
    x = rng.standard_normal(shape)
    w, b = _affine(rng, shape[-1], np.float64)
    probe = rng.standard_normal(shape)

    def loss():
        return float((F.layer_norm(x, w, b, eps=1e-3) * probe).sum())

    _, mean, rstd = F.layer_norm_forward(x, w, b, eps=1e-3)
    gx, gw, gb = F.layer_norm_backward(probe, x, mean, rstd, w, b)
    np.testing.assert_allclose(gx, reference.finite_difference(loss, x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(gw, reference.finite_difference(loss, w), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(gb, reference.finite_difference(loss, b), rtol=1e-6, atol=1e-7)


def test_chunking_depends_only_on_rows():
    assert _args.chunk_rows(1) == _args.MIN_CHUNK_ROWS
    assert _args.chunk_rows(4096) == _args.MIN_CHUNK_ROWS
    assert -(-100_000 // _args.chunk_rows(100_000)) <= _args.MAX_CHUNKS
    assert _args.num_chunks(100_000) <= _args.MAX_CHUNKS


def _threads():
    return two_threads()


def test_deterministic_for_any_thread_count(rng):
    x = rng.standard_normal((300, 200)).astype(np.float32)  # parallel kernels, many chunks
    gy = rng.standard_normal((300, 200)).astype(np.float32)
    w, b = _affine(rng, 200, np.float32)
    results = []
    before = numba.get_num_threads()
    try:
        for threads in (1, _threads()):
            numba.set_num_threads(threads)
            y, mean, rstd = F.layer_norm_forward(x, w, b)
            results.append((y, *F.layer_norm_backward(gy, x, mean, rstd, w, b)))
    finally:
        numba.set_num_threads(before)
    for first, second in zip(*results, strict=True):
        np.testing.assert_array_equal(first, second)


def test_serial_and_parallel_kernels_agree_bitwise(rng, parallel_threshold):
    x = rng.standard_normal((40, 33)).astype(np.float32)
    gy = rng.standard_normal((40, 33)).astype(np.float32)
    w, b = _affine(rng, 33, np.float32)
    outs = []
    for threshold in (1 << 40, 1):  # serial, then parallel kernels
        parallel_threshold(threshold)
        y, mean, rstd = F.layer_norm_forward(x, w, b)
        outs.append((y, mean, rstd, *F.layer_norm_backward(gy, x, mean, rstd, w, b)))
    for first, second in zip(*outs, strict=True):
        np.testing.assert_array_equal(first, second)


# ------------------------------------------------------------------ errors


def test_forward_errors(rng, device):
    x_host = rng.standard_normal((2, 4)).astype(np.float32)
    x = on(device, x_host)
    w = on(device, np.ones(4, np.float32))
    with pytest.raises(TypeError, match="x: expected a NumPy or CUDA array"):
        F.layer_norm([[1.0, 2.0]])
    with pytest.raises(TypeError, match="x: expected dtype float32 or float64, got int64"):
        F.layer_norm(on(device, np.ones((2, 3), dtype=np.int64)))
    with pytest.raises(ValueError, match=r"x: .*non-empty last dimension.*got shape \(\)"):
        F.layer_norm(on(device, np.ones((), np.float32)))
    with pytest.raises(ValueError, match=r"x: .*got shape \(3, 0\)"):
        F.layer_norm(on(device, np.ones((3, 0), np.float32)))
    with pytest.raises(ValueError, match=r"weight: expected shape \(4,\) .*got \(5,\)"):
        F.layer_norm(x, on(device, np.ones(5, np.float32)))
    with pytest.raises(ValueError, match="bias: expected a 1-D array"):
        F.layer_norm(x, w, on(device, np.ones((1, 4), np.float32)))
    with pytest.raises(TypeError, match="weight: expected dtype float32 .*got float64"):
        F.layer_norm(x, on(device, np.ones(4)))
    with pytest.raises(ValueError, match="eps: expected a finite number >= 0, got -1.0"):
        F.layer_norm(x, eps=-1.0)
    with pytest.raises(ValueError, match="eps: expected a finite number >= 0, got inf"):
        F.layer_norm(x, eps=float("inf"))
    with pytest.raises(TypeError, match="eps: expected a real number"):
        F.layer_norm(x, eps="small")
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 4\) and dtype float32"):
        F.layer_norm(x, out=on(device, np.empty((2, 4))))
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.layer_norm(x, out=x)
    np.testing.assert_array_equal(host(x), x_host)
    np.testing.assert_array_equal(host(w), 1.0)


def test_backward_errors(rng, device):
    x_host = rng.standard_normal((2, 4))
    gy_host = rng.standard_normal((2, 4))
    x, gy = on(device, x_host), on(device, gy_host)
    _, mean, rstd = F.layer_norm_forward(x)
    stats = host(mean), host(rstd)
    with pytest.raises(ValueError, match=r"grad_y: expected shape \(2, 4\)"):
        F.layer_norm_backward(gy[:1], x, mean, rstd)
    with pytest.raises(TypeError, match="grad_y: expected dtype float64"):
        F.layer_norm_backward(on(device, gy_host.astype(np.float32)), x, mean, rstd)
    with pytest.raises(ValueError, match=r"mean: expected shape \(2,\)"):
        F.layer_norm_backward(gy, x, mean[:1], rstd)
    with pytest.raises(TypeError, match="rstd: expected dtype float64"):
        F.layer_norm_backward(gy, x, mean, on(device, stats[1].astype(np.float32)))
    with pytest.raises(ValueError, match=r"weight: expected shape \(4,\)"):
        F.layer_norm_backward(gy, x, mean, rstd, on(device, np.ones(3)))
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.layer_norm_backward(gy, x, mean, rstd, out=gy)
    for got, want in zip((x, gy, mean, rstd), (x_host, gy_host, *stats), strict=True):
        np.testing.assert_array_equal(host(got), want)


def test_out_overlapping_weight_is_refused(rng, device):
    # The kernel reads weight for every row while writing out: an overlap gave
    # rows normalised with a half-overwritten weight.
    x = on(device, rng.standard_normal((2, 4)))
    buf = on(device, np.ones(8))
    weight, out = buf[:4], buf.reshape(2, 4)
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.layer_norm(x, weight, out=out)
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.layer_norm(x, None, weight, out=out)
    _, mean, rstd = F.layer_norm_forward(x)
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.layer_norm_backward(x, x, mean, rstd, weight, out=out)
    module = nn.LayerNorm(4, dtype=np.float64, device=device)
    module.weight.data = weight
    with pytest.raises(ValueError, match="out: must not share memory"):
        module(x, out=out)
    np.testing.assert_array_equal(host(buf), 1.0)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # simulator
@pytest.mark.parametrize(("device", "rows"), [("cpu", 2), ("cpu", 20000), ("cuda", 2)],
                         indirect=["device"])  # serial and parallel CPU kernels
def test_eps_zero_on_a_constant_row_gives_nan_as_pytorch(device, rows):
    # rstd = 1 / sqrt(0) raised ZeroDivisionError inside the kernel (SystemError
    # from the parallel one), after part of the output had been written.
    x_host = np.ones((rows, 4))
    x_host[1] = [1.0, 2.0, 3.0, 4.0]
    x = on(device, x_host)
    y, mean, rstd = F.layer_norm_forward(x, eps=0.0)
    y, rstd = host(y), host(rstd)
    assert np.isnan(y[0]).all() and np.isinf(rstd[0])
    np.testing.assert_allclose(y[1], host(F.layer_norm(x[1:2], eps=1e-300))[0])
    grad_x = host(F.layer_norm_backward(on(device, np.ones_like(x_host)), x, mean,
                                        on(device, rstd))[0])
    assert np.isnan(grad_x[0]).all() and np.isfinite(grad_x[1]).all()
    table = on(device, np.ones((3, 4)))
    assert np.isnan(host(F.bert_embeddings(on(device, np.array([[1]])), table, table, table,
                                           eps=0.0))).all()


def test_module_checks_replaced_parameter_arrays(rng, device):
    # The module passed weight.data / bias.data to the kernels unchecked: a shorter
    # array was read past its end, another dtype silently mixed.
    x = on(device, rng.standard_normal((2, 400)).astype(np.float32))
    grad = on(device, np.ones((2, 400), np.float32))
    module = nn.LayerNorm(400, device=device)
    module(x)
    for name, data, error, match in [
        ("weight", np.ones(4, np.float32), ValueError, r"weight: expected shape \(400,\)"),
        ("weight", np.ones(400), TypeError, "weight: expected dtype float32"),
        ("bias", np.ones((1, 400), np.float32), ValueError, "bias: expected a 1-D array"),
    ]:
        param = getattr(module, name)
        kept, param.data = param.data, on(device, data)
        with pytest.raises(error, match=match):
            module(x)
        if name == "weight":  # the backward of the earlier forward reads the weight
            with pytest.raises(RuntimeError, match="'weight' was modified"):
                module.backward(grad)
        param.data = kept
    assert module.weight.grad is None and module.bias.grad is None


def test_inputs_unchanged_after_error(rng, device):
    x_host = rng.standard_normal((2, 4)).astype(np.float32)
    x = on(device, x_host)
    out = on(device, np.full((2, 4), 7.0, np.float32))
    with pytest.raises(ValueError):
        F.layer_norm(x, on(device, np.ones(3, np.float32)), out=out)
    np.testing.assert_array_equal(host(out), 7.0)
    np.testing.assert_array_equal(host(x), x_host)


# ------------------------------------------------------------------ module


def test_module_parameters_and_forward(rng, device):
    ln = nn.LayerNorm(6, device=device)
    assert ln.normalized_shape == (6,) and ln.device == device
    assert [name for name, _ in ln.named_parameters()] == ["weight", "bias"]
    np.testing.assert_array_equal(host(ln.weight.data), np.ones(6, np.float32))
    np.testing.assert_array_equal(host(ln.bias.data), np.zeros(6, np.float32))
    assert ln.weight.dtype == np.float32
    w, b = _affine(rng, 6, np.float32)
    ln.weight.data, ln.bias.data = on(device, w), on(device, b)
    x = rng.standard_normal((2, 2, 6)).astype(np.float32)
    y = ln(on(device, x))
    _assert_on(device, y)
    rtol, atol = _tol(np.float32, device)
    np.testing.assert_allclose(host(y), reference.layer_norm(x, w, b)[0], rtol=rtol, atol=atol)
    assert "elementwise_affine=True" in repr(ln)


def test_module_backward_accumulates(rng, device):
    ln = nn.LayerNorm((5,), eps=1e-3, dtype=np.float64)
    ln.weight.data[:] = rng.standard_normal(5)
    weight = ln.weight.data.copy()
    ln.to(device)
    rows = 4 if device == "cpu" else 2
    x = rng.standard_normal((rows, 5))
    gy = rng.standard_normal((rows, 5))
    ln(on(device, x))
    gx = ln.backward(on(device, gy))
    _assert_on(device, gx, ln.weight.grad, ln.bias.grad)
    ref_gx, ref_gw, ref_gb = reference.layer_norm_backward(gy, x, weight, eps=1e-3)
    np.testing.assert_allclose(host(gx), ref_gx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(host(ln.weight.grad), ref_gw, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(host(ln.bias.grad), ref_gb, rtol=1e-10, atol=1e-12)
    ln(on(device, x))
    ln.backward(on(device, gy))
    np.testing.assert_allclose(host(ln.weight.grad), 2 * ref_gw, rtol=1e-10, atol=1e-12)


def test_module_finite_differences(rng):
    # CPU only (a forward pass per probed element); test_module_backward_accumulates
    # checks the module's gradients on CUDA.
    ln = nn.LayerNorm(4, eps=1e-2, dtype=np.float64)
    ln.weight.data[:] = rng.standard_normal(4)
    ln.bias.data[:] = rng.standard_normal(4)
    x = rng.standard_normal((3, 4))
    probe = rng.standard_normal((3, 4))

    def loss():
        return float((ln(x) * probe).sum())

    ln(x)
    gx = ln.backward(probe)
    np.testing.assert_allclose(gx, reference.finite_difference(loss, x), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ln.weight.grad, reference.finite_difference(loss, ln.weight.data),
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ln.bias.grad, reference.finite_difference(loss, ln.bias.data),
                               rtol=1e-6, atol=1e-7)


def test_module_frozen_and_without_affine(rng, device):
    rows = 3 if device == "cpu" else 2
    x_host = rng.standard_normal((rows, 4)).astype(np.float32)
    x, gy = on(device, x_host), on(device, rng.standard_normal((rows, 4)).astype(np.float32))
    ln = nn.LayerNorm(4, device=device)
    ln.weight.requires_grad = False
    ln(x)
    gx = ln.backward(gy)
    assert ln.weight.grad is None and ln.bias.grad is not None
    plain = nn.LayerNorm(4, elementwise_affine=False, device=device)
    assert list(plain.parameters()) == [] and plain.weight is None
    rtol, atol = _tol(np.float32, device)
    np.testing.assert_allclose(host(plain(x)), reference.layer_norm(x_host)[0], rtol=rtol,
                               atol=atol)
    np.testing.assert_allclose(host(plain.backward(gy)), host(gx), rtol=1e-6, atol=1e-6)
    # Without affine parameters any float dtype is accepted.
    y64 = plain(on(device, x_host.astype(np.float64)))
    assert y64.dtype == np.float64
    _assert_on(device, y64)
    no_bias = nn.LayerNorm(4, bias=False)
    assert [n for n, _ in no_bias.named_parameters()] == ["weight"]
    assert "bias=False" in repr(no_bias)


def test_module_errors(device):
    with pytest.raises(ValueError, match=r"only normalisation over the last dimension.*\(2, 3\)"):
        nn.LayerNorm((2, 3), device=device)
    with pytest.raises(TypeError, match="normalized_shape: expected an int or a 1-tuple"):
        nn.LayerNorm(4.0, device=device)
    with pytest.raises(ValueError, match="normalized_shape: expected an integer >= 1, got 0"):
        nn.LayerNorm(0, device=device)
    with pytest.raises(TypeError, match="dtype: expected float32 or float64"):
        nn.LayerNorm(4, dtype=np.int32, device=device)
    with pytest.raises(ValueError, match="eps: expected a finite number >= 0"):
        nn.LayerNorm(4, eps=-1e-5, device=device)
    ln = nn.LayerNorm(4, device=device)
    with pytest.raises(RuntimeError, match="before forward"):
        ln.backward(on(device, np.zeros((1, 4), np.float32)))
    with pytest.raises(ValueError, match=r"x: expected last dimension normalized_shape=4, got"):
        ln(on(device, np.zeros((2, 5), np.float32)))
    with pytest.raises(TypeError, match="x: expected dtype float32 .*got float64"):
        ln(on(device, np.zeros((2, 4))))
    ln(on(device, np.zeros((2, 4), np.float32)))
    with pytest.raises(ValueError, match=r"grad_output: expected shape \(2, 4\)"):
        ln.backward(on(device, np.zeros((1, 4), np.float32)))
    with pytest.raises(TypeError, match="grad_output: expected dtype float32"):
        ln.backward(on(device, np.zeros((2, 4))))
    assert ln.weight.grad is None
