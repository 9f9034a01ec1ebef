"""CPU launchers and kernels of bfloat16 / float16 tables (lookup and max-norm).

Numba reads neither bfloat16 nor (on the CPU) float16, so the launchers get
a 16-bit table as its ``uint16`` bits (``table.view(np.uint16)``) with a
format code (:data:`~numbapos.kernels.halfbits.BF16` or ``F16``), and a
float32 output as its ``uint32`` bits: a lookup into float32 is then integer
work alone (a bfloat16 row widens with a 16-bit shift, which LLVM vectorises),
and a lookup into the table's own dtype is a plain row copy. The conversions
are the exact ones of :mod:`numbapos.kernels.halfbits`, shared with the CUDA
twin (``kernels/cuda/half.py``: same ``__all__``, same signatures, same bits).

Launchers take validated arrays (indices range-checked) and caller-owned
outputs; the ``@njit`` bodies trust their inputs and never allocate.
"""

import numpy as np
from numba import prange

from .. import halfbits
from ..halfbits import (
    BF16,
    F16,
    f16_to_f32_bits,
    half_from_f32_bits,
    half_from_f32_bits_stochastic,
)
from ..hash import dropout_key, next_column_key, rounding_bits16_at, rounding_row_key
from ..scalar import f32_bits
from ..widen import widen
from .arrays import option, pick
from .embedding import unique_rows
from .jit import kernel
from .prefetch import (
    AHEAD,
    half_prefetch_listed,
    half_prefetch_listed_for_write,
    prefetch_output_ahead,
)
from .rowcopy import put_row, streams

__all__ = ["copy_half_rows", "gather_half_rows", "renorm_half_rows_", "store_half_",
           "store_half_rows_", "widen_half_rows"]

assert halfbits.F16 == 1


# ---------------------------------------------------------------- launchers


def gather_half_rows(flat, table, fmt, out):
    """``out[i] = float32(table[flat[i]])`` as bits: ``table`` ``(V, D)`` uint16 of format
    ``fmt``, ``out`` ``(N, D)`` uint32 (a float32 array's view)."""
    if flat.size and out.shape[1]:
        if fmt == BF16:
            kernel = pick(_widen_bf16, out.size)
        else:
            kernel = pick(_widen_f16, out.size)
        kernel(flat, table, out)


def copy_half_rows(flat, table, out):
    """``out[i] = table[flat[i]]`` for 16-bit rows (``(V, D)`` and ``(N, D)`` uint16): the
    lookup into the table's own dtype, a plain row copy."""
    if flat.size and out.shape[1]:
        stream = option(streams(out.nbytes))
        pick(_copy_rows, out.size)(flat, table, out, stream)


def renorm_half_rows_(table, flat, max_norm, norm_type, fmt):
    """Clip each distinct row of the 16-bit ``table`` (uint16 bits of format ``fmt``) named in
    ``flat`` to ``max_norm``, in place.

    The norm is computed in float64 from the float32 values; a row whose norm
    exceeds ``max_norm`` is multiplied, in float32, by
    ``float32(max_norm / (norm + 1e-7))`` and written back rounded to nearest even.
    """
    if flat.size and table.shape[1]:
        rows = unique_rows(flat)
        pick(_renorm, rows.size * table.shape[1])(
            table, rows, float(max_norm), float(norm_type), option(fmt == F16))


def store_half_(table, values, seed, step, stochastic, fmt):
    """``table[r, d] = round(values[r, d])``: the float32 ``(V, D)`` values (as uint32 bits)
    stored into the 16-bit ``table`` (uint16 bits of format ``fmt``), in place.

    With ``stochastic`` each element rounds stochastically
    (:func:`~numbapos.kernels.halfbits.half_from_f32_bits_stochastic`) with the 16 bits
    of the keyed hash :func:`~numbapos.kernels.hash.rounding_bits` for ``(seed, step, r,
    d)``: the same bits for any thread count and on the GPU. Otherwise to nearest even.
    """
    if table.size:
        rows = np.arange(table.shape[0], dtype=np.int64)
        store_half_rows_(table, values, rows, rows.size, seed, step, stochastic, fmt)


def store_half_rows_(table, values, rows, used, seed, step, stochastic, fmt):
    """:func:`store_half_` for the rows ``rows[:used]`` only (unique; ``used`` an int here, a
    one-element device array or an int on the GPU); the same bits for those rows."""
    if used and table.shape[1]:
        kernel = pick(_store_rows, int(used) * table.shape[1])
        kernel(table, values, rows, np.int64(used), np.uint64(seed), np.uint64(step),
               option(stochastic), np.int64(fmt))


