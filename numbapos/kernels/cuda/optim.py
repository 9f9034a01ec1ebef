"""CUDA kernels of the optimisers: one fused pass per parameter, dense or over listed rows.

SGD, Adam/AdamW, Adagrad and row-wise Adagrad (row-wise: one thread per row,
summing along the row in the CPU's order).

The twin of ``kernels/cpu/optim.py``. Both call the same element updates,
:mod:`numbapos.kernels.updates`, with the same hyper-parameter named tuples
(:mod:`numbapos._args`, floats already in the parameter's dtype), so results
are bit-identical to the CPU's for float32 and float64 by construction: there
the products that feed a sum go through ``mul_rn``, which the GPU compiles to
an unfused ``mul.rn`` (NVVM contracts ``a * b + c`` into an FMA by default;
the CPU never does). With ``momentum == 0`` SGD's buffer is never read or
written and may be empty.

Every kernel returns at once while an index error is pending (see
:mod:`.errors`), so a step after a failed lookup changes nothing. The row
updates read how many rows are real from the device (``used``, see
:mod:`.grouping`): the grid is sized by the upper bound and nothing is read
back.

Given a ``rounding`` (:class:`~numbapos._args.HalfRounding`), the sparse
launchers update a bfloat16 / float16 table given as its ``uint16`` bits, in the
same one pass: each thread widens its element to a float32 register, updates it
with the float32 state and hyper-parameters by the same element updates, and
stores it back rounded (:mod:`.convert`: stochastically with the keyed hash of
``(seed, step, row, column)``, or to nearest even), the CPU's bits. SGD's
momentum and Adam's ``exp_avg`` may then be bfloat16 (``uint16`` bits: widened,
updated in float32, stored rounded to nearest even), as on the CPU.
"""

import numpy as np
from numba import cuda, types
from numba.extending import overload

from ..._args import AdagradHyper, AdamHyper, RowWiseAdagradHyper, SGDHyper, WeightDecayMode
from .. import updates
from ..halfbits import bf16_to_f32_bits, f32_bits_to_bf16, half_to_f32_bits
from ..scalar import f32_bits, f32_from_bits
from . import arrays, clock, errors
from .arrays import MAX_BLOCKS, THREADS, grid
from .convert import _rounded, kernel_rounding, rounding_key
from .embedding import segment_sum
from .fpmath import cast_like
from .launch import launch

__all__ = ["adagrad_dense_", "adagrad_row_groups_", "adagrad_rows_", "adam_dense_",
           "adam_row_groups_", "adam_rows_", "rowwise_adagrad_dense_",
           "rowwise_adagrad_row_groups_", "rowwise_adagrad_rows_", "sgd_dense_",
           "sgd_row_groups_", "sgd_rows_"]

_L2 = int(WeightDecayMode.L2)


# ---------------------------------------------------------------- launchers


def sgd_dense_(param, grad, buf, first, hyper):
    """Update flat ``param`` (and flat momentum ``buf``) in place from flat ``grad``.

    ``hyper`` is a :class:`~numbapos._args.SGDHyper` already cast to the
    parameter's dtype; ``first`` says the momentum buffer starts on this step.
    """
    hyper, dyn = clock.split(hyper, param.dtype)
    if param.size:
        launch(_sgd_dense, grid(param.size), THREADS, param, grad, buf, bool(first), hyper, dyn,
               errors.device_word())


