"""Relative positions: T5 buckets, bias, in-place add and table gradient; DeBERTa buckets.

Kernel-backed cases run on the CPU and on CUDA (the simulator, tiny shapes), against
the NumPy reference (bit for bit); transformers' T5 and DeBERTa-v2 are compared
where installed, the T5 buckets and DeBERTa's for every position in [-2**16, 2**16].
"""

import math

import numba
import numpy as np
import pytest
import reference as ref
from conftest import FLOAT_DTYPES, device_cases, host, on, two_threads
from cuda_counts import count_cuda_traffic

import numbapos
from numbapos.functional import relative as F

WIDE = np.arange(-(2 ** 16), 2 ** 16 + 1, dtype=np.int64)
# (bidirectional, num_buckets, max_distance): T5's, odd splits, non-power-of-two exact halves
T5_CONFIGS = [(True, 32, 128), (False, 32, 128), (True, 64, 256), (False, 128, 1024),
              (True, 20, 50), (False, 20, 50), (True, 33, 1000), (True, 4, 3), (False, 2, 2),
              (True, 48, 300), (False, 17, 27), (False, 9, 128), (True, 72, 32)]
DEBERTA_CONFIGS = [(256, 512), (256, 1024), (128, 512), (7, 100), (32, 64), (2, 5), (256, 300)]


def _small(device):
    """The simulator's slice of WIDE: the exact and log buckets, edges and far values."""
    if device == "cpu":
        return WIDE
    return np.array([*range(-140, 141, 3), -1, 0, 1, 16, 32, 64, 127, 128, 129, -(2 ** 16)],
                    np.int64)


# ---------------------------------------------------------------- T5 buckets


@pytest.mark.parametrize("config", T5_CONFIGS, ids=str)
def test_buckets_are_transformers_for_every_position_to_2_16(config):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.t5.modeling_t5 import T5Attention

    bidirectional, num_buckets, max_distance = config

    def theirs():
        return T5Attention._relative_position_bucket(torch.from_numpy(WIDE), bidirectional,
                                                     num_buckets, max_distance).numpy()

    got = F.relative_position_bucket(WIDE, bidirectional, num_buckets, max_distance)
    _assert_transformers_bits(torch, got, theirs)
    assert got.dtype == np.int64 and got.min() >= 0 and got.max() < num_buckets


def _correctly_rounded_log(torch):
    """``torch.log`` of float32 tensors, correctly rounded (as PyTorch's scalar dispatch,
    ``ATEN_CPU_CAPABILITY=default``, gives it)."""
    vectorised = torch.log

    def log(x):
        if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
            return vectorised(x)
        exact = [math.log(v) if v > 0 else (-math.inf if v == 0 else math.nan)
                 for v in x.double().flatten().tolist()]
        return torch.tensor(exact, dtype=torch.float64).to(torch.float32).reshape(x.shape)

    return log


def _assert_transformers_bits(torch, got, theirs):
    """``got`` is what ``theirs()`` (transformers' function) computes with a correctly
    rounded float32 log: PyTorch's own on its scalar dispatch. Its vectorised log (SLEEF,
    1 ulp; the elements it rounds the other way depend on the CPU's vector width) may
    move a position across a bucket edge: only there may the two differ, by one bucket."""
    vectorised = np.asarray(theirs())
    log = torch.log
    torch.log = _correctly_rounded_log(torch)
    try:
        exact = np.asarray(theirs())
    finally:
        torch.log = log
    np.testing.assert_array_equal(got, exact.astype(got.dtype))
    moved = got != vectorised.astype(got.dtype)
    assert np.abs(got[moved] - vectorised[moved].astype(got.dtype)).max(initial=0) <= 1
    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":  # ATEN_CPU_CAPABILITY=default
        assert not moved.any()


@pytest.mark.parametrize("device,config", device_cases([(c,) for c in T5_CONFIGS]),
                         indirect=["device"])
