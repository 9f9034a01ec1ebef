"""LayerNorm: functional forward/backward and nn.LayerNorm against the NumPy reference."""

import numba
import numpy as np
import pytest
import reference
from conftest import FLOAT_DTYPES, two_threads

from numbapos import _args, nn
from numbapos import functional as F
from numbapos.kernels.cpu import arrays as cpu_arrays

SHAPES = [(5,), (3, 7), (2, 3, 16), (64, 600)]  # the last one takes the parallel kernels


def _tol(dtype):
    return (1e-5, 2e-5) if np.dtype(dtype) == np.float32 else (1e-12, 1e-12)


def _affine(rng, dim, dtype):
    return (rng.standard_normal(dim).astype(dtype), rng.standard_normal(dim).astype(dtype))


# ------------------------------------------------------------------ forward


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", ["none", "weight", "bias", "both"])
def test_forward_matches_reference(rng, dtype, shape, affine):
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    w, b = _affine(rng, shape[-1], dtype)
    w = w if affine in ("weight", "both") else None
    b = b if affine in ("bias", "both") else None
    y, mean, rstd = F.layer_norm_forward(x, w, b, eps=1e-5)
    ref_y, ref_mean, ref_rstd = reference.layer_norm(x, w, b, eps=1e-5)
    rtol, atol = _tol(dtype)
    assert y.dtype == dtype and y.shape == shape
    assert mean.shape == shape[:-1] and rstd.shape == shape[:-1]
    np.testing.assert_allclose(y, ref_y, rtol=rtol, atol=atol)
    np.testing.assert_allclose(mean, ref_mean, rtol=rtol, atol=atol)
    np.testing.assert_allclose(rstd, ref_rstd, rtol=rtol, atol=atol)
    np.testing.assert_array_equal(F.layer_norm(x, w, b, eps=1e-5), y)


def test_float32_within_1e5_of_float64_even_with_large_mean(rng):
    # The corrected two-pass statistics keep float32 close although mean >> std.
    x = (rng.standard_normal((33, 768)) * 0.5 + 10.0).astype(np.float32)
    y = F.layer_norm(x, eps=1e-12)
    ref = reference.layer_norm(x, eps=1e-12)[0]
    assert np.abs(y - ref).max() <= 1e-5


def test_constant_rows_give_bias(rng):
    x = np.full((4, 9), 3.25, dtype=np.float32)
    w, b = _affine(rng, 9, np.float32)
    y = F.layer_norm(x, w, b, eps=1e-5)
    np.testing.assert_array_equal(y, np.broadcast_to(b, y.shape))


def test_non_contiguous_input_and_out_buffer(rng):
    base = rng.standard_normal((6, 20))
    x = base[:, ::2]
    out = np.empty((6, 10))
    y = F.layer_norm(x, eps=1e-5, out=out)
    assert y is out
    np.testing.assert_allclose(y, reference.layer_norm(x, eps=1e-5)[0], rtol=1e-12, atol=1e-12)


def test_empty_leading_dims():
    y, mean, rstd = F.layer_norm_forward(np.zeros((0, 4), dtype=np.float32))
    assert y.shape == (0, 4) and mean.shape == (0,) and rstd.shape == (0,)
    gx, gw, gb = F.layer_norm_backward(y, y, mean, rstd, np.ones(4, np.float32))
    assert gx.shape == (0, 4)
    np.testing.assert_array_equal(gw, 0)
    np.testing.assert_array_equal(gb, 0)


