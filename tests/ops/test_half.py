"""bfloat16 / float16 tables: the exact bit conversions (against ml_dtypes, NumPy and
PyTorch where installed), lookups into float32 or the table's dtype, padding, max-norm,
float32 gradients, on the CPU and on CUDA (the simulator without a GPU)."""

import warnings

import numpy as np
import pytest
import reference as ref
from conftest import host, on

import numbapos
from numbapos import functional as F
from numbapos import nn
from numbapos.kernels import halfbits

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
HALVES = [BF16, F16]
FORMAT = {BF16: halfbits.BF16, F16: halfbits.F16}


def test_format_codes_agree():
    from numbapos.functional import half

    assert (half.BF16, half.F16) == (halfbits.BF16, halfbits.F16)


def test_is_half_dtype_answers_the_same_when_asked_again():
    from numbapos._checks import is_half_dtype

    cases = [(np.dtype(BF16), True), (np.dtype(F16), True), (np.dtype(">f2"), False),
             (np.dtype(np.uint16), False), (np.dtype(np.float32), False),
             (np.dtype(np.float64), False), (np.dtype([("a", F16)]), False)]
    for _ in range(2):  # the second time from the answers kept per dtype
        assert [is_half_dtype(dtype) for dtype, _ in cases] == [half for _, half in cases]
    assert is_half_dtype(np.float16) and not is_half_dtype(np.uint16)  # types, not dtypes


def _cpu():
    return numbapos._device.kernels_for("cpu")


def _cuda():
    if not numbapos.cuda_available():
        pytest.skip("CUDA is not available (no GPU and the simulator is off)")
    return numbapos._device.kernels_for("cuda")


def _bits(x):
    return np.ascontiguousarray(x).view(np.uint16)


def _special_f32_bits(rng):
    """float32 bit patterns that reach every branch of the casts: ties (exactly half a
    16-bit step) on both parities, just above and below them, NaNs with payloads, both
    infinities, overflow, bfloat16 and float16 subnormals and underflow, random bits."""
    top = np.arange(1 << 16, dtype=np.uint32) << 16
    f16_grid = np.arange(1 << 19, dtype=np.uint32) << 13
    parts = [rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32),
             top, top | 0x8000, top | 0x7FFF, top | 0x8001, top | 0xFFFF,
             f16_grid, f16_grid | 0x1000, f16_grid | 0x0FFF, f16_grid | 0x1001,
             np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0xFFC12345, 0x7F812345,
                       0x7F800000, 0xFF800000, 0x7F7FFFFF, 0x477FF000, 0x477FEFFF,
                       0x33000000, 0x33000001, 0x32FFFFFF, 0x00000001, 0x80000000],
                      dtype=np.uint32)]
    return np.concatenate(parts)