def sgd_rows_(param, rows, values, used, buf, row_started, hyper, rounding=None):
    """Lazy SGD on the listed (unique) rows of a 2-D ``param`` only.

    Row ``rows[j]`` gets gradient ``values[j]`` for ``j < used`` (an int, or a
    device array whose first entry is); its momentum row starts fresh the
    first time it is touched (``row_started``, updated here). With a
    ``rounding`` (:class:`~numbapos._args.HalfRounding`) ``param`` is a 16-bit
    table's ``uint16`` bits, stored back rounded by it (see the module), here
    and in every sparse launcher.
    """
    hyper, dyn = _split(hyper, param, rounding)
    if rows.size == 0:
        return
    used, word = _on_device(used), errors.device_word()
    if param.shape[1]:
        kernel, half = _pick(_sgd_rows, _sgd_half_rows, rounding)
        launch(kernel, _row_blocks(rows), _row_threads(param.shape[1]), param, rows, used,
               values, buf, row_started, hyper, dyn, *half, word)
    if hyper.momentum != 0:
        # A second launch, so no block can see a flag that another set this step
        # (rows are unique, but the flags are read above and set only here).
        launch(_mark_started, grid(rows.size), THREADS, rows, used, row_started, word)


def sgd_row_groups_(param, grad, groups, scale_grad_by_freq, buf, row_started, hyper,
                    rounding=None):
    """Lazy SGD fused with the gradient of a lookup: one pass over the rows used.

    One block per row of ``groups`` (:class:`~numbapos._args.RowGroups`); each
    thread sums its columns over the row's positions (the scatter's
    ``segment_sum``) and applies the update at once, so the ``(rows, D)``
    gradient is never stored. Same bits as ``sum_row_groups`` then
    :func:`sgd_rows_`, and as the CPU.
    """
    hyper, dyn = _split(hyper, param, rounding)
    if groups.rows.size == 0:
        return
    word = errors.device_word()
    if param.shape[1]:
        kernel, half = _pick(_sgd_row_groups, _sgd_half_row_groups, rounding)
        launch(kernel, _row_blocks(groups.rows), _row_threads(param.shape[1]), param, grad,
               groups, bool(scale_grad_by_freq), buf, row_started, hyper, dyn, *half, word)
    if hyper.momentum != 0:
        launch(_mark_started, grid(groups.rows.size), THREADS, groups.rows, groups.used,
               row_started, word)


def adam_dense_(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, hyper):
    """One ``torch.optim.Adam`` step on flat arrays, in place.

    ``hyper`` is an :class:`~numbapos._args.AdamHyper` (dense step size);
    ``max_exp_avg_sq`` is read and written only with ``amsgrad`` (may be empty).
    """
    hyper, dyn = clock.split(hyper, param.dtype)
    if param.size:
        launch(_adam_dense, grid(param.size), THREADS, param, grad, exp_avg, exp_avg_sq,
               max_exp_avg_sq, hyper, dyn, errors.device_word())


def adam_rows_(param, rows, values, used, exp_avg, exp_avg_sq, hyper, rounding=None):
    """``torch.optim.SparseAdam``'s update of the listed (unique) rows of a 2-D ``param``.

    Row ``rows[j]`` gets gradient ``values[j]``; only those rows of ``param``
    and of the moments are read and written. ``hyper`` carries the sparse
    step size. ``used`` rows are real (see :func:`sgd_rows_`).
    """
    hyper, dyn = _split(hyper, param, rounding)
    if rows.size and param.shape[1]:
        kernel, half = _pick(_adam_rows, _adam_half_rows, rounding)
        launch(kernel, _row_blocks(rows), _row_threads(param.shape[1]), param, rows,
               _on_device(used), values, exp_avg, exp_avg_sq, hyper, dyn, *half,
               errors.device_word())


def adam_row_groups_(param, grad, groups, scale_grad_by_freq, exp_avg, exp_avg_sq, hyper,
                     rounding=None):
    """:func:`adam_rows_` fused with the gradient of a lookup (as :func:`sgd_row_groups_`)."""
    hyper, dyn = _split(hyper, param, rounding)
    if groups.rows.size and param.shape[1]:
        kernel, half = _pick(_adam_row_groups, _adam_half_row_groups, rounding)
        launch(kernel, _row_blocks(groups.rows), _row_threads(param.shape[1]), param, grad,
               groups, bool(scale_grad_by_freq), exp_avg, exp_avg_sq, hyper, dyn, *half,
               errors.device_word())


