"""CPU kernels for SGD: one fused pass per parameter, dense or over listed rows.

The arithmetic follows ``torch.optim.SGD`` operation for operation, in the
parameter's dtype (scalars arrive already cast to it), so results match
PyTorch step for step. With ``momentum == 0`` the buffer is never read or
written and may be empty.
"""

from numba import njit, prange


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


@njit(cache=True, nogil=True, parallel=True)
def sgd_dense_(param, grad, buf, first, lr, momentum, one_minus_dampening, weight_decay,
               nesterov, maximize):
    """Update flat ``param`` (and flat momentum ``buf``) in place from flat ``grad``."""
    zero = param.dtype.type(0)
    for i in prange(param.size):
        b = buf[i] if momentum != 0 else zero
        p, b = _sgd_update(param[i], grad[i], b, first, lr, momentum, one_minus_dampening,
                           weight_decay, nesterov, maximize)
        param[i] = p
        if momentum != 0:
            buf[i] = b


@njit(cache=True, nogil=True, parallel=True)
def sgd_rows_(param, rows, values, buf, row_started, lr, momentum, one_minus_dampening,
              weight_decay, nesterov, maximize):
    """Lazy SGD on the listed (unique) rows of a 2-D ``param`` only.

    Row ``rows[j]`` gets gradient ``values[j]``. Its momentum row starts fresh the
    first time the row is touched (``row_started``), as a dense buffer does on
    step 1; rows not listed keep their values and their momentum.
    """
    dim = param.shape[1]
    zero = param.dtype.type(0)
    for j in prange(rows.size):
        row = rows[j]
        first = momentum != 0 and not row_started[row]
        for d in range(dim):
            b = buf[row, d] if momentum != 0 else zero
            p, b = _sgd_update(param[row, d], values[j, d], b, first, lr, momentum,
                               one_minus_dampening, weight_decay, nesterov, maximize)
            param[row, d] = p
            if momentum != 0:
                buf[row, d] = b
        if momentum != 0:
            row_started[row] = True
