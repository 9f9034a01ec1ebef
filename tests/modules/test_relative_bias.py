"""RelativePositionBias (T5): forward, add_, backward, loading Hugging Face weights, a step.

Built with ``device=`` and run on the CPU and on CUDA (Numba's simulator, tiny
shapes) against the NumPy reference; transformers' T5 (a tiny T5Config) where
installed.
"""

import numpy as np
import pytest
import reference as ref
from conftest import FLOAT_DTYPES, host, on

import numbapos
from numbapos.nn.relative import RelativePositionBias


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_forward_and_backward_are_the_reference(device, dtype, rng):
    bias = RelativePositionBias(3, num_buckets=8, max_distance=12, bidirectional=False,
                                device=device, dtype=dtype, seed=7)
    weight = host(bias.weight.data)
    assert weight.shape == (8, 3) and weight.dtype == dtype
    out = bias(4, 6, offset=2)
    np.testing.assert_array_equal(host(out), ref.t5_bias(weight, 4, 6, 2, False, 12))
    grad = rng.standard_normal((1, 3, 4, 6)).astype(dtype)
    assert bias.backward(on(device, grad)) is None
    want = ref.t5_bias_grad(grad, 8, 2, False, 12)
    np.testing.assert_array_equal(host(bias.weight.grad), want)
    bias(4, 6, offset=2)
    bias.backward(on(device, grad))  # accumulates
    np.testing.assert_array_equal(host(bias.weight.grad), want + want)


def test_add_and_its_backward(device, rng):
    bias = RelativePositionBias(2, num_buckets=8, max_distance=10, device=device)
    weight = host(bias.weight.data)
    scores = rng.standard_normal((3, 2, 4, 5)).astype(np.float32)
    x = on(device, scores.copy())
    assert bias.add_(x, offset=1) is x
    np.testing.assert_array_equal(host(x), scores + ref.t5_bias(weight, 4, 5, 1, True, 10))
    grad = rng.standard_normal((3, 2, 4, 5)).astype(np.float32)
    back = bias.backward(on(device, grad))
    np.testing.assert_array_equal(host(back), grad)
    np.testing.assert_array_equal(host(bias.weight.grad), ref.t5_bias_grad(grad, 8, 1, True,
                                                                           10))


def test_keyed_init_is_the_same_on_each_device_and_seed_dependent(device):
    a = RelativePositionBias(4, device=device, seed=3)
    b = RelativePositionBias(4, seed=3)
    c = RelativePositionBias(4, seed=4)
    np.testing.assert_array_equal(host(a.weight.data), b.weight.data)
    assert not np.array_equal(b.weight.data, c.weight.data)
    assert 0.5 < float(np.std(b.weight.data)) < 1.5
    scaled = RelativePositionBias(4, seed=3, std=0.5)
    np.testing.assert_allclose(scaled.weight.data, 0.5 * b.weight.data, rtol=1e-6)


def test_sgd_step_moves_the_table_by_the_gradient(device, rng):
    bias = RelativePositionBias(2, num_buckets=8, max_distance=10, device=device)
    before = host(bias.weight.data).copy()
    opt = numbapos.optim.SGD(bias.parameters(), lr=0.5)
    bias(3, 3)
    grad = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    bias.backward(on(device, grad))
    opt.step()
    step = ref.t5_bias_grad(grad, 8, 0, True, 10)
    np.testing.assert_allclose(host(bias.weight.data), before - np.float32(0.5) * step,
                               rtol=1e-6, atol=1e-7)
    bias.zero_grad()
    assert bias.weight.grad is None or not host(bias.weight.grad).any()


def _tiny_t5(torch, transformers):
    config = transformers.T5Config(vocab_size=40, d_model=16, d_kv=4, d_ff=32, num_layers=2,
                                   num_decoder_layers=2, num_heads=4,
                                   relative_attention_num_buckets=32,
                                   relative_attention_max_distance=128)
    torch.manual_seed(0)
    return transformers.T5Model(config).eval()


