"""CPU kernels of sparse optimiser steps on bfloat16 / float16 tables, one pass per step.

Each listed row is read as its ``uint16`` bits, every element widened to
float32 in a register (:mod:`numbapos.kernels.halfbits`, then a bit cast),
updated with the float32 state by the element updates the float tables use
(:mod:`numbapos.kernels.updates`) and stored back rounded: stochastically,
with the keyed hash of ``(seed, step, row, column)``
(:func:`~numbapos.kernels.hash.rounding_bits`), or to nearest even.
No float32 copy of the table is made, and the bits are those of widening the
rows, running the float32 update and storing them rounded
(``functional.widen_table``, the float launchers, ``store_rounded_``), for
any thread count and on the GPU (``kernels/cuda/halfoptim.py``: same names,
same signatures, same bits).

Each launcher is the 16-bit twin of the float launcher of :mod:`.optim` with
the same arguments plus ``rounding`` (:class:`~numbapos._args.HalfRounding`).
SGD's momentum buffer and Adam's ``exp_avg`` may be float32 or bfloat16 (given
as its ``uint16`` bits): a bfloat16 one is widened exactly, updated in float32
and stored back rounded to nearest even (:func:`_load_state` /
:func:`_store_state`). The launchers:
``*_half_rows_`` take summed gradient rows, ``*_half_row_groups_`` a lookup's
unsummed gradient, each row summed into per-chunk scratch
(:func:`.embedding.group_gradient`) just before its update.
"""

import numba
import numpy as np
from numba import prange

from ..._args import WeightDecayMode
from .. import updates
from ..halfbits import (
    BF16,
    F16,
    bf16_to_f32_bits,
    f32_bits_to_bf16,
    half_from_f32_bits,
    half_from_f32_bits_stochastic,
    half_to_f32_bits,
)
from ..hash import dropout_key, next_column_key, rounding_bits16_at, rounding_row_key
from ..scalar import f32_bits, f32_from_bits
from .arrays import option, pick, runs_parallel
from .embedding import group_gradient
from .jit import kernel
from .prefetch import AHEAD, half_prefetch_listed_for_write

__all__ = ["adagrad_half_row_groups_", "adagrad_half_rows_", "adam_half_row_groups_",
           "adam_half_rows_", "rowwise_adagrad_half_row_groups_", "rowwise_adagrad_half_rows_",
           "sgd_half_row_groups_", "sgd_half_rows_"]

_L2 = int(WeightDecayMode.L2)


# ---------------------------------------------------------------- launchers


def sgd_half_rows_(table, rows, values, used, buf, row_started, hyper, rounding):
    """Lazy SGD (:func:`.optim.sgd_rows_`) on the listed rows of the 16-bit ``table``
    (``uint16`` bits), float32 ``values``, ``buf`` and ``hyper``; stored per ``rounding``."""
    _rows(_sgd, table, rows, values, used, rounding, *_sgd_state(buf, row_started, hyper))


def sgd_half_row_groups_(table, grad, groups, scale_grad_by_freq, buf, row_started, hyper,
                         rounding):
    """:func:`sgd_half_rows_` fused with the gradient of a lookup (see
    :func:`.optim.sgd_row_groups_`)."""
    _groups(_sgd, table, grad, groups, scale_grad_by_freq, rounding,
            *_sgd_state(buf, row_started, hyper))


def adam_half_rows_(table, rows, values, used, exp_avg, exp_avg_sq, hyper, rounding):
    """SparseAdam (:func:`.optim.adam_rows_`) on the listed rows of the 16-bit ``table``
    (``exp_avg`` float32, or bfloat16 as ``uint16`` bits)."""
    _rows(_adam, table, rows, values, used, rounding, exp_avg, _bf16_state(exp_avg), exp_avg_sq,
          hyper)


def adam_half_row_groups_(table, grad, groups, scale_grad_by_freq, exp_avg, exp_avg_sq, hyper,
                          rounding):
    """:func:`adam_half_rows_` fused with the gradient of a lookup."""
    _groups(_adam, table, grad, groups, scale_grad_by_freq, rounding, exp_avg,
            _bf16_state(exp_avg), exp_avg_sq, hyper)


def adagrad_half_rows_(table, rows, values, used, state_sum, hyper, rounding):
    """Sparse Adagrad (:func:`.optim.adagrad_rows_`) on the listed rows of the 16-bit ``table``."""
    _rows(_adagrad, table, rows, values, used, rounding, state_sum, hyper)


