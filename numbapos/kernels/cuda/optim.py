"""CUDA kernels of the optimisers: one fused pass per parameter, dense or over listed rows.

SGD, Adam/AdamW, Adagrad and row-wise Adagrad (row-wise: one thread per row,
summing along the row in the CPU's order).

The twin of ``kernels/cpu/optim.py``: the same operations in the same order,
in the parameter's dtype, so results are bit-identical to the CPU's for
float32 and float64. With ``momentum == 0`` the buffer is never read or
written and may be empty.

Every kernel returns at once while an index error is pending (see
:mod:`.errors`), so a step after a failed lookup changes nothing. The row
updates read how many rows are real from the device (``used``, see
:mod:`.grouping`): the grid is sized by the upper bound and nothing is read
back.

Bit-identity needs one GPU-specific care: NVVM contracts ``a * b + c`` into a
fused multiply-add by default (one rounding instead of two), which the CPU
never does. Every product that feeds an addition goes through
:func:`~numbapos.kernels.cuda.fpmath.mul_rn` (``mul.rn``, never fused).
"""

import math

import numpy as np
from numba import cuda

from . import arrays, errors
from .arrays import MAX_BLOCKS, THREADS, grid
from .embedding import segment_sum
from .fpmath import cast_like, mul_rn

__all__ = ["adagrad_dense_", "adagrad_row_groups_", "adagrad_rows_", "adam_dense_",
           "adam_row_groups_", "adam_rows_", "rowwise_adagrad_dense_",
           "rowwise_adagrad_row_groups_", "rowwise_adagrad_rows_", "sgd_dense_",
           "sgd_row_groups_", "sgd_rows_"]


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
                                          one_minus_dampening, weight_decay, nesterov, maximize,
                                          errors.device_word())


def sgd_rows_(param, rows, values, used, buf, row_started, hyper):
    """Lazy SGD on the listed (unique) rows of a 2-D ``param`` only.

    Row ``rows[j]`` gets gradient ``values[j]`` for ``j < used`` (an int, or a
    device array whose first entry is); its momentum row starts fresh the
    first time it is touched (``row_started``, updated here).
    """
    if rows.size == 0:
        return
    lr, momentum, one_minus_dampening, weight_decay, nesterov, maximize = _scalars(param, hyper)
    used, word = _on_device(used), errors.device_word()
    dim = param.shape[1]
    if dim:
        threads = _row_threads(dim)
        _sgd_rows[_row_blocks(rows), threads](param, rows, used, values, buf, row_started, lr,
                                              momentum, one_minus_dampening, weight_decay,
                                              nesterov, maximize, word)
    if momentum != 0:
        # A second launch, so no block can see a flag that another set this step
        # (rows are unique, but the flags are read above and set only here).
        _mark_started[grid(rows.size), THREADS](rows, used, row_started, word)


def sgd_row_groups_(param, grad, groups, scale_grad_by_freq, buf, row_started, hyper):
    """Lazy SGD fused with the gradient of a lookup: one pass over the rows used.

    One block per row of ``groups`` (:class:`~numbapos._args.RowGroups`); each
    thread sums its columns over the row's positions (the scatter's
    ``segment_sum``) and applies the update at once, so the ``(rows, D)``
    gradient is never stored. Same bits as ``sum_row_groups`` then
    :func:`sgd_rows_`, and as the CPU.
    """
    if groups.rows.size == 0:
        return
    lr, momentum, one_minus_dampening, weight_decay, nesterov, maximize = _scalars(param, hyper)
    word = errors.device_word()
    dim = param.shape[1]
    if dim:
        _sgd_row_groups[_row_blocks(groups.rows), _row_threads(dim)](
            param, grad, groups.rows, groups.used, groups.starts, groups.counts, groups.order,
            bool(scale_grad_by_freq), buf, row_started, lr, momentum, one_minus_dampening,
            weight_decay, nesterov, maximize, word)
    if momentum != 0:
        _mark_started[grid(groups.rows.size), THREADS](groups.rows, groups.used, row_started,
                                                       word)


def _scalars(param, hyper):
    """The hyper-parameters as plain kernel arguments, floats in ``param``'s dtype."""
    cast = param.dtype.type
    return (cast(hyper.lr), cast(hyper.momentum), cast(hyper.one_minus_dampening),
            cast(hyper.weight_decay), bool(hyper.nesterov), bool(hyper.maximize))


