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

Each optimiser has one sparse kernel; where its rows' gradient comes from and
the table's format are compile-time parameters. The gradient of a listed row
is a summed ``values[j]`` (:class:`_Summed`: the ``*_rows_`` launchers) or is
summed on the spot from the row's positions (:class:`_Grouped`: the fused
``*_row_groups_`` launchers, the scatter's ``segment_sum``), so a lookup's
``(rows, D)`` gradient is never stored. A float table is read and written as
it is (its kernels get ``()`` for ``rounding``: numba-cuda cannot launch a
None argument). Given a ``rounding`` (:class:`~numbapos._args.HalfRounding`)
the table is a bfloat16 / float16 one as its ``uint16`` bits: each element is
widened to float32, updated with float32 state and hyper-parameters by the
same element updates, and stored back rounded (:mod:`.convert`:
stochastically with the keyed hash of ``(seed, step, row, column)``, or to
nearest even), the CPU's bits. SGD's momentum and Adam's ``exp_avg`` may then
be bfloat16 (``uint16`` bits: widened, updated in float32, stored rounded to
nearest even), as on the CPU.
"""

from typing import NamedTuple

import numpy as np
from numba import cuda, types
from numba.extending import overload

from ..._args import AdagradHyper, AdamHyper, RowWiseAdagradHyper, SGDHyper, WeightDecayMode
from ..._gpuhost.launch import launch
from .. import updates
from ..halfbits import BF16, f32_bits_to_bf16
from ..scalar import f32_bits
from ..widen import widen
from . import arrays, clock, errors
from .arrays import MAX_BLOCKS, THREADS, grid
from .convert import _rounded, kernel_rounding, rounding_key
from .embedding import segment_sum
from .fpmath import cast_like

__all__ = ["adagrad_dense_", "adagrad_row_groups_", "adagrad_rows_", "adam_dense_",
           "adam_row_groups_", "adam_rows_", "rowwise_adagrad_dense_",
           "rowwise_adagrad_row_groups_", "rowwise_adagrad_rows_", "sgd_dense_",
           "sgd_row_groups_", "sgd_rows_"]

_L2 = int(WeightDecayMode.L2)


class _Summed(NamedTuple):
    """The gradient of a sparse kernel's rows: ``values[j]`` is row ``rows[j]``'s, for
    ``j < used[0]``."""

    rows: object
    used: object
    values: object


class _Grouped(NamedTuple):
    """The gradient of a sparse kernel's rows summed on the spot: row ``rows[j]``'s is the
    sum of ``grad[order[k]]`` over the row's positions (the fields of a
    :class:`~numbapos._args.RowGroups`), each term over its count with ``scale_by_freq``."""

    grad: object
    rows: object
    starts: object
    counts: object
    order: object
    used: object
    scale_by_freq: bool


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
    if rows.size:
        _sgd_sparse(param, _Summed(rows, _on_device(used), values), buf, row_started, hyper,
                    rounding)


def sgd_row_groups_(param, grad, groups, scale_grad_by_freq, buf, row_started, hyper,
                    rounding=None):
    """Lazy SGD fused with the gradient of a lookup: one pass over the rows used.

    One block per row of ``groups`` (:class:`~numbapos._args.RowGroups`); each
    thread sums its columns over the row's positions (the scatter's
    ``segment_sum``) and applies the update at once, so the ``(rows, D)``
    gradient is never stored. Same bits as ``sum_row_groups`` then
    :func:`sgd_rows_`, and as the CPU.
    """
    if groups.rows.size:
        _sgd_sparse(param, _grouped(grad, groups, scale_grad_by_freq), buf, row_started, hyper,
                    rounding)


def _sgd_sparse(param, source, buf, row_started, hyper, rounding):
    """:func:`sgd_rows_` / :func:`sgd_row_groups_` of a :class:`_Summed` / :class:`_Grouped`."""
    hyper = _update_rows(_sgd_rows, param, source, (buf, row_started), hyper, rounding)
    if hyper.momentum != 0:
        # A second launch, so no block can see a flag that another set this step
        # (rows are unique, but the flags are read above and set only here).
        launch(_mark_started, grid(source.rows.size), THREADS, source.rows, source.used,
               row_started, errors.device_word())


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
    if rows.size:
        _update_rows(_adam_rows, param, _Summed(rows, _on_device(used), values),
                     (exp_avg, exp_avg_sq), hyper, rounding)


def adam_row_groups_(param, grad, groups, scale_grad_by_freq, exp_avg, exp_avg_sq, hyper,
                     rounding=None):
    """:func:`adam_rows_` fused with the gradient of a lookup (as :func:`sgd_row_groups_`)."""
    if groups.rows.size:
        _update_rows(_adam_rows, param, _grouped(grad, groups, scale_grad_by_freq),
                     (exp_avg, exp_avg_sq), hyper, rounding)


def adagrad_dense_(param, grad, state_sum, hyper):
    """One ``torch.optim.Adagrad`` step on flat arrays, in place (``hyper``: AdagradHyper)."""
    hyper, dyn = clock.split(hyper, param.dtype)
    if param.size:
        launch(_adagrad_dense, grid(param.size), THREADS, param, grad, state_sum, hyper, dyn,
               errors.device_word())


def adagrad_rows_(param, rows, values, used, state_sum, hyper, rounding=None):
    """``torch.optim.Adagrad``'s sparse update of the listed (unique) rows of a 2-D ``param``
    (``used`` rows are real, see :func:`sgd_rows_`)."""
    if rows.size:
        _update_rows(_adagrad_rows, param, _Summed(rows, _on_device(used), values),
                     (state_sum,), hyper, rounding)


def adagrad_row_groups_(param, grad, groups, scale_grad_by_freq, state_sum, hyper,
                        rounding=None):
    """:func:`adagrad_rows_` fused with the gradient of a lookup (as :func:`sgd_row_groups_`)."""
    if groups.rows.size:
        _update_rows(_adagrad_rows, param, _grouped(grad, groups, scale_grad_by_freq),
                     (state_sum,), hyper, rounding)


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
    if rows.size:
        _update_rows(_rowwise_rows, param, _Summed(rows, _on_device(used), values),
                     (state_sum,), hyper, rounding)


def rowwise_adagrad_row_groups_(param, grad, groups, scale_grad_by_freq, state_sum, hyper,
                                rounding=None):
    """:func:`rowwise_adagrad_rows_` fused with the gradient of a lookup (see sgd_row_groups_)."""
    if groups.rows.size:
        _update_rows(_rowwise_rows, param, _grouped(grad, groups, scale_grad_by_freq),
                     (state_sum,), hyper, rounding)


def _update_rows(kernel, param, source, states, hyper, rounding):
    """Launch the sparse ``kernel`` on the rows of ``source`` (:class:`_Summed` or
    :class:`_Grouped`) and return ``hyper`` (its host values).

    ``hyper`` is in ``param``'s dtype, float32 for a 16-bit table. Row-wise Adagrad runs
    one thread per row, the other optimisers a block per row with threads along D.
    """
    hyper, dyn = clock.split(hyper, param.dtype if rounding is None else np.float32)
    if param.shape[1]:
        if kernel is _rowwise_rows:
            blocks, threads = grid(source.rows.size), THREADS
        else:
            blocks = max(1, min(int(source.rows.size), MAX_BLOCKS))
            threads = min(THREADS, -(-param.shape[1] // 32) * 32)  # whole warps covering D
        launch(kernel, blocks, threads, param, source, *states, hyper, dyn,
               () if rounding is None else kernel_rounding(rounding), errors.device_word())
    return hyper


def _grouped(grad, groups, scale_by_freq):
    """A :class:`_Grouped` of a lookup's gradient and its :class:`~numbapos._args.RowGroups`."""
    return _Grouped(grad, *groups, bool(scale_by_freq))