def adagrad_half_row_groups_(table, grad, groups, scale_grad_by_freq, state_sum, hyper,
                             rounding):
    """:func:`adagrad_half_rows_` fused with the gradient of a lookup."""
    _groups(_adagrad, table, grad, groups, scale_grad_by_freq, rounding, state_sum, hyper)


def rowwise_adagrad_half_rows_(table, rows, values, used, state_sum, hyper, rounding):
    """Row-wise Adagrad (:func:`.optim.rowwise_adagrad_rows_`) on the listed rows of the
    16-bit ``table``; each row's mean square summed in column order, as there."""
    _rows(_rowwise, table, rows, values, used, rounding, state_sum, hyper)


def rowwise_adagrad_half_row_groups_(table, grad, groups, scale_grad_by_freq, state_sum, hyper,
                                     rounding):
    """:func:`rowwise_adagrad_half_rows_` fused with the gradient of a lookup."""
    _groups(_rowwise, table, grad, groups, scale_grad_by_freq, rounding, state_sum, hyper)


def _sgd_state(buf, row_started, hyper):
    """SGD's state arguments: the buffer is None without momentum (then its bfloat16 flag
    too), and ``general`` None for SGD's usual options (no Nesterov, maximize or weight
    decay): each compiles its own loop, as :func:`.optim._sgd_variant` explains."""
    usual = not (hyper.nesterov or hyper.maximize or hyper.weight_decay != 0)
    if hyper.momentum == 0:
        return None, None, row_started, option(not usual), hyper
    return buf, _bf16_state(buf), row_started, option(not usual), hyper


def _bf16_state(state):
    """The kernels' flag for a state array: True for bfloat16 bits (``uint16``), None for
    float32."""
    return option(state.dtype == np.uint16)


def _rows(kernels, table, rows, values, used, rounding, *rest):
    rows, values = rows[:used], values[:used]  # exact on the CPU: used == rows.size
    _run(kernels, table, rows, values, None, None, False, rounding, rest)


def _groups(kernels, table, grad, groups, scale_grad_by_freq, rounding, *rest):
    # No summed values: an empty array (the kernels' ``groups is None`` branches must type).
    _run(kernels, table, groups.rows, np.empty((0, table.shape[1]), np.float32), grad, groups,
         scale_grad_by_freq, rounding, rest)


def _run(kernels, table, rows, values, grad, groups, scale, rounding, rest):
    """``kernel(table, rows, values, grad, groups, scale, scratch, seed, step, stochastic, f16,
    *rest)`` over chunks of the rows: one chunk for small work (the serial kernel of the
    ``kernels`` pair), else a few per thread (the parallel one), each summing its rows'
    gradients (a lookup's) into its row of scratch."""
    used, dim = rows.size, table.shape[1]
    if used == 0 or dim == 0:
        return
    work = used * dim
    chunks = min(used, 4 * numba.get_num_threads()) if runs_parallel(work) else 1
    scratch = np.empty((chunks, dim if groups is not None else 0), np.float32)
    pick(kernels, work)(
        table, rows, values, grad, groups, option(scale), scratch, np.uint64(rounding.seed),
        np.uint64(rounding.step), option(rounding.stochastic), option(rounding.fmt == F16),
        *rest)


# ---------------------------------------------------------------- elements


@kernel(inline="always")
def _load(table, row, d, fmt):
    # Element (row, d) as a float32 value (exact).
    return f32_from_bits(half_to_f32_bits(table[row, d], fmt))


@kernel(inline="always")
def _store(table, row, d, value, column_key, stochastic, fmt):
    # The float32 ``value`` into element (row, d), rounded as store_half_rows_ rounds it:
    # stochastically with rounding_bits16_at(column_key), the loops stepping column_key
    # from the row's rounding_row_key (one 64-bit hash per row) by next_column_key.
    u = f32_bits(value)
    if stochastic is None:
        table[row, d] = half_from_f32_bits(u, fmt)
    else:
        table[row, d] = half_from_f32_bits_stochastic(u, fmt, rounding_bits16_at(column_key))


@kernel(inline="always")
def _load_state(state, row, d, bf16):
    # Element (row, d) of a float32 state, or of a bfloat16 one (its bits), as float32.
    if bf16 is None:
        return state[row, d]
    return f32_from_bits(bf16_to_f32_bits(state[row, d]))


