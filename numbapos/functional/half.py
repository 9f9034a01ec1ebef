"""bfloat16 / float16 tables: their format code, and their conversions to float32 and back.

A 16-bit table takes half the memory of a float32 one, and a lookup from it
reads half the bytes. NumPy's bfloat16 is ``ml_dtypes.bfloat16`` (the type
safetensors and JAX use); float16 is NumPy's own. Numba reads neither, so the
launchers get the tables' ``uint16`` bits (``table.view(np.uint16)``) and a
format code, and convert with the exact integer operations of
:mod:`numbapos.kernels.halfbits`:

- to float32 (the default result): exact (bfloat16 is a 16-bit shift);
- to the table's dtype (``out_dtype=``): a plain row copy;
- back from float32 (max-norm's clipped rows, a table made from float32):
  round to nearest even, bit for bit ``ml_dtypes`` / NumPy's casts.

:func:`numbapos.functional.embedding` looks such tables up (the kernels'
``gather_rows`` / ``renorm_used_rows_`` with the table's format); the backward
of a lookup is the float32 one (gradients of a 16-bit table are float32, summed
in float32). This module holds the conversions: :func:`widen_table`,
:func:`store_rounded_` and what the optimisers call.
"""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from .._alignment import table_copy
from .._args import TableFormat
from ._common import backend_for, flatten, on_backend

__all__ = ["half_format", "store_rounded_", "store_widened_", "to_table_dtype",
           "widen_table"]

# The launchers' formats of 16-bit tables.
BF16, F16 = TableFormat.BF16, TableFormat.F16

_FLOAT32 = np.dtype(np.float32)
_UINT16, _UINT32 = np.dtype(np.uint16), np.dtype(np.uint32)


def half_format(dtype) -> TableFormat:
    """The launchers' :class:`~numbapos._args.TableFormat` of a 16-bit dtype: BF16 or F16."""
    return F16 if dtype == _checks.FLOAT16 else BF16


def to_table_dtype(values, dtype):
    """``values`` (a float array on the host) as a C-contiguous table of ``dtype``.

    16-bit dtypes round to nearest even (``ml_dtypes`` / NumPy casts, which the
    kernels' conversions match bit for bit). From 1 MB on the table starts on a
    cache line, from 32 MB on it lies in huge pages (:mod:`numbapos._alignment`).
    """
    return table_copy(values, dtype)


def widen_table(table, rows=None):
    """A float32 copy of the 16-bit ``table`` (exact), on its device: the values an
    optimiser updates in float32.

    Parameters
    ----------
    table : ndarray, shape (V, D), bfloat16 or float16
    rows : array of int, optional
        Unique rows to widen; the other rows of the result are left
        uninitialised (a sparse update reads only its rows; on the CPU the
        untouched pages of the ``(V, D)`` result are never even mapped).

    Returns
    -------
    ndarray of float32, shape (V, D)
    """
    table = _check_half(table)
    K = backend_for((table,), ("table",))
    if rows is None:
        return _widen(K, table, None, 0)
    rows = _rows(K, rows, table.shape[0])
    return _widen(K, table, rows, int(rows.shape[0]))


def store_rounded_(table, values, *, rows=None, seed=0, step=0, stochastic_rounding=True):
    """Store the float32 ``values`` into the 16-bit ``table`` in place, rounded.

    With ``stochastic_rounding`` (the default) each element rounds up or down
    at random, with probability given by its distance to the two 16-bit
    neighbours (to 2**-16 of a step), so the stored value's expectation is the
    float32 value and small updates are not lost: the random bits are the
    keyed hash (:mod:`numbapos.kernels.hash`) of ``(seed, step, r, d)``,
    the same for any thread count, with or without ``rows``, and on the GPU.
    Otherwise to nearest even.

    Parameters
    ----------
    table : ndarray, shape (V, D), bfloat16 or float16
        Modified in place; C-contiguous and writeable.
    values : ndarray, shape (V, D), float32
        On ``table``'s device.
    rows : array of int, optional
        Unique rows to store (default: all).
    seed, step : int
        The hash's key (0 <= each < 2**64).
    stochastic_rounding : bool, default True

    Returns
    -------
    ndarray
        ``table``.
    """
    table = _check_half(table)
    _checks.check_writeable(table, "table", "the rounded values are stored into it")
    if not _device.is_c_contiguous(table):
        raise ValueError("table: expected a C-contiguous table (it is written in place)")
    values = _checks.check_float_like(values, "values", tuple(table.shape), _FLOAT32,
                                      "the table's shape", "float32")
    seed = _checks.check_uint64(seed, "seed")
    step = _checks.check_uint64(step, "step")
    K = backend_for((table, values), ("table", "values"))
    if rows is not None:
        rows = _rows(K, rows, table.shape[0])
    _store(K, table, values, rows, None if rows is None else int(rows.shape[0]), seed, step,
           bool(stochastic_rounding))
    return table


