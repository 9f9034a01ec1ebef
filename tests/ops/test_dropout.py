"""Dropout: the counter-based hash, functional forward/backward/mask, and nn.Dropout.

Tests of the ops and the module run on the CPU and on CUDA (the ``device``
fixture; Numba's simulator without a GPU): both devices draw the same masks, so
the expected values are the same, bit for bit. The hash's statistics (100,000
draws), the CPU's thread-count and serial/parallel checks, strided NumPy inputs
and Python lists stay on the CPU.
"""

import numba
import numpy as np
import pytest
import reference
from conftest import FLOAT_DTYPES, device_cases, host, on
from numba import njit

import numbapos
import numbapos.functional as F
from numbapos import _device, nn
from numbapos._args import DropoutArgs, keep_threshold
from numbapos.kernels import hash as kernels
from numbapos.kernels.cpu import dropout as cpu_dropout


@njit(cache=False)
def _bits_range(seed, counter, start, out):
    for i in range(out.size):
        out[i] = kernels.dropout_bits(seed, counter, np.uint64(start + i))


@njit(cache=False)
def _one_bits(seed, counter, index):
    return kernels.dropout_bits(seed, counter, index)


def bits(seed, counter, n, start=0):
    out = np.empty(n, dtype=np.uint32)
    _bits_range(np.uint64(seed), np.uint64(counter), start, out)
    return out


def corr(a, b):
    return float(np.corrcoef(a.astype(np.float64), b.astype(np.float64))[0, 1])


def _assert_on(x, device):
    assert _device.device_of(x) == device, f"result on {_device.device_of(x)}, not {device}"


# ----------------------------------------------------------------- the hash

HASH_CASES = [
    (0, 0), (1, 0), (0, 1), (12345, 7), (2**63, 2**32 + 5), (2**64 - 1, 2**64 - 1),
]


@pytest.mark.parametrize("seed,counter", HASH_CASES)
def test_bits_match_python_reference(seed, counter):
    got = bits(seed, counter, 200)
    want = [reference.dropout_bits(seed, counter, i) for i in range(200)]
    assert got.dtype == np.uint32
    np.testing.assert_array_equal(got, np.array(want, dtype=np.uint32))


def test_bits_match_reference_at_huge_indices():
    start = 2**64 - 100
    out = np.empty(100, dtype=np.uint32)
    for k in range(100):
        out[k] = _one_bits(np.uint64(9), np.uint64(3), np.uint64(start + k))
    want = [reference.dropout_bits(9, 3, start + k) for k in range(100)]
    np.testing.assert_array_equal(out, np.array(want, dtype=np.uint32))


def test_bits_are_uniform():
    n = 100_000
    b = bits(42, 0, n)
    # Top 4 bits into 16 buckets; chi-square with 15 dof: 99.99th percentile ~ 44.3.
    counts = np.bincount(b >> 28, minlength=16)
    chi2 = float(((counts - n / 16) ** 2 / (n / 16)).sum())
    assert chi2 < 44.3
    # Every bit is set about half the time.
    for k in range(32):
        frac = float(((b >> k) & 1).mean())
        assert abs(frac - 0.5) < 5 * 0.5 / np.sqrt(n)


def test_bits_uncorrelated_across_neighbours():
    n = 100_000
    limit = 5 / np.sqrt(n)
    base = bits(7, 3, n)
    assert abs(corr(base[:-1], base[1:])) < limit            # consecutive indices
    assert abs(corr(base, bits(7, 4, n))) < limit            # consecutive counters
    assert abs(corr(base, bits(8, 3, n))) < limit            # consecutive seeds
    assert abs(corr(base, bits(3, 7, n))) < limit            # seed and counter swapped
    assert abs(corr(base[1:], bits(7, 4, n)[:-1])) < limit   # shifted by one index


def test_keep_threshold():
    assert keep_threshold(0.0) == 0
    assert keep_threshold(0.5) == 2**31
    assert keep_threshold(0.25) == 2**30
    assert keep_threshold(1.0) == 2**32
    assert keep_threshold(1 - 1e-15) == 2**32 - 1


