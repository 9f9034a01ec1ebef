"""SGD with momentum, on dense and row-sparse gradients."""

from __future__ import annotations

import weakref
from operator import is_not

import numpy as np

from .. import _checks, _device
from .._docs import fill_doc
from ..functional import optim as F
from ..nn.parameter import Parameter
from ..sparse import SparseRows
from ._base import DOC, Optimizer, StateArray, _grad_key, momentum_dtype_doc, num_rows

_OTHERS = ("momentum", "dampening", "weight_decay", "nesterov", "maximize")  # all but lr


# What a replay stands for: a subclass that changes any of these steps in full.
_REPLAYED = ("_check", "_checked_key", "_check_all", "_check_float", "_check_state",
             "_check_sparse", "_apply", "_update", "_state", "_spec", "_state_spec", "_clock")


def _weak(array):
    """A weak reference to ``array``, None for None."""
    return None if array is None else weakref.ref(array)


@fill_doc(DOC, momentum_dtype=momentum_dtype_doc("the momentum buffer"))
class SGD(Optimizer):
    """Stochastic gradient descent with momentum, PyTorch's update rule.

    For a dense gradient ``g`` of parameter ``p`` each step does, exactly as
    ``torch.optim.SGD``::

        g = -g                                   if maximize
        g = g + weight_decay * p                 if weight_decay != 0
        if momentum != 0:
            b = g                                on the first step
            b = momentum * b + (1 - dampening) * g   afterwards
            g = g + momentum * b if nesterov else b
        p = p - lr * g

    A :class:`~numbapos.sparse.SparseRows` gradient (``Embedding(sparse=True)``)
    is applied *lazily*: only the listed rows are read and written. Weight decay
    and momentum act on those rows alone; a row's momentum starts on the first
    step that touches it and is neither decayed nor applied on steps that do
    not. This differs from a dense update (which keeps moving every row along
    its momentum) and is what makes a sparse step cost O(rows used), not O(V).
    PyTorch's SGD refuses weight decay with sparse gradients, and its sparse
    momentum buffer grows to every row seen so far.

    The state lives on the device of its parameter; the updates run there,
    through :func:`numbapos.functional.sgd_` and
    :func:`numbapos.functional.sparse_sgd_`. With ``momentum != 0`` it is, per
    parameter of shape ``(V, ...)``:

    ``momentum_buffer``
        Array of the parameter's shape and dtype (per row); float32 for a
        bfloat16 / float16 table, or bfloat16 with ``momentum_dtype="bfloat16"``.
    ``row_started``
        Bool array of shape ``(V,)`` (per row): whether the row's momentum has
        started (``(1,)`` for a 0-d parameter).
    ``dense_started``
        Bool: a dense step has run, so every row has started.

    A dense step after sparse ones continues the started rows' momentum and
    starts the others fresh (their buffer becomes the gradient); a sparse step
    after dense ones continues every row. :meth:`state_dict` saves all three,
    so a checkpointed run resumes bit for bit.

    Parameters
    ----------
    params : iterable of Parameter, or of dicts
        Parameters to optimise, or parameter groups: dicts with a ``"params"``
        entry and any of the options below overriding the defaults.
    lr : float
        Learning rate (>= 0).
    momentum : float, default 0
    dampening : float, default 0
    weight_decay : float, default 0
        L2 penalty coefficient.
    nesterov : bool, default False
        Nesterov momentum; needs ``momentum > 0`` and ``dampening == 0``.
    maximize : bool, default False
        Ascend the objective instead of descending it.
    {rounding}
    {momentum_dtype}

    Examples
    --------
    >>> import numpy as np
    >>> from numbapos import nn, optim
    >>> p = nn.Parameter(np.ones(2, np.float32))
    >>> opt = optim.SGD([p], lr=0.5, momentum=0.9)
    >>> p.grad = np.ones(2, np.float32)
    >>> opt.step()
    >>> p.data
    array([0.5, 0.5], dtype=float32)
    >>> sorted(opt.state_dict()["state"][0])
    ['dense_started', 'momentum_buffer', 'row_started']
    """

    _OPTIONS = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize")
    _MOMENTUM = "momentum_buffer"

    def __init__(self, params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, maximize=False, *, stochastic_rounding=True, seed=0,
                 momentum_dtype=None):
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov,
                                      maximize=maximize))
        self._set_rounding(stochastic_rounding, seed, momentum_dtype)

    def _check_options(self, options):
        return F.check_sgd_options(options)

    def _state_spec(self, shape, dtype, group):
        if group["momentum"] == 0:
            return {}, {}
        arrays = {"momentum_buffer": StateArray(shape, dtype, 0),
                  "row_started": StateArray((num_rows(shape),), np.dtype(np.bool_), False)}
        return arrays, {"dense_started": False}

    def _remember(self, param: Parameter, group: dict) -> None:
        # A float CUDA table whose sparse gradient numbapos made, checked with exactly what
        # _checked_key reads now (the state made by an earlier step, its clock made). The
        # arrays are held weakly: an entry keeps nothing alive.
        key = id(param)
        data, state, clock = param.data, self.state.get(key), self._clocks.get(key)
        grad = _grad_key(param.grad)
        if (grad is None or state is None or clock is None
                or _checks.is_half_dtype(data.dtype)
                or any(getattr(type(self), name) is not getattr(SGD, name) for name in _REPLAYED)
                or self._checked.get(key) != self._checked_key(param, group)):
            self._replays.pop(key, None)
            return
        buf, started = state.get("momentum_buffer"), state.get("row_started")
        others = tuple(map(group.get, _OTHERS))
        self._replays[key] = (param, group, weakref.ref(data), _weak(buf), _weak(started), clock,
                              self.momentum_dtype, others, grad,
                              F._SparseSGDReplay(data.dtype, clock, *others))

    def _replay(self, param: Parameter, group: dict) -> bool:
        key = id(param)
        entry = self._replays.get(key)
        if entry is None:
            return False
        (known, known_group, data, buf, started, clock, momentum_dtype, others, grad,
         update) = entry
        state = self.state.get(key)
        data = data()
        buf = buf() if buf is not None else None
        started = started() if started is not None else None
        if (known is not param or known_group is not group or state is None
                or param.data is not data or data is None
                or state.get("momentum_buffer") is not buf
                or state.get("row_started") is not started
                or self._clocks.get(key) is not clock or self.momentum_dtype is not momentum_dtype
                or "lr" not in group):
            return False
        # The options but the rate, which _check does not read (the update checks it, as
        # the full step's does; the clock's is set from it as there): the same objects,
        # so of the same types too.
        if any(map(is_not, map(group.get, _OTHERS), others)) or _grad_key(param.grad) != grad:
            return False
        lr = group["lr"]
        clock.set_lr(lr)
        update(data, param.grad, buf, started, lr)
        param.bump_version()
        return True

    def _update(self, param: Parameter, group: dict, rounding: dict) -> None:
        data = param.data
        options = {name: group[name] for name in self._OPTIONS}
        momentum = group["momentum"]
        state = self._state(param, group)
        buf = state.get("momentum_buffer")
        started = state.get("row_started")
        grad = param.grad
        options["clock"] = self._clock(param, group, state)
        if isinstance(grad, SparseRows):
            F.sparse_sgd_(data, grad, buf, started, **options, **rounding)
            return
        if momentum != 0 and not state["dense_started"] and data.ndim == 2 \
                and _device.to_host(started).any():
            # Earlier sparse steps started some rows' momentum: continue per row.
            all_rows = SparseRows(np.arange(data.shape[0], dtype=np.int64),
                                  grad, data.shape[0])
            F.sparse_sgd_(data, all_rows, buf, started, **options)
        else:
            F.sgd_(data, grad, buf, **options,
                   first_step=momentum != 0 and not state["dense_started"])
        if momentum != 0:
            state["dense_started"] = True
            state["row_started"] = _device.full(tuple(started.shape), True, np.bool_,
                                                _device.device_of(data))
