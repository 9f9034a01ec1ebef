"""CPU launchers and kernels storing 16-bit tables from float32 values and widening them back.

What ``functional.widen_table`` / ``store_rounded_`` and the dense 16-bit
optimiser steps call. A table is its ``uint16`` bits with its format ``fmt``
(:class:`~numbapos._args.TableFormat` ``BF16`` / ``F16``), float32 values their
``uint32`` bits (see :mod:`.embedding`); the conversions are the exact ones of
:mod:`numbapos.kernels.halfbits`, as on the GPU (``kernels/cuda/convert.py``).
"""

import numpy as np
from numba import prange

from ..halfbits import F16, half_from_f32_bits, half_from_f32_bits_stochastic
from ..hash import dropout_key, next_column_key, rounding_bits16_at, rounding_row_key
from .arrays import option, pick
from .embedding import _half_widen_row
from .jit import kernel

__all__ = ["store_half_", "store_half_rows_", "widen_half_rows"]


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
        pick(_widen_at, int(used) * table.shape[1])(rows, np.int64(used), table, out,
                                                    option(fmt == F16))


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
def _widen_at(rows, used, table, out, f16):
    for j in prange(used):
        _half_widen_row(table, rows[j], out, rows[j], f16)
