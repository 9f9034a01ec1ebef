"""The CPU backend's allocations (kernels/cpu/arrays.py) and the tables modules initialise:
large arrays start on a cache line (numbapos/_alignment.py)."""

import ml_dtypes
import numpy as np
import pytest

import numbapos.functional as F
from numbapos._alignment import ALIGNED_MIN_BYTES, LINE_BYTES
from numbapos.kernels.cpu import arrays

LARGE = ALIGNED_MIN_BYTES


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.uint8,
                                   ml_dtypes.bfloat16])
@pytest.mark.parametrize("shape", [(LARGE,), (LARGE // 64 + 3, 64), (4, 5, LARGE // 16)])
def test_large_arrays_are_cache_line_aligned_and_behave_as_numpys(dtype, shape):
    expected_bytes = np.dtype(dtype).itemsize * int(np.prod(shape))
    made = {"empty": arrays.empty(shape, dtype), "zeros": arrays.zeros(shape, dtype),
            "full": arrays.full(shape, 3, dtype), "full0": arrays.full(shape, 0.0, dtype),
            "full-0": arrays.full(shape, -0.0, dtype)}
    for name, array in made.items():
        assert array.shape == shape and array.dtype == np.dtype(dtype), name
        assert array.nbytes == expected_bytes
        assert array.flags.c_contiguous and array.flags.writeable, name
        assert array.ctypes.data % LINE_BYTES == 0, name
    assert not made["zeros"].any() and not made["full0"].any()
    assert (made["full"] == 3).all()
    if np.dtype(dtype).kind == "f":
        assert np.signbit(made["full-0"]).all() and not np.signbit(made["full0"]).any()
    made["empty"][...] = 1  # writes land in the array itself
    assert (made["empty"] == 1).all()


def test_small_arrays_and_other_shapes():
    assert arrays.empty(5, np.float32).shape == (5,)
    assert arrays.zeros((0, 256), np.float32).shape == (0, 256)
    assert arrays.full((2, 3), 7, np.int32).tolist() == [[7] * 3] * 2
    assert arrays.empty(LARGE // 8, np.float64).shape == (LARGE // 8,)  # an int shape, large


def test_lookup_outputs_numbapos_allocates_are_aligned(rng):
    weight = rng.standard_normal((1000, 256), dtype=np.float32)
    ids = rng.integers(0, 1000, 2048)  # a 2 MB output
    for table, out_dtype in [(weight, None), (weight.astype(ml_dtypes.bfloat16), None),
                             (weight.astype(ml_dtypes.bfloat16), "bfloat16")]:
        out = F.embedding(ids, table, out_dtype=out_dtype)
        assert out.ctypes.data % LINE_BYTES == 0
        np.testing.assert_array_equal(out, table[ids].astype(out.dtype))
    packed = F.quantize_rowwise(weight, 8)
    out = F.quantized_embedding(ids, packed, 8)
    assert out.ctypes.data % LINE_BYTES == 0


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
def test_initialised_tables_are_aligned_and_cast_as_numpy_casts(dtype):
    from numbapos import nn
    from numbapos.nn.init import make_array, normal

    shape = (LARGE // 16, 16)  # 1 MB or more in every dtype
    table = make_array(normal(std=3.0), shape, dtype, np.random.default_rng(5))
    expected = np.array(normal(std=3.0)(shape, np.random.default_rng(5)), dtype=dtype)
    assert table.tobytes() == expected.tobytes()  # the same rounding, bit for bit
    assert table.ctypes.data % LINE_BYTES == 0 and table.flags.c_contiguous
    module = nn.Embedding(LARGE // 64, 64, dtype=np.dtype(dtype).name)
    assert module.weight.data.ctypes.data % LINE_BYTES == 0
    assert module.weight.data.dtype == np.dtype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
def test_large_tables_lie_in_huge_pages_and_behave_as_numpys(dtype, monkeypatch):
    import copy
    import mmap
    import pickle

    from numbapos import _alignment
    from numbapos.nn.bag import EmbeddingBag

    monkeypatch.setattr(_alignment, "HUGE_PAGE_MIN_BYTES", 1 << 20)  # a small "large" table
    values = np.random.default_rng(3).standard_normal((10000, 64))  # >= 1 MB in 16 bits
    table = _alignment.table_copy(values, dtype)
    assert table.tobytes() == values.astype(dtype).tobytes()
    assert table.flags.c_contiguous and table.flags.writeable and table.flags.aligned
    if hasattr(mmap, "MADV_HUGEPAGE"):
        assert table.ctypes.data % _alignment.HUGE_PAGE_BYTES == 0
    for same in (pickle.loads(pickle.dumps(table)), copy.deepcopy(table), table.copy()):
        assert same.tobytes() == table.tobytes()
    bag = EmbeddingBag(5000, 64, mode="sum", seed=0)  # initialised through make_array
    assert bag.weight.data.ctypes.data % LINE_BYTES == 0
    small = _alignment.table_copy(values[:10], dtype)  # below the threshold: NumPy's memory
    assert small.tobytes() == values[:10].astype(dtype).tobytes()
    monkeypatch.delattr(mmap, "MADV_HUGEPAGE", raising=False)  # macOS, Windows
    plain = _alignment.table_copy(values, dtype)
    assert plain.tobytes() == table.tobytes() and plain.ctypes.data % LINE_BYTES == 0
