"""Pooled lookups of int8 / int4 row-wise quantised tables (quantized_embedding_bag,
QuantizedEmbeddingBag): sums bit for bit PyTorch 2.13's quantised bag ops, means and
maxima against the NumPy reference (tests/reference.py), on the CPU and on CUDA (the simulator)."""

import numpy as np
import pytest
import reference as ref
from conftest import device_cases, host, on
from cuda_counts import deferred_raises

import numbapos
from numbapos.functional.bag import embedding_bag
from numbapos.functional.quantized import (
    dequantize_rowwise,
    quantize_rowwise,
    quantized_embedding_bag,
)
from numbapos.nn.bag import EmbeddingBag
from numbapos.nn.quantized import QuantizedEmbeddingBag

BITS = [8, 4]


# ------------------------------------------------------------------ helpers


def _table(rng, num, dim):
    """Rows of different scales (a constant row among them): every rounding shows."""
    table = rng.normal(size=(num, dim)) * rng.uniform(0.01, 100.0, size=(num, 1))
    table[1] = 2.5
    return table.astype(np.float32)


def _bags(rng, num, two_d, include_last_offset, index_dtype, bags=9, longest=7):
    """``(input, offsets)``: 1-D bags of 0..longest ids (two empty ones) or a 2-D input."""
    if two_d:
        return rng.integers(0, num, (bags, 4)).astype(index_dtype), None
    sizes = rng.integers(0, longest + 1, bags)
    sizes[[1, -1]] = 0  # an empty bag inside and one at the end
    ids = rng.integers(0, num, int(sizes.sum())).astype(index_dtype)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(index_dtype)
    return ids, offsets if include_last_offset else offsets[:-1]


def _torch_sum(packed, bits, ids, offsets, include_last_offset=False, weights=None):
    """PyTorch's quantised bag op (mode 0) on ``ids`` (2-D: one bag per row)."""
    torch = pytest.importorskip("torch")
    op = (torch.ops.quantized.embedding_bag_byte_rowwise_offsets if bits == 8
          else torch.ops.quantized.embedding_bag_4bit_rowwise_offsets)
    ids = np.asarray(ids)
    if ids.ndim == 2:
        offsets = np.arange(0, ids.size, ids.shape[1], dtype=ids.dtype)
        include_last_offset = False
    return op(torch.from_numpy(packed), torch.from_numpy(ids.reshape(-1)),
              torch.from_numpy(np.asarray(offsets)),
              per_sample_weights=None if weights is None else torch.from_numpy(
                  np.ascontiguousarray(weights).reshape(-1)),
              include_last_offset=include_last_offset).numpy()


def _same_bits(got, want):
    got = host(got)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert got.tobytes() == np.asarray(want, np.float32).tobytes()


# ------------------------------------------------------------------ PyTorch's sums


SUMS = [(bits, layout, weighted, index_dtype)
        for bits in BITS for layout in ("offsets", "last_offset", "2d")
        for weighted in (False, True) for index_dtype in (np.int32, np.int64)]


@pytest.mark.parametrize("bits, layout, weighted, index_dtype", SUMS)
def test_sums_are_pytorchs_bits(bits, layout, weighted, index_dtype, rng):
    torch = pytest.importorskip("torch")  # noqa: F841
    for dim in (2, 7, 16, 38) if bits == 8 else (2, 16, 38):  # PyTorch packs even D only
        packed = quantize_rowwise(_table(rng, 40, dim), bits)
        last = layout == "last_offset"
        ids, offsets = _bags(rng, 40, layout == "2d", last, index_dtype)
        weights = rng.normal(size=ids.shape).astype(np.float32) if weighted else None
        got = quantized_embedding_bag(ids, packed, bits, offsets, mode="sum",
                                      per_sample_weights=weights, include_last_offset=last)
        _same_bits(got, _torch_sum(packed, bits, ids, offsets, last, weights))
        _same_bits(got, ref.quantized_embedding_bag(ids, packed, bits, dim, offsets, "sum",
                                                          weights, last))


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("padding_idx", [0, -1])
@pytest.mark.parametrize("weighted", [False, True])
def test_padding_is_left_out_of_pytorchs_sums(bits, padding_idx, weighted, rng):
    """PyTorch's quantised ops take no padding_idx: the sum over a bag's other entries."""
    pytest.importorskip("torch")
    num, dim = 12, 10
    packed = quantize_rowwise(_table(rng, num, dim), bits)
    ids, offsets = _bags(rng, num, False, False, np.int64, bags=12)
    pad = padding_idx % num
    ids[::2] = pad
    ids[offsets[2]:offsets[3]] = pad  # a bag of padding only: zeros
    weights = rng.normal(size=ids.shape).astype(np.float32) if weighted else None
    got = quantized_embedding_bag(ids, packed, bits, offsets, mode="sum",
                                  per_sample_weights=weights, padding_idx=padding_idx)
    keep = ids != pad
    kept_offsets = np.concatenate([[0], np.cumsum(keep)])[offsets]
    want = _torch_sum(packed, bits, ids[keep], kept_offsets, False,
                      None if weights is None else weights[keep])
    _same_bits(got, want)
    assert not host(got)[2].any()