# ----------------------------------------------------------------- functional forward


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_matches_reference(device, rng, dtype, p):
    x = rng.standard_normal((3, 5, 7)).astype(dtype)
    xd = on(device, x)
    got = F.dropout(xd, p, seed=11, counter=2)
    _assert_on(got, device)
    want = reference.dropout(x, p, 11, 2)
    assert got.dtype == dtype and got.shape == x.shape
    np.testing.assert_array_equal(host(got), want)
    np.testing.assert_array_equal(host(xd), x)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_scale_is_rounded_to_dtype(device, dtype):
    x = on(device, np.ones(1000, dtype=dtype))
    y = host(F.dropout(x, 0.1, seed=5))
    scale = dtype(1.0 / 0.9)
    assert set(np.unique(y).tolist()) == {0.0, float(scale)}


def test_same_seed_and_counter_same_mask(device, rng):
    x = on(device, rng.standard_normal((8, 16)))
    np.testing.assert_array_equal(host(F.dropout(x, 0.5, 3, counter=4)),
                                  host(F.dropout(x, 0.5, 3, counter=4)))
    np.testing.assert_array_equal(host(F.dropout_mask((8, 16), 0.5, 3, counter=4, device=device)),
                                  host(F.dropout_mask((8, 16), 0.5, 3, counter=4, device=device)))


def test_different_counter_or_seed_different_mask(device):
    m = host(F.dropout_mask(1000, 0.5, 3, counter=0, device=device))
    assert not np.array_equal(m, host(F.dropout_mask(1000, 0.5, 3, counter=1, device=device)))
    assert not np.array_equal(m, host(F.dropout_mask(1000, 0.5, 4, counter=0, device=device)))


def test_mask_matches_reference_and_dropout(device):
    mask = F.dropout_mask((4, 6), 0.3, 99, counter=5, device=device)
    _assert_on(mask, device)
    assert mask.dtype == np.bool_ and mask.shape == (4, 6)
    mask = host(mask)
    np.testing.assert_array_equal(mask, reference.dropout_mask((4, 6), 0.3, 99, 5))
    x = on(device, np.ones((4, 6)))
    y = host(F.dropout(x, 0.3, 99, counter=5))
    np.testing.assert_array_equal(y != 0, mask)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate(p):
    n = 100_000
    mask = F.dropout_mask(n, p, seed=2024)
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs(mask.mean() - (1 - p)) < 5 * sigma
    # Expectation preserved: mean of dropout(ones) is about 1.
    y = F.dropout(np.ones(n), p, seed=2024)
    assert abs(y.mean() - 1.0) < 5 * sigma / (1 - p)


def test_masks_of_consecutive_counters_and_seeds_uncorrelated():
    n = 100_000
    limit = 5 / np.sqrt(n)
    m = F.dropout_mask(n, 0.5, 10, counter=0)
    assert abs(corr(m, F.dropout_mask(n, 0.5, 10, counter=1))) < limit
    assert abs(corr(m, F.dropout_mask(n, 0.5, 11, counter=0))) < limit
    assert abs(corr(m[:-1], m[1:])) < limit


def test_mask_independent_of_thread_count():
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs at least 2 Numba threads")
    n = 3 * numbapos.config.get("parallel_min_elements") + 17
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one_y, one_m = F.dropout(x, 0.4, 77, counter=9), F.dropout_mask(n, 0.4, 77, counter=9)
        numba.set_num_threads(2)
        two_y, two_m = F.dropout(x, 0.4, 77, counter=9), F.dropout_mask(n, 0.4, 77, counter=9)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(one_y, two_y)
    np.testing.assert_array_equal(one_m, two_m)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_serial_and_parallel_kernels_agree(dtype, parallel_threshold):
    n = 5000
    x = np.random.default_rng(1).standard_normal(n).astype(dtype)
    drop = DropoutArgs.make(0.3, 5, 6)
    results = []
    for threshold in (1 << 40, 1):  # serial, then parallel
        parallel_threshold(threshold)
        y = np.empty_like(x)
        cpu_dropout.dropout_apply(x, drop, y)
        mask = np.empty(n, dtype=np.bool_)
        cpu_dropout.dropout_keep_mask(drop, mask)
        results.append((y, mask))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])