def _on_device(used):
    """The count of real rows as a device array (``[used]``) for kernels to read."""
    if isinstance(used, int):
        return arrays.asarray(np.array([used, 0], np.int64))
    return used


def _row_blocks(rows) -> int:
    """Blocks of a one-block-per-row kernel over at most ``rows.size`` rows."""
    return max(1, min(int(rows.size), MAX_BLOCKS))


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
               nesterov, maximize, word):
    """Elementwise SGD over flat arrays (grid-stride)."""
    if errors.is_pending(word):
        return
    use_buf = momentum != 0
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        b = buf[i] if use_buf else lr  # any value of the dtype: unused without momentum
        p, b = _sgd_update(param[i], grad[i], b, first, lr, momentum, one_minus_dampening,
                           weight_decay, nesterov, maximize)
        param[i] = p
        if use_buf:
            buf[i] = b


@cuda.jit(device=True)
def _sgd_row_element(param, buf, row, d, g, first, lr, momentum, one_minus_dampening,
                     weight_decay, nesterov, maximize):
    # Element (row, d) of param (and of the momentum buffer) with gradient g.
    use_buf = momentum != 0
    b = buf[row, d] if use_buf else lr  # unused without momentum
    p, b = _sgd_update(param[row, d], g, b, first, lr, momentum, one_minus_dampening,
                       weight_decay, nesterov, maximize)
    param[row, d] = p
    if use_buf:
        buf[row, d] = b


@cuda.jit
def _sgd_rows(param, rows, used, values, buf, row_started, lr, momentum, one_minus_dampening,
              weight_decay, nesterov, maximize, word):
    """SGD on rows ``rows[j]`` of a 2-D ``param``: one block per listed row, threads along D."""
    if errors.is_pending(word):
        return
    dim = param.shape[1]
    use_buf = momentum != 0
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        row = rows[j]
        first = use_buf and not row_started[row]
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            _sgd_row_element(param, buf, row, d, values[j, d], first, lr, momentum,
                             one_minus_dampening, weight_decay, nesterov, maximize)


@cuda.jit
def _sgd_row_groups(param, grad, rows, used, starts, counts, order, scale_by_freq, buf,
                    row_started,
                    lr, momentum, one_minus_dampening, weight_decay, nesterov, maximize, word):
    """:func:`_sgd_rows` with each gradient element summed on the spot from its positions."""
    if errors.is_pending(word):
        return
    dim = param.shape[1]
    use_buf = momentum != 0
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        row = rows[j]
        first = use_buf and not row_started[row]
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            g = segment_sum(grad, order, starts[j], counts[j], scale_by_freq, d)
            _sgd_row_element(param, buf, row, d, g, first, lr, momentum, one_minus_dampening,
                             weight_decay, nesterov, maximize)


@cuda.jit
def _mark_started(rows, used, row_started, word):
    """``row_started[rows[j]] = True`` (elementwise)."""
    if errors.is_pending(word):
        return
    for j in range(cuda.grid(1), used[0], cuda.gridsize(1)):
        row_started[rows[j]] = True


# ---------------------------------------------------------------- Adam / AdamW


def adam_dense_(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, hyper):
    """One ``torch.optim.Adam`` step on flat arrays, in place.

    ``hyper`` is an :class:`~numbapos._args.AdamHyper` (dense step size);
    ``max_exp_avg_sq`` is read and written only with ``amsgrad`` (may be empty).
    """
    if param.size:
        _adam_dense[grid(param.size), THREADS](param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq,
                                               *_cast_all(param, hyper), errors.device_word())


def adam_rows_(param, rows, values, used, exp_avg, exp_avg_sq, hyper):
    """``torch.optim.SparseAdam``'s update of the listed (unique) rows of a 2-D ``param``.

    Row ``rows[j]`` gets gradient ``values[j]``; only those rows of ``param``
    and of the moments are read and written. ``hyper`` carries the sparse
    step size. ``used`` rows are real (see :func:`sgd_rows_`).
    """
    if rows.size and param.shape[1]:
        _adam_rows[_row_blocks(rows), _row_threads(param.shape[1])](
            param, rows, _on_device(used), values, exp_avg, exp_avg_sq,
            *_cast_all(param, hyper), errors.device_word())


def adam_row_groups_(param, grad, groups, scale_grad_by_freq, exp_avg, exp_avg_sq, hyper):
    """:func:`adam_rows_` fused with the gradient of a lookup (as :func:`sgd_row_groups_`)."""
    if groups.rows.size and param.shape[1]:
        _adam_row_groups[_row_blocks(groups.rows), _row_threads(param.shape[1])](
            param, grad, groups.rows, groups.used, groups.starts, groups.counts, groups.order,
            bool(scale_grad_by_freq), exp_avg, exp_avg_sq, *_cast_all(param, hyper),
            errors.device_word())


