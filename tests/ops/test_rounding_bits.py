"""The random bits of stochastic rounding (16-bit tables) against a NumPy / Python-int
reference, and the 32-bit jitted forms (random bits, bfloat16 rounding stochastic and
to nearest) against the Python functions the CUDA simulator runs: every device draws
the same bits for element (row, column) and rounds it the same way."""

import ml_dtypes
import numpy as np
import pytest
from numba import njit
from reference import bf16_round_stochastic, f16_round_stochastic_bits
from reference import rounding_bits16 as reference_bits16

import numbapos.functional as F
from numbapos.kernels.halfbits import (
    F16,
    bf16_from_f32_bits_stochastic,
    f16_from_f32_bits_stochastic,
    f32_bits_to_bf16,
    f32_bits_to_f16,
    half_from_f32_bits_stochastic,
)
from numbapos.kernels.hash import (
    GOLDEN_GAMMA32,
    dropout_key,
    next_column_key,
    rounding_bits,
    rounding_bits16,
    rounding_bits16_at,
    rounding_row_key,
)

BF16 = ml_dtypes.bfloat16


@njit
def _jitted_bits(key, rows, columns):
    out = np.empty(rows.size, np.uint32)
    for i in range(rows.size):
        out[i] = rounding_bits(key, rows[i], columns[i])
    return out


@njit
def _jitted_row(row_key, dim):
    out = np.empty(dim, np.uint32)
    for d in range(dim):  # the vectorised loop of the kernels
        out[d] = rounding_bits16(row_key, d)
    return out


@njit
def _jitted_row_stepped(row_key, first_column, dim):
    out = np.empty(dim, np.uint32)
    column_key = np.uint64(row_key) + np.uint64(first_column) * np.uint64(GOLDEN_GAMMA32)
    for d in range(dim):  # the CPU kernels' loops: the key stepped, not multiplied
        out[d] = rounding_bits16_at(column_key)
        column_key = next_column_key(column_key)
    return out


@njit
def _jitted_bf16(bits, random16):
    out = np.empty(bits.size, np.uint16)
    for i in range(bits.size):
        out[i] = bf16_from_f32_bits_stochastic(bits[i], random16[i])
    return out


@njit
def _jitted_f16(bits, random16):
    out = np.empty(bits.size, np.uint16)
    for i in range(bits.size):  # vectorised, as in the kernels' row loops
        out[i] = half_from_f32_bits_stochastic(bits[i], F16, random16[i])
    return out


@njit
def _jitted_bf16_nearest(bits):
    out = np.empty(bits.size, np.uint16)
    for i in range(bits.size):  # vectorised, as in the kernels' row loops
        out[i] = f32_bits_to_bf16(bits[i])
    return out


@njit
def _jitted_f16_nearest(bits):
    out = np.empty(bits.size, np.uint16)
    for i in range(bits.size):
        out[i] = f32_bits_to_f16(bits[i])
    return out


def test_rounding_bits_match_the_reference_jitted_and_in_python(rng):
    seed, step = 11, 2**40 + 3
    key = dropout_key(np.uint64(seed), np.uint64(step))
    rows = rng.integers(0, 2**40, 300)
    columns = rng.integers(0, 70_000, 300)
    expected = [reference_bits16(seed, step, int(r), int(c))
                for r, c in zip(rows, columns, strict=True)]
    np.testing.assert_array_equal(_jitted_bits(key, rows, columns), expected)
    assert [int(rounding_bits(key, r, c))
            for r, c in zip(rows, columns, strict=True)] == expected
    row_key = rounding_row_key(key, 5)
    np.testing.assert_array_equal(_jitted_row(row_key, 1000),
                                  [reference_bits16(seed, step, 5, d) for d in range(1000)])


@pytest.mark.parametrize("first_column", [0, 2**32 - 3, 2**33 + 5])
def test_stepped_column_keys_give_the_bits_of_rounding_bits16(first_column):
    # The kernels step a 64-bit column key; only its low 32 bits count, so the keys stay
    # right past 2**32 columns' worth of steps (the uint64 wraps, the i32 hash input too).
    key = dropout_key(np.uint64(7), np.uint64(9))
    for row_key in (rounding_row_key(key, 3), np.uint32(2**32 - 1), np.uint32(0)):
        columns = range(first_column, first_column + 600)
        expected = [int(rounding_bits16(row_key, c)) for c in columns]
        np.testing.assert_array_equal(_jitted_row_stepped(row_key, first_column, 600),
                                      expected)
        at = int(row_key) + first_column * GOLDEN_GAMMA32
        assert [int(rounding_bits16_at(at + k * GOLDEN_GAMMA32)) for k in range(600)] == expected


