"""Positional layers: SinusoidalPosEmbedding, LearnedPosEmbedding, PositionalEmbedding (NeoML).

Layers are built with ``device=`` and tested on the CPU and on CUDA (the
``device`` fixture; Numba's simulator without a GPU) against the same NumPy
reference. Initialisers (host code, large tables) and NumPy read-only flags stay
on the CPU.
"""

import numpy as np
import pytest
import reference as ref
from conftest import FLOAT_DTYPES, host, on, tolerance

import numbapos
import numbapos.functional as F
from numbapos import _device, nn


def _assert_on(x, device):
    assert _device.device_of(x) == device, f"result on {_device.device_of(x)}, not {device}"


def _placed(device, value):
    """An ndarray argument on ``device``; anything else (lists, ints, None) as it is."""
    return on(device, value) if isinstance(value, np.ndarray) else value


def _set(param, values):
    """Overwrite a parameter's values in place, on its device."""
    if isinstance(param.data, np.ndarray):
        np.copyto(param.data, values)
    else:
        param.data.copy_to_device(np.ascontiguousarray(values, dtype=param.dtype))


def _finite_difference_of(loss, param):
    """Central differences of ``loss`` wrt ``param`` on either device: a host copy of its
    values is perturbed and written into the parameter before every evaluation."""
    values = host(param.data).copy()

    def at_values():
        _set(param, values)
        return loss()

    try:
        return ref.finite_difference(at_values, values)
    finally:
        _set(param, values)


# ---------------------------------------------------------------- SinusoidalPosEmbedding


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(6, 5), (3, 6, 8)])
@pytest.mark.parametrize("offset", [0, 4])
def test_sinusoidal_module_adds_table(device, rng, shape, dtype, offset):
    x = rng.standard_normal(shape).astype(dtype)
    layer = nn.SinusoidalPosEmbedding(device=device)
    y = layer(on(device, x), offset=offset)
    _assert_on(y, device)
    assert y.dtype == dtype and y.shape == shape
    expected = x + ref.sinusoidal_table(shape[-2], shape[-1], offset=offset)
    rtol, atol = tolerance(dtype)
    np.testing.assert_allclose(host(y), expected, rtol, atol * 4)
    assert list(layer.parameters()) == []


def test_sinusoidal_module_base(device):
    layer = nn.SinusoidalPosEmbedding(base=100.0, device=device)
    y = layer(on(device, np.zeros((5, 4))))
    np.testing.assert_allclose(host(y), ref.sinusoidal_table(5, 4, base=100.0), atol=1e-12)


def test_sinusoidal_module_caches_table(device, rng):
    layer = nn.SinusoidalPosEmbedding(device=device)
    t1 = layer.table(5, 8, np.float32, 0, device=device)
    _assert_on(t1, device)
    assert layer.table(5, 8, np.float32, 0, device=device) is t1
    assert layer.table(5, 8, "float32", device=device) is t1
    assert layer.table(5, 8, np.float64, 0, device=device) is not t1
    assert layer.table(5, 8, np.float32, 1, device=device) is not t1
    assert layer.table(6, 8, np.float32, 0, device=device) is not t1
    if device == "cpu":
        assert not t1.flags.writeable
    # forward uses the cached table rather than recomputing it
    x = on(device, rng.standard_normal((2, 5, 8)).astype(np.float32))
    layer(x)
    layer(x)
    assert layer.table(5, 8, np.float32, 0, device=device) is t1
    assert len(layer._tables) == 4


def test_sinusoidal_module_cache_is_bounded(device):
    layer = nn.SinusoidalPosEmbedding(device=device)
    layer.cache_size = 3
    first = layer.table(2, 4, offset=0, device=device)
    for offset in range(1, 6):
        layer.table(2, 4, offset=offset, device=device)
    assert len(layer._tables) == 3
    again = layer.table(2, 4, offset=0, device=device)
    assert again is not first
    np.testing.assert_array_equal(host(again), host(first))


