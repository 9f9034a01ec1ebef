"""Learned position tables past max_len: resize_pos_table, extend_, resize_position_embeddings.

Kernel cases run on the CPU and on CUDA (the simulator); the GPU gives the
CPU's bits. The linear mode is compared with PyTorch's interpolate where installed.
"""

import numpy as np
import pytest
import reference as ref
from conftest import FLOAT_DTYPES, host, on

import numbapos.functional as F
from numbapos import nn, optim

MODES = ["linear", "copy", "repeat_last", "init"]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("new_len, prefix", [(11, 0), (20, 2), (4, 0), (6, 1), (7, 0)])
@pytest.mark.parametrize("mode", MODES)
def test_resize_matches_reference(device, mode, new_len, prefix, dtype, rng):
    table = rng.standard_normal((7, 5)).astype(dtype)
    grown = max(new_len - 7, 0)
    fill = rng.standard_normal((grown, 5)).astype(dtype) if mode == "init" and grown else None
    got = F.resize_pos_table(on(device, table), new_len, mode=mode, num_prefix_rows=prefix,
                             fill=on(device, fill))
    want = ref.resize_pos_table(table, new_len, mode, prefix, fill)
    rtol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(host(got), want, rtol=rtol, atol=rtol)
    if mode != "linear":
        np.testing.assert_array_equal(host(got), want)  # rows copied exactly
    if device == "cuda":
        cpu = F.resize_pos_table(table, new_len, mode=mode, num_prefix_rows=prefix, fill=fill)
        np.testing.assert_array_equal(host(got), cpu)


@pytest.mark.parametrize("new_len", [3, 8, 16, 33, 1000])
@pytest.mark.parametrize("prefix", [0, 1])
def test_linear_equals_torch_interpolate(new_len, prefix, rng):
    torch = pytest.importorskip("torch")
    table = rng.standard_normal((12, 6)).astype(np.float32)
    body = torch.from_numpy(table[prefix:].T.copy())[None]
    want = torch.nn.functional.interpolate(body, size=new_len - prefix, mode="linear",
                                           align_corners=False)[0].T.numpy()
    got = F.resize_pos_table(table, new_len, num_prefix_rows=prefix)
    np.testing.assert_array_equal(got[:prefix], table[:prefix])
    # PyTorch forms the source coordinate and its weights in float32, numbapos in float64.
    np.testing.assert_allclose(got[prefix:], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call, error, match", [
    (lambda t: F.resize_pos_table(t, 8, mode="cubic"), ValueError, "mode"),
    (lambda t: F.resize_pos_table(t, 2, num_prefix_rows=2), ValueError, "new_len"),
    (lambda t: F.resize_pos_table(t, 8, num_prefix_rows=4), ValueError, "num_prefix_rows"),
    (lambda t: F.resize_pos_table(t, 8, mode="init"), ValueError, "fill"),
    (lambda t: F.resize_pos_table(t, 8, mode="init", fill=np.zeros((3, 3))), ValueError, "fill"),
    (lambda t: F.resize_pos_table(t, 8, fill=np.zeros((4, 3))), ValueError, "fill"),
    (lambda t: F.resize_pos_table(t.astype(np.int64), 8), TypeError, "table"),
    (lambda t: F.resize_pos_table(t, 8.0), TypeError, "new_len"),
])
def test_bad_input_raises_and_changes_nothing(call, error, match):
    table = np.arange(12.0).reshape(4, 3)
    before = table.copy()
    with pytest.raises(error, match=match):
        call(table)
    np.testing.assert_array_equal(table, before)


# ---------------------------------------------------------------- modules


@pytest.mark.parametrize("mode", MODES)
def test_learned_extend_keeps_the_parameter_and_reads_past_the_old_length(mode, rng):
    layer = nn.LearnedPosEmbedding(6, 4, seed=0)
    weight = layer.weight
    old = weight.data.copy()
    assert layer.extend_(10, mode=mode, seed=1) is layer
    assert layer.weight is weight and layer.max_len == 10 and weight.data.shape == (10, 4)
    if mode != "linear":
        np.testing.assert_array_equal(weight.data[:6], old)
    x = rng.standard_normal((2, 9, 4)).astype(np.float32)
    y = layer(x, offset=1)
    np.testing.assert_allclose(y, x + weight.data[1:10], rtol=1e-6)
    layer.backward(np.ones_like(x))
    assert weight.grad.shape == (10, 4)