# ------------------------------------------------------------------ backward


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_backward_matches_reference(rng, dtype, shape):
    x = rng.standard_normal(shape).astype(dtype)
    gy = rng.standard_normal(shape).astype(dtype)
    w, b = _affine(rng, shape[-1], dtype)
    _, mean, rstd = F.layer_norm_forward(x, w, b, eps=1e-5)
    gx, gw, gb = F.layer_norm_backward(gy, x, mean, rstd, w, b)
    ref_gx, ref_gw, ref_gb = reference.layer_norm_backward(gy, x, w, eps=1e-5)
    rtol, atol = (1e-4, 1e-4) if np.dtype(dtype) == np.float32 else (1e-10, 1e-10)
    for got, want in ((gx, ref_gx), (gw, ref_gw), (gb, ref_gb)):
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def test_backward_which_gradients(rng):
    x = rng.standard_normal((3, 5))
    gy = rng.standard_normal((3, 5))
    w, b = _affine(rng, 5, np.float64)
    _, mean, rstd = F.layer_norm_forward(x, w, b)
    assert F.layer_norm_backward(gy, x, mean, rstd)[1:] == (None, None)
    _, gw, gb = F.layer_norm_backward(gy, x, mean, rstd, w)
    assert gw is not None and gb is not None
    _, gw, gb = F.layer_norm_backward(gy, x, mean, rstd, None, b)
    assert gw is None
    np.testing.assert_allclose(gb, gy.sum(0), rtol=1e-12)


@pytest.mark.parametrize("shape", [(3, 6), (2, 2, 5)])
def test_gradients_match_finite_differences(rng, shape):
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


def test_serial_and_parallel_kernels_agree_bitwise(rng, monkeypatch):
    x = rng.standard_normal((40, 33)).astype(np.float32)
    gy = rng.standard_normal((40, 33)).astype(np.float32)
    w, b = _affine(rng, 33, np.float32)
    outs = []
    for threshold in (1 << 40, 1):  # serial, then parallel kernels
        monkeypatch.setattr(cpu_arrays, "PARALLEL_MIN_ELEMENTS", threshold)
        y, mean, rstd = F.layer_norm_forward(x, w, b)
        outs.append((y, mean, rstd, *F.layer_norm_backward(gy, x, mean, rstd, w, b)))
    for first, second in zip(*outs, strict=True):
        np.testing.assert_array_equal(first, second)


# ------------------------------------------------------------------ errors


def test_forward_errors(rng):
    x = rng.standard_normal((2, 4)).astype(np.float32)
    w = np.ones(4, np.float32)
    with pytest.raises(TypeError, match="x: expected a NumPy or CUDA array"):
        F.layer_norm([[1.0, 2.0]])
    with pytest.raises(TypeError, match="x: expected dtype float32 or float64, got int64"):
        F.layer_norm(np.ones((2, 3), dtype=np.int64))
    with pytest.raises(ValueError, match=r"x: .*non-empty last dimension.*got shape \(\)"):
        F.layer_norm(np.ones((), np.float32))
    with pytest.raises(ValueError, match=r"x: .*got shape \(3, 0\)"):
        F.layer_norm(np.ones((3, 0), np.float32))
    with pytest.raises(ValueError, match=r"weight: expected shape \(4,\) .*got \(5,\)"):
        F.layer_norm(x, np.ones(5, np.float32))
    with pytest.raises(ValueError, match="bias: expected a 1-D array"):
        F.layer_norm(x, w, np.ones((1, 4), np.float32))
    with pytest.raises(TypeError, match="weight: expected dtype float32 .*got float64"):
        F.layer_norm(x, np.ones(4))
    with pytest.raises(ValueError, match="eps: expected a finite number >= 0, got -1.0"):
        F.layer_norm(x, eps=-1.0)
    with pytest.raises(ValueError, match="eps: expected a finite number >= 0, got inf"):
        F.layer_norm(x, eps=float("inf"))
    with pytest.raises(TypeError, match="eps: expected a real number"):
        F.layer_norm(x, eps="small")
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 4\) and dtype float32"):
        F.layer_norm(x, out=np.empty((2, 4)))
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.layer_norm(x, out=x)


