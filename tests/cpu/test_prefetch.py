"""The row prefetch intrinsics: hints that compile for every table the kernels use."""

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

import numbapos
from numbapos.kernels.cpu import prefetch
from numbapos.kernels.cpu.prefetch import (
    AHEAD,
    half_prefetch_listed,
    half_prefetch_listed_for_write,
    prefetch_listed,
    prefetch_listed_for_write,
    prefetch_output_ahead,
    prefetch_row,
    prefetch_row_for_write,
    read_once_prefetch_listed,
)


@njit
def _gather_with_prefetch(table, rows, out):
    for j in range(rows.size):
        prefetch_listed(table, rows, j + AHEAD)
        prefetch_listed_for_write(out, rows, j + AHEAD)
        prefetch_row(table, rows[j])
        prefetch_row_for_write(out, j)
        out[j] = table[rows[j]]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("dim", [0, 1, 7, 768, 5000])
def test_prefetch_changes_nothing(dtype, dim):
    rng = np.random.default_rng(dim)
    table = rng.normal(size=(50, dim)).astype(dtype)
    rows = rng.integers(0, 50, size=40)
    before = table.copy()
    out = np.empty((50, dim), dtype)
    _gather_with_prefetch(table, rows, out)
    np.testing.assert_array_equal(out[:40], table[rows])
    np.testing.assert_array_equal(table, before)


def test_prefetch_of_strided_and_int_tables():
    table = np.arange(60, dtype=np.int64).reshape(10, 6)[:, ::2]
    out = np.empty((10, 3), np.int64)
    rows = np.array([3, 1, 9], dtype=np.int32)
    _gather_with_prefetch(table, rows, out)
    np.testing.assert_array_equal(out[:3], table[rows])


def test_prefetch_wants_a_2d_table_and_an_integer_row():
    @njit
    def one_d(v):
        prefetch_row(v, 0)

    @njit
    def float_row(v):
        prefetch_row(v, 1.5)

    with pytest.raises(TypingError):
        one_d(np.zeros(4))
    with pytest.raises(TypingError):
        float_row(np.zeros((2, 2)))


@pytest.mark.parametrize("cpu, lines", [("znver3", 64), ("znver5", 64), ("rocketlake", 0),
                                        ("skylake-avx512", 0), ("generic", 0),
                                        ("sapphirerapids", 0), ("emeraldrapids", 0),
                                        ("graniterapids", 0)])
def test_prefetch_policy_by_cpu(cpu, lines):
    with numbapos.config.override(prefetch_lines=None):
        assert prefetch.prefetch_lines(cpu=cpu) == lines


@pytest.mark.parametrize("text, lines", [("0", 0), ("8", 8), ("64", 64)])
def test_prefetch_override(monkeypatch, text, lines):
    monkeypatch.setenv(prefetch.PREFETCH_ENV, text)
    numbapos.config.reset()
    try:
        assert prefetch.prefetch_lines(cpu="znver3") == lines
        assert prefetch.prefetch_lines(cpu="rocketlake") == lines
    finally:
        monkeypatch.undo()
        numbapos.config.reset()
    with numbapos.config.override(prefetch_lines=lines):
        assert prefetch.prefetch_lines(cpu="znver3") == lines


@pytest.mark.parametrize("text", ["-1", "65", "many", ""])
def test_bad_prefetch_override_is_a_value_error_naming_the_variable(monkeypatch, text):
    monkeypatch.setenv(prefetch.PREFETCH_ENV, text)
    numbapos.config.reset()
    try:
        with pytest.raises(ValueError, match="NUMBAPOS_PREFETCH_LINES.*0, 64"):
            prefetch.prefetch_lines()
    finally:
        monkeypatch.undo()
        numbapos.config.reset()