def test_functional_paths_agree(parallel_threshold, rng):
    x = rng.standard_normal((20, 30))
    parallel_threshold(1 << 40)
    serial = F.dropout(x, 0.5, 1, counter=1), F.dropout_mask(x.shape, 0.5, 1, counter=1)
    parallel_threshold(1)
    parallel = F.dropout(x, 0.5, 1, counter=1), F.dropout_mask(x.shape, 0.5, 1, counter=1)
    np.testing.assert_array_equal(serial[0], parallel[0])
    np.testing.assert_array_equal(serial[1], parallel[1])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_p_zero_and_eval_return_input_itself(device, rng, dtype):
    x = rng.standard_normal((3, 4)).astype(dtype)
    xd = on(device, x)
    assert F.dropout(xd, 0.0, 1) is xd
    assert F.dropout(xd, 0.7, 1, training=False) is xd
    assert F.dropout_backward(xd, 0.7, 1, training=False) is xd
    out = on(device, np.empty_like(x))
    assert F.dropout(xd, 0.7, 1, training=False, out=out) is out
    np.testing.assert_array_equal(host(out), x)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_p_one_gives_zeros(device, rng, dtype):
    x = rng.standard_normal((3, 4)).astype(dtype)
    xd = on(device, x)
    y = F.dropout(xd, 1.0, 1)
    assert y.dtype == dtype
    np.testing.assert_array_equal(host(y), np.zeros_like(x))
    assert not host(F.dropout_mask((3, 4), 1.0, 1, device=device)).any()
    assert host(F.dropout_mask((3, 4), 0.0, 1, device=device)).all()
    np.testing.assert_array_equal(host(F.dropout_backward(xd, 1.0, 1)), np.zeros_like(x))


def test_nan_propagates_like_pytorch(device):
    # Dropped elements are multiplied by zero, as torch does: NaN stays NaN.
    x = on(device, np.full(64, np.nan))
    assert np.isnan(host(F.dropout(x, 0.5, 0))).all()
    assert np.isnan(host(F.dropout(x, 1.0, 0))).all()


def test_non_contiguous_input(rng):
    base = rng.standard_normal((6, 10))
    for x in (base[:, ::2], base.T, base[::-1]):
        got = F.dropout(x, 0.5, 8, counter=1)
        want = reference.dropout(np.ascontiguousarray(x), 0.5, 8, 1)
        np.testing.assert_array_equal(got, want)
        assert got.flags.c_contiguous


def test_zero_size_and_zero_d(device):
    x = on(device, np.empty((0, 3), dtype=np.float32))
    y = F.dropout(x, 0.5, 1)
    _assert_on(y, device)
    assert y.shape == (0, 3)
    assert F.dropout_mask((0, 3), 0.5, 1, device=device).shape == (0, 3)
    z = on(device, np.array(2.0))
    y = F.dropout(z, 0.5, 1)
    _assert_on(y, device)
    assert y.shape == () and float(host(y)) in (0.0, 4.0)
    assert float(host(y)) == float(F.dropout(np.array(2.0), 0.5, 1))
    assert F.dropout_mask(5, 0.5, 1, device=device).shape == (5,)


def test_out_and_in_place(device, rng):
    x = rng.standard_normal((4, 5))
    want = reference.dropout(x, 0.5, 3, 0)
    out = on(device, np.empty_like(x))
    assert F.dropout(on(device, x), 0.5, 3, out=out) is out
    np.testing.assert_array_equal(host(out), want)
    y = on(device, x.copy())
    assert F.dropout(y, 0.5, 3, out=y) is y
    np.testing.assert_array_equal(host(y), want)


# ----------------------------------------------------------------- functional backward


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_backward_is_mask_times_scale(device, rng, dtype):
    g = rng.standard_normal((5, 6)).astype(dtype)
    mask = reference.dropout_mask(g.shape, 0.3, 4, 2)
    got = F.dropout_backward(on(device, g), 0.3, 4, counter=2)
    _assert_on(got, device)
    want = np.where(mask, g * dtype(1 / 0.7), dtype(0))
    assert got.dtype == dtype
    np.testing.assert_array_equal(host(got), want)


def test_backward_matches_finite_differences(device, rng):
    x = rng.standard_normal((3, 4))
    w = rng.standard_normal((3, 4))

    def loss():  # the forward on ``device``, of the current host values
        return float((host(F.dropout(on(device, x), 0.4, 6, counter=1)) * w).sum())

    numeric = reference.finite_difference(loss, x)
    analytic = F.dropout_backward(on(device, w), 0.4, 6, counter=1)
    np.testing.assert_allclose(host(analytic), numeric, rtol=1e-7, atol=1e-8)


# ----------------------------------------------------------------- errors


