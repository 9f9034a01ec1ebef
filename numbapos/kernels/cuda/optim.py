"""CUDA kernels for SGD: one fused elementwise pass per parameter, dense or over listed rows.

The twin of ``kernels/cpu/optim.py``: the same operations in the same order,
in the parameter's dtype, so results are bit-identical to the CPU's for
float32 and float64. With ``momentum == 0`` the buffer is never read or
written and may be empty.

Bit-identity needs one GPU-specific care: NVVM contracts ``a * b + c`` into a
fused multiply-add by default (one rounding instead of two), which the CPU
never does. Every product that feeds an addition goes through
:func:`~numbapos.kernels.cuda.fpmath.mul_rn` (``mul.rn``, never fused).
"""

from numba import cuda

from .arrays import THREADS, grid
from .embedding import segment_sum
from .fpmath import mul_rn

__all__ = ["sgd_dense_", "sgd_row_groups_", "sgd_rows_"]


# ---------------------------------------------------------------- launchers


def sgd_dense_(param, grad, buf, first, hyper):
    """Update flat ``param`` (and flat momentum ``buf``) in place from flat ``grad``.

    ``hyper`` is a :class:`~numbapos._args.SGDHyper` already cast to the
    parameter's dtype; ``first`` says the momentum buffer starts on this step.
    """
    if param.size == 0:
        return
    lr, momentum, one_minus_dampening, weight_decay, nesterov, maximize = _scalars(param, hyper)
    _sgd_dense[grid(param.size), THREADS](param, grad, buf, bool(first), lr, momentum,
                                          one_minus_dampening, weight_decay, nesterov, maximize)


def sgd_rows_(param, rows, values, buf, row_started, hyper):
    """Lazy SGD on the listed (unique) rows of a 2-D ``param`` only.

    Row ``rows[j]`` gets gradient ``values[j]``; its momentum row starts fresh
    the first time it is touched (``row_started``, updated here).
    """
    if rows.size == 0:
        return
    lr, momentum, one_minus_dampening, weight_decay, nesterov, maximize = _scalars(param, hyper)
    dim = param.shape[1]
    if dim:
        threads = _row_threads(dim)
        _sgd_rows[grid(rows.size, 1), threads](param, rows, values, buf, row_started, lr,
                                               momentum, one_minus_dampening, weight_decay,
                                               nesterov, maximize)
    if momentum != 0:
        # A second launch, so no block can see a flag that another set this step
        # (rows are unique, but the flags are read above and set only here).
        _mark_started[grid(rows.size), THREADS](rows, row_started)


def sgd_row_groups_(param, grad, groups, scale_grad_by_freq, buf, row_started, hyper):
    """Lazy SGD fused with the gradient of a lookup: one pass over the rows used.

    One block per row of ``groups`` (:class:`~numbapos._args.RowGroups`); each
    thread sums its columns over the row's positions (the scatter's
    ``segment_sum``) and applies the update at once, so the ``(rows, D)``
    gradient is never stored. Same bits as ``sum_row_groups`` then
    :func:`sgd_rows_`, and as the CPU.
    """
    used = groups.rows.size
    if used == 0:
        return
    lr, momentum, one_minus_dampening, weight_decay, nesterov, maximize = _scalars(param, hyper)
    dim = param.shape[1]
    if dim:
        _sgd_row_groups[grid(used, 1), _row_threads(dim)](
            param, grad, groups.rows, groups.starts, groups.counts, groups.order,
            bool(scale_grad_by_freq), buf, row_started, lr, momentum, one_minus_dampening,
            weight_decay, nesterov, maximize)
    if momentum != 0:
        _mark_started[grid(used), THREADS](groups.rows, row_started)


def _scalars(param, hyper):
    """The hyper-parameters as plain kernel arguments, floats in ``param``'s dtype."""
    cast = param.dtype.type
    return (cast(hyper.lr), cast(hyper.momentum), cast(hyper.one_minus_dampening),
            cast(hyper.weight_decay), bool(hyper.nesterov), bool(hyper.maximize))


def _row_threads(dim: int) -> int:
    """Threads of a per-row block: a whole number of warps covering ``dim``, at most THREADS."""
    return min(THREADS, -(-dim // 32) * 32)


# ---------------------------------------------------------------- kernels


@cuda.jit(device=True)
def _sgd_update(p, g, buf, first, lr, momentum, one_minus_dampening, weight_decay, nesterov,
                maximize):
    # One element, operation for operation as the CPU's _sgd_update: (new_p, new_buf).
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + mul_rn(weight_decay, p)
    if momentum != 0:
        if first:
            buf = g
        else:
            buf = mul_rn(buf, momentum) + mul_rn(one_minus_dampening, g)
        if nesterov:
            g = g + mul_rn(momentum, buf)
        else:
            g = buf
    return p - mul_rn(lr, g), buf


@cuda.jit
def _sgd_dense(param, grad, buf, first, lr, momentum, one_minus_dampening, weight_decay,
               nesterov, maximize):
    """Elementwise SGD over flat arrays (grid-stride)."""
    use_buf = momentum != 0
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        b = buf[i] if use_buf else lr  # any value of the dtype: unused without momentum
        p, b = _sgd_update(param[i], grad[i], b, first, lr, momentum, one_minus_dampening,
                           weight_decay, nesterov, maximize)
        param[i] = p
        if use_buf:
            buf[i] = b


@cuda.jit
def _sgd_rows(param, rows, values, buf, row_started, lr, momentum, one_minus_dampening,
              weight_decay, nesterov, maximize):
    """SGD on rows ``rows[j]`` of a 2-D ``param``: one block per listed row, threads along D."""
    dim = param.shape[1]
    use_buf = momentum != 0
    for j in range(cuda.blockIdx.x, rows.size, cuda.gridDim.x):
        row = rows[j]
        first = use_buf and not row_started[row]
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            b = buf[row, d] if use_buf else lr  # unused without momentum
            p, b = _sgd_update(param[row, d], values[j, d], b, first, lr, momentum,
                               one_minus_dampening, weight_decay, nesterov, maximize)
            param[row, d] = p
            if use_buf:
                buf[row, d] = b


@cuda.jit
def _sgd_row_groups(param, grad, rows, starts, counts, order, scale_by_freq, buf, row_started,
                    lr, momentum, one_minus_dampening, weight_decay, nesterov, maximize):
    """:func:`_sgd_rows` with each gradient element summed on the spot from its positions."""
    dim = param.shape[1]
    use_buf = momentum != 0
    for j in range(cuda.blockIdx.x, rows.size, cuda.gridDim.x):
        row = rows[j]
        first = use_buf and not row_started[row]
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            g = segment_sum(grad, order, starts[j], counts[j], scale_by_freq, d)
            b = buf[row, d] if use_buf else lr  # unused without momentum
            p, b = _sgd_update(param[row, d], g, b, first, lr, momentum, one_minus_dampening,
                               weight_decay, nesterov, maximize)
            param[row, d] = p
            if use_buf:
                buf[row, d] = b


@cuda.jit
def _mark_started(rows, row_started):
    """``row_started[rows[j]] = True`` (elementwise)."""
    for j in range(cuda.grid(1), rows.size, cuda.gridsize(1)):
        row_started[rows[j]] = True
