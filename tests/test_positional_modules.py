"""Positional layers: SinusoidalPosEmbedding, LearnedPosEmbedding, PositionalEmbedding (NeoML)."""

import numpy as np
import pytest
import reference as ref
from conftest import FLOAT_DTYPES, tolerance

import numbapos.functional as F
from numbapos import nn

# ---------------------------------------------------------------- SinusoidalPosEmbedding


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(6, 5), (3, 6, 8)])
@pytest.mark.parametrize("offset", [0, 4])
def test_sinusoidal_module_adds_table(rng, shape, dtype, offset):
    x = rng.standard_normal(shape).astype(dtype)
    layer = nn.SinusoidalPosEmbedding()
    y = layer(x, offset=offset)
    assert y.dtype == dtype and y.shape == shape
    expected = x + ref.sinusoidal_table(shape[-2], shape[-1], offset=offset)
    rtol, atol = tolerance(dtype)
    np.testing.assert_allclose(y, expected, rtol, atol * 4)
    assert list(layer.parameters()) == []


def test_sinusoidal_module_base():
    layer = nn.SinusoidalPosEmbedding(base=100.0)
    y = layer(np.zeros((5, 4)))
    np.testing.assert_allclose(y, ref.sinusoidal_table(5, 4, base=100.0), atol=1e-12)


def test_sinusoidal_module_caches_table(rng):
    layer = nn.SinusoidalPosEmbedding()
    t1 = layer.table(5, 8, np.float32, 0)
    assert layer.table(5, 8, np.float32, 0) is t1
    assert layer.table(5, 8, "float32") is t1
    assert layer.table(5, 8, np.float64, 0) is not t1
    assert layer.table(5, 8, np.float32, 1) is not t1
    assert layer.table(6, 8, np.float32, 0) is not t1
    assert not t1.flags.writeable
    # forward uses the cached table rather than recomputing it
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    layer(x)
    layer(x)
    assert layer.table(5, 8, np.float32, 0) is t1
    assert len(layer._tables) == 4


def test_sinusoidal_module_cache_is_bounded():
    layer = nn.SinusoidalPosEmbedding()
    layer.cache_size = 3
    first = layer.table(2, 4, offset=0)
    for offset in range(1, 6):
        layer.table(2, 4, offset=offset)
    assert len(layer._tables) == 3
    assert layer.table(2, 4, offset=0) is not first
    np.testing.assert_array_equal(layer.table(2, 4, offset=0), first)


def test_sinusoidal_module_fixed_sizes(rng):
    layer = nn.SinusoidalPosEmbedding(seq_len=4, embed_dim=6)
    layer(np.zeros((2, 4, 6), np.float32))
    with pytest.raises(ValueError, match="L=5 differs from seq_len=4.*seq_len=None"):
        layer(np.zeros((2, 5, 6), np.float32))
    with pytest.raises(ValueError, match="D=7 differs from embed_dim=6.*embed_dim=None"):
        layer(np.zeros((4, 7), np.float32))


def test_sinusoidal_module_backward_is_identity(rng):
    layer = nn.SinusoidalPosEmbedding()
    x = rng.standard_normal((2, 3, 4))
    layer(x)
    grad = rng.standard_normal((2, 3, 4))
    assert layer.backward(grad) is grad


def test_sinusoidal_module_out(rng):
    layer = nn.SinusoidalPosEmbedding()
    x = rng.standard_normal((3, 4)).astype(np.float32)
    expected = layer(x)
    assert layer(x, out=x) is x
    np.testing.assert_array_equal(x, expected)


def test_sinusoidal_module_errors(rng):
    layer = nn.SinusoidalPosEmbedding()
    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(np.zeros((2, 3)))
    with pytest.raises(TypeError, match="x: expected dtype float32 or float64"):
        layer(np.zeros((2, 3), np.int64))
    with pytest.raises(ValueError, match="x: expected a 2-D or 3-D"):
        layer(np.zeros((1, 2, 3, 4)))
    with pytest.raises(ValueError, match="x: expected L > 0"):
        layer(np.zeros((2, 0, 4)))
    with pytest.raises(ValueError, match="offset: expected an integer >= 0"):
        layer(np.zeros((2, 3)), offset=-1)
    layer(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"grad_output: expected shape \(2, 3\)"):
        layer.backward(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="seq_len"):
        nn.SinusoidalPosEmbedding(seq_len=0)
    with pytest.raises(TypeError, match="embed_dim"):
        nn.SinusoidalPosEmbedding(embed_dim=2.0)
    with pytest.raises(ValueError, match="base"):
        nn.SinusoidalPosEmbedding(base=0)


# ---------------------------------------------------------------- LearnedPosEmbedding


def test_learned_inits():
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


