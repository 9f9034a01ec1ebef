"""A table element as a number and back, whatever the table's storage, for both devices.

Fused kernels that take float32 / float64 tables and bfloat16 / float16 ones
(the BERT / GPT-2 blocks) read every table element through :func:`widen`,
with the tables' format (:class:`numbapos._args.TableFormat`): a float element
is returned as it is, and the ``uint16`` bits of a 16-bit element (what kernels
see of a bfloat16 / float16 table) are widened exactly to float32 with
:mod:`numbapos.kernels.halfbits`. One kernel source then serves every table
format, and a 16-bit table gives bit for bit the results of the float32
kernel on the widened table. :func:`store` is the way back: a float value
goes into a float table as it is and into a 16-bit table rounded (to nearest
even or stochastically), :func:`store_state` likewise into an optimiser state
that may be bfloat16.

Written once and compiled for both targets, as :mod:`numbapos.kernels.scalar`:
a plain Python function (what Numba's CUDA simulator runs) and an overload
that picks the conversion from the element's type when a kernel is compiled.
"""

import numpy as np
from numba import types
from numba.extending import overload, register_jitable

from .._args import TableFormat
from .halfbits import (
    f32_bits_to_bf16,
    half_from_f32_bits,
    half_from_f32_bits_stochastic,
    half_to_f32_bits,
)
from .hash import rounding_bits16_at, rounding_row_key
from .scalar import f32_bits, f32_from_bits

__all__ = []  # device helpers, not launchers

# The format of float32 / float64 tables (read as they are), TableFormat.FLOAT as an int
# (see halfbits.BF16); 16-bit tables have halfbits.BF16 / F16.
FLOAT_TABLES = int(TableFormat.FLOAT)


def widen(x, fmt):
    """``x`` as a number: a float as it is; ``uint16`` bits of format ``fmt`` as float32."""
    if isinstance(x, (np.integer, int)):
        return f32_from_bits(half_to_f32_bits(x, fmt))
    return x


@overload(widen, target="generic", inline="always")
def _widen(x, fmt):
    if isinstance(x, types.Integer):
        return lambda x, fmt: f32_from_bits(half_to_f32_bits(x, fmt))
    if isinstance(x, types.Float):
        return lambda x, fmt: x
    return None


def store(table, row, d, value, column_key, stochastic, fmt):
    """``table[row, d] = value``: as it is into a float table; into a 16-bit table's bits
    (format ``fmt``) rounded to nearest even, or, with ``stochastic`` not None, with the
    16 random bits :func:`~numbapos.kernels.hash.rounding_bits16_at` of ``column_key``
    (the row's :func:`~numbapos.kernels.hash.rounding_row_key` stepped by
    :func:`~numbapos.kernels.hash.next_column_key` once per column, as
    ``store_half_rows_`` rounds)."""
    if isinstance(table[row, d], (np.integer, int)):
        table[row, d] = _rounded(value, column_key, stochastic, fmt)
    else:
        table[row, d] = value


@register_jitable
def _rounded(value, column_key, stochastic, fmt):
    u = f32_bits(value)
    if stochastic is None:
        return half_from_f32_bits(u, fmt)
    return half_from_f32_bits_stochastic(u, fmt, rounding_bits16_at(column_key))


@overload(store, target="generic")
def _store(table, row, d, value, column_key, stochastic, fmt):
    if isinstance(table.dtype, types.Integer):
        def store_half(table, row, d, value, column_key, stochastic, fmt):
            table[row, d] = _rounded(value, column_key, stochastic, fmt)
        return store_half

    def store_float(table, row, d, value, column_key, stochastic, fmt):
        table[row, d] = value
    return store_float


def store_state(state, row, d, value):
    """``state[row, d] = value``: as it is into a float optimiser state, rounded to nearest
    even into a bfloat16 one (its ``uint16`` bits; read back with ``widen(x, BF16)``)."""
    if isinstance(state[row, d], (np.integer, int)):
        state[row, d] = f32_bits_to_bf16(f32_bits(value))
    else:
        state[row, d] = value


@overload(store_state, target="generic")
def _store_state(state, row, d, value):
    if isinstance(state.dtype, types.Integer):
        def store_bf16(state, row, d, value):
            state[row, d] = f32_bits_to_bf16(f32_bits(value))
        return store_bf16

    def store_float(state, row, d, value):
        state[row, d] = value
    return store_float


def first_column_key(key, row, stochastic):
    """The :func:`store` key of column 0 of row ``row`` (then stepped by
    :func:`~numbapos.kernels.hash.next_column_key`): the row's
    :func:`~numbapos.kernels.hash.rounding_row_key` under the call key ``key`` with
    ``stochastic`` rounding, else 0 (nothing reads it: a kernel compiled for a float
    table or for rounding to nearest holds no hash)."""
    return np.uint64(0) if stochastic is None else np.uint64(rounding_row_key(key, row))


@overload(first_column_key, target="generic")
def _first_column_key(key, row, stochastic):
    if isinstance(stochastic, types.NoneType):
        return lambda key, row, stochastic: np.uint64(0)
    return lambda key, row, stochastic: np.uint64(rounding_row_key(key, row))
