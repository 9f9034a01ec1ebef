"""Pooled lookups (embedding_bag) and their gradients, against tests/reference.py and
PyTorch 2.13's CPU results (bit for bit where PyTorch's order is defined).

PyTorch sums a table row's gradient in the order of its (unstable) sort of the ids;
numbapos sums in input order (deterministic, the NumPy oracle's order). So the
gradients equal PyTorch's bit for bit where every id occurs at most once, and to
rounding otherwise; the gradient of per_sample_weights is a dot product whose order
PyTorch leaves to BLAS (compared to rounding).
"""

import numpy as np
import pytest
import reference as ref
from conftest import device_cases, host, on

import numbapos
from numbapos.functional.bag import embedding_bag, embedding_bag_backward
from numbapos.functional.half import to_table_dtype
from numbapos.sparse import SparseRows

torch = pytest.importorskip("torch")
TF = torch.nn.functional


def _case(rng, dtype, index_dtype, two_d, include_last_offset, V=20, D=7, bags=6):
    weight = rng.standard_normal((V, D)).astype(dtype)
    if two_d:
        return rng.integers(0, V, (bags, 5)).astype(index_dtype), None, weight
    sizes = rng.integers(0, 6, bags)
    sizes[1] = 0  # an empty bag
    ids = rng.integers(0, V, int(sizes.sum())).astype(index_dtype)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(index_dtype)
    return ids, (offsets if include_last_offset else offsets[:-1]), weight


def _torch(ids, weight, offsets, **kwargs):
    w = torch.tensor(weight, requires_grad=True)
    psw = kwargs.pop("per_sample_weights", None)
    p = None if psw is None else torch.tensor(psw, requires_grad=True)
    out = TF.embedding_bag(torch.from_numpy(np.asarray(ids, np.int64)), w,
                           None if offsets is None else torch.from_numpy(
                               np.asarray(offsets, np.int64)),
                           per_sample_weights=p, **kwargs)
    return out, w, p


FORWARD = [(mode, two_d, last, pad, dtype, index_dtype)
           for mode in ("sum", "mean", "max") for two_d in (False, True)
           for last in (False, True) for pad in (None, 0, -1)
           for dtype, index_dtype in ((np.float32, np.int64), (np.float64, np.int32),
                                      (np.float32, np.int32))]


@pytest.mark.parametrize("device, mode, two_d, last, pad, dtype, index_dtype",
                         device_cases(FORWARD, cuda=lambda m, t, last, p, dt, it:
                                      dt == np.float32 and it == np.int64))
def test_forward_matches_torch_and_reference(rng, device, mode, two_d, last, pad, dtype,
                                             index_dtype):
    ids, offsets, weight = _case(rng, dtype, index_dtype, two_d, last)
    ids[::3] = 0  # padding occurs, a bag of padding only too
    out = embedding_bag(on(device, ids), on(device, weight), on(device, offsets), mode=mode,
                        include_last_offset=last, padding_idx=pad)
    expected, _, _ = _torch(ids, weight, offsets, mode=mode, include_last_offset=last,
                            padding_idx=pad)
    np.testing.assert_array_equal(host(out), expected.detach().numpy())
    np.testing.assert_array_equal(host(out), ref.embedding_bag(ids, weight, offsets, mode,
                                                               None, last, pad))


@pytest.mark.parametrize("device, pad, dtype", device_cases(
    [(None, np.float32), (2, np.float32), (None, np.float64), (-1, np.float64)]))
def test_weighted_sum_is_torch_bits(rng, device, pad, dtype):
    ids, offsets, weight = _case(rng, dtype, np.int64, False, False, bags=12, D=33)
    psw = rng.standard_normal(ids.shape).astype(dtype)
    out = embedding_bag(on(device, ids), on(device, weight), on(device, offsets), mode="sum",
                        per_sample_weights=on(device, psw), padding_idx=pad)
    expected, _, _ = _torch(ids, weight, offsets, mode="sum", per_sample_weights=psw,
                            padding_idx=pad)
    np.testing.assert_array_equal(host(out), ref.embedding_bag(ids, weight, offsets, "sum",
                                                               psw, False, pad))
    if dtype == np.float32:  # PyTorch's float64 loop is BLAS's: compared to rounding
        np.testing.assert_array_equal(host(out), expected.detach().numpy())
    else:
        np.testing.assert_allclose(host(out), expected.detach().numpy(), rtol=1e-13)


BACKWARD = [(mode, pad, weighted, sgbf, sparse) for mode in ("sum", "mean", "max")
            for pad in (None, 1) for weighted in ((False, True) if mode == "sum" else (False,))
            for sgbf in ((False, True) if mode != "max" else (False,))
            for sparse in (False, True)]