def _cast_all(param, hyper):
    """A hyper-parameter tuple as kernel arguments: floats in ``param``'s dtype, flags kept."""
    cast = param.dtype.type
    return tuple(v if isinstance(v, (bool, int)) else cast(v) for v in hyper)


@cuda.jit(device=True)
def _adam_prologue(p, g, weight_decay, decay, decoupled, maximize):
    # As the CPU's _adam_prologue: (p, g).
    if maximize:
        g = -g
    if weight_decay != 0:
        if decoupled:
            p = p * decay
        else:
            g = g + mul_rn(weight_decay, p)
    return p, g


@cuda.jit
def _adam_dense(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, one_minus_beta1, beta2,
                one_minus_beta2, eps, weight_decay, decay, neg_step_size, bias_correction2_sqrt,
                decoupled, amsgrad, maximize, word):
    """Elementwise Adam over flat arrays (grid-stride), torch.optim.Adam's operations."""
    if errors.is_pending(word):
        return
    one = cast_like(1, beta2)
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        p, g = _adam_prologue(param[i], grad[i], weight_decay, decay, decoupled, maximize)
        m = exp_avg[i]
        if one_minus_beta1 < 0.5:  # torch.lerp, both branches
            m = m + mul_rn(one_minus_beta1, g - m)
        else:
            m = g - mul_rn(g - m, one - one_minus_beta1)
        v = mul_rn(exp_avg_sq[i], beta2) + mul_rn(mul_rn(one_minus_beta2, g), g)
        exp_avg[i] = m
        exp_avg_sq[i] = v
        if amsgrad:
            if max_exp_avg_sq[i] > v:
                v = max_exp_avg_sq[i]
            max_exp_avg_sq[i] = v
        denom = cast_like(math.sqrt(v), v) / bias_correction2_sqrt + eps
        param[i] = p + mul_rn(neg_step_size, m / denom)


@cuda.jit(device=True)
def _adam_row_element(param, exp_avg, exp_avg_sq, row, d, g, one_minus_beta1, one_minus_beta2,
                      eps, weight_decay, decay, neg_step_size, decoupled, maximize):
    # Element (row, d) of SparseAdam's update with gradient g.
    p, g = _adam_prologue(param[row, d], g, weight_decay, decay, decoupled, maximize)
    m = exp_avg[row, d]
    m = m + mul_rn(g - m, one_minus_beta1)
    v = exp_avg_sq[row, d]
    v = v + mul_rn(mul_rn(g, g) - v, one_minus_beta2)
    exp_avg[row, d] = m
    exp_avg_sq[row, d] = v
    param[row, d] = p + mul_rn(neg_step_size, m / (cast_like(math.sqrt(v), v) + eps))


@cuda.jit
def _adam_rows(param, rows, used, values, exp_avg, exp_avg_sq, one_minus_beta1, beta2,
               one_minus_beta2, eps, weight_decay, decay, neg_step_size, bias_correction2_sqrt,
               decoupled, amsgrad, maximize, word):
    """SparseAdam on rows ``rows[j]``: one block per listed row, threads along D."""
    if errors.is_pending(word):
        return
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        row = rows[j]
        for d in range(cuda.threadIdx.x, param.shape[1], cuda.blockDim.x):
            _adam_row_element(param, exp_avg, exp_avg_sq, row, d, values[j, d], one_minus_beta1,
                              one_minus_beta2, eps, weight_decay, decay, neg_step_size,
                              decoupled, maximize)


@cuda.jit
def _adam_row_groups(param, grad, rows, used, starts, counts, order, scale_by_freq, exp_avg,
                     exp_avg_sq, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay,
                     decay, neg_step_size, bias_correction2_sqrt, decoupled, amsgrad, maximize,
                     word):
    """:func:`_adam_rows` with each gradient element summed on the spot from its positions."""
    if errors.is_pending(word):
        return
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        row = rows[j]
        for d in range(cuda.threadIdx.x, param.shape[1], cuda.blockDim.x):
            g = segment_sum(grad, order, starts[j], counts[j], scale_by_freq, d)
            _adam_row_element(param, exp_avg, exp_avg_sq, row, d, g, one_minus_beta1,
                              one_minus_beta2, eps, weight_decay, decay, neg_step_size,
                              decoupled, maximize)


