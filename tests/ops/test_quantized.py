"""Int8 / int4 row-wise quantised tables: FBGEMM's format byte for byte, PyTorch's lookups
bit for bit, on the CPU and on CUDA (the simulator without a GPU)."""

import numpy as np
import pytest
import reference as ref
from conftest import host, on
from cuda_counts import deferred_raises

import numbapos
from numbapos import functional as F
from numbapos import nn

BITS = [8, 4]


def _tables(rng, dim):
    """Named float32 tables of shape (6, dim) that reach every branch of the quantisers."""
    normal = rng.normal(size=(6, dim)).astype(np.float32)
    constant = np.repeat(rng.normal(size=(6, 1)).astype(np.float32), dim, axis=1)
    constant[0] = 0.0
    mixed = normal.copy()
    mixed[1] = 3.0  # a constant row among others
    mixed[2] *= np.float32(1e-6)
    mixed[3] *= np.float32(1e4)
    integers = rng.integers(-3, 4, size=(6, dim)).astype(np.float32)
    tiny = (normal * np.float32(1e-30)).astype(np.float32)
    return {"normal": normal, "constant": constant, "mixed": mixed, "integers": integers,
            "tiny": tiny}


def _extremes(rng, dim, bits):
    """The widest finite tables each format takes (max - min finite; float16 range for 4 bits)."""
    limit = 1.5e38 if bits == 8 else 65504.0
    table = rng.uniform(-limit, limit, size=(4, dim)).astype(np.float32)
    table[0, 0], table[0, -1] = -limit, limit
    table[1] = limit
    if bits == 4:  # values beyond float16's range, with a float16 minimum and scale
        table[2] = np.linspace(-65504.0, 9.0e5, dim, dtype=np.float32)
    return table


def _signed_zeros(dim):
    """Rows whose minimum is a zero of either sign: the bias keeps the first one's sign."""
    patterns = ([0.0, -0.0, 1.0], [-0.0, 0.0, 2.0], [-0.0], [0.0, -0.0], [-0.0, 0.0])
    return np.array([np.resize(np.array(p, np.float32), dim) for p in patterns], np.float32)


# ------------------------------------------------------------------ format


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dim", [1, 2, 7, 8, 33])
def test_quantize_matches_the_reference_byte_for_byte(bits, dim, rng):
    for name, table in {**_tables(rng, dim), "extremes": _extremes(rng, dim, bits)}.items():
        got = F.quantize_rowwise(table, bits)
        assert got.dtype == np.uint8 and got.shape == (6 if name != "extremes" else 4,
                                                       F.rowwise_width(dim, bits))
        np.testing.assert_array_equal(got, ref.quantize_rowwise(table, bits), err_msg=name)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dim", [2, 8, 64])
def test_quantize_is_pytorchs_prepack_byte_for_byte(bits, dim, rng):
    torch = pytest.importorskip("torch")
    prepack = (torch.ops.quantized.embedding_bag_byte_prepack if bits == 8
               else torch.ops.quantized.embedding_bag_4bit_prepack)
    tables = {**_tables(rng, dim), "extremes": _extremes(rng, dim, bits),
              "large": rng.normal(size=(50, dim)).astype(np.float32) * np.float32(100),
              "signed_zeros": _signed_zeros(dim)}
    for name, table in tables.items():
        want = prepack(torch.from_numpy(table)).numpy()
        np.testing.assert_array_equal(F.quantize_rowwise(table, bits), want, err_msg=name)


@pytest.mark.parametrize("bits", BITS)
def test_dequantize_is_pytorchs_unpack_bit_for_bit(bits, rng):
    torch = pytest.importorskip("torch")
    unpack = (torch.ops.quantized.embedding_bag_byte_unpack if bits == 8
              else torch.ops.quantized.embedding_bag_4bit_unpack)
    for name, table in {**_tables(rng, 12), "extremes": _extremes(rng, 12, bits)}.items():
        packed = F.quantize_rowwise(table, bits)
        want = unpack(torch.from_numpy(packed)).numpy()
        got = F.dequantize_rowwise(packed, bits)
        assert got.dtype == np.float32 and got.tobytes() == want.tobytes(), name