def test_sinusoidal_module_fixed_sizes(device):
    layer = nn.SinusoidalPosEmbedding(seq_len=4, embed_dim=6, device=device)
    layer(on(device, np.zeros((2, 4, 6), np.float32)))
    with pytest.raises(ValueError, match="L=5 differs from seq_len=4.*seq_len=None"):
        layer(on(device, np.zeros((2, 5, 6), np.float32)))
    with pytest.raises(ValueError, match="D=7 differs from embed_dim=6.*embed_dim=None"):
        layer(on(device, np.zeros((4, 7), np.float32)))


def test_sinusoidal_module_backward_is_identity(device, rng):
    layer = nn.SinusoidalPosEmbedding(device=device)
    layer(on(device, rng.standard_normal((2, 3, 4))))
    grad = on(device, rng.standard_normal((2, 3, 4)))
    assert layer.backward(grad) is grad


def test_sinusoidal_module_out(device, rng):
    layer = nn.SinusoidalPosEmbedding(device=device)
    x = on(device, rng.standard_normal((3, 4)).astype(np.float32))
    expected = host(layer(x))
    assert layer(x, out=x) is x
    np.testing.assert_array_equal(host(x), expected)


def test_sinusoidal_module_errors(device):
    layer = nn.SinusoidalPosEmbedding(device=device)

    def zeros(shape, dtype=np.float64):
        return on(device, np.zeros(shape, dtype))

    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(zeros((2, 3)))
    with pytest.raises(TypeError, match="x: expected dtype float32 or float64"):
        layer(zeros((2, 3), np.int64))
    with pytest.raises(ValueError, match="x: expected a 2-D or 3-D"):
        layer(zeros((1, 2, 3, 4)))
    with pytest.raises(ValueError, match="x: expected L > 0"):
        layer(zeros((2, 0, 4)))
    with pytest.raises(ValueError, match="offset: expected an integer >= 0"):
        layer(zeros((2, 3)), offset=-1)
    layer(zeros((2, 3)))
    with pytest.raises(ValueError, match=r"grad_output: expected shape \(2, 3\)"):
        layer.backward(zeros((3, 2)))
    with pytest.raises(ValueError, match="seq_len"):
        nn.SinusoidalPosEmbedding(seq_len=0, device=device)
    with pytest.raises(TypeError, match="embed_dim"):
        nn.SinusoidalPosEmbedding(embed_dim=2.0, device=device)
    with pytest.raises(ValueError, match="base"):
        nn.SinusoidalPosEmbedding(base=0, device=device)


# ---------------------------------------------------------------- LearnedPosEmbedding


def test_learned_inits():
    # Initialisers run on the host (the table is then moved): CPU only, large tables.
    m, d = 512, 64
    normal = nn.LearnedPosEmbedding(m, d, seed=0).weight.data
    assert normal.dtype == np.float32 and normal.shape == (m, d)
    assert abs(normal.std() - 0.02) < 0.001 and abs(normal.mean()) < 0.001
    uniform = nn.LearnedPosEmbedding(m, d, init="uniform", seed=0).weight.data
    assert uniform.min() >= -0.1 and uniform.max() <= 0.1 and uniform.max() > 0.09
    xavier = nn.LearnedPosEmbedding(m, d, init="xavier_uniform", seed=0).weight.data
    bound = np.sqrt(6.0 / (m + d))
    assert np.abs(xavier).max() <= bound and np.abs(xavier).max() > 0.9 * bound
    sinus = nn.LearnedPosEmbedding(m, d, init="sinusoidal", dtype=np.float64).weight.data
    np.testing.assert_allclose(sinus, ref.sinusoidal_table(m, d), atol=1e-10)
    zeros = nn.LearnedPosEmbedding(m, d, init="zeros").weight.data
    assert not zeros.any()
    custom = nn.LearnedPosEmbedding(3, 2, init=lambda shape, rng: np.full(shape, 0.5))
    np.testing.assert_array_equal(custom.weight.data, 0.5)


def test_learned_seed_reproducible(device):
    a = nn.LearnedPosEmbedding(8, 4, dropout=0.5, seed=3, device=device)
    b = nn.LearnedPosEmbedding(8, 4, dropout=0.5, seed=3, device=device)
    _assert_on(a.weight.data, device)
    np.testing.assert_array_equal(host(a.weight.data), host(b.weight.data))
    x = on(device, np.ones((2, 8, 4), np.float32))
    np.testing.assert_array_equal(host(a(x)), host(b(x)))
    assert [name for name, _ in a.named_parameters()] == ["weight"]
    assert isinstance(a.dropout, nn.Dropout)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(4, 3), (2, 4, 3)])