def test_pytorchs_ops_ignore_mode_and_numbapos_does_not(rng):
    """PyTorch 2.13's quantised bag ops return the sum for mode 1 (mean) and 2 (max)."""
    torch = pytest.importorskip("torch")
    packed = quantize_rowwise(_table(rng, 6, 4), 8)
    ids, offsets = np.array([0, 2, 3, 5]), np.array([0, 3])
    op = torch.ops.quantized.embedding_bag_byte_rowwise_offsets
    tp, ti, to = map(torch.from_numpy, (packed, ids, offsets))
    total = op(tp, ti, to, mode=0).numpy()
    assert all((op(tp, ti, to, mode=m).numpy() == total).all() for m in (1, 2))
    mean = quantized_embedding_bag(ids, packed, 8, offsets, mode="mean")
    _same_bits(mean, total / np.array([[3], [1]], np.float32))
    table = dequantize_rowwise(packed, 8)
    _same_bits(quantized_embedding_bag(ids, packed, 8, offsets, mode="max"),
               np.stack([table[[0, 2, 3]].max(0), table[5]]))


# ------------------------------------------------------------------ mean and max


MODES = [(bits, mode, layout, pad)
         for bits in BITS for mode in ("mean", "max") for layout in ("offsets", "last", "2d")
         for pad in (None, 0, -1)]


@pytest.mark.parametrize("bits, mode, layout, pad", MODES)
def test_mean_and_max_match_the_reference(bits, mode, layout, pad, rng):
    num, dim = 15, 9  # odd D: the 4-bit tail column
    packed = quantize_rowwise(_table(rng, num, dim), bits)
    last = layout == "last"
    for index_dtype in (np.int32, np.int64):
        ids, offsets = _bags(rng, num, layout == "2d", last, index_dtype)
        ids[::3] = 0  # padding occurs (row 0, or row 14 for -1 when drawn)
        got = quantized_embedding_bag(ids, packed, bits, offsets, mode=mode,
                                      include_last_offset=last, padding_idx=pad, dim=dim)
        _same_bits(got, ref.quantized_embedding_bag(ids, packed, bits, dim, offsets, mode,
                                                          None, last, pad))
        if mode == "mean":  # the sum divided by the entries that are not padding
            total = quantized_embedding_bag(ids, packed, bits, offsets, mode="sum",
                                            include_last_offset=last, padding_idx=pad, dim=dim)
            flat, bounds = ref.bag_bounds(ids, offsets, last)
            pad_row = -1 if pad is None else pad % num
            counts = np.array([max(1, int((flat[s:e] != pad_row).sum())) for s, e in bounds])
            _same_bits(got, total / counts[:, None].astype(np.float32))


@pytest.mark.parametrize("bits", BITS)
def test_max_is_the_float_bags_max_of_the_dequantised_table(bits, rng):
    packed = quantize_rowwise(_table(rng, 20, 6), bits)
    ids, offsets = _bags(rng, 20, False, False, np.int64)
    for pad in (None, 3):
        _same_bits(quantized_embedding_bag(ids, packed, bits, offsets, mode="max",
                                           padding_idx=pad),
                   embedding_bag(ids, dequantize_rowwise(packed, bits), offsets, mode="max",
                                 padding_idx=pad))


# ------------------------------------------------------------------ shapes, threads, out


