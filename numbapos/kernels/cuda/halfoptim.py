"""CUDA kernels of sparse optimiser steps on float16 tables, one pass per step.

The twin of ``kernels/cpu/halfoptim.py`` (same ``__all__``, same signatures,
the same bits): one block per listed row, threads along D (row-wise Adagrad:
one thread per row, summing in column order). Each thread widens its element
from the table's ``uint16`` bits to a float32 register, updates it with the
float32 state by the shared element updates (:mod:`numbapos.kernels.updates`)
and stores it back rounded (stochastically with the keyed hash of
``(seed, step, row, column)``, or to nearest even). SGD's momentum and
Adam's ``exp_avg`` may be bfloat16 (``uint16`` bits; widened, updated in
float32, stored rounded to nearest even), as on the CPU. Nothing is modified
while an index error is pending; row counts stay on the device.
"""

import numpy as np
from numba import cuda

from ..._args import WeightDecayMode
from .. import updates
from ..halfbits import bf16_to_f32_bits, f32_bits_to_bf16, half_to_f32_bits
from ..scalar import f32_bits, f32_from_bits
from . import clock, errors
from .arrays import THREADS, grid
from .embedding import segment_sum
from .half import _rounded, kernel_rounding, rounding_key
from .launch import launch
from .optim import (
    _live_adagrad,
    _live_adam,
    _live_rowwise,
    _live_sgd,
    _mark_started,
    _on_device,
    _row_blocks,
    _row_threads,
)

__all__ = ["adagrad_half_row_groups_", "adagrad_half_rows_", "adam_half_row_groups_",
           "adam_half_rows_", "rowwise_adagrad_half_row_groups_", "rowwise_adagrad_half_rows_",
           "sgd_half_row_groups_", "sgd_half_rows_"]

_L2 = int(WeightDecayMode.L2)


# ---------------------------------------------------------------- launchers


def sgd_half_rows_(table, rows, values, used, buf, row_started, hyper, rounding):
    """Lazy SGD on the listed rows of the 16-bit ``table`` (``uint16`` bits), float32
    ``values``, ``buf`` and ``hyper``; stored per ``rounding``."""
    if rows.size == 0:
        return
    used, word = _on_device(used), errors.device_word()
    if table.shape[1]:
        launch(_sgd_rows, _row_blocks(rows), _row_threads(table.shape[1]), table, rows, used,
               values, buf, _bf16_state(buf), row_started, *_hyper(hyper),
               kernel_rounding(rounding), word)
    if _host(hyper).momentum != 0:
        launch(_mark_started, grid(rows.size), THREADS, rows, used, row_started, word)


def sgd_half_row_groups_(table, grad, groups, scale_grad_by_freq, buf, row_started, hyper,
                         rounding):
    """:func:`sgd_half_rows_` fused with the gradient of a lookup."""
    if groups.rows.size == 0:
        return
    word = errors.device_word()
    if table.shape[1]:
        launch(_sgd_row_groups, _row_blocks(groups.rows), _row_threads(table.shape[1]), table,
               grad, groups, bool(scale_grad_by_freq), buf, _bf16_state(buf), row_started,
               *_hyper(hyper), kernel_rounding(rounding), word)
    if _host(hyper).momentum != 0:
        launch(_mark_started, grid(groups.rows.size), THREADS, groups.rows, groups.used,
               row_started, word)


def adam_half_rows_(table, rows, values, used, exp_avg, exp_avg_sq, hyper, rounding):
    """SparseAdam on the listed rows of the 16-bit ``table``."""
    if rows.size and table.shape[1]:
        launch(_adam_rows, _row_blocks(rows), _row_threads(table.shape[1]), table, rows,
               _on_device(used), values, exp_avg, _bf16_state(exp_avg), exp_avg_sq,
               *_hyper(hyper), kernel_rounding(rounding), errors.device_word())


