"""CUDA launchers and kernels of bfloat16 / float16 tables (lookup and max-norm).

The twin of ``kernels/cpu/half.py`` (same ``__all__``, same signatures, the
same bits): tables arrive as ``uint16`` bits with a format code, float32
outputs as ``uint32`` bits, and the conversions are the shared exact ones of
:mod:`numbapos.kernels.halfbits`. Lookups run one block per output row with
the threads along D and check each id as they read it: a bad one is recorded
in the deferred error word (:mod:`.errors`) and its output row zero-filled.
Max-norm groups the rows on the device (which checks the ids too) and
modifies nothing while an error is pending.

The two lookups move rows by 16-byte vectors (:mod:`.vector`) when the
table's and the output's pointers and row strides are 16-byte aligned and a
row is whole vectors (D % 8 == 0): the copy through the embedding gather's
vector kernel (8 values a vector), the widening by ``_widen_rows_vec`` (one
16-byte load of 8 values, two 16-byte stores of their float32 bits).
Otherwise they run by elements; the bits are the same.
"""

import math

import numpy as np
from numba import cuda, float64, int64

from ..._args import HalfRounding
from ..halfbits import (
    f32_value_bits,
    half_from_f32_bits,
    half_from_f32_bits_stochastic,
    half_to_f32_bits,
    half_value,
)
from ..hash import rounding_bits
from . import arrays, errors, streams, vector
from .arrays import MAX_BLOCKS, THREADS, grid
from .dropout import counter_key, no_counter
from .embedding import (
    _NORM_1,
    _NORM_2,
    _NORM_INF,
    _NORM_P,
    _gather_rows_vec,
    group_rows,
    norm_kind,
)
from .fpmath import mul_rn
from .launch import launch
from .vector import load16, store16

__all__ = ["copy_half_rows", "gather_half_rows", "renorm_half_rows_", "store_half_",
           "store_half_rows_", "widen_half_rows"]


# ---------------------------------------------------------------- launchers