def test_out_buffer_and_empty_inputs(rng):
    packed = quantize_rowwise(_table(rng, 4, 3), 8)
    out = np.full((2, 3), np.nan, np.float32)
    assert quantized_embedding_bag([1, 2], packed, 8, [0, 1], mode="sum", out=out) is out
    _same_bits(out, dequantize_rowwise(packed, 8)[[1, 2]])
    for mode in ("sum", "mean", "max"):
        assert quantized_embedding_bag(np.array([], np.int64), packed, 8, [0, 0],
                                       mode=mode).tolist() == [[0, 0, 0]] * 2
        assert quantized_embedding_bag(np.zeros((3, 0), np.int64), packed, 8,
                                       mode=mode).tolist() == [[0, 0, 0]] * 3
    assert quantized_embedding_bag([1], packed, 8, np.array([], np.int64)).shape == (0, 3)
    assert quantized_embedding_bag([1], packed, 8, [0, 1], include_last_offset=True).shape == \
        (1, 3)
    zero_width = quantize_rowwise(np.zeros((3, 0), np.float32), 4)
    assert quantized_embedding_bag([2, 0], zero_width, 4, [0], dim=0).shape == (1, 0)


def test_strided_packed_tables_are_copied(rng):
    packed = quantize_rowwise(_table(rng, 10, 8), 8)
    wide = np.zeros((10, 2 * packed.shape[1]), np.uint8)
    wide[:, ::2] = packed
    ids, offsets = np.array([3, 1, 9, 9, 0]), np.array([0, 2])
    _same_bits(quantized_embedding_bag(ids, wide[:, ::2], 8, offsets, mode="sum"),
               quantized_embedding_bag(ids, packed, 8, offsets, mode="sum"))


@pytest.mark.parametrize("bits", BITS)
def test_serial_and_parallel_kernels_agree(bits, parallel_threshold, rng):
    packed = quantize_rowwise(_table(rng, 64, 33), bits)
    ids, offsets = _bags(rng, 64, False, False, np.int64, bags=40, longest=12)
    weights = rng.normal(size=ids.shape).astype(np.float32)
    runs = []
    for threshold in (1 << 40, 1):
        parallel_threshold(threshold)
        runs.append([quantized_embedding_bag(ids, packed, bits, offsets, mode=mode,
                                             padding_idx=5, dim=33)
                     for mode in ("sum", "mean", "max")]
                    + [quantized_embedding_bag(ids, packed, bits, offsets, mode="sum",
                                               per_sample_weights=weights, dim=33)])
    for a, b in zip(*runs, strict=True):
        _same_bits(a, b)


# ------------------------------------------------------------------ bad input


BAD = [
    (dict(offsets=[1, 2]), ValueError, r"offsets\[0\]=1: the first offset must be 0"),
    (dict(offsets=[0, 3, 2]), ValueError, r"offsets\[2\]=2: offsets must not decrease"),
    (dict(offsets=[0, 7]), ValueError, r"offsets\[1\]=7: offsets must not pass len\(input\)=4"),
    (dict(offsets=[0, 3], include_last_offset=True), ValueError, "last offset must equal len"),
    (dict(ids=[[1, 2]], offsets=[0]), ValueError, "offsets: must be None for 2-D input"),
    (dict(offsets=None), ValueError, "offsets: required with 1-D input"),
    (dict(ids=[1, 2, 9, 0]), IndexError, "input: index 9"),
    (dict(ids=[1, -1, 2, 0]), IndexError, "input: index -1"),
    (dict(ids=[1.0, 2.0]), TypeError, "input"),
    (dict(mode="mean", per_sample_weights=np.ones(4, np.float32)), ValueError,
     "per_sample_weights: only supported with mode='sum'"),
    (dict(mode="max", per_sample_weights=np.ones(4, np.float32)), ValueError,
     "per_sample_weights: only supported with mode='sum'"),
    (dict(mode="sum", per_sample_weights=np.ones(3, np.float32)), ValueError,
     r"per_sample_weights: expected the input's shape \(4,\)"),
    (dict(mode="sum", per_sample_weights=np.ones(4, np.float64)), TypeError,
     "per_sample_weights: expected dtype float32"),
    (dict(mode="avg"), ValueError, "mode: expected 'sum', 'mean' or 'max'"),
    (dict(padding_idx=5), ValueError, "padding_idx: 5 is outside"),
    (dict(bits=16), ValueError, "bits: expected 8 or 4"),
    (dict(dim=5), ValueError, "dim: 5 columns take"),
    (dict(out=np.zeros((2, 4), np.float32)), ValueError, "out"),
    (dict(out=np.zeros((2, 3), np.float64)), ValueError, "out"),
]


