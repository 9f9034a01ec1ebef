"""Functional positional ops: sinusoid table, x + P, A * X + B, positions from padding.

Tests of kernel-backed ops run on the CPU and on CUDA (the ``device`` fixture;
Numba's simulator without a GPU), with the same NumPy reference. Large shapes,
strided or read-only NumPy inputs, Python lists as float arrays and the CPU's
thread-count and serial/parallel checks stay on the CPU.
"""

import numba
import numpy as np
import pytest
import reference as ref
from conftest import FLOAT_DTYPES, device_cases, host, on, tolerance, two_threads
from cuda_counts import deferred_raises

import numbapos
import numbapos.functional as F
from numbapos import _device

# Largest N*D of one call on CUDA: the simulator runs every thread as Python.
CUDA_MAX_ELEMENTS = 10_000


def _small(*dims):
    return int(np.prod(dims)) <= CUDA_MAX_ELEMENTS


def _small_shape(shape, *rest):
    return _small(*shape)


def _placed(device, value):
    """An ndarray argument on ``device``; anything else (lists, ints, None) as it is."""
    return on(device, value) if isinstance(value, np.ndarray) else value


def _assert_on(x, device):
    assert _device.device_of(x) == device, f"result on {_device.device_of(x)}, not {device}"


# ---------------------------------------------------------------- sinusoid table

