"""CPU kernels of the optimisers: one fused pass per parameter, dense or over listed rows.

SGD, Adam/AdamW (dense: ``torch.optim.Adam``; listed rows:
``torch.optim.SparseAdam``), Adagrad (``torch.optim.Adagrad``, dense and
sparse) and FBGEMM's exact row-wise Adagrad. The arithmetic follows the
reference operation for operation, in the parameter's dtype (scalars arrive
already cast to it), so results match step for step. With ``momentum == 0``
SGD's buffer is never read or written and may be empty; so is Adam's
``max_exp_avg_sq`` without ``amsgrad``. The element updates themselves are
:mod:`numbapos.kernels.updates`, shared with the CUDA twins.

Each optimiser has one sparse kernel for every table format, over the listed
rows (``*_rows_``) or over the row groups of a lookup's gradient
(``*_row_groups_``, the gradient summed on the fly). Given a ``rounding``
(:class:`~numbapos._args.HalfRounding`), ``param`` is a bfloat16 / float16
table's ``uint16`` bits: each element is widened to float32 in a register
(:func:`~numbapos.kernels.widen.widen`), updated with the float32 state by the
same element updates and stored back rounded (:func:`~numbapos.kernels.widen.store`), stochastically
with the keyed hash of ``(seed, step, row, column)``
(:func:`~numbapos.kernels.hash.rounding_bits`) or to nearest even. No float32
copy of the table is made, and the bits are those of widening the rows,
running the float32 update and storing them rounded, for any thread count and
on the GPU. SGD's momentum buffer and Adam's ``exp_avg`` may then be bfloat16
(its ``uint16`` bits): widened exactly, updated in float32, stored back rounded
to nearest even. A float table is read and written as it is: the kernel
compiled for it holds no conversion.
"""

import numba
import numpy as np
from numba import prange

from ..._args import WeightDecayMode
from .. import updates
from ..halfbits import BF16, F16
from ..hash import dropout_key, next_column_key
from ..widen import first_column_key, store, store_state, widen
from .arrays import option, pick, runs_parallel
from .branchless import choose
from .embedding import group_gradient
from .jit import kernel
from .prefetch import AHEAD, table_prefetch_listed_for_write

__all__ = ["adagrad_dense_", "adagrad_row_groups_", "adagrad_rows_", "adam_dense_",
           "adam_row_groups_", "adam_rows_", "rowwise_adagrad_dense_",
           "rowwise_adagrad_row_groups_", "rowwise_adagrad_rows_", "sgd_dense_",
           "sgd_row_groups_", "sgd_rows_"]


# ---------------------------------------------------------------- launchers
#
# ``rounding`` is None for a float table; the ``*_rows_`` launchers take the row
# gradients ``values[j]`` of the (unique) ``rows[:used]``, the ``*_row_groups_`` ones
# sum each row's gradient from a lookup's ``grad`` (:class:`~numbapos._args.RowGroups`,
# divided by the count with ``scale_grad_by_freq``) and give the bits of
# ``sum_row_groups`` followed by the rows launcher, without storing the gradient.


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
    _run(_sgd, param, rows[:used], values[:used], None, None, False, rounding,
         *_sgd_state(buf, row_started, hyper))


def sgd_row_groups_(param, grad, groups, scale_grad_by_freq, buf, row_started, hyper,
                    rounding=None):
    """:func:`sgd_rows_` fused with the gradient of a lookup: one pass over the rows used."""
    _run(_sgd, param, groups.rows, None, grad, groups, scale_grad_by_freq, rounding,
         *_sgd_state(buf, row_started, hyper))


def adam_dense_(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, hyper):
    """One ``torch.optim.Adam`` step on flat arrays, in place.

    ``hyper`` is an :class:`~numbapos._args.AdamHyper` (dense step size);
    ``max_exp_avg_sq`` is read and written only with ``amsgrad`` (may be empty).
    """
    if param.size:
        pick(_adam_dense, param.size)(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, hyper)


def adam_rows_(param, rows, values, used, exp_avg, exp_avg_sq, hyper, rounding=None):
    """``torch.optim.SparseAdam``'s update of the listed (unique) rows of a 2-D ``param``.

    Only those rows of ``param`` and of the moments are read and written;
    ``hyper`` carries the sparse step size.
    """
    _run(_adam, param, rows[:used], values[:used], None, None, False, rounding, exp_avg,
         exp_avg_sq, hyper)