# ---------------------------------------------------------------- Adagrad


def adagrad_dense_(param, grad, state_sum, hyper):
    """One ``torch.optim.Adagrad`` step on flat arrays, in place (``hyper``: AdagradHyper)."""
    if param.size:
        _adagrad_dense[grid(param.size), THREADS](param, grad, state_sum,
                                                  *_cast_all(param, hyper), errors.device_word())


def adagrad_rows_(param, rows, values, used, state_sum, hyper):
    """``torch.optim.Adagrad``'s sparse update of the listed (unique) rows of a 2-D ``param``
    (``used`` rows are real, see :func:`sgd_rows_`)."""
    if rows.size and param.shape[1]:
        _adagrad_rows[_row_blocks(rows), _row_threads(param.shape[1])](
            param, rows, _on_device(used), values, state_sum, *_cast_all(param, hyper),
            errors.device_word())


def adagrad_row_groups_(param, grad, groups, scale_grad_by_freq, state_sum, hyper):
    """:func:`adagrad_rows_` fused with the gradient of a lookup (as :func:`sgd_row_groups_`)."""
    if groups.rows.size and param.shape[1]:
        _adagrad_row_groups[_row_blocks(groups.rows), _row_threads(param.shape[1])](
            param, grad, groups.rows, groups.used, groups.starts, groups.counts, groups.order,
            bool(scale_grad_by_freq), state_sum, *_cast_all(param, hyper), errors.device_word())


@cuda.jit(device=True)
def _adagrad_update(p, g, s, neg_clr, weight_decay, eps, maximize):
    # One element, as the CPU's _adagrad_update: (new_p, new_sum).
    if maximize:
        g = -g
    if weight_decay != 0:
        g = g + mul_rn(weight_decay, p)
    s = s + mul_rn(g, g)
    return p + mul_rn(neg_clr, g / (cast_like(math.sqrt(s), s) + eps)), s


@cuda.jit
def _adagrad_dense(param, grad, state_sum, neg_clr, weight_decay, eps, maximize, word):
    """Elementwise Adagrad over flat arrays (grid-stride)."""
    if errors.is_pending(word):
        return
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        p, s = _adagrad_update(param[i], grad[i], state_sum[i], neg_clr, weight_decay, eps,
                               maximize)
        param[i] = p
        state_sum[i] = s


@cuda.jit
def _adagrad_rows(param, rows, used, values, state_sum, neg_clr, weight_decay, eps, maximize,
                  word):
    """Adagrad on rows ``rows[j]``: one block per listed row, threads along D."""
    if errors.is_pending(word):
        return
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        row = rows[j]
        for d in range(cuda.threadIdx.x, param.shape[1], cuda.blockDim.x):
            p, s = _adagrad_update(param[row, d], values[j, d], state_sum[row, d], neg_clr,
                                   weight_decay, eps, maximize)
            param[row, d] = p
            state_sum[row, d] = s


@cuda.jit
def _adagrad_row_groups(param, grad, rows, used, starts, counts, order, scale_by_freq, state_sum,
                        neg_clr, weight_decay, eps, maximize, word):
    """:func:`_adagrad_rows` with each gradient element summed on the spot from its positions."""
    if errors.is_pending(word):
        return
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        row = rows[j]
        for d in range(cuda.threadIdx.x, param.shape[1], cuda.blockDim.x):
            g = segment_sum(grad, order, starts[j], counts[j], scale_by_freq, d)
            p, s = _adagrad_update(param[row, d], g, state_sum[row, d], neg_clr, weight_decay,
                                   eps, maximize)
            param[row, d] = p
            state_sum[row, d] = s


# ---------------------------------------------------------------- row-wise Adagrad


def rowwise_adagrad_dense_(param, grad, state_sum, hyper):
    """FBGEMM's exact row-wise Adagrad on every row of 2-D ``param`` (``grad`` 2-D too).

    ``state_sum`` has one accumulator per row; ``hyper`` is a
    :class:`~numbapos._args.RowWiseAdagradHyper`.
    """
    if param.shape[0] and param.shape[1]:
        _rowwise_dense[grid(param.shape[0]), THREADS](param, grad, state_sum,
                                                      *_rowwise_scalars(param, hyper),
                                                      errors.device_word())


