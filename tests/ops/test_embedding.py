"""Embedding lookup, max-norm clipping and the padding mask, against tests/reference.py.

Tests of the ops take the ``device`` fixture (conftest): they run on the CPU and
on CUDA (Numba's simulator without a GPU, so CUDA shapes stay tiny). Tests of
NumPy-only inputs (strided views, read-only flags, lists of floats) and of the
CPU's serial/parallel paths stay on the CPU.
"""

import numpy as np
import pytest
import reference as ref
from conftest import FLOAT_DTYPES, INDEX_DTYPES, device_cases, host, on

import numbapos
import numbapos.functional as F

# The submodule, not the function of the same name that numbapos.functional exports.

SHAPES = [(), (0,), (7,), (3, 4), (2, 3, 5), (2, 0, 3)]


@pytest.mark.parametrize("device, dtype, index_dtype, shape", device_cases(
    [(d, i, s) for d in FLOAT_DTYPES for i in INDEX_DTYPES for s in SHAPES],
    [(d, i, s) for d, i in zip(FLOAT_DTYPES, INDEX_DTYPES, strict=True) for s in SHAPES]),
    indirect=["device"])
def test_lookup_matches_reference(rng, device, dtype, index_dtype, shape):
    weight = rng.normal(size=(11, 6)).astype(dtype)
    indices = rng.integers(0, 11, size=shape).astype(index_dtype)
    out = F.embedding(on(device, indices), on(device, weight))
    assert out.shape == shape + (6,)
    assert out.dtype == dtype
    np.testing.assert_array_equal(host(out), ref.embedding(indices, weight))


def test_empty_indices_give_zero_rows(rng, device):
    weight = on(device, rng.normal(size=(5, 3)).astype(np.float32))
    assert F.embedding(on(device, np.array([], dtype=np.int64)), weight).shape == (0, 3)
    assert F.embedding([], weight).shape == (0, 3)


@pytest.mark.parametrize("index", [np.int64(3), np.int32(3), 3, np.array(3)])
def test_scalar_indices(rng, device, index):
    weight = rng.normal(size=(5, 3))
    out = F.embedding(index, on(device, weight))  # host scalars go to the weight's device
    assert out.shape == (3,)
    np.testing.assert_array_equal(host(out), weight[3])


@pytest.mark.parametrize("index_dtype", [np.int8, np.uint8, np.int16, np.uint32, np.uint64])
def test_other_integer_dtypes_are_accepted(rng, device, index_dtype):
    weight = rng.normal(size=(5, 3))
    indices = np.array([[0, 4], [2, 2]], dtype=index_dtype)
    out = F.embedding(indices, on(device, weight))  # host indices are converted, then moved
    np.testing.assert_array_equal(host(out), weight[indices.astype(int)])
    if device == "cuda":  # already on the GPU they are not converted
        with pytest.raises(TypeError, match="int32 or int64 on the GPU.*cast them first"):
            F.embedding(on(device, indices), on(device, weight))


def test_non_contiguous_inputs(rng):
    weight_full = rng.normal(size=(12, 10)).astype(np.float32)
    weight = weight_full[::2, 1::3]  # strided rows and columns
    indices = rng.integers(0, 6, size=(4, 6))[:, ::2].T  # transposed, strided
    assert not weight.flags.c_contiguous and not indices.flags.c_contiguous
    np.testing.assert_array_equal(F.embedding(indices, weight), weight[indices])


def test_parallel_path_matches_serial(rng, parallel_threshold):
    weight = rng.normal(size=(50, 64)).astype(np.float32)
    indices = rng.integers(0, 50, size=(40, 30))
    big = F.embedding(indices, weight)
    parallel_threshold(1 << 62)
    np.testing.assert_array_equal(big, F.embedding(indices, weight))
    np.testing.assert_array_equal(big, weight[indices])


def test_out_buffer_is_filled_and_returned(rng, device):
    weight = rng.normal(size=(9, 4))
    indices = rng.integers(0, 9, size=(2, 3))
    out = on(device, np.empty((2, 3, 4)))
    result = F.embedding(on(device, indices), on(device, weight), out=out)
    assert result is out
    np.testing.assert_array_equal(host(out), weight[indices])