def adam_half_row_groups_(table, grad, groups, scale_grad_by_freq, exp_avg, exp_avg_sq, hyper,
                          rounding):
    """:func:`adam_half_rows_` fused with the gradient of a lookup."""
    if groups.rows.size and table.shape[1]:
        launch(_adam_row_groups, _row_blocks(groups.rows), _row_threads(table.shape[1]), table,
               grad, groups, bool(scale_grad_by_freq), exp_avg, _bf16_state(exp_avg),
               exp_avg_sq, *_hyper(hyper), kernel_rounding(rounding), errors.device_word())


def adagrad_half_rows_(table, rows, values, used, state_sum, hyper, rounding):
    """Sparse Adagrad on the listed rows of the 16-bit ``table``."""
    if rows.size and table.shape[1]:
        launch(_adagrad_rows, _row_blocks(rows), _row_threads(table.shape[1]), table, rows,
               _on_device(used), values, state_sum, *_hyper(hyper), kernel_rounding(rounding),
               errors.device_word())


def adagrad_half_row_groups_(table, grad, groups, scale_grad_by_freq, state_sum, hyper,
                             rounding):
    """:func:`adagrad_half_rows_` fused with the gradient of a lookup."""
    if groups.rows.size and table.shape[1]:
        launch(_adagrad_row_groups, _row_blocks(groups.rows), _row_threads(table.shape[1]),
               table, grad, groups, bool(scale_grad_by_freq), state_sum, *_hyper(hyper),
               kernel_rounding(rounding), errors.device_word())


def rowwise_adagrad_half_rows_(table, rows, values, used, state_sum, hyper, rounding):
    """Row-wise Adagrad on the listed rows of the 16-bit ``table``."""
    if rows.size and table.shape[1]:
        launch(_rowwise_rows, grid(rows.size), THREADS, table, rows, _on_device(used), values,
               state_sum, *_hyper(hyper), kernel_rounding(rounding), errors.device_word())


def rowwise_adagrad_half_row_groups_(table, grad, groups, scale_grad_by_freq, state_sum, hyper,
                                     rounding):
    """:func:`rowwise_adagrad_half_rows_` fused with the gradient of a lookup."""
    if groups.rows.size and table.shape[1]:
        launch(_rowwise_row_groups, grid(groups.rows.size), THREADS, table, grad, groups,
               bool(scale_grad_by_freq), state_sum, *_hyper(hyper), kernel_rounding(rounding),
               errors.device_word())


def _bf16_state(state):
    """The kernels' flag for a state array: True for bfloat16 bits (``uint16``)."""
    return bool(state.dtype == np.uint16)


def _host(hyper):
    """The hyper-parameter tuple of ``hyper`` (a :class:`.clock.LiveHyper` or plain)."""
    return hyper.hyper if isinstance(hyper, clock.LiveHyper) else hyper


def _hyper(hyper):
    """The kernels' ``(h, dyn)`` arguments: ``dyn`` the step's scalars an optimiser clock
    wrote on the device (float32, the tables' arithmetic), or empty (``h`` holds)."""
    return clock.split(hyper, np.float32)


# ---------------------------------------------------------------- elements


@cuda.jit(device=True)
def _load(table, row, d, fmt):
    return f32_from_bits(half_to_f32_bits(table[row, d], fmt))


@cuda.jit(device=True)
def _store(table, row, d, value, key, rounding):
    table[row, d] = _rounded(f32_bits(value), key, row, d, rounding)


@cuda.jit(device=True)
def _load_state(state, row, d, bf16):
    # Element (row, d) of a float32 state, or of a bfloat16 one (its bits), as float32.
    x = state[row, d]
    if bf16:
        return f32_from_bits(bf16_to_f32_bits(x))
    return np.float32(x)


@cuda.jit(device=True)
def _store_state(state, row, d, value, bf16):
    # The float32 ``value`` into a float32 state, or into a bfloat16 one rounded to nearest.
    if bf16:
        state[row, d] = f32_bits_to_bf16(f32_bits(value))
    else:
        state[row, d] = value


@cuda.jit(device=True)
def _group_gradient(grad, groups, scale_by_freq, j, d):
    return segment_sum(grad, groups.order, groups.starts[j], groups.counts[j], scale_by_freq, d)


