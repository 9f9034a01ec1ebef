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


@pytest.mark.parametrize("max_bias", [8.0, 5.0, 12.5])
def test_bloom_and_mpt_recipes_round_each_float32_step_exactly(max_bias):
    # The reference rounds rationals (Fraction, 40-digit Decimal) to float32 itself.
    for num_heads in [*range(1, 41), 64, 100, 127, 128, 200]:
        bloom = F.alibi_slopes(num_heads, max_bias, recipe="bloom")
        mpt = F.alibi_slopes(num_heads, max_bias, recipe="mpt")
        np.testing.assert_array_equal(bloom, ref.alibi_slopes_bloom(num_heads, max_bias))
        np.testing.assert_array_equal(mpt, ref.alibi_slopes_mpt(num_heads, max_bias))
        paper = F.alibi_slopes(num_heads, max_bias)
        for slopes in (bloom, mpt):  # the paper's values, but for BLOOM's rounded base,
            # whose relative error (<= 2**-24) the k-th power multiplies by k
            np.testing.assert_allclose(slopes, paper, rtol=(num_heads + 2) * 2.0 ** -24)
    wide = F.alibi_slopes(16, max_bias, np.float64, recipe="bloom")
    np.testing.assert_array_equal(wide, F.alibi_slopes(16, max_bias, recipe="bloom"))
    assert wide.dtype == np.float64


def test_bloom_slopes_are_one_ulp_below_the_papers_where_transformers_rounds_the_base():
    assert F.alibi_slopes(16)[1] == np.float32(0.5)
    assert F.alibi_slopes(16, recipe="bloom")[1] == np.nextafter(np.float32(0.5), np.float32(0))
    with pytest.raises(ValueError, match="recipe: expected one of .*got 'falcon'"):
        F.alibi_slopes(16, recipe="falcon")


LEFT_PADDED = np.array([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1],
                        [0, 0, 0, 0, 0, 1, 1], [0, 1, 1, 1, 1, 1, 1]])


def test_bloom_bias_is_transformers_bits_for_1_to_128_heads():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes, build_alibi_tensor

    batch, length = LEFT_PADDED.shape
    off_by_torch = 0
    for heads in range(1, 129):
        want = build_alibi_tensor(torch.from_numpy(LEFT_PADDED), heads, torch.float32).numpy()
        want = want.reshape(batch, heads, 1, length)
        theirs = _get_alibi_slopes(heads, torch.device("cpu")).numpy()
        ours = F.alibi_slopes(heads, recipe="bloom")
        got = F.alibi_bias(ours, length, mode="bloom", attention_mask=LEFT_PADDED)
        same = ours == theirs
        np.testing.assert_array_equal(got[:, same], want[:, same])
        # Elsewhere PyTorch's vectorised float32 pow (SLEEF, 1 ulp; which elements it
        # takes depends on the CPU's vector width) rounded base ** k the other way:
        # one ulp, and its own slopes give its bits.
        assert np.abs(ours.view(np.int32) - theirs.view(np.int32)).max() <= 1
        np.testing.assert_array_equal(
            F.alibi_bias(theirs, length, mode="bloom", attention_mask=LEFT_PADDED), want)
        off_by_torch += int(np.count_nonzero(~same))
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":  # ATEN_CPU_CAPABILITY=default
        assert off_by_torch == 0


def test_mpt_bias_is_transformers_bits_for_1_to_128_heads():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    for heads in range(1, 129):
        want = build_mpt_alibi_tensor(heads, 7).numpy()
        got = F.alibi_bias(F.alibi_slopes(heads, recipe="mpt"), 7, mode="mpt")
        np.testing.assert_array_equal(got[0], want)


@pytest.mark.parametrize("heads", [17, 128])
def test_bloom_bias_has_the_same_bits_on_each_device(device, heads):
    slopes = F.alibi_slopes(heads, recipe="bloom")
    got = host(F.alibi_bias(on(device, slopes), 7, mode="bloom", attention_mask=LEFT_PADDED))
    want = ref.alibi_scores(np.zeros((4, heads, 1, 7), np.float32), slopes, "bloom", LEFT_PADDED)
    np.testing.assert_array_equal(got, want)


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


# ---------------------------------------------------------------- the module


def test_module_forward_backward_trains_the_slopes(device, rng):
    alibi = nn.ALiBi(3, mode="bloom", trainable=True, device=device)
    scores = rng.standard_normal((3, 3, 2, 5)).astype(np.float32)
    y = alibi(on(device, scores), attention_mask=MASK)
    np.testing.assert_array_equal(host(y), ref.alibi_scores(
        scores, F.alibi_slopes(3, recipe="bloom"), "bloom", MASK))
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


@pytest.mark.parametrize("mode, recipe", [("symmetric", "paper"), ("bloom", "bloom"),
                                          ("mpt", "mpt")])
def test_module_slopes_default_to_the_modes_recipe(mode, recipe):
    alibi = nn.ALiBi(24, mode=mode)
    np.testing.assert_array_equal(alibi.slopes.data, F.alibi_slopes(24, recipe=recipe))
    assert f"slopes={recipe!r}" in repr(alibi)
    exact = nn.ALiBi(24, mode=mode, slopes="paper", dtype=np.float64)
    np.testing.assert_array_equal(exact.slopes.data, F.alibi_slopes(24, dtype=np.float64))


def test_module_takes_given_slopes_and_refuses_bad_ones():
    given = np.array([0.3, 0.7])
    alibi = nn.ALiBi(2, mode="bloom", slopes=given)
    np.testing.assert_array_equal(alibi.slopes.data, given.astype(np.float32))
    assert alibi.slopes.data.dtype == np.float32 and "slopes='given'" in repr(alibi)
    for bad, error, match in [("exact", ValueError, "slopes: expected one of"),
                              (np.ones(3), ValueError, r"slopes: expected shape \(2,\)"),
                              (np.array([0.5, np.inf]), ValueError, "slopes: expected finite"),
                              (np.ones(2, np.int64), TypeError, "slopes: expected dtype")]:
        with pytest.raises(error, match=match):
            nn.ALiBi(2, slopes=bad)


def test_module_bloom_forward_is_transformers_bits():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes, build_alibi_tensor

    batch, length = LEFT_PADDED.shape
    want = build_alibi_tensor(torch.from_numpy(LEFT_PADDED), 16, torch.float32).numpy()
    want = want.reshape(batch, 16, 1, length)
    scores = np.zeros((batch, 16, 1, length), np.float32)
    got = nn.ALiBi(16, mode="bloom")(scores, attention_mask=LEFT_PADDED)
    # PyTorch's vectorised pow may round a slope the other way (see the test above):
    # the heads whose slopes agree agree, and transformers' slopes give all its bits.
    theirs = _get_alibi_slopes(16, torch.device("cpu")).numpy()
    same = F.alibi_slopes(16, recipe="bloom") == theirs
    np.testing.assert_array_equal(got[:, same], want[:, same])
    got = nn.ALiBi(16, mode="bloom", slopes=theirs)(scores, attention_mask=LEFT_PADDED)
    np.testing.assert_array_equal(got, want)
