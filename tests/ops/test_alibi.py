"""ALiBi: slopes, biases of each mode, the in-place add, the slopes' gradient, the module.

Kernel-backed cases run on the CPU and on CUDA (the simulator, tiny shapes),
against the NumPy reference; the GPU must give the CPU's bits. transformers'
BLOOM and MPT are compared where installed.
"""

import numpy as np
import pytest
import reference as ref
from conftest import FLOAT_DTYPES, host, on
from cuda_counts import deferred_raises

import numbapos.functional as F
from numbapos import nn

MODES = ["symmetric", "mpt", "bloom"]
MASK = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 0, 1]])


@pytest.mark.parametrize("num_heads", [1, 2, 3, 5, 8, 12, 16, 24, 30])
def test_slopes_follow_the_paper(num_heads):
    slopes = F.alibi_slopes(num_heads, dtype=np.float64)
    closest = 2 ** int(np.floor(np.log2(num_heads)))
    want = [2.0 ** (-8 * k / closest) for k in range(1, closest + 1)]
    want += [2.0 ** (-8 * k / (2 * closest)) for k in range(1, 2 * closest, 2)]
    np.testing.assert_allclose(slopes, want[:num_heads], rtol=1e-15)


@pytest.mark.parametrize("num_heads", [4, 6, 12, 32, 40])
def test_slopes_match_bloom_and_mpt(num_heads):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    ours = F.alibi_slopes(num_heads)
    np.testing.assert_allclose(ours, _get_alibi_slopes(num_heads, torch.device("cpu")).numpy(),
                               rtol=1e-6)
    mpt = build_mpt_alibi_tensor(num_heads, 2)[:, 0, 0].numpy()  # distance -1: -slope
    np.testing.assert_allclose(-mpt, ours, rtol=1e-6)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_bias_matches_reference(device, mode, dtype):
    slopes = F.alibi_slopes(3, dtype=dtype) * dtype(1.5)
    mask = MASK if mode == "bloom" else None
    bias = F.alibi_bias(on(device, slopes), 4, 5, mode=mode, attention_mask=mask)
    want = ref.alibi_scores(np.zeros((3, 3, 4, 5), dtype), slopes, mode, mask)
    got = np.broadcast_to(host(bias), want.shape)
    np.testing.assert_array_equal(got, want)
    assert bias.dtype == dtype


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("mode", MODES)
def test_add_and_slope_gradient(device, mode, dtype, rng):
    scores = rng.standard_normal((3, 2, 3, 5)).astype(dtype)
    slopes = rng.uniform(0.1, 1.0, 2).astype(dtype)
    mask = MASK if mode == "bloom" else None
    got = on(device, scores.copy())
    assert F.add_alibi_(got, on(device, slopes), mode=mode, attention_mask=mask) is got
    np.testing.assert_array_equal(host(got), ref.alibi_scores(scores, slopes, mode, mask))
    grad = F.alibi_slopes_grad(on(device, scores), mode=mode, attention_mask=mask)
    want = ref.alibi_slopes_grad(scores, mode, mask)
    rtol = 1e-6 if dtype == np.float32 else 1e-13
    np.testing.assert_allclose(host(grad), want, rtol=rtol)
    if device == "cuda":  # the CPU's summation order: its bits
        cpu = F.alibi_slopes_grad(scores, mode=mode, attention_mask=mask)
        np.testing.assert_array_equal(host(grad), cpu)


def test_slope_gradient_matches_finite_differences(rng):
    scores = rng.standard_normal((2, 3, 4, 6))
    weights = rng.standard_normal(scores.shape)
    slopes = rng.uniform(0.1, 1.0, 3)
    for mode in MODES:
        mask = MASK[:2, :6] if mode == "bloom" else None
        if mask is not None:
            mask = np.concatenate([mask, np.ones((2, 1), np.int64)], axis=1)

        def loss(s, mode=mode, mask=mask):
            return np.sum(F.add_alibi_(scores.copy(), s, mode=mode, attention_mask=mask)
                          * weights)

        numeric = np.zeros(3)
        for h in range(3):
            up, down = slopes.copy(), slopes.copy()
            up[h] += 1e-6
            down[h] -= 1e-6
            numeric[h] = (loss(up) - loss(down)) / 2e-6
        got = F.alibi_slopes_grad(weights, mode=mode, attention_mask=mask)
        np.testing.assert_allclose(got, numeric, rtol=1e-6)


def test_large_shapes_use_the_parallel_kernels_with_the_same_bits(rng):
    scores = rng.standard_normal((4, 8, 64, 80)).astype(np.float32)
    slopes = F.alibi_slopes(8)
    got = F.add_alibi_(scores.copy(), slopes)
    np.testing.assert_array_equal(got, ref.alibi_scores(scores, slopes, "symmetric"))
    grad = F.alibi_slopes_grad(scores)
    np.testing.assert_allclose(grad, ref.alibi_slopes_grad(scores, "symmetric"), rtol=1e-6)