def gather_half_rows(flat, table, fmt, out):
    """``out[i] = float32(table[flat[i]])`` as bits: ``table`` ``(V, D)`` uint16 of format
    ``fmt``, ``out`` ``(N, D)`` uint32 (a float32 array's view)."""
    if flat.size and out.shape[1]:
        word, host = errors.words()
        if vector.aligned(table, out):
            launch(_widen_rows_vec, min(flat.size, MAX_BLOCKS), _row_threads(out.shape[1] // 8),
                   flat, table, int64(fmt), out, word, host, errors.tag())
        else:
            launch(_widen_rows, min(flat.size, MAX_BLOCKS), _row_threads(out.shape[1]), flat,
                   table, int64(fmt), out, word, host, errors.tag())
        errors.after_launch()


def copy_half_rows(flat, table, out):
    """``out[i] = table[flat[i]]`` for 16-bit rows (``(V, D)`` and ``(N, D)`` uint16)."""
    if flat.size and out.shape[1]:
        word, host = errors.words()
        if vector.aligned(table, out):
            pairs = max(1, out.shape[1] // 16)  # the vector gather moves 2 x 8 values a thread
            launch(_gather_rows_vec, min(flat.size, MAX_BLOCKS), _row_threads(pairs), flat,
                   table, out, vector.lanes(table.dtype), word, host, errors.tag())
        else:
            launch(_copy_rows, min(flat.size, MAX_BLOCKS), _row_threads(out.shape[1]), flat,
                   table, out, word, host, errors.tag())
        errors.after_launch()


def renorm_half_rows_(table, flat, max_norm, norm_type, fmt):
    """Clip each distinct row of the 16-bit ``table`` named in ``flat`` to ``max_norm``, in place.

    As the CPU: the norm in float64 from the float32 values, summed in column
    order (every thread of a row's block sums the whole row, so the bits are
    the CPU's), then ``value * float32(max_norm / (norm + 1e-7))`` in float32,
    rounded to nearest even. Nothing is clipped while an index error is pending.
    """
    if flat.size == 0 or table.shape[1] == 0:
        return
    groups = group_rows(flat, None, table.shape[0])
    norm_type = float(norm_type)
    launch(_renorm_rows, min(flat.size, MAX_BLOCKS), _row_threads(table.shape[1]), table,
           groups.rows, groups.used, float(max_norm), norm_kind(norm_type), norm_type,
           int64(fmt), errors.device_word())


def store_half_(table, values, seed, step, stochastic, fmt):
    """``table[r, d] = round(values[r, d])`` (float32 bits into 16-bit ones), in place: the
    CPU's bits (stochastic rounding keyed by ``(seed, step, r, d)``, or to nearest
    even). ``step`` is an int, or a device counter (a ``(1,)`` uint64 device array the
    kernel reads: :class:`.clock.DeviceCounter`). Nothing is stored while an index error
    is pending."""
    if table.size:
        launch(_store, grid(table.size), THREADS, table, values,
               _store_rounding(seed, step, stochastic, fmt), errors.device_word())


def store_half_rows_(table, values, rows, used, seed, step, stochastic, fmt):
    """:func:`store_half_` for the rows ``rows[:used]`` only (``used`` an int or a
    one-element device array: the count stays on the device)."""
    if rows.shape[0] and table.shape[1]:
        launch(_store_rows, min(rows.shape[0], MAX_BLOCKS), _row_threads(table.shape[1]), table,
               values, rows, _count(used), _store_rounding(seed, step, stochastic, fmt),
               errors.device_word())


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


def widen_half_rows(table, rows, used, fmt, out):
    """``out[rows[j]] = float32(table[rows[j]])`` as bits for ``j < used``."""
    if rows.shape[0] and table.shape[1]:
        launch(_widen_at, min(rows.shape[0], MAX_BLOCKS), _row_threads(table.shape[1]), rows,
               _count(used), table, int64(fmt), out)


def _count(used):
    """A row count as a one-element device array (ints are copied there)."""
    if isinstance(used, (int, np.integer)):
        return arrays.full((1,), int(used), np.int64)
    return used


def _row_threads(dim: int) -> int:
    """Whole warps covering ``dim``, at most THREADS."""
    return min(THREADS, -(-dim // 32) * 32)


# ---------------------------------------------------------------- kernels


@cuda.jit
def _widen_rows(flat_idx, table, fmt, out, word, host, which):
    """``out[i, :] = f32 bits of table[flat_idx[i], :]``: a block per output row."""
    dim = out.shape[1]
    for i in range(cuda.blockIdx.x, flat_idx.size, cuda.gridDim.x):
        row = errors.checked(word, host, flat_idx[i], i, table.shape[0], which)
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            if row < 0:
                out[i, d] = 0
            else:
                out[i, d] = half_to_f32_bits(table[row, d], fmt)


@cuda.jit
def _widen_rows_vec(flat_idx, table, fmt, out, word, host, which):
    """:func:`_widen_rows` by vectors (the launcher checked :func:`.vector.aligned`):
    8 columns a thread, one 16-byte load and two 16-byte stores."""
    dim = out.shape[1]
    for i in range(cuda.blockIdx.x, flat_idx.size, cuda.gridDim.x):
        row = errors.checked(word, host, flat_idx[i], i, table.shape[0], which)
        if row < 0:
            for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
                out[i, d] = 0
            continue
        for v in range(cuda.threadIdx.x, dim // 8, cuda.blockDim.x):
            d = 8 * v
            h = load16(table, row, d)
            store16(out, i, d, (half_to_f32_bits(h[0], fmt), half_to_f32_bits(h[1], fmt),
                                half_to_f32_bits(h[2], fmt), half_to_f32_bits(h[3], fmt)))
            store16(out, i, d + 4, (half_to_f32_bits(h[4], fmt), half_to_f32_bits(h[5], fmt),
                                    half_to_f32_bits(h[6], fmt), half_to_f32_bits(h[7], fmt)))


@cuda.jit
def _copy_rows(flat_idx, table, out, word, host, which):
    """``out[i, :] = table[flat_idx[i], :]`` (16-bit rows): a block per output row."""
    dim = out.shape[1]
    for i in range(cuda.blockIdx.x, flat_idx.size, cuda.gridDim.x):
        row = errors.checked(word, host, flat_idx[i], i, table.shape[0], which)
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            if row < 0:
                out[i, d] = 0
            else:
                out[i, d] = table[row, d]


@cuda.jit
def _renorm_rows(table, rows, used, max_norm, kind, norm_type, fmt, word):
    """Clip each listed (unique) row: one block per row, threads along D for the write."""
    if errors.is_pending(word):
        return
    dim = table.shape[1]
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        row = rows[j]
        acc = 0.0
        for d in range(dim):
            a = abs(float64(half_value(table[row, d], fmt)))
            if kind == _NORM_INF:
                acc = max(acc, a)
            elif kind == _NORM_2:
                acc += mul_rn(a, a)  # never fused into the add: the CPU's bits
            elif kind == _NORM_1:
                acc += a
            else:
                acc += a ** norm_type
        if kind == _NORM_2:
            norm = math.sqrt(acc)
        elif kind == _NORM_P:
            norm = acc ** (1.0 / norm_type)
        else:
            norm = acc
        cuda.syncthreads()  # every thread has read the row before any writes it
        if norm > max_norm:
            scale = np.float32(max_norm / (norm + 1e-7))
            for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
                value = np.float32(half_value(table[row, d], fmt) * scale)
                table[row, d] = half_from_f32_bits(f32_value_bits(value), fmt)
        cuda.syncthreads()


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