def adam_row_groups_(param, grad, groups, scale_grad_by_freq, exp_avg, exp_avg_sq, hyper,
                     rounding=None):
    """:func:`adam_rows_` fused with the gradient of a lookup."""
    _run(_adam, param, groups.rows, None, grad, groups, scale_grad_by_freq, rounding, exp_avg,
         exp_avg_sq, hyper)


def adagrad_dense_(param, grad, state_sum, hyper):
    """One ``torch.optim.Adagrad`` step on flat arrays, in place (``hyper``: AdagradHyper)."""
    if param.size:
        pick(_adagrad_dense, param.size)(param, grad, state_sum, hyper)


def adagrad_rows_(param, rows, values, used, state_sum, hyper, rounding=None):
    """``torch.optim.Adagrad``'s sparse update of the listed (unique) rows of a 2-D ``param``."""
    _run(_adagrad, param, rows[:used], values[:used], None, None, False, rounding, state_sum,
         hyper)


def adagrad_row_groups_(param, grad, groups, scale_grad_by_freq, state_sum, hyper,
                        rounding=None):
    """:func:`adagrad_rows_` fused with the gradient of a lookup."""
    _run(_adagrad, param, groups.rows, None, grad, groups, scale_grad_by_freq, rounding,
         state_sum, hyper)


def rowwise_adagrad_dense_(param, grad, state_sum, hyper):
    """FBGEMM's exact row-wise Adagrad on every row of 2-D ``param`` (``grad`` 2-D too).

    ``state_sum`` has one accumulator per row; ``hyper`` is a
    :class:`~numbapos._args.RowWiseAdagradHyper`.
    """
    if param.shape[0] and param.shape[1]:
        pick(_rowwise_dense, param.size)(param, grad, state_sum, _l2_variant(hyper), hyper)


def rowwise_adagrad_rows_(param, rows, values, used, state_sum, hyper, rounding=None):
    """Row-wise Adagrad on the listed (unique) rows of a 2-D ``param`` only."""
    if param.shape[1]:  # a row of width 0 has no mean square
        _run(_rowwise, param, rows[:used], values[:used], None, None, False, rounding,
             state_sum, _l2_variant(hyper), hyper)


def rowwise_adagrad_row_groups_(param, grad, groups, scale_grad_by_freq, state_sum, hyper,
                                rounding=None):
    """:func:`rowwise_adagrad_rows_` fused with the gradient of a lookup."""
    if param.shape[1]:
        _run(_rowwise, param, groups.rows, None, grad, groups, scale_grad_by_freq, rounding,
             state_sum, _l2_variant(hyper), hyper, accumulators=_ROWS_AT_ONCE)


def _sgd_state(buf, row_started, hyper):
    """The SGD kernel's ``(buf, started, general, hyper)``: the code it compiles follows
    the options.

    ``buf`` is None without momentum; ``general`` is None for SGD's usual
    options (no Nesterov, maximize or weight decay), else True (see
    :func:`.arrays.option`). A kernel is compiled with one of the four row
    loops only, which shortens its compilation.
    """
    usual = not (hyper.nesterov or hyper.maximize or hyper.weight_decay != 0)
    return (buf if hyper.momentum != 0 else None), row_started, option(not usual), hyper


def _l2_variant(hyper):
    """True (see :func:`.arrays.option`) with L2 weight decay, whose square sums also
    read the parameter; None otherwise, and the kernel compiles without that read."""
    return option(hyper.mode == _L2)


