"""copy_row: one memcpy for contiguous rows, the element loop for any other layout;
put_row: the same copy with non-temporal stores (large lookups)."""

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

import numbapos
import numbapos.functional as F
from numbapos.kernels.cpu import embedding as cpu_embedding
from numbapos.kernels.cpu import rowcopy
from numbapos.kernels.cpu.embedding import gather_rows, gather_rows_checked
from numbapos.kernels.cpu.rowcopy import _memcpy_row, _stream_row, copy_row, put_row


@njit
def _copy_rows(dst, src, rows):
    for i in range(rows.size):
        copy_row(dst, i, src, rows[i])


def _tables():
    rng = np.random.default_rng(0)
    base = rng.normal(size=(12, 10))
    yield "C float64", base
    yield "C float32", base.astype(np.float32)
    yield "int64", np.arange(120, dtype=np.int64).reshape(12, 10)
    yield "column-strided", base[:, ::3]
    yield "transposed", np.asfortranarray(base)
    yield "row-strided", base[::2]
    yield "zero width", base[:, :0]


@pytest.mark.parametrize("name, table", list(_tables()), ids=[n for n, _ in _tables()])
def test_copy_row_matches_fancy_indexing(name, table):
    rows = np.array([3, 0, 5, 5, table.shape[0] - 1], dtype=np.int64)
    before = table.copy()
    for dst in (np.full((rows.size, table.shape[1]), -1, table.dtype),
                np.full((table.shape[1], rows.size), -1, table.dtype).T):  # strided rows
        _copy_rows(dst, table, rows)
        np.testing.assert_array_equal(dst, table[rows])
    np.testing.assert_array_equal(table, before)


def test_copy_row_writes_only_its_row():
    table = np.arange(24, dtype=np.float32).reshape(4, 6)
    dst = np.full((3, 6), -1.0, np.float32)
    _copy_rows(dst[1:2], table, np.array([2]))
    np.testing.assert_array_equal(dst[1], table[2])
    np.testing.assert_array_equal(dst[[0, 2]], -1.0)


@pytest.mark.parametrize("name, table", list(_tables()), ids=[n for n, _ in _tables()])
def test_gather_kernels_on_every_layout(name, table):
    indices = np.array([[1, 4], [4, 0]], dtype=np.int32)
    out = np.empty(indices.shape + (table.shape[1],), table.dtype)
    assert gather_rows_checked(indices, table, out) == -1
    np.testing.assert_array_equal(out, table[indices])
    flat_out = np.empty((indices.size, table.shape[1]), table.dtype)
    gather_rows(indices.reshape(-1), table, flat_out)
    np.testing.assert_array_equal(flat_out, table[indices.reshape(-1)])
    if table.dtype.kind == "f":
        np.testing.assert_array_equal(F.embedding(indices, table), table[indices])


@pytest.mark.parametrize("intrinsic", [_memcpy_row, _stream_row], ids=["memcpy", "stream"])
def test_row_intrinsics_want_two_2d_arrays_of_one_dtype(intrinsic):
    @njit
    def mixed(dst, src):
        intrinsic(dst, 0, src, 0)

    with pytest.raises(TypingError):
        mixed(np.zeros((2, 2), np.float32), np.zeros((2, 2), np.float64))
    with pytest.raises(TypingError):
        mixed(np.zeros(4), np.zeros((2, 2)))


_LAYOUTS = {
    "C": lambda a: a,
    "strided": lambda a: a[:, ::2],
    "Fortran": np.asfortranarray,
    "transposed int32": lambda a: a.astype(np.int32).T,
    "0-d": lambda a: a[2, 3],
    "empty": lambda a: a[:0],
}


@pytest.mark.parametrize("layout", list(_LAYOUTS))
def test_checked_gather_reads_indices_of_any_layout_in_c_order(layout):
    make = _LAYOUTS[layout]
    base = np.arange(24, dtype=np.int64).reshape(4, 6) % 11
    ids = np.asarray(make(base))
    table = np.random.default_rng(1).normal(size=(11, 5)).astype(np.float32)
    out = np.empty(ids.shape + (5,), np.float32)
    assert gather_rows_checked(ids, table, out) == -1
    np.testing.assert_array_equal(out, table[ids])
    np.testing.assert_array_equal(F.embedding(ids, table), table[ids])
    if ids.size:
        last = np.unravel_index(ids.size - 1, ids.shape)  # the last index in C order
        for value in (11, -1):
            bad_base = base.copy()
            bad = np.asarray(make(bad_base))
            if not np.shares_memory(bad, bad_base):  # a copy (astype, asfortranarray)
                bad = bad.copy(order="K")
            bad[last] = value
            assert gather_rows_checked(bad, table, np.empty_like(out)) == ids.size - 1
            with pytest.raises(IndexError, match=str(value)):
                F.embedding(bad, table)


@njit
def _put_rows(dst, src, rows, stream):
    for i in range(rows.size):
        put_row(dst, i, src, rows[i], stream)


@pytest.mark.parametrize("name, table", list(_tables()), ids=[n for n, _ in _tables()])
def test_streamed_rows_match_fancy_indexing(name, table):
    rows = np.array([3, 0, 5, 5, table.shape[0] - 1], dtype=np.int64)
    before = table.copy()
    for dst in (np.full((rows.size, table.shape[1]), -1, table.dtype),
                np.full((table.shape[1], rows.size), -1, table.dtype).T):
        _put_rows(dst, table, rows, True)
        np.testing.assert_array_equal(dst, table[rows])
    np.testing.assert_array_equal(table, before)


@pytest.mark.parametrize("dim", [1, 3, 15, 16, 17, 31, 48, 100, 769])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8])
@pytest.mark.parametrize("shift", [0, 1, 4, 8, 60])
def test_streamed_rows_around_64_byte_boundaries(dim, dtype, shift):
    # Rows start anywhere against a 64-byte line (the head), have any length
    # (whole 64-byte blocks and a tail), and nothing outside a row is written.
    rng = np.random.default_rng(dim)
    table = (rng.normal(size=(7, dim)) * 50).astype(dtype)
    itemsize = np.dtype(dtype).itemsize
    rows = np.array([6, 2, 2, 0, 5], dtype=np.int64)
    size = rows.size * dim * itemsize
    raw = np.zeros(size + 64 + shift + 64, np.uint8)
    start = (-raw.ctypes.data) % 64 + shift
    start += (-start) % itemsize  # the dtype's own alignment
    canary = raw.copy()
    dst = raw[start:start + size].view(dtype).reshape(rows.size, dim)
    _put_rows(dst, table, rows, True)
    np.testing.assert_array_equal(dst, table[rows])
    np.testing.assert_array_equal(raw[:start], canary[:start])
    np.testing.assert_array_equal(raw[start + size:], canary[start + size:])


def test_gather_streams_large_outputs_only(monkeypatch):
    seen = []
    original = cpu_embedding.pick

    def spy(kernels, work):
        kernel = original(kernels, work)
        return lambda *args: (seen.append(args[-1]), kernel(*args))[1]

    monkeypatch.setattr(cpu_embedding, "pick", spy)
    table = np.random.default_rng(2).normal(size=(50, 64)).astype(np.float32)
    ids = np.arange(5000) % 50  # past the small-lookup path, serial and parallel sizes
    F.embedding(ids, table)
    with numbapos.config.override(stream_min_bytes=ids.size * 64 * 4):
        np.testing.assert_array_equal(F.embedding(ids, table), table[ids])
    assert seen == [None, True]
    assert numbapos.config.get("stream_min_bytes") == rowcopy.STREAM_MIN_BYTES == 32 << 20