def rowwise_adagrad_rows_(param, rows, values, used, state_sum, hyper):
    """Row-wise Adagrad on the listed (unique) rows of a 2-D ``param`` only (``used`` rows are
    real, see :func:`sgd_rows_`)."""
    if rows.size and param.shape[1]:
        _rowwise_rows[grid(rows.size), THREADS](param, rows, _on_device(used), values, state_sum,
                                                *_rowwise_scalars(param, hyper),
                                                errors.device_word())


def rowwise_adagrad_row_groups_(param, grad, groups, scale_grad_by_freq, state_sum, hyper):
    """:func:`rowwise_adagrad_rows_` fused with the gradient of a lookup (see sgd_row_groups_)."""
    if groups.rows.size and param.shape[1]:
        _rowwise_row_groups[grid(groups.rows.size), THREADS](
            param, grad, groups.rows, groups.used, groups.starts, groups.counts, groups.order,
            bool(scale_grad_by_freq), state_sum, *_rowwise_scalars(param, hyper),
            errors.device_word())


def _rowwise_scalars(param, hyper):
    cast = param.dtype.type
    return (cast(hyper.lr), cast(hyper.eps), cast(hyper.weight_decay), int(hyper.mode),
            cast(param.shape[1]))


@cuda.jit(device=True)
def _rowwise_row(row, j, param, values, state_sum, lr, eps, weight_decay, mode, dim_f):
    # One row, sequentially in one thread (the CPU's order, so the same sum), as the CPU's.
    square_sum = cast_like(0, lr)
    for d in range(param.shape[1]):
        g = values[j, d]
        if mode == 1:
            g = g + mul_rn(weight_decay, param[row, d])
        square_sum += mul_rn(g, g)
    correction, multiplier = _rowwise_factors(row, state_sum, square_sum, lr, eps,
                                              weight_decay, mode, dim_f)
    for d in range(param.shape[1]):
        param[row, d] = mul_rn(correction, param[row, d]) - mul_rn(multiplier, values[j, d])


@cuda.jit(device=True)
def _rowwise_factors(row, state_sum, square_sum, lr, eps, weight_decay, mode, dim_f):
    # Accumulates the row's state; returns (correction, multiplier) of its update.
    one = cast_like(1, lr)
    acc = state_sum[row] + square_sum / dim_f
    state_sum[row] = acc
    multiplier = lr / (cast_like(math.sqrt(acc), acc) + eps)
    correction = one
    if mode == 1:
        correction = one - mul_rn(multiplier, weight_decay)
    elif mode == 2:
        correction = one - mul_rn(lr, weight_decay)
    return correction, multiplier


@cuda.jit
def _rowwise_dense(param, grad, state_sum, lr, eps, weight_decay, mode, dim_f, word):
    """Row-wise Adagrad on every row: one thread per row (grid-stride)."""
    if errors.is_pending(word):
        return
    for r in range(cuda.grid(1), param.shape[0], cuda.gridsize(1)):
        _rowwise_row(r, r, param, grad, state_sum, lr, eps, weight_decay, mode, dim_f)


@cuda.jit
def _rowwise_rows(param, rows, used, values, state_sum, lr, eps, weight_decay, mode, dim_f,
                  word):
    """Row-wise Adagrad on rows ``rows[j]``: one thread per listed row (grid-stride)."""
    if errors.is_pending(word):
        return
    for j in range(cuda.grid(1), used[0], cuda.gridsize(1)):
        _rowwise_row(rows[j], j, param, values, state_sum, lr, eps, weight_decay, mode, dim_f)


@cuda.jit
def _rowwise_row_groups(param, grad, rows, used, starts, counts, order, scale_by_freq, state_sum,
                        lr, eps, weight_decay, mode, dim_f, word):
    """:func:`_rowwise_rows` with the gradient summed on the spot (squares, then update)."""
    if errors.is_pending(word):
        return
    for j in range(cuda.grid(1), used[0], cuda.gridsize(1)):
        row = rows[j]
        square_sum = cast_like(0, lr)
        for d in range(param.shape[1]):
            g = segment_sum(grad, order, starts[j], counts[j], scale_by_freq, d)
            if mode == 1:
                g = g + mul_rn(weight_decay, param[row, d])
            square_sum += mul_rn(g, g)
        correction, multiplier = _rowwise_factors(row, state_sum, square_sum, lr, eps,
                                                  weight_decay, mode, dim_f)
        for d in range(param.shape[1]):
            g = segment_sum(grad, order, starts[j], counts[j], scale_by_freq, d)
            param[row, d] = mul_rn(correction, param[row, d]) - mul_rn(multiplier, g)