def test_backward_errors(rng):
    x = rng.standard_normal((2, 4))
    gy = rng.standard_normal((2, 4))
    _, mean, rstd = F.layer_norm_forward(x)
    with pytest.raises(ValueError, match=r"grad_y: expected shape \(2, 4\)"):
        F.layer_norm_backward(gy[:1], x, mean, rstd)
    with pytest.raises(TypeError, match="grad_y: expected dtype float64"):
        F.layer_norm_backward(gy.astype(np.float32), x, mean, rstd)
    with pytest.raises(ValueError, match=r"mean: expected shape \(2,\)"):
        F.layer_norm_backward(gy, x, mean[:1], rstd)
    with pytest.raises(TypeError, match="rstd: expected dtype float64"):
        F.layer_norm_backward(gy, x, mean, rstd.astype(np.float32))
    with pytest.raises(ValueError, match=r"weight: expected shape \(4,\)"):
        F.layer_norm_backward(gy, x, mean, rstd, np.ones(3))
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.layer_norm_backward(gy, x, mean, rstd, out=gy)


def test_out_overlapping_weight_is_refused(rng):
    # The kernel reads weight for every row while writing out: an overlap gave
    # rows normalised with a half-overwritten weight.
    x = rng.standard_normal((2, 4))
    buf = np.ones(8)
    weight, out = buf[:4], buf.reshape(2, 4)
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.layer_norm(x, weight, out=out)
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.layer_norm(x, None, weight, out=out)
    _, mean, rstd = F.layer_norm_forward(x)
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.layer_norm_backward(x, x, mean, rstd, weight, out=out)
    module = nn.LayerNorm(4, dtype=np.float64)
    module.weight.data = weight
    with pytest.raises(ValueError, match="out: must not share memory"):
        module(x, out=out)
    np.testing.assert_array_equal(buf, 1.0)


@pytest.mark.parametrize("rows", [2, 20000])  # serial and parallel kernels
def test_eps_zero_on_a_constant_row_gives_nan_as_pytorch(rows):
    # rstd = 1 / sqrt(0) raised ZeroDivisionError inside the kernel (SystemError
    # from the parallel one), after part of the output had been written.
    x = np.ones((rows, 4))
    x[1] = [1.0, 2.0, 3.0, 4.0]
    y, mean, rstd = F.layer_norm_forward(x, eps=0.0)
    assert np.isnan(y[0]).all() and np.isinf(rstd[0])
    np.testing.assert_allclose(y[1], F.layer_norm(x[1:2], eps=1e-300)[0])
    grad_x = F.layer_norm_backward(np.ones_like(x), x, mean, rstd)[0]
    assert np.isnan(grad_x[0]).all() and np.isfinite(grad_x[1]).all()
    table = np.ones((3, 4))
    assert np.isnan(F.bert_embeddings(np.array([[1]]), table, table, table, eps=0.0)).all()


def test_module_checks_replaced_parameter_arrays(rng):
    # The module passed weight.data / bias.data to the kernels unchecked: a shorter
    # array was read past its end, another dtype silently mixed.
    x = rng.standard_normal((2, 400)).astype(np.float32)
    module = nn.LayerNorm(400)
    module(x)
    for name, data, error, match in [
        ("weight", np.ones(4, np.float32), ValueError, r"weight: expected shape \(400,\)"),
        ("weight", np.ones(400), TypeError, "weight: expected dtype float32"),
        ("bias", np.ones((1, 400), np.float32), ValueError, "bias: expected a 1-D array"),
    ]:
        param = getattr(module, name)
        kept, param.data = param.data, data
        with pytest.raises(error, match=match):
            module(x)
        with pytest.raises(error, match=match):
            module.backward(np.ones_like(x))
        param.data = kept


def test_inputs_unchanged_after_error(rng):
    x = rng.standard_normal((2, 4)).astype(np.float32)
    out = np.full((2, 4), 7.0, np.float32)
    x_before = x.copy()
    with pytest.raises(ValueError):
        F.layer_norm(x, np.ones(3, np.float32), out=out)
    np.testing.assert_array_equal(out, 7.0)
    np.testing.assert_array_equal(x, x_before)


# ------------------------------------------------------------------ module