def test_padding_row_is_returned_as_stored(rng, device):
    weight = rng.normal(size=(10, 3))
    out = F.embedding([8, 1], on(device, weight), padding_idx=-2)
    np.testing.assert_array_equal(host(out)[0], weight[8])


# ------------------------------------------------------------------ max_norm

NORM_TYPES = [2.0, 1.0, 0.5, 3.0, np.inf]


@pytest.mark.parametrize("device, dtype, norm_type", device_cases(
    [(d, n) for d in FLOAT_DTYPES for n in NORM_TYPES],
    [(np.float32, 2.0), (np.float64, 1.0), (np.float32, 0.5), (np.float64, np.inf)]),
    indirect=["device"])
def test_max_norm_matches_reference(rng, device, dtype, norm_type):
    table = (rng.normal(size=(8, 5)) * 3).astype(dtype)
    expected_weight = table.copy()
    indices = np.array([[1, 3, 3], [7, 1, 0]])
    expected = ref.embedding(indices, expected_weight, max_norm=1.5, norm_type=norm_type)
    weight = on(device, table)
    out = F.embedding(on(device, indices), weight, max_norm=1.5, norm_type=norm_type)
    weight = host(weight)
    rtol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(host(out), expected, rtol=rtol)
    np.testing.assert_allclose(weight, expected_weight, rtol=rtol)  # clipped in place
    untouched = [2, 4, 5, 6]
    norms = [ref.row_norm(weight[r], norm_type) for r in (0, 1, 3, 7)]
    assert max(norms) <= 1.5 * (1 + 1e-6)
    assert untouched  # rows never referenced keep their values:
    np.testing.assert_array_equal(weight[untouched], expected_weight[untouched])


# 100_000 ids take the CPU's parallel path; the simulator runs one block per id.
@pytest.mark.parametrize("device, repeats", device_cases([(100_000,)], [(64,)]),
                         indirect=["device"])
def test_repeated_row_is_renormed_once(device, repeats):
    # A racy or per-occurrence renorm would scale row 0 many times (norm -> 1/50, ...).
    weight = on(device, np.array([[30.0, 40.0], [0.1, 0.1]]))
    out = host(F.embedding(on(device, np.zeros(repeats, dtype=np.int64)), weight, max_norm=1.0))
    weight = host(weight)
    np.testing.assert_allclose(weight[0], np.array([0.6, 0.8]) * 50 / (50 + 1e-7), rtol=1e-15)
    np.testing.assert_array_equal(out[-1], weight[0])
    np.testing.assert_array_equal(weight[1], [0.1, 0.1])


def test_rows_below_max_norm_unchanged(device):
    before = np.array([[0.3, 0.4], [30.0, 40.0]], dtype=np.float32)
    weight = on(device, before.copy())
    F.embedding([0], weight, max_norm=1.0)
    np.testing.assert_array_equal(host(weight), before)


def test_from_pretrained_case_norm_type_half(device):
    # PyTorch's documented case: max_norm=2, norm_type=0.5.
    weight = on(device, np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=np.float32))
    out = F.embedding(on(device, np.array([0, 1])), weight, max_norm=2.0, norm_type=0.5)
    np.testing.assert_allclose(host(out), [[0.1163365, 0.2326730, 0.3490095],
                                           [0.1789842, 0.2237303, 0.2684763]], rtol=1e-6)


def test_embedding_renorm_public(rng, device):
    table = rng.normal(size=(6, 4)) * 5
    expected = ref.embedding_renorm_(table.copy(), [1, 2, 2], 1.0)
    weight = on(device, table)
    assert F.embedding_renorm_(weight, on(device, np.array([1, 2, 2])), 1.0) is weight
    np.testing.assert_allclose(host(weight), expected, rtol=1e-14)


@pytest.mark.parametrize("dim", [1, 7, 8, 9, 33, 768, 1003])
@pytest.mark.parametrize("norm_type", [1.0, 2.0])
def test_max_norm_on_rows_of_every_width(rng, dim, norm_type):
    # The CPU sums the 1- and 2-norms in vector lanes (reassociated), so every width,
    # with and without a remainder after the lanes, against NumPy's float64 norm.
    table = rng.normal(size=(50, dim)) * 3
    table[7] = 0.0  # below max_norm: never scaled
    table[9, 0] = np.inf  # an infinite norm: scaled by 1 / inf, as in PyTorch
    ids = rng.integers(0, 50, size=200)
    ids[:2] = 7, 9
    with np.errstate(invalid="ignore"):  # inf * 0 in row 9
        expected = ref.embedding_renorm_(table.copy(), ids, 0.5, norm_type)
    weight = table.copy()
    F.embedding(ids, weight, max_norm=0.5, norm_type=norm_type)
    np.testing.assert_allclose(weight, expected, rtol=1e-14)
    np.testing.assert_array_equal(weight[7], 0.0)
    assert np.isnan(weight[9, 0]) and np.all(weight[9, 1:] == 0)


