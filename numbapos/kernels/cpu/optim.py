"""CPU kernels of the optimisers: one fused pass per parameter, dense or over listed rows.

SGD, Adam/AdamW (dense: ``torch.optim.Adam``; listed rows:
``torch.optim.SparseAdam``), Adagrad (``torch.optim.Adagrad``, dense and
sparse) and FBGEMM's exact row-wise Adagrad. The arithmetic follows the
reference operation for operation, in the parameter's dtype (scalars arrive
already cast to it), so results match step for step. With ``momentum == 0``
SGD's buffer is never read or written and may be empty; so is Adam's
``max_exp_avg_sq`` without ``amsgrad``. The element updates themselves are
:mod:`numbapos.kernels.updates`, shared with the CUDA twins.

Given a ``rounding`` (:class:`~numbapos._args.HalfRounding`), the sparse
launchers step a bfloat16 / float16 table, ``param`` being its ``uint16`` bits,
in one pass (the ``_half_*`` kernels): each element is widened to float32 in a
register (:mod:`numbapos.kernels.halfbits`), updated with the float32 state by
the same element updates and stored back rounded, stochastically with the keyed
hash of ``(seed, step, row, column)``
(:func:`~numbapos.kernels.hash.rounding_bits`) or to nearest even. No float32
copy of the table is made, and the bits are those of widening the rows,
running the float32 update and storing them rounded (``functional.widen_table``,
the float launchers, ``store_rounded_``), for any thread count and on the GPU.
SGD's momentum buffer and Adam's ``exp_avg`` may then be bfloat16 (its
``uint16`` bits): widened exactly, updated in float32, stored back rounded to
nearest even.
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
from .branchless import choose
from .embedding import group_gradient
from .jit import kernel
from .prefetch import AHEAD, half_prefetch_listed_for_write, prefetch_listed_for_write

__all__ = ["adagrad_dense_", "adagrad_row_groups_", "adagrad_rows_", "adam_dense_",
           "adam_row_groups_", "adam_rows_", "rowwise_adagrad_dense_",
           "rowwise_adagrad_row_groups_", "rowwise_adagrad_rows_", "sgd_dense_",
           "sgd_row_groups_", "sgd_rows_"]


def sgd_dense_(param, grad, buf, first, hyper):
    """Update flat ``param`` (and flat momentum ``buf``) in place from flat ``grad``.

    ``hyper`` is a :class:`~numbapos.kernels.args.SGDHyper` already cast to the
    parameter's dtype; ``first`` says the momentum buffer starts on this step.
    """
    if param.size:
        pick(_sgd_dense, param.size)(param, grad, buf, first, hyper)


def sgd_rows_(param, rows, values, used, buf, row_started, hyper, rounding=None):
    """Lazy SGD on the listed (unique) rows of a 2-D ``param`` only.

    Row ``rows[j]`` gets gradient ``values[j]``; its momentum row starts fresh
    the first time it is touched (``row_started``, updated here). With a
    ``rounding``, ``param`` is a 16-bit table's bits (see the module docstring).
    """
    rows, values = rows[:used], values[:used]  # exact on the CPU: used == rows.size
    if rounding is not None:
        _half_rows(_half_sgd, param, rows, values, rounding,
                   *_half_sgd_state(buf, row_started, hyper))
    elif rows.size:
        work = rows.size * param.shape[1]
        pick(_sgd_rows, work)(param, rows, values, *_sgd_variant(buf, hyper), row_started, hyper)


def sgd_row_groups_(param, grad, groups, scale_grad_by_freq, buf, row_started, hyper,
                    rounding=None):
    """Lazy SGD fused with the gradient of a lookup: one pass over the rows used.

    Row ``groups.rows[j]`` gets the sum of ``grad`` over its positions
    (:class:`~numbapos._args.RowGroups`, divided by the count with
    ``scale_grad_by_freq``), summed into a per-thread row of scratch and applied
    at once: the ``(rows, D)`` gradient is never stored. Same bits as
    ``sum_row_groups`` followed by :func:`sgd_rows_` (``rounding`` as there).
    """
    if rounding is not None:
        _half_groups(_half_sgd, param, grad, groups, scale_grad_by_freq, rounding,
                     *_half_sgd_state(buf, row_started, hyper))
    else:
        _run_row_groups(_sgd_row_groups, param, grad, groups, scale_grad_by_freq,
                        *_sgd_variant(buf, hyper), row_started, hyper)


def _sgd_variant(buf, hyper):
    """``(buf, general)`` for the row kernels: the code they compile follows the options.

    ``buf`` is None without momentum; ``general`` is None for SGD's usual
    options (no Nesterov, maximize or weight decay), else True (see
    :func:`.arrays.option`). A kernel is compiled with one of the four row
    loops only, which shortens its compilation.
    """
    usual = not (hyper.nesterov or hyper.maximize or hyper.weight_decay != 0)
    return (buf if hyper.momentum != 0 else None), option(not usual)


def _run_row_groups(kernels, param, grad, groups, scale_grad_by_freq, *rest, accumulators=1):
    """Run a fused row-group update: ``kernel(param, grad, groups, scale, scratch, *rest)``.

    The scratch holds one row per chunk of rows, each chunk summing its rows'
    gradients into its own row (``accumulators`` rows of D side by side, for
    a kernel that sums several groups at once): one chunk (the serial kernel
    of the ``kernels`` pair) for small work, else a few per thread (the
    parallel one). Nothing runs without rows.
    """
    used = groups.rows.size
    if used == 0:
        return
    dim = param.shape[1]
    chunks = min(used, 4 * numba.get_num_threads()) if runs_parallel(used * dim) else 1
    scratch = np.empty((chunks, accumulators * dim), param.dtype)
    run = kernels.parallel if chunks > 1 else kernels.serial
    run(param, grad, groups, option(scale_grad_by_freq), scratch, *rest)


# The element updates pick between their options with ``choose`` (a select, no
# branch): written with ``if``, the options were branches inside the row loops,
# which LLVM left scalar. Only a state that an option may leave absent (SGD's
# momentum buffer) gets a loop of its own. The dense updates stream whole arrays
# at memory speed either way and keep one loop each (a loop per option only
# lengthened their compilation).
_sgd_plain_update = updates.sgd_plain_update
_sgd_momentum_update = updates.sgd_momentum_update


@kernel(inline="always")
def _sgd_dense_at(i, param, grad, buf, first, h, decay):
    if h.momentum != 0:
        param[i], buf[i] = _sgd_momentum_update(param[i], grad[i], buf[i], h, first, h.nesterov,
                                                h.maximize, decay)
    else:
        param[i] = _sgd_plain_update(param[i], grad[i], h, h.maximize, decay)


@kernel(parallel=True)
def _sgd_dense(param, grad, buf, first, hyper):
    decay = hyper.weight_decay != 0
    for i in prange(param.size):
        _sgd_dense_at(i, param, grad, buf, first, hyper, decay)


# The sparse SGD kernels hold one of four row loops (plain or momentum, SGD's usual
# options or any others), picked by ``buf`` and ``general`` (None or not, see
# _sgd_variant) when Numba compiles the kernel. The choice is made in the kernel
# itself, not in a helper: Numba prunes an ``is None`` branch on a kernel's own
# arguments before it inlines the helpers, so the other three loops are never
# copied in (less compilation than choosing inside an inlined helper).
# The usual options get loops with the other options as literals: they pay for no selects.
@kernel(inline="always")
def _sgd_plain_row(row, g, param, h, maximize, decay):
    # Row ``row`` of ``param`` with gradient row ``g`` (1-D), no momentum.
    for d in range(param.shape[1]):
        param[row, d] = _sgd_plain_update(param[row, d], g[d], h, maximize, decay)


@kernel(inline="always")
def _sgd_momentum_row(row, g, param, buf, row_started, h, nesterov, maximize, decay):
    # As _sgd_plain_row with momentum; a row's momentum starts fresh the first
    # time the row is touched.
    first = not row_started[row]
    for d in range(param.shape[1]):
        param[row, d], buf[row, d] = _sgd_momentum_update(param[row, d], g[d], buf[row, d], h,
                                                          first, nesterov, maximize, decay)
    row_started[row] = True


@kernel(inline="always")
def _sgd_plain_entry(j, param, rows, values, h, maximize, decay):
    prefetch_listed_for_write(param, rows, j + AHEAD)
    _sgd_plain_row(rows[j], values[j], param, h, maximize, decay)


@kernel(inline="always")
def _sgd_momentum_entry(j, param, rows, values, buf, row_started, h, nesterov, maximize, decay):
    prefetch_listed_for_write(param, rows, j + AHEAD)
    prefetch_listed_for_write(buf, rows, j + AHEAD)
    _sgd_momentum_row(rows[j], values[j], param, buf, row_started, h, nesterov, maximize, decay)


@kernel(parallel=True)
def _sgd_rows(param, rows, values, buf, general, row_started, h):
    if buf is None:
        if general is None:
            for j in prange(rows.size):
                _sgd_plain_entry(j, param, rows, values, h, False, False)
        else:
            for j in prange(rows.size):
                _sgd_plain_entry(j, param, rows, values, h, h.maximize, h.weight_decay != 0)
    elif general is None:
        for j in prange(rows.size):
            _sgd_momentum_entry(j, param, rows, values, buf, row_started, h, False, False, False)
    else:
        for j in prange(rows.size):
            _sgd_momentum_entry(j, param, rows, values, buf, row_started, h, h.nesterov,
                                h.maximize, h.weight_decay != 0)


# Each optimiser has its own chunk loop and kernel: a kernel that took the row
# update as an argument (a Numba dispatcher) would never load from the cache.
@kernel(inline="always")
def _chunk_bounds(chunk, used, chunks):
    # The rows of chunk ``chunk`` of ``chunks`` (summed through scratch[chunk]):
    # chunk * used / chunks .. (chunk + 1) * used / chunks.
    return chunk * used // chunks, (chunk + 1) * used // chunks


@kernel(inline="always")
def _sgd_plain_chunk(chunk, param, grad, groups, scale_by_freq, scratch, h, maximize, decay):
    acc = scratch[chunk]
    for j in range(*_chunk_bounds(chunk, groups.rows.size, scratch.shape[0])):
        prefetch_listed_for_write(param, groups.rows, j + AHEAD)
        g = group_gradient(grad, groups, j, scale_by_freq, acc)
        _sgd_plain_row(groups.rows[j], g, param, h, maximize, decay)


@kernel(inline="always")
def _sgd_momentum_chunk(chunk, param, grad, groups, scale_by_freq, scratch, buf, row_started,
                        h, nesterov, maximize, decay):
    acc = scratch[chunk]
    for j in range(*_chunk_bounds(chunk, groups.rows.size, scratch.shape[0])):
        prefetch_listed_for_write(param, groups.rows, j + AHEAD)
        prefetch_listed_for_write(buf, groups.rows, j + AHEAD)
        g = group_gradient(grad, groups, j, scale_by_freq, acc)
        _sgd_momentum_row(groups.rows[j], g, param, buf, row_started, h, nesterov, maximize,
                          decay)


@kernel(parallel=True)
def _sgd_row_groups(param, grad, groups, scale_by_freq, scratch, buf, general, row_started, h):
    # The loop of _sgd_rows's variant (see there) over the row groups, one chunk of rows
    # per scratch row; rows are unique, so chunks never share a row.
    chunks = scratch.shape[0]
    if buf is None:
        if general is None:
            for chunk in prange(chunks):
                _sgd_plain_chunk(chunk, param, grad, groups, scale_by_freq, scratch, h, False,
                                 False)
        else:
            for chunk in prange(chunks):
                _sgd_plain_chunk(chunk, param, grad, groups, scale_by_freq, scratch, h,
                                 h.maximize, h.weight_decay != 0)
    elif general is None:
        for chunk in prange(chunks):
            _sgd_momentum_chunk(chunk, param, grad, groups, scale_by_freq, scratch, buf,
                                row_started, h, False, False, False)
    else:
        for chunk in prange(chunks):
            _sgd_momentum_chunk(chunk, param, grad, groups, scale_by_freq, scratch, buf,
                                row_started, h, h.nesterov, h.maximize, h.weight_decay != 0)


# ---------------------------------------------------------------- Adam / AdamW


def adam_dense_(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, hyper):
    """One ``torch.optim.Adam`` step on flat arrays, in place.

    ``hyper`` is an :class:`~numbapos._args.AdamHyper` (dense step size);
    ``max_exp_avg_sq`` is read and written only with ``amsgrad`` (may be empty).
    """
    if param.size:
        pick(_adam_dense, param.size)(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, hyper)


def adam_rows_(param, rows, values, used, exp_avg, exp_avg_sq, hyper, rounding=None):
    """``torch.optim.SparseAdam``'s update of the listed (unique) rows of a 2-D ``param``.

    Row ``rows[j]`` gets gradient ``values[j]``; only those rows of ``param``
    and of the moments are read and written. ``hyper`` carries the sparse
    step size; ``rounding`` as in :func:`sgd_rows_`.
    """
    rows, values = rows[:used], values[:used]  # exact on the CPU: used == rows.size
    if rounding is not None:
        _half_rows(_half_adam, param, rows, values, rounding, exp_avg,
                   _half_bf16_state(exp_avg), exp_avg_sq, hyper)
    elif rows.size:
        pick(_adam_rows, rows.size * param.shape[1])(param, rows, values, exp_avg, exp_avg_sq,
                                                     hyper)


_adam_prologue = updates.adam_prologue
_adam_decay_flags = updates.adam_decay_flags
_adam_moments = updates.adam_moments


@kernel(inline="always")
def _adam_dense_at(i, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h, l2, decoupled,
                   low_weight, beta1):
    p, g = _adam_prologue(param[i], grad[i], h, h.maximize, l2, decoupled)
    m, v = _adam_moments(g, exp_avg[i], exp_avg_sq[i], h, low_weight, beta1)
    exp_avg[i] = m
    exp_avg_sq[i] = v
    if h.amsgrad:
        v = choose(max_exp_avg_sq[i] > v, max_exp_avg_sq[i], v)
        max_exp_avg_sq[i] = v
    param[i] = updates.adam_dense_param(p, m, v, h)


@kernel(parallel=True)
def _adam_dense(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h):
    l2, decoupled = _adam_decay_flags(h)
    low_weight = h.one_minus_beta1 < 0.5
    beta1 = param.dtype.type(1) - h.one_minus_beta1
    for i in prange(param.size):
        _adam_dense_at(i, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h, l2, decoupled,
                       low_weight, beta1)


def adam_row_groups_(param, grad, groups, scale_grad_by_freq, exp_avg, exp_avg_sq, hyper,
                     rounding=None):
    """:func:`adam_rows_` fused with the gradient of a lookup (as :func:`sgd_row_groups_`).

    Same bits as ``sum_row_groups`` followed by :func:`adam_rows_`.
    """
    if rounding is not None:
        _half_groups(_half_adam, param, grad, groups, scale_grad_by_freq, rounding, exp_avg,
                     _half_bf16_state(exp_avg), exp_avg_sq, hyper)
    else:
        _run_row_groups(_adam_row_groups, param, grad, groups, scale_grad_by_freq, exp_avg,
                        exp_avg_sq, hyper)


@kernel(inline="always")
def _adam_row(j, param, rows, values, exp_avg, exp_avg_sq, h):
    _prefetch_adam_rows(j + AHEAD, rows, param, exp_avg, exp_avg_sq)
    _adam_row_from(rows[j], values[j], param, exp_avg, exp_avg_sq, h)


@kernel(inline="always")
def _prefetch_adam_rows(j, rows, param, exp_avg, exp_avg_sq):
    prefetch_listed_for_write(param, rows, j)
    prefetch_listed_for_write(exp_avg, rows, j)
    prefetch_listed_for_write(exp_avg_sq, rows, j)


@kernel(inline="always")
def _adam_row_from(row, g_row, param, exp_avg, exp_avg_sq, h):
    # Row ``row`` of ``param`` (and the moments) with gradient row ``g_row`` (1-D).
    l2, decoupled = _adam_decay_flags(h)
    for d in range(param.shape[1]):
        param[row, d], exp_avg[row, d], exp_avg_sq[row, d] = updates.sparse_adam_update(
            param[row, d], g_row[d], exp_avg[row, d], exp_avg_sq[row, d], h, l2, decoupled)


@kernel(parallel=True)
def _adam_rows(param, rows, values, exp_avg, exp_avg_sq, hyper):
    for j in prange(rows.size):
        _adam_row(j, param, rows, values, exp_avg, exp_avg_sq, hyper)


@kernel(inline="always")
def _adam_group_chunk(chunk, param, grad, groups, scale_by_freq, scratch, exp_avg,
                      exp_avg_sq, h):
    # As _sgd_momentum_chunk.
    acc = scratch[chunk]
    for j in range(*_chunk_bounds(chunk, groups.rows.size, scratch.shape[0])):
        _prefetch_adam_rows(j + AHEAD, groups.rows, param, exp_avg, exp_avg_sq)
        g = group_gradient(grad, groups, j, scale_by_freq, acc)
        _adam_row_from(groups.rows[j], g, param, exp_avg, exp_avg_sq, h)


@kernel(parallel=True)
def _adam_row_groups(param, grad, groups, scale_by_freq, scratch, exp_avg, exp_avg_sq, hyper):
    for chunk in prange(scratch.shape[0]):
        _adam_group_chunk(chunk, param, grad, groups, scale_by_freq, scratch,
                          exp_avg, exp_avg_sq, hyper)


# ---------------------------------------------------------------- Adagrad


def adagrad_dense_(param, grad, state_sum, hyper):
    """One ``torch.optim.Adagrad`` step on flat arrays, in place (``hyper``: AdagradHyper)."""
    if param.size:
        pick(_adagrad_dense, param.size)(param, grad, state_sum, hyper)


def adagrad_rows_(param, rows, values, used, state_sum, hyper, rounding=None):
    """``torch.optim.Adagrad``'s sparse update of the listed (unique) rows of a 2-D ``param``.

    ``rounding`` as in :func:`sgd_rows_`.
    """
    rows, values = rows[:used], values[:used]  # exact on the CPU: used == rows.size
    if rounding is not None:
        _half_rows(_half_adagrad, param, rows, values, rounding, state_sum, hyper)
    elif rows.size:
        pick(_adagrad_rows, rows.size * param.shape[1])(param, rows, values, state_sum, hyper)


_adagrad_update = updates.adagrad_update


@kernel(parallel=True)
def _adagrad_dense(param, grad, state_sum, hyper):
    decay = hyper.weight_decay != 0
    for i in prange(param.size):
        param[i], state_sum[i] = _adagrad_update(param[i], grad[i], state_sum[i], hyper, decay)


def adagrad_row_groups_(param, grad, groups, scale_grad_by_freq, state_sum, hyper,
                        rounding=None):
    """:func:`adagrad_rows_` fused with the gradient of a lookup (as :func:`sgd_row_groups_`)."""
    if rounding is not None:
        _half_groups(_half_adagrad, param, grad, groups, scale_grad_by_freq, rounding,
                     state_sum, hyper)
    else:
        _run_row_groups(_adagrad_row_groups, param, grad, groups, scale_grad_by_freq,
                        state_sum, hyper)


@kernel(inline="always")
def _adagrad_row(j, param, rows, values, state_sum, h):
    _prefetch_two(j + AHEAD, rows, param, state_sum)
    _adagrad_row_from(rows[j], values[j], param, state_sum, h)


@kernel(inline="always")
def _prefetch_two(j, rows, param, state):
    prefetch_listed_for_write(param, rows, j)
    prefetch_listed_for_write(state, rows, j)


@kernel(inline="always")
def _adagrad_row_from(row, g_row, param, state_sum, h):
    decay = h.weight_decay != 0
    for d in range(param.shape[1]):
        param[row, d], state_sum[row, d] = _adagrad_update(param[row, d], g_row[d],
                                                           state_sum[row, d], h, decay)


@kernel(parallel=True)
def _adagrad_rows(param, rows, values, state_sum, hyper):
    for j in prange(rows.size):
        _adagrad_row(j, param, rows, values, state_sum, hyper)


@kernel(inline="always")
def _adagrad_group_chunk(chunk, param, grad, groups, scale_by_freq, scratch,
                         state_sum, h):
    # As _sgd_momentum_chunk.
    acc = scratch[chunk]
    for j in range(*_chunk_bounds(chunk, groups.rows.size, scratch.shape[0])):
        _prefetch_two(j + AHEAD, groups.rows, param, state_sum)
        g = group_gradient(grad, groups, j, scale_by_freq, acc)
        _adagrad_row_from(groups.rows[j], g, param, state_sum, h)


@kernel(parallel=True)
def _adagrad_row_groups(param, grad, groups, scale_by_freq, scratch, state_sum, hyper):
    for chunk in prange(scratch.shape[0]):
        _adagrad_group_chunk(chunk, param, grad, groups, scale_by_freq, scratch,
                             state_sum, hyper)


# ---------------------------------------------------------------- row-wise Adagrad


def rowwise_adagrad_dense_(param, grad, state_sum, hyper):
    """FBGEMM's exact row-wise Adagrad on every row of 2-D ``param`` (``grad`` 2-D too).

    ``state_sum`` has one accumulator per row; ``hyper`` is a
    :class:`~numbapos._args.RowWiseAdagradHyper`.
    """
    if param.shape[0] and param.shape[1]:
        pick(_rowwise_dense, param.size)(param, grad, state_sum, _l2_variant(hyper), hyper)


def rowwise_adagrad_row_groups_(param, grad, groups, scale_grad_by_freq, state_sum, hyper,
                                rounding=None):
    """:func:`rowwise_adagrad_rows_` fused with the gradient of a lookup (see sgd_row_groups_)."""
    if rounding is not None:
        _half_groups(_half_rowwise, param, grad, groups, scale_grad_by_freq, rounding,
                     state_sum, hyper)
    elif param.shape[1]:  # as rowwise_adagrad_rows_: a row of width 0 has no mean square
        _run_row_groups(_rowwise_row_groups, param, grad, groups, scale_grad_by_freq, state_sum,
                        _l2_variant(hyper), hyper, accumulators=_ROWS_AT_ONCE)


def rowwise_adagrad_rows_(param, rows, values, used, state_sum, hyper, rounding=None):
    """Row-wise Adagrad on the listed (unique) rows of a 2-D ``param`` only.

    ``rounding`` as in :func:`sgd_rows_`.
    """
    rows, values = rows[:used], values[:used]  # exact on the CPU: used == rows.size
    if rounding is not None:
        _half_rows(_half_rowwise, param, rows, values, rounding, state_sum, hyper)
    elif rows.size and param.shape[1]:
        pick(_rowwise_rows, rows.size * param.shape[1])(param, rows, values, state_sum,
                                                        _l2_variant(hyper), hyper)


def _l2_variant(hyper):
    """True (see :func:`.arrays.option`) with L2 weight decay, whose square sums also
    read the parameter; None otherwise, and the kernel compiles without that read."""
    return option(hyper.mode == _L2)


# A row's mean square is summed in order, as FBGEMM's loop does: one chain of
# dependent additions (D of them, each waiting for the last), which LLVM may
# not reorder. Four rows' chains interleaved in one loop keep the adder busy
# and give each row the same bits (see benchmarks/test_bench_optimizers.py).
# Every function below takes ``l2``: the constant False in a kernel compiled
# without L2 decay (LLVM then drops the parameter's read from the sums), else
# ``h.mode == 1``.
_ROWS_AT_ONCE = 4
_L2 = int(WeightDecayMode.L2)


@kernel(inline="always")
def _rowwise_term(g_row, row, d, param, h, l2):
    # Element d's square in row ``row``'s mean square (L2 decay folded into g).
    return updates.rowwise_term(g_row[d], param[row, d], h, l2)


@kernel(inline="always")
def _rowwise_apply(row, g_row, square_sum, param, state_sum, h):
    # Row ``row`` of param with gradient row ``g_row`` and its square sum
    # (FBGEMM's split_weight_update_cpu).
    dim = param.shape[1]
    acc, correction, multiplier = updates.rowwise_factors(
        state_sum[row], square_sum, param.dtype.type(dim), param.dtype.type(1), h)
    state_sum[row] = acc
    for d in range(dim):
        param[row, d] = updates.rowwise_apply(param[row, d], g_row[d], correction, multiplier)


@kernel(inline="always")
def _rowwise_row(row, g_row, param, state_sum, h, l2):
    square_sum = param.dtype.type(0)
    for d in range(param.shape[1]):
        square_sum += _rowwise_term(g_row, row, d, param, h, l2)
    _rowwise_apply(row, g_row, square_sum, param, state_sum, h)


@kernel(inline="always")
def _rowwise_four(r0, g0, r1, g1, r2, g2, r3, g3, param, state_sum, h, l2):
    # Four distinct rows, their square sums interleaved (see _ROWS_AT_ONCE).
    s0 = s1 = s2 = s3 = param.dtype.type(0)
    for d in range(param.shape[1]):
        s0 += _rowwise_term(g0, r0, d, param, h, l2)
        s1 += _rowwise_term(g1, r1, d, param, h, l2)
        s2 += _rowwise_term(g2, r2, d, param, h, l2)
        s3 += _rowwise_term(g3, r3, d, param, h, l2)
    _rowwise_apply(r0, g0, s0, param, state_sum, h)
    _rowwise_apply(r1, g1, s1, param, state_sum, h)
    _rowwise_apply(r2, g2, s2, param, state_sum, h)
    _rowwise_apply(r3, g3, s3, param, state_sum, h)


@kernel(inline="always")
def _blocks(count):
    return (count + _ROWS_AT_ONCE - 1) // _ROWS_AT_ONCE


@kernel(inline="always")
def _rowwise_dense_block(b, param, grad, state_sum, h, l2):
    # Rows 4b .. 4b + 3 (fewer in the last block).
    r = b * _ROWS_AT_ONCE
    if r + _ROWS_AT_ONCE <= param.shape[0]:
        _rowwise_four(r, grad[r], r + 1, grad[r + 1], r + 2, grad[r + 2], r + 3, grad[r + 3],
                      param, state_sum, h, l2)
    else:
        for i in range(r, param.shape[0]):
            _rowwise_row(i, grad[i], param, state_sum, h, l2)


@kernel(parallel=True)
def _rowwise_dense(param, grad, state_sum, general, hyper):
    l2 = False if general is None else hyper.mode == _L2
    for b in prange(_blocks(param.shape[0])):
        _rowwise_dense_block(b, param, grad, state_sum, hyper, l2)


@kernel(inline="always")
def _rowwise_rows_block(b, param, rows, values, state_sum, h, l2):
    # Listed rows 4b .. 4b + 3 (fewer in the last block).
    j = b * _ROWS_AT_ONCE
    for k in range(_ROWS_AT_ONCE):
        prefetch_listed_for_write(param, rows, j + AHEAD + k)
    if j + _ROWS_AT_ONCE <= rows.size:
        _rowwise_four(rows[j], values[j], rows[j + 1], values[j + 1], rows[j + 2],
                      values[j + 2], rows[j + 3], values[j + 3], param, state_sum, h, l2)
    else:
        for i in range(j, rows.size):
            _rowwise_row(rows[i], values[i], param, state_sum, h, l2)


@kernel(parallel=True)
def _rowwise_rows(param, rows, values, state_sum, general, hyper):
    l2 = False if general is None else hyper.mode == _L2
    for b in prange(_blocks(rows.size)):
        _rowwise_rows_block(b, param, rows, values, state_sum, hyper, l2)


@kernel(inline="always")
def _rowwise_group_chunk(chunk, param, grad, groups, scale_by_freq, scratch, state_sum, h, l2):
    # As _sgd_momentum_chunk, four groups at a time: scratch[chunk] holds four
    # accumulator rows side by side, one per group of a block.
    dim = param.shape[1]
    row = scratch[chunk]
    acc0, acc1, acc2, acc3 = row[:dim], row[dim:2 * dim], row[2 * dim:3 * dim], row[3 * dim:]
    rows = groups.rows
    lo, hi = _chunk_bounds(chunk, rows.size, scratch.shape[0])
    j = lo
    while j + _ROWS_AT_ONCE <= hi:
        for k in range(_ROWS_AT_ONCE):
            prefetch_listed_for_write(param, rows, j + AHEAD + k)
        g0 = group_gradient(grad, groups, j, scale_by_freq, acc0)
        g1 = group_gradient(grad, groups, j + 1, scale_by_freq, acc1)
        g2 = group_gradient(grad, groups, j + 2, scale_by_freq, acc2)
        g3 = group_gradient(grad, groups, j + 3, scale_by_freq, acc3)
        _rowwise_four(rows[j], g0, rows[j + 1], g1, rows[j + 2], g2, rows[j + 3], g3,
                      param, state_sum, h, l2)
        j += _ROWS_AT_ONCE
    for i in range(j, hi):
        g = group_gradient(grad, groups, i, scale_by_freq, acc0)
        _rowwise_row(rows[i], g, param, state_sum, h, l2)


@kernel(parallel=True)
def _rowwise_row_groups(param, grad, groups, scale_by_freq, scratch, state_sum, general, hyper):
    l2 = False if general is None else hyper.mode == _L2
    for chunk in prange(scratch.shape[0]):
        _rowwise_group_chunk(chunk, param, grad, groups, scale_by_freq, scratch, state_sum,
                             hyper, l2)


# ---------------------------------------------------------------- 16-bit tables


def _half_sgd_state(buf, row_started, hyper):
    """The 16-bit SGD kernels' state arguments: :func:`_sgd_variant`'s, with the buffer's
    bfloat16 flag (None without a buffer) and ``row_started``."""
    buf, general = _sgd_variant(buf, hyper)
    return buf, None if buf is None else _half_bf16_state(buf), row_started, general, hyper


def _half_bf16_state(state):
    """The kernels' flag for a state array: True for bfloat16 bits (``uint16``), None for
    float32."""
    return option(state.dtype == np.uint16)


def _half_rows(kernels, table, rows, values, rounding, *rest):
    _half_run(kernels, table, rows, values, None, None, False, rounding, rest)


def _half_groups(kernels, table, grad, groups, scale_grad_by_freq, rounding, *rest):
    # No summed values: an empty array (the kernels' ``groups is None`` branches must type).
    _half_run(kernels, table, groups.rows, np.empty((0, table.shape[1]), np.float32), grad,
              groups, scale_grad_by_freq, rounding, rest)


def _half_run(kernels, table, rows, values, grad, groups, scale, rounding, rest):
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


@kernel(inline="always")
def _half_load(table, row, d, fmt):
    # Element (row, d) as a float32 value (exact).
    return f32_from_bits(half_to_f32_bits(table[row, d], fmt))


@kernel(inline="always")
def _half_store(table, row, d, value, column_key, stochastic, fmt):
    # The float32 ``value`` into element (row, d), rounded as store_half_rows_ rounds it:
    # stochastically with rounding_bits16_at(column_key), the loops stepping column_key
    # from the row's rounding_row_key (one 64-bit hash per row) by next_column_key.
    u = f32_bits(value)
    if stochastic is None:
        table[row, d] = half_from_f32_bits(u, fmt)
    else:
        table[row, d] = half_from_f32_bits_stochastic(u, fmt, rounding_bits16_at(column_key))


@kernel(inline="always")
def _half_load_state(state, row, d, bf16):
    # Element (row, d) of a float32 state, or of a bfloat16 one (its bits), as float32.
    if bf16 is None:
        return state[row, d]
    return f32_from_bits(bf16_to_f32_bits(state[row, d]))


@kernel(inline="always")
def _half_store_state(state, row, d, value, bf16):
    # The float32 ``value`` into a float32 state, or into a bfloat16 one rounded to nearest.
    if bf16 is None:
        state[row, d] = value
    else:
        state[row, d] = f32_bits_to_bf16(f32_bits(value))


@kernel(inline="always")
def _half_gradient(j, values, grad, groups, scale, acc):
    # Row j's gradient: given (summed rows), or summed from a lookup's positions.
    if groups is None:
        return values[j]
    return group_gradient(grad, groups, j, scale, acc)


# The kernels take ``f16`` (None for bfloat16) and call their row update with the
# format as a constant, so each loop is compiled for one format: bfloat16's
# widening is then a shift and its stochastic rounding a compare, both vectorised.


@kernel(inline="always")
def _half_sgd_row(row, g, table, buf, bf16_buf, started, h, nesterov, maximize, decay, key,
                  stochastic, fmt):
    column_key = np.uint64(rounding_row_key(key, row))
    if buf is None:
        for d in range(table.shape[1]):
            p = updates.sgd_plain_update(_half_load(table, row, d, fmt), g[d], h, maximize,
                                         decay)
            _half_store(table, row, d, p, column_key, stochastic, fmt)
            column_key = next_column_key(column_key)
    else:
        first = not started[row]
        for d in range(table.shape[1]):
            p, b = updates.sgd_momentum_update(_half_load(table, row, d, fmt), g[d],
                                               _half_load_state(buf, row, d, bf16_buf), h,
                                               first, nesterov, maximize, decay)
            _half_store_state(buf, row, d, b, bf16_buf)
            _half_store(table, row, d, p, column_key, stochastic, fmt)
            column_key = next_column_key(column_key)
        started[row] = True


@kernel(inline="always")
def _half_sgd_options_row(row, g, table, buf, bf16_buf, started, general, h, key, stochastic,
                          fmt):
    # SGD's usual options as constants (they then pay for no selects), or any.
    if general is None:
        _half_sgd_row(row, g, table, buf, bf16_buf, started, h, False, False, False, key,
                      stochastic, fmt)
    else:
        _half_sgd_row(row, g, table, buf, bf16_buf, started, h, h.nesterov, h.maximize,
                      h.weight_decay != 0, key, stochastic, fmt)


@kernel(inline="always")
def _half_sgd_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key, stochastic,
                    f16, buf, bf16_buf, started, general, h):
    lo, hi = _chunk_bounds(chunk, rows.size, scratch.shape[0])
    for j in range(lo, hi):
        half_prefetch_listed_for_write(table, rows, j + AHEAD)
        if buf is not None:
            half_prefetch_listed_for_write(buf, rows, j + AHEAD)
        g = _half_gradient(j, values, grad, groups, scale, scratch[chunk])
        if f16 is None:
            _half_sgd_options_row(rows[j], g, table, buf, bf16_buf, started, general, h, key,
                                  stochastic, BF16)
        else:
            _half_sgd_options_row(rows[j], g, table, buf, bf16_buf, started, general, h, key,
                                  stochastic, F16)


@kernel(parallel=True)
def _half_sgd(table, rows, values, grad, groups, scale, scratch, seed, step, stochastic, f16,
              buf, bf16_buf, started, general, h):
    # Rows are unique, so chunks never share a row (nor its momentum or flag).
    key = dropout_key(seed, step)
    for chunk in prange(scratch.shape[0]):
        _half_sgd_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key,
                        stochastic, f16, buf, bf16_buf, started, general, h)


@kernel(inline="always")
def _half_adam_row(row, g, table, exp_avg, bf16_avg, exp_avg_sq, h, key, stochastic, fmt):
    l2, decoupled = updates.adam_decay_flags(h)
    column_key = np.uint64(rounding_row_key(key, row))
    for d in range(table.shape[1]):
        p, m, exp_avg_sq[row, d] = updates.sparse_adam_update(
            _half_load(table, row, d, fmt), g[d], _half_load_state(exp_avg, row, d, bf16_avg),
            exp_avg_sq[row, d], h, l2, decoupled)
        _half_store_state(exp_avg, row, d, m, bf16_avg)
        _half_store(table, row, d, p, column_key, stochastic, fmt)
        column_key = next_column_key(column_key)


@kernel(inline="always")
def _half_adam_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key,
                     stochastic, f16, exp_avg, bf16_avg, exp_avg_sq, h):
    lo, hi = _chunk_bounds(chunk, rows.size, scratch.shape[0])
    for j in range(lo, hi):
        half_prefetch_listed_for_write(table, rows, j + AHEAD)
        half_prefetch_listed_for_write(exp_avg, rows, j + AHEAD)
        half_prefetch_listed_for_write(exp_avg_sq, rows, j + AHEAD)
        g = _half_gradient(j, values, grad, groups, scale, scratch[chunk])
        if f16 is None:
            _half_adam_row(rows[j], g, table, exp_avg, bf16_avg, exp_avg_sq, h, key,
                           stochastic, BF16)
        else:
            _half_adam_row(rows[j], g, table, exp_avg, bf16_avg, exp_avg_sq, h, key,
                           stochastic, F16)


@kernel(parallel=True)
def _half_adam(table, rows, values, grad, groups, scale, scratch, seed, step, stochastic, f16,
               exp_avg, bf16_avg, exp_avg_sq, h):
    key = dropout_key(seed, step)
    for chunk in prange(scratch.shape[0]):
        _half_adam_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key,
                         stochastic, f16, exp_avg, bf16_avg, exp_avg_sq, h)


@kernel(inline="always")
def _half_adagrad_row(row, g, table, state_sum, h, key, stochastic, fmt):
    decay = h.weight_decay != 0
    column_key = np.uint64(rounding_row_key(key, row))
    for d in range(table.shape[1]):
        p, state_sum[row, d] = updates.adagrad_update(_half_load(table, row, d, fmt), g[d],
                                                      state_sum[row, d], h, decay)
        _half_store(table, row, d, p, column_key, stochastic, fmt)
        column_key = next_column_key(column_key)


@kernel(inline="always")
def _half_adagrad_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key,
                        stochastic, f16, state_sum, h):
    lo, hi = _chunk_bounds(chunk, rows.size, scratch.shape[0])
    for j in range(lo, hi):
        half_prefetch_listed_for_write(table, rows, j + AHEAD)
        half_prefetch_listed_for_write(state_sum, rows, j + AHEAD)
        g = _half_gradient(j, values, grad, groups, scale, scratch[chunk])
        if f16 is None:
            _half_adagrad_row(rows[j], g, table, state_sum, h, key, stochastic, BF16)
        else:
            _half_adagrad_row(rows[j], g, table, state_sum, h, key, stochastic, F16)


@kernel(parallel=True)
def _half_adagrad(table, rows, values, grad, groups, scale, scratch, seed, step, stochastic,
                  f16, state_sum, h):
    key = dropout_key(seed, step)
    for chunk in prange(scratch.shape[0]):
        _half_adagrad_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key,
                            stochastic, f16, state_sum, h)


@kernel(inline="always")
def _half_rowwise_row(row, g, table, state_sum, h, key, stochastic, fmt):
    # FBGEMM's row update (see _rowwise_row): the mean square summed in column order.
    dim = table.shape[1]
    l2 = h.mode == _L2
    square_sum = np.float32(0)
    for d in range(dim):
        square_sum += updates.rowwise_term(g[d], _half_load(table, row, d, fmt), h, l2)
    acc, correction, multiplier = updates.rowwise_factors(state_sum[row], square_sum,
                                                          np.float32(dim), np.float32(1), h)
    state_sum[row] = acc
    column_key = np.uint64(rounding_row_key(key, row))
    for d in range(dim):
        p = updates.rowwise_apply(_half_load(table, row, d, fmt), g[d], correction, multiplier)
        _half_store(table, row, d, p, column_key, stochastic, fmt)
        column_key = next_column_key(column_key)


@kernel(inline="always")
def _half_rowwise_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key,
                        stochastic, f16, state_sum, h):
    lo, hi = _chunk_bounds(chunk, rows.size, scratch.shape[0])
    for j in range(lo, hi):
        half_prefetch_listed_for_write(table, rows, j + AHEAD)
        g = _half_gradient(j, values, grad, groups, scale, scratch[chunk])
        if f16 is None:
            _half_rowwise_row(rows[j], g, table, state_sum, h, key, stochastic, BF16)
        else:
            _half_rowwise_row(rows[j], g, table, state_sum, h, key, stochastic, F16)


@kernel(parallel=True)
def _half_rowwise(table, rows, values, grad, groups, scale, scratch, seed, step, stochastic,
                  f16, state_sum, h):
    key = dropout_key(seed, step)
    for chunk in prange(scratch.shape[0]):
        _half_rowwise_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key,
                            stochastic, f16, state_sum, h)
