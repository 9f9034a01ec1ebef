"""Optimisers. :class:`SGD` updates dense gradients and row-sparse ones."""

from __future__ import annotations

import numpy as np

from . import _checks, _device
from .functional import optim as F
from .nn.parameter import Parameter
from .sparse import SparseRows


class SGD:
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

    The state (momentum buffers) lives on the device of its parameter; the
    updates run there, through :func:`numbapos.functional.sgd_` and
    :func:`numbapos.functional.sparse_sgd_`.

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
    """

    _OPTIONS = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize")

    def __init__(self, params, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, maximize=False):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)
        self.defaults = self._check_options(defaults)
        params = list(params)
        if not params:
            raise ValueError("params: got an empty parameter list")
        if not isinstance(params[0], dict):
            params = [{"params": params}]
        self.param_groups = []
        for group in params:
            self.add_param_group(group)
        self.state: dict[int, dict] = {}

    @staticmethod
    def _check_options(options):
        checked = dict(options)
        for name in ("lr", "momentum", "dampening", "weight_decay"):
            value = _checks.check_real(checked[name], name)
            if value < 0 or np.isinf(value):
                raise ValueError(f"{name}: expected a finite number >= 0, got {value}")
            checked[name] = value
        checked["nesterov"] = bool(checked["nesterov"])
        checked["maximize"] = bool(checked["maximize"])
        if checked["nesterov"] and (checked["momentum"] <= 0 or checked["dampening"] != 0):
            raise ValueError("nesterov: requires momentum > 0 and dampening == 0, got "
                             f"momentum={checked['momentum']}, dampening={checked['dampening']}")
        return checked

    def add_param_group(self, group: dict) -> None:
        """Add a group of parameters with its own options."""
        if not isinstance(group, dict) or "params" not in group:
            raise TypeError("param group: expected a dict with a 'params' entry")
        unknown = set(group) - {"params", *self._OPTIONS}
        if unknown:
            raise ValueError(f"param group: unknown option(s) {sorted(unknown)}")
        params = group["params"]
        params = [params] if isinstance(params, Parameter) else list(params)
        for param in params:
            if not isinstance(param, Parameter):
                raise TypeError(f"params: expected Parameter objects, got {type(param).__name__}")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params):
            raise ValueError("params: a parameter appears in more than one group")
        options = self._check_options({**self.defaults, **{k: group[k] for k in group
                                                           if k != "params"}})
        self.param_groups.append({"params": params, **options})

    def zero_grad(self) -> None:
        """Drop the gradients of every parameter (``grad = None``)."""
        for group in self.param_groups:
            for param in group["params"]:
                param.grad = None

    def step(self) -> None:
        """Apply one update to every parameter that has a gradient.

        Every parameter and gradient is checked before any is updated, so a
        failed step changes nothing.

        Raises
        ------
        TypeError
            A gradient that is neither a float array nor a SparseRows.
        ValueError
            A gradient whose shape is not its parameter's, a SparseRows whose
            rows are not unique and sorted or whose parameter is not 2-D, a
            read-only parameter, or a parameter whose shape or dtype changed
            since its momentum buffer was made.
        IndexError
            A SparseRows row outside the parameter.
        """
        todo = [(param, group) for group in self.param_groups for param in group["params"]
                if param.grad is not None and param.requires_grad]
        for param, _ in todo:
            self._check(param)
        for param, group in todo:
            self._update(param, group)

    def fuse_with_backward(self):
        """Update each parameter inside the backward pass that makes its gradient.

        PyTorch's "optimizer in backward" pattern: a hook on every parameter
        (:meth:`~numbapos.nn.Parameter.register_post_accumulate_grad_hook`)
        applies this optimiser's update to that parameter as soon as a module's
        ``backward`` has accumulated its gradient, then drops the gradient
        (``grad = None``); :meth:`step` then has nothing left to do for it.
        For a sparse :class:`~numbapos.nn.Embedding` the update is fused with
        the gradient itself: each used row's gradient is summed and applied in
        one pass, and the ``(rows, D)`` gradient is never stored. The result is
        bit-identical to ``backward`` followed by :meth:`step`, as long as each
        parameter gets one backward per step (a tied or shared parameter
        updated by two backward calls gets two updates, not one on the sum).

        Returns
        -------
        HookHandles
            ``handles.remove()`` restores the usual backward-then-step behaviour.
        """
        handles = []
        for group in self.param_groups:
            for param in group["params"]:
                handles.append(param.register_post_accumulate_grad_hook(
                    lambda p, group=group: self._step_one(p, group)))
        return HookHandles(handles)

    def _step_one(self, param: Parameter, group: dict) -> None:
        """One parameter's update from its fresh gradient, which is then dropped."""
        if param.grad is None or not param.requires_grad:
            return
        self._check(param)
        self._update(param, group)
        param.grad = None

    def _check(self, param: Parameter) -> None:
        """Validate ``param`` and its gradient, before any parameter is updated."""
        data = _checks.check_update_target(param.data, "param.data")
        buf = self.state.get(id(param), {}).get("momentum_buffer")
        if buf is not None and (tuple(buf.shape) != tuple(data.shape) or buf.dtype != data.dtype
                                or _device.device_of(buf) != _device.device_of(data)):
            raise ValueError(
                f"param.data: shape {tuple(data.shape)}, dtype {data.dtype} on "
                f"{_device.device_of(data)!r}, but its momentum buffer was made for shape "
                f"{tuple(buf.shape)}, dtype {buf.dtype} on {_device.device_of(buf)!r}; a "
                "parameter must keep its shape, dtype and device (create a new SGD after "
                "replacing or moving it)"
            )
        grad = param.grad
        if isinstance(grad, SparseRows):
            _checks.check_sparse_grad(grad, data, "param.grad", summed=grad.summed)
        else:
            grad = _checks.check_float_array(grad, "param.grad")
            _checks.check_same_shape(grad, data.shape, "param.grad", "the parameter's shape")
        _checks.check_same_device((data, grad.indices if isinstance(grad, SparseRows) else grad),
                                  ("param.data", "param.grad"))

    def _update(self, param: Parameter, group: dict) -> None:
        data = param.data
        options = {name: group[name] for name in self._OPTIONS}
        momentum = group["momentum"]
        state = self.state.setdefault(id(param), {})
        device = _device.device_of(data)
        if momentum != 0 and "momentum_buffer" not in state:
            state["momentum_buffer"] = _device.zeros(tuple(data.shape), data.dtype, device)
            rows = data.shape[0] if data.ndim else 1
            state["row_started"] = _device.zeros((rows,), np.bool_, device)
            state["dense_started"] = False
        buf = state.get("momentum_buffer")
        started = state.get("row_started")
        grad = param.grad
        if isinstance(grad, SparseRows):
            F.sparse_sgd_(data, grad, buf, started, **options)
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
            state["row_started"] = _device.full(tuple(started.shape), True, np.bool_, device)


class HookHandles:
    """The hooks :meth:`SGD.fuse_with_backward` registered; ``remove()`` unregisters them."""

    def __init__(self, handles):
        self._handles = list(handles)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