def store_widened_(table, values, *, seed=0, step=0, stochastic_rounding=True):
    """Store the float32 copy :func:`widen_table` made of ``table`` back into it, rounded.

    What an optimiser's dense step on a 16-bit table ends with (and the
    storing back of a bfloat16 momentum it widened): :func:`store_rounded_`
    of every row, on arrays the caller has checked. Nothing is checked here,
    so that the checks of a step all come before its first update; and
    ``step`` may be a device counter, as the sparse optimiser ops'
    ``rounding_step`` may.

    Parameters
    ----------
    table : ndarray or CUDA array, shape (V, D), bfloat16 or float16
        A table as ``numbapos._checks.check_table`` returns it, writeable;
        modified in place.
    values : ndarray or CUDA array, shape (V, D), float32
        On ``table``'s device.
    seed : int, default 0
        The stochastic rounding's seed (0 <= seed < 2**64).
    step : int or CUDA array, default 0
        The rounding step (0 <= step < 2**64), or for a CUDA ``table`` a
        device counter (a CUDA array of one uint64 that the kernel reads:
        :func:`numbapos.functional.capture.device_counter`).
    stochastic_rounding : bool, default True
        Round stochastically, keyed by ``(seed, step, r, d)``; False rounds
        to nearest even.

    Returns
    -------
    ndarray or CUDA array
        ``table``.

    Raises
    ------
    RuntimeError
        Stochastic rounding with an integer ``step`` inside a captured GPU
        step (every replay would round with the same bits).
    """
    K = _device.backend(table)
    _store(K, table, values, None, None, seed, step, stochastic_rounding)
    return table


def _check_half(table):
    table = _checks.check_table(table, "table")
    if not _checks.is_half_dtype(table.dtype):
        raise TypeError(f"table: expected a bfloat16 or float16 table, got {table.dtype}")
    return table


def _rows(K, rows, num_rows):
    rows = on_backend(K, rows, "rows")
    flat = K.contiguous(flatten(K, rows))
    if flat.size:
        _checks.check_sorted_rows(flat, num_rows, "rows")
    return flat


def _widen(K, table, rows, used):
    """The float32 copy of ``table`` (rows ``rows[:used]`` only, when given; ``used`` an int or
    a device count): the optimisers' step, on validated arrays."""
    num_rows, dim = table.shape
    out = K.empty((num_rows, dim), _FLOAT32)
    bits = K.contiguous(table).view(_UINT16)
    if rows is None:
        if table.size:
            # Every row, numbered on the table's device (no copy from the host, so that
            # a captured step can widen a table).
            every = K.empty((num_rows,), np.int64)
            K.tile_ids(None, 0, num_rows, every)
            K.gather_rows(every, bits, out.view(_UINT32), half_format(table.dtype))
    else:
        K.widen_half_rows(bits, rows, used, half_format(table.dtype), out.view(_UINT32))
    return out


def widened(K, x):
    """A float32 copy of the 16-bit array ``x`` (any shape, last dimension > 0), exact, on
    K's device: what an op that computes in float32 reads of a 16-bit activation."""
    dim = x.shape[x.ndim - 1]  # (the simulator's shapes take no negative index)
    return _widen(K, K.contiguous(x).reshape((x.size // dim, dim)), None, 0).reshape(x.shape)


def store_nearest_(K, out, values):
    """Store the float32 ``values`` into the C-contiguous 16-bit ``out`` of the same shape
    (last dimension > 0), rounded to nearest even: ``ml_dtypes`` / NumPy's cast, bit for bit."""
    dim = out.shape[out.ndim - 1]
    shape = (out.size // dim, dim)
    _store(K, out.reshape(shape), values.reshape(shape), None, None, 0, 0, False)
    return out


def _store(K, table, values, rows, used, seed, step, stochastic):
    """:func:`store_rounded_` on validated arrays (``rows[:used]`` only, when given)."""
    bits, wide = table.view(_UINT16), K.contiguous(values).view(_UINT32)
    fmt = half_format(table.dtype)
    if rows is None:
        K.store_half_(bits, wide, seed, step, stochastic, fmt)
    else:
        K.store_half_rows_(bits, wide, rows, used, seed, step, stochastic, fmt)