def test_learned_forward_offset(device, rng, shape, dtype):
    layer = nn.LearnedPosEmbedding(10, 3, seed=1, dtype=dtype, device=device)
    weight = host(layer.weight.data)
    x = rng.standard_normal(shape).astype(dtype)
    xd = on(device, x)
    y = layer(xd)
    _assert_on(y, device)
    np.testing.assert_array_equal(host(y), x + weight[:4])
    np.testing.assert_array_equal(host(layer(xd, offset=6)), x + weight[6:10])


def test_learned_position_ids(device, rng):
    layer = nn.LearnedPosEmbedding(10, 3, seed=1, device=device)
    weight = host(layer.weight.data)
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    xd = on(device, x)
    ids = np.array([[3, 3, 0, 9], [1, 2, 2, 2]])
    np.testing.assert_array_equal(host(layer(xd, position_ids=ids)), x + weight[ids])
    np.testing.assert_array_equal(host(layer(xd, position_ids=on(device, ids))),
                                  x + weight[ids])
    np.testing.assert_array_equal(host(layer(xd, position_ids=[5, 5, 5, 5])),
                                  x + weight[[5, 5, 5, 5]])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_learned_backward_repeated_position_ids(device, rng, dtype):
    layer = nn.LearnedPosEmbedding(6, 3, seed=1, dtype=dtype, device=device)
    x = on(device, rng.standard_normal((3, 4, 3)).astype(dtype))
    ids = np.array([[2, 2, 0, 2], [5, 2, 2, 0], [1, 1, 1, 1]])
    layer(x, position_ids=ids)
    grad = rng.standard_normal((3, 4, 3)).astype(dtype)
    gx = layer.backward(on(device, grad))
    _assert_on(gx, device)
    np.testing.assert_array_equal(host(gx), grad)
    _assert_on(layer.weight.grad, device)
    first = host(layer.weight.grad).copy()
    np.testing.assert_allclose(first, ref.embedding_backward(grad, ids, 6), *tolerance(dtype))
    layer.zero_grad()
    layer(x, position_ids=ids)
    layer.backward(on(device, grad))
    np.testing.assert_array_equal(host(layer.weight.grad), first)  # deterministic


def test_learned_backward_offset_and_accumulation(device, rng):
    layer = nn.LearnedPosEmbedding(8, 3, seed=1, dtype=np.float64, device=device)
    x = on(device, rng.standard_normal((2, 4, 3)))
    grad = rng.standard_normal((2, 4, 3))
    layer(x, offset=3)
    layer.backward(on(device, grad))
    expected = np.zeros((8, 3))
    expected[3:7] = grad.sum(axis=0)
    np.testing.assert_allclose(host(layer.weight.grad), expected, atol=1e-12)
    layer(x, offset=3)
    layer.backward(on(device, grad))
    np.testing.assert_allclose(host(layer.weight.grad), 2 * expected, atol=1e-12)


# With position_ids every CUDA forward range-checks the ids (a reduction kernel, slow on
# the simulator): that case stays on the CPU; test_learned_backward_repeated_position_ids
# checks the CUDA gradient with ids against the reference.
@pytest.mark.parametrize("device, use_ids", [("cpu", False), ("cuda", False), ("cpu", True)],
                         indirect=["device"])
def test_learned_finite_differences(device, rng, use_ids):
    layer = nn.LearnedPosEmbedding(5, 2, seed=2, dtype=np.float64, device=device)
    x = rng.standard_normal((2, 3, 2))
    r = rng.standard_normal((2, 3, 2))
    kwargs = {"position_ids": np.array([4, 0, 4])} if use_ids else {"offset": 1}

    def loss():
        with numbapos.no_grad():  # evaluations only, no backward
            return float(np.sum(host(layer(on(device, x), **kwargs)) * r))

    layer(on(device, x), **kwargs)
    gx = layer.backward(on(device, r))
    np.testing.assert_allclose(host(gx), ref.finite_difference(loss, x), atol=1e-7)
    np.testing.assert_allclose(host(layer.weight.grad), _finite_difference_of(loss, layer.weight),
                               atol=1e-7)