@pytest.mark.parametrize("bits", BITS)
def test_lookup_is_pytorchs_quantized_bag_with_one_id_per_bag(bits, rng):
    torch = pytest.importorskip("torch")
    op = (torch.ops.quantized.embedding_bag_byte_rowwise_offsets if bits == 8
          else torch.ops.quantized.embedding_bag_4bit_rowwise_offsets)
    table = rng.normal(size=(40, 24)).astype(np.float32) * np.float32(3)
    table[5] = -2.5
    packed = F.quantize_rowwise(table, bits)
    for index_dtype in (np.int32, np.int64):
        ids = rng.integers(0, 40, size=(3, 17)).astype(index_dtype)
        flat = torch.from_numpy(ids.reshape(-1))
        want = op(torch.from_numpy(packed), flat, torch.arange(flat.numel(), dtype=flat.dtype))
        got = F.quantized_embedding(ids, packed, bits)
        assert got.shape == (3, 17, 24)
        assert got.tobytes() == want.numpy().tobytes()
    # padding_idx: PyTorch's bags skip it, so a one-id bag of it is a row of zeros
    ids = np.array([5, 7, 7, 0, 7, 39])
    keep = torch.from_numpy(ids[ids != 7])
    offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(ids != 7)[:-1]]))
    want = op(torch.from_numpy(packed), keep, offsets)
    assert F.quantized_embedding(ids, packed, bits, padding_idx=7).tobytes() == \
        want.numpy().tobytes()


@pytest.mark.parametrize("bits", BITS)
def test_odd_dim_with_4_bits_leaves_the_last_high_nibble_zero(bits, rng):
    table = rng.normal(size=(5, 7)).astype(np.float32)
    packed = F.quantize_rowwise(table, bits)
    if bits == 4:
        assert packed.shape == (5, 4 + 4) and not (packed[:, 3] >> 4).any()
        assert F.dequantize_rowwise(packed, 4).shape == (5, 8)  # without dim: 2 * bytes
    got = F.dequantize_rowwise(packed, bits, dim=7)
    assert got.tobytes() == ref.dequantize_rowwise(packed, bits, 7).tobytes()
    ids = np.array([4, 0, 2])
    assert F.quantized_embedding(ids, packed, bits, dim=7).tobytes() == \
        ref.quantized_embedding(ids, packed, bits, 7).tobytes()


@pytest.mark.parametrize("bits", BITS)
def test_error_bounds(bits, rng):
    """8 bits: within half a step (max - min) / 255 per row; 4 bits: half the float16
    scale, measured from the float16 bias; plus float32 rounding of the result."""
    table = rng.normal(size=(200, 64)).astype(np.float32) * rng.uniform(
        1e-3, 1e3, size=(200, 1)).astype(np.float32)
    table[:10] = rng.uniform(-5, 5, size=(10, 1)).astype(np.float32)  # constant rows
    packed = F.quantize_rowwise(table, bits)
    back = F.dequantize_rowwise(packed, bits).astype(np.float64)
    x = table.astype(np.float64)
    low, high = x.min(axis=1, keepdims=True), x.max(axis=1, keepdims=True)
    rounding = 2.0 ** -20 * np.abs(x).max(axis=1, keepdims=True)
    if bits == 8:
        bound = (high - low) / 255 / 2
    else:
        _, scale, bias = ref.rowwise_parts(packed, 4, 64)
        bias = bias.astype(np.float64)
        # the codes measure from the float16 bias: half a step, or what the clamp at 0 leaves
        bound = np.maximum(scale.astype(np.float64) / 2, np.abs(bias - low))
        assert (np.abs(bias - low) <= np.abs(low) * 2.0 ** -11 + 2.0 ** -25).all()
    assert (np.abs(back - x) <= bound + rounding).all()
    if bits == 8:  # constant rows come back exactly: scale 0, bias the value
        np.testing.assert_array_equal(back[:10], x[:10])


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("dim", [15, 16, 17, 32, 47, 256])
def test_every_vector_remainder_matches_the_reference(bits, dim, parallel, rng,
                                                      parallel_threshold):
    """The int8 decode runs 16 columns per vector operation, then column by column:
    lookups (with padding and into ``out``) and dequantising agree with the reference for
    every remainder, in the serial and the parallel kernels."""
    parallel_threshold(0 if parallel else 10**9)
    table = rng.normal(size=(300, dim)).astype(np.float32) * np.float32(5)
    table[7] = 1.25
    packed = F.quantize_rowwise(table, bits)
    back = F.dequantize_rowwise(packed, bits, dim=dim)
    assert back.tobytes() == ref.dequantize_rowwise(packed, bits, dim).tobytes()
    ids = rng.integers(0, 300, size=(40, 9))
    ids[0, :3] = 7
    out = np.full(ids.shape + (dim,), np.nan, np.float32)
    got = F.quantized_embedding(ids, packed, bits, padding_idx=7, out=out, dim=dim)
    want = ref.quantized_embedding(ids, packed, bits, dim, padding_idx=7)
    assert got is out and got.tobytes() == want.tobytes()