def test_learned_seed_reproducible():
    a = nn.LearnedPosEmbedding(8, 4, dropout=0.5, seed=3)
    b = nn.LearnedPosEmbedding(8, 4, dropout=0.5, seed=3)
    np.testing.assert_array_equal(a.weight.data, b.weight.data)
    x = np.ones((2, 8, 4), np.float32)
    np.testing.assert_array_equal(a(x), b(x))
    assert [name for name, _ in a.named_parameters()] == ["weight"]
    assert isinstance(a.dropout, nn.Dropout)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [(4, 3), (2, 4, 3)])
def test_learned_forward_offset(rng, shape, dtype):
    layer = nn.LearnedPosEmbedding(10, 3, seed=1, dtype=dtype)
    x = rng.standard_normal(shape).astype(dtype)
    np.testing.assert_array_equal(layer(x), x + layer.weight.data[:4])
    np.testing.assert_array_equal(layer(x, offset=6), x + layer.weight.data[6:10])


def test_learned_position_ids(rng):
    layer = nn.LearnedPosEmbedding(10, 3, seed=1)
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    ids = np.array([[3, 3, 0, 9], [1, 2, 2, 2]])
    np.testing.assert_array_equal(layer(x, position_ids=ids), x + layer.weight.data[ids])
    np.testing.assert_array_equal(layer(x, position_ids=[5, 5, 5, 5]),
                                  x + layer.weight.data[[5, 5, 5, 5]])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_learned_backward_repeated_position_ids(rng, dtype):
    layer = nn.LearnedPosEmbedding(6, 3, seed=1, dtype=dtype)
    x = rng.standard_normal((3, 4, 3)).astype(dtype)
    ids = np.array([[2, 2, 0, 2], [5, 2, 2, 0], [1, 1, 1, 1]])
    layer(x, position_ids=ids)
    grad = rng.standard_normal((3, 4, 3)).astype(dtype)
    gx = layer.backward(grad)
    np.testing.assert_array_equal(gx, grad)
    np.testing.assert_allclose(layer.weight.grad, ref.embedding_backward(grad, ids, 6),
                               *tolerance(dtype))
    first = layer.weight.grad.copy()
    layer.zero_grad()
    layer(x, position_ids=ids)
    layer.backward(grad)
    np.testing.assert_array_equal(layer.weight.grad, first)  # deterministic


def test_learned_backward_offset_and_accumulation(rng):
    layer = nn.LearnedPosEmbedding(8, 3, seed=1, dtype=np.float64)
    x = rng.standard_normal((2, 4, 3))
    grad = rng.standard_normal((2, 4, 3))
    layer(x, offset=3)
    layer.backward(grad)
    expected = np.zeros((8, 3))
    expected[3:7] = grad.sum(axis=0)
    np.testing.assert_allclose(layer.weight.grad, expected, atol=1e-12)
    layer(x, offset=3)
    layer.backward(grad)
    np.testing.assert_allclose(layer.weight.grad, 2 * expected, atol=1e-12)


@pytest.mark.parametrize("use_ids", [False, True])
def test_learned_finite_differences(rng, use_ids):
    layer = nn.LearnedPosEmbedding(5, 2, seed=2, dtype=np.float64)
    x = rng.standard_normal((2, 3, 2))
    r = rng.standard_normal((2, 3, 2))
    kwargs = {"position_ids": np.array([4, 0, 4])} if use_ids else {"offset": 1}

    def loss():
        return float(np.sum(layer(x, **kwargs) * r))

    loss()
    gx = layer.backward(r)
    np.testing.assert_allclose(gx, ref.finite_difference(loss, x), atol=1e-7)
    np.testing.assert_allclose(layer.weight.grad, ref.finite_difference(loss, layer.weight.data),
                               atol=1e-7)


def test_learned_dropout_forward_backward(rng):
    p = 0.3
    layer = nn.LearnedPosEmbedding(6, 4, dropout=p, seed=5, dtype=np.float64)
    x = rng.standard_normal((3, 6, 4))
    seed = layer.dropout.seed
    y = layer(x)
    expected = F.dropout(x + layer.weight.data, p, seed, counter=0)
    np.testing.assert_array_equal(y, expected)
    assert (y == 0).any()
    grad = rng.standard_normal((3, 6, 4))
    gx = layer.backward(grad)
    g_expected = F.dropout_backward(grad, p, seed, counter=0)
    np.testing.assert_array_equal(gx, g_expected)
    np.testing.assert_allclose(layer.weight.grad, g_expected.sum(axis=0), atol=1e-12)
    # a second training call draws a fresh mask
    y2 = layer(x)
    np.testing.assert_array_equal(y2, F.dropout(x + layer.weight.data, p, seed, counter=1))
    # eval mode: no dropout
    layer.eval()
    np.testing.assert_array_equal(layer(x), x + layer.weight.data)
    np.testing.assert_array_equal(layer.backward(grad), grad)