# ---------------------------------------------------------------- SGD


@cuda.jit(device=True)
def _sgd_element(table, buf, bf16_buf, row, d, g, first, h, decay, key, rounding):
    p = _load(table, row, d, rounding.fmt)
    if h.momentum != 0:
        p, b = updates.sgd_momentum_update(p, g, _load_state(buf, row, d, bf16_buf), h, first,
                                           h.nesterov, h.maximize, decay)
        _store_state(buf, row, d, b, bf16_buf)
    else:
        p = updates.sgd_plain_update(p, g, h, h.maximize, decay)
    _store(table, row, d, p, key, rounding)


@cuda.jit
def _sgd_rows(table, rows, used, values, buf, bf16_buf, row_started, h, dyn, rounding, word):
    """SGD on rows ``rows[j]``: one block per listed row, threads along D."""
    if errors.is_pending(word):
        return
    key = rounding_key(rounding)
    h = _live_sgd(h, dyn)
    decay = h.weight_decay != 0
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        row = rows[j]
        first = h.momentum != 0 and not row_started[row]
        for d in range(cuda.threadIdx.x, table.shape[1], cuda.blockDim.x):
            _sgd_element(table, buf, bf16_buf, row, d, values[j, d], first, h, decay, key,
                         rounding)


@cuda.jit
def _sgd_row_groups(table, grad, groups, scale_by_freq, buf, bf16_buf, row_started, h, dyn,
                    rounding, word):
    """:func:`_sgd_rows` with each gradient element summed on the spot from its positions."""
    if errors.is_pending(word):
        return
    key = rounding_key(rounding)
    h = _live_sgd(h, dyn)
    decay = h.weight_decay != 0
    for j in range(cuda.blockIdx.x, groups.used[0], cuda.gridDim.x):
        row = groups.rows[j]
        first = h.momentum != 0 and not row_started[row]
        for d in range(cuda.threadIdx.x, table.shape[1], cuda.blockDim.x):
            g = _group_gradient(grad, groups, scale_by_freq, j, d)
            _sgd_element(table, buf, bf16_buf, row, d, g, first, h, decay, key, rounding)


# ---------------------------------------------------------------- Adam


@cuda.jit(device=True)
def _adam_element(table, exp_avg, bf16_avg, exp_avg_sq, row, d, g, h, key, rounding):
    l2, decoupled = updates.adam_decay_flags(h)
    p, m, exp_avg_sq[row, d] = updates.sparse_adam_update(
        _load(table, row, d, rounding.fmt), g, _load_state(exp_avg, row, d, bf16_avg),
        exp_avg_sq[row, d], h, l2, decoupled)
    _store_state(exp_avg, row, d, m, bf16_avg)
    _store(table, row, d, p, key, rounding)


@cuda.jit
def _adam_rows(table, rows, used, values, exp_avg, bf16_avg, exp_avg_sq, h, dyn, rounding,
               word):
    """SparseAdam on rows ``rows[j]``: one block per listed row, threads along D."""
    if errors.is_pending(word):
        return
    key = rounding_key(rounding)
    h = _live_adam(h, dyn)
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        for d in range(cuda.threadIdx.x, table.shape[1], cuda.blockDim.x):
            _adam_element(table, exp_avg, bf16_avg, exp_avg_sq, rows[j], d, values[j, d], h,
                          key, rounding)


@cuda.jit
def _adam_row_groups(table, grad, groups, scale_by_freq, exp_avg, bf16_avg, exp_avg_sq, h,
                     dyn, rounding, word):
    """:func:`_adam_rows` with each gradient element summed on the spot from its positions."""
    if errors.is_pending(word):
        return
    key = rounding_key(rounding)
    h = _live_adam(h, dyn)
    for j in range(cuda.blockIdx.x, groups.used[0], cuda.gridDim.x):
        for d in range(cuda.threadIdx.x, table.shape[1], cuda.blockDim.x):
            g = _group_gradient(grad, groups, scale_by_freq, j, d)
            _adam_element(table, exp_avg, bf16_avg, exp_avg_sq, groups.rows[j], d, g, h, key,
                          rounding)