def test_buckets_match_the_reference(device, config):
    rel = _small(device)
    for dtype in (np.int64, np.int32):
        got = F.relative_position_bucket(on(device, rel.astype(dtype)), *config)
        np.testing.assert_array_equal(host(got), ref.t5_bucket(rel, *config))


@pytest.mark.parametrize("bidirectional,num_buckets,max_distance,distance,bucket,exact", [
    (False, 17, 27, 12, 10, 11),   # float32 rounds the quotient below 2, exact math is above
    (False, 9, 128, 8, 5, 4),      # and the other way
    (True, 72, 32, 24, 27, 26),
])
def test_float32_rounding_at_bucket_edges_is_transformers(bidirectional, num_buckets,
                                                          max_distance, distance, bucket, exact):
    # The buckets transformers gives (float32 steps) where float64 math gives another.
    buckets = num_buckets // 2 if bidirectional else num_buckets
    max_exact = buckets // 2
    assert max_exact + math.floor(math.log(distance / max_exact) / math.log(
        max_distance / max_exact) * (buckets - max_exact)) == exact
    got = F.relative_position_bucket(np.array([-distance]), bidirectional, num_buckets,
                                     max_distance)
    assert got[0] == bucket


def test_bucket_keeps_the_shape_and_takes_lists():
    rel = np.arange(-6, 6).reshape(3, 1, 4)
    assert F.relative_position_bucket(rel).shape == (3, 1, 4)
    assert F.relative_position_bucket(np.int64(-3)).shape == ()
    np.testing.assert_array_equal(F.relative_position_bucket([-1, 0, 2]), [1, 0, 18])
    assert F.relative_position_bucket(np.zeros((0, 3), np.int32)).shape == (0, 3)


# ---------------------------------------------------------------- T5 bias

BIAS_CASES = [  # (heads, Lq, Lk, offset, bidirectional, num_buckets, max_distance)
    (3, 5, 7, 0, True, 32, 128),
    (2, 7, 4, 0, False, 32, 128),
    (4, 1, 9, 8, False, 32, 128),  # one new token with a cache
    (2, 40, 300, 5, True, 16, 20),
    (1, 3, 3, 200, False, 8, 12),
]
SMALL_BIAS = [c for c in BIAS_CASES if c[1] * c[2] <= 64]


@pytest.mark.parametrize("device,dtype,case", device_cases(
    [(d, c) for d in FLOAT_DTYPES for c in BIAS_CASES],
    cuda=lambda d, c: c in SMALL_BIAS), indirect=["device"])
def test_bias_is_the_reference(device, dtype, case, rng):
    heads, rows, cols, offset, bidirectional, num_buckets, max_distance = case
    weight = rng.standard_normal((num_buckets, heads)).astype(dtype)
    want = ref.t5_bias(weight, rows, cols, offset, bidirectional, max_distance)
    got = F.relative_position_bias(on(device, weight), rows, cols, offset=offset,
                                   bidirectional=bidirectional, max_distance=max_distance)
    assert got.dtype == dtype and got.shape == (1, heads, rows, cols)
    np.testing.assert_array_equal(host(got), want)
    out = on(device, np.full((1, heads, rows, cols), np.nan, dtype))
    same = F.relative_position_bias(on(device, weight), rows, cols, offset=offset,
                                    bidirectional=bidirectional, num_buckets=num_buckets,
                                    max_distance=max_distance, out=out)
    assert same is out
    np.testing.assert_array_equal(host(out), want)


@pytest.mark.parametrize("is_decoder", [False, True])
@pytest.mark.parametrize("rows,cols,offset", [(17, 17, 0), (1, 300, 299), (64, 200, 0),
                                              (5, 4100, 4000)])