def test_strided_outputs_take_the_column_loop(rng):
    """The kernels trust their callers but not the layout: an output whose columns are
    not adjacent is decoded one column at a time, with the same bits."""
    from numbapos.kernels import cpu as K

    table = rng.normal(size=(20, 40)).astype(np.float32)
    ids = np.array([3, 19, 0, 3])
    for bits in BITS:
        packed = F.quantize_rowwise(table, bits)
        wide = np.zeros((4, 80), np.float32)
        K.gather_quantized_rows(ids, packed, bits, 40, -1, wide[:, ::2])
        assert wide[:, ::2].tobytes() == ref.quantized_embedding(ids, packed, bits, 40).tobytes()
        assert not wide[:, 1::2].any()


def test_memory_is_about_3_9x_and_7_8x_smaller():
    table = np.zeros((10, 256), np.float32)
    assert table.nbytes / F.quantize_rowwise(table, 8).nbytes == pytest.approx(3.88, abs=0.01)
    assert table.nbytes / F.quantize_rowwise(table, 4).nbytes == pytest.approx(7.76, abs=0.01)


def test_float64_tables_are_rounded_to_float32_first(rng):
    table = rng.normal(size=(4, 6))
    for bits in BITS:
        np.testing.assert_array_equal(F.quantize_rowwise(table, bits),
                                      F.quantize_rowwise(table.astype(np.float32), bits))


HALF_DTYPES = ["bfloat16", "float16"]


def _half_on(device, table):
    """A 16-bit host table on ``device`` (bfloat16 as Numba's own device array: numbapos
    keeps bfloat16 tables on the CPU, but takes such arrays, as it takes PyTorch's)."""
    if device == "cpu":
        return table
    from conftest import dev

    return dev(table)


@pytest.mark.parametrize("half", HALF_DTYPES)
@pytest.mark.parametrize("bits", BITS)
def test_16_bit_tables_quantise_their_float32_widening(device, bits, half, rng):
    dtype = numbapos._checks.check_table_dtype(half)
    table = rng.normal(size=(7, 5)).astype(np.float32).astype(dtype)
    table[3] = table[3] * 1000  # float16's top range: a row far from 1
    table[1, 2] = -0.0
    want = ref.quantize_rowwise(table.astype(np.float32), bits)
    packed = F.quantize_rowwise(_half_on(device, table), bits)
    assert numbapos.device_of(packed) == device
    assert host(packed).tobytes() == want.tobytes()
    emb = nn.Embedding.from_pretrained(_half_on(device, table), padding_idx=2)
    module = nn.QuantizedEmbedding.from_float(emb, bits=bits)
    assert module.padding_idx == 2 and host(module.packed).tobytes() == want.tobytes()
    empty = F.quantize_rowwise(_half_on(device, np.zeros((0, 4), dtype)), bits)
    assert empty.shape == (0, F.rowwise_width(4, bits))
    assert F.quantize_rowwise(_half_on(device, np.zeros((3, 0), dtype)), bits).shape == \
        (3, F.rowwise_width(0, bits))


def test_16_bit_non_finite_rows_are_named(device):
    table = np.ones((3, 4), np.float16)
    table[2, 1] = np.inf
    with pytest.raises(ValueError, match="row 2 holds inf"):
        F.quantize_rowwise(_half_on(device, table), 8)


# ------------------------------------------------------------------ both devices


@pytest.mark.parametrize("bits", BITS)
def test_devices_compute_the_same_bits(device, bits, rng):
    dim = 5
    table = _tables(rng, dim)["mixed"]
    packed = F.quantize_rowwise(on(device, table), bits)
    assert numbapos.device_of(packed) == device
    np.testing.assert_array_equal(host(packed), ref.quantize_rowwise(table, bits))
    back = F.dequantize_rowwise(packed, bits, dim=dim)
    assert host(back).tobytes() == ref.dequantize_rowwise(host(packed), bits, dim).tobytes()
    ids = np.array([[0, 5, 2], [2, 1, 3]])
    got = F.quantized_embedding(on(device, ids), packed, bits, padding_idx=-1, dim=dim)
    want = ref.quantized_embedding(ids, host(packed), bits, dim, padding_idx=5)
    assert numbapos.device_of(got) == device and host(got).tobytes() == want.tobytes()