def adagrad_dense_(param, grad, state_sum, hyper):
    """One ``torch.optim.Adagrad`` step on flat arrays, in place (``hyper``: AdagradHyper)."""
    hyper, dyn = clock.split(hyper, param.dtype)
    if param.size:
        launch(_adagrad_dense, grid(param.size), THREADS, param, grad, state_sum, hyper, dyn,
               errors.device_word())


def adagrad_rows_(param, rows, values, used, state_sum, hyper, rounding=None):
    """``torch.optim.Adagrad``'s sparse update of the listed (unique) rows of a 2-D ``param``
    (``used`` rows are real, see :func:`sgd_rows_`)."""
    hyper, dyn = _split(hyper, param, rounding)
    if rows.size and param.shape[1]:
        kernel, half = _pick(_adagrad_rows, _adagrad_half_rows, rounding)
        launch(kernel, _row_blocks(rows), _row_threads(param.shape[1]), param, rows,
               _on_device(used), values, state_sum, hyper, dyn, *half, errors.device_word())


def adagrad_row_groups_(param, grad, groups, scale_grad_by_freq, state_sum, hyper,
                        rounding=None):
    """:func:`adagrad_rows_` fused with the gradient of a lookup (as :func:`sgd_row_groups_`)."""
    hyper, dyn = _split(hyper, param, rounding)
    if groups.rows.size and param.shape[1]:
        kernel, half = _pick(_adagrad_row_groups, _adagrad_half_row_groups, rounding)
        launch(kernel, _row_blocks(groups.rows), _row_threads(param.shape[1]), param, grad,
               groups, bool(scale_grad_by_freq), state_sum, hyper, dyn, *half,
               errors.device_word())


def rowwise_adagrad_dense_(param, grad, state_sum, hyper):
    """FBGEMM's exact row-wise Adagrad on every row of 2-D ``param`` (``grad`` 2-D too).

    ``state_sum`` has one accumulator per row; ``hyper`` is a
    :class:`~numbapos._args.RowWiseAdagradHyper`.
    """
    hyper, dyn = clock.split(hyper, param.dtype)
    if param.shape[0] and param.shape[1]:
        launch(_rowwise_dense, grid(param.shape[0]), THREADS, param, grad, state_sum, hyper, dyn,
               errors.device_word())


def rowwise_adagrad_rows_(param, rows, values, used, state_sum, hyper, rounding=None):
    """Row-wise Adagrad on the listed (unique) rows of a 2-D ``param`` only (``used`` rows are
    real, see :func:`sgd_rows_`)."""
    hyper, dyn = _split(hyper, param, rounding)
    if rows.size and param.shape[1]:
        kernel, half = _pick(_rowwise_rows, _rowwise_half_rows, rounding)
        launch(kernel, grid(rows.size), THREADS, param, rows, _on_device(used), values,
               state_sum, hyper, dyn, *half, errors.device_word())


def rowwise_adagrad_row_groups_(param, grad, groups, scale_grad_by_freq, state_sum, hyper,
                                rounding=None):
    """:func:`rowwise_adagrad_rows_` fused with the gradient of a lookup (see sgd_row_groups_)."""
    hyper, dyn = _split(hyper, param, rounding)
    if groups.rows.size and param.shape[1]:
        kernel, half = _pick(_rowwise_row_groups, _rowwise_half_row_groups, rounding)
        launch(kernel, grid(groups.rows.size), THREADS, param, grad, groups,
               bool(scale_grad_by_freq), state_sum, hyper, dyn, *half, errors.device_word())


def _split(hyper, param, rounding):
    """:func:`.clock.split` for ``param``'s arithmetic: float32 for a 16-bit table."""
    return clock.split(hyper, param.dtype if rounding is None else np.float32)