def _on_device(used):
    """The count of real rows as a device array (``[used, 0]``) for kernels to read."""
    if isinstance(used, int):
        return arrays.asarray(np.array([used, 0], np.int64))
    return used


# ---------------------------------------------------------------- compile-time choices


def _specialised(pick):
    """A device function ``f(*args)`` that runs ``pick(*args)(*args)``.

    ``pick`` chooses one version of a helper from its arguments: their values
    on the simulator, their Numba types when a kernel is compiled, so the
    choice is made once per kernel signature and costs nothing on the GPU. It
    reads only what values and types share (:func:`_holds_bits`,
    :func:`_record`).
    """
    def specialised(*args):
        return pick(*args)(*args)

    @overload(specialised, target="generic")
    def _compiled(*args):
        version = pick(*args)
        return lambda *args: version(*args)

    return specialised


def _holds_bits(array) -> bool:
    """Whether ``array`` (a device array, or its Numba type) holds 16-bit ``uint16`` bits."""
    return str(array.dtype) == "uint16"


def _record(value):
    """The class of ``value``, or the named tuple class of a Numba record type."""
    return value.instance_class if isinstance(value, types.BaseNamedTuple) else type(value)


# ---------------------------------------------------------------- table formats
# A kernel's table is a float one (``rounding`` is ``()``) or a 16-bit one's ``uint16``
# bits (``rounding`` a kernel_rounding record); ``at`` is an element's index, ``i`` of a
# flat array or ``(row, d)``.


@cuda.jit(device=True)
def _key_of_float(table, rounding):
    return 0


