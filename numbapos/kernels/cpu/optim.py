"""CPU kernels for SGD: one fused pass per parameter, dense or over listed rows.

The arithmetic follows ``torch.optim.SGD`` operation for operation, in the
parameter's dtype (scalars arrive already cast to it), so results match
PyTorch step for step. With ``momentum == 0`` the buffer is never read or
written and may be empty.
"""

from numba import njit, prange

from .arrays import pick

__all__ = ["sgd_dense_", "sgd_rows_"]


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
    row = rows[j]
    dim = param.shape[1]
    zero = param.dtype.type(0)
    first = h.momentum != 0 and not row_started[row]
    for d in range(dim):
        b = buf[row, d] if h.momentum != 0 else zero
        p, b = _sgd_update(param[row, d], values[j, d], b, first, h.lr, h.momentum,
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