@pytest.mark.parametrize("p,exc,match", [
    (-0.1, ValueError, r"p: expected a probability in \[0, 1\], got -0.1"),
    (1.5, ValueError, r"p: expected a probability in \[0, 1\], got 1.5"),
    (float("nan"), ValueError, "p: expected a number, got nan"),
    ("0.5", TypeError, "p: expected a real number"),
    (None, TypeError, "p: expected a real number"),
])
def test_bad_p(device, p, exc, match):
    x = on(device, np.ones(4))
    with pytest.raises(exc, match=match):
        F.dropout(x, p, 1)
    with pytest.raises(exc, match=match):
        F.dropout_backward(x, p, 1)
    with pytest.raises(exc, match=match):
        F.dropout_mask(4, p, 1, device=device)
    with pytest.raises(exc, match=match):
        nn.Dropout(p, device=device)
    np.testing.assert_array_equal(host(x), np.ones(4))


@pytest.mark.parametrize("seed,exc,match", [
    (-1, ValueError, "seed: expected an integer >= 0, got -1"),
    (2**64, ValueError, r"seed: expected an integer < 2\*\*64"),
    (1.5, TypeError, "seed: expected an integer, got float"),
    (True, TypeError, "seed: expected an integer, got bool"),
    (None, TypeError, "seed: expected an integer, got NoneType"),
])
def test_bad_seed(device, seed, exc, match):
    with pytest.raises(exc, match=match):
        F.dropout(on(device, np.ones(4)), 0.5, seed)
    with pytest.raises(exc, match=match):
        F.dropout_mask(4, 0.5, seed, device=device)


@pytest.mark.parametrize("counter,exc,match", [
    (-3, ValueError, "counter: expected an integer >= 0, got -3"),
    (2**64, ValueError, r"counter: expected an integer < 2\*\*64"),
    (2.0, TypeError, "counter: expected an integer, got float"),
])
def test_bad_counter(device, counter, exc, match):
    with pytest.raises(exc, match=match):
        F.dropout(on(device, np.ones(4)), 0.5, 1, counter=counter)
    with pytest.raises(exc, match=match):
        F.dropout_mask(4, 0.5, 1, counter=counter, device=device)


def test_seed_accepts_numpy_and_large_ints(device):
    x = on(device, np.ones(16))
    np.testing.assert_array_equal(host(F.dropout(x, 0.5, np.int64(5))),
                                  reference.dropout(np.ones(16), 0.5, 5, 0))
    np.testing.assert_array_equal(host(F.dropout(x, 0.5, np.uint64(2**64 - 1))),
                                  reference.dropout(np.ones(16), 0.5, 2**64 - 1, 0))


@pytest.mark.parametrize("device, x, match", device_cases([
    (np.ones(4, dtype=np.int64), "x: expected dtype float32 or float64, got int64"),
    (np.ones(4, dtype=np.float16), "x: expected dtype float32 or float64, got float16"),
    ([1.0, 2.0], "x: expected a NumPy or CUDA array of float32 or float64"),
], cuda=lambda x, match: isinstance(x, np.ndarray)), indirect=["device"])
def test_bad_x(device, x, match):
    x = on(device, x) if isinstance(x, np.ndarray) else x
    with pytest.raises(TypeError, match=match):
        F.dropout(x, 0.5, 1)
    with pytest.raises(TypeError, match=match.replace("x:", "grad_output:")):
        F.dropout_backward(x, 0.5, 1)


def test_bad_out_leaves_inputs_unchanged(device):
    keep = np.arange(12, dtype=np.float64).reshape(3, 4)
    x = on(device, keep.copy())
    with pytest.raises(ValueError, match=r"out: expected shape \(3, 4\) and dtype float64"):
        F.dropout(x, 0.5, 1, out=on(device, np.empty((3, 4), dtype=np.float32)))
    with pytest.raises(ValueError, match="out: must not share memory with an input array"):
        F.dropout(x, 0.5, 1, out=x.reshape(4, 3).reshape(3, 4))
    buf = on(device, np.arange(16.0))  # out a shifted view of grad_output
    with pytest.raises(ValueError, match="out: must not share memory with an input array"):
        F.dropout_backward(buf[:12].reshape(3, 4), 0.5, 1, out=buf[4:].reshape(3, 4))
    np.testing.assert_array_equal(host(buf), np.arange(16.0))
    if device == "cpu":  # CUDA arrays are always C-contiguous here; lists are host-only
        with pytest.raises(ValueError, match="out: expected a C-contiguous"):
            F.dropout(x, 0.5, 1, out=np.empty((4, 3)).T)
        with pytest.raises(TypeError, match="out: expected a NumPy or CUDA array"):
            F.dropout(x, 0.5, 1, out=[0.0])
    np.testing.assert_array_equal(host(x), keep)