@pytest.mark.parametrize("device, mode, pad, weighted, sgbf, sparse",
                         device_cases(BACKWARD))
def test_backward_matches_reference_and_torch(rng, device, mode, pad, weighted, sgbf, sparse):
    ids, offsets, weight = _case(rng, np.float32, np.int64, False, False, V=6, bags=8)
    ids[:4] = [1, 1, 2, 1]  # repeated ids, padding among them
    psw = rng.standard_normal(ids.shape).astype(np.float32) if weighted else None
    grad_out = rng.standard_normal((offsets.size, weight.shape[1])).astype(np.float32)
    gw, gp = embedding_bag_backward(on(device, grad_out), on(device, ids), on(device, weight),
                                    on(device, offsets), scale_grad_by_freq=sgbf, mode=mode,
                                    sparse=sparse, per_sample_weights=on(device, psw),
                                    padding_idx=pad)
    if sparse:
        assert isinstance(gw, SparseRows)
        gw = gw.to_dense()
    want_w, want_p = ref.embedding_bag_backward(grad_out, ids, weight, offsets, mode, psw,
                                                False, pad, sgbf)
    np.testing.assert_array_equal(host(gw), want_w)
    assert (gp is None) == (psw is None)
    if psw is not None:
        np.testing.assert_array_equal(host(gp), want_p)
    out, w, p = _torch(ids, weight, offsets, mode=mode, per_sample_weights=psw, padding_idx=pad)
    out.backward(torch.from_numpy(grad_out))
    if not sgbf:  # PyTorch's CPU bag kernel counts ids wrongly (its docs say what we do)
        np.testing.assert_allclose(host(gw), w.grad.numpy(), rtol=1e-5, atol=1e-6)
    if psw is not None:
        np.testing.assert_allclose(host(gp), p.grad.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_backward_is_torch_bits_with_distinct_ids(rng, mode):
    weight = rng.standard_normal((40, 9)).astype(np.float32)
    ids = rng.permutation(40)[:30]
    offsets = np.array([0, 4, 4, 11, 20])
    psw = rng.standard_normal(30).astype(np.float32) if mode == "sum" else None
    grad_out = rng.standard_normal((5, 9)).astype(np.float32)
    gw, gp = embedding_bag_backward(grad_out, ids, weight, offsets, mode=mode,
                                    per_sample_weights=psw)
    out, w, p = _torch(ids, weight, offsets, mode=mode, per_sample_weights=psw)
    out.backward(torch.from_numpy(grad_out))
    np.testing.assert_array_equal(gw, w.grad.numpy())


def test_scale_grad_by_freq_counts_the_whole_input(rng):
    weight = np.ones((3, 2), np.float32)
    ids = np.array([0, 1, 2, 1, 0, 0])
    gw, _ = embedding_bag_backward(np.ones((2, 2), np.float32), ids, weight, [0, 3],
                                   mode="sum", scale_grad_by_freq=True)
    np.testing.assert_array_equal(gw, np.ones((3, 2)))  # each id's terms / its count


def test_max_sends_each_column_to_the_first_winner():
    weight = np.array([[1.0, 5.0], [1.0, 2.0], [0.0, 9.0]], np.float32)
    gw, _ = embedding_bag_backward(np.array([[10.0, 20.0]], np.float32), [1, 0, 2], weight,
                                   [0], mode="max")
    np.testing.assert_array_equal(gw, [[0, 0], [10, 0], [0, 20]])


def test_gradients_match_finite_differences(rng):
    weight = rng.standard_normal((5, 3))
    ids, offsets = np.array([0, 3, 3, 1, 4, 2]), np.array([0, 2, 2, 5])
    psw = rng.standard_normal(6)
    grad_out = rng.standard_normal((4, 3))
    gw, gp = embedding_bag_backward(grad_out, ids, weight, offsets, mode="sum",
                                    per_sample_weights=psw)

    def loss(w, p):
        return float((embedding_bag(ids, w, offsets, mode="sum", per_sample_weights=p)
                      * grad_out).sum())

    eps = 1e-6
    for r, d in np.ndindex(*weight.shape):
        up, down = weight.copy(), weight.copy()
        up[r, d] += eps
        down[r, d] -= eps
        assert gw[r, d] == pytest.approx((loss(up, psw) - loss(down, psw)) / (2 * eps),
                                         abs=1e-7)
    for i in range(6):
        up, down = psw.copy(), psw.copy()
        up[i] += eps
        down[i] -= eps
        assert gp[i] == pytest.approx((loss(weight, up) - loss(weight, down)) / (2 * eps),
                                      abs=1e-7)


def test_max_norm_clips_the_rows_looked_up_as_torch(rng):
    weight = (rng.standard_normal((8, 4)) * 3).astype(np.float32)
    ids, offsets = np.array([1, 2, 2, 5]), np.array([0, 3])
    ours = weight.copy()
    out = embedding_bag(ids, ours, offsets, max_norm=1.0, mode="sum")
    w = torch.from_numpy(weight.copy())
    expected = TF.embedding_bag(torch.from_numpy(ids), w, torch.from_numpy(offsets),
                                max_norm=1.0, mode="sum")
    np.testing.assert_array_equal(ours, w.numpy())
    np.testing.assert_array_equal(out, expected.numpy())


@pytest.mark.parametrize("device, dtype", device_cases([("bfloat16",), ("float16",)]),
                         indirect=["device"])
def test_half_tables_pool_in_float32(rng, device, dtype):
    half = to_table_dtype(rng.standard_normal((10, 6)), _half_dtype(dtype))
    ids, offsets = on(device, np.array([1, 2, 9, 0, 3])), on(device, np.array([0, 2, 2]))
    for mode in ("sum", "mean", "max"):
        out = embedding_bag(ids, on(device, half), offsets, mode=mode)
        assert out.dtype == np.float32
        np.testing.assert_array_equal(host(out), embedding_bag(
            host(ids), half.astype(np.float32), host(offsets), mode=mode))


def _half_dtype(name):
    if name == "float16":
        return np.dtype(np.float16)
    return numbapos._device.bfloat16_dtype()


def test_results_do_not_depend_on_threads(rng, parallel_threshold):
    weight = rng.standard_normal((300, 64)).astype(np.float32)
    ids = rng.integers(0, 300, 2000)
    offsets = np.arange(0, 2000, 10)
    grad_out = rng.standard_normal((200, 64)).astype(np.float32)
    runs = []
    for threshold in (1 << 40, 1):
        parallel_threshold(threshold)
        runs.append((embedding_bag(ids, weight, offsets, mode="mean"),
                     embedding_bag_backward(grad_out, ids, weight, offsets, mode="mean")[0]))
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_out_buffer_and_empty_inputs(rng):
    weight = rng.standard_normal((4, 3)).astype(np.float32)
    out = np.full((2, 3), np.nan, np.float32)
    assert embedding_bag([1, 2], weight, [0, 1], mode="sum", out=out) is out
    np.testing.assert_array_equal(out, weight[[1, 2]])
    assert embedding_bag(np.array([], np.int64), weight, [0, 0], mode="max").tolist() == \
        [[0, 0, 0]] * 2
    assert embedding_bag(np.zeros((3, 0), np.int64), weight, mode="mean").tolist() == \
        [[0, 0, 0]] * 3
    assert embedding_bag([1], weight, np.array([], np.int64)).shape == (0, 3)


BAD = [
    (dict(offsets=[1, 2]), ValueError, r"offsets\[0\]=1: the first offset must be 0"),
    (dict(offsets=[0, 3, 2]), ValueError, r"offsets\[2\]=2: offsets must not decrease"),
    (dict(offsets=[0, 7]), ValueError, r"offsets\[1\]=7: offsets must not pass len\(input\)=4"),
    (dict(offsets=[0, 3], include_last_offset=True), ValueError,
     "last offset must equal len"),
    (dict(ids=[[1, 2]], offsets=[0]), ValueError, "offsets: must be None for 2-D input"),
    (dict(offsets=None), ValueError, "offsets: required with 1-D input"),
    (dict(ids=[1, 2, 9, 0]), IndexError, "input: index 9"),
    (dict(mode="mean", per_sample_weights=np.ones(4, np.float32)), ValueError,
     "per_sample_weights: only supported with mode='sum'"),
    (dict(mode="sum", per_sample_weights=np.ones(3, np.float32)), ValueError,
     r"per_sample_weights: expected the input's shape \(4,\)"),
    (dict(mode="avg"), ValueError, "mode: expected 'sum', 'mean' or 'max'"),
    (dict(padding_idx=5), ValueError, "padding_idx: 5 is outside"),
    (dict(mode="max", scale_grad_by_freq=True), ValueError,
     "scale_grad_by_freq: not supported with mode='max'"),
]


@pytest.mark.parametrize("kwargs, error, match", BAD)
def test_bad_input_raises_and_changes_nothing(rng, kwargs, error, match):
    weight = (rng.standard_normal((5, 3)) * 10).astype(np.float32)
    before = weight.copy()
    kwargs = dict(kwargs)
    ids = kwargs.pop("ids", [1, 2, 3, 0])
    offsets = kwargs.pop("offsets", [0, 2])
    with pytest.raises(error, match=match):
        embedding_bag(ids, weight, offsets, max_norm=1.0, **kwargs)
    np.testing.assert_array_equal(weight, before)  # max_norm clipped nothing


def test_backward_bad_input():
    weight = np.ones((5, 3), np.float32)
    with pytest.raises(ValueError, match=r"grad_output: expected shape \(2, 3\)"):
        embedding_bag_backward(np.ones((3, 3), np.float32), [1, 2], weight, [0, 1])
    with pytest.raises(ValueError, match="scale_grad_by_freq: not supported with mode='max'"):
        embedding_bag_backward(np.ones((2, 3), np.float32), [1, 2], weight, [0, 1],
                               mode="max", scale_grad_by_freq=True)


def test_cuda_bad_id_is_deferred_and_changes_nothing():
    if not numbapos.cuda_available():
        pytest.skip("CUDA is not available")
    weight = on("cuda", np.ones((5, 3), np.float32))
    grad = on("cuda", np.zeros((5, 3), np.float32))
    with pytest.raises(IndexError, match="input: index 7"):
        embedding_bag(on("cuda", np.array([1, 7])), weight, on("cuda", np.array([0, 1])),
                      mode="sum")
        numbapos.synchronize()
    np.testing.assert_array_equal(host(grad), 0)


def test_cuda_bad_offsets_are_deferred_and_clip_nothing():
    if not numbapos.cuda_available():
        pytest.skip("CUDA is not available")
    table = (np.arange(15, dtype=np.float32).reshape(5, 3) + 5)
    weight = on("cuda", table)
    with pytest.raises(ValueError, match="offsets: gives position 9"):
        embedding_bag(on("cuda", np.array([1, 2, 3])), weight, on("cuda", np.array([0, 9])),
                      max_norm=1.0, mode="sum")
        numbapos.synchronize()
    np.testing.assert_array_equal(host(weight), table)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_bag_vs_embedding(rng, mode):
    """PyTorch's ``_test_EmbeddingBag_vs_Embedding``: a 2-D bag is a lookup then a reduction."""
    weight = rng.standard_normal((30, 6))
    ids = rng.integers(0, 30, (7, 4))
    rows = numbapos.functional.embedding(ids, weight)
    expected = {"sum": rows.sum, "mean": rows.mean, "max": rows.max}[mode](axis=1)
    np.testing.assert_allclose(embedding_bag(ids, weight, mode=mode), expected, rtol=1e-12)
    flat_offsets = np.arange(0, 28, 4)
    np.testing.assert_array_equal(embedding_bag(ids.reshape(-1), weight, flat_offsets,
                                                mode=mode),
                                  embedding_bag(ids, weight, mode=mode))


LAZY = [(mode, weighted, sgbf, pad) for mode, weighted, sgbf in
        (("sum", False, False), ("sum", True, False), ("sum", False, True),
         ("mean", False, False)) for pad in (None, 1)]


@pytest.mark.parametrize("device, mode, weighted, sgbf, pad", device_cases(LAZY))
def test_lazy_backward_leaves_plain_sums_to_the_update_with_the_same_bits(
        rng, device, mode, weighted, sgbf, pad):
    ids, offsets, weight = _case(rng, np.float32, np.int64, False, False, V=6, bags=8)
    ids[:4] = [1, 1, 2, 1]
    psw = rng.standard_normal(ids.shape).astype(np.float32) if weighted else None
    grad_out = rng.standard_normal((offsets.size, weight.shape[1])).astype(np.float32)
    grad_out[:, 0] = -0.0  # a column whose sums are all -0.0 terms
    args = [on(device, a) for a in (grad_out, ids, weight, offsets)]
    kwargs = dict(mode=mode, sparse=True, per_sample_weights=on(device, psw),
                  scale_grad_by_freq=sgbf, padding_idx=pad)
    summed, _ = embedding_bag_backward(*args, **kwargs)
    lazy, _ = embedding_bag_backward(*args, lazy=True, **kwargs)
    plain = mode == "sum" and not weighted and not sgbf
    assert lazy.summed is not plain
    np.testing.assert_array_equal(host(lazy.indices), host(summed.indices))
    np.testing.assert_array_equal(host(lazy.materialize().values).view(np.uint32),
                                  host(summed.values).view(np.uint32))
    dense, _ = embedding_bag_backward(*args[:3], on(device, offsets), mode=mode,
                                      per_sample_weights=on(device, psw),
                                      scale_grad_by_freq=sgbf, padding_idx=pad)
    rows = host(summed.indices)
    assert host(dense)[rows].tobytes() == host(summed.values).tobytes()
    if plain:  # a plain sum starts from its first term: the -0.0 column stays -0.0
        assert np.all(np.signbit(host(summed.values)[:, 0]))