def test_rounding_bits_are_uniform_and_rows_independent():
    key = dropout_key(np.uint64(3), np.uint64(0))
    bits = np.stack([_jitted_row(rounding_row_key(key, r), 512) for r in range(512)])
    assert bits.max() < 2**16
    counts = np.bincount((bits >> 12).ravel(), minlength=16)  # 16 bins of 16,384 expected
    chi2 = (((counts - bits.size / 16) ** 2) / (bits.size / 16)).sum()
    assert chi2 < 45  # 15 degrees of freedom: p < 1e-4
    for bit in range(16):  # every bit is a fair coin
        assert abs(((bits >> bit) & 1).mean() - 0.5) < 0.01
    # Neighbouring rows and columns are uncorrelated.
    x = bits.astype(np.float64) - bits.mean()
    assert abs((x[1:] * x[:-1]).mean() / x.var()) < 0.02
    assert abs((x[:, 1:] * x[:, :-1]).mean() / x.var()) < 0.02


def test_bf16_stochastic_rounding_jitted_equals_python_on_edge_cases(rng):
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 3.3895314e38,
                         -3.3895314e38, 1e-45, -1e-45, 1.0, 1.0000001, -1.9999999],
                        np.float32).view(np.uint32)
    payload_nans = np.array([0x7F800001, 0xFF80FFFF, 0x7FFFFFFF], np.uint32)
    bits = np.concatenate([specials, payload_nans,
                           rng.integers(0, 2**32, 5000, dtype=np.uint64).astype(np.uint32)])
    for random16 in (np.zeros(bits.size, np.uint32), np.full(bits.size, 0xFFFF, np.uint32),
                     rng.integers(0, 2**16, bits.size).astype(np.uint32)):
        python = [int(bf16_from_f32_bits_stochastic(u, r))
                  for u, r in zip(bits, random16, strict=True)]
        np.testing.assert_array_equal(_jitted_bf16(bits, random16), python)
    # random16 = 0 rounds every inexact value away from zero, 0xFFFF truncates it.
    assert int(bf16_from_f32_bits_stochastic(np.uint32(0x3F800001), 0)) == 0x3F81
    assert int(bf16_from_f32_bits_stochastic(np.uint32(0x3F80FFFF), 0xFFFF)) == 0x3F80
    assert int(bf16_from_f32_bits_stochastic(np.uint32(0x3F800000), 0)) == 0x3F80  # exact


def test_bf16_nearest_jitted_equals_python_and_ml_dtypes(rng):
    # Ties either way of even, the largest finite values (rounding up to infinity),
    # subnormals, signed zeros and infinities, NaN payloads (to the quiet NaN, sign kept).
    edges = np.array([0x3F808000, 0x3F818000, 0x3F807FFF, 0xBF808000, 0xBF818001,
                      0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0xFF7F8000, 0x00008000, 0x00018000,
                      0x807FFFFF, 0x00000000, 0x80000000, 0x7F800000, 0xFF800000,
                      0x7F800001, 0x7FC00000, 0xFFFFFFFF, 0xFF80FFFF, 0x7FBFFFFF],
                     np.uint32)
    bits = np.concatenate([edges, rng.integers(0, 2**32, 20_000, dtype=np.uint64)
                           .astype(np.uint32)])
    jitted = _jitted_bf16_nearest(bits)
    np.testing.assert_array_equal(jitted, [int(f32_bits_to_bf16(u)) for u in bits])
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    np.testing.assert_array_equal(jitted[~nan],
                                  bits[~nan].view(np.float32).astype(BF16).view(np.uint16))
    np.testing.assert_array_equal(jitted[nan], ((bits[nan] >> 16) & 0x8000) | 0x7FC0)
    assert jitted[:3].tolist() == [0x3F80, 0x3F82, 0x3F80]  # ties to even, below a tie down
    assert jitted[5:8].tolist() == [0x7F7F, 0x7F80, 0x7F80]  # past the largest: infinity