@kernel(inline="always")
def _store_state(state, row, d, value, bf16):
    # The float32 ``value`` into a float32 state, or into a bfloat16 one rounded to nearest.
    if bf16 is None:
        state[row, d] = value
    else:
        state[row, d] = f32_bits_to_bf16(f32_bits(value))


@kernel(inline="always")
def _bounds(chunk, used, chunks):
    return chunk * used // chunks, (chunk + 1) * used // chunks


@kernel(inline="always")
def _gradient(j, values, grad, groups, scale, acc):
    # Row j's gradient: given (summed rows), or summed from a lookup's positions.
    if groups is None:
        return values[j]
    return group_gradient(grad, groups, j, scale, acc)


# The kernels take ``f16`` (None for bfloat16) and call their row update with the
# format as a constant, so each loop is compiled for one format: bfloat16's
# widening is then a shift and its stochastic rounding a compare, both vectorised.

# ---------------------------------------------------------------- SGD


@kernel(inline="always")
def _sgd_row(row, g, table, buf, bf16_buf, started, h, nesterov, maximize, decay, key,
             stochastic, fmt):
    column_key = np.uint64(rounding_row_key(key, row))
    if buf is None:
        for d in range(table.shape[1]):
            p = updates.sgd_plain_update(_load(table, row, d, fmt), g[d], h, maximize, decay)
            _store(table, row, d, p, column_key, stochastic, fmt)
            column_key = next_column_key(column_key)
    else:
        first = not started[row]
        for d in range(table.shape[1]):
            p, b = updates.sgd_momentum_update(_load(table, row, d, fmt), g[d],
                                               _load_state(buf, row, d, bf16_buf), h, first,
                                               nesterov, maximize, decay)
            _store_state(buf, row, d, b, bf16_buf)
            _store(table, row, d, p, column_key, stochastic, fmt)
            column_key = next_column_key(column_key)
        started[row] = True


@kernel(inline="always")
def _sgd_options_row(row, g, table, buf, bf16_buf, started, general, h, key, stochastic, fmt):
    # SGD's usual options as constants (they then pay for no selects), or any.
    if general is None:
        _sgd_row(row, g, table, buf, bf16_buf, started, h, False, False, False, key,
                 stochastic, fmt)
    else:
        _sgd_row(row, g, table, buf, bf16_buf, started, h, h.nesterov, h.maximize,
                 h.weight_decay != 0, key, stochastic, fmt)


@kernel(inline="always")
def _sgd_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key, stochastic, f16,
               buf, bf16_buf, started, general, h):
    lo, hi = _bounds(chunk, rows.size, scratch.shape[0])
    for j in range(lo, hi):
        half_prefetch_listed_for_write(table, rows, j + AHEAD)
        if buf is not None:
            half_prefetch_listed_for_write(buf, rows, j + AHEAD)
        g = _gradient(j, values, grad, groups, scale, scratch[chunk])
        if f16 is None:
            _sgd_options_row(rows[j], g, table, buf, bf16_buf, started, general, h, key,
                             stochastic, BF16)
        else:
            _sgd_options_row(rows[j], g, table, buf, bf16_buf, started, general, h, key,
                             stochastic, F16)


@kernel(parallel=True)
def _sgd(table, rows, values, grad, groups, scale, scratch, seed, step, stochastic, f16, buf,
         bf16_buf, started, general, h):
    # Rows are unique, so chunks never share a row (nor its momentum or flag).
    key = dropout_key(seed, step)
    for chunk in prange(scratch.shape[0]):
        _sgd_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key, stochastic,
                   f16, buf, bf16_buf, started, general, h)


# ---------------------------------------------------------------- Adam


@kernel(inline="always")
def _adam_row(row, g, table, exp_avg, bf16_avg, exp_avg_sq, h, key, stochastic, fmt):
    l2, decoupled = updates.adam_decay_flags(h)
    column_key = np.uint64(rounding_row_key(key, row))
    for d in range(table.shape[1]):
        p, m, exp_avg_sq[row, d] = updates.sparse_adam_update(
            _load(table, row, d, fmt), g[d], _load_state(exp_avg, row, d, bf16_avg),
            exp_avg_sq[row, d], h, l2, decoupled)
        _store_state(exp_avg, row, d, m, bf16_avg)
        _store(table, row, d, p, column_key, stochastic, fmt)
        column_key = next_column_key(column_key)