def test_extend_with_an_optimizer_keeps_its_state_consistent(rng):
    layer = nn.LearnedPosEmbedding(6, 4, seed=0)
    opt = optim.Adam(layer.parameters(), lr=0.1)
    x = rng.standard_normal((2, 6, 4)).astype(np.float32)
    layer(x)
    layer.backward(np.ones_like(x))
    opt.step()
    state = opt.state[id(layer.weight)]
    moments = {name: value.copy() for name, value in state.items() if hasattr(value, "shape")}
    step = state["step"]
    layer.zero_grad()
    layer.extend_(9, mode="copy", optimizer=opt)
    for name, value in moments.items():
        if value.ndim and value.shape[0] == 6:
            np.testing.assert_array_equal(state[name][:6], value)
            np.testing.assert_array_equal(state[name][6:], 0)
    assert state["step"] == step
    layer(rng.standard_normal((1, 9, 4)).astype(np.float32))
    layer.backward(np.ones((1, 9, 4), np.float32))
    opt.step()  # the resized state fits


def test_extend_without_the_optimizer_is_refused_at_its_next_step(rng):
    layer = nn.LearnedPosEmbedding(4, 2, seed=0)
    opt = optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)
    layer(np.ones((1, 4, 2), np.float32))
    layer.backward(np.ones((1, 4, 2), np.float32))
    opt.step()
    layer.extend_(6, mode="repeat_last")
    layer(np.ones((1, 6, 2), np.float32))
    layer.backward(np.ones((1, 6, 2), np.float32))
    with pytest.raises(ValueError, match="shape"):
        opt.step()
    other = optim.SGD([nn.Parameter(np.zeros(3))], lr=0.1)
    with pytest.raises(ValueError, match="optimizer"):
        layer.extend_(8, optimizer=other)
    assert layer.max_len == 6


def test_extend_refuses_pending_backwards():
    layer = nn.LearnedPosEmbedding(4, 2)
    layer(np.ones((1, 4, 2), np.float32))
    with pytest.raises(RuntimeError, match="backward"):
        layer.extend_(8)
    assert layer.max_len == 4


@pytest.mark.parametrize("kind", ["learnable_addition", "learnable_mult_addition",
                                  "transformers"])
def test_positional_embedding_extend(kind, rng):
    layer = nn.PositionalEmbedding(4, 3, type=kind, seed=0)
    layer.extend_(7, mode="init")
    assert layer.max_len == 7
    x = rng.standard_normal((2, 7, 3)).astype(np.float32)
    y = layer(x)
    assert y.shape == x.shape
    if kind == "learnable_mult_addition":
        np.testing.assert_array_equal(layer.multipliers.data[4:], 1)
        assert layer.addends.data.shape == (7, 3)


def test_bert_and_gpt2_resize_position_embeddings(rng):
    bert = nn.BertEmbeddings(20, 8, max_position_embeddings=6, seed=0)
    old = bert.position_embeddings.weight.data.copy()
    bert.resize_position_embeddings(14, mode="copy", num_prefix_rows=2)  # Longformer
    assert bert.max_position_embeddings == 14
    np.testing.assert_array_equal(bert.position_embeddings.weight.data[6:10], old[2:6])
    ids = rng.integers(0, 20, (2, 14))
    assert bert(ids).shape == (2, 14, 8)
    gpt2 = nn.GPT2Embeddings(20, 5, 8, seed=0)
    gpt2.resize_position_embeddings(9, mode="linear")
    assert gpt2.n_positions == 9 and gpt2(ids[:, :9]).shape == (2, 9, 8)


def test_module_extend_on_the_device(device, rng):
    layer = nn.LearnedPosEmbedding(5, 3, seed=0, device=device)
    cpu = nn.LearnedPosEmbedding(5, 3, seed=0)
    layer.extend_(8)
    cpu.extend_(8)
    np.testing.assert_array_equal(host(layer.weight.data), cpu.weight.data)