def _run(kernels, table, rows, values, grad, groups, scale, rounding, *state, accumulators=1):
    """``kernel(table, rows, values, grad, groups, scale, scratch, seed, step, stochastic, f16,
    *state)`` over chunks of the rows.

    One chunk for small work (the serial kernel of the ``kernels`` pair, see
    :func:`.arrays.pick`), else a few per thread (the parallel one); rows are
    unique, so chunks never share a row. Each chunk sums its rows' gradients (a
    lookup's) into its row of ``scratch`` (``accumulators`` rows of D side by
    side, for a kernel that sums several rows at once), whose dtype is the one
    the update computes in: the table's, float32 for a 16-bit table. Nothing
    runs without rows.
    """
    used, dim = rows.size, table.shape[1]
    if used == 0:
        return
    compute = table.dtype if rounding is None else np.dtype(np.float32)
    chunks = min(used, 4 * numba.get_num_threads()) if runs_parallel(used * dim) else 1
    scratch = np.empty((chunks, 0 if groups is None else accumulators * dim), compute)
    if values is None:  # the kernel's ``groups is None`` branch must still type
        values = np.empty((0, dim), compute)
    if rounding is None:
        seed, step, stochastic, f16 = np.uint64(0), np.uint64(0), None, None
    else:
        seed, step = np.uint64(rounding.seed), np.uint64(rounding.step)
        stochastic, f16 = option(rounding.stochastic), option(rounding.fmt == F16)
    pick(kernels, used * dim)(table, rows, values, grad, groups, option(scale), scratch, seed,
                              step, stochastic, f16, *state)


# ---------------------------------------------------------------- shared loops


@kernel(inline="always")
def _gradient(j, values, grad, groups, scale, acc):
    # Row j's gradient: given (``values``), or summed from a lookup's positions.
    if groups is None:
        return values[j]
    return group_gradient(grad, groups, j, scale, acc)


@kernel(inline="always")
def _chunk_bounds(chunk, used, chunks):
    # The rows of chunk ``chunk`` of ``chunks`` (summed through scratch[chunk]):
    # chunk * used / chunks .. (chunk + 1) * used / chunks.
    return chunk * used // chunks, (chunk + 1) * used // chunks


# Each optimiser has its own chunk loop and kernel: a kernel that took the row update as
# an argument (a Numba dispatcher) would never load from the cache. The kernels settle
# the 16-bit format from ``f16`` (None: bfloat16, which a float table ignores) on their
# own argument, so each compilation holds one format's loop (bfloat16's widening is then
# a shift and its stochastic rounding a compare, both vectorised) and inlines the row
# update once.

# ---------------------------------------------------------------- SGD
#
# The element updates pick between their options with ``choose`` (a select, no
# branch): written with ``if``, the options were branches inside the row loops,
# which LLVM left scalar. Only a state that an option may leave absent (SGD's
# momentum buffer) gets a loop of its own. The dense updates stream whole arrays
# at memory speed either way and keep one loop each (a loop per option only
# lengthened their compilation).


@kernel(inline="always")
def _sgd_dense_at(i, param, grad, buf, first, h, decay):
    if h.momentum != 0:
        param[i], buf[i] = updates.sgd_momentum_update(param[i], grad[i], buf[i], h, first,
                                                       h.nesterov, h.maximize, decay)
    else:
        param[i] = updates.sgd_plain_update(param[i], grad[i], h, h.maximize, decay)


@kernel(parallel=True)
def _sgd_dense(param, grad, buf, first, hyper):
    decay = hyper.weight_decay != 0
    for i in prange(param.size):
        _sgd_dense_at(i, param, grad, buf, first, hyper, decay)


@kernel(inline="always")
def _sgd_row(row, g, table, buf, started, h, nesterov, maximize, decay, key, stochastic, fmt):
    # Row ``row`` with gradient row ``g`` (1-D); a row's momentum starts fresh the first
    # time the row is touched.
    column_key = first_column_key(key, row, stochastic)
    if buf is None:
        for d in range(table.shape[1]):
            p = updates.sgd_plain_update(widen(table[row, d], fmt), g[d], h, maximize, decay)
            store(table, row, d, p, column_key, stochastic, fmt)
            column_key = next_column_key(column_key)
    else:
        first = not started[row]
        for d in range(table.shape[1]):
            p, b = updates.sgd_momentum_update(widen(table[row, d], fmt), g[d],
                                               widen(buf[row, d], BF16), h, first, nesterov,
                                               maximize, decay)
            store_state(buf, row, d, b)
            store(table, row, d, p, column_key, stochastic, fmt)
            column_key = next_column_key(column_key)
        started[row] = True


@kernel(inline="always")
def _sgd_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key, stochastic,
               fmt, buf, started, h, nesterov, maximize, decay):
    for j in range(*_chunk_bounds(chunk, rows.size, scratch.shape[0])):
        table_prefetch_listed_for_write(table, table, rows, j + AHEAD)
        if buf is not None:
            table_prefetch_listed_for_write(table, buf, rows, j + AHEAD)
        g = _gradient(j, values, grad, groups, scale, scratch[chunk])
        _sgd_row(rows[j], g, table, buf, started, h, nesterov, maximize, decay, key,
                 stochastic, fmt)


