"""CUDA launchers and kernels of 16-bit tables from float32 values and back.

The twin of ``kernels/cpu/convert.py`` (same ``__all__``, same signatures, the
same bits): bfloat16 / float16 tables arrive as ``uint16`` bits with a format
code, float32 values as ``uint32`` bits, and the conversions are the shared
exact ones of :mod:`numbapos.kernels.halfbits`. A store rounds stochastically
(the keyed hash of ``(seed, step, row, column)``) or to nearest even; the
sparse optimiser steps on 16-bit tables (:mod:`.optim`) round through the same
helpers (:func:`kernel_rounding`, :func:`rounding_key`, :func:`_rounded`).
Nothing is stored while an index error is pending; row counts may stay on the
device.
"""

import numpy as np
from numba import cuda, int64

from ..._args import HalfRounding
from ..._gpuhost import streams
from ..._gpuhost.launch import launch
from ..halfbits import half_from_f32_bits, half_from_f32_bits_stochastic, half_to_f32_bits
from ..hash import rounding_bits
from . import arrays, errors
from .arrays import MAX_BLOCKS, THREADS, grid
from .dropout import counter_key, no_counter

__all__ = ["store_half_", "store_half_rows_", "widen_half_rows"]


# ---------------------------------------------------------------- launchers


def store_half_(table, values, seed, step, stochastic, fmt):
    """Round float32 values into a 16-bit table, in place: ``table[r, d] = round(values[r, d])``.

    ``table`` holds the ``uint16`` bits of format ``fmt``, ``values`` float32 bits
    (``uint32``), both ``(V, D)``. With ``stochastic`` each element rounds with the
    keyed hash of ``(seed, step, r, d)``, else to nearest even: the CPU's bits.
    ``step`` is an int, or a device counter (a ``(1,)`` uint64 device array the
    kernel reads: :class:`.clock.DeviceCounter`). Nothing is stored while an index
    error is pending.
    """
    if table.size:
        launch(_store, grid(table.size), THREADS, table, values,
               _store_rounding(seed, step, stochastic, fmt), errors.device_word())


def store_half_rows_(table, values, rows, used, seed, step, stochastic, fmt):
    """:func:`store_half_` for the rows ``rows[:used]`` only.

    ``used`` is an int or a one-element device array (the count stays on the device).
    """
    if rows.shape[0] and table.shape[1]:
        launch(_store_rows, min(rows.shape[0], MAX_BLOCKS), _row_threads(table.shape[1]), table,
               values, rows, _count(used), _store_rounding(seed, step, stochastic, fmt),
               errors.device_word())


def widen_half_rows(table, rows, used, fmt, out):
    """``out[rows[j]] = float32(table[rows[j]])`` as bits, for ``j < used``.

    ``table`` holds ``uint16`` bits of format ``fmt``, ``out`` float32 bits
    (``uint32``); ``used`` as in :func:`store_half_rows_`.
    """
    if rows.shape[0] and table.shape[1]:
        launch(_widen_at, min(rows.shape[0], MAX_BLOCKS), _row_threads(table.shape[1]), rows,
               _count(used), table, int64(fmt), out)


def kernel_rounding(rounding):
    """``rounding`` (a :class:`~numbapos._args.HalfRounding`) as the kernels take it: the
    format an int64, ``live`` the device counter holding the step, or an empty array
    when the step is the host's (refused in a captured step when stochastic: replays
    would repeat its bits)."""
    live = rounding.live
    if live is None:
        if rounding.stochastic:
            streams.refuse_in_capture(streams.ROUNDING)
        live = no_counter()
    return HalfRounding(int64(rounding.fmt), np.uint64(rounding.seed), np.uint64(rounding.step),
                        bool(rounding.stochastic), live)


def _store_rounding(seed, step, stochastic, fmt):
    """The store kernels' rounding: ``step`` an int, or a device counter (step 0 and live)."""
    if isinstance(step, (int, np.integer)):
        return kernel_rounding(HalfRounding(fmt, seed, step, stochastic))
    return kernel_rounding(HalfRounding(fmt, seed, 0, stochastic, step))


def _count(used):
    """A row count as a one-element device array (ints are copied there)."""
    if isinstance(used, (int, np.integer)):
        return arrays.full((1,), int(used), np.int64)
    return used


def _row_threads(dim: int) -> int:
    """Whole warps covering ``dim``, at most THREADS."""
    return min(THREADS, -(-dim // 32) * 32)


# ---------------------------------------------------------------- kernels


@cuda.jit(device=True)
def rounding_key(rounding):
    """The hash key of a kernel's :class:`~numbapos._args.HalfRounding` (its seed and step,
    the step read from ``live`` when that is not empty)."""
    return counter_key(rounding.seed, rounding.step, rounding.live)


@cuda.jit(device=True)
def _rounded(u, key, row, d, rounding):
    """The float32 bits ``u`` of element ``(row, d)`` rounded to ``rounding.fmt``."""
    if rounding.stochastic:
        return half_from_f32_bits_stochastic(u, rounding.fmt, rounding_bits(key, row, d))
    return half_from_f32_bits(u, rounding.fmt)


@cuda.jit
def _store(table, values, rounding, word):
    """Elementwise :func:`store_half_` (``rounding``: :func:`kernel_rounding`)."""
    if errors.is_pending(word):
        return
    key = rounding_key(rounding)
    dim = table.shape[1]
    for k in range(cuda.grid(1), table.size, cuda.gridsize(1)):
        r = k // dim
        d = k - r * dim
        table[r, d] = _rounded(values[r, d], key, r, d, rounding)


@cuda.jit
def _store_rows(table, values, rows, used, rounding, word):
    """:func:`store_half_rows_`: a block per listed row, threads along D."""
    if errors.is_pending(word):
        return
    key = rounding_key(rounding)
    dim = table.shape[1]
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        r = rows[j]
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            table[r, d] = _rounded(values[r, d], key, r, d, rounding)


@cuda.jit
def _widen_at(rows, used, table, fmt, out):
    """:func:`widen_half_rows`: a block per listed row, threads along D."""
    dim = table.shape[1]
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        r = rows[j]
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            out[r, d] = half_to_f32_bits(table[r, d], fmt)