# ---------------------------------------------------------------- fractional positions


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("shared", [True, False])
def test_fractional_positions_blend_neighbouring_rows(device, shared, dtype, rng):
    table = rng.standard_normal((6, 4)).astype(dtype)
    x = rng.standard_normal((2, 3, 4)).astype(dtype)
    ids = np.array([0.0, 2.25, 5.0]) if shared else np.array([[0.5, 1.0, 4.9], [3.0, 0.0, 1.5]])
    got = F.add_positional(on(device, x), on(device, table), position_ids=ids)
    want = ref.add_fractional_positions(x, table, ids)
    rtol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(host(got), want, rtol=rtol, atol=rtol)
    g = rng.standard_normal(x.shape).astype(dtype)
    grad = F.add_positional_backward(on(device, g), 6, position_ids=ids)
    np.testing.assert_allclose(host(grad), ref.add_fractional_positions_backward(g, ids, 6),
                               rtol=rtol * 10, atol=rtol * 10)
    if device == "cuda":  # the CPU's bits
        np.testing.assert_array_equal(host(got), F.add_positional(x, table, position_ids=ids))
        np.testing.assert_array_equal(host(grad),
                                      F.add_positional_backward(g, 6, position_ids=ids))


def test_integer_valued_float_positions_read_exactly_their_rows(rng):
    table = rng.standard_normal((8, 5)).astype(np.float32)
    x = rng.standard_normal((3, 4, 5)).astype(np.float32)
    ids = np.array([[7, 0, 3, 3], [1, 2, 5, 6], [0, 0, 0, 7]])
    np.testing.assert_array_equal(F.add_positional(x, table, position_ids=ids.astype(float)),
                                  F.add_positional(x, table, position_ids=ids))
    np.testing.assert_array_equal(
        F.add_positional_backward(x, 8, position_ids=ids.astype(np.float32)),
        F.add_positional_backward(x, 8, position_ids=ids))


def test_fractional_gradient_matches_finite_differences(rng):
    table = rng.standard_normal((5, 3))
    x = rng.standard_normal((2, 4, 3))
    g = rng.standard_normal(x.shape)
    ids = np.array([0.3, 1.7, 3.99, 2.0])
    grad = F.add_positional_backward(g, 5, position_ids=ids)
    numeric = np.zeros_like(table)
    for i in np.ndindex(table.shape):
        up, down = table.copy(), table.copy()
        up[i] += 1e-6
        down[i] -= 1e-6
        numeric[i] = (np.sum(F.add_positional(x, up, position_ids=ids) * g)
                      - np.sum(F.add_positional(x, down, position_ids=ids) * g)) / 2e-6
    np.testing.assert_allclose(grad, numeric, rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("ids", [[0.0, 5.5, 1.0], [-0.5, 1.0, 1.0], [0.0, np.nan, 1.0]])
def test_fractional_positions_out_of_range_raise(ids):
    table = np.ones((6, 2), np.float32)
    x = np.zeros((1, 3, 2), np.float32)
    with pytest.raises(IndexError, match="position_ids"):
        F.add_positional(x, table, position_ids=np.array(ids), out=x)
    np.testing.assert_array_equal(x, 0)
    with pytest.raises(ValueError, match="position_ids"):
        F.add_positional(x, table, position_ids=np.zeros(4))


def test_learned_module_reads_fractional_positions(rng):
    layer = nn.LearnedPosEmbedding(4, 2, seed=0)
    x = rng.standard_normal((2, 3, 2)).astype(np.float32)
    ids = np.array([0.5, 1.5, 2.5])
    y = layer(x, position_ids=ids)
    np.testing.assert_allclose(y, ref.add_fractional_positions(x, layer.weight.data, ids),
                               rtol=1e-6)
    ids[:] = 0  # the record holds its own copy
    layer.backward(np.ones_like(x))
    np.testing.assert_allclose(layer.weight.grad,
                               ref.add_fractional_positions_backward(
                                   np.ones_like(x), [0.5, 1.5, 2.5], 4), rtol=1e-6)


def test_positional_embedding_extend_checks_the_optimizer_before_changing_anything(rng):
    layer = nn.PositionalEmbedding(4, 3, type="learnable_mult_addition", seed=0)
    opt = optim.SGD([layer.addends], lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="optimizer"):
        layer.extend_(8, optimizer=opt)
    assert layer.max_len == 4 and layer.addends.data.shape == (4, 3)
    both = optim.Adam(layer.parameters(), lr=0.1)
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    layer(x)
    layer.backward(np.ones_like(x))
    both.step()
    layer.zero_grad()
    layer.extend_(6, mode="repeat_last", optimizer=both)
    layer(rng.standard_normal((2, 6, 3)).astype(np.float32))
    layer.backward(np.ones((2, 6, 3), np.float32))
    both.step()