def test_bias_is_transformers_compute_bias(is_decoder, rows, cols, offset):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.t5.modeling_t5 import T5Attention

    config = transformers.T5Config(d_model=16, d_kv=4, num_heads=6, is_decoder=is_decoder,
                                   relative_attention_num_buckets=32,
                                   relative_attention_max_distance=128)
    attention = T5Attention(config, has_relative_attention_bias=True)
    torch.nn.init.normal_(attention.relative_attention_bias.weight)
    with torch.no_grad():
        want = attention.compute_bias(rows, cols, past_seen_tokens=offset).numpy()
    weight = attention.relative_attention_bias.weight.detach().numpy()
    got = F.relative_position_bias(weight, rows, cols, offset=offset,
                                   bidirectional=not is_decoder)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(got, want)  # in fact the same bits (a gather)


@pytest.mark.parametrize("device,dtype,case", device_cases(
    [(d, c) for d in FLOAT_DTYPES for c in BIAS_CASES],
    cuda=lambda d, c: c in SMALL_BIAS), indirect=["device"])
def test_add_in_place_is_scores_plus_bias(device, dtype, case, rng):
    heads, rows, cols, offset, bidirectional, num_buckets, max_distance = case
    weight = rng.standard_normal((num_buckets, heads))  # float64, cast to the scores' dtype
    scores = rng.standard_normal((2, heads, rows, cols)).astype(dtype)
    bias = ref.t5_bias(weight.astype(dtype), rows, cols, offset, bidirectional, max_distance)
    x = on(device, scores.copy())
    got = F.add_relative_position_bias_(x, on(device, weight), offset=offset,
                                        bidirectional=bidirectional, max_distance=max_distance)
    assert got is x
    np.testing.assert_array_equal(host(got), scores + bias)


# ---------------------------------------------------------------- the table's gradient


@pytest.mark.parametrize("device,dtype,case", device_cases(
    [(d, c) for d in FLOAT_DTYPES for c in BIAS_CASES],
    cuda=lambda d, c: c in SMALL_BIAS), indirect=["device"])
def test_grad_is_the_reference_sum_in_its_order(device, dtype, case, rng):
    heads, rows, cols, offset, bidirectional, num_buckets, max_distance = case
    for batch in (1, 3):
        grad = rng.standard_normal((batch, heads, rows, cols)).astype(dtype)
        want = ref.t5_bias_grad(grad, num_buckets, offset, bidirectional, max_distance)
        got = F.relative_position_bias_grad(on(device, grad), num_buckets, offset=offset,
                                            bidirectional=bidirectional,
                                            max_distance=max_distance)
        assert got.dtype == dtype and got.shape == (num_buckets, heads)
        np.testing.assert_array_equal(host(got), want)


def test_grad_order_is_seen_in_float32():
    # Cells whose float32 sum depends on the order: the float64 sums of the defined
    # order, rounded once, are not float32's pairwise sum.
    grad = np.zeros((1, 1, 3, 3), np.float32)
    grad[0, 0, 0, 0], grad[0, 0, 1, 1], grad[0, 0, 2, 2] = 1.0, 2.0 ** -24, 2.0 ** -24
    got = F.relative_position_bias_grad(grad, 32)
    assert got[0, 0] == np.float32(1.0 + 2.0 ** -23)
    assert got[0, 0] != (np.float32(1.0) + np.float32(2.0 ** -24)) + np.float32(2.0 ** -24)


def test_grad_matches_finite_differences_in_float64(rng):
    heads, rows, cols, offset = 2, 4, 6, 1
    weight = rng.standard_normal((8, heads))
    upstream = rng.standard_normal((3, heads, rows, cols))
    scores = rng.standard_normal((3, heads, rows, cols))

    def loss(w):
        s = F.add_relative_position_bias_(scores.copy(), w, offset=offset, bidirectional=False,
                                          max_distance=10)
        return float(np.sum(s * upstream))

    got = F.relative_position_bias_grad(upstream, 8, offset=offset, bidirectional=False,
                                        max_distance=10)
    numeric = np.zeros_like(weight)
    eps = 1e-6
    for index in np.ndindex(*weight.shape):
        plus, minus = weight.copy(), weight.copy()
        plus[index] += eps
        minus[index] -= eps
        numeric[index] = (loss(plus) - loss(minus)) / (2 * eps)
    np.testing.assert_allclose(got, numeric, rtol=1e-7, atol=1e-7)
    assert np.count_nonzero(got) > 4