# The SGD kernel holds one of four row loops (plain or momentum, SGD's usual options or
# any others), picked by ``buf`` and ``general`` (None or not, see _sgd_state) when Numba
# compiles it. The choice is made in the kernel itself: Numba prunes an ``is None``
# branch on a kernel's own arguments before it inlines the helpers, so the other three
# loops are never copied in. The usual options get loops with the other options as
# literals: they pay for no selects.
@kernel(parallel=True)
def _sgd(table, rows, values, grad, groups, scale, scratch, seed, step, stochastic, f16, buf,
         started, general, h):
    key = dropout_key(seed, step)
    fmt = BF16 if f16 is None else F16
    chunks = scratch.shape[0]
    if buf is None:
        if general is None:
            for c in prange(chunks):
                _sgd_chunk(c, table, rows, values, grad, groups, scale, scratch, key,
                           stochastic, fmt, buf, started, h, False, False, False)
        else:
            for c in prange(chunks):
                _sgd_chunk(c, table, rows, values, grad, groups, scale, scratch, key,
                           stochastic, fmt, buf, started, h, False, h.maximize,
                           h.weight_decay != 0)
    elif general is None:
        for c in prange(chunks):
            _sgd_chunk(c, table, rows, values, grad, groups, scale, scratch, key, stochastic,
                       fmt, buf, started, h, False, False, False)
    else:
        for c in prange(chunks):
            _sgd_chunk(c, table, rows, values, grad, groups, scale, scratch, key, stochastic,
                       fmt, buf, started, h, h.nesterov, h.maximize, h.weight_decay != 0)


# ---------------------------------------------------------------- Adam / AdamW


@kernel(inline="always")
def _adam_dense_at(i, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h, l2, decoupled,
                   low_weight, beta1):
    p, g = updates.adam_prologue(param[i], grad[i], h, h.maximize, l2, decoupled)
    m, v = updates.adam_moments(g, exp_avg[i], exp_avg_sq[i], h, low_weight, beta1)
    exp_avg[i] = m
    exp_avg_sq[i] = v
    if h.amsgrad:
        v = choose(max_exp_avg_sq[i] > v, max_exp_avg_sq[i], v)
        max_exp_avg_sq[i] = v
    param[i] = updates.adam_dense_param(p, m, v, h)


@kernel(parallel=True)
def _adam_dense(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h):
    l2, decoupled = updates.adam_decay_flags(h)
    low_weight = h.one_minus_beta1 < 0.5
    beta1 = param.dtype.type(1) - h.one_minus_beta1
    for i in prange(param.size):
        _adam_dense_at(i, param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h, l2, decoupled,
                       low_weight, beta1)


@kernel(inline="always")
def _adam_row(row, g, table, exp_avg, exp_avg_sq, h, key, stochastic, fmt):
    l2, decoupled = updates.adam_decay_flags(h)
    column_key = first_column_key(key, row, stochastic)
    for d in range(table.shape[1]):
        p, m, exp_avg_sq[row, d] = updates.sparse_adam_update(
            widen(table[row, d], fmt), g[d], widen(exp_avg[row, d], BF16), exp_avg_sq[row, d],
            h, l2, decoupled)
        store_state(exp_avg, row, d, m)
        store(table, row, d, p, column_key, stochastic, fmt)
        column_key = next_column_key(column_key)


@kernel(inline="always")
def _adam_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key, stochastic,
                fmt, exp_avg, exp_avg_sq, h):
    for j in range(*_chunk_bounds(chunk, rows.size, scratch.shape[0])):
        table_prefetch_listed_for_write(table, table, rows, j + AHEAD)
        table_prefetch_listed_for_write(table, exp_avg, rows, j + AHEAD)
        table_prefetch_listed_for_write(table, exp_avg_sq, rows, j + AHEAD)
        g = _gradient(j, values, grad, groups, scale, scratch[chunk])
        _adam_row(rows[j], g, table, exp_avg, exp_avg_sq, h, key, stochastic, fmt)


