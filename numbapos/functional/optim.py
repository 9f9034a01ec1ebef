"""Optimiser updates as in-place ops: SGD, Adam/AdamW, Adagrad, row-wise Adagrad.

Each optimiser has a dense op (every element) and a sparse one that updates
only the rows a :class:`~numbapos.sparse.SparseRows` gradient lists.
:mod:`numbapos.optim` keeps the state (momentum buffers, moments, sums, step
counts) and calls these; they validate, then run the update kernels of the
device the parameter lives on. The ``check_*_options`` helpers validate the
options both here and when an optimiser is built.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .. import _checks, _device
from .._args import (
    WEIGHT_DECAY_MODES,
    AdagradHyper,
    AdamHyper,
    HalfRounding,
    RowWiseAdagradHyper,
    SGDHyper,
)
from .._docs import fill_doc
from ..sparse import SparseRows
from ._common import Planned, backend_for
from .half import half_format

_FLOAT32 = np.dtype(np.float32)

# ---------------------------------------------------------------- shared docstring text

# Written once: each ``{name}`` line of an op's docstring becomes ``_DOC[name]``
# (``@fill_doc(_DOC)``, numbapos/_docs.py).
_SPARSE_GRAD = """\
grad : SparseRows
    Rows unique, sorted, in ``[0, V)``; values cast to ``param``'s dtype
    (float32 for a 16-bit ``param``)."""
_DOC = {
    "dense_target": """\
param : ndarray or CUDA array, float32 or float64
    Updated in place.
grad : ndarray or CUDA array
    Of ``param``'s shape (cast to its dtype).""",
    "sparse_half": """\
A bfloat16 / float16 ``param`` (C-contiguous) is updated in float32: each
listed element is widened, updated with float32 gradient and state, and
stored back rounded, in one pass, with no float32 copy of the table.""",
    "sparse_grad": _SPARSE_GRAD,
    "sparse_target": """\
param : ndarray or CUDA array, shape (V, D), float32, float64, bfloat16 or float16
    Updated in place.
""" + _SPARSE_GRAD,
    "clock": """\
clock : optional
    CUDA only, what the optimisers pass: a device clock
    (``numbapos.kernels.cuda.clock.Clock``) whose step this call advances
    and whose step and learning rate the kernels read on the device (so a
    captured step, ``numbapos.cuda.capture``, replays correctly). The
    values are those the host would compute: same bits.""",
    "rounding": """\
stochastic_rounding : bool, default True
    For a bfloat16 / float16 ``param``: each updated element, computed in
    float32, is stored stochastically rounded with the keyed hash of
    ``(seed, rounding_step, row, column)``; False rounds to nearest
    even. Ignored for float32 / float64.
seed, rounding_step : int, default 0
    The stochastic rounding's key, each in ``[0, 2**64)`` (a new
    ``rounding_step`` for each step: :mod:`numbapos.optim` counts them).
    For a CUDA ``param`` ``rounding_step`` may be a device counter, a CUDA
    array of one uint64 that the kernels read when they run (what the
    optimisers pass there, so that a captured step's replays round with
    their own steps).""",
    "returns": """\
Returns
-------
ndarray
    ``param``.""",
    "raises": """\
Raises
------
TypeError, ValueError
    A non-float, read-only or mismatched array, a bad option.""",
}

# ---------------------------------------------------------------- shared checks


def _non_negative(options: dict, names) -> dict:
    """``options`` with each of ``names`` checked to be a finite real >= 0 (as a float)."""
    checked = dict(options)
    for name in names:
        value = _checks.check_real(checked[name], name)
        if value < 0 or np.isinf(value):
            raise ValueError(f"{name}: expected a finite number >= 0, got {value}")
        checked[name] = value
    return checked


def _dense_args(param, grad, states, names):
    """Checked ``(K, param, grad, states)`` of an elementwise update.

    Every state array has the parameter's shape and dtype, is C-contiguous and
    shares no memory with the parameter or the gradient.
    """
    param = _checks.check_update_target(param)
    grad = _checks.check_float_array(grad, "grad")
    _checks.check_same_shape(grad, param.shape, "grad", "the parameter's shape")
    K = backend_for((param, grad, *states), ("param", "grad", *names))
    return K, param, grad, _same_as_param(states, names, param, avoid=(grad,))


def _flat(x):
    """``x`` as one dimension."""
    return x.reshape(x.size)