@kernel(inline="always")
def _adam_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key, stochastic, f16,
                exp_avg, bf16_avg, exp_avg_sq, h):
    lo, hi = _bounds(chunk, rows.size, scratch.shape[0])
    for j in range(lo, hi):
        half_prefetch_listed_for_write(table, rows, j + AHEAD)
        half_prefetch_listed_for_write(exp_avg, rows, j + AHEAD)
        half_prefetch_listed_for_write(exp_avg_sq, rows, j + AHEAD)
        g = _gradient(j, values, grad, groups, scale, scratch[chunk])
        if f16 is None:
            _adam_row(rows[j], g, table, exp_avg, bf16_avg, exp_avg_sq, h, key, stochastic,
                      BF16)
        else:
            _adam_row(rows[j], g, table, exp_avg, bf16_avg, exp_avg_sq, h, key, stochastic,
                      F16)


@kernel(parallel=True)
def _adam(table, rows, values, grad, groups, scale, scratch, seed, step, stochastic, f16,
          exp_avg, bf16_avg, exp_avg_sq, h):
    key = dropout_key(seed, step)
    for chunk in prange(scratch.shape[0]):
        _adam_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key, stochastic,
                    f16, exp_avg, bf16_avg, exp_avg_sq, h)


# ---------------------------------------------------------------- Adagrad


@kernel(inline="always")
def _adagrad_row(row, g, table, state_sum, h, key, stochastic, fmt):
    decay = h.weight_decay != 0
    column_key = np.uint64(rounding_row_key(key, row))
    for d in range(table.shape[1]):
        p, state_sum[row, d] = updates.adagrad_update(_load(table, row, d, fmt), g[d],
                                                      state_sum[row, d], h, decay)
        _store(table, row, d, p, column_key, stochastic, fmt)
        column_key = next_column_key(column_key)


@kernel(inline="always")
def _adagrad_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key, stochastic,
                   f16, state_sum, h):
    lo, hi = _bounds(chunk, rows.size, scratch.shape[0])
    for j in range(lo, hi):
        half_prefetch_listed_for_write(table, rows, j + AHEAD)
        half_prefetch_listed_for_write(state_sum, rows, j + AHEAD)
        g = _gradient(j, values, grad, groups, scale, scratch[chunk])
        if f16 is None:
            _adagrad_row(rows[j], g, table, state_sum, h, key, stochastic, BF16)
        else:
            _adagrad_row(rows[j], g, table, state_sum, h, key, stochastic, F16)


@kernel(parallel=True)
def _adagrad(table, rows, values, grad, groups, scale, scratch, seed, step, stochastic, f16,
             state_sum, h):
    key = dropout_key(seed, step)
    for chunk in prange(scratch.shape[0]):
        _adagrad_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key,
                       stochastic, f16, state_sum, h)


# ---------------------------------------------------------------- row-wise Adagrad


@kernel(inline="always")
def _rowwise_row(row, g, table, state_sum, h, key, stochastic, fmt):
    # FBGEMM's row update (see .optim._rowwise_row): the mean square summed in column order.
    dim = table.shape[1]
    l2 = h.mode == _L2
    square_sum = np.float32(0)
    for d in range(dim):
        square_sum += updates.rowwise_term(g[d], _load(table, row, d, fmt), h, l2)
    acc, correction, multiplier = updates.rowwise_factors(state_sum[row], square_sum,
                                                          np.float32(dim), np.float32(1), h)
    state_sum[row] = acc
    column_key = np.uint64(rounding_row_key(key, row))
    for d in range(dim):
        p = updates.rowwise_apply(_load(table, row, d, fmt), g[d], correction, multiplier)
        _store(table, row, d, p, column_key, stochastic, fmt)
        column_key = next_column_key(column_key)


@kernel(inline="always")
def _rowwise_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key, stochastic,
                   f16, state_sum, h):
    lo, hi = _bounds(chunk, rows.size, scratch.shape[0])
    for j in range(lo, hi):
        half_prefetch_listed_for_write(table, rows, j + AHEAD)
        g = _gradient(j, values, grad, groups, scale, scratch[chunk])
        if f16 is None:
            _rowwise_row(rows[j], g, table, state_sum, h, key, stochastic, BF16)
        else:
            _rowwise_row(rows[j], g, table, state_sum, h, key, stochastic, F16)


@kernel(parallel=True)
def _rowwise(table, rows, values, grad, groups, scale, scratch, seed, step, stochastic, f16,
             state_sum, h):
    key = dropout_key(seed, step)
    for chunk in prange(scratch.shape[0]):
        _rowwise_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key,
                       stochastic, f16, state_sum, h)