@pytest.mark.parametrize("bits", BITS)
def test_signed_zeros_on_both_devices(device, bits):
    table = _signed_zeros(4)
    want = F.quantize_rowwise(table, bits)
    assert host(F.quantize_rowwise(on(device, table), bits)).tobytes() == want.tobytes()
    assert want[1, -1] == 0x80 and want[0, -1] == 0  # the bias is -0.0, then +0.0


@pytest.mark.parametrize("bits", BITS)
def test_extremes_on_both_devices(device, bits, rng):
    table = _extremes(rng, 4, bits)
    packed = F.quantize_rowwise(on(device, table), bits)
    np.testing.assert_array_equal(host(packed), ref.quantize_rowwise(table, bits))
    assert host(F.dequantize_rowwise(packed, bits)).tobytes() == \
        ref.dequantize_rowwise(host(packed), bits, 4).tobytes()


@pytest.mark.parametrize("bits", BITS)
def test_shapes_out_and_empty(device, bits, rng):
    table = rng.normal(size=(6, 3)).astype(np.float32)
    packed = F.quantize_rowwise(on(device, table), bits)
    want = ref.dequantize_rowwise(host(packed), bits, 3)
    scalar = F.quantized_embedding(np.int64(4), packed, bits, dim=3)
    assert scalar.shape == (3,) and host(scalar).tobytes() == want[4].tobytes()
    zero_d = F.quantized_embedding(np.array(2, np.int32), packed, bits, dim=3)
    assert zero_d.shape == (3,) and host(zero_d).tobytes() == want[2].tobytes()
    empty = F.quantized_embedding(np.zeros((2, 0), np.int64), packed, bits, dim=3)
    assert empty.shape == (2, 0, 3)
    out = on(device, np.full((2, 2, 3), np.nan, np.float32))
    result = F.quantized_embedding([[1, 0], [5, 5]], packed, bits, out=out, dim=3)
    assert result is out
    assert host(out).tobytes() == want[[[1, 0], [5, 5]]].tobytes()


def test_empty_tables(device):
    for bits in BITS:
        packed = F.quantize_rowwise(on(device, np.zeros((0, 4), np.float32)), bits)
        assert packed.shape == (0, F.rowwise_width(4, bits))
        assert F.dequantize_rowwise(packed, bits).shape == (0, 4)
        zero_width = F.quantize_rowwise(on(device, np.zeros((3, 0), np.float32)), bits)
        np.testing.assert_array_equal(host(zero_width),
                                      ref.quantize_rowwise(np.zeros((3, 0)), bits))
        assert F.quantized_embedding([2, 0], zero_width, bits, dim=0).shape == (2, 0)


def test_bad_indices_raise_and_write_nothing(device, rng):
    packed = F.quantize_rowwise(on(device, rng.normal(size=(4, 3)).astype(np.float32)), 8)
    table = host(packed).copy()
    out = on(device, np.full((3, 3), 7.0, np.float32))
    for bad in (4, -1):
        # On CUDA the gather checks as it reads: the error comes at the next synchronising
        # call, and the bad row of out is zeros (the table is never read out of bounds).
        with deferred_raises(device, IndexError, rf"indices: index {bad} \(at flat position 1\) "
                                                 r"is out of range for num_embeddings=4"):
            F.quantized_embedding(on(device, np.array([0, bad, 1])), packed, 8, out=out)
    np.testing.assert_array_equal(host(packed), table)
    if device == "cpu":
        assert (host(out) == 7.0).all()
    else:
        got = host(out)
        np.testing.assert_array_equal(got[1], 0.0)
        np.testing.assert_array_equal(got[[0, 2]], F.dequantize_rowwise(table, 8)[[0, 1]])
    # The device is usable again.
    np.testing.assert_array_equal(
        host(F.quantized_embedding(on(device, np.array([3, 2])), packed, 8)),
        F.dequantize_rowwise(table, 8)[[3, 2]])