def test_grad_is_torch_autograd_of_compute_bias(rng):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.t5.modeling_t5 import T5Attention

    config = transformers.T5Config(d_model=16, d_kv=4, num_heads=4, is_decoder=True)
    attention = T5Attention(config, has_relative_attention_bias=True).double()
    grad = rng.standard_normal((1, 4, 30, 170))
    attention.compute_bias(30, 170, past_seen_tokens=3).backward(torch.from_numpy(grad))
    want = attention.relative_attention_bias.weight.grad.numpy()
    got = F.relative_position_bias_grad(grad, 32, offset=3, bidirectional=False)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_grad_bits_do_not_depend_on_the_thread_count(rng, parallel_threshold):
    parallel_threshold(1)
    grad = rng.standard_normal((2, 8, 60, 90)).astype(np.float32)
    threads = numba.get_num_threads()
    results = []
    try:
        for n in sorted({1, two_threads(), threads}):
            numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
            results.append(F.relative_position_bias_grad(grad, 32, offset=2))
    finally:
        numba.set_num_threads(threads)
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])
    np.testing.assert_array_equal(results[0], ref.t5_bias_grad(grad, 32, 2))


def test_serial_and_parallel_kernels_agree(rng, parallel_threshold):
    weight = rng.standard_normal((32, 4)).astype(np.float32)
    scores = rng.standard_normal((2, 4, 9, 13)).astype(np.float32)
    rel = np.arange(-300, 300)

    def run():
        return (F.relative_position_bucket(rel), F.log_bucket_position(rel, 64, 128),
                F.relative_positions(9, 13, 8, 32),
                F.relative_position_bias(weight, 9, 13, offset=3),
                F.add_relative_position_bias_(scores.copy(), weight, offset=3),
                F.relative_position_bias_grad(scores, 32, offset=3))

    parallel_threshold(1 << 40)
    serial = run()
    parallel_threshold(1)
    for a, b in zip(serial, run(), strict=True):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_empty_shapes():
    weight = np.ones((32, 3), np.float32)
    assert F.relative_position_bias(weight, 0, 5).shape == (1, 3, 0, 5)
    assert F.relative_position_bias(weight, 0, 0).shape == (1, 3, 0, 0)
    scores = np.zeros((2, 3, 0, 4), np.float32)
    assert F.add_relative_position_bias_(scores, weight) is scores
    grad = F.relative_position_bias_grad(np.zeros((1, 3, 4, 0), np.float32), 32)
    np.testing.assert_array_equal(grad, np.zeros((32, 3), np.float32))


# ---------------------------------------------------------------- DeBERTa


@pytest.mark.parametrize("config", DEBERTA_CONFIGS, ids=str)
def test_log_buckets_are_transformers_for_every_position_to_2_16(config):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    got = F.log_bucket_position(WIDE, *config)
    want = make_log_bucket_position(torch.from_numpy(WIDE), *config)
    assert want.dtype == torch.float32 and np.all(want.numpy() == want.numpy().round())
    _assert_transformers_bits(torch, got,
                              lambda: make_log_bucket_position(torch.from_numpy(WIDE), *config))


@pytest.mark.parametrize("device,config", device_cases([(c,) for c in DEBERTA_CONFIGS]),
                         indirect=["device"])
def test_log_buckets_match_the_reference(device, config):
    rel = _small(device)
    got = F.log_bucket_position(on(device, rel.astype(np.int32)), *config)
    np.testing.assert_array_equal(host(got), ref.deberta_log_bucket(rel, *config))


@pytest.mark.parametrize("device,sizes", device_cases(
    [((5, 7, -1, -1),), ((7, 5, 4, 16),), ((30, 300, 256, 512),), ((3, 4, 8, -1),),
     ((0, 3, 4, 16),)], cuda=lambda s: s[0] * s[1] <= 64), indirect=["device"])