@kernel(parallel=True)
def _adam(table, rows, values, grad, groups, scale, scratch, seed, step, stochastic, f16,
          exp_avg, exp_avg_sq, h):
    key = dropout_key(seed, step)
    fmt = BF16 if f16 is None else F16
    for c in prange(scratch.shape[0]):
        _adam_chunk(c, table, rows, values, grad, groups, scale, scratch, key, stochastic,
                    fmt, exp_avg, exp_avg_sq, h)


# ---------------------------------------------------------------- Adagrad


@kernel(parallel=True)
def _adagrad_dense(param, grad, state_sum, hyper):
    decay = hyper.weight_decay != 0
    for i in prange(param.size):
        param[i], state_sum[i] = updates.adagrad_update(param[i], grad[i], state_sum[i], hyper,
                                                        decay)


@kernel(inline="always")
def _adagrad_row(row, g, table, state_sum, h, key, stochastic, fmt):
    decay = h.weight_decay != 0
    column_key = first_column_key(key, row, stochastic)
    for d in range(table.shape[1]):
        p, state_sum[row, d] = updates.adagrad_update(widen(table[row, d], fmt), g[d],
                                                      state_sum[row, d], h, decay)
        store(table, row, d, p, column_key, stochastic, fmt)
        column_key = next_column_key(column_key)


@kernel(inline="always")
def _adagrad_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key, stochastic,
                   fmt, state_sum, h):
    for j in range(*_chunk_bounds(chunk, rows.size, scratch.shape[0])):
        table_prefetch_listed_for_write(table, table, rows, j + AHEAD)
        table_prefetch_listed_for_write(table, state_sum, rows, j + AHEAD)
        g = _gradient(j, values, grad, groups, scale, scratch[chunk])
        _adagrad_row(rows[j], g, table, state_sum, h, key, stochastic, fmt)


@kernel(parallel=True)
def _adagrad(table, rows, values, grad, groups, scale, scratch, seed, step, stochastic, f16,
             state_sum, h):
    key = dropout_key(seed, step)
    fmt = BF16 if f16 is None else F16
    for c in prange(scratch.shape[0]):
        _adagrad_chunk(c, table, rows, values, grad, groups, scale, scratch, key, stochastic,
                       fmt, state_sum, h)


# ---------------------------------------------------------------- row-wise Adagrad
#
# A row's mean square is summed in order, as FBGEMM's loop does: one chain of
# dependent additions (D of them, each waiting for the last), which LLVM may
# not reorder. Four rows' chains interleaved in one loop keep the adder busy
# and give each row the same bits (see benchmarks/test_bench_optimizers.py).
# Every function below takes ``l2``: the constant False in a kernel compiled
# without L2 decay (LLVM then drops the parameter's read from the sums), else
# ``h.mode == 1``; and ``like``, an array of the dtype the update computes in.
_ROWS_AT_ONCE = 4
_L2 = int(WeightDecayMode.L2)


@kernel(inline="always")
def _rowwise_term(g, row, d, table, h, l2, fmt):
    # Element d's square in row ``row``'s mean square (L2 decay folded into g).
    return updates.rowwise_term(g[d], widen(table[row, d], fmt), h, l2)


@kernel(inline="always")
def _rowwise_apply(row, g, square_sum, table, state_sum, h, like, key, stochastic, fmt):
    # Row ``row`` with gradient row ``g`` and its square sum (FBGEMM's
    # split_weight_update_cpu).
    dim = table.shape[1]
    acc, correction, multiplier = updates.rowwise_factors(
        state_sum[row], square_sum, like.dtype.type(dim), like.dtype.type(1), h)
    state_sum[row] = acc
    column_key = first_column_key(key, row, stochastic)
    for d in range(dim):
        p = updates.rowwise_apply(widen(table[row, d], fmt), g[d], correction, multiplier)
        store(table, row, d, p, column_key, stochastic, fmt)
        column_key = next_column_key(column_key)


@kernel(inline="always")
def _rowwise_row(row, g, table, state_sum, h, l2, like, key, stochastic, fmt):
    square_sum = like.dtype.type(0)
    for d in range(table.shape[1]):
        square_sum += _rowwise_term(g, row, d, table, h, l2, fmt)
    _rowwise_apply(row, g, square_sum, table, state_sum, h, like, key, stochastic, fmt)