def test_serial_and_parallel_kernels_agree(parallel_threshold, rng):
    table = rng.normal(size=(64, 9)).astype(np.float32)
    ids = rng.integers(0, 64, size=50)
    for bits in BITS:
        results = []
        for threshold in (1 << 40, 1):
            parallel_threshold(threshold)
            packed = F.quantize_rowwise(table, bits)
            results.append((packed.tobytes(),
                            F.dequantize_rowwise(packed, bits, dim=9).tobytes(),
                            F.quantized_embedding(ids, packed, bits, padding_idx=3,
                                                  dim=9).tobytes()))
        assert results[0] == results[1]


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("bits, error, message", [
    ("8", TypeError, "bits: expected 8 or 4, got str '8'"),
    (True, TypeError, "bits: expected 8 or 4, got bool"),
    (2, ValueError, r"bits: expected 8 or 4 \(bits per code\), got 2"),
])
def test_bad_bits(bits, error, message):
    with pytest.raises(error, match=message):
        F.quantize_rowwise(np.zeros((2, 2), np.float32), bits)
    with pytest.raises(error, match=message):
        F.quantized_embedding([0], np.zeros((2, 10), np.uint8), bits)


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("value, what", [
    (np.nan, "nan; expected finite values"),
    (np.inf, "inf; expected finite values"),
    (-np.inf, "-inf; expected finite values"),
])
def test_non_finite_tables_are_refused_naming_the_row(bits, value, what, device):
    table = np.ones((3, 4), np.float32)
    table[2, 1] = value
    before = table.copy()
    with pytest.raises(ValueError, match=f"table: row 2 holds {what}"):
        F.quantize_rowwise(on(device, table), bits)
    np.testing.assert_array_equal(table, before)


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the simulator's
def test_format_limits_are_refused(device):
    bias_overflow = np.array([[1.0, 2.0, 3.0], [-65520.0, 0.0, 1.0]], np.float32)
    scale_overflow = np.array([[1.0, 2.0, 3.0], [0.0, 1.0, 982800.0]], np.float32)
    for table in (bias_overflow, scale_overflow):
        with pytest.raises(ValueError, match=r"table: row 1 spans .*: its 4-bit bias \(the "
                                             r"minimum\) or scale .* exceeds float16's range"):
            F.quantize_rowwise(on(device, table), 4)
        F.quantize_rowwise(on(device, table), 8)  # fine with 8 bits
    fits = np.array([[-65519.0, 0.0, 9.0e5]], np.float32)  # float16 bias and scale finite
    np.testing.assert_array_equal(host(F.quantize_rowwise(on(device, fits), 4)),
                                  ref.quantize_rowwise(fits, 4))
    wide = np.array([[-3e38, 3e38]], np.float32)
    with pytest.raises(ValueError, match="row 0 spans .* max - min overflows float32"):
        F.quantize_rowwise(on(device, wide), 8)
    F.quantize_rowwise(on(device, wide[:, :1]), 8)


def test_bad_packed_tables_and_outputs():
    packed = F.quantize_rowwise(np.ones((3, 4), np.float32), 8)
    with pytest.raises(TypeError, match=r"packed: expected a 2-D uint8 array .* got dtype "
                                        r"float32 and shape \(3, 12\)"):
        F.quantized_embedding([0], packed.astype(np.float32), 8)
    with pytest.raises(TypeError, match="packed: expected a NumPy or CUDA array"):
        F.dequantize_rowwise([[1, 2]], 8)
    with pytest.raises(ValueError, match="at least 8 bytes; got rows of 5"):
        F.dequantize_rowwise(packed[:, :5], 8)
    with pytest.raises(ValueError, match=r"dim: 5 columns take 13 bytes per 8-bit row, but "
                                         r"packed has rows of 12 bytes \(dim 4\)"):
        F.quantized_embedding([0], packed, 8, dim=5)
    four = F.quantize_rowwise(np.ones((3, 4), np.float32), 4)
    with pytest.raises(ValueError, match=r"dim: 6 columns .* \(dim 4 or 3\)"):
        F.dequantize_rowwise(four, 4, dim=6)
    with pytest.raises(ValueError, match=r"padding_idx: 3 is outside \[-3, 3\)"):
        F.quantized_embedding([0], packed, 8, padding_idx=3)
    with pytest.raises(ValueError, match=r"out: expected shape \(1, 4\) and dtype float32"):
        F.quantized_embedding([0], packed, 8, out=np.empty((1, 4), np.float64))
    with pytest.raises(TypeError, match="table: expected dtype float32, float64, bfloat16 or "
                                        "float16, got uint8"):
        F.quantize_rowwise(packed, 8)


# ------------------------------------------------------------------ the module