def test_learned_dropout_forward_backward(device, rng):
    p = 0.3
    layer = nn.LearnedPosEmbedding(6, 4, dropout=p, seed=5, dtype=np.float64, device=device)
    weight = host(layer.weight.data)
    x = rng.standard_normal((3, 6, 4))
    xd = on(device, x)
    seed = layer.dropout.seed
    y = host(layer(xd))
    expected = F.dropout(x + weight, p, seed, counter=0)
    np.testing.assert_array_equal(y, expected)
    assert (y == 0).any()
    grad = rng.standard_normal((3, 6, 4))
    gd = on(device, grad)
    gx = layer.backward(gd)
    _assert_on(gx, device)
    g_expected = F.dropout_backward(grad, p, seed, counter=0)
    np.testing.assert_array_equal(host(gx), g_expected)
    np.testing.assert_allclose(host(layer.weight.grad), g_expected.sum(axis=0), atol=1e-12)
    # a second training call draws a fresh mask
    y2 = layer(xd)
    np.testing.assert_array_equal(host(y2), F.dropout(x + weight, p, seed, counter=1))
    # eval mode: no dropout; its backward is the identity, then the second
    # forward's backward applies its mask
    layer.eval()
    np.testing.assert_array_equal(host(layer(xd)), x + weight)
    np.testing.assert_array_equal(host(layer.backward(gd)), grad)
    np.testing.assert_array_equal(host(layer.backward(gd)),
                                  F.dropout_backward(grad, p, seed, counter=1))


def test_learned_frozen_table(device):
    layer = nn.LearnedPosEmbedding(4, 2, device=device)
    layer.weight.requires_grad = False
    layer(on(device, np.ones((4, 2), np.float32)))
    layer.backward(on(device, np.ones((4, 2), np.float32)))
    assert layer.weight.grad is None


def test_learned_errors(device, rng):
    layer = nn.LearnedPosEmbedding(6, 3, seed=0, device=device)
    before = host(layer.weight.data).copy()
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    x_before = x.copy()
    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(on(device, x))
    cases = [
        ((x[0, 0],), {}, ValueError, "x: expected a 2-D or 3-D array"),
        ((x.astype(np.int32),), {}, TypeError, "x: expected dtype float32 or float64"),
        ((x[..., :2],), {}, ValueError, "x: last dimension 2 does not match embed_dim=3"),
        ((x.astype(np.float64),), {}, TypeError, "x: dtype float64 differs"),
        ((x,), {"offset": -1}, ValueError, r"offset=-1 .*L=4.*max_len=6"),
        ((x,), {"offset": 3}, ValueError, r"offset=3 .*L=4.*max_len=6"),
        ((x,), {"position_ids": [0, 1, 6, 2]}, IndexError, r"position_ids: index 6 .*max_len=6"),
        ((x,), {"position_ids": np.array([0, -1, 2, 2])}, IndexError,
         r"position_ids: index -1 .*max_len=6"),
        ((x,), {"position_ids": [[0, 1, 2, 3]] * 3}, ValueError, "position_ids: expected shape"),
    ]
    for args, kwargs, exc, match in cases:
        placed = [_placed(device, a) for a in args]
        with pytest.raises(exc, match=match):
            layer(*placed, **{k: _placed(device, v) for k, v in kwargs.items()})
        for source, array in zip(args, placed, strict=True):
            np.testing.assert_array_equal(host(array), source)
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(host(layer.weight.data), before)
    assert layer.dropout.counter == 0
    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(on(device, x))