@kernel(inline="always")
def _rowwise_four(r0, g0, r1, g1, r2, g2, r3, g3, table, state_sum, h, l2, like, key,
                  stochastic, fmt):
    # Four distinct rows, their square sums interleaved (see _ROWS_AT_ONCE).
    s0 = s1 = s2 = s3 = like.dtype.type(0)
    for d in range(table.shape[1]):
        s0 += _rowwise_term(g0, r0, d, table, h, l2, fmt)
        s1 += _rowwise_term(g1, r1, d, table, h, l2, fmt)
        s2 += _rowwise_term(g2, r2, d, table, h, l2, fmt)
        s3 += _rowwise_term(g3, r3, d, table, h, l2, fmt)
    _rowwise_apply(r0, g0, s0, table, state_sum, h, like, key, stochastic, fmt)
    _rowwise_apply(r1, g1, s1, table, state_sum, h, like, key, stochastic, fmt)
    _rowwise_apply(r2, g2, s2, table, state_sum, h, like, key, stochastic, fmt)
    _rowwise_apply(r3, g3, s3, table, state_sum, h, like, key, stochastic, fmt)


@kernel(inline="always")
def _rowwise_dense_block(b, param, grad, state_sum, h, l2):
    # Rows 4b .. 4b + 3 (fewer in the last block).
    r = b * _ROWS_AT_ONCE
    key = np.uint64(0)  # a float table: no rounding
    if r + _ROWS_AT_ONCE <= param.shape[0]:
        _rowwise_four(r, grad[r], r + 1, grad[r + 1], r + 2, grad[r + 2], r + 3, grad[r + 3],
                      param, state_sum, h, l2, param, key, None, BF16)
    else:
        for i in range(r, param.shape[0]):
            _rowwise_row(i, grad[i], param, state_sum, h, l2, param, key, None, BF16)


@kernel(parallel=True)
def _rowwise_dense(param, grad, state_sum, general, hyper):
    l2 = False if general is None else hyper.mode == _L2
    for b in prange((param.shape[0] + _ROWS_AT_ONCE - 1) // _ROWS_AT_ONCE):
        _rowwise_dense_block(b, param, grad, state_sum, hyper, l2)


@kernel(inline="always")
def _rowwise_chunk(chunk, table, rows, values, grad, groups, scale, scratch, key, stochastic,
                   state_sum, h, l2, fmt):
    # Four rows at a time: with a lookup's gradient, scratch[chunk] holds four
    # accumulator rows side by side, one per row of a block.
    dim = table.shape[1]
    acc = scratch[chunk]
    acc0, acc1, acc2, acc3 = acc[:dim], acc[dim:2 * dim], acc[2 * dim:3 * dim], acc[3 * dim:]
    lo, hi = _chunk_bounds(chunk, rows.size, scratch.shape[0])
    j = lo
    while j + _ROWS_AT_ONCE <= hi:
        for k in range(_ROWS_AT_ONCE):
            table_prefetch_listed_for_write(table, table, rows, j + AHEAD + k)
        g0 = _gradient(j, values, grad, groups, scale, acc0)
        g1 = _gradient(j + 1, values, grad, groups, scale, acc1)
        g2 = _gradient(j + 2, values, grad, groups, scale, acc2)
        g3 = _gradient(j + 3, values, grad, groups, scale, acc3)
        _rowwise_four(rows[j], g0, rows[j + 1], g1, rows[j + 2], g2, rows[j + 3], g3, table,
                      state_sum, h, l2, scratch, key, stochastic, fmt)
        j += _ROWS_AT_ONCE
    for i in range(j, hi):
        g = _gradient(i, values, grad, groups, scale, acc0)
        _rowwise_row(rows[i], g, table, state_sum, h, l2, scratch, key, stochastic, fmt)


@kernel(parallel=True)
def _rowwise(table, rows, values, grad, groups, scale, scratch, seed, step, stochastic, f16,
             state_sum, general, h):
    key = dropout_key(seed, step)
    l2 = False if general is None else h.mode == _L2
    fmt = BF16 if f16 is None else F16
    for c in prange(scratch.shape[0]):
        _rowwise_chunk(c, table, rows, values, grad, groups, scale, scratch, key, stochastic,
                       state_sum, h, l2, fmt)