def test_learned_frozen_table(rng):
    layer = nn.LearnedPosEmbedding(4, 2)
    layer.weight.requires_grad = False
    layer(np.ones((4, 2), np.float32))
    layer.backward(np.ones((4, 2), np.float32))
    assert layer.weight.grad is None


def test_learned_errors(rng):
    layer = nn.LearnedPosEmbedding(6, 3, seed=0)
    before = layer.weight.data.copy()
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    x_before = x.copy()
    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(x)
    cases = [
        ((x[0, 0],), {}, ValueError, "x: expected a 2-D or 3-D array"),
        ((x[None],), {}, ValueError, "x: expected a 2-D or 3-D array"),
        ((x.astype(np.int32),), {}, TypeError, "x: expected dtype float32 or float64"),
        ((x[..., :2],), {}, ValueError, "x: last dimension 2 does not match embed_dim=3"),
        ((x.astype(np.float64),), {}, TypeError, "x: dtype float64 differs"),
        ((x,), {"offset": -1}, ValueError, r"offset=-1 .*L=4.*max_len=6"),
        ((x,), {"offset": 3}, ValueError, r"offset=3 .*L=4.*max_len=6"),
        ((x,), {"position_ids": [0, 1, 6, 2]}, IndexError, r"position_ids: index 6 .*max_len=6"),
        ((x,), {"position_ids": [[0, 1, 2, 3]] * 3}, ValueError, "position_ids: expected shape"),
    ]
    for args, kwargs, exc, match in cases:
        with pytest.raises(exc, match=match):
            layer(*args, **kwargs)
    np.testing.assert_array_equal(x, x_before)
    np.testing.assert_array_equal(layer.weight.data, before)
    assert layer.dropout.counter == 0
    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(x)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(max_len=0, embed_dim=3), ValueError, "max_len"),
    (dict(max_len=4, embed_dim=None), TypeError, "embed_dim"),
    (dict(max_len=4, embed_dim=3, init="he"), ValueError, "init: unknown initialiser 'he'"),
    (dict(max_len=4, embed_dim=3, init=3), TypeError, "init: expected a string or a callable"),
    (dict(max_len=4, embed_dim=3, dropout=1.5), ValueError, "p: expected a probability"),
    (dict(max_len=4, embed_dim=3, dtype=np.int64), TypeError, "dtype"),
    (dict(max_len=4, embed_dim=3, init=lambda s, r: np.zeros(3)), ValueError, "returned shape"),
])
def test_learned_constructor_errors(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        nn.LearnedPosEmbedding(**kwargs)


# ---------------------------------------------------------------- PositionalEmbedding (NeoML)


def test_neoml_learnable_addition(rng):
    layer = nn.PositionalEmbedding(6, 4, seed=0)
    b = layer.addends.data
    assert b.shape == (6, 4) and b.dtype == np.float32
    assert b.min() >= -0.02 and b.max() <= 0.02 and np.abs(b).max() > 0.015
    assert [name for name, _ in layer.named_parameters()] == ["addends"]
    x = rng.standard_normal((3, 4, 2, 2)).astype(np.float32)  # features (2, 2) -> D = 4
    y = layer(x)
    assert y.shape == x.shape
    np.testing.assert_array_equal(y, x + b[:4].reshape(1, 4, 2, 2))
    grad = rng.standard_normal(x.shape).astype(np.float32)
    assert layer.backward(grad) is grad
    expected = np.zeros((6, 4))
    expected[:4] = grad.reshape(3, 4, 4).sum(axis=0)
    np.testing.assert_allclose(layer.addends.grad, expected, 1e-5, 1e-6)


def test_neoml_mult_addition(rng):
    layer = nn.PositionalEmbedding(5, 3, type="learnable_mult_addition", seed=0,
                                   dtype=np.float64)
    assert [name for name, _ in layer.named_parameters()] == ["multipliers", "addends"]
    np.testing.assert_array_equal(layer.multipliers.data, 1.0)
    b = layer.addends.data
    assert np.abs(b).max() <= 0.02
    layer.multipliers.data[:] = rng.standard_normal((5, 3))
    x = rng.standard_normal((2, 4, 3))
    np.testing.assert_allclose(layer(x), layer.multipliers.data[:4] * x + b[:4], atol=1e-14)


@pytest.mark.parametrize("features", [(3,), (3, 2)])
def test_neoml_mult_addition_finite_differences(rng, features):
    dim = int(np.prod(features))
    layer = nn.PositionalEmbedding(4, dim, type="learnable_mult_addition", seed=0,
                                   dtype=np.float64)
    layer.multipliers.data[:] = rng.standard_normal((4, dim))
    x = rng.standard_normal((2, 3) + features)
    r = rng.standard_normal(x.shape)

    def loss():
        return float(np.sum(layer(x) * r))

    loss()
    gx = layer.backward(r)
    np.testing.assert_allclose(gx, ref.finite_difference(loss, x), atol=1e-7)
    np.testing.assert_allclose(layer.multipliers.grad,
                               ref.finite_difference(loss, layer.multipliers.data), atol=1e-7)
    np.testing.assert_allclose(layer.addends.grad,
                               ref.finite_difference(loss, layer.addends.data), atol=1e-7)
    assert not layer.multipliers.grad[3:].any()


def test_neoml_addition_finite_differences(rng):
    layer = nn.PositionalEmbedding(4, 3, seed=0, dtype=np.float64)
    x = rng.standard_normal((2, 4, 3))
    r = rng.standard_normal(x.shape)

    def loss():
        return float(np.sum(layer(x) * r))

    loss()
    gx = layer.backward(r)
    np.testing.assert_allclose(gx, ref.finite_difference(loss, x), atol=1e-7)
    np.testing.assert_allclose(layer.addends.grad,
                               ref.finite_difference(loss, layer.addends.data), atol=1e-7)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_neoml_transformers(rng, dtype):
    layer = nn.PositionalEmbedding(8, 6, type="transformers")
    assert list(layer.parameters()) == []
    x = rng.standard_normal((2, 5, 6)).astype(dtype)
    y = layer(x)
    assert y.dtype == dtype
    rtol, atol = tolerance(dtype)
    np.testing.assert_allclose(y, x + ref.sinusoidal_table(5, 6), rtol, atol * 4)
    grad = rng.standard_normal(x.shape).astype(dtype)
    assert layer.backward(grad) is grad
    with pytest.raises(ValueError, match="exactly one feature dim"):
        layer(np.zeros((2, 5, 3, 2), dtype))


def test_neoml_max_len_none_fixed_at_first_input(rng):
    layer = nn.PositionalEmbedding(None, 4, seed=0)
    assert layer.max_len is None and list(layer.parameters()) == []
    layer(np.zeros((2, 5, 4), np.float32))
    assert layer.max_len == 5 and layer.addends.shape == (5, 4)
    b = layer.addends.data.copy()
    y = layer(np.zeros((2, 3, 4), np.float32))  # shorter: first rows
    np.testing.assert_array_equal(y, np.broadcast_to(b[:3], (2, 3, 4)))
    with pytest.raises(ValueError, match="sequence is too long: L=6 but max_len=5"):
        layer(np.zeros((1, 6, 4), np.float32))
    sinus = nn.PositionalEmbedding(None, 4, type="transformers")
    sinus(np.zeros((1, 3, 4)))
    assert sinus.max_len == 3
    with pytest.raises(ValueError, match="sequence is too long"):
        sinus(np.zeros((1, 4, 4)))


def test_neoml_errors(rng):
    layer = nn.PositionalEmbedding(4, 6, type="learnable_mult_addition", seed=0)
    a0, b0 = layer.multipliers.data.copy(), layer.addends.data.copy()
    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(np.zeros((1, 2, 6), np.float32))
    with pytest.raises(ValueError, match=r"x: expected shape \(N, L, \*features\)"):
        layer(np.zeros((2, 6), np.float32))
    with pytest.raises(ValueError, match="hold 8 values per position, expected embed_dim=6"):
        layer(np.zeros((1, 2, 2, 4), np.float32))
    with pytest.raises(ValueError, match="sequence is too long: L=5 but max_len=4"):
        layer(np.zeros((1, 5, 6), np.float32))
    with pytest.raises(TypeError, match="x: dtype float64 differs"):
        layer(np.zeros((1, 2, 6)))
    with pytest.raises(TypeError, match="x: expected dtype float32 or float64"):
        layer(np.zeros((1, 2, 6), np.int32))
    with pytest.raises(ValueError, match="non-empty sequence"):
        layer(np.zeros((1, 0, 6), np.float32))
    np.testing.assert_array_equal(layer.multipliers.data, a0)
    np.testing.assert_array_equal(layer.addends.data, b0)
    layer(np.zeros((1, 2, 6), np.float32))
    with pytest.raises(ValueError, match=r"grad_output: expected shape \(1, 2, 6\)"):
        layer.backward(np.zeros((1, 3, 6), np.float32))
    with pytest.raises(ValueError, match="type: expected one of"):
        nn.PositionalEmbedding(4, 6, type="rotary")
    with pytest.raises(ValueError, match="max_len"):
        nn.PositionalEmbedding(0, 6)
    with pytest.raises(TypeError, match="embed_dim"):
        nn.PositionalEmbedding(4, None)