@cuda.jit(device=True)
def _key_of_half(table, rounding):
    return rounding_key(rounding)


@cuda.jit(device=True)
def _load_float(table, at, rounding):
    return table[at]


@cuda.jit(device=True)
def _load_half(table, at, rounding):
    return widen(table[at], rounding.fmt)


@cuda.jit(device=True)
def _store_float(table, at, value, key, rounding):
    table[at] = value


@cuda.jit(device=True)
def _store_half(table, at, value, key, rounding):
    table[at] = _rounded(f32_bits(value), key, at[0], at[1], rounding)


@cuda.jit(device=True)
def _store_state_float(state, at, value):
    state[at] = value


@cuda.jit(device=True)
def _store_state_bf16(state, at, value):
    state[at] = f32_bits_to_bf16(f32_bits(value))


# The hash key of a table's stochastic rounding (none for a float table).
_key = _specialised(lambda table, rounding: _key_of_half if _holds_bits(table) else _key_of_float)
# Element ``at`` of a table as a number: as it is, or widened from the 16-bit format's bits.
_load = _specialised(lambda table, at, rounding: _load_half if _holds_bits(table)
                     else _load_float)
# A number into element ``at`` of a table: as it is, or rounded to the 16-bit format.
_store = _specialised(lambda table, at, value, key, rounding: _store_half if _holds_bits(table)
                      else _store_float)
# The float32 ``value`` into a bfloat16 state rounded to nearest, or a number into a float one.
_store_state = _specialised(lambda state, at, value: _store_state_bf16 if _holds_bits(state)
                            else _store_state_float)


@cuda.jit(device=True)
def _load_state(state, at):
    # Element ``at`` of a float state as it is, of a bfloat16 one (its bits) as float32.
    return widen(state[at], BF16)


# ---------------------------------------------------------------- gradient sources
# A sparse kernel reads the gradient of its ``j``-th row from its ``source`` (a
# :class:`_Summed` or a :class:`_Grouped`): ``_gradient(source, j, d)`` is its column d.
# Row-wise Adagrad reads each column twice: it locates the row once,
# ``_segment(source, j)``, then reads ``_column(source, segment, d)`` (its dense kernel's
# source is the 2-D gradient itself).


@cuda.jit(device=True)
def _summed_gradient(source, j, d):
    return source.values[j, d]


@cuda.jit(device=True)
def _grouped_gradient(source, j, d):
    return segment_sum(source.grad, source.order, source.starts[j], source.counts[j],
                       source.scale_by_freq, d)


@cuda.jit(device=True)
def _row_segment(source, j):
    return j


@cuda.jit(device=True)
def _grouped_segment(source, j):
    return source.starts[j], source.counts[j]


@cuda.jit(device=True)
def _grouped_column(source, segment, d):
    return segment_sum(source.grad, source.order, segment[0], segment[1], source.scale_by_freq,
                       d)


@cuda.jit(device=True)
def _dense_column(grad, j, d):
    return grad[j, d]


_gradient = _specialised(
    lambda source, j, d: _grouped_gradient if _record(source) is _Grouped else _summed_gradient)
_segment = _specialised(
    lambda source, j: _grouped_segment if _record(source) is _Grouped else _row_segment)
_column = _specialised(
    lambda source, segment, d: {_Summed: _summed_gradient, _Grouped: _grouped_column}.get(
        _record(source), _dense_column))


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
def _sgd_element(table, buf, at, g, first, h, decay, key, rounding):
    # Element ``at`` of the table (and of the momentum buffer) with gradient g.
    p = _load(table, at, rounding)
    if h.momentum != 0:
        p, b = updates.sgd_momentum_update(p, g, _load_state(buf, at), h, first, h.nesterov,
                                           h.maximize, decay)
        _store(table, at, p, key, rounding)
        _store_state(buf, at, b)
    else:
        _store(table, at, updates.sgd_plain_update(p, g, h, h.maximize, decay), key, rounding)


@cuda.jit
def _sgd_dense(param, grad, buf, first, h, dyn, word):
    """Elementwise SGD over flat arrays (grid-stride)."""
    if errors.is_pending(word):
        return
    h = _live_sgd(h, dyn)
    decay = h.weight_decay != 0
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        _sgd_element(param, buf, i, grad[i], first, h, decay, 0, ())


@cuda.jit
def _sgd_rows(table, source, buf, row_started, h, dyn, rounding, word):
    """SGD on rows ``source.rows[j]``: one block per listed row, threads along D."""
    if errors.is_pending(word):
        return
    key = _key(table, rounding)
    h = _live_sgd(h, dyn)
    decay = h.weight_decay != 0
    for j in range(cuda.blockIdx.x, source.used[0], cuda.gridDim.x):
        row = source.rows[j]
        first = h.momentum != 0 and not row_started[row]
        for d in range(cuda.threadIdx.x, table.shape[1], cuda.blockDim.x):
            g = _gradient(source, j, d)
            _sgd_element(table, buf, (row, d), g, first, h, decay, key, rounding)


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