def test_relative_positions_match_the_reference(device, sizes):
    got = F.relative_positions(*sizes, device=device)
    np.testing.assert_array_equal(host(got), ref.deberta_relative_positions(*sizes))
    assert got.dtype == np.int64 and got.shape == (1, sizes[0], sizes[1])


@pytest.mark.parametrize("sizes", [(5, 7, -1, -1), (40, 600, 256, 512), (600, 40, 64, 300),
                                   (9, 9, 4, 16)])
def test_relative_positions_are_transformers(sizes):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position

    query, key = torch.zeros(1, sizes[0], 2), torch.zeros(1, sizes[1], 2)
    want = build_relative_position(query, key, sizes[2], sizes[3]).numpy()
    np.testing.assert_array_equal(F.relative_positions(*sizes), want)


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("kwargs,error,message", [
    (dict(num_buckets=0), ValueError, "num_buckets: expected an integer >= 1, got 0"),
    (dict(num_buckets=3), ValueError, "num_buckets: expected an integer >= 4 with "
                                      "bidirectional=True .*got 3"),
    (dict(num_buckets=1, bidirectional=False), ValueError,
     "num_buckets: expected an integer >= 2 with bidirectional=False"),
    (dict(max_distance=0), ValueError, "max_distance: expected an integer >= 1, got 0"),
    (dict(max_distance=-5), ValueError, "max_distance: expected an integer >= 1, got -5"),
    (dict(max_distance=8), ValueError, r"max_distance: expected an integer > 8 \(the exact "
                                       r"buckets per direction of 32 buckets\), got 8"),
    (dict(num_buckets=32.0), TypeError, "num_buckets: expected an integer, got"),
    (dict(bidirectional=1), TypeError, "bidirectional: expected a bool, got 1"),
])
def test_bad_bucket_options(kwargs, error, message):
    with pytest.raises(error, match=message):
        F.relative_position_bucket(np.arange(3), **kwargs)
    weight = np.ones((kwargs.get("num_buckets", 32) if isinstance(
        kwargs.get("num_buckets", 32), int) else 32, 2), np.float32)
    scores = np.zeros((1, 2, 3, 3), np.float32)
    with pytest.raises(error, match=message):
        F.add_relative_position_bias_(scores, weight, **kwargs)
    assert not scores.any()
    with pytest.raises(error, match=message):
        F.relative_position_bias_grad(scores, **{"num_buckets": 32, **kwargs})


def test_bad_bias_inputs():
    weight = np.ones((32, 2), np.float32)
    with pytest.raises(TypeError, match="relative_position: expected integer indices"):
        F.relative_position_bucket(np.ones(3))
    with pytest.raises(ValueError, match=r"query_length: expected an integer >= 0, got -1"):
        F.relative_position_bias(weight, -1, 3)
    with pytest.raises(ValueError, match=r"key_length: expected an integer >= 0, got -2"):
        F.relative_position_bias(weight, 3, -2)
    with pytest.raises(ValueError, match=r"offset: expected an integer >= 0, got -1"):
        F.relative_position_bias(weight, 3, 3, offset=-1)
    with pytest.raises(ValueError, match=r"weight: expected shape \(16, H\)"):
        F.relative_position_bias(weight, 3, 3, num_buckets=16)
    with pytest.raises(ValueError, match="weight: expected a 2-D array"):
        F.relative_position_bias(np.ones(32, np.float32), 3, 3)
    with pytest.raises(TypeError, match="weight"):
        F.relative_position_bias(np.ones((32, 2), np.int64), 3, 3)
    out = np.zeros((1, 2, 3, 4), np.float64)
    with pytest.raises(ValueError, match=r"out: expected shape \(1, 2, 3, 4\) and dtype float32"):
        F.relative_position_bias(weight, 3, 4, out=out)
    assert not out.any()
    scores = np.zeros((1, 3, 2, 2), np.float32)
    with pytest.raises(ValueError, match="weight: 2 heads .* scores with 3 heads"):
        F.add_relative_position_bias_(scores, weight)
    frozen = np.zeros((1, 2, 2, 2), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="scores: expected a C-contiguous, writeable array"):
        F.add_relative_position_bias_(frozen, weight)
    with pytest.raises(ValueError, match="scores: expected a 4-D array"):
        F.add_relative_position_bias_(np.zeros((2, 2, 2), np.float32), weight)
    assert not scores.any()