def _pick(kernel, half_kernel, rounding):
    """``(kernel, args)`` of a sparse launcher: the float kernel and no more arguments, or
    with a ``rounding`` the 16-bit table's kernel and its :func:`.convert.kernel_rounding`."""
    if rounding is None:
        return kernel, ()
    return half_kernel, (kernel_rounding(rounding),)


def _on_device(used):
    """The count of real rows as a device array (``[used, 0]``) for kernels to read."""
    if isinstance(used, int):
        return arrays.asarray(np.array([used, 0], np.int64))
    return used


def _row_blocks(rows) -> int:
    """Blocks of a one-block-per-row kernel over at most ``rows.size`` rows."""
    return max(1, min(int(rows.size), MAX_BLOCKS))


def _row_threads(dim: int) -> int:
    """Threads of a per-row block: a whole number of warps covering ``dim``, at most THREADS."""
    return min(THREADS, -(-dim // 32) * 32)


# ---------------------------------------------------------------- step-dependent scalars
# ``dyn`` holds the step's scalars when an optimiser clock computed them on the device
# (kernels/cuda/clock.py: a captured step advances them on every replay); it is empty
# when the host's values in ``h`` hold.


@cuda.jit(device=True)
def _live_sgd(h, dyn):
    if dyn.size == 0:
        return h
    return SGDHyper(dyn[0], h.momentum, h.one_minus_dampening, h.weight_decay, h.nesterov,
                    h.maximize)


@cuda.jit(device=True)
def _live_adam(h, dyn):
    if dyn.size == 0:
        return h
    return AdamHyper(h.one_minus_beta1, h.beta2, h.one_minus_beta2, h.eps, h.weight_decay,
                     dyn[0], dyn[1], dyn[2], h.decoupled, h.amsgrad, h.maximize)


@cuda.jit(device=True)
def _live_adagrad(h, dyn):
    if dyn.size == 0:
        return h
    return AdagradHyper(dyn[0], h.weight_decay, h.eps, h.maximize)


@cuda.jit(device=True)
def _live_rowwise(h, dyn):
    if dyn.size == 0:
        return h
    return RowWiseAdagradHyper(dyn[0], h.eps, h.weight_decay, h.mode)


# ---------------------------------------------------------------- SGD kernels


@cuda.jit(device=True)
def _sgd_flat(param, buf, i, g, first, h, decay):
    # Element i of flat param (and of the momentum buffer) with gradient g.
    if h.momentum != 0:
        param[i], buf[i] = updates.sgd_momentum_update(param[i], g, buf[i], h, first,
                                                       h.nesterov, h.maximize, decay)
    else:
        param[i] = updates.sgd_plain_update(param[i], g, h, h.maximize, decay)


@cuda.jit(device=True)
def _sgd_cell(param, buf, row, d, g, first, h, decay):
    # Element (row, d) of a 2-D param (and of the momentum buffer) with gradient g.
    if h.momentum != 0:
        param[row, d], buf[row, d] = updates.sgd_momentum_update(
            param[row, d], g, buf[row, d], h, first, h.nesterov, h.maximize, decay)
    else:
        param[row, d] = updates.sgd_plain_update(param[row, d], g, h, h.maximize, decay)


@cuda.jit
def _sgd_dense(param, grad, buf, first, h, dyn, word):
    """Elementwise SGD over flat arrays (grid-stride)."""
    if errors.is_pending(word):
        return
    h = _live_sgd(h, dyn)
    decay = h.weight_decay != 0
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        _sgd_flat(param, buf, i, grad[i], first, h, decay)


@cuda.jit
def _sgd_rows(param, rows, used, values, buf, row_started, h, dyn, word):
    """SGD on rows ``rows[j]`` of a 2-D ``param``: one block per listed row, threads along D."""
    if errors.is_pending(word):
        return
    h = _live_sgd(h, dyn)
    decay = h.weight_decay != 0
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        row = rows[j]
        first = h.momentum != 0 and not row_started[row]
        for d in range(cuda.threadIdx.x, param.shape[1], cuda.blockDim.x):
            _sgd_cell(param, buf, row, d, values[j, d], first, h, decay)


@cuda.jit
def _sgd_row_groups(param, grad, groups, scale_by_freq, buf, row_started, h, dyn, word):
    """:func:`_sgd_rows` with each gradient element summed on the spot from its positions."""
    if errors.is_pending(word):
        return
    h = _live_sgd(h, dyn)
    decay = h.weight_decay != 0
    for j in range(cuda.blockIdx.x, groups.used[0], cuda.gridDim.x):
        row = groups.rows[j]
        first = h.momentum != 0 and not row_started[row]
        for d in range(cuda.threadIdx.x, param.shape[1], cuda.blockDim.x):
            g = segment_sum(grad, groups.order, groups.starts[j], groups.counts[j],
                            scale_by_freq, d)
            _sgd_cell(param, buf, row, d, g, first, h, decay)


@cuda.jit
def _mark_started(rows, used, row_started, word):
    """``row_started[rows[j]] = True`` (elementwise)."""
    if errors.is_pending(word):
        return
    for j in range(cuda.grid(1), used[0], cuda.gridsize(1)):
        row_started[rows[j]] = True


# ---------------------------------------------------------------- Adam / AdamW kernels


@cuda.jit
def _adam_dense(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h, dyn, word):
    """Elementwise Adam over flat arrays (grid-stride), torch.optim.Adam's operations."""
    if errors.is_pending(word):
        return
    h = _live_adam(h, dyn)
    l2, decoupled = updates.adam_decay_flags(h)
    low_weight = h.one_minus_beta1 < 0.5
    beta1 = cast_like(1, h.beta2) - h.one_minus_beta1
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        p, g = updates.adam_prologue(param[i], grad[i], h, h.maximize, l2, decoupled)
        m, v = updates.adam_moments(g, exp_avg[i], exp_avg_sq[i], h, low_weight, beta1)
        exp_avg[i] = m
        exp_avg_sq[i] = v
        if h.amsgrad:
            if max_exp_avg_sq[i] > v:
                v = max_exp_avg_sq[i]
            max_exp_avg_sq[i] = v
        param[i] = updates.adam_dense_param(p, m, v, h)


@cuda.jit(device=True)
def _sparse_adam_element(param, exp_avg, exp_avg_sq, row, d, g, h, l2, decoupled):
    param[row, d], exp_avg[row, d], exp_avg_sq[row, d] = updates.sparse_adam_update(
        param[row, d], g, exp_avg[row, d], exp_avg_sq[row, d], h, l2, decoupled)


@cuda.jit
def _adam_rows(param, rows, used, values, exp_avg, exp_avg_sq, h, dyn, word):
    """SparseAdam on rows ``rows[j]``: one block per listed row, threads along D."""
    if errors.is_pending(word):
        return
    h = _live_adam(h, dyn)
    l2, decoupled = updates.adam_decay_flags(h)
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        row = rows[j]
        for d in range(cuda.threadIdx.x, param.shape[1], cuda.blockDim.x):
            _sparse_adam_element(param, exp_avg, exp_avg_sq, row, d, values[j, d], h, l2,
                                 decoupled)


@cuda.jit
def _adam_row_groups(param, grad, groups, scale_by_freq, exp_avg, exp_avg_sq, h, dyn, word):
    """:func:`_adam_rows` with each gradient element summed on the spot from its positions."""
    if errors.is_pending(word):
        return
    h = _live_adam(h, dyn)
    l2, decoupled = updates.adam_decay_flags(h)
    for j in range(cuda.blockIdx.x, groups.used[0], cuda.gridDim.x):
        row = groups.rows[j]
        for d in range(cuda.threadIdx.x, param.shape[1], cuda.blockDim.x):
            g = segment_sum(grad, groups.order, groups.starts[j], groups.counts[j],
                            scale_by_freq, d)
            _sparse_adam_element(param, exp_avg, exp_avg_sq, row, d, g, h, l2, decoupled)


# ---------------------------------------------------------------- Adagrad kernels


@cuda.jit
def _adagrad_dense(param, grad, state_sum, h, dyn, word):
    """Elementwise Adagrad over flat arrays (grid-stride)."""
    if errors.is_pending(word):
        return
    h = _live_adagrad(h, dyn)
    decay = h.weight_decay != 0
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        param[i], state_sum[i] = updates.adagrad_update(param[i], grad[i], state_sum[i], h,
                                                        decay)


@cuda.jit
def _adagrad_rows(param, rows, used, values, state_sum, h, dyn, word):
    """Adagrad on rows ``rows[j]``: one block per listed row, threads along D."""
    if errors.is_pending(word):
        return
    h = _live_adagrad(h, dyn)
    decay = h.weight_decay != 0
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        row = rows[j]
        for d in range(cuda.threadIdx.x, param.shape[1], cuda.blockDim.x):
            param[row, d], state_sum[row, d] = updates.adagrad_update(
                param[row, d], values[j, d], state_sum[row, d], h, decay)


@cuda.jit
def _adagrad_row_groups(param, grad, groups, scale_by_freq, state_sum, h, dyn, word):
    """:func:`_adagrad_rows` with each gradient element summed on the spot from its positions."""
    if errors.is_pending(word):
        return
    h = _live_adagrad(h, dyn)
    decay = h.weight_decay != 0
    for j in range(cuda.blockIdx.x, groups.used[0], cuda.gridDim.x):
        row = groups.rows[j]
        for d in range(cuda.threadIdx.x, param.shape[1], cuda.blockDim.x):
            g = segment_sum(grad, groups.order, groups.starts[j], groups.counts[j],
                            scale_by_freq, d)
            param[row, d], state_sum[row, d] = updates.adagrad_update(
                param[row, d], g, state_sum[row, d], h, decay)


# ---------------------------------------------------------------- row-wise Adagrad kernels


@cuda.jit(device=True)
def _rowwise_row(row, j, param, values, state_sum, h):
    # One row, sequentially in one thread (the CPU's order, so the same sum).
    l2 = h.mode == _L2
    square_sum = cast_like(0, h.lr)
    for d in range(param.shape[1]):
        square_sum += updates.rowwise_term(values[j, d], param[row, d], h, l2)
    acc, correction, multiplier = updates.rowwise_factors(
        state_sum[row], square_sum, cast_like(param.shape[1], h.lr), cast_like(1, h.lr), h)
    state_sum[row] = acc
    for d in range(param.shape[1]):
        param[row, d] = updates.rowwise_apply(param[row, d], values[j, d], correction,
                                              multiplier)


@cuda.jit
def _rowwise_dense(param, grad, state_sum, h, dyn, word):
    """Row-wise Adagrad on every row: one thread per row (grid-stride)."""
    if errors.is_pending(word):
        return
    h = _live_rowwise(h, dyn)
    for r in range(cuda.grid(1), param.shape[0], cuda.gridsize(1)):
        _rowwise_row(r, r, param, grad, state_sum, h)


@cuda.jit
def _rowwise_rows(param, rows, used, values, state_sum, h, dyn, word):
    """Row-wise Adagrad on rows ``rows[j]``: one thread per listed row (grid-stride)."""
    if errors.is_pending(word):
        return
    h = _live_rowwise(h, dyn)
    for j in range(cuda.grid(1), used[0], cuda.gridsize(1)):
        _rowwise_row(rows[j], j, param, values, state_sum, h)


@cuda.jit
def _rowwise_row_groups(param, grad, groups, scale_by_freq, state_sum, h, dyn, word):
    """:func:`_rowwise_rows` with the gradient summed on the spot (squares, then update)."""
    if errors.is_pending(word):
        return
    h = _live_rowwise(h, dyn)
    l2 = h.mode == _L2
    for j in range(cuda.grid(1), groups.used[0], cuda.gridsize(1)):
        row = groups.rows[j]
        start, count = groups.starts[j], groups.counts[j]
        square_sum = cast_like(0, h.lr)
        for d in range(param.shape[1]):
            g = segment_sum(grad, groups.order, start, count, scale_by_freq, d)
            square_sum += updates.rowwise_term(g, param[row, d], h, l2)
        acc, correction, multiplier = updates.rowwise_factors(
            state_sum[row], square_sum, cast_like(param.shape[1], h.lr), cast_like(1, h.lr), h)
        state_sum[row] = acc
        for d in range(param.shape[1]):
            g = segment_sum(grad, groups.order, start, count, scale_by_freq, d)
            param[row, d] = updates.rowwise_apply(param[row, d], g, correction, multiplier)


# ---------------------------------------------------------------- 16-bit tables


@cuda.jit(device=True)
def _load(table, row, d, fmt):
    return f32_from_bits(half_to_f32_bits(table[row, d], fmt))


@cuda.jit(device=True)
def _store(table, row, d, value, key, rounding):
    table[row, d] = _rounded(f32_bits(value), key, row, d, rounding)


def _is_bf16(state):
    """Whether a state holds bfloat16 bits (``uint16``) rather than float32 values: read
    here on the simulator, a constant of the state's type when a kernel is compiled."""
    return state.dtype == np.uint16


@overload(_is_bf16, target="generic", inline="always")
def _is_bf16_typed(state):
    bf16 = state.dtype == types.uint16
    return lambda state: bf16


@cuda.jit(device=True)
def _load_state(state, row, d):
    # Element (row, d) of a float32 state, or of a bfloat16 one (its bits), as float32.
    x = state[row, d]
    if _is_bf16(state):
        return f32_from_bits(bf16_to_f32_bits(x))
    return np.float32(x)


@cuda.jit(device=True)
def _store_state(state, row, d, value):
    # The float32 ``value`` into a float32 state, or into a bfloat16 one rounded to nearest.
    if _is_bf16(state):
        state[row, d] = f32_bits_to_bf16(f32_bits(value))
    else:
        state[row, d] = value


@cuda.jit(device=True)
def _group_gradient(grad, groups, scale_by_freq, j, d):
    return segment_sum(grad, groups.order, groups.starts[j], groups.counts[j], scale_by_freq, d)


@cuda.jit(device=True)
def _sgd_element(table, buf, row, d, g, first, h, decay, key, rounding):
    p = _load(table, row, d, rounding.fmt)
    if h.momentum != 0:
        p, b = updates.sgd_momentum_update(p, g, _load_state(buf, row, d), h, first,
                                           h.nesterov, h.maximize, decay)
        _store_state(buf, row, d, b)
    else:
        p = updates.sgd_plain_update(p, g, h, h.maximize, decay)
    _store(table, row, d, p, key, rounding)


@cuda.jit
def _sgd_half_rows(table, rows, used, values, buf, row_started, h, dyn, rounding, word):
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
            _sgd_element(table, buf, row, d, values[j, d], first, h, decay, key, rounding)


@cuda.jit
def _sgd_half_row_groups(table, grad, groups, scale_by_freq, buf, row_started, h, dyn,
                         rounding, word):
    """:func:`_sgd_half_rows` with each gradient element summed on the spot from its
    positions."""
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
            _sgd_element(table, buf, row, d, g, first, h, decay, key, rounding)


@cuda.jit(device=True)
def _adam_element(table, exp_avg, exp_avg_sq, row, d, g, h, key, rounding):
    l2, decoupled = updates.adam_decay_flags(h)
    p, m, exp_avg_sq[row, d] = updates.sparse_adam_update(
        _load(table, row, d, rounding.fmt), g, _load_state(exp_avg, row, d),
        exp_avg_sq[row, d], h, l2, decoupled)
    _store_state(exp_avg, row, d, m)
    _store(table, row, d, p, key, rounding)


@cuda.jit
def _adam_half_rows(table, rows, used, values, exp_avg, exp_avg_sq, h, dyn, rounding, word):
    """SparseAdam on rows ``rows[j]``: one block per listed row, threads along D."""
    if errors.is_pending(word):
        return
    key = rounding_key(rounding)
    h = _live_adam(h, dyn)
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        for d in range(cuda.threadIdx.x, table.shape[1], cuda.blockDim.x):
            _adam_element(table, exp_avg, exp_avg_sq, rows[j], d, values[j, d], h, key,
                          rounding)


@cuda.jit
def _adam_half_row_groups(table, grad, groups, scale_by_freq, exp_avg, exp_avg_sq, h, dyn,
                          rounding, word):
    """:func:`_adam_half_rows` with each gradient element summed on the spot from its
    positions."""
    if errors.is_pending(word):
        return
    key = rounding_key(rounding)
    h = _live_adam(h, dyn)
    for j in range(cuda.blockIdx.x, groups.used[0], cuda.gridDim.x):
        for d in range(cuda.threadIdx.x, table.shape[1], cuda.blockDim.x):
            g = _group_gradient(grad, groups, scale_by_freq, j, d)
            _adam_element(table, exp_avg, exp_avg_sq, groups.rows[j], d, g, h, key, rounding)


@cuda.jit(device=True)
def _adagrad_element(table, state_sum, row, d, g, h, key, rounding):
    p, state_sum[row, d] = updates.adagrad_update(_load(table, row, d, rounding.fmt), g,
                                                  state_sum[row, d], h, h.weight_decay != 0)
    _store(table, row, d, p, key, rounding)


@cuda.jit
def _adagrad_half_rows(table, rows, used, values, state_sum, h, dyn, rounding, word):
    """Adagrad on rows ``rows[j]``: one block per listed row, threads along D."""
    if errors.is_pending(word):
        return
    key = rounding_key(rounding)
    h = _live_adagrad(h, dyn)
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        for d in range(cuda.threadIdx.x, table.shape[1], cuda.blockDim.x):
            _adagrad_element(table, state_sum, rows[j], d, values[j, d], h, key, rounding)


@cuda.jit
def _adagrad_half_row_groups(table, grad, groups, scale_by_freq, state_sum, h, dyn, rounding,
                             word):
    """:func:`_adagrad_half_rows` with each gradient element summed on the spot from its
    positions."""
    if errors.is_pending(word):
        return
    key = rounding_key(rounding)
    h = _live_adagrad(h, dyn)
    for j in range(cuda.blockIdx.x, groups.used[0], cuda.gridDim.x):
        for d in range(cuda.threadIdx.x, table.shape[1], cuda.blockDim.x):
            g = _group_gradient(grad, groups, scale_by_freq, j, d)
            _adagrad_element(table, state_sum, groups.rows[j], d, g, h, key, rounding)


@cuda.jit(device=True)
def _rowwise_factors(table, row, square_sum, state_sum, h):
    acc, correction, multiplier = updates.rowwise_factors(
        state_sum[row], square_sum, np.float32(table.shape[1]), np.float32(1), h)
    state_sum[row] = acc
    return correction, multiplier


@cuda.jit
def _rowwise_half_rows(table, rows, used, values, state_sum, h, dyn, rounding, word):
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
def _rowwise_half_row_groups(table, grad, groups, scale_by_freq, state_sum, h, dyn, rounding,
                             word):
    """:func:`_rowwise_half_rows` with the gradient summed on the spot (squares, then update)."""
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