def widen_half_rows(table, rows, used, fmt, out):
    """``out[rows[j]] = float32(table[rows[j]])`` as bits for ``j < used`` (``out`` ``(V, D)``
    uint32; its other rows are left as they are)."""
    if used and table.shape[1]:
        if fmt == BF16:
            kernel = pick(_widen_bf16_at, int(used) * table.shape[1])
        else:
            kernel = pick(_widen_f16_at, int(used) * table.shape[1])
        kernel(rows, np.int64(used), table, out)


# ---------------------------------------------------------------- kernels


@kernel(inline="always")
def _widen_bf16_row(table, r, out, i):
    for d in range(out.shape[1]):
        out[i, d] = np.uint32(table[r, d]) << np.uint32(16)


@kernel(inline="always")
def _widen_f16_row(table, r, out, i):
    for d in range(out.shape[1]):
        out[i, d] = f16_to_f32_bits(table[r, d])


@kernel(parallel=True)
def _widen_bf16(flat_idx, table, out):
    for i in prange(flat_idx.size):
        half_prefetch_listed(table, flat_idx, i + AHEAD)
        prefetch_output_ahead(out, i)
        _widen_bf16_row(table, flat_idx[i], out, i)


@kernel(parallel=True)
def _widen_f16(flat_idx, table, out):
    for i in prange(flat_idx.size):
        half_prefetch_listed(table, flat_idx, i + AHEAD)
        prefetch_output_ahead(out, i)
        _widen_f16_row(table, flat_idx[i], out, i)


@kernel(parallel=True)
def _copy_rows(flat_idx, table, out, stream):
    for i in prange(flat_idx.size):
        half_prefetch_listed(table, flat_idx, i + AHEAD)
        if stream is None:  # (non-temporal stores do not wait on their lines)
            prefetch_output_ahead(out, i)
        put_row(out, i, table, flat_idx[i], stream)


@kernel(inline="always")
def _renorm_row(table, row, max_norm, norm_type, fmt):
    """Clip one row (see :func:`renorm_half_rows_`); the norm summed in float64, in order.
    Elements are read by their bits (:func:`~numbapos.kernels.widen.widen`, vectorised),
    not through ``ldexp`` (``half_value``), which made the pass far slower."""
    dim = table.shape[1]
    acc = 0.0
    if norm_type == np.inf:
        for d in range(dim):
            acc = max(acc, abs(np.float64(widen(table[row, d], fmt))))
        norm = acc
    elif norm_type == 2.0:
        for d in range(dim):
            a = np.float64(widen(table[row, d], fmt))
            acc += a * a
        norm = np.sqrt(acc)
    elif norm_type == 1.0:
        for d in range(dim):
            acc += abs(np.float64(widen(table[row, d], fmt)))
        norm = acc
    else:
        for d in range(dim):
            acc += abs(np.float64(widen(table[row, d], fmt))) ** norm_type
        norm = acc ** (1.0 / norm_type)
    if norm > max_norm:
        scale = np.float32(max_norm / (norm + 1e-7))
        for d in range(dim):
            value = widen(table[row, d], fmt) * scale
            # A NaN (an infinity times a zero scale) as the positive quiet NaN, whatever
            # sign the processor gives it: the bits of the CUDA kernel (f32_value_bits).
            bits = f32_bits(value) if value == value else np.uint32(0x7FC00000)
            table[row, d] = half_from_f32_bits(bits, fmt)


@kernel(inline="always")
def _renorm_entry(table, rows, j, max_norm, norm_type, f16):
    # The format as a constant, so each loop is compiled for one format.
    if f16 is None:
        _renorm_row(table, rows[j], max_norm, norm_type, BF16)
    else:
        _renorm_row(table, rows[j], max_norm, norm_type, F16)


@kernel(parallel=True)
def _renorm(table, rows, max_norm, norm_type, f16):
    for j in prange(rows.size):
        half_prefetch_listed_for_write(table, rows, j + AHEAD)
        _renorm_entry(table, rows, j, max_norm, norm_type, f16)


@kernel(inline="always")
def _store_row(table, values, r, key, stochastic, fmt):
    dim = table.shape[1]
    if stochastic is None:
        for d in range(dim):
            table[r, d] = half_from_f32_bits(values[r, d], fmt)
    else:
        column_key = np.uint64(rounding_row_key(key, r))
        for d in range(dim):
            table[r, d] = half_from_f32_bits_stochastic(values[r, d], fmt,
                                                        rounding_bits16_at(column_key))
            column_key = next_column_key(column_key)


@kernel(parallel=True)
def _store_rows(table, values, rows, used, seed, step, stochastic, fmt):
    key = dropout_key(seed, step)
    for j in prange(used):
        _store_row(table, values, rows[j], key, stochastic, fmt)


@kernel(parallel=True)
def _widen_bf16_at(rows, used, table, out):
    for j in prange(used):
        _widen_bf16_row(table, rows[j], out, rows[j])


@kernel(parallel=True)
def _widen_f16_at(rows, used, table, out):
    for j in prange(used):
        _widen_f16_row(table, rows[j], out, rows[j])