@pytest.mark.parametrize("args,error,message", [
    ((1, 512), ValueError, "bucket_size: expected an integer >= 2, got 1"),
    ((0, 512), ValueError, "bucket_size: expected an integer >= 2, got 0"),
    ((256, 0), ValueError, "max_position: expected an integer >= 1, got 0"),
    ((256, 129), ValueError, r"max_position: expected an integer > 129 .*got 129"),
    ((256.0, 512), TypeError, "bucket_size: expected an integer"),
])
def test_bad_deberta_options(args, error, message):
    with pytest.raises(error, match=message):
        F.log_bucket_position(np.arange(3), *args)
    if args[0] > 0 and args[1] > 0:
        with pytest.raises(error, match=message):
            F.relative_positions(3, 3, *args)


def test_relative_positions_bad_sizes():
    with pytest.raises(ValueError, match="query_size: expected an integer >= 0, got -1"):
        F.relative_positions(-1, 3)
    with pytest.raises(ValueError, match="device"):
        F.relative_positions(2, 3, device="tpu")


# ---------------------------------------------------------------- the two backends


def test_backends_export_the_same_launchers():
    import inspect

    from numbapos.kernels import area_names

    pytest.importorskip("numba.cuda")
    import numbapos.kernels.cpu.relative as cpu
    import numbapos.kernels.cuda.relative as gpu

    assert "relative" in area_names()
    assert sorted(cpu.__all__) == sorted(gpu.__all__)
    for name in cpu.__all__:
        ours = [(p.name, p.default) for p in inspect.signature(getattr(cpu, name)).parameters
                .values()]
        theirs = [(p.name, p.default) for p in inspect.signature(getattr(gpu, name)).parameters
                  .values()]
        assert ours == theirs, name


def test_gpu_ops_make_no_host_round_trip(rng):
    if not (numbapos.cuda_available() and numbapos._device.simulator_enabled()):
        pytest.skip("counts are taken on the CUDA simulator")
    device = "cuda"
    weight = on(device, rng.standard_normal((8, 2)).astype(np.float32))
    scores = on(device, rng.standard_normal((1, 2, 3, 4)).astype(np.float32))
    rel = on(device, np.arange(-5, 5))
    ops = [(lambda: F.relative_position_bucket(rel, True, 8, 12), 1),
           (lambda: F.relative_position_bias(weight, 3, 4, max_distance=12), 2),
           (lambda: F.add_relative_position_bias_(scores, weight, max_distance=12), 2),
           (lambda: F.relative_position_bias_grad(scores, 8, max_distance=12), 2),
           (lambda: F.log_bucket_position(rel, 4, 16), 1),
           (lambda: F.relative_positions(3, 4, 4, 16, device="cuda"), 1)]
    for op, launches in ops:
        op()
        numbapos.synchronize()
        with count_cuda_traffic() as counts:
            op()
        assert counts.device_to_host == 0 and counts.synchronizations == 0, counts
        assert counts.launches == launches, counts


def test_extreme_positions_take_the_last_buckets():
    extreme = np.array([np.iinfo(np.int64).min, -(2 ** 62), 2 ** 62, np.iinfo(np.int64).max])
    np.testing.assert_array_equal(F.relative_position_bucket(extreme), [15, 15, 31, 31])
    np.testing.assert_array_equal(F.relative_position_bucket(extreme, False), [31, 31, 0, 0])
    np.testing.assert_array_equal(F.relative_position_bucket(np.array([np.iinfo(np.int32).min,
                                                                       np.iinfo(np.int32).max],
                                                                      np.int32)), [15, 31])