def test_learned_rejects_4d_x(device, rng):
    """x[None] has a stride-0 axis: to_device gives it standard strides, so the rank is what
    gets refused, on both devices."""
    layer = nn.LearnedPosEmbedding(6, 3, seed=0, device=device)
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    with pytest.raises(ValueError, match="x: expected a 2-D or 3-D array"):
        layer(on(device, x[None]))
    assert layer.dropout.counter == 0


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(max_len=0, embed_dim=3), ValueError, "max_len"),
    (dict(max_len=4, embed_dim=None), TypeError, "embed_dim"),
    (dict(max_len=4, embed_dim=3, init="he"), ValueError, "init: unknown initialiser 'he'"),
    (dict(max_len=4, embed_dim=3, init=3), TypeError, "init: expected a string or a callable"),
    (dict(max_len=4, embed_dim=3, dropout=1.5), ValueError, "p: expected a probability"),
    (dict(max_len=4, embed_dim=3, dtype=np.int64), TypeError, "dtype"),
    (dict(max_len=4, embed_dim=3, init=lambda s, r: np.zeros(3)), ValueError, "returned shape"),
])
def test_learned_constructor_errors(device, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        nn.LearnedPosEmbedding(**kwargs, device=device)


# ---------------------------------------------------------------- PositionalEmbedding (NeoML)


def test_neoml_learnable_addition(device, rng):
    layer = nn.PositionalEmbedding(6, 4, seed=0, device=device)
    _assert_on(layer.addends.data, device)
    b = host(layer.addends.data)
    assert b.shape == (6, 4) and b.dtype == np.float32
    assert b.min() >= -0.02 and b.max() <= 0.02 and np.abs(b).max() > 0.015
    assert [name for name, _ in layer.named_parameters()] == ["addends"]
    x = rng.standard_normal((3, 4, 2, 2)).astype(np.float32)  # features (2, 2) -> D = 4
    y = layer(on(device, x))
    _assert_on(y, device)
    assert y.shape == x.shape
    np.testing.assert_array_equal(host(y), x + b[:4].reshape(1, 4, 2, 2))
    grad = rng.standard_normal(x.shape).astype(np.float32)
    gd = on(device, grad)
    assert layer.backward(gd) is gd
    expected = np.zeros((6, 4))
    expected[:4] = grad.reshape(3, 4, 4).sum(axis=0)
    np.testing.assert_allclose(host(layer.addends.grad), expected, 1e-5, 1e-6)


def test_neoml_mult_addition(device, rng):
    layer = nn.PositionalEmbedding(5, 3, type="learnable_mult_addition", seed=0,
                                   dtype=np.float64, device=device)
    assert [name for name, _ in layer.named_parameters()] == ["multipliers", "addends"]
    np.testing.assert_array_equal(host(layer.multipliers.data), 1.0)
    b = host(layer.addends.data)
    assert np.abs(b).max() <= 0.02
    a = rng.standard_normal((5, 3))
    _set(layer.multipliers, a)
    x = rng.standard_normal((2, 4, 3))
    y = layer(on(device, x))
    _assert_on(y, device)
    np.testing.assert_allclose(host(y), a[:4] * x + b[:4], atol=1e-14)


# The (3, 2) features run ~170 forwards: CPU only (the CUDA 4-D path is checked by
# test_neoml_learnable_addition).
@pytest.mark.parametrize("device, features", [("cpu", (3,)), ("cuda", (3,)), ("cpu", (3, 2))],
                         indirect=["device"])
def test_neoml_mult_addition_finite_differences(device, rng, features):
    dim = int(np.prod(features))
    layer = nn.PositionalEmbedding(4, dim, type="learnable_mult_addition", seed=0,
                                   dtype=np.float64, device=device)
    _set(layer.multipliers, rng.standard_normal((4, dim)))
    x = rng.standard_normal((2, 3) + features)
    r = rng.standard_normal(x.shape)

    def loss():
        with numbapos.no_grad():  # evaluations only, no backward
            return float(np.sum(host(layer(on(device, x))) * r))

    layer(on(device, x))
    gx = layer.backward(on(device, r))
    np.testing.assert_allclose(host(gx), ref.finite_difference(loss, x), atol=1e-7)
    grad_a, grad_b = host(layer.multipliers.grad), host(layer.addends.grad)
    np.testing.assert_allclose(grad_a, _finite_difference_of(loss, layer.multipliers), atol=1e-7)
    np.testing.assert_allclose(grad_b, _finite_difference_of(loss, layer.addends), atol=1e-7)
    assert not grad_a[3:].any()


def test_neoml_addition_finite_differences(device, rng):
    layer = nn.PositionalEmbedding(4, 3, seed=0, dtype=np.float64, device=device)
    x = rng.standard_normal((2, 4, 3))
    r = rng.standard_normal(x.shape)

    def loss():
        with numbapos.no_grad():  # evaluations only, no backward
            return float(np.sum(host(layer(on(device, x))) * r))

    layer(on(device, x))
    gx = layer.backward(on(device, r))
    np.testing.assert_allclose(host(gx), ref.finite_difference(loss, x), atol=1e-7)
    np.testing.assert_allclose(host(layer.addends.grad),
                               _finite_difference_of(loss, layer.addends), atol=1e-7)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_neoml_transformers(device, rng, dtype):
    layer = nn.PositionalEmbedding(8, 6, type="transformers", device=device)
    assert list(layer.parameters()) == []
    x = rng.standard_normal((2, 5, 6)).astype(dtype)
    y = layer(on(device, x))
    _assert_on(y, device)
    assert y.dtype == dtype
    rtol, atol = tolerance(dtype)
    np.testing.assert_allclose(host(y), x + ref.sinusoidal_table(5, 6), rtol, atol * 4)
    grad = on(device, rng.standard_normal(x.shape).astype(dtype))
    assert layer.backward(grad) is grad
    with pytest.raises(ValueError, match="exactly one feature dim"):
        layer(on(device, np.zeros((2, 5, 3, 2), dtype)))


def test_neoml_max_len_none_fixed_at_first_input(device):
    def zeros(shape, dtype=np.float32):
        return on(device, np.zeros(shape, dtype))

    layer = nn.PositionalEmbedding(None, 4, seed=0, device=device)
    assert layer.max_len is None and list(layer.parameters()) == []
    layer(zeros((2, 5, 4)))
    assert layer.max_len == 5 and layer.addends.shape == (5, 4)
    _assert_on(layer.addends.data, device)
    b = host(layer.addends.data).copy()
    y = layer(zeros((2, 3, 4)))  # shorter: first rows
    np.testing.assert_array_equal(host(y), np.broadcast_to(b[:3], (2, 3, 4)))
    with pytest.raises(ValueError, match="sequence is too long: L=6 but max_len=5"):
        layer(zeros((1, 6, 4)))
    sinus = nn.PositionalEmbedding(None, 4, type="transformers", device=device)
    sinus(zeros((1, 3, 4), np.float64))
    assert sinus.max_len == 3
    with pytest.raises(ValueError, match="sequence is too long"):
        sinus(zeros((1, 4, 4), np.float64))


def test_neoml_errors(device):
    def zeros(shape, dtype=np.float32):
        return on(device, np.zeros(shape, dtype))

    layer = nn.PositionalEmbedding(4, 6, type="learnable_mult_addition", seed=0, device=device)
    a0, b0 = host(layer.multipliers.data).copy(), host(layer.addends.data).copy()
    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(zeros((1, 2, 6)))
    with pytest.raises(ValueError, match=r"x: expected shape \(N, L, \*features\)"):
        layer(zeros((2, 6)))
    with pytest.raises(ValueError, match="hold 8 values per position, expected embed_dim=6"):
        layer(zeros((1, 2, 2, 4)))
    with pytest.raises(ValueError, match="sequence is too long: L=5 but max_len=4"):
        layer(zeros((1, 5, 6)))
    with pytest.raises(TypeError, match="x: dtype float64 differs"):
        layer(zeros((1, 2, 6), np.float64))
    with pytest.raises(TypeError, match="x: expected dtype float32 or float64"):
        layer(zeros((1, 2, 6), np.int32))
    with pytest.raises(ValueError, match="non-empty sequence"):
        layer(zeros((1, 0, 6)))
    np.testing.assert_array_equal(host(layer.multipliers.data), a0)
    np.testing.assert_array_equal(host(layer.addends.data), b0)
    layer(zeros((1, 2, 6)))
    with pytest.raises(ValueError, match=r"grad_output: expected shape \(1, 2, 6\)"):
        layer.backward(zeros((1, 3, 6)))
    with pytest.raises(ValueError, match="type: expected one of"):
        nn.PositionalEmbedding(4, 6, type="rotary", device=device)
    with pytest.raises(ValueError, match="max_len"):
        nn.PositionalEmbedding(0, 6, device=device)
    with pytest.raises(TypeError, match="embed_dim"):
        nn.PositionalEmbedding(4, None, device=device)