def _rows_view(x):
    """``x`` as ``(rows, D)``: rows = ``shape[0]`` (1 for a 0-d array), D the rest."""
    rows = x.shape[0] if x.ndim else 1
    return x.reshape((rows, x.size // rows if rows else 0))


def _run_flat(K, param, grad, states, launch, view=_flat):
    """``launch(param, grad, *states)`` on ``view``s of param and grad (flat, or
    :func:`_rows_view`) and flat states; a strided NumPy param is copied in and out."""
    if param.size == 0:
        return param
    contiguous = _device.is_c_contiguous(param)
    table = view(K.contiguous(param))  # a copy only for a strided NumPy param
    launch(table, view(K.contiguous(grad, param.dtype)), *[_flat(s) for s in states])
    if not contiguous:
        np.copyto(param, table.reshape(param.shape))
    return param


class SummedRows(NamedTuple):
    """A sparse update's gradient as rows and their summed values (C-contiguous, int64 rows).

    ``used`` rows are real: an int, or on the GPU a device array whose first
    entry is (the arrays are then padded; kernels read the count).
    """

    rows: object
    values: object
    used: object


class UnsummedRows(NamedTuple):
    """A lookup's gradient not summed yet (``embedding_backward(..., lazy=True)``): the
    update sums each row in its own pass."""

    groups: object  # RowGroups
    grad: object  # (N, D)
    scale_grad_by_freq: bool


def _sparse_target(param):
    """``(param, dtype)``: the checked parameter of a sparse update and the dtype its
    arithmetic, gradient and state use (float32 for a bfloat16 / float16 table)."""
    dtype = getattr(param, "dtype", None)
    if dtype is None or not _checks.is_half_dtype(dtype):
        param = _checks.check_update_target(param)
        return param, param.dtype
    table = _checks.check_table(param, "param")
    _checks.check_writeable(table, "param", "the update writes its rows in place")
    if not _device.is_c_contiguous(table):
        raise ValueError(f"param: a {table.dtype} table is updated in place through its bits "
                         "and must be C-contiguous")
    return table, _FLOAT32


def _rounding(param, stochastic_rounding, seed, rounding_step):
    """The :class:`HalfRounding` of a 16-bit ``param`` (checked), None for a float one.

    ``rounding_step`` is an int, or for a CUDA ``param`` a device counter (a
    CUDA array of one uint64 that the kernels read)."""
    if not _checks.is_half_dtype(param.dtype):
        return None
    seed = _checks.check_uint64(seed, "seed")
    if _device.is_cuda_array(rounding_step):
        live = _checks.check_device_counter(rounding_step, "rounding_step")
        if _device.device_of(param) != "cuda":
            raise TypeError("rounding_step: a device counter (a CUDA array) needs a CUDA "
                            "param; on the CPU pass an int")
        return HalfRounding(half_format(param.dtype), seed, np.uint64(0),
                            bool(stochastic_rounding), live)
    return HalfRounding(half_format(param.dtype), seed,
                        _checks.check_uint64(rounding_step, "rounding_step"),
                        bool(stochastic_rounding))


def _sparse_args(param, dtype, grad, states, names):
    """Checked ``(K, param, rows)`` of an update of the rows ``grad`` lists (``param`` and
    ``dtype`` from :func:`_sparse_target`).

    ``rows`` is :class:`SummedRows` (int64 rows and values of ``dtype``,
    C-contiguous on the parameter's device) or, for an unsummed gradient of
    ``dtype``, :class:`UnsummedRows` for a fused update. ``states`` (None
    entries skipped) are only checked to live on that device (callers check
    their shapes).
    """
    if not isinstance(grad, SparseRows):
        raise TypeError(f"grad: expected a SparseRows, got {type(grad).__name__}")
    unsummed = grad._take_unsummed()
    if unsummed is not None and unsummed[1].dtype != dtype:
        unsummed = None  # sum first, then cast, as a summed gradient would be
        grad.materialize()
    rows, values, used = _checks.check_sparse_grad(grad, param, summed=unsummed is None)
    source = values if unsummed is None else unsummed[1]
    K = backend_for((param, source, *states), ("param", "grad.values", *names))
    if not _device.is_c_contiguous(param) and K.DEVICE == "cuda":
        raise ValueError("param: expected a C-contiguous CUDA array")
    if unsummed is not None:
        return K, param, UnsummedRows(*unsummed)
    if _device.device_of(rows) != K.DEVICE:
        rows = K.asarray(rows) if K.DEVICE == "cuda" else _device.to_host(rows)
    return K, param, SummedRows(K.contiguous(rows, np.int64), K.contiguous(values, dtype), used)


def _stepvalues():
    """``numbapos.kernels.stepvalues``: the step scalars' code shared with the GPU's clocks."""
    return _device.kernels_for("cpu").stepvalues


def _live(K, hyper, clock, param, kind, **options):
    """``hyper`` with its step-dependent values read from ``clock`` on the device, which this
    advances by one step (``kernels/cuda/clock.py``); ``hyper`` itself without a clock.

    The host's values of those fields are zeroed (the kernels read the clock's), so that
    the parameters packed for a launch do not change with them (see :func:`_live_rate`).
    """
    if clock is None:
        return hyper
    if K.DEVICE != "cuda":
        raise TypeError("clock: an optimiser clock keeps the step on the GPU; it is for CUDA "
                        f"parameters only, got a {type(param).__name__}")
    options = {name: float(value) if name != "sparse" else value
               for name, value in options.items()}
    fields = _LIVE_FIELDS.get((type(hyper), kind))
    if fields is not None:
        zero = type(getattr(hyper, fields[0]))(0)
        hyper = hyper._replace(**dict.fromkeys(fields, zero))
    # A 16-bit table's arithmetic (and so its step's scalars) is float32.
    return K.clock.tick(clock, hyper, _checks.grad_dtype(param.dtype), getattr(K.clock, kind),
                        **options)


# The fields of each hyper-parameter tuple that a clock's tick replaces on the device
# (kernels/cuda/optim.py, ``_live_*``).
_LIVE_FIELDS = {(SGDHyper, "SGD"): ("lr",)}

# ---------------------------------------------------------------- plans (CUDA)

_SPARSE_SGD = Planned("sparse_sgd_")


def _typed(value):
    """``value`` in a plan's key with its type (``True``, ``1`` and ``1.0`` are equal keys
    that the checks tell apart)."""
    return type(value), value


def _live_rate(lr, clock):
    """``lr`` in a plan's key: with a clock the kernels read the clock's rate, so any valid
    float rate has one key (a scheduler changing it does not make a plan per step)."""
    if clock is not None and type(lr) is float and 0.0 <= lr < math.inf:
        return "a valid rate"
    return _typed(lr)


def _planned_sparse(param, grad, clock, rounding_step, stochastic_rounding, seed):
    """``(arrays, options)`` of a sparse update's plan key beyond ``param`` and its state, or
    None where the update is not planned.

    Planned: a CUDA step from a gradient numbapos made (see :func:`_planned_grad`), with a
    clock or none, and for a 16-bit table a device rounding counter. ``arrays`` are the
    gradient's arrays, the clock's and the counter; ``options`` what the checks of the
    gradient, the clock and the rounding read.
    """
    dtype = getattr(param, "dtype", None)
    if not isinstance(dtype, np.dtype) or not _device.backend_loaded("cuda"):
        return None
    half = _checks.is_half_dtype(dtype)
    planned = _planned_grad(grad, _FLOAT32 if half else dtype)
    if planned is None:
        return None
    arrays, options = planned
    options += (clock is None,)
    if clock is not None:
        if type(clock) is not _clock_type():
            return None
        arrays += [clock.values, clock.dyn(_FLOAT32 if half else dtype)]
    if half:
        if not _device.is_cuda_array(rounding_step):
            return None  # a step counted on the host: a new key every step
        arrays.append(rounding_step)
        options += (_typed(stochastic_rounding), _typed(seed))
    return arrays, options


def _planned_grad(grad, dtype):
    """``(arrays, options)`` of a sparse update's plan key that its gradient gives, for an
    update in ``dtype``; None where it is not planned: a gradient numbapos did not make
    (private), one with its count of rows on the host, or with values the update sums and
    casts first."""
    if type(grad) is not SparseRows or not grad._private:
        return None
    pending = grad._pending
    if pending is None:
        rows, values, used = grad._padded()
        if isinstance(used, int):
            return None
        return [rows, values, used], ("summed", grad._num_rows)
    groups, source, scale = pending  # scale_grad_by_freq, a bool
    if source.dtype != dtype:
        return None  # the update sums the rows first (materialize): not a replay
    return [*groups, source], (("unsummed", scale), grad._num_rows)


def _nothing(K, shape, dtype):
    """The empty array a kernel gets for an absent state (on the GPU one made once, which a
    plan may keep)."""
    if K.DEVICE == "cuda":
        return K.arrays.absent(dtype, len(shape))
    return K.empty(shape, dtype)


def _clock_type():
    """The CUDA backend's ``Clock`` class (the backend is in use when this is asked)."""
    found = _CLOCK_TYPE[0]
    if found is None:
        found = _CLOCK_TYPE[0] = _device.kernels_for("cuda").clock.Clock
    return found


_CLOCK_TYPE = [None]  # the CUDA backend's Clock class, once asked


def _update_rows(launchers, param, rows, rounding, *rest):
    """Apply a sparse update to the rows ``_sparse_args`` returned.

    ``launchers`` are the optimiser's ``(rows, row_groups)`` launchers:
    ``update_rows(param, rows, values, used, *rest, rounding)`` for summed rows,
    the fused ``update_row_groups(param, grad, groups, scale_grad_by_freq,
    *rest, rounding)`` (each row summed inside the update) otherwise. A 16-bit
    ``param`` goes to them as its ``uint16`` bits, with its ``rounding``
    (None for float tables).
    """
    update_rows, update_row_groups = launchers
    if rounding is not None:
        param = param.view(np.uint16)
    if isinstance(rows, UnsummedRows):
        update_row_groups(param, rows.grad, rows.groups, rows.scale_grad_by_freq, *rest,
                          rounding)
    else:
        update_rows(param, rows.rows, rows.values, rows.used, *rest, rounding)


def _momentum_state(state, name, param, dtype, avoid=()):
    """A sparse step's momentum state (SGD's buffer, Adam's ``exp_avg``) checked: ``dtype``
    (float32 for a 16-bit ``param``), or bfloat16 beside a bfloat16 / float16 ``param``, then
    passed to the kernels as its ``uint16`` bits."""
    if (_checks.is_half_dtype(param.dtype) and state is not None
            and getattr(getattr(state, "dtype", None), "name", None) == "bfloat16"):
        state = _checks.check_out(state, tuple(param.shape), state.dtype, name,
                                  avoid=(param, *avoid))
        return state.view(np.uint16)
    return _same_as_param([state], [name], param, avoid, dtype=dtype)[0]


def _same_as_param(states, names, param, avoid=(), dtype=None):
    """Each state checked to have ``param``'s shape and dtype (or ``dtype``), C-contiguous
    and not aliased."""
    dtype = param.dtype if dtype is None else dtype
    return [_checks.check_out(s, tuple(param.shape), dtype, n, avoid=(param, *avoid))
            for s, n in zip(states, names, strict=True)]



# ---------------------------------------------------------------- SGD


def check_sgd_options(options: dict) -> dict:
    """SGD's options checked: ``lr``, ``momentum``, ``dampening``, ``weight_decay`` >= 0."""
    checked = _non_negative(options, ("lr", "momentum", "dampening", "weight_decay"))
    checked["nesterov"] = bool(checked["nesterov"])
    checked["maximize"] = bool(checked["maximize"])
    if checked["nesterov"] and (checked["momentum"] <= 0 or checked["dampening"] != 0):
        raise ValueError("nesterov: requires momentum > 0 and dampening == 0, got "
                         f"momentum={checked['momentum']}, dampening={checked['dampening']}")
    return checked


def _sgd_hyper(dtype, lr, momentum, dampening, weight_decay, nesterov, maximize) -> SGDHyper:
    v = check_sgd_options(dict(lr=lr, momentum=momentum, dampening=dampening,
                               weight_decay=weight_decay, nesterov=nesterov, maximize=maximize))
    cast = np.dtype(dtype).type
    return SGDHyper(cast(v["lr"]), cast(v["momentum"]), cast(1.0 - v["dampening"]),
                    cast(v["weight_decay"]), v["nesterov"], v["maximize"])


def _momentum_buffer(buf, momentum):
    """``[buf]`` when momentum is on (then required), else ``[]``."""
    if momentum == 0:
        return []
    if buf is None:
        raise ValueError("momentum_buffer: required when momentum != 0 (an array of the "
                         "parameter's shape and dtype, zeros before the first step)")
    return [buf]


@fill_doc(_DOC)
def sgd_(param, grad, momentum_buffer=None, *, lr, momentum=0.0, dampening=0.0,
         weight_decay=0.0, nesterov=False, maximize=False, first_step=True, clock=None):
    """One SGD step on ``param`` in place, ``torch.optim.SGD``'s rule for a dense gradient.

    Parameters
    ----------
    param : ndarray, float32 or float64
        Updated in place (any layout on the CPU; CUDA arrays are C-contiguous).
    grad : ndarray
        Gradient of ``param``'s shape (cast to its dtype).
    momentum_buffer : ndarray, optional
        C-contiguous, of ``param``'s shape and dtype; needed when
        ``momentum != 0`` and updated in place.
    lr, momentum, dampening, weight_decay : float
        Finite and >= 0.
    nesterov, maximize : bool
    first_step : bool, default True
        The buffer starts as the gradient on the first step (PyTorch's
        ``momentum_buffer is None``).
    {clock}

    {returns}

    {raises}
    """
    hyper = _sgd_hyper(_checks.check_update_target(param).dtype, lr, momentum, dampening,
                       weight_decay, nesterov, maximize)
    bufs = _momentum_buffer(momentum_buffer, hyper.momentum)
    K, param, grad, bufs = _dense_args(param, grad, bufs, ["momentum_buffer"][:len(bufs)])
    hyper = _live(K, hyper, clock, param, "SGD")
    no_buffer = K.empty((0,), param.dtype)  # the kernel's buffer when there is none to pass
    return _run_flat(K, param, grad, bufs, lambda p, g, b=no_buffer: K.sgd_dense_(
        p, g, b, bool(first_step), hyper))


@fill_doc(_DOC)
def sparse_sgd_(param, grad, momentum_buffer=None, row_started=None, *, lr, momentum=0.0,
                dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False, clock=None,
                stochastic_rounding=True, seed=0, rounding_step=0):
    """Lazy SGD on the rows a :class:`~numbapos.sparse.SparseRows` gradient lists.

    Only those rows are read and written. A row's momentum starts (as the
    gradient) the first time a step touches it, recorded in ``row_started``;
    rows not listed keep their values and momentum (no decay, no drift).

    {sparse_half}

    Parameters
    ----------
    param : ndarray, shape (V, D), float32, float64, bfloat16 or float16
        Updated in place.
    {sparse_grad}
    momentum_buffer : ndarray, shape (V, D), optional
        Needed when ``momentum != 0``; C-contiguous, ``param``'s dtype
        (float32 for a 16-bit ``param``, or bfloat16: widened, updated in
        float32 and stored back rounded to nearest even).
    row_started : ndarray of bool, shape (V,), optional
        Needed when ``momentum != 0``; updated in place.
    lr, momentum, dampening, weight_decay, nesterov, maximize
        As for :func:`sgd_`.
    {clock}
    {rounding}

    {returns}
    """
    def full():
        return _sparse_sgd(param, grad, momentum_buffer, row_started, lr, momentum, dampening,
                           weight_decay, nesterov, maximize, clock, stochastic_rounding, seed,
                           rounding_step)

    if type(param) is np.ndarray:
        return full()
    planned = _planned_sparse(param, grad, clock, rounding_step, stochastic_rounding, seed)
    if planned is None:
        return full()
    arrays, options = planned
    options += (_live_rate(lr, clock), *_typed_values(momentum, dampening, weight_decay,
                                                      nesterov, maximize))
    return _SPARSE_SGD.call(full, (param, momentum_buffer, row_started, *arrays), options,
                            outputs=(0,), avoid=_SGD_AVOID)


# momentum_buffer and row_started must not overlap param, nor each other
_SGD_AVOID = ((1, 0), (2, 0), (2, 1))


def _typed_values(*values):
    """Options in a plan's key, with their types (see :func:`_typed`)."""
    return values, tuple(map(type, values))


class _SparseSGDReplay:
    """:func:`sparse_sgd_` of a float32 / float64 CUDA parameter with a clock, the options
    but the rate fixed: what an optimiser's step fused with the backward calls again while
    those stay (the part of the plan's key they make is made once).

    ``replay(param, grad, momentum_buffer, row_started, lr)`` is ``sparse_sgd_(param, grad,
    momentum_buffer, row_started, lr=lr, clock=clock, **options)``, for a ``param`` of the
    dtype given here.
    """

    __slots__ = ("_clock", "_dtype", "_values", "_arrays", "_options")

    def __init__(self, dtype, clock, momentum, dampening, weight_decay, nesterov, maximize):
        self._clock, self._dtype = clock, dtype
        self._values = (momentum, dampening, weight_decay, nesterov, maximize)
        self._arrays = (clock.values, clock.dyn(dtype))
        self._options = _typed_values(*self._values)

    def __call__(self, param, grad, momentum_buffer, row_started, lr):
        clock = self._clock

        def full():
            return _sparse_sgd(param, grad, momentum_buffer, row_started, lr, *self._values,
                               clock, True, 0, 0)

        planned = _planned_grad(grad, self._dtype)
        if planned is None:
            return full()
        arrays, options = planned
        # The key sparse_sgd_ makes of these (a clock of its type, a float parameter).
        # _live_rate(lr, clock), inline (the clock is there).
        rate = "a valid rate" if type(lr) is float and 0.0 <= lr < math.inf else _typed(lr)
        return _SPARSE_SGD.call(
            full, (param, momentum_buffer, row_started, *arrays, *self._arrays),
            options + (False, rate, *self._options), outputs=(0,), avoid=_SGD_AVOID)


def _sparse_sgd(param, grad, momentum_buffer, row_started, lr, momentum, dampening,
                weight_decay, nesterov, maximize, clock, stochastic_rounding, seed,
                rounding_step):
    """:func:`sparse_sgd_`'s ordinary path: every check, then the launches."""
    param, dtype = _sparse_target(param)
    hyper = _sgd_hyper(dtype, lr, momentum, dampening, weight_decay, nesterov, maximize)
    rounding = _rounding(param, stochastic_rounding, seed, rounding_step)
    bufs = _momentum_buffer(momentum_buffer, hyper.momentum)
    K, param, rows = _sparse_args(param, dtype, grad, (momentum_buffer, row_started),
                                  ("momentum_buffer", "row_started"))
    hyper = _live(K, hyper, clock, param, "SGD")
    if bufs:
        bufs = [_momentum_state(bufs[0], "momentum_buffer", param, dtype)]
        if row_started is None:
            raise ValueError("row_started: required when momentum != 0 (a bool array with "
                             "one flag per row)")
        started = _checks.check_out(row_started, (param.shape[0],), np.dtype(np.bool_),
                                    "row_started", avoid=(param, bufs[0]))
    else:
        bufs, started = [_nothing(K, (0, 0), dtype)], _nothing(K, (0,), np.bool_)
    _update_rows((K.sgd_rows_, K.sgd_row_groups_), param, rows, rounding, bufs[0], started, hyper)
    return param


# ---------------------------------------------------------------- Adam / AdamW


def check_adam_options(options: dict) -> dict:
    """Adam's options checked as ``torch.optim.Adam`` checks them (and finite).

    ``lr``, ``eps``, ``weight_decay`` >= 0; ``betas`` two numbers in ``[0, 1)``.
    """
    checked = _non_negative(options, ("lr", "eps", "weight_decay"))
    betas = checked["betas"]
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas: expected a pair (beta1, beta2), got {_checks.quote(betas)}")
    betas = tuple(_checks.check_real(b, f"betas[{i}]") for i, b in enumerate(betas))
    for i, beta in enumerate(betas):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"betas[{i}]: expected a number in [0, 1), got {beta}")
    checked["betas"] = betas
    for flag in ("amsgrad", "maximize", "decoupled_weight_decay"):
        if flag in checked:
            checked[flag] = bool(checked[flag])
    return checked


def _adam_hyper(dtype, step, lr, betas, eps, weight_decay, maximize, decoupled_weight_decay,
                amsgrad=False, sparse=False) -> AdamHyper:
    v = check_adam_options(dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
    step = _checks.check_int(step, "step", minimum=1)
    (beta1, beta2), lr = v["betas"], v["lr"]
    # torch.optim.SparseAdam folds sqrt(bias_correction2) into the step size. Computed as
    # a captured CUDA step computes it on the device (kernels/stepvalues.py): same bits.
    decay, neg_step_size, root = _stepvalues().adam_scalars(
        float(lr), float(beta1), float(beta2), float(v["weight_decay"]), step, bool(sparse))
    cast = np.dtype(dtype).type
    return AdamHyper(cast(1 - beta1), cast(beta2), cast(1 - beta2), cast(v["eps"]),
                     cast(v["weight_decay"]), cast(decay), cast(neg_step_size), cast(root),
                     bool(decoupled_weight_decay), bool(amsgrad), bool(maximize))


@fill_doc(_DOC)
def adam_(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq=None, *, step, lr=1e-3,
          betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False,
          decoupled_weight_decay=False, clock=None):
    """One Adam (or AdamW) step on ``param`` in place, ``torch.optim.Adam``'s rule.

    Per element, in ``param``'s dtype::

        g = -g                                        if maximize
        p = p * (1 - lr * weight_decay)               if decoupled_weight_decay (AdamW)
        g = g + weight_decay * p                      otherwise, if weight_decay != 0
        m = lerp(m, g, 1 - beta1)
        v = beta2 * v + (1 - beta2) * g * g
        v_max = max(v_max, v); v = v_max              if amsgrad
        p = p - lr / (1 - beta1**step) * m / (sqrt(v) / sqrt(1 - beta2**step) + eps)

    Parameters
    ----------
    {dense_target}
    exp_avg, exp_avg_sq : ndarray or CUDA array
        The moments: ``param``'s shape and dtype, C-contiguous, updated in
        place (zeros before the first step).
    max_exp_avg_sq : ndarray or CUDA array, optional
        Needed with ``amsgrad``; like ``exp_avg``.
    step : int
        The step number, 1 on the first step (after PyTorch's increment).
    lr, eps, weight_decay : float
        Finite and >= 0.
    betas : (float, float)
        Each in ``[0, 1)``.
    amsgrad, maximize, decoupled_weight_decay : bool
    {clock}

    {returns}

    {raises}
    """
    hyper = _adam_hyper(_checks.check_update_target(param).dtype, step, lr, betas, eps,
                        weight_decay, maximize, decoupled_weight_decay, amsgrad=amsgrad)
    states, names = [exp_avg, exp_avg_sq], ["exp_avg", "exp_avg_sq"]
    if hyper.amsgrad:
        if max_exp_avg_sq is None:
            raise ValueError("max_exp_avg_sq: required with amsgrad=True (an array of the "
                             "parameter's shape and dtype, zeros before the first step)")
        states.append(max_exp_avg_sq)
        names.append("max_exp_avg_sq")
    K, param, grad, states = _dense_args(param, grad, states, names)
    hyper = _live(K, hyper, clock, param, "ADAM", beta1=betas[0], beta2=betas[1],
                  weight_decay=weight_decay)
    no_max = K.empty((0,), param.dtype)  # the kernel's max_exp_avg_sq without amsgrad
    return _run_flat(K, param, grad, states, lambda p, g, m, v, vmax=no_max: K.adam_dense_(
        p, g, m, v, vmax, hyper))


@fill_doc(_DOC)
def sparse_adam_(param, grad, exp_avg, exp_avg_sq, *, step, lr=1e-3, betas=(0.9, 0.999),
                 eps=1e-8, weight_decay=0.0, maximize=False, decoupled_weight_decay=False,
                 clock=None, stochastic_rounding=True, seed=0, rounding_step=0):
    """Lazy Adam on the rows a SparseRows gradient lists, ``torch.optim.SparseAdam``'s rule.

    Only the listed rows of ``param`` and of the moments are read and written;
    the others keep their values (their moments do not decay). For each
    listed element, in ``param``'s dtype::

        g = -g                                         if maximize
        m = m + (g - m) * (1 - beta1)
        v = v + (g * g - v) * (1 - beta2)
        p = p - lr * sqrt(1 - beta2**step) / (1 - beta1**step) * m / (sqrt(v) + eps)

    exactly ``torch.optim.SparseAdam`` (``step`` counts the parameter's steps,
    not the row's). ``weight_decay``, which SparseAdam lacks, acts lazily on the
    listed rows as in :func:`adam_` (L2, or AdamW's decay with
    ``decoupled_weight_decay``) before the update.

    {sparse_half}

    Parameters
    ----------
    {sparse_target}
    exp_avg, exp_avg_sq : ndarray or CUDA array, shape (V, D)
        The moments, ``param``'s dtype (float32 for a 16-bit ``param``;
        ``exp_avg`` may then be bfloat16: widened, updated in float32 and
        stored back rounded to nearest even), C-contiguous, updated in place.
    step, lr, betas, eps, weight_decay, maximize, decoupled_weight_decay
        As for :func:`adam_`.
    {clock}
    {rounding}

    {returns}
    """
    param, dtype = _sparse_target(param)
    hyper = _adam_hyper(dtype, step, lr, betas, eps, weight_decay, maximize,
                        decoupled_weight_decay, sparse=True)
    rounding = _rounding(param, stochastic_rounding, seed, rounding_step)
    names = ["exp_avg", "exp_avg_sq"]
    K, param, rows = _sparse_args(param, dtype, grad, (exp_avg, exp_avg_sq), names)
    hyper = _live(K, hyper, clock, param, "ADAM", beta1=betas[0], beta2=betas[1],
                  weight_decay=weight_decay, sparse=True)
    m = _momentum_state(exp_avg, "exp_avg", param, dtype, avoid=(exp_avg_sq,))
    v = _same_as_param([exp_avg_sq], ["exp_avg_sq"], param, avoid=(exp_avg,), dtype=dtype)[0]
    _update_rows((K.adam_rows_, K.adam_row_groups_), param, rows, rounding, m, v, hyper)
    return param


# ---------------------------------------------------------------- Adagrad


def check_adagrad_options(options: dict) -> dict:
    """Adagrad's options checked as ``torch.optim.Adagrad`` checks them (and finite)."""
    names = [n for n in ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps")
             if n in options]
    checked = _non_negative(options, names)
    if "maximize" in checked:
        checked["maximize"] = bool(checked["maximize"])
    return checked


def _adagrad_hyper(dtype, step, lr, lr_decay, weight_decay, eps, maximize) -> AdagradHyper:
    v = check_adagrad_options(dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                   eps=eps))
    step = _checks.check_int(step, "step", minimum=1)
    neg_clr = _stepvalues().adagrad_neg_clr(float(v["lr"]), float(v["lr_decay"]), float(step))
    cast = np.dtype(dtype).type
    return AdagradHyper(cast(neg_clr), cast(v["weight_decay"]), cast(v["eps"]), bool(maximize))


@fill_doc(_DOC)
def adagrad_(param, grad, state_sum, *, step, lr=1e-2, lr_decay=0.0, weight_decay=0.0,
             eps=1e-10, maximize=False, clock=None):
    """One Adagrad step on ``param`` in place, ``torch.optim.Adagrad``'s rule.

    Per element, in ``param``'s dtype::

        g = -g                            if maximize
        g = g + weight_decay * p          if weight_decay != 0
        s = s + g * g
        p = p - lr / (1 + (step - 1) * lr_decay) * g / (sqrt(s) + eps)

    Parameters
    ----------
    {dense_target}
    state_sum : ndarray or CUDA array
        The sum of squared gradients: ``param``'s shape and dtype,
        C-contiguous, updated in place.
    step : int
        The step number, 1 on the first step.
    lr, lr_decay, weight_decay, eps : float
        Finite and >= 0.
    maximize : bool
    {clock}

    {returns}
    """
    hyper = _adagrad_hyper(_checks.check_update_target(param).dtype, step, lr, lr_decay,
                           weight_decay, eps, maximize)
    K, param, grad, states = _dense_args(param, grad, [state_sum], ["state_sum"])
    hyper = _live(K, hyper, clock, param, "ADAGRAD", lr_decay=lr_decay)
    return _run_flat(K, param, grad, states, lambda p, g, s: K.adagrad_dense_(p, g, s, hyper))


@fill_doc(_DOC)
def sparse_adagrad_(param, grad, state_sum, *, step, lr=1e-2, lr_decay=0.0, eps=1e-10,
                    maximize=False, clock=None, stochastic_rounding=True, seed=0,
                    rounding_step=0):
    """Adagrad on the rows a SparseRows gradient lists, as ``torch.optim.Adagrad`` does.

    The listed elements follow :func:`adagrad_`'s rule (PyTorch's sparse path
    computes the same operations); other rows, their sums included, are not
    touched. PyTorch refuses weight decay with sparse gradients, and so does
    this op (it has no ``weight_decay``).

    {sparse_half}

    Parameters
    ----------
    {sparse_target}
    state_sum : ndarray or CUDA array, shape (V, D)
        ``param``'s dtype (float32 for a 16-bit ``param``), C-contiguous,
        updated in place.
    step, lr, lr_decay, eps, maximize
        As for :func:`adagrad_`.
    {clock}
    {rounding}

    {returns}
    """
    param, dtype = _sparse_target(param)
    hyper = _adagrad_hyper(dtype, step, lr, lr_decay, 0.0, eps, maximize)
    rounding = _rounding(param, stochastic_rounding, seed, rounding_step)
    K, param, rows = _sparse_args(param, dtype, grad, (state_sum,), ("state_sum",))
    hyper = _live(K, hyper, clock, param, "ADAGRAD", lr_decay=lr_decay)
    (state_sum,) = _same_as_param((state_sum,), ["state_sum"], param, dtype=dtype)
    _update_rows((K.adagrad_rows_, K.adagrad_row_groups_), param, rows, rounding, state_sum, hyper)
    return param


# ---------------------------------------------------------------- row-wise Adagrad


def check_rowwise_adagrad_options(options: dict) -> dict:
    """Row-wise Adagrad's options: ``lr``, ``eps``, ``weight_decay`` >= 0 and a known mode.

    ``weight_decay_mode`` is ``"none"``, ``"l2"`` or ``"decoupled"``; a
    nonzero ``weight_decay`` with ``"none"`` is refused (it would be ignored).
    """
    checked = _non_negative(options, ("lr", "eps", "weight_decay"))
    mode = checked["weight_decay_mode"]
    if not isinstance(mode, str) or mode.lower() not in WEIGHT_DECAY_MODES:
        raise ValueError(f"weight_decay_mode: expected one of {sorted(WEIGHT_DECAY_MODES)}, "
                         f"got {_checks.quote(mode)}")
    checked["weight_decay_mode"] = mode.lower()
    if checked["weight_decay"] != 0 and checked["weight_decay_mode"] == "none":
        raise ValueError(f"weight_decay: {checked['weight_decay']} would be ignored with "
                         "weight_decay_mode='none'; pick 'l2' or 'decoupled'")
    return checked


def _rowwise_hyper(dtype, lr, eps, weight_decay, weight_decay_mode) -> RowWiseAdagradHyper:
    v = check_rowwise_adagrad_options(dict(lr=lr, eps=eps, weight_decay=weight_decay,
                                           weight_decay_mode=weight_decay_mode))
    cast = np.dtype(dtype).type
    return RowWiseAdagradHyper(cast(v["lr"]), cast(v["eps"]), cast(v["weight_decay"]),
                               int(WEIGHT_DECAY_MODES[v["weight_decay_mode"]]))


@fill_doc(_DOC)
def rowwise_adagrad_(param, grad, state_sum, *, lr=1e-2, eps=1e-8, weight_decay=0.0,
                     weight_decay_mode="none", clock=None):
    """One step of FBGEMM's exact row-wise Adagrad on every row of ``param``, in place.

    Row ``r`` (``param[r]``, flattened to D values; a 0-d or 1-D parameter
    has rows of one value) with gradient row ``g``, in ``param``'s dtype, as
    FBGEMM's ``EXACT_ROWWISE_ADAGRAD`` CPU update::

        h = g + weight_decay * p          if weight_decay_mode == "l2", else g
        s[r] = s[r] + sum(h * h) / D      (summed along the row in order)
        mult = lr / (sqrt(s[r]) + eps)
        c = 1 - mult * weight_decay       if "l2"
            1 - lr * weight_decay         if "decoupled"
            1                             if "none"
        p = c * p - mult * g

    Parameters
    ----------
    {dense_target}
    state_sum : ndarray or CUDA array, shape (rows,)
        One accumulator per row, ``param``'s dtype, C-contiguous, updated in
        place (zeros before the first step).
    lr, eps, weight_decay : float
        Finite and >= 0.
    weight_decay_mode : {"none", "l2", "decoupled"}
    {clock}

    {returns}
    """
    hyper = _rowwise_hyper(_checks.check_update_target(param).dtype, lr, eps, weight_decay,
                           weight_decay_mode)
    _, param, grad, _ = _dense_args(param, grad, [], [])
    rows = param.shape[0] if param.ndim else 1
    K = backend_for((param, grad, state_sum), ("param", "grad", "state_sum"))
    hyper = _live(K, hyper, clock, param, "SGD")  # the learning rate alone
    state_sum = _checks.check_out(state_sum, (rows,), param.dtype, "state_sum",
                                  avoid=(param, grad))
    return _run_flat(K, param, grad, [state_sum],
                     lambda p, g, s: K.rowwise_adagrad_dense_(p, g, s, hyper), view=_rows_view)


@fill_doc(_DOC)
def sparse_rowwise_adagrad_(param, grad, state_sum, *, lr=1e-2, eps=1e-8, weight_decay=0.0,
                            weight_decay_mode="none", clock=None, stochastic_rounding=True,
                            seed=0, rounding_step=0):
    """Row-wise Adagrad (FBGEMM's exact rule) on the rows a SparseRows gradient lists.

    Each listed row follows :func:`rowwise_adagrad_`; every other row and its
    accumulator are left alone (FBGEMM's sparse update). The work is
    O(rows listed * D).

    {sparse_half}

    Parameters
    ----------
    {sparse_target}
    state_sum : ndarray or CUDA array, shape (V,)
        One accumulator per row, ``param``'s dtype (float32 for a 16-bit
        ``param``), updated in place.
    lr, eps, weight_decay, weight_decay_mode
        As for :func:`rowwise_adagrad_`.
    {clock}
    {rounding}

    {returns}
    """
    param, dtype = _sparse_target(param)
    hyper = _rowwise_hyper(dtype, lr, eps, weight_decay, weight_decay_mode)
    rounding = _rounding(param, stochastic_rounding, seed, rounding_step)
    K, param, rows = _sparse_args(param, dtype, grad, (state_sum,), ("state_sum",))
    hyper = _live(K, hyper, clock, param, "SGD")  # the learning rate alone
    state_sum = _checks.check_out(state_sum, (param.shape[0],), dtype, "state_sum",
                                  avoid=(param,))
    _update_rows((K.rowwise_adagrad_rows_, K.rowwise_adagrad_row_groups_), param, rows, rounding,
                 state_sum, hyper)
    return param