@pytest.mark.parametrize("lines", [0, 4, 64])
def test_prefetch_setting_changes_the_code_not_the_result(monkeypatch, lines):
    monkeypatch.setattr(prefetch, "PREFETCH_LINES", lines)

    @njit  # a fresh function: compiled now, with this setting
    def gather(table, rows, out):
        for j in range(rows.size):
            prefetch_listed(table, rows, j + AHEAD)
            out[j] = table[rows[j]]

    table = np.arange(40.0).reshape(8, 5)
    rows = np.array([7, 0, 3, 3])
    out = np.empty((4, 5))
    gather(table, rows, out)
    np.testing.assert_array_equal(out, table[rows])
    ir = next(iter(gather.inspect_llvm().values()))
    assert ("llvm.prefetch" in ir) == (lines > 0)


def test_kernels_widening_16_bit_rows_prefetch_at_least_eight_lines_unless_set():
    for cpu, lines in [("rocketlake", 8), ("emeraldrapids", 8), ("znver3", 64)]:
        with numbapos.config.override(prefetch_lines=None):
            assert prefetch.half_prefetch_lines(cpu=cpu) == lines
    for lines in (0, 4):
        with numbapos.config.override(prefetch_lines=lines):
            assert prefetch.half_prefetch_lines(cpu="rocketlake") == lines


def _prefetch_calls(function):
    """The ``llvm.prefetch`` calls in a jitted function's IR: ``(read or write, locality)``."""
    ir = next(iter(function.inspect_llvm().values()))
    calls = [line for line in ir.splitlines() if "call void @llvm.prefetch" in line]
    return [tuple(int(x.split()[-1]) for x in line.rsplit("(", 1)[1].split(",")[1:3])
            for line in calls]


@pytest.mark.parametrize("lines", [0, 8])
def test_half_prefetch_setting_changes_the_code_not_the_result(monkeypatch, lines):
    monkeypatch.setattr(prefetch, "HALF_PREFETCH_LINES", lines)

    @njit
    def gather(table, rows, out):
        for j in range(rows.size):
            half_prefetch_listed(table, rows, j + AHEAD)
            half_prefetch_listed_for_write(out, rows, j + AHEAD)
            read_once_prefetch_listed(table, rows, j + AHEAD)
            out[j] = table[rows[j]]

    table = np.arange(2000, dtype=np.uint16).reshape(8, 250)
    rows = np.array([7, 0, 3, 3, 5, 1, 2, 6, 4, 7])
    before = table.copy()
    out = np.zeros((10, 250), np.uint16)
    gather(table, rows, out)
    np.testing.assert_array_equal(out, table[rows])
    np.testing.assert_array_equal(table, before)
    calls = set(_prefetch_calls(gather))
    # (read 0 / write 1, locality 3: prefetcht0 / 0: prefetchnta, the read-once rows)
    assert calls == ({(0, 3), (1, 3), (0, 0)} if lines else set())


@pytest.mark.parametrize("lines", [None, 0, 4])
def test_output_row_prefetch_is_the_same_on_every_cpu(lines):
    """The 16-bit and int8 lookups' output rows, on every CPU; the setting overrides it."""
    with numbapos.config.override(prefetch_lines=lines):
        expected = prefetch.OUTPUT_MIN_LINES if lines is None else lines
        assert prefetch.output_prefetch_lines() == expected


@pytest.mark.parametrize("lines", [0, 16])
def test_output_prefetches_are_writes_within_the_output(monkeypatch, lines):
    for name in ("OUTPUT_PREFETCH_LINES", "PREFETCH_LINES"):
        monkeypatch.setattr(prefetch, name, lines)

    @njit
    def gather(table, rows, out):
        for j in range(rows.size):
            prefetch_listed(table, rows, j + AHEAD)
            prefetch_output_ahead(out, j)
            out[j] = table[rows[j]]

    table = np.arange(3000, dtype=np.float32).reshape(10, 300)
    rows = np.array([9, 0, 4, 4, 2, 7])
    before = table.copy()
    out = np.zeros((6, 300), np.float32)  # the last rows have no row OUTPUT_AHEAD on
    gather(table, rows, out)
    np.testing.assert_array_equal(out, table[rows])
    np.testing.assert_array_equal(table, before)
    assert set(_prefetch_calls(gather)) == ({(0, 3), (1, 3)} if lines else set())