def _f16_cases(rng, count):
    """float32 bits around float16's range (its subnormals, binade edges, the largest
    finite value, overflow), float32 subnormals, zeros, infinities and NaN payloads, and
    random bits over all float32 values."""
    edges = np.array([0x00000000, 0x80000000, 0x00000001, 0x807FFFFF, 0x33000000,
                      0x33000001, 0x337FFFFF, 0x387FFFFF, 0x38800000, 0x38800001,
                      0x38FFFFFF, 0x3F800000, 0x3F801000, 0x3F800FFF, 0xBF801001,
                      0x477FE000, 0x477FE001, 0x477FEFFF, 0x477FF000, 0x477FFFFF,
                      0x47800000, 0xC7800001, 0x7F7FFFFF, 0x7F800000, 0xFF800000,
                      0x7F800001, 0x7F802000, 0xFFC00000, 0x7FFFFFFF], np.uint32)
    exponents = rng.integers(95, 146, count, dtype=np.uint64)  # 2**-32 .. 2**18
    near_range = ((exponents << 23) | rng.integers(0, 2**23, count, dtype=np.uint64)
                  | (rng.integers(0, 2, count, dtype=np.uint64) << 31))
    anywhere = rng.integers(0, 2**32, count // 4, dtype=np.uint64)
    return np.concatenate([edges, near_range.astype(np.uint32), anywhere.astype(np.uint32)])


def _check_f16_stochastic(bits, random16):
    expected = [f16_round_stochastic_bits(int(u), int(r))
                for u, r in zip(bits, random16, strict=True)]
    np.testing.assert_array_equal(_jitted_f16(bits, random16), expected)
    assert [int(f16_from_f32_bits_stochastic(u, r))
            for u, r in zip(bits, random16, strict=True)] == expected


def test_f16_stochastic_rounding_jitted_and_python_equal_the_float64_rule(rng):
    """The integer rounding (jitted in 32-bit lanes, and in Python for the CUDA simulator)
    makes the float64 comparison's decision for every case."""
    bits = _f16_cases(rng, 6000)
    for random16 in (np.zeros(bits.size, np.uint32), np.full(bits.size, 0xFFFF, np.uint32),
                     rng.integers(0, 2**16, bits.size).astype(np.uint32)):
        _check_f16_stochastic(bits, random16)
    # Thresholds exactly: 1 + 3 * 2**-23 (3 of 2**13 dropped units: up iff random16 < 24).
    one_up = np.array([0x3F800003] * 3, np.uint32)
    assert _jitted_f16(one_up, np.array([23, 24, 0xFFFF], np.uint32)).tolist() == [
        0x3C01, 0x3C00, 0x3C00]
    # The smallest float16 subnormal is 2**-24; 2**-40 of it is still up iff random16 == 0.
    tiny = np.array([0x27800000] * 2, np.uint32)  # 2**-48
    assert _jitted_f16(tiny, np.array([0, 1], np.uint32)).tolist() == [0x0001, 0x0000]


def test_f16_nearest_jitted_equals_python_and_numpy(rng):
    """Rounding to nearest float16 (NumPy's ``npy_floatbits_to_halfbits``), jitted in 32-bit
    lanes: ties to even in the normal and subnormal ranges (where the shift drops up to 11
    bits), overflow, underflow to signed zero, NaN payloads."""
    ties = np.array([0x3F801000, 0x3F803000, 0x38801000, 0x387FF000, 0x37000000, 0x37000001,
                     0x33000000, 0x33000001, 0x32FFFFFF, 0x477FEFFF, 0x477FF000, 0x477FE000,
                     0x33000400, 0x34000200],
                    np.uint32)
    bits = np.concatenate([ties, _f16_cases(rng, 20_000)])
    jitted = _jitted_f16_nearest(bits)
    np.testing.assert_array_equal(jitted, [int(f32_bits_to_f16(u)) for u in bits])
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    with np.errstate(over="ignore"):
        numpy = bits[~nan].view(np.float32).astype(np.float16).view(np.uint16)
    np.testing.assert_array_equal(jitted[~nan], numpy)
    assert jitted[:3].tolist() == [0x3C00, 0x3C02, 0x0400]  # ties to even
    assert jitted[9:12].tolist() == [0x7BFF, 0x7C00, 0x7BFF]  # 65,520 rounds to infinity
    # Subnormal ties decided by bits the shift dropped: above the tie, so up.
    assert jitted[12:14].tolist() == [0x0001, 0x0002]


@pytest.mark.exhaustive
def test_f16_stochastic_rounding_equals_the_float64_rule_on_many_values(rng):
    bits = _f16_cases(rng, 400_000)
    _check_f16_stochastic(bits, rng.integers(0, 2**16, bits.size).astype(np.uint32))


@pytest.mark.parametrize("threads_threshold", [1 << 40, 1], ids=["serial", "parallel"])
def test_store_rounded_bfloat16_is_the_reference_bit_for_bit(threads_threshold, parallel_threshold,
                                                             rng):
    parallel_threshold(threads_threshold)
    values = (rng.normal(size=(40, 96)) * np.logspace(-40, 38, 96)).astype(np.float32)
    values[0, :4] = [np.nan, -np.inf, np.inf, -0.0]
    table = np.zeros(values.shape, BF16)
    F.store_rounded_(table, values, seed=21, step=9)
    np.testing.assert_array_equal(table.view(np.uint16), bf16_round_stochastic(values, 21, 9))