# ------------------------------------------------------------------ bit conversions


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_widening_is_exact_for_every_16_bit_pattern(dtype):
    patterns = np.arange(1 << 16).astype(np.uint16)
    expected = patterns.view(dtype).astype(np.float32).view(np.uint32)
    got = np.empty((1, 1 << 16), np.uint32)
    _cpu().gather_rows(np.zeros(1, np.int64), patterns.reshape(1, -1), got, FORMAT[dtype])
    # NaN payloads are kept: the bits themselves are compared, NaNs included.
    np.testing.assert_array_equal(got[0], expected)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_rounding_matches_ml_dtypes_and_numpy_bit_for_bit(dtype, rng):
    bits = _special_f32_bits(rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = bits.view(np.float32).astype(dtype).view(np.uint16)
    got = _round_bits(bits, FORMAT[dtype])
    nan = np.isnan(bits.view(np.float32))
    np.testing.assert_array_equal(got[~nan], expected[~nan])
    assert np.isnan(got[nan].view(dtype).astype(np.float32)).all()
    if dtype == BF16:  # NaN: the quiet NaN 0x7fc0 with the sign, as ml_dtypes
        np.testing.assert_array_equal(got[nan], expected[nan])


def test_ties_round_to_even():
    # 1 + 2**-8 lies halfway between the bfloat16s 1 and 1 + 2**-7: down to the even 1;
    # 1 + 3 * 2**-8 halfway between 1 + 2**-7 and 1 + 2**-6: up to the even one.
    values = np.array([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 1 + 2**-11, 1 + 3 * 2**-11],
                      np.float32)
    got = _round_bits(values.view(np.uint32), halfbits.BF16)
    np.testing.assert_array_equal(got[:3].view(BF16).astype(np.float32),
                                  [1.0, 1 + 2**-6, -1.0])
    got = _round_bits(values.view(np.uint32), halfbits.F16)
    np.testing.assert_array_equal(got[3:].view(F16).astype(np.float32), [1.0, 1 + 2**-9])


def _round_bits(bits, fmt):
    """The kernels' float32 -> 16-bit rounding of ``bits``, through a compiled helper."""
    from numba import njit

    @njit
    def run(bits, fmt, out):
        for i in range(bits.size):
            out[i] = halfbits.half_from_f32_bits(bits[i], fmt)

    out = np.empty(bits.size, np.uint16)
    run(bits, np.int64(fmt), out)
    return out


def test_the_python_helpers_equal_the_compiled_ones(rng):
    """The simulator runs the helpers as Python (``register_jitable`` keeps the function):
    the same bits as compiled."""
    bits = _special_f32_bits(rng)[:: 997]
    for fmt in (halfbits.BF16, halfbits.F16):
        compiled = _round_bits(bits, fmt)
        python = np.array([halfbits.half_from_f32_bits(int(b), fmt) for b in bits], np.uint16)
        np.testing.assert_array_equal(python, compiled)
        widened = np.array([halfbits.half_to_f32_bits(int(h), fmt) for h in compiled],
                           np.uint32)
        expected = np.empty((1, compiled.size), np.uint32)
        _cpu().gather_rows(np.zeros(1, np.int64), compiled.reshape(1, -1), expected, fmt)
        np.testing.assert_array_equal(widened, expected[0])


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
def test_casts_match_pytorch(name, rng):
    torch = pytest.importorskip("torch")
    dtype = BF16 if name == "bfloat16" else F16
    bits = _special_f32_bits(rng)
    values = bits.view(np.float32)
    got = _round_bits(bits, FORMAT[dtype])
    expected = torch.from_numpy(values.copy()).to(getattr(torch, name)).view(torch.int16)
    expected = expected.numpy().view(np.uint16)
    nan = np.isnan(values)
    np.testing.assert_array_equal(got[~nan], expected[~nan])
    # PyTorch's NaN patterns differ between its scalar and vector paths: any NaN will do.
    assert np.isnan(got[nan].view(dtype).astype(np.float32)).all()
    patterns = np.arange(1 << 16).astype(np.uint16)
    wide = torch.from_numpy(patterns.view(np.int16).copy()).view(getattr(torch, name))
    table = patterns.reshape(1, -1).view(dtype)
    got = F.embedding(np.zeros(1, np.int64), table)[0]
    np.testing.assert_array_equal(got, wide.float().numpy())


# ------------------------------------------------------------------ lookups


def _table(rng, shape, dtype):
    table = rng.normal(size=shape).astype(np.float32)
    table[0, :2] = [np.inf, -0.0]  # special values travel unchanged
    return table.astype(dtype)


def _device_table(device, table):
    """``table`` on ``device`` (a bfloat16 CUDA table is a device array of its dtype)."""
    return on(device, table)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("shape", [(), (5,), (3, 4)], ids=str)
def test_lookup_into_float32_and_into_the_table_dtype(device, dtype, shape, rng):
    table = _table(rng, (11, 9), dtype)
    weight = _device_table(device, table)
    indices = rng.integers(0, 11, size=shape)
    got = F.embedding(on(device, indices), weight)
    assert got.dtype == np.float32 and got.shape == shape + (9,)
    np.testing.assert_array_equal(host(got), ref.half_embedding(indices, table))
    same = F.embedding(on(device, indices), weight, out_dtype=dtype)
    assert same.dtype == dtype
    np.testing.assert_array_equal(_bits(host(same)), _bits(table[indices]))
    out = on(device, np.full(shape + (9,), np.nan, np.float32))
    assert F.embedding(on(device, indices), weight, out=out) is out
    np.testing.assert_array_equal(host(out), ref.half_embedding(indices, table))


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("threshold", [1 << 40, 1], ids=["serial", "parallel"])
def test_serial_and_parallel_lookups_agree(dtype, threshold, parallel_threshold, rng):
    parallel_threshold(threshold)
    table = _table(rng, (300, 70), dtype)
    indices = rng.integers(0, 300, size=2000)
    np.testing.assert_array_equal(F.embedding(indices, table),
                                  ref.half_embedding(indices, table))
    np.testing.assert_array_equal(_bits(F.embedding(indices, table, out_dtype=dtype)),
                                  _bits(table[indices]))


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_padding_idx_returns_the_row_as_stored(device, dtype, rng):
    table = _table(rng, (6, 4), dtype)
    weight = _device_table(device, table)
    got = F.embedding(on(device, np.array([5, 1, 5])), weight, padding_idx=-1)
    np.testing.assert_array_equal(host(got), table[[5, 1, 5]].astype(np.float32))


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("norm_type", [2.0, 1.0, np.inf, 3.0])
def test_max_norm_clips_in_float32_and_rounds_to_nearest_even(device, dtype, norm_type, rng):
    table = (rng.normal(size=(20, 13)) * 2).astype(np.float32).astype(dtype)
    indices = rng.integers(0, 20, size=(4, 6))
    expected_table = table.copy()
    expected = ref.half_embedding(indices, expected_table, max_norm=1.5, norm_type=norm_type)
    weight = _device_table(device, table.copy())
    got = F.embedding(on(device, indices), weight, max_norm=1.5, norm_type=norm_type)
    np.testing.assert_array_equal(host(got), expected)
    np.testing.assert_array_equal(_bits(host(weight)), _bits(expected_table))
    assert not np.array_equal(_bits(expected_table), _bits(table))  # something was clipped


# The simulator's inf * 0, in NumPy scalars on its own threads (np.errstate is per thread).
@pytest.mark.filterwarnings("ignore:.*invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("threads_threshold", [1 << 40, 1], ids=["serial", "parallel"])
def test_max_norm_of_rows_with_an_infinity_or_a_nan(dtype, threads_threshold,
                                                   parallel_threshold):
    """A row with an infinity has an infinite norm: scaled by 0, the infinity becomes the
    positive quiet NaN (whatever sign the processor gives inf * 0) and the rest signed
    zeros; a row with a NaN has a NaN norm and is left alone."""
    parallel_threshold(threads_threshold)
    table = np.array([[1.0, -np.inf, -3.0, 0.5], [np.nan, 5.0, -5.0, 1.0],
                      [0.25, -0.25, 0.0, 0.0]], np.float32).astype(dtype)
    before = _bits(table).copy()
    _cpu().renorm_used_rows_(_bits(table), np.array([0, 1, 2]), 1.0, 2.0, FORMAT[dtype])
    quiet_nan = 0x7FC0 if dtype == BF16 else 0x7E00
    assert _bits(table)[0].tolist() == [0x0000, quiet_nan, 0x8000, 0x0000]
    np.testing.assert_array_equal(_bits(table)[1:], before[1:])
    if numbapos.cuda_available():  # the CUDA twin stores the same bits
        from conftest import dev

        gpu = dev(before)
        _cuda().renorm_used_rows_(gpu, dev(np.array([0, 1, 2])), 1.0, 2.0, FORMAT[dtype])
        np.testing.assert_array_equal(host(gpu), _bits(table))


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_the_cuda_launchers_give_the_cpu_bits(dtype, rng):
    """bfloat16 included: the twins take the tables' bits, whatever their host dtype."""
    from conftest import dev

    K = _cuda()
    table = _bits((rng.normal(size=(30, 37)) * 3).astype(np.float32).astype(dtype))
    indices = rng.integers(0, 30, size=50)
    fmt = FORMAT[dtype]
    wide = np.empty((50, 37), np.uint32)
    _cpu().gather_rows(indices, table, wide, fmt)
    wide_gpu = dev(np.zeros((50, 37), np.uint32))
    K.gather_rows(dev(indices), dev(table), wide_gpu, fmt)
    np.testing.assert_array_equal(host(wide_gpu), wide)
    same = dev(np.zeros((50, 37), np.uint16))
    K.gather_rows(dev(indices), dev(table), same, fmt)
    np.testing.assert_array_equal(host(same), table[indices])
    for norm_type in (2.0, 1.0, np.inf, 3.0):
        cpu_table, gpu_table = table.copy(), dev(table)
        _cpu().renorm_used_rows_(cpu_table, indices, 2.0, norm_type, fmt)
        K.renorm_used_rows_(gpu_table, dev(indices), 2.0, norm_type, fmt)
        np.testing.assert_array_equal(host(gpu_table), cpu_table)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_bad_indices_raise_and_modify_nothing(device, dtype, rng):
    table = _table(rng, (5, 3), dtype)
    weight = _device_table(device, table.copy())
    with pytest.raises(IndexError, match="index 5"):
        F.embedding(on(device, np.array([1, 5])), weight, max_norm=0.1)
        numbapos.synchronize()
    np.testing.assert_array_equal(_bits(host(weight)), _bits(table))


def test_bad_out_dtypes_and_buffers_are_refused(rng):
    table = _table(rng, (5, 3), BF16)
    with pytest.raises(TypeError, match="out_dtype: a bfloat16 table looks up into float32 or"):
        F.embedding(np.array([1]), table, out_dtype=np.float16)
    with pytest.raises(TypeError, match="out_dtype: a float32 table looks up into float32"):
        F.embedding(np.array([1]), table.astype(np.float32), out_dtype="bfloat16")
    with pytest.raises(ValueError, match="dtype float32"):
        F.embedding(np.array([1]), table, out=np.empty((1, 3), BF16))
    with pytest.raises(ValueError, match="read-only"):
        frozen = table.copy()
        frozen.flags.writeable = False
        F.embedding(np.array([1]), frozen, max_norm=1.0)
    with pytest.raises(ValueError, match="C-contiguous"):
        F.embedding(np.array([1]), np.asfortranarray(table), max_norm=1.0)
    # A strided table is looked up as it is (read as a copy).
    strided = _table(rng, (5, 6), BF16)[:, ::2]
    np.testing.assert_array_equal(F.embedding(np.array([4, 0]), strided),
                                  strided[[4, 0]].astype(np.float32))
    assert F.embedding(np.array([1]), table.astype(np.float32), out_dtype="float32").dtype \
        == np.float32


# ------------------------------------------------------------------ the module


@pytest.mark.parametrize("spelling", ["bfloat16", "bf16", BF16, ml_dtypes.bfloat16, "float16",
                                      "half", np.float16, F16], ids=str)
def test_embedding_dtype_spellings(spelling):
    module = nn.Embedding(7, 3, dtype=spelling, seed=5, padding_idx=2)
    expected = BF16 if "b" in str(np.dtype(module.weight.dtype)) else F16
    assert module.weight.dtype == expected
    # Drawn in float32 (the keyed initialiser), rounded to nearest even, padding row zero.
    full = nn.Embedding(7, 3, seed=5, padding_idx=2).weight.data
    np.testing.assert_array_equal(_bits(module.weight.data), _bits(full.astype(expected)))


def test_torch_dtype_spellings():
    torch = pytest.importorskip("torch")
    assert nn.Embedding(2, 2, dtype=torch.bfloat16).weight.dtype == BF16
    assert nn.Embedding(2, 2, dtype=torch.float16).weight.dtype == F16


def test_torch_like_dtype_objects_without_torch():
    """torch dtypes are recognised by their type's module and name, torch never imported."""
    kind = type("dtype", (), {"__module__": "torch", "__str__": lambda self: self.text})

    def fake(text):
        obj = kind()
        obj.text = text
        return obj

    assert nn.Embedding(2, 2, dtype=fake("torch.bfloat16")).weight.dtype == BF16
    assert nn.Embedding(2, 2, dtype=fake("torch.float16")).weight.dtype == F16
    with pytest.raises(TypeError, match="bfloat16 or float16, got torch.int8"):
        nn.Embedding(2, 2, dtype=fake("torch.int8"))


@pytest.mark.parametrize("dtype", HALVES, ids=str)
@pytest.mark.parametrize("sparse", [False, True])
def test_module_lookup_and_float32_gradients(device, dtype, sparse, rng):
    table = _table(rng, (9, 5), dtype)
    module = nn.Embedding.from_pretrained(_device_table(device, table), freeze=False,
                                          padding_idx=3, sparse=sparse)
    assert module.weight.dtype == dtype
    indices = np.array([[1, 3, 1], [8, 1, 0]])
    y = module(on(device, indices))
    assert y.dtype == np.float32
    np.testing.assert_array_equal(host(y), ref.half_embedding(indices, table))
    grad_y = rng.normal(size=y.shape).astype(np.float32)
    assert module.backward(on(device, grad_y)) is None
    grad = module.weight.grad
    dense = host(grad.to_dense()) if sparse else host(grad)
    assert dense.dtype == np.float32
    np.testing.assert_allclose(dense, ref.embedding_backward(grad_y, indices, 9, padding_idx=3),
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="float32"):
        module(on(device, indices))
        module.backward(on(device, grad_y.astype(np.float64)))


def test_gradients_of_a_repeated_id_are_summed_in_float32():
    """PyTorch's bfloat16 table sums 4,096 gradients of 1.0 to 256; numbapos to 4,096."""
    for sparse in (False, True):
        module = nn.Embedding(3, 2, dtype="bfloat16", sparse=sparse, seed=0)
        y = module(np.ones(4096, np.int64))
        module.backward(np.ones_like(y))
        grad = module.weight.grad.to_dense() if sparse else module.weight.grad
        np.testing.assert_array_equal(grad[1], [4096.0, 4096.0])


def test_module_out_dtype_and_max_norm(rng):
    table = (rng.normal(size=(6, 4)) * 3).astype(BF16)
    module = nn.Embedding.from_pretrained(table.copy(), out_dtype="bfloat16", max_norm=1.0,
                                          freeze=False)
    indices = np.array([0, 5, 5])
    y = module(indices)
    expected_table = table.copy()
    expected = ref.half_embedding(indices, expected_table, max_norm=1.0, out_dtype=BF16)
    assert y.dtype == BF16
    np.testing.assert_array_equal(_bits(y), _bits(expected))
    np.testing.assert_array_equal(_bits(module.weight.data), _bits(expected_table))
    module.backward(rng.normal(size=y.shape).astype(np.float32))  # float32 gradients
    assert module.weight.grad.dtype == np.float32
    assert "dtype=bfloat16, out_dtype=bfloat16" in repr(module)
    with pytest.raises(TypeError, match="out_dtype"):
        nn.Embedding(3, 3, out_dtype="bfloat16")


def test_functional_optimiser_ops_point_to_the_optimisers():
    table = nn.Embedding(4, 2, dtype="bfloat16", seed=1).weight.data
    with pytest.raises(TypeError, match="updated by the numbapos.optim optimisers"):
        F.sgd_(table, np.ones((4, 2), np.float32), lr=0.1)


def test_bfloat16_tables_live_on_cuda_as_their_bits():
    _cuda()
    table = nn.Embedding(3, 2, dtype="bfloat16", device="cuda")
    assert table.weight.dtype == BF16 and table.weight.device == "cuda"
    host = numbapos.to_host(table.weight.data)
    assert host.dtype == BF16 and host.shape == (3, 2)


# ------------------------------------------------------------------ checkpoints


def test_checkpoints_keep_16_bit_dtypes(tmp_path, rng):
    pytest.importorskip("safetensors")
    from numbapos import io

    module = nn.Embedding(50, 6, dtype="bfloat16", seed=3)
    state = {"weight": module.weight.data, "f16": rng.normal(size=(3, 2)).astype(F16),
             "f32": np.ones(2, np.float32)}
    path = tmp_path / "half.safetensors"
    io.save_state(state, path)
    kept = io.load_state(path, keep_dtype=True)
    assert kept["weight"].dtype == BF16 and kept["f16"].dtype == F16
    assert kept["f32"].dtype == np.float32
    for name in state:
        np.testing.assert_array_equal(_bits(kept[name]) if name != "f32" else kept[name],
                                      _bits(state[name]) if name != "f32" else state[name])
    widened = io.load_state(path)  # the default: bfloat16 as float32, exact
    assert widened["weight"].dtype == np.float32
    np.testing.assert_array_equal(widened["weight"], state["weight"].astype(np.float32))
    # A bfloat16 module loads the bits at half the memory of float32; a module saves BF16.
    other = nn.Embedding(50, 6, dtype="bfloat16", seed=4)
    other.load_state_dict({"weight": kept["weight"]})
    np.testing.assert_array_equal(_bits(other.weight.data), _bits(module.weight.data))
    assert other.weight.data.nbytes == 50 * 6 * 2
    io.save_state(other, tmp_path / "module.safetensors")
    again = io.load_state(tmp_path / "module.safetensors", keep_dtype=True)["weight"]
    np.testing.assert_array_equal(_bits(again), _bits(module.weight.data))
    pretrained = nn.Embedding.from_pretrained(kept["weight"])
    assert pretrained.weight.data is kept["weight"]
    # float32 values into a bfloat16 table: rounded to nearest even.
    values = rng.normal(size=(50, 6)).astype(np.float32)
    other.load_state_dict({"weight": values})
    np.testing.assert_array_equal(_bits(other.weight.data), _bits(values.astype(BF16)))


def test_pytorch_16_bit_tables_are_viewed_without_a_copy():
    torch = pytest.importorskip("torch")
    for name in ("bfloat16", "float16"):
        table = torch.randn(6, 3).to(getattr(torch, name))
        module = nn.Embedding.from_pretrained(table)
        assert module.weight.dtype == (BF16 if name == "bfloat16" else F16)
        assert np.shares_memory(module.weight.data.view(np.uint16),
                                table.view(torch.int16).numpy())
        ids = torch.tensor([5, 0, 2])
        np.testing.assert_array_equal(module(ids.numpy()),
                                      torch.nn.functional.embedding(ids, table).float().numpy())
    with pytest.raises(TypeError, match="requires grad"):
        nn.Embedding.from_pretrained(torch.ones(2, 2, dtype=torch.bfloat16, requires_grad=True))


# ------------------------------------------------------------------ training


OPTIMISERS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    ("Adam", dict(lr=0.01)),
    ("AdamW", dict(lr=0.01)),
    ("Adagrad", dict(lr=0.1)),
    ("RowWiseAdagrad", dict(lr=0.1)),
]


def _train(module, optimiser, steps, rng_seed=0, fused=False):
    rng = np.random.default_rng(rng_seed)
    handles = optimiser.fuse_with_backward() if fused else None
    for _ in range(steps):
        ids = rng.integers(0, module.num_embeddings, size=(3, 5))
        device = numbapos.device_of(module.weight.data)
        y = module(on(device, ids))
        module.backward(on(device, rng.normal(size=tuple(y.shape)).astype(np.float32)))
        if not fused:
            optimiser.step()
        module.zero_grad()
    if handles is not None:
        handles.remove()


def _rounding_cases():
    """Dense steps for both formats; sparse steps (their own kernels for each format and
    option set: seconds each on a cold cache) with the two formats in turn by default, the
    other format of each under the exhaustive marker."""
    params = []
    for k, (name, options) in enumerate(OPTIMISERS):
        for sparse in (False, True):
            for j, dtype in enumerate(HALVES):
                wanted = not sparse or j == k % len(HALVES)
                params.append(pytest.param(
                    dtype, sparse, name, options, marks=() if wanted else pytest.mark.exhaustive,
                    id="-".join([name, ",".join(f"{a}={b}" for a, b in options.items()),
                                 "sparse" if sparse else "dense", str(dtype)])))
    return params


@pytest.mark.parametrize("dtype, sparse, name, options", _rounding_cases())
def test_every_optimiser_updates_in_float32_and_rounds_to_nearest(dtype, sparse, name, options):
    """stochastic_rounding=False: each step is the float32 update of the widened table
    (float32 state), stored rounded to nearest even: a float32 run rounded after each step."""
    cls = getattr(numbapos.optim, name)
    table = nn.Embedding(20, 6, seed=3).weight.data.astype(dtype)
    half = nn.Embedding.from_pretrained(table.copy(), freeze=False, sparse=sparse)
    opt = cls(half.parameters(), stochastic_rounding=False, **options)
    full = nn.Embedding.from_pretrained(table.astype(np.float32), freeze=False, sparse=sparse)
    reference = cls(full.parameters(), **options)
    rng = np.random.default_rng(1)
    for _ in range(4):
        ids = rng.integers(0, 20, size=(3, 5))
        grad = rng.normal(size=(3, 5, 6)).astype(np.float32)
        for module, optimiser in ((half, opt), (full, reference)):
            module(ids)
            module.backward(grad)
            optimiser.step()
            module.zero_grad()
        full.weight.data[...] = full.weight.data.astype(dtype).astype(np.float32)
    np.testing.assert_array_equal(_bits(half.weight.data), _bits(full.weight.data.astype(dtype)))
    state = opt.state_dict()["state"][0]
    assert state["rounding_step"] == 4
    assert all(v.dtype == np.float32 for v in state.values()
               if isinstance(v, np.ndarray) and v.dtype.kind == "f")


def test_round_to_nearest_stalls_and_stochastic_rounding_does_not():
    """1,000 steps of -1e-5 from 0.02: bfloat16's step there is 2**-13 (1.2e-4), so each
    update is under half a step and round-to-nearest never moves; stochastic rounding
    reaches 0.01 on average."""
    results = {}
    for stochastic in (False, True):
        table = np.full((2, 256), 0.02, np.float32).astype(BF16)
        module = nn.Embedding.from_pretrained(table, freeze=False, sparse=True)
        opt = numbapos.optim.SGD(module.parameters(), lr=1.0, stochastic_rounding=stochastic,
                                 seed=11)
        for _ in range(1000):
            y = module(np.array([0]))
            module.backward(np.full(y.shape, 1e-5, np.float32))
            opt.step()
            module.zero_grad()
        results[stochastic] = module.weight.data.astype(np.float64)
    np.testing.assert_array_equal(results[False][0], np.float32(0.02).astype(BF16))  # 0.02002
    assert results[False][0, 0] == pytest.approx(0.02002, abs=1e-5)
    trained = results[True][0]
    # 256 values, each a sum of 1,000 unbiased roundings: the mean within 1e-4 of 0.01.
    assert abs(trained.mean() - 0.01) < 1e-4
    np.testing.assert_array_equal(results[True][1], np.float32(0.02).astype(BF16))  # unused


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_stochastic_rounding_is_unbiased(dtype, rng):
    """The mean of many stochastic roundings of one float32 value lies within a few
    standard errors (and the 2**-16-step granularity) of the value."""
    values = np.concatenate([rng.normal(size=40), rng.uniform(-1, 1, 10) * 1e-6,
                             [0.02 - 1e-5, 1 / 3, -1e-3]]).astype(np.float32)
    if dtype == F16:
        values[40:50] *= 1e-1  # float16 subnormals
    copies = 2000
    table = np.zeros((copies, values.size), dtype)
    F.store_rounded_(table, np.tile(values, (copies, 1)), seed=5, step=0)
    stored = table.astype(np.float64)
    low = np.minimum.reduce(stored, axis=0)
    high = np.maximum.reduce(stored, axis=0)
    assert ((low <= values) & (values <= high)).all()
    spacing = np.abs(np.spacing(values.astype(dtype)).astype(np.float64))
    assert (high - low <= 2 * spacing + 1e-30).all()  # the two neighbours, or the value
    step = np.maximum(high - low, 1e-45)
    error = np.abs(stored.mean(axis=0) - values)
    # Bernoulli: standard error <= step / (2 sqrt(copies)); 6 of them, plus the 2**-16 grid.
    assert (error <= step * (6 * 0.5 / np.sqrt(copies) + 2.0 ** -16)).all()


def test_stochastic_rounding_is_deterministic_across_threads_and_keyed(parallel_threshold, rng):
    from conftest import two_threads

    values = rng.normal(size=(300, 200)).astype(np.float32)
    results = []
    before = numbapos.get_num_threads()
    try:
        for threads, threshold in ((1, 1 << 40), (two_threads(), 1)):
            parallel_threshold(threshold)
            numbapos.set_num_threads(threads)
            table = np.zeros((300, 200), BF16)
            F.store_rounded_(table, values, seed=9, step=4)
            results.append(_bits(table).copy())
    finally:
        numbapos.set_num_threads(before)
    np.testing.assert_array_equal(results[0], results[1])
    other = np.zeros((300, 200), BF16)
    F.store_rounded_(other, values, seed=9, step=5)  # another step: other bits
    assert not np.array_equal(_bits(other), results[0])
    nearest = np.zeros((300, 200), BF16)
    F.store_rounded_(nearest, values, stochastic_rounding=False)
    np.testing.assert_array_equal(_bits(nearest), _bits(values.astype(BF16)))


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_stochastic_rounding_on_cuda_gives_the_cpu_bits(dtype, rng):
    from conftest import dev

    K = _cuda()
    values = (rng.normal(size=(40, 33)) * 10).astype(np.float32)
    values[0, :3] = [np.inf, np.nan, 1e-30]
    fmt = FORMAT[dtype]
    for stochastic in (True, False):
        cpu = np.zeros((40, 33), np.uint16)
        _cpu().store_half_(cpu, values.view(np.uint32), 7, 3, stochastic, fmt)
        gpu = dev(np.zeros((40, 33), np.uint16))
        K.store_half_(gpu, dev(values.view(np.uint32)), 7, 3, stochastic, fmt)
        np.testing.assert_array_equal(host(gpu), cpu)


def test_training_a_float16_table_on_cuda_matches_the_cpu(rng):
    _cuda()
    results = []
    for device in ("cpu", "cuda"):
        module = nn.Embedding(30, 8, dtype="float16", seed=2, sparse=True, device=device)
        opt = numbapos.optim.Adam(module.parameters(), lr=0.01, seed=4)
        _train(module, opt, 3)
        results.append(_bits(host(module.weight.data)))
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("name, options", [OPTIMISERS[1], OPTIMISERS[2]], ids=["SGD", "Adam"])
def test_fused_steps_and_checkpoints_of_16_bit_tables(name, options):
    cls = getattr(numbapos.optim, name)
    runs = []
    for fused in (False, True):
        module = nn.Embedding(25, 4, dtype="bfloat16", seed=6, sparse=True)
        opt = cls(module.parameters(), seed=3, **options)
        _train(module, opt, 3, fused=fused)
        runs.append((module, opt))
    np.testing.assert_array_equal(_bits(runs[0][0].weight.data), _bits(runs[1][0].weight.data))
    # A resumed run continues bit for bit (the rounding step is part of the state).
    module, opt = runs[0]
    saved_table, saved = module.weight.data.copy(), opt.state_dict()
    _train(module, opt, 2, rng_seed=8)
    resumed = nn.Embedding.from_pretrained(saved_table, freeze=False, sparse=True)
    again = cls(resumed.parameters(), seed=3, **options)
    again.load_state_dict(saved)
    _train(resumed, again, 2, rng_seed=8)
    np.testing.assert_array_equal(_bits(resumed.weight.data), _bits(module.weight.data))


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_row_stores_give_the_full_stores_bits(device, dtype, rng):
    """A sparse step stores only its rows: the same bits as a full store there, the other
    rows untouched; widen_table(rows) widens exactly those rows."""
    table = _table(rng, (12, 7), dtype)
    values = (rng.normal(size=(12, 7)) * 3).astype(np.float32)
    rows = np.array([0, 4, 5, 11])
    full = on(device, table.copy())
    F.store_rounded_(full, on(device, values), seed=3, step=2)
    part = on(device, table.copy())
    F.store_rounded_(part, on(device, values), rows=rows, seed=3, step=2)
    expected = table.copy()
    expected[rows] = host(full)[rows]
    np.testing.assert_array_equal(_bits(host(part)), _bits(expected))
    wide = host(F.widen_table(on(device, table), rows=rows))
    np.testing.assert_array_equal(wide[rows], table[rows].astype(np.float32))
    np.testing.assert_array_equal(host(F.widen_table(on(device, table))),
                                  table.astype(np.float32))
    with pytest.raises(ValueError, match="unique and sorted"):
        F.store_rounded_(part, on(device, values), rows=np.array([4, 0]))


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_the_cuda_row_launchers_give_the_cpu_bits(dtype, rng):
    from conftest import dev

    K = _cuda()
    table = _bits(_table(rng, (20, 9), dtype))
    values = (rng.normal(size=(20, 9)) * 5).astype(np.float32).view(np.uint32)
    rows = np.array([1, 3, 4, 19], np.int64)
    fmt = FORMAT[dtype]
    for stochastic in (True, False):
        cpu = table.copy()
        _cpu().store_half_rows_(cpu, values, rows, 3, 5, 6, stochastic, fmt)
        gpu = dev(table)
        K.store_half_rows_(gpu, dev(values), dev(rows), dev(np.array([3])), 5, 6, stochastic,
                           fmt)
        np.testing.assert_array_equal(host(gpu), cpu)
    cpu = np.zeros((20, 9), np.uint32)
    _cpu().widen_half_rows(table, rows, 4, fmt, cpu)
    gpu = dev(np.zeros((20, 9), np.uint32))
    K.widen_half_rows(dev(table), dev(rows), 4, fmt, gpu)
    np.testing.assert_array_equal(host(gpu), cpu)