@pytest.mark.parametrize("kwargs, error, match", BAD)
def test_bad_input_raises_and_changes_nothing(rng, kwargs, error, match):
    packed = quantize_rowwise(_table(rng, 5, 3), 8)
    before = packed.copy()
    kwargs = dict(kwargs)
    ids = kwargs.pop("ids", [1, 2, 3, 0])
    offsets = kwargs.pop("offsets", [0, 2])
    bits = kwargs.pop("bits", 8)
    out = kwargs.pop("out", np.full((2, 3), 7.0, np.float32))
    out_before = out.copy()
    with pytest.raises(error, match=match):
        quantized_embedding_bag(ids, packed, bits, offsets, out=out, **kwargs)
    np.testing.assert_array_equal(packed, before)
    np.testing.assert_array_equal(out, out_before)


def test_bad_packed_tables():
    with pytest.raises(TypeError, match="packed: expected a 2-D uint8 array"):
        quantized_embedding_bag([0], np.zeros((2, 12), np.float32), 8, [0])
    with pytest.raises(ValueError, match="packed: a 4-bit row holds its codes and 4 bytes"):
        quantized_embedding_bag([0], np.zeros((2, 3), np.uint8), 4, [0])


# ------------------------------------------------------------------ devices


DEVICE_CASES = [(bits, mode, weighted, pad, two_d)
                for bits in BITS for mode in ("sum", "mean", "max")
                for weighted in ((False, True) if mode == "sum" else (False,))
                for pad in (None, 1) for two_d in (False, True)]


@pytest.mark.parametrize("device, bits, mode, weighted, pad, two_d", device_cases(
    DEVICE_CASES, cuda=lambda bits, mode, weighted, pad, two_d: pad is None or not two_d))
def test_devices_compute_the_same_bits(device, bits, mode, weighted, pad, two_d, rng):
    num, dim = 6, 5
    packed = quantize_rowwise(_table(rng, num, dim), bits)
    ids, offsets = _bags(rng, num, two_d, False, np.int64, bags=4, longest=4)
    ids.reshape(-1)[::4] = 1
    weights = rng.normal(size=ids.shape).astype(np.float32) if weighted else None
    got = quantized_embedding_bag(on(device, ids), on(device, packed), bits, on(device, offsets),
                                  mode=mode, per_sample_weights=on(device, weights),
                                  padding_idx=pad, dim=dim)
    assert numbapos.device_of(got) == device
    _same_bits(got, ref.quantized_embedding_bag(ids, packed, bits, dim, offsets, mode,
                                                      weights, False, pad))


@pytest.mark.parametrize("device", ["cpu", "cuda"], indirect=True)
def test_bad_ids_and_offsets_write_nothing(device, rng):
    packed = on(device, quantize_rowwise(_table(rng, 4, 3), 8))
    table = host(packed).copy()
    out = on(device, np.full((2, 3), 7.0, np.float32))
    # On CUDA the pooling kernel checks ids as it reads them: the error comes at the next
    # synchronising call, the bad entry left out of its bag, the table never read past V.
    with deferred_raises(device, IndexError, r"input: index 4 \(at flat position 1\) is out "
                                             r"of range for num_embeddings=4"):
        quantized_embedding_bag(on(device, np.array([0, 4, 1])), packed, 8,
                                on(device, np.array([0, 2])), mode="sum", out=out)
    np.testing.assert_array_equal(host(packed), table)
    if device == "cpu":
        assert (host(out) == 7.0).all()
    else:
        _same_bits(out, dequantize_rowwise(table, 8)[[0, 1]])
    with deferred_raises(device, ValueError, "offsets", deferred=True):
        quantized_embedding_bag(on(device, np.array([0, 1, 2])), packed, 8,
                                on(device, np.array([0, 9])), mode="sum")
    np.testing.assert_array_equal(host(packed), table)
    # The device is usable again.
    _same_bits(quantized_embedding_bag(on(device, np.array([[3, 2]])), packed, 8, mode="max"),
               dequantize_rowwise(table, 8)[[3, 2]].max(0, keepdims=True))


# ------------------------------------------------------------------ the module