def test_max_norm_inf_never_clips(rng, device):
    before = rng.normal(size=(4, 3)) * 100
    weight = on(device, before.copy())
    F.embedding([0, 1, 2, 3], weight, max_norm=np.inf)
    np.testing.assert_array_equal(host(weight), before)


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize("bad", [10, 11, -1, 2**40])
def test_out_of_range_index_raises_and_changes_nothing(rng, device, bad):
    before = rng.normal(size=(10, 3)) * 10
    weight = on(device, before.copy())
    indices = np.array([[1, 2], [bad, 3]])
    with pytest.raises(IndexError, match=rf"index {bad} .*num_embeddings=10.*0 <= index < 10"):
        F.embedding(on(device, indices), weight, max_norm=1.0)
        numbapos.synchronize()  # GPU index errors are deferred
    np.testing.assert_array_equal(host(weight), before)  # the renorm had not started


def test_first_bad_index_is_named(rng, device):
    weight = on(device, rng.normal(size=(5, 2)))
    with pytest.raises(IndexError, match=r"index 7 \(at flat position 1\)"):
        F.embedding(on(device, np.array([0, 7, -3, 9])), weight)
        numbapos.synchronize()  # GPU index errors are deferred


@pytest.mark.parametrize("indices", [np.array([1.0, 2.0]), np.array([True, False]), [0.5], True])
def test_non_integer_indices_raise_type_error(rng, device, indices):
    weight = on(device, rng.normal(size=(5, 2)))
    if isinstance(indices, np.ndarray):
        indices = on(device, indices)
    with pytest.raises(TypeError, match="indices"):
        F.embedding(indices, weight)


@pytest.mark.parametrize("device, weight", device_cases(
    [(np.zeros((4, 3), dtype=np.int64),), (np.zeros((4, 3), dtype=np.uint16),), ([[0.0, 1.0]],)],
    [(np.zeros((4, 3), dtype=np.int64),), (np.zeros((4, 3), dtype=np.uint16),)]),
    indirect=["device"])
def test_non_float_weight_raises_type_error(device, weight):
    # (float16 and bfloat16 tables are looked up: tests/ops/test_half.py)
    if isinstance(weight, np.ndarray):
        weight = on(device, weight)
    with pytest.raises(TypeError, match="weight"):
        F.embedding([0], weight)


@pytest.mark.parametrize("shape", [(4,), (2, 3, 4), ()])
def test_weight_not_2d_raises_value_error(device, shape):
    with pytest.raises(ValueError, match=r"weight: expected a 2-D array"):
        F.embedding([0], on(device, np.zeros(shape)))


@pytest.mark.parametrize("padding_idx", [10, -11, 100])
def test_padding_idx_out_of_range(device, padding_idx):
    with pytest.raises(ValueError, match=rf"padding_idx: {padding_idx} is outside \[-10, 10\)"):
        F.embedding([0], on(device, np.zeros((10, 2))), padding_idx=padding_idx)


def test_padding_idx_must_be_integer(device):
    with pytest.raises(TypeError, match="padding_idx"):
        F.embedding([0], on(device, np.zeros((10, 2))), padding_idx=1.5)


@pytest.mark.parametrize("kwargs", [dict(max_norm=0.0), dict(max_norm=-1.0),
                                    dict(max_norm=1.0, norm_type=0.0),
                                    dict(max_norm=1.0, norm_type=-2.0),
                                    dict(max_norm=np.nan)])
def test_bad_norm_options(device, kwargs):
    weight = on(device, np.ones((3, 2)))
    with pytest.raises(ValueError, match="max_norm|norm_type"):
        F.embedding([0], weight, **kwargs)
    np.testing.assert_array_equal(host(weight), np.ones((3, 2)))