@pytest.mark.parametrize("shape,exc,match", [
    (-1, ValueError, "shape: expected an integer >= 0, got -1"),
    ((2, -1), ValueError, r"shape\[1\]: expected an integer >= 0, got -1"),
    ((2, 1.5), TypeError, r"shape\[1\]: expected an integer"),
    ([2, 3], TypeError, "shape: expected an integer"),
])
def test_bad_mask_shape(device, shape, exc, match):
    with pytest.raises(exc, match=match):
        F.dropout_mask(shape, 0.5, 1, device=device)


# ----------------------------------------------------------------- nn.Dropout


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_module_advances_counter(device, rng, dtype):
    x = rng.standard_normal((4, 8)).astype(dtype)
    xd = on(device, x)
    d = nn.Dropout(0.5, seed=21, device=device)
    assert d.counter == 0 and d.seed == 21
    y0 = d(xd)
    _assert_on(y0, device)
    y0 = host(y0)
    y1 = host(d(xd))
    assert d.counter == 2
    np.testing.assert_array_equal(y0, reference.dropout(x, 0.5, 21, 0))
    np.testing.assert_array_equal(y1, reference.dropout(x, 0.5, 21, 1))
    assert not np.array_equal(y0, y1)
    replay = nn.Dropout(0.5, seed=21, device=device)
    np.testing.assert_array_equal(host(replay(xd)), y0)
    np.testing.assert_array_equal(host(replay(xd)), y1)


def test_module_backward_uses_last_forward_mask(device, rng):
    x = on(device, rng.standard_normal((4, 8)))
    g = rng.standard_normal((4, 8))
    d = nn.Dropout(0.3, seed=5, device=device)
    d(x)
    d(x)                     # counter 1 is the last forward
    d.p = 0.6                # backward uses the p of that forward
    got = d.backward(on(device, g))
    _assert_on(got, device)
    mask = reference.dropout_mask(x.shape, 0.3, 5, 1)
    np.testing.assert_array_equal(host(got), np.where(mask, g * (1 / 0.7), 0.0))


def test_module_eval_is_identity(device, rng):
    x = on(device, rng.standard_normal((3, 3)))
    d = nn.Dropout(0.5, seed=1, device=device).eval()
    assert d(x) is x
    assert d.counter == 0
    g = on(device, rng.standard_normal((3, 3)))
    assert d.backward(g) is g  # eval forwards record too: the gradient of the identity
    d.train()
    assert d(x) is not x
    assert d.counter == 1


def test_module_seed_none_and_generator():
    a, b = nn.Dropout(0.5), nn.Dropout(0.5)
    assert isinstance(a.seed, int) and 0 <= a.seed < 2**64
    assert a.seed != b.seed
    g1 = nn.Dropout(0.5, seed=np.random.default_rng(3))
    g2 = nn.Dropout(0.5, seed=np.random.default_rng(3))
    assert g1.seed == g2.seed


def test_module_has_no_parameters_and_repr():
    d = nn.Dropout(0.25, seed=4)
    assert list(d.parameters()) == []
    assert list(d.state_dict()) == ["seed", "counter"]  # buffers
    assert repr(d) == "Dropout(p=0.25, seed=4)"


def test_module_errors(device):
    def ones(shape, dtype=np.float64):
        return on(device, np.ones(shape, dtype))

    d = nn.Dropout(0.5, seed=1, device=device)
    with pytest.raises(RuntimeError, match="Dropout.backward called before forward"):
        d.backward(ones(3))
    d(ones((2, 3)))
    with pytest.raises(ValueError, match=r"grad_output: expected shape \(2, 3\)"):
        d.backward(ones((3, 2)))
    with pytest.raises(TypeError, match="x: expected dtype float32 or float64"):
        d(ones(3, np.int32))
    assert d.counter == 1    # a failed forward does not advance the counter
    with pytest.raises(ValueError, match="seed: expected an integer >= 0"):
        nn.Dropout(0.5, seed=-2, device=device)