@pytest.mark.parametrize("bits", BITS)
def test_module_keeps_the_bags_options_and_pools_like_the_op(bits, rng):
    float_bag = EmbeddingBag(12, 6, mode="max", include_last_offset=True, padding_idx=2, seed=0)
    float_bag.weight.data[2] = rng.normal(size=6)  # a trained padding row: still left out
    q = QuantizedEmbeddingBag.from_float(float_bag, bits)
    assert (q.mode, q.include_last_offset, q.padding_idx, q.bits) == ("max", True, 2, bits)
    assert (q.num_embeddings, q.embedding_dim) == (12, 6)
    assert host(q.packed).tobytes() == ref.quantize_rowwise(float_bag.weight.data, bits).tobytes()
    ids, offsets = np.array([2, 5, 7, 2, 11]), np.array([0, 3, 3, 5])
    got = q(ids, offsets)
    _same_bits(got, quantized_embedding_bag(ids, q.packed, bits, offsets, mode="max",
                                            include_last_offset=True, padding_idx=2))
    out = np.empty((3, 6), np.float32)
    assert q(ids, offsets, out=out) is out and out.tobytes() == got.tobytes()
    assert repr(q) == (f"QuantizedEmbeddingBag(12, 6, bits={bits}, mode='max', "
                       "include_last_offset=True, padding_idx=2)")
    weighted = QuantizedEmbeddingBag.from_float(float_bag, bits, mode="sum",
                                                include_last_offset=False, padding_idx=None)
    psw = rng.normal(size=5).astype(np.float32)
    _same_bits(weighted(ids, offsets[:-1], psw),
               ref.quantized_embedding_bag(ids, host(q.packed), bits, 6, offsets[:-1],
                                                 "sum", psw))
    with pytest.raises(ValueError, match="per_sample_weights: only supported with mode='sum'"):
        q(ids, offsets, psw)


def test_module_from_tables_and_pytorch_bags(rng):
    table = _table(rng, 5, 4)
    q = QuantizedEmbeddingBag.from_float(table, bits=4)
    assert (q.mode, q.include_last_offset, q.padding_idx) == ("mean", False, None)
    torch = pytest.importorskip("torch")
    bag = torch.nn.EmbeddingBag(5, 4, mode="sum", padding_idx=1)  # requires grad: detached
    q = QuantizedEmbeddingBag.from_float(bag)
    assert (q.mode, q.padding_idx, q.bits) == ("sum", 1, 8)
    ids, offsets = np.array([0, 1, 4, 3]), np.array([0, 2])
    _same_bits(q(ids, offsets), _torch_sum(ref.quantize_rowwise(bag.weight.detach().numpy(), 8),
                                           8, np.array([0, 4, 3]), np.array([0, 1])))


def test_module_cannot_be_trained_and_its_state_round_trips(rng):
    q = QuantizedEmbeddingBag.from_float(_table(rng, 6, 3), bits=8, mode="sum")
    assert list(q.parameters()) == []
    y = q([[1, 2]])
    with pytest.raises(RuntimeError, match=r"cannot be trained .* nn.EmbeddingBag .* "
                                           r"QuantizedEmbeddingBag.from_float\(bag"):
        q.backward(np.ones_like(y))
    state = q.state_dict()
    assert list(state) == ["packed"] and state["packed"].dtype == np.uint8
    fresh = QuantizedEmbeddingBag(6, 3, bits=8, mode="sum")
    assert fresh([[1, 2]]).tobytes() != y.tobytes()
    fresh.load_state_dict(state)
    assert fresh([[1, 2]]).tobytes() == y.tobytes()
    _same_bits(fresh.dequantize(), dequantize_rowwise(state["packed"], 8))


def test_module_argument_errors():
    with pytest.raises(ValueError, match="mode: expected 'sum', 'mean' or 'max', got 'avg'"):
        QuantizedEmbeddingBag(2, 4, mode="avg")
    with pytest.raises(ValueError, match=r"_packed: expected shape \(2, 12\)"):
        QuantizedEmbeddingBag(2, 4, _packed=np.zeros((3, 12), np.uint8))
    with pytest.raises(TypeError, match="bag_or_table: expected"):
        QuantizedEmbeddingBag.from_float("table")


@pytest.mark.parametrize("device", ["cpu", "cuda"], indirect=True)
def test_module_on_devices(device, rng):
    table = _table(rng, 5, 3)
    q = QuantizedEmbeddingBag.from_float(on(device, table), bits=4, mode="mean", padding_idx=0)
    assert q.device == device and numbapos.device_of(q.packed) == device
    ids, offsets = np.array([0, 3, 4, 0]), np.array([0, 3])
    got = q(on(device, ids), on(device, offsets))
    _same_bits(got, ref.quantized_embedding_bag(ids, ref.quantize_rowwise(table, 4), 4, 3,
                                                      offsets, "mean", padding_idx=0))
    _same_bits(q.to("cpu")(ids, offsets), host(got))
