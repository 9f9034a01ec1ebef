"""CPU kernels for SGD: one fused pass per parameter, dense or over listed rows.

The arithmetic follows ``torch.optim.SGD`` operation for operation, in the
parameter's dtype (scalars arrive already cast to it), so results match
PyTorch step for step. With ``momentum == 0`` the buffer is never read or
written and may be empty.
"""

import numba
import numpy as np
from numba import njit, prange

from .arrays import PARALLEL_MIN_ELEMENTS, pick
from .embedding import sum_segment

__all__ = ["sgd_dense_", "sgd_row_groups_", "sgd_rows_"]


def sgd_dense_(param, grad, buf, first, hyper):
    """Update flat ``param`` (and flat momentum ``buf``) in place from flat ``grad``.

    ``hyper`` is a :class:`~numbapos.kernels.args.SGDHyper` already cast to the
    parameter's dtype; ``first`` says the momentum buffer starts on this step.
    """
    if param.size:
        pick(_sgd_dense, _sgd_dense_parallel, param.size)(param, grad, buf, first, hyper)


def sgd_rows_(param, rows, values, buf, row_started, hyper):
    """Lazy SGD on the listed (unique) rows of a 2-D ``param`` only.

    Row ``rows[j]`` gets gradient ``values[j]``; its momentum row starts fresh
    the first time it is touched (``row_started``, updated here).
    """
    if rows.size:
        work = rows.size * param.shape[1]
        pick(_sgd_rows, _sgd_rows_parallel, work)(param, rows, values, buf, row_started, hyper)


def sgd_row_groups_(param, grad, groups, scale_grad_by_freq, buf, row_started, hyper):
    """Lazy SGD fused with the gradient of a lookup: one pass over the rows used.

    Row ``groups.rows[j]`` gets the sum of ``grad`` over its positions
    (:class:`~numbapos._args.RowGroups`, divided by the count with
    ``scale_grad_by_freq``), summed into a per-thread row of scratch and applied
    at once: the ``(rows, D)`` gradient is never stored. Same bits as
    ``sum_row_groups`` followed by :func:`sgd_rows_`.
    """
    used = groups.rows.size
    if used == 0:
        return
    dim = param.shape[1]
    if used * dim < PARALLEL_MIN_ELEMENTS:
        scratch = np.empty((1, dim), param.dtype)
        _sgd_row_groups(param, grad, groups, bool(scale_grad_by_freq), scratch, buf,
                        row_started, hyper)
    else:
        scratch = np.empty((min(used, 4 * numba.get_num_threads()), dim), param.dtype)
        _sgd_row_groups_parallel(param, grad, groups, bool(scale_grad_by_freq), scratch, buf,
                                 row_started, hyper)


@njit(cache=True, nogil=True, inline="always")
def _sgd_update(p, g, buf, first, lr, momentum, one_minus_dampening, weight_decay, nesterov,
                maximize):
    # One element: returns (new_p, new_buf).
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + weight_decay * p
    if momentum != 0:
        if first:
            buf = g
        else:
            buf = buf * momentum + one_minus_dampening * g
        if nesterov:
            g = g + momentum * buf
        else:
            g = buf
    return p - lr * g, buf


@njit(cache=True, nogil=True, inline="always")
def _sgd_dense_at(i, param, grad, buf, first, h):
    zero = param.dtype.type(0)
    b = buf[i] if h.momentum != 0 else zero
    p, b = _sgd_update(param[i], grad[i], b, first, h.lr, h.momentum, h.one_minus_dampening,
                       h.weight_decay, h.nesterov, h.maximize)
    param[i] = p
    if h.momentum != 0:
        buf[i] = b


@njit(cache=True, nogil=True)
def _sgd_dense(param, grad, buf, first, hyper):
    for i in range(param.size):
        _sgd_dense_at(i, param, grad, buf, first, hyper)


@njit(cache=True, nogil=True, parallel=True)
def _sgd_dense_parallel(param, grad, buf, first, hyper):
    for i in prange(param.size):
        _sgd_dense_at(i, param, grad, buf, first, hyper)


@njit(cache=True, nogil=True, inline="always")
def _sgd_row(j, param, rows, values, buf, row_started, h):
    _sgd_row_from(rows[j], values[j], param, buf, row_started, h)


@njit(cache=True, nogil=True, inline="always")
def _sgd_row_from(row, g, param, buf, row_started, h):
    # Row ``row`` of ``param`` with gradient row ``g`` (1-D).
    dim = param.shape[1]
    zero = param.dtype.type(0)
    first = h.momentum != 0 and not row_started[row]
    for d in range(dim):
        b = buf[row, d] if h.momentum != 0 else zero
        p, b = _sgd_update(param[row, d], g[d], b, first, h.lr, h.momentum,
                           h.one_minus_dampening, h.weight_decay, h.nesterov, h.maximize)
        param[row, d] = p
        if h.momentum != 0:
            buf[row, d] = b
    if h.momentum != 0:
        row_started[row] = True


@njit(cache=True, nogil=True)
def _sgd_rows(param, rows, values, buf, row_started, hyper):
    for j in range(rows.size):
        _sgd_row(j, param, rows, values, buf, row_started, hyper)


@njit(cache=True, nogil=True, parallel=True)
def _sgd_rows_parallel(param, rows, values, buf, row_started, hyper):
    for j in prange(rows.size):
        _sgd_row(j, param, rows, values, buf, row_started, hyper)


@njit(cache=True, nogil=True, inline="always")
def _sgd_group_chunk(chunk, num_chunks, param, grad, groups, scale_by_freq, scratch, buf,
                     row_started, h):
    # Groups chunk * U / num_chunks .. (chunk + 1) * U / num_chunks, through scratch[chunk].
    used = groups.rows.size
    acc = scratch[chunk]
    for j in range(chunk * used // num_chunks, (chunk + 1) * used // num_chunks):
        sum_segment(grad, groups.order, groups.starts[j], groups.counts[j], scale_by_freq, acc)
        _sgd_row_from(groups.rows[j], acc, param, buf, row_started, h)


@njit(cache=True, nogil=True)
def _sgd_row_groups(param, grad, groups, scale_by_freq, scratch, buf, row_started, hyper):
    _sgd_group_chunk(0, 1, param, grad, groups, scale_by_freq, scratch, buf, row_started, hyper)


@njit(cache=True, nogil=True, parallel=True)
def _sgd_row_groups_parallel(param, grad, groups, scale_by_freq, scratch, buf, row_started,
                             hyper):
    # One chunk of rows per scratch row; rows are unique, so chunks never share a row.
    num_chunks = scratch.shape[0]
    for chunk in prange(num_chunks):
        _sgd_group_chunk(chunk, num_chunks, param, grad, groups, scale_by_freq, scratch, buf,
                         row_started, hyper)