# A transposed view is C-contiguous once copied to the GPU: that case is the CPU's.
@pytest.mark.parametrize("device, out", device_cases(
    [(np.empty((2, 4)),), (np.empty((2, 3), dtype=np.float32),), (np.empty((3, 2))[:, ::1].T,)],
    [(np.empty((2, 4)),), (np.empty((2, 3), dtype=np.float32),)]),
    indirect=["device"])
def test_bad_out_buffer(device, out):
    with pytest.raises(ValueError, match="out"):
        F.embedding([0, 1], on(device, np.zeros((5, 3))), out=on(device, out))


def test_out_aliasing_weight_is_refused(device):
    weight = on(device, np.zeros((5, 3)))
    with pytest.raises(ValueError, match="share memory"):
        F.embedding([0, 1], weight, out=weight[:2])


def test_out_aliasing_indices_is_refused(device):
    # out overlapping the ids ahead of the gather would overwrite ids not yet read
    # with float bits: a read far outside the table (segfault) before the check.
    weight = on(device, np.full((4, 1), 1e300))
    buf = on(device, np.zeros(48, dtype=np.int64))
    ids, out = buf[:32], buf[8:40].view(np.float64).reshape(32, 1)
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.embedding(ids, weight, out=out)
    np.testing.assert_array_equal(host(buf), 0)


def test_timedelta_and_ragged_indices_are_refused(device):
    # timedelta64 counts as a NumPy integer and was used as row numbers; a ragged
    # list raised NumPy's message without naming the argument.
    weight = on(device, np.ones((4, 3)))
    with pytest.raises(TypeError, match="indices: expected integer indices .* timedelta64"):
        F.embedding(np.array([1], "m8[s]"), weight)
    with pytest.raises(TypeError, match="indices: expected integer indices .* timedelta64"):
        F.embedding(on(device, np.array([1], "m8[s]")), weight)
    with pytest.raises(ValueError, match="indices: cannot make an array of integer indices"):
        F.embedding([[1], [1, 2]], weight)


def test_read_only_weight_with_max_norm_is_refused():
    # Clipping writes the table: a read-only one raised a Numba typing error.
    weight = np.full((3, 2), 5.0)
    weight.flags.writeable = False
    with pytest.raises(ValueError, match="weight: the array is read-only, but max_norm"):
        F.embedding_renorm_(weight, [0], 1.0)
    with pytest.raises(ValueError, match="weight: the array is read-only, but max_norm"):
        F.embedding([0], weight, max_norm=1.0)
    np.testing.assert_array_equal(F.embedding([0], weight), [[5.0, 5.0]])  # no clipping: fine


def test_renorm_errors_leave_weight_unchanged(device):
    weight = on(device, np.full((3, 2), 5.0))
    with pytest.raises(IndexError):
        F.embedding_renorm_(weight, [0, 3], 1.0)
        numbapos.synchronize()  # GPU index errors are deferred
    with pytest.raises(TypeError, match="max_norm"):
        F.embedding_renorm_(weight, [0], None)
    np.testing.assert_array_equal(host(weight), np.full((3, 2), 5.0))


# ------------------------------------------------------------------ padding mask


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_padding_mask(rng, device, index_dtype):
    ids = rng.integers(0, 4, size=(3, 7)).astype(index_dtype)
    np.testing.assert_array_equal(host(F.padding_mask(on(device, ids), 0)),
                                  ref.padding_mask(ids, 0))
    np.testing.assert_array_equal(host(F.padding_mask(on(device, ids), 3)), ids != 3)


def test_padding_mask_negative_index_needs_vocab(device):
    ids = on(device, np.array([[1, 9, 9]]))
    np.testing.assert_array_equal(host(F.padding_mask(ids, -1, num_embeddings=10)),
                                  [[True, False, False]])
    with pytest.raises(ValueError, match="num_embeddings"):
        F.padding_mask(ids, -1)
    with pytest.raises(TypeError, match="indices"):
        F.padding_mask(on(device, np.array([1.0])), 0)
    with pytest.raises(ValueError, match="padding_idx: expected an integer <="):
        F.padding_mask(ids, 2**64)  # was a Numba typing error


def test_padding_mask_shapes(device):
    assert F.padding_mask(on(device, np.int64(0)), 0).shape == ()
    assert F.padding_mask(on(device, np.zeros((0, 4), dtype=np.int64)), 0).shape == (0, 4)