@pytest.mark.parametrize("call, error, match", [
    (lambda s: F.add_alibi_(s, F.alibi_slopes(3)), ValueError, "slopes"),
    (lambda s: F.add_alibi_(s, F.alibi_slopes(2), mode="causal"), ValueError, "mode"),
    (lambda s: F.add_alibi_(s, F.alibi_slopes(2), attention_mask=[1, 1, 1]), ValueError,
     "attention_mask"),
    (lambda s: F.add_alibi_(s, F.alibi_slopes(2), mode="bloom", attention_mask=[1, 2, 1]),
     ValueError, "attention_mask"),
    (lambda s: F.add_alibi_(s, F.alibi_slopes(2), mode="bloom", attention_mask=[1, 1]),
     ValueError, "attention_mask"),
    (lambda s: F.add_alibi_(s[0], F.alibi_slopes(2)), ValueError, "scores"),
    (lambda s: F.add_alibi_(s.astype(np.int64), F.alibi_slopes(2)), TypeError, "scores"),
    (lambda s: F.alibi_bias(F.alibi_slopes(2), 0), ValueError, "query_length"),
    (lambda s: F.alibi_slopes(0), ValueError, "num_heads"),
])
def test_bad_input_raises_and_changes_nothing(call, error, match):
    scores = np.arange(2 * 2 * 3 * 3, dtype=np.float32).reshape(2, 2, 3, 3)
    before = scores.copy()
    with pytest.raises(error, match=match):
        call(scores)
    np.testing.assert_array_equal(scores, before)


def test_a_bad_mask_value_raises_on_each_device(device):
    # On CUDA the mask is read by a kernel: the ValueError is deferred to the next
    # synchronising call, with the CPU's message (the first bad value in flat order).
    slopes = on(device, F.alibi_slopes(2))
    mask = on(device, np.array([[1, 1, 1], [0, 3, 2]]))
    with deferred_raises(device, ValueError, "attention_mask: expected only 0 and 1, got 3",
                         deferred=True):
        F.alibi_bias(slopes, 3, mode="bloom", attention_mask=mask)
    good = on(device, np.array([[1, 1, 1], [0, 1, 1]], dtype=bool))
    got = host(F.alibi_bias(slopes, 3, mode="bloom", attention_mask=good))
    np.testing.assert_array_equal(got, F.alibi_bias(F.alibi_slopes(2), 3, mode="bloom",
                                                    attention_mask=host(good)))


def test_bloom_parity_with_left_padding():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1], [0, 0, 0, 0, 1, 1]])
    for heads in (4, 6):
        want = build_alibi_tensor(torch.from_numpy(mask), heads, torch.float32).numpy()
        got = F.alibi_bias(F.alibi_slopes(heads), 6, mode="bloom", attention_mask=mask)
        np.testing.assert_allclose(got.reshape(3 * heads, 1, 6), want, rtol=1e-6, atol=0)
        slopes = torch.from_numpy(F.alibi_slopes(heads))
        theirs_with_our_slopes = (slopes[None, :, None] * torch.from_numpy(
            (np.cumsum(mask, 1) - 1) * mask)[:, None, :]).reshape(3 * heads, 1, 6)
        np.testing.assert_array_equal(got.reshape(3 * heads, 1, 6),
                                      theirs_with_our_slopes.numpy())


def test_mpt_parity():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    for heads in (4, 6, 16):
        want = build_mpt_alibi_tensor(heads, 7).numpy()
        got = F.alibi_bias(F.alibi_slopes(heads), 7, mode="mpt")
        np.testing.assert_allclose(got[0], want, rtol=1e-6, atol=0)


# ---------------------------------------------------------------- the module


def test_module_forward_backward_trains_the_slopes(device, rng):
    alibi = nn.ALiBi(3, mode="bloom", trainable=True, device=device)
    scores = rng.standard_normal((3, 3, 2, 5)).astype(np.float32)
    y = alibi(on(device, scores), attention_mask=MASK)
    np.testing.assert_array_equal(host(y), ref.alibi_scores(scores, F.alibi_slopes(3),
                                                            "bloom", MASK))
    g = rng.standard_normal(scores.shape).astype(np.float32)
    assert host(alibi.backward(on(device, g))) is not None
    np.testing.assert_allclose(host(alibi.slopes.grad), ref.alibi_slopes_grad(g, "bloom", MASK),
                               rtol=1e-6)
    assert alibi.pending_backwards() == 0


def test_module_frozen_slopes_get_no_gradient(rng):
    alibi = nn.ALiBi(2)
    scores = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)
    before = scores.copy()
    alibi(scores)
    np.testing.assert_array_equal(scores, before)  # not in place
    with pytest.raises(ValueError, match="grad_output"):
        alibi.backward(scores[:, :1])
    alibi.backward(scores)
    assert alibi.slopes.grad is None
    with pytest.raises(ValueError, match="mode"):
        nn.ALiBi(2, mode="rightward")