@pytest.mark.parametrize("stack", ["encoder", "decoder"])
def test_from_hf_state_dict_gives_transformers_compute_bias(stack):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = _tiny_t5(torch, transformers)
    prefix = f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias."
    bias = RelativePositionBias.from_hf_state_dict(model.state_dict(), prefix)
    assert bias.bidirectional == (stack == "encoder")
    assert (bias.num_heads, bias.num_buckets) == (4, 32)
    attention = getattr(model, stack).block[0].layer[0].SelfAttention
    for rows, cols, offset in [(9, 9, 0), (1, 200, 199), (30, 300, 0)]:
        with torch.no_grad():
            want = attention.compute_bias(rows, cols, past_seen_tokens=offset).numpy()
        got = bias(rows, cols, offset=offset)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    # The loaded table is an owning copy.
    with torch.no_grad():
        attention.relative_attention_bias.weight.add_(1.0)
    assert not np.array_equal(bias.weight.data,
                              attention.relative_attention_bias.weight.detach().numpy())


def test_backward_is_torch_autograd_through_compute_bias(rng):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = _tiny_t5(torch, transformers).double()
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    bias = RelativePositionBias.from_hf_state_dict(state)
    assert bias.weight.dtype == np.float64
    attention = model.encoder.block[0].layer[0].SelfAttention
    grad = rng.standard_normal((1, 4, 20, 150))
    attention.compute_bias(20, 150).backward(torch.from_numpy(grad))
    bias(20, 150)
    bias.backward(grad)
    np.testing.assert_allclose(bias.weight.grad,
                               attention.relative_attention_bias.weight.grad.numpy(),
                               rtol=1e-12, atol=1e-12)


def test_state_dict_round_trip_and_bad_state():
    bias = RelativePositionBias(3, num_buckets=16, max_distance=40)
    state = bias.state_dict()
    assert list(state) == ["weight"] and state["weight"].shape == (16, 3)
    other = RelativePositionBias.from_hf_state_dict(state, prefix="")
    np.testing.assert_array_equal(other.weight.data, bias.weight.data)
    with pytest.raises(KeyError, match="missing 'encoder.block.0.layer.0.SelfAttention."):
        RelativePositionBias.from_hf_state_dict(state)
    with pytest.raises(ValueError, match=r"state_dict\['weight'\]: expected shape \(\?, \?\)"):
        RelativePositionBias.from_hf_state_dict({"weight": np.ones(3, np.float32)}, prefix="")
    with pytest.raises(ValueError, match="max_distance: expected an integer > 4"):
        RelativePositionBias.from_hf_state_dict({"weight": np.ones((16, 2), np.float32)},
                                                prefix="", max_distance=4)


def test_bad_arguments_and_records():
    with pytest.raises(ValueError, match="num_heads: expected an integer >= 1, got 0"):
        RelativePositionBias(0)
    with pytest.raises(ValueError, match="num_buckets: expected an integer >= 4"):
        RelativePositionBias(2, num_buckets=2)
    with pytest.raises(ValueError, match="max_distance: expected an integer >= 1, got 0"):
        RelativePositionBias(2, max_distance=0)
    with pytest.raises(TypeError, match="bidirectional: expected a bool"):
        RelativePositionBias(2, bidirectional="yes")
    bias = RelativePositionBias(2, num_buckets=8, max_distance=10)
    with pytest.raises(RuntimeError, match="backward called before forward"):
        bias.backward(np.zeros((1, 2, 3, 3), np.float32))
    with pytest.raises(ValueError, match="offset: expected an integer >= 0, got -1"):
        bias(3, 3, offset=-1)
    bias(3, 4)
    with pytest.raises(ValueError, match=r"grad_output: expected shape \(1, 2, 3, 4\)"):
        bias.backward(np.zeros((1, 2, 4, 3), np.float32))
    bias.backward(np.ones((1, 2, 3, 4), np.float32))  # the record was kept
    assert float(bias.weight.grad.sum()) == 24.0
    with numbapos.no_grad():
        bias(3, 4)
    with pytest.raises(RuntimeError):
        bias.backward(np.ones((1, 2, 3, 4), np.float32))