@cuda.jit
def _adam_rows(table, source, exp_avg, exp_avg_sq, h, dyn, rounding, word):
    """SparseAdam on rows ``source.rows[j]``: one block per listed row, threads along D."""
    if errors.is_pending(word):
        return
    key = _key(table, rounding)
    h = _live_adam(h, dyn)
    l2, decoupled = updates.adam_decay_flags(h)
    for j in range(cuda.blockIdx.x, source.used[0], cuda.gridDim.x):
        row = source.rows[j]
        for d in range(cuda.threadIdx.x, table.shape[1], cuda.blockDim.x):
            g = _gradient(source, j, d)
            p, m, v = updates.sparse_adam_update(
                _load(table, (row, d), rounding), g, _load_state(exp_avg, (row, d)),
                exp_avg_sq[row, d], h, l2, decoupled)
            _store(table, (row, d), p, key, rounding)
            _store_state(exp_avg, (row, d), m)
            exp_avg_sq[row, d] = v


# ---------------------------------------------------------------- Adagrad kernels


@cuda.jit(device=True)
def _adagrad_element(table, state_sum, at, g, h, decay, key, rounding):
    # Element ``at`` of the table (and of its sum of squares) with gradient g.
    p, s = updates.adagrad_update(_load(table, at, rounding), g, state_sum[at], h, decay)
    _store(table, at, p, key, rounding)
    state_sum[at] = s


@cuda.jit
def _adagrad_dense(param, grad, state_sum, h, dyn, word):
    """Elementwise Adagrad over flat arrays (grid-stride)."""
    if errors.is_pending(word):
        return
    h = _live_adagrad(h, dyn)
    decay = h.weight_decay != 0
    for i in range(cuda.grid(1), param.size, cuda.gridsize(1)):
        _adagrad_element(param, state_sum, i, grad[i], h, decay, 0, ())


@cuda.jit
def _adagrad_rows(table, source, state_sum, h, dyn, rounding, word):
    """Adagrad on rows ``source.rows[j]``: one block per listed row, threads along D."""
    if errors.is_pending(word):
        return
    key = _key(table, rounding)
    h = _live_adagrad(h, dyn)
    decay = h.weight_decay != 0
    for j in range(cuda.blockIdx.x, source.used[0], cuda.gridDim.x):
        row = source.rows[j]
        for d in range(cuda.threadIdx.x, table.shape[1], cuda.blockDim.x):
            g = _gradient(source, j, d)
            _adagrad_element(table, state_sum, (row, d), g, h, decay, key, rounding)


# ---------------------------------------------------------------- row-wise Adagrad kernels


@cuda.jit(device=True)
def _rowwise_row(table, row, source, j, state_sum, h, key, rounding):
    # Row ``row`` with the gradient of ``source``'s row j, sequentially in one thread (the
    # CPU's order, so the same sum): the squares, the row's factors, then the update.
    l2 = h.mode == _L2
    dim = table.shape[1]
    segment = _segment(source, j)
    square_sum = cast_like(0, h.lr)
    for d in range(dim):
        square_sum += updates.rowwise_term(_column(source, segment, d),
                                           _load(table, (row, d), rounding), h, l2)
    acc, correction, multiplier = updates.rowwise_factors(
        state_sum[row], square_sum, cast_like(dim, h.lr), cast_like(1, h.lr), h)
    state_sum[row] = acc
    for d in range(dim):
        g = _column(source, segment, d)
        p = updates.rowwise_apply(_load(table, (row, d), rounding), g, correction, multiplier)
        _store(table, (row, d), p, key, rounding)


@cuda.jit
def _rowwise_dense(param, grad, state_sum, h, dyn, word):
    """Row-wise Adagrad on every row: one thread per row (grid-stride)."""
    if errors.is_pending(word):
        return
    h = _live_rowwise(h, dyn)
    for r in range(cuda.grid(1), param.shape[0], cuda.gridsize(1)):
        _rowwise_row(param, r, grad, r, state_sum, h, 0, ())


@cuda.jit
def _rowwise_rows(table, source, state_sum, h, dyn, rounding, word):
    """Row-wise Adagrad on rows ``source.rows[j]``: one thread per listed row (grid-stride)."""
    if errors.is_pending(word):
        return
    key = _key(table, rounding)
    h = _live_rowwise(h, dyn)
    for j in range(cuda.grid(1), source.used[0], cuda.gridsize(1)):
        _rowwise_row(table, source.rows[j], source, j, state_sum, h, key, rounding)