SINUSOID_SHAPES = [(1, 1), (1, 2), (5, 7), (9, 8), (600, 6), (300, 129), (1024, 64)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("device, seq_len, embed_dim", device_cases(SINUSOID_SHAPES, _small),
                         indirect=["device"])
def test_sinusoid_matches_formula(device, seq_len, embed_dim, dtype):
    table = F.sinusoidal_pos_embedding(seq_len, embed_dim, device=device, dtype=dtype)
    _assert_on(table, device)
    assert table.shape == (seq_len, embed_dim) and table.dtype == dtype
    assert _device.is_c_contiguous(table)
    expected = ref.sinusoidal_table(seq_len, embed_dim)
    atol = 1e-6 if dtype == np.float32 else 1e-10
    np.testing.assert_allclose(host(table), expected, rtol=0, atol=atol)


def test_sinusoid_layout_sin_then_cos(device):
    table = host(F.sinusoidal_pos_embedding(3, 5, device=device, dtype=np.float64))
    w = 10000.0 ** (-np.array([0, 2, 4]) / 5)
    for p in range(3):
        np.testing.assert_allclose(table[p, 0::2], np.sin(p * w), atol=1e-14)
        np.testing.assert_allclose(table[p, 1::2], np.cos(p * w[:2]), atol=1e-14)
    # position 0: sin = 0, cos = 1; odd D ends with an unpaired sin channel
    np.testing.assert_array_equal(table[0], [0, 1, 0, 1, 0])


def test_sinusoid_default_dtype_is_float32(device):
    table = F.sinusoidal_pos_embedding(2, 4, device=device)
    _assert_on(table, device)
    assert table.dtype == np.float32


@pytest.mark.parametrize("dtype, bound", [(np.float32, 1e-6), (np.float64, 1e-10)])
@pytest.mark.parametrize("embed_dim", [64, 33])
def test_sinusoid_error_bound_65536_positions(dtype, bound, embed_dim):
    # CPU only (4 million elements); test_sinusoid_offset and test_devices check the
    # CUDA table at large positions.
    seq_len = 65536
    table = F.sinusoidal_pos_embedding(seq_len, embed_dim, dtype=dtype)
    err = np.max(np.abs(table.astype(np.float64) - ref.sinusoidal_table(seq_len, embed_dim)))
    assert err <= bound, f"max abs error {err:.3g} > {bound:g}"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_sinusoid_error_bound_serial_path(dtype):
    # Small tables take the serial kernel, with the same re-anchoring.
    seq_len, embed_dim = 4000, 4
    assert seq_len * embed_dim < numbapos.config.get("parallel_min_elements")
    table = F.sinusoidal_pos_embedding(seq_len, embed_dim, dtype=dtype, offset=60000)
    expected = ref.sinusoidal_table(seq_len, embed_dim, offset=60000)
    bound = 1e-6 if dtype == np.float32 else 1e-10
    assert np.max(np.abs(table - expected)) <= bound


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_sinusoid_same_values_for_any_thread_count_and_kernel(dtype, parallel_threshold):
    two_threads()
    seq_len, embed_dim = 3000, 40
    default = F.sinusoidal_pos_embedding(seq_len, embed_dim, dtype=dtype)
    threads = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        single = F.sinusoidal_pos_embedding(seq_len, embed_dim, dtype=dtype)
    finally:
        numba.set_num_threads(threads)
    np.testing.assert_array_equal(single, default)
    # the serial kernel gives the parallel kernel's values bit for bit
    parallel_threshold(1 << 40)
    serial = F.sinusoidal_pos_embedding(seq_len, embed_dim, dtype=dtype)
    np.testing.assert_array_equal(serial, default)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("offset", [1, 7, 300])
def test_sinusoid_offset(device, offset, dtype):
    table = host(F.sinusoidal_pos_embedding(40, 10, device=device, dtype=dtype, offset=offset))
    np.testing.assert_allclose(table, ref.sinusoidal_table(40, 10, offset=offset),
                               rtol=0, atol=tolerance(dtype)[1] * 10)
    longer = host(F.sinusoidal_pos_embedding(40 + offset, 10, device=device, dtype=dtype))
    np.testing.assert_allclose(table, longer[offset:], rtol=0, atol=2e-6)


@pytest.mark.parametrize("base", [100.0, 10000, 1e6, 0.5])
def test_sinusoid_base(device, base):
    table = F.sinusoidal_pos_embedding(50, 12, device=device, dtype=np.float64, base=base)
    np.testing.assert_allclose(host(table), ref.sinusoidal_table(50, 12, base=float(base)),
                               rtol=0, atol=1e-12)


def test_sinusoid_out(device):
    out = on(device, np.full((6, 4), np.nan, dtype=np.float64))
    result = F.sinusoidal_pos_embedding(6, 4, dtype=np.float64, out=out)
    assert result is out
    np.testing.assert_allclose(host(out), ref.sinusoidal_table(6, 4), atol=1e-12)
    # dtype=None follows out
    out32 = on(device, np.empty((6, 4), dtype=np.float32))
    assert F.sinusoidal_pos_embedding(6, 4, out=out32) is out32


def test_sinusoid_numpy_integer_sizes(device):
    table = F.sinusoidal_pos_embedding(np.int64(3), np.int32(4), offset=np.int16(2),
                                       device=device)
    _assert_on(table, device)
    assert table.shape == (3, 4)


SINUSOID_ERRORS = [
    (dict(seq_len=0, embed_dim=4), ValueError, "seq_len: expected an integer >= 1, got 0"),
    (dict(seq_len=-3, embed_dim=4), ValueError, "seq_len"),
    (dict(seq_len=3, embed_dim=0), ValueError, "embed_dim: expected an integer >= 1, got 0"),
    (dict(seq_len=3, embed_dim=4, offset=-1), ValueError, "offset: expected an integer >= 0"),
    (dict(seq_len=2.0, embed_dim=4), TypeError, "seq_len: expected an integer"),
    (dict(seq_len="3", embed_dim=4), TypeError, "seq_len: expected an integer"),
    (dict(seq_len=True, embed_dim=4), TypeError, "seq_len: expected an integer"),
    (dict(seq_len=3, embed_dim=4.5), TypeError, "embed_dim: expected an integer"),
    (dict(seq_len=3, embed_dim=4, offset=1.0), TypeError, "offset: expected an integer"),
    (dict(seq_len=3, embed_dim=4, dtype=np.int32), TypeError, "dtype: expected float32"),
    (dict(seq_len=3, embed_dim=4, dtype=np.float16), TypeError, "dtype: expected float32"),
    (dict(seq_len=3, embed_dim=4, dtype="complex64"), TypeError, "dtype"),
    (dict(seq_len=3, embed_dim=4, base=0.0), ValueError, "base: expected a finite positive"),
    (dict(seq_len=3, embed_dim=4, base=-2.0), ValueError, "base"),
    (dict(seq_len=3, embed_dim=4, base="e"), TypeError, "base: expected a real number"),
    (dict(seq_len=3, embed_dim=4, out=np.empty((3, 5), np.float32)), ValueError, "out: expected"),
    (dict(seq_len=3, embed_dim=4, dtype=np.float64, out=np.empty((3, 4), np.float32)),
     ValueError, "out: expected shape"),
    # beyond int64 the kernel failed to type (2**64) or wrapped to negative positions
    (dict(seq_len=3, embed_dim=4, offset=2**64), ValueError, "offset: .* does not fit in int64"),
    (dict(seq_len=3, embed_dim=4, offset=2**63 - 2), ValueError,
     r"offset \+ seq_len - 1 = 9223372036854775808"),
]
# The device argument itself, and outs that cannot be CUDA arrays (strided, a list).
SINUSOID_HOST_ERRORS = [
    (dict(seq_len=3, embed_dim=4, device="gpu"), ValueError, "device: expected 'cpu' or 'cuda'"),
    (dict(seq_len=3, embed_dim=4, device=0), TypeError, "device: expected 'cpu' or 'cuda'"),
    (dict(seq_len=3, embed_dim=4, out=np.empty((4, 3), np.float32).T), ValueError,
     "C-contiguous"),
    (dict(seq_len=3, embed_dim=4, out=[[0.0] * 4] * 3), TypeError, "out: expected a NumPy"),
]


@pytest.mark.parametrize("device, kwargs, exc, match",
                         device_cases(SINUSOID_ERRORS)
                         + device_cases(SINUSOID_HOST_ERRORS, cuda=()),
                         indirect=["device"])
def test_sinusoid_errors(device, kwargs, exc, match):
    kwargs = {name: _placed(device, value) for name, value in kwargs.items()}
    if "out" not in kwargs and "device" not in kwargs:
        kwargs["device"] = device
    with pytest.raises(exc, match=match):
        F.sinusoidal_pos_embedding(**kwargs)


def test_sinusoid_error_leaves_out_untouched(device):
    out = on(device, np.full((3, 4), 7.0, dtype=np.float32))
    with pytest.raises(ValueError):
        F.sinusoidal_pos_embedding(3, 4, base=-1.0, out=out)
    assert np.all(host(out) == 7.0)


# ---------------------------------------------------------------- x + P


def _x(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("device, shape", device_cases([((5, 3),), ((2, 5, 3),),
                                                         ((4, 64, 128),)], _small_shape),
                         indirect=["device"])
@pytest.mark.parametrize("offset", [0, 2])
def test_add_positional_offset(device, rng, shape, offset, dtype):
    x = _x(rng, shape, dtype)
    table = _x(rng, (shape[-2] + 3, shape[-1]), dtype)
    xd = on(device, x)
    y = F.add_positional(xd, on(device, table), offset=offset)
    _assert_on(y, device)
    expected = x + table[offset:offset + shape[-2]]
    np.testing.assert_array_equal(host(y), expected)
    np.testing.assert_array_equal(host(xd), x)
    assert y.dtype == dtype


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("device, x_shape, ids_shape",
                         device_cases([((5, 3), (5,)), ((2, 5, 3), (5,)), ((2, 5, 3), (1, 5)),
                                        ((2, 5, 3), (2, 5)), ((4, 64, 128), (4, 64))],
                                       _small_shape),
                         indirect=["device"])
def test_add_positional_position_ids(device, rng, x_shape, ids_shape, dtype):
    x = _x(rng, x_shape, dtype)
    table = _x(rng, (7, x_shape[-1]), dtype)
    ids = rng.integers(0, 7, size=ids_shape)
    y = F.add_positional(on(device, x), on(device, table), position_ids=on(device, ids))
    _assert_on(y, device)
    np.testing.assert_array_equal(host(y), x + table[ids])


def test_add_positional_in_place_and_out(device, rng):
    x = _x(rng, (2, 4, 3), np.float32)
    table = _x(rng, (4, 3), np.float32)
    expected = x + table
    xd, td = on(device, x), on(device, table)
    assert F.add_positional(xd, td, out=xd) is xd
    np.testing.assert_array_equal(host(xd), expected)
    out = on(device, np.empty_like(x))
    assert F.add_positional(xd, td, out=out) is out


def test_out_overlapping_inputs_is_refused(device, rng):
    # out may be x itself, but a shifted view of x (read after being written) or
    # of the position ids (an index overwritten before it is read) is refused.
    before = rng.standard_normal(64)
    buf = on(device, before)
    x, out = buf[:60].reshape(3, 5, 4), buf[4:].reshape(3, 5, 4)
    table = on(device, rng.standard_normal((7, 4)))
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.add_positional(x, table, out=out)
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.positional_mult_add(x, table, table, out=out)
    np.testing.assert_array_equal(host(buf), before)
    ids_buf = on(device, np.zeros(48, dtype=np.int64))
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.add_positional(on(device, np.zeros((40, 1))), on(device, np.full((9, 1), 1e300)),
                         position_ids=ids_buf[:40],
                         out=ids_buf[8:].view(np.float64).reshape(40, 1))
    np.testing.assert_array_equal(host(ids_buf), 0)


def test_add_positional_non_contiguous_input(rng):
    x = _x(rng, (3, 5, 8), np.float64)[:, :, ::2]
    table = _x(rng, (5, 4), np.float64)
    np.testing.assert_array_equal(F.add_positional(x, table), x + table)


def _add_args(rng, dtype=np.float32):
    return _x(rng, (2, 4, 3), dtype), _x(rng, (6, 3), dtype)


ADD_ERRORS = [
    (lambda x, t: (x.astype(np.int32), t, {}), TypeError, "x: expected dtype float32 or float64"),
    (lambda x, t: (x[0, 0], t, {}), ValueError, r"x: expected a 2-D or 3-D array"),
    (lambda x, t: (x, t[:, :2], {}), ValueError, "table: has 2 columns"),
    (lambda x, t: (x, t[0], {}), ValueError, "table: expected a 2-D"),
    (lambda x, t: (x, t.astype(np.float64), {}), TypeError, "table: dtype float64 differs"),
    (lambda x, t: (x, t, {"offset": 3}), ValueError,
     r"offset=3 .*L=4.*max_len=6"),
    (lambda x, t: (x, t, {"offset": -1}), ValueError, r"offset=-1"),
    (lambda x, t: (x, t, {"offset": 1.5}), TypeError, "offset: expected an integer"),
    (lambda x, t: (x, t, {"offset": 1, "position_ids": [0, 1, 2, 3]}), ValueError,
     "either an offset or explicit position_ids"),
    (lambda x, t: (x, t, {"position_ids": [0, 1, 2]}), ValueError, r"position_ids: expected shape"),
    (lambda x, t: (x, t, {"position_ids": np.zeros((3, 4), int)}), ValueError,
     r"position_ids: expected shape"),
    (lambda x, t: (x, t, {"position_ids": [0, 1, 6, 2]}), IndexError,
     r"position_ids: index 6 .*max_len=6"),
    (lambda x, t: (x, t, {"position_ids": np.array([0, 1, 6, 2])}), IndexError,
     r"position_ids: index 6 .*max_len=6"),
    (lambda x, t: (x, t, {"position_ids": [0, -1, 2, 2]}), IndexError, "index -1"),
    # (float positions are fractional positions: tests/ops/test_resize.py)
    (lambda x, t: (x, t, {"position_ids": [True, False, True, True]}), TypeError,
     "position_ids: expected integer"),
    (lambda x, t: (x, t, {"out": np.empty((2, 4, 2), np.float32)}), ValueError, "out: expected"),
    (lambda x, t: (x, t, {"out": t}), ValueError, "out: expected shape"),
]
ADD_4D_ERRORS = [  # x[None]: a stride-0 axis, which to_device must normalise
    (lambda x, t: (x[None], t, {}), ValueError, r"x: expected a 2-D or 3-D array"),
]
ADD_HOST_ERRORS = [  # a Python list as the float input
    (lambda x, t: (list(x), t, {}), TypeError, "x: expected a NumPy or CUDA array"),
]


@pytest.mark.parametrize("device, change, exc, match",
                         device_cases(ADD_ERRORS)
                         + device_cases(ADD_4D_ERRORS)
                         + device_cases(ADD_HOST_ERRORS, cuda=()),
                         indirect=["device"])
def test_add_positional_errors(device, rng, change, exc, match):
    x, table = _add_args(rng)
    x0, t0 = x.copy(), table.copy()
    args_x, args_t, kwargs = change(x, table)
    sources = [args_x, args_t, *kwargs.values()]
    placed = [_placed(device, value) for value in sources]
    with deferred_raises(device, exc, match):  # on CUDA an IndexError at the next sync
        F.add_positional(placed[0], placed[1], **dict(zip(kwargs, placed[2:], strict=True)))
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(table, t0)
    for source, array in zip(sources, placed, strict=True):  # the device copies too
        if isinstance(source, np.ndarray):
            np.testing.assert_array_equal(host(array), source)


def test_add_positional_2d_rejects_batched_ids(device, rng):
    with pytest.raises(ValueError, match=r"position_ids: expected shape \(4,\)"):
        F.add_positional(on(device, _x(rng, (4, 3), np.float32)),
                         on(device, _x(rng, (6, 3), np.float32)),
                         position_ids=on(device, np.zeros((1, 4), int)))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("device, shape", device_cases([((5, 3),), ((3, 5, 3),),
                                                         ((4, 64, 128),)], _small_shape),
                         indirect=["device"])
def test_add_positional_backward_offset(device, rng, shape, dtype):
    grad = _x(rng, shape, dtype)
    result = F.add_positional_backward(on(device, grad), shape[-2] + 4, offset=3)
    _assert_on(result, device)
    g3 = grad.reshape((-1,) + shape[-2:]).astype(np.float64)
    expected = np.zeros((shape[-2] + 4, shape[-1]))
    expected[3:3 + shape[-2]] = g3.sum(axis=0)
    assert result.dtype == dtype and result.shape == expected.shape
    np.testing.assert_allclose(host(result), expected, *tolerance(dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("ids_shape", [(5,), (1, 5), (3, 5)])
def test_add_positional_backward_repeated_ids(device, rng, ids_shape, dtype):
    grad = _x(rng, (3, 5, 4), dtype)
    ids = np.array([2, 2, 0, 2, 5]) if len(ids_shape) == 1 else rng.integers(0, 3, ids_shape)
    gd = on(device, grad)
    result = F.add_positional_backward(gd, 6, position_ids=ids)
    _assert_on(result, device)
    expected = ref.embedding_backward(grad, np.broadcast_to(ids, (3, 5)), 6)
    np.testing.assert_allclose(host(result), expected, *tolerance(dtype))
    # deterministic: bit-identical on a second run (device ids this time)
    np.testing.assert_array_equal(
        host(result), host(F.add_positional_backward(gd, 6, position_ids=on(device, ids))))


def test_add_positional_backward_errors(device, rng):
    g = _x(rng, (2, 4, 3), np.float32)
    grad = on(device, g)
    with pytest.raises(ValueError, match=r"offset=3 .*L=4.*max_len=6"):
        F.add_positional_backward(grad, 6, offset=3)
    with deferred_raises(device, IndexError, "position_ids: index 6"):
        F.add_positional_backward(grad, 6, position_ids=[0, 6, 1, 1])
    with deferred_raises(device, IndexError, "position_ids: index -1"):
        F.add_positional_backward(grad, 6, position_ids=on(device, np.array([0, -1, 1, 1])))
    with pytest.raises(ValueError, match="num_positions"):
        F.add_positional_backward(grad, 0)
    with pytest.raises(TypeError, match="grad_output"):
        F.add_positional_backward(on(device, g.astype(np.int64)), 6)
    with pytest.raises(ValueError, match="either an offset"):
        F.add_positional_backward(grad, 6, offset=1, position_ids=[0, 1, 2, 3])
    np.testing.assert_array_equal(host(grad), g)


# ---------------------------------------------------------------- A * X + B


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("device, shape", device_cases([((4, 3),), ((2, 4, 3),),
                                                         ((4, 64, 128),)], _small_shape),
                         indirect=["device"])
def test_mult_add_values(device, rng, shape, dtype):
    x = _x(rng, shape, dtype)
    a = _x(rng, (shape[-2] + 2, shape[-1]), dtype)
    b = _x(rng, (shape[-2] + 2, shape[-1]), dtype)
    xd, ad = on(device, x), on(device, a)
    y = F.positional_mult_add(xd, ad, on(device, b))
    _assert_on(y, device)
    seq = shape[-2]
    np.testing.assert_allclose(host(y), a[:seq] * x + b[:seq], *tolerance(dtype))
    grad = _x(rng, shape, dtype)
    got = F.positional_mult_add_backward(on(device, grad), xd, ad)
    for g in got:
        _assert_on(g, device)
    gx, ga, gb = (host(g) for g in got)
    g3 = grad.reshape((-1,) + shape[-2:]).astype(np.float64)
    x3 = x.reshape((-1,) + shape[-2:]).astype(np.float64)
    np.testing.assert_allclose(gx, grad * a[:seq], *tolerance(dtype))
    exp_a = np.zeros(a.shape)
    exp_a[:seq] = (g3 * x3).sum(axis=0)
    exp_b = np.zeros(a.shape)
    exp_b[:seq] = g3.sum(axis=0)
    rtol, atol = tolerance(dtype)
    np.testing.assert_allclose(ga, exp_a, rtol, atol * 10)
    np.testing.assert_allclose(gb, exp_b, rtol, atol * 10)


def test_mult_add_finite_differences(device, rng):
    x = rng.standard_normal((3, 4, 2))
    a = rng.standard_normal((5, 2))
    b = rng.standard_normal((5, 2))
    r = rng.standard_normal((3, 4, 2))

    def loss():  # the forward on ``device``, of the current host values
        y = F.positional_mult_add(on(device, x), on(device, a), on(device, b))
        return float(np.sum(host(y) * r))

    got = F.positional_mult_add_backward(on(device, r), on(device, x), on(device, a))
    for analytic, var in zip(got, (x, a, b), strict=True):
        np.testing.assert_allclose(host(analytic), ref.finite_difference(loss, var), atol=1e-7)


def test_mult_add_errors(device, rng):
    x = _x(rng, (2, 4, 3), np.float32)
    xd = on(device, x)
    a3 = _x(rng, (3, 3), np.float32)
    with pytest.raises(ValueError, match="sequence is too long: L=4 .*max_len=3"):
        F.positional_mult_add(xd, on(device, a3), on(device, a3))
    a = _x(rng, (5, 3), np.float32)
    ad = on(device, a)
    with pytest.raises(ValueError, match=r"b: expected shape \(5, 3\)"):
        F.positional_mult_add(xd, ad, on(device, a[:4]))
    with pytest.raises(TypeError, match="b: dtype float64 differs"):
        F.positional_mult_add(xd, ad, on(device, a.astype(np.float64)))
    with pytest.raises(ValueError, match=r"grad_output: expected shape \(2, 4, 3\)"):
        F.positional_mult_add_backward(on(device, x[0]), xd, ad)
    with pytest.raises(TypeError, match="grad_output: expected dtype float32"):
        F.positional_mult_add_backward(on(device, x.astype(np.float64)), xd, ad)
    with pytest.raises(ValueError, match="sequence is too long"):
        F.positional_mult_add_backward(xd, xd, on(device, a[:2]))
    np.testing.assert_array_equal(host(xd), x)
    np.testing.assert_array_equal(host(ad), a)


# ---------------------------------------------------------------- positions from padding


def test_positions_from_padding_docstring_example(device):
    ids = on(device, np.array([[0, 0, 7, 8], [7, 8, 0, 0]]))
    got = F.positions_from_padding(ids, 0)
    _assert_on(got, device)
    np.testing.assert_array_equal(host(got), [[0, 0, 0, 1], [0, 1, 0, 0]])


@pytest.mark.parametrize("past_length", [0, 5])
def test_left_and_right_padding_give_same_positions(device, rng, past_length):
    pad = 1
    lengths = [3, 6, 1, 5]
    seq_len = 6
    left = np.full((4, seq_len), pad)
    right = np.full((4, seq_len), pad)
    tokens = []
    for r, n in enumerate(lengths):
        t = rng.integers(2, 50, size=n)
        tokens.append(t)
        left[r, seq_len - n:] = t
        right[r, :n] = t
    pos_left = F.positions_from_padding(on(device, left), pad, past_length=past_length)
    pos_right = host(F.positions_from_padding(on(device, right), pad, past_length=past_length))
    assert pos_left.dtype == np.int64
    pos_left = host(pos_left)
    for r, n in enumerate(lengths):
        expected = np.arange(past_length, past_length + n)
        np.testing.assert_array_equal(pos_left[r, seq_len - n:], expected)
        np.testing.assert_array_equal(pos_right[r, :n], expected)
        np.testing.assert_array_equal(pos_left[r, :seq_len - n], 0)
        np.testing.assert_array_equal(pos_right[r, n:], 0)


# uint8 ids stay on the CPU: CUDA index arrays must be int32 or int64 (a TypeError there).
@pytest.mark.parametrize("device, shape, dtype",
                         device_cases([(shape, dtype) for shape in [(7,), (3, 9), (2, 3, 5)]
                                        for dtype in [np.int32, np.int64, np.uint8]],
                                       cuda=lambda shape, dtype: dtype != np.uint8),
                         indirect=["device"])
def test_positions_from_padding_vs_reference(device, rng, shape, dtype):
    ids = rng.integers(0, 3, size=shape).astype(dtype)
    got = F.positions_from_padding(on(device, ids), 0, past_length=2, pad_position=-1)
    _assert_on(got, device)
    np.testing.assert_array_equal(host(got), ref.positions_from_padding(ids, 0, 2, -1))


def test_positions_from_padding_per_row_past(device, rng):
    ids = rng.integers(0, 3, size=(4, 6))
    idsd = on(device, ids)
    past = np.array([0, 3, 1, 10])
    got = host(F.positions_from_padding(idsd, 0, past_length=past))
    np.testing.assert_array_equal(got, ref.positions_from_padding(ids, 0, past))
    for same in (list(past), on(device, past)):
        np.testing.assert_array_equal(
            host(F.positions_from_padding(idsd, 0, past_length=same)), got)


def test_positions_from_padding_matches_fairseq(device, rng):
    ids = rng.integers(0, 4, size=(5, 8))
    ids[:, :2] = 1  # some left padding
    got = F.positions_from_padding(on(device, ids), 1, past_length=2, pad_position=1)
    np.testing.assert_array_equal(host(got), ref.fairseq_make_positions(ids, 1))


def test_positions_from_padding_matches_hf_attention_mask(device, rng):
    ids = rng.integers(0, 4, size=(5, 8))
    ids[:3, :3] = 0
    attention_mask = (ids != 0).astype(np.int64)
    hf = attention_mask.cumsum(-1) - 1
    hf[attention_mask == 0] = 1
    np.testing.assert_array_equal(
        host(F.positions_from_padding(on(device, ids), 0, pad_position=1)), hf)


def test_positions_from_padding_largest_positions(device):
    top = 2**63 - 1
    np.testing.assert_array_equal(
        host(F.positions_from_padding(on(device, np.array([[5, 5, 0]])), 0,
                                      past_length=top - 2, pad_position=top)),
        [[top - 2, top - 1, top]])


def test_positions_from_padding_no_padding_is_arange(device):
    ids = on(device, np.arange(1, 11).reshape(2, 5))
    np.testing.assert_array_equal(host(F.positions_from_padding(ids, 0, past_length=4)),
                                  np.tile(np.arange(4, 9), (2, 1)))


@pytest.mark.parametrize("args, kwargs, exc, match", [
    ((np.array(3), 0), {}, ValueError, "input_ids: expected at least 1 dimension"),
    ((np.zeros((2, 3)), 0), {}, TypeError, "input_ids: expected integer"),
    ((np.zeros((2, 3), bool), 0), {}, TypeError, "input_ids: expected integer"),
    ((np.zeros((2, 3), int), 0.5), {}, TypeError, "padding_idx: expected an integer"),
    ((np.zeros((2, 3), int), 0), {"past_length": -1}, ValueError,
     "past_length: expected an integer >= 0"),
    ((np.zeros((2, 3), int), 0), {"past_length": 1.0}, TypeError, "past_length"),
    ((np.zeros((2, 3), int), 0), {"past_length": [1, 2, 3]}, ValueError,
     r"past_length: expected shape \(2,\)"),
    ((np.zeros((2, 3), int), 0), {"past_length": [1, -2]}, ValueError,
     "past_length: expected values >= 0"),
    ((np.zeros((2, 3), int), 0), {"pad_position": "0"}, TypeError, "pad_position"),
    # Values the int64 kernel cannot hold failed to type or silently wrapped around.
    ((np.zeros((2, 3), int), 2**64), {}, ValueError, "padding_idx: expected an integer <="),
    ((np.zeros((2, 3), int), 0), {"pad_position": 2**63}, ValueError,
     "pad_position: expected an integer <= 9223372036854775807"),
    ((np.ones((2, 3), int), 0), {"past_length": 2**63 - 2}, ValueError,
     "past_length: expected an integer <= 9223372036854775805"),
    ((np.ones((2, 3), int), 0), {"past_length": 2**63}, ValueError, "past_length"),
    ((np.ones((2, 3), int), 0), {"past_length": [0, 2**63 - 2]}, ValueError,
     "past_length: expected values <= 9223372036854775805"),
])
def test_positions_from_padding_errors(device, args, kwargs, exc, match):
    ids, padding_idx = args
    with pytest.raises(exc, match=match):
        F.positions_from_padding(on(device, ids), padding_idx, **kwargs)