# ---------------------------------------------------------------- Adagrad


@cuda.jit(device=True)
def _adagrad_element(table, state_sum, row, d, g, h, key, rounding):
    p, state_sum[row, d] = updates.adagrad_update(_load(table, row, d, rounding.fmt), g,
                                                  state_sum[row, d], h, h.weight_decay != 0)
    _store(table, row, d, p, key, rounding)


@cuda.jit
def _adagrad_rows(table, rows, used, values, state_sum, h, dyn, rounding, word):
    """Adagrad on rows ``rows[j]``: one block per listed row, threads along D."""
    if errors.is_pending(word):
        return
    key = rounding_key(rounding)
    h = _live_adagrad(h, dyn)
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        for d in range(cuda.threadIdx.x, table.shape[1], cuda.blockDim.x):
            _adagrad_element(table, state_sum, rows[j], d, values[j, d], h, key, rounding)


@cuda.jit
def _adagrad_row_groups(table, grad, groups, scale_by_freq, state_sum, h, dyn, rounding, word):
    """:func:`_adagrad_rows` with each gradient element summed on the spot from its positions."""
    if errors.is_pending(word):
        return
    key = rounding_key(rounding)
    h = _live_adagrad(h, dyn)
    for j in range(cuda.blockIdx.x, groups.used[0], cuda.gridDim.x):
        for d in range(cuda.threadIdx.x, table.shape[1], cuda.blockDim.x):
            g = _group_gradient(grad, groups, scale_by_freq, j, d)
            _adagrad_element(table, state_sum, groups.rows[j], d, g, h, key, rounding)


# ---------------------------------------------------------------- row-wise Adagrad


@cuda.jit(device=True)
def _rowwise_factors(table, row, square_sum, state_sum, h):
    acc, correction, multiplier = updates.rowwise_factors(
        state_sum[row], square_sum, np.float32(table.shape[1]), np.float32(1), h)
    state_sum[row] = acc
    return correction, multiplier


@cuda.jit
def _rowwise_rows(table, rows, used, values, state_sum, h, dyn, rounding, word):
    """Row-wise Adagrad on rows ``rows[j]``: one thread per listed row (the CPU's order)."""
    if errors.is_pending(word):
        return
    key = rounding_key(rounding)
    h = _live_rowwise(h, dyn)
    l2 = h.mode == _L2
    for j in range(cuda.grid(1), used[0], cuda.gridsize(1)):
        row = rows[j]
        square_sum = np.float32(0)
        for d in range(table.shape[1]):
            square_sum += updates.rowwise_term(values[j, d], _load(table, row, d, rounding.fmt),
                                               h, l2)
        correction, multiplier = _rowwise_factors(table, row, square_sum, state_sum, h)
        for d in range(table.shape[1]):
            p = updates.rowwise_apply(_load(table, row, d, rounding.fmt), values[j, d],
                                      correction, multiplier)
            _store(table, row, d, p, key, rounding)


@cuda.jit
def _rowwise_row_groups(table, grad, groups, scale_by_freq, state_sum, h, dyn, rounding, word):
    """:func:`_rowwise_rows` with the gradient summed on the spot (squares, then update)."""
    if errors.is_pending(word):
        return
    key = rounding_key(rounding)
    h = _live_rowwise(h, dyn)
    l2 = h.mode == _L2
    for j in range(cuda.grid(1), groups.used[0], cuda.gridsize(1)):
        row = groups.rows[j]
        square_sum = np.float32(0)
        for d in range(table.shape[1]):
            g = _group_gradient(grad, groups, scale_by_freq, j, d)
            square_sum += updates.rowwise_term(g, _load(table, row, d, rounding.fmt), h, l2)
        correction, multiplier = _rowwise_factors(table, row, square_sum, state_sum, h)
        for d in range(table.shape[1]):
            g = _group_gradient(grad, groups, scale_by_freq, j, d)
            p = updates.rowwise_apply(_load(table, row, d, rounding.fmt), g, correction,
                                      multiplier)
            _store(table, row, d, p, key, rounding)