def test_module_parameters_and_forward(rng):
    ln = nn.LayerNorm(6)
    assert ln.normalized_shape == (6,)
    assert [name for name, _ in ln.named_parameters()] == ["weight", "bias"]
    np.testing.assert_array_equal(ln.weight.data, np.ones(6, np.float32))
    np.testing.assert_array_equal(ln.bias.data, np.zeros(6, np.float32))
    assert ln.weight.dtype == np.float32
    ln.weight.data[:] = rng.standard_normal(6)
    ln.bias.data[:] = rng.standard_normal(6)
    x = rng.standard_normal((2, 3, 6)).astype(np.float32)
    np.testing.assert_allclose(ln(x), reference.layer_norm(x, ln.weight.data, ln.bias.data)[0],
                               rtol=1e-5, atol=2e-5)
    assert "elementwise_affine=True" in repr(ln)


def test_module_backward_accumulates(rng):
    ln = nn.LayerNorm((5,), eps=1e-3, dtype=np.float64)
    ln.weight.data[:] = rng.standard_normal(5)
    x = rng.standard_normal((4, 5))
    gy = rng.standard_normal((4, 5))
    ln(x)
    gx = ln.backward(gy)
    ref_gx, ref_gw, ref_gb = reference.layer_norm_backward(gy, x, ln.weight.data, eps=1e-3)
    np.testing.assert_allclose(gx, ref_gx, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ln.weight.grad, ref_gw, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ln.bias.grad, ref_gb, rtol=1e-10, atol=1e-12)
    ln(x)
    ln.backward(gy)
    np.testing.assert_allclose(ln.weight.grad, 2 * ref_gw, rtol=1e-10, atol=1e-12)


def test_module_finite_differences(rng):
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


def test_module_frozen_and_without_affine(rng):
    x = rng.standard_normal((3, 4)).astype(np.float32)
    gy = rng.standard_normal((3, 4)).astype(np.float32)
    ln = nn.LayerNorm(4)
    ln.weight.requires_grad = False
    ln(x)
    gx = ln.backward(gy)
    assert ln.weight.grad is None and ln.bias.grad is not None
    plain = nn.LayerNorm(4, elementwise_affine=False)
    assert list(plain.parameters()) == [] and plain.weight is None
    np.testing.assert_allclose(plain(x), reference.layer_norm(x)[0], rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(plain.backward(gy), gx, rtol=1e-6, atol=1e-6)
    # Without affine parameters any float dtype is accepted.
    assert plain(x.astype(np.float64)).dtype == np.float64
    no_bias = nn.LayerNorm(4, bias=False)
    assert [n for n, _ in no_bias.named_parameters()] == ["weight"]
    assert "bias=False" in repr(no_bias)


def test_module_errors(rng):
    with pytest.raises(ValueError, match=r"only normalisation over the last dimension.*\(2, 3\)"):
        nn.LayerNorm((2, 3))
    with pytest.raises(TypeError, match="normalized_shape: expected an int or a 1-tuple"):
        nn.LayerNorm(4.0)
    with pytest.raises(ValueError, match="normalized_shape: expected an integer >= 1, got 0"):
        nn.LayerNorm(0)
    with pytest.raises(TypeError, match="dtype: expected float32 or float64"):
        nn.LayerNorm(4, dtype=np.int32)
    with pytest.raises(ValueError, match="eps: expected a finite number >= 0"):
        nn.LayerNorm(4, eps=-1e-5)
    ln = nn.LayerNorm(4)
    with pytest.raises(RuntimeError, match="before forward"):
        ln.backward(np.zeros((1, 4), np.float32))
    with pytest.raises(ValueError, match=r"x: expected last dimension normalized_shape=4, got"):
        ln(np.zeros((2, 5), np.float32))
    with pytest.raises(TypeError, match="x: expected dtype float32 .*got float64"):
        ln(np.zeros((2, 4)))
    ln(np.zeros((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"grad_output: expected shape \(2, 4\)"):
        ln.backward(np.zeros((1, 4), np.float32))
    with pytest.raises(TypeError, match="grad_output: expected dtype float32"):
        ln.backward(np.zeros((2, 4)))