def test_module_from_an_embedding_keeps_its_padding_and_looks_up_like_the_op(rng):
    emb = nn.Embedding(10, 6, padding_idx=2, seed=0)
    emb.weight.data[2] = rng.normal(size=6)  # a trained padding row: still looked up as 0
    for bits in BITS:
        q = nn.QuantizedEmbedding.from_float(emb, bits=bits)
        assert (q.padding_idx, q.bits, q.num_embeddings, q.embedding_dim) == (2, bits, 10, 6)
        ids = np.array([[2, 3], [9, 2]])
        want = F.quantized_embedding(ids, F.quantize_rowwise(emb.weight.data, bits), bits,
                                     padding_idx=2)
        assert q(ids).tobytes() == want.tobytes() and not q(ids)[0, 0].any()
        assert nn.QuantizedEmbedding.from_float(emb, bits, padding_idx=None)(ids)[0, 0].any()
        assert repr(q) == f"QuantizedEmbedding(10, 6, bits={bits}, padding_idx=2)"


def test_module_from_tables_and_pytorch_modules(rng):
    table = rng.normal(size=(5, 4)).astype(np.float32)
    q = nn.QuantizedEmbedding.from_float(table, bits=4, padding_idx=-1)
    assert q.padding_idx == 4 and q.packed.tobytes() == ref.quantize_rowwise(table, 4).tobytes()
    out = np.empty((2, 4), np.float32)
    assert q([1, 4], out=out) is out and not out[1].any()
    np.testing.assert_array_equal(q.dequantize(), ref.dequantize_rowwise(q.packed, 4, 4))
    torch = pytest.importorskip("torch")
    emb = torch.nn.Embedding(5, 4, padding_idx=1)  # requires grad: read detached
    q = nn.QuantizedEmbedding.from_float(emb)
    assert q.padding_idx == 1
    np.testing.assert_array_equal(q.packed,
                                  ref.quantize_rowwise(emb.weight.detach().numpy(), 8))


def test_module_cannot_be_trained_and_its_state_round_trips(rng):
    q = nn.QuantizedEmbedding.from_float(rng.normal(size=(6, 3)).astype(np.float32), bits=8)
    assert list(q.parameters()) == []
    y = q([1, 2])
    with pytest.raises(RuntimeError, match="cannot be trained .* QuantizedEmbedding.from_float"):
        q.backward(np.ones_like(y))
    state = q.state_dict()
    assert list(state) == ["packed"] and state["packed"].dtype == np.uint8
    fresh = nn.QuantizedEmbedding(6, 3, bits=8)
    assert fresh([1, 2]).tobytes() != y.tobytes()
    fresh.load_state_dict(state)
    assert fresh([1, 2]).tobytes() == y.tobytes()
    with pytest.raises(ValueError, match=r"'packed' has shape \(6, 11\), expected \(6, 6\)"):
        nn.QuantizedEmbedding(6, 3, bits=4).load_state_dict(state)


def test_module_on_cuda(device, rng):
    table = rng.normal(size=(5, 3)).astype(np.float32)
    q = nn.QuantizedEmbedding.from_float(on(device, table), bits=4, padding_idx=0)
    assert q.device == device and numbapos.device_of(q.packed) == device
    got = q(np.array([0, 3]))
    assert host(got).tobytes() == ref.quantized_embedding(
        [0, 3], ref.quantize_rowwise(table, 4), 4, 3, padding_idx=0).tobytes()
    assert host(q.to("cpu")([3])).tobytes() == host(got)[1:].tobytes()


def test_module_argument_errors():
    with pytest.raises(ValueError, match=r"_packed: expected shape \(2, 12\)"):
        nn.QuantizedEmbedding(2, 4, _packed=np.zeros((3, 12), np.uint8))
    with pytest.raises(ValueError, match="bits: expected 8 or 4"):
        nn.QuantizedEmbedding(2, 4, bits=16)
    with pytest.raises(TypeError, match="embedding_or_table: expected"):
        nn.QuantizedEmbedding.from_float("table")


def test_info_lists_the_table_formats_and_their_bounds(capsys):
    from numbapos.__main__ import info

    assert info() == 0
    shown = capsys.readouterr().out
    assert "float32 / float64: 4 D / 8 D bytes; training and inference; exact" in shown
    assert "int8 row-wise (quantize_rowwise(t, 8)): D + 8 bytes; inference only" in shown
    assert "|x - x'| <= (max - min) / 255 / 2" in shown
    assert "int4 row-wise (quantize_rowwise(t, 4)): ceil(D / 2) + 4 bytes" in shown
