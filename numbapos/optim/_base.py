"""The optimiser base class: parameter groups, per-parameter state, checkpoints."""

from __future__ import annotations

import copy
import os
import sys
import warnings
from typing import NamedTuple

import numpy as np

from .. import _checks, _device
from ..functional.capture import device_clock, device_counter
from ..functional.half import store_widened_, widen_table
from ..nn.parameter import Parameter
from ..sparse import SparseRows

# PyTorch's own words (torch/optim/optimizer.py, add_param_group), so that code
# filtering that warning filters ours too.
DUPLICATE_WARNING = ("optimizer contains a parameter group with duplicate parameters; "
                     "in future, this will cause an error; "
                     "see github.com/pytorch/pytorch/issues/40967 for more information")


# Options of PyTorch's optimisers that pick an implementation, not the arithmetic:
# a PyTorch checkpoint loads when they are off (False or None).
TORCH_ONLY_FLAGS = ("foreach", "capturable", "differentiable", "fused")

# The optimisers' shared parameters, for their docstrings' ``{name}`` lines
# (:func:`numbapos._docs.fill_doc`).
DOC = {
    "rounding": """\
stochastic_rounding : bool, default True
    How a bfloat16 / float16 table (updated in float32, with float32
    state) is written back: stochastically rounded (random bits from
    numbapos's keyed hash of ``(seed, rounding step, row, column)``), or,
    when False, to nearest even.
seed : int, default 0
    The stochastic rounding's seed.""",
}


def momentum_dtype_doc(state: str) -> str:
    """The docstring entry of ``momentum_dtype``, for an optimiser whose momentum is ``state``."""
    return f"""\
momentum_dtype : None, "float32" or "bfloat16", default None
    The dtype of {state} of bfloat16 / float16 tables: float32,
    or bfloat16 to halve it (widened to float32 for each update and
    stored back rounded to nearest even; FBGEMM's bfloat16 momentum).
    Float32 / float64 parameters keep their state in their own dtype."""


class StateArray(NamedTuple):
    """One array of a parameter's state: its shape, dtype and the value it starts at."""

    shape: tuple
    dtype: np.dtype
    fill: object


def _not_a_parameter(x) -> TypeError:
    hint = ""
    if type(x).__module__.startswith("torch"):
        hint = " (convert with numbapos.nn.Parameter(t.detach().numpy()))"
    elif _checks.is_array(x):
        hint = " (wrap the array: numbapos.nn.Parameter(array))"
    return TypeError("params: expected numbapos.nn.Parameter objects, got "
                     f"{_checks.type_name(x)}{hint}")


def _caller_level() -> int:
    """The ``stacklevel`` of the first frame outside this package (the user's call)."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) \
            == here:
        frame, level = frame.f_back, level + 1
    return level


def _check_momentum_dtype(momentum_dtype):
    """An optimiser's ``momentum_dtype``: None (float32) or bfloat16."""
    if momentum_dtype is None:
        return None
    try:
        dtype = _checks.check_table_dtype(momentum_dtype, "momentum_dtype")
    except TypeError:
        dtype = None
    if dtype == np.float32:
        return None
    if dtype is None or dtype.name != "bfloat16":
        raise ValueError("momentum_dtype: expected None, 'float32' or 'bfloat16' (the momentum "
                         f"of bfloat16 / float16 tables), got {momentum_dtype!r}")
    return dtype


def num_rows(shape) -> int:
    """Rows of a parameter of ``shape``: ``shape[0]``, or 1 for a 0-d parameter."""
    return int(shape[0]) if len(shape) else 1


class Optimizer:
    """Base class of numbapos optimisers: parameter groups and per-parameter state.

    Subclasses name their options (``_OPTIONS``, with defaults in
    ``self.defaults``), validate them (``_check_options``), declare the state
    one parameter needs (``_state_spec``) and apply one update
    (``_update``). Everything else, PyTorch's ``Optimizer`` interface, lives here:
    ``param_groups``, ``add_param_group``, ``zero_grad``, ``step``,
    ``state_dict`` / ``load_state_dict`` and the repr.

    State is kept per parameter in ``self.state[id(param)]``, a dict of
    arrays (on the parameter's device, made lazily on the parameter's first
    step) and Python scalars (step counts, flags).

    **Per-row state convention.** Every state array whose leading dimension
    equals the parameter's number of rows (``shape[0]``; 1 for a 0-d
    parameter) holds one entry per row of the parameter: momentum buffers,
    the rows-started flags of SGD, Adam's moments, Adagrad's sums and the
    row-wise accumulator of :class:`RowWiseAdagrad` (shape ``(V,)``). Row
    ``r`` of such an array belongs to row ``r`` of the parameter, so a table
    split by rows (sharding) splits these arrays the same way. Every other
    entry (step counts, ``dense_started``) is global to the parameter.

    **Checkpoints.** :meth:`state_dict` returns PyTorch's layout::

        {"state": {index: {name: ndarray copy or Python scalar, ...}, ...},
         "param_groups": [{option: value, ..., "params": [index, ...]}, ...]}

    where parameters are numbered 0, 1, ... in the order of the groups and
    of the parameters in them, and ``state`` has an entry only for parameters
    that have taken a step. Arrays are host (NumPy) copies.

    Attributes
    ----------
    param_groups : list of dict
        Each group's options and ``"params"``, its parameters.
    state : dict
        ``id(param) -> {name: array or scalar}``: each parameter's state.
    stochastic_rounding : bool
        How the updates of bfloat16 / float16 tables are stored back:
        stochastically (True, the default) or to nearest even.
    seed : int
        The stochastic rounding's seed (default 0).
    momentum_dtype : numpy.dtype or None
        bfloat16 for a bfloat16 momentum of 16-bit tables, None (the
        default) for float32.
    """

    _OPTIONS: tuple[str, ...] = ()

    def __init__(self, params, defaults: dict):
        # The subclasses' keywords set these (_set_rounding); they apply to 16-bit tables.
        self.stochastic_rounding: bool = True
        self.seed: int = 0
        self.momentum_dtype: np.dtype | None = None
        # What a step makes besides the state, keyed by id(param), never in a checkpoint:
        # - _clocks: a CUDA parameter's device clock (step count and learning rate on the
        #   GPU, made at its first CUDA step; see _clock);
        # - _rounding_counters: a 16-bit CUDA table's rounding step on the GPU (a device
        #   counter mirroring state["rounding_step"]; see _rounding_counter);
        # - _shadows: the float32 copy of a 16-bit table that _check makes for a dense step
        #   and _apply updates and stores back (empty between steps).
        # - _checked: per CUDA parameter with a sparse gradient, what :meth:`_check` read
        #   when it last passed (see _checked_key): the same again passes again.
        self._clocks: dict[int, object] = {}
        self._rounding_counters: dict[int, object] = {}
        self._shadows: dict[int, object] = {}
        self._checked: dict[int, tuple] = {}
        # - _replays: per CUDA parameter stepped inside its backward (fuse_with_backward),
        #   what the last full step read and used, for the next one to go straight to the
        #   update while all of it is unchanged (see _replay; subclasses that have one).
        self._replays: dict[int, tuple] = {}
        self.defaults = self._check_options(dict(defaults))
        if isinstance(params, (Parameter, dict)) or _checks.is_array(params) \
                or not hasattr(params, "__iter__"):
            raise TypeError("params: expected an iterable of numbapos.nn.Parameter objects or "
                            f"of parameter-group dicts, got {_checks.type_name(params)}")
        if isinstance(params, (set, frozenset)):
            raise TypeError("params: expected an ordered collection such as a list (the order "
                            "of a set changes between runs), got a set")
        params = list(params)
        if not params:
            raise ValueError("params: got an empty parameter list")
        if not isinstance(params[0], dict):
            params = [{"params": params}]
        self.param_groups: list[dict] = []
        self.state: dict[int, dict] = {}
        for group in params:
            self.add_param_group(group)

    # ------------------------------------------------------------ options and groups

    def _check_options(self, options: dict) -> dict:
        """Validated copy of one group's options (subclasses check their own)."""
        return dict(options)

    def add_param_group(self, param_group: dict) -> None:
        """Add a group of parameters with its own options.

        Parameters
        ----------
        param_group : dict
            ``"params"``: a Parameter or an ordered iterable of them; any
            other entry overrides the optimiser's default of that option.

        Raises
        ------
        TypeError
            Not a dict with ``"params"``, a set of parameters, or an entry that
            is not a :class:`numbapos.nn.Parameter` (its full type is named).
        ValueError
            An unknown or invalid option, an empty group, or a parameter that
            already belongs to another group.

        Warns
        -----
        UserWarning
            A parameter listed twice in this group (PyTorch's warning; it is
            then updated twice per step, as in PyTorch).
        """
        if not isinstance(param_group, dict) or "params" not in param_group:
            raise TypeError("param_group: expected a dict with a 'params' entry, got "
                            f"{_checks.type_name(param_group)}")
        unknown = set(param_group) - {"params", *self._OPTIONS}
        if unknown:
            raise ValueError(f"param group: unknown option(s) {sorted(unknown)}; "
                             f"{type(self).__name__} takes {list(self._OPTIONS)}")
        params = param_group["params"]
        if isinstance(params, (set, frozenset)):
            raise TypeError("params: expected an ordered collection such as a list (the order "
                            "of a set changes between runs), got a set")
        params = [params] if isinstance(params, Parameter) else list(params)
        for param in params:
            if not isinstance(param, Parameter):
                raise _not_a_parameter(param)
        options = self._check_options({**self.defaults, **{k: v for k, v in param_group.items()
                                                           if k != "params"}})
        if len({id(p) for p in params}) != len(params):
            warnings.warn(DUPLICATE_WARNING, UserWarning, stacklevel=_caller_level())
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params):
            raise ValueError("params: some parameters appear in more than one group (each "
                             "parameter may belong to one parameter group only)")
        self.param_groups.append({"params": params, **options})

    def zero_grad(self) -> None:
        """Drop the gradients of every parameter (``grad = None``)."""
        for group in self.param_groups:
            for param in group["params"]:
                param.grad = None

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {key}: {group[key]}" for key in sorted(group) if key != "params"]
        return "\n".join(lines) + "\n)"

    # ------------------------------------------------------------ state

    def _state_spec(self, shape, dtype, group) -> tuple[dict, dict]:
        """``(arrays, scalars)``: the state one parameter of ``shape``/``dtype`` needs.

        ``arrays`` maps names to :class:`StateArray`, ``scalars`` maps names to
        their starting values (whose types they keep).
        """
        return {}, {}

    _MOMENTUM: str | None = None
    """The state array ``momentum_dtype`` applies to (SGD's buffer, Adam's ``exp_avg``)."""

    def _spec(self, data, group) -> tuple[dict, dict]:
        """:meth:`_state_spec` of a parameter array: float32 state for a 16-bit table (its
        momentum bfloat16 with ``momentum_dtype="bfloat16"``), which also counts its rounding
        steps (``"rounding_step"``, the stochastic rounding's key)."""
        arrays, scalars = self._state_spec(tuple(data.shape), _checks.grad_dtype(data.dtype),
                                           group)
        if _checks.is_half_dtype(data.dtype):
            scalars = {**scalars, "rounding_step": 0}
            momentum_dtype = self.momentum_dtype
            if momentum_dtype is not None and self._MOMENTUM in arrays:
                arrays = {**arrays, self._MOMENTUM:
                          arrays[self._MOMENTUM]._replace(dtype=momentum_dtype)}
        return arrays, scalars

    def _state(self, param: Parameter, group: dict) -> dict:
        """``param``'s state, with whatever the group's options need made now (lazily)."""
        data = param.data
        state = self.state.setdefault(id(param), {})
        arrays, scalars = self._spec(data, group)
        device = _device.device_of(data)
        for name, spec in arrays.items():
            if state.get(name) is None:
                state[name] = _device.full(spec.shape, spec.fill, spec.dtype, device)
        for name, value in scalars.items():
            state.setdefault(name, value)
        return state

    # On the GPU each parameter's step count and learning rate also live in device memory
    # (a clock, kernels/cuda/clock.py): the kernels read them there, so a captured step
    # (numbapos.cuda.capture) advances them on every replay. ``state["step"]`` is the
    # host's count of eager steps; state_dict() reports the device's.

    def _clock(self, param: Parameter, group: dict, state: dict):
        """``param``'s device clock (made at its first CUDA step, at the state's step count,
        before this step's increment), its learning rate set to the group's; None on the
        CPU."""
        if _device.device_of(param.data) != "cuda":
            return None
        clock = self._clocks.get(id(param))
        if clock is None:
            clock = self._clocks[id(param)] = device_clock(
                group["lr"], state.get("step", 0), source=lambda: group["lr"])
        clock.set_lr(group["lr"])
        return clock

    def _check_state(self, param: Parameter, group: dict) -> None:
        """ValueError if ``param`` changed shape, dtype or device since its state was made."""
        data = param.data
        arrays, _ = self._spec(data, group)
        for name, value in self.state.get(id(param), {}).items():
            spec = arrays.get(name)
            if spec is None or value is None or not _checks.is_array(value):
                continue
            if (tuple(value.shape) != tuple(spec.shape) or value.dtype != spec.dtype
                    or _device.device_of(value) != _device.device_of(data)):
                made = f"shape {tuple(value.shape)}, dtype {value.dtype} on " \
                       f"{_device.device_of(value)!r}"
                raise ValueError(
                    f"param.data: shape {tuple(data.shape)}, dtype {data.dtype} on "
                    f"{_device.device_of(data)!r}, but its {name.replace('_', ' ')} was made "
                    f"for {made}; a parameter must keep its shape, dtype and device (create a "
                    f"new {type(self).__name__} after replacing or moving it)")

    # ------------------------------------------------------------ stepping

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
            read-only parameter, a parameter whose shape, dtype or device
            changed since its state was made, or a gradient this optimiser's
            options refuse.
        IndexError
            A SparseRows row outside the parameter.
        """
        todo = []  # loops, not a comprehension: no call of their own
        for group in self.param_groups:
            for param in group["params"]:
                if param.grad is not None and param.requires_grad:
                    todo.append((param, group))
        if todo:  # none left after steps fused with the backward
            self._check_then_apply(todo)

    def _check_then_apply(self, todo) -> None:
        """Check every ``(param, group)`` of ``todo``, then update each: a failed check
        changes nothing (the float32 copies checked so far are dropped)."""
        try:
            for param, group in todo:
                self._check(param, group)
        except BaseException:
            self._shadows.clear()
            raise
        for param, group in todo:
            self._apply(param, group)
            param.bump_version()

    def fuse_with_backward(self) -> HookHandles:
        """Update each parameter inside the backward pass that makes its gradient.

        PyTorch's "optimizer in backward" pattern: a hook on every parameter
        (:meth:`~numbapos.nn.Parameter.register_post_accumulate_grad_hook`)
        applies this optimiser's update to that parameter as soon as a module's
        ``backward`` has accumulated its gradient, then drops the gradient
        (``grad = None``); :meth:`step` then has nothing left to do for it.
        With a sparse :class:`~numbapos.nn.Embedding`, or a sparse
        :class:`~numbapos.nn.EmbeddingBag` in sum mode without
        ``per_sample_weights`` or ``scale_grad_by_freq``, the update is fused
        with the gradient itself (every optimiser here: SGD, Adam/AdamW,
        Adagrad, RowWiseAdagrad): each used row's gradient is summed and
        applied in one pass, and the ``(rows, D)`` gradient is never stored.
        The result is bit-identical to ``backward`` followed by :meth:`step`,
        as long as each parameter gets one backward per step (a tied or shared
        parameter updated by two backward calls gets two updates, not one on
        the sum).

        Returns
        -------
        HookHandles
            ``handles.remove()`` restores the usual backward-then-step behaviour.
        """
        handles = []
        for group in self.param_groups:
            for param in group["params"]:
                handles.append(param._register_fused_step(
                    lambda p, group=group: self._step_one(p, group)))
        return HookHandles(handles)

    def _step_one(self, param: Parameter, group: dict) -> None:
        """One parameter's update from its fresh gradient, which is then dropped."""
        if param.grad is None or not param.requires_grad:
            return
        if not self._replay(param, group):
            self._check_then_apply([(param, group)])
            self._remember(param, group)
        param.grad = None

    def _replay(self, param: Parameter, group: dict) -> bool:
        """The fused step of :meth:`_step_one` done the way :meth:`_remember` recorded it,
        when everything :meth:`_check` and :meth:`_update` would read is as it was then
        (the check would pass again, the update would use the same state); False, nothing
        done, otherwise (the full step runs). The base class has none."""
        return False

    def _remember(self, param: Parameter, group: dict) -> None:
        """After a full fused step of ``param``: what :meth:`_replay` needs (none here)."""

    # 16-bit tables (bfloat16 / float16) are updated in float32 with float32 state and
    # stored back rounded stochastically (or to nearest even). A SparseRows gradient goes
    # to the sparse functional ops, which do all three per row in one pass (the
    # subclass's _update passes them the ``rounding`` keywords _apply gives it). A dense
    # gradient updates a float32 copy of the whole table: _check widens it (kept in
    # _shadows until _apply), _update runs on the copy, and _apply stores it back.

    def _set_rounding(self, stochastic_rounding, seed, momentum_dtype=None) -> None:
        """How 16-bit tables are written back and the dtype of their momentum (the
        subclasses' keyword arguments)."""
        self.stochastic_rounding = bool(stochastic_rounding)
        self.seed = _checks.check_uint64(seed, "seed")
        self.momentum_dtype = _check_momentum_dtype(momentum_dtype)

    def _check(self, param: Parameter, group: dict) -> None:
        """Validate ``param``, its gradient and its state, before any parameter is updated.

        These checks read only metadata; for a CUDA parameter with a gradient numbapos made
        they are skipped when they read the same as the last time they passed.
        """
        key = self._checked_key(param, group)
        if key is not None and self._checked.get(id(param)) == key:
            return
        self._check_all(param, group)
        if key is not None:
            self._checked[id(param)] = key

    def _checked_key(self, param: Parameter, group: dict):
        """Everything :meth:`_check` reads of a CUDA ``param`` whose gradient is a private
        :class:`SparseRows` (its arrays never handed out: nothing of them is read back), or
        None for any other parameter: its dtype, shape and layout (``plans.signature``),
        the gradient's, the group's options and the state's arrays."""
        grad = param.grad
        if type(grad) is not SparseRows or not grad._private \
                or not _device.backend_loaded("cuda"):
            return None
        signature = _signature()
        data = signature(param.data)
        rows, values, _ = grad._padded()
        source = signature(grad._source())
        if data is None or source is None or signature(rows) is None:
            return None
        options = tuple(map(group.get, self._OPTIONS))
        state = []
        for name, value in self.state.get(id(param), {}).items():
            if type(value) in (bool, int, float) or value is None:
                continue  # what _check_state skips
            found = signature(value)
            if found is None:
                return None
            state.append((name, found))
        return (type(self), data, grad._num_rows, source, values is None, options,
                tuple(map(type, options)), self.momentum_dtype, tuple(state))

    def _check_all(self, param: Parameter, group: dict) -> None:
        """:meth:`_check`'s checks."""
        table = param.data
        if not _checks.is_half_dtype(getattr(table, "dtype", None)):
            self._check_float(param, group)
            return
        table = _checks.check_table(table, "param.data")
        _checks.check_writeable(table, "param.data", "the optimiser updates it in place")
        if isinstance(param.grad, SparseRows):
            if not _device.is_c_contiguous(table):
                raise ValueError(f"param.data: a {table.dtype} table is updated in place "
                                 "through its bits and must be C-contiguous")
            self._check_float(param, group, table)
            return
        self._check_state(param, group)  # the state is the 16-bit table's
        shadow = self._shadows.get(id(param))
        if shadow is None:
            shadow = self._shadows[id(param)] = widen_table(table)
        param.data = shadow
        try:
            self._check_float(param, group, state=False)
        finally:
            param.data = table

    def _apply(self, param: Parameter, group: dict) -> None:
        """:meth:`_update`; a 16-bit table's rounding step counted, its dense update run on
        the float32 copy :meth:`_check` made and stored back."""
        table = param.data
        if not _checks.is_half_dtype(table.dtype):
            self._update(param, group, {})
            return
        state = self._state(param, group)  # float32 arrays, the rounding step
        step = state["rounding_step"]
        # On the GPU the rounding step is also a device counter, which the kernels read
        # and this draw advances there (so a captured step's replays round with their
        # own steps); the host's count stays exact (see kernels/cuda/clock.py).
        drawn = step
        if _device.device_of(table) == "cuda":
            drawn = self._rounding_counter(param).draw()
        shadow = self._shadows.pop(id(param), None)
        narrow = {}
        if shadow is not None:
            narrow = self._widen_state(param, group)  # its state made for the 16-bit table
            param.data = shadow
            rounding = {}  # the float32 copy's update: stored back rounded below
        else:  # the sparse ops round the rows they update, keyed by this step
            rounding = {"stochastic_rounding": self.stochastic_rounding, "seed": self.seed,
                        "rounding_step": drawn}
        try:
            self._update(param, group, rounding)
        finally:
            param.data = table
            self._narrow_state(param, narrow)
        state["rounding_step"] = step + 1
        if shadow is not None:
            store_widened_(table, shadow, seed=self.seed, step=drawn,
                           stochastic_rounding=self.stochastic_rounding)

    def _rounding_counter(self, param: Parameter):
        """``param``'s rounding step on the device (made from the host's at its first CUDA
        update; :class:`numbapos.kernels.cuda.clock.DeviceCounter`)."""
        counters = self._rounding_counters
        counter = counters.get(id(param))
        if counter is None:
            key = id(param)

            def source():  # self.state, as load_state_dict may replace it
                return self.state[key]["rounding_step"]

            def sink(value):
                self.state[key]["rounding_step"] = value

            counter = counters[key] = device_counter(source, sink, "rounding step")
        return counter

    def _widen_state(self, param: Parameter, group: dict) -> dict:
        """A dense step on a 16-bit table's float32 copy: its bfloat16 momentum (if any) swapped
        for a float32 copy in the state; ``{name: bfloat16 array}`` to store back into."""
        state = self._state(param, group)
        value = state.get(self._MOMENTUM) if self._MOMENTUM else None
        if value is None or not _checks.is_half_dtype(value.dtype):
            return {}
        state[self._MOMENTUM] = widen_table(value)
        return {self._MOMENTUM: value}

    def _narrow_state(self, param: Parameter, narrow: dict) -> None:
        """Store the float32 copies :meth:`_widen_state` made back into their bfloat16 arrays,
        rounded to nearest even, and put those back in the state."""
        state = self.state.get(id(param), {})
        for name, value in narrow.items():
            store_widened_(value, state[name], seed=0, step=0, stochastic_rounding=False)
            state[name] = value

    def _check_float(self, param: Parameter, group: dict, table=None, state=True) -> None:
        """The checks of a float parameter, or (``table``) of a 16-bit table's sparse step;
        its state's too unless ``state`` is False."""
        data = table if table is not None else _checks.check_update_target(param.data,
                                                                           "param.data")
        if state:
            self._check_state(param, group)
        grad = param.grad
        if isinstance(grad, SparseRows):
            _checks.check_sparse_grad(grad, data, "param.grad", summed=grad.summed)
            self._check_sparse(group)
        else:
            grad = _checks.check_float_array(grad, "param.grad")
            _checks.check_same_shape(grad, data.shape, "param.grad", "the parameter's shape")
        where = grad._padded()[0] if isinstance(grad, SparseRows) else grad  # nothing read back
        _checks.check_same_device((data, where), ("param.data", "param.grad"))

    def _check_sparse(self, group: dict) -> None:
        """ValueError where the group's options refuse a SparseRows gradient (none here)."""

    def _update(self, param: Parameter, group: dict, rounding: dict) -> None:
        """Apply one update to ``param`` (checked by :meth:`_check`) with ``group``'s options.

        ``rounding`` holds the keywords the sparse functional ops take to store a 16-bit
        table's rows back (``stochastic_rounding``, ``seed`` and this step's
        ``rounding_step``: on the GPU the device counter :meth:`_apply` drew); it is empty
        for a float parameter and for the float32 copy a dense step of a 16-bit table
        updates.
        """
        raise NotImplementedError

    # ------------------------------------------------------------ checkpoints

    def _indexed_params(self):
        """``(index, param)`` in state-dict order; a parameter listed twice keeps its first."""
        index = 0
        for group in self.param_groups:
            for param in group["params"]:
                yield index, param
                index += 1

    def state_dict(self) -> dict:
        """The optimiser's state and options as plain Python and NumPy objects.

        Returns
        -------
        dict
            ``{"state": {index: {name: value}}, "param_groups": [group, ...]}``,
            PyTorch's layout: each group holds its options and ``"params"``,
            the indices of its parameters (numbered across groups in order);
            ``state`` has an entry for each parameter that has state. Arrays
            are NumPy copies (taken from the GPU for CUDA parameters); scalars
            are Python ints, floats and bools. Arrays whose first dimension
            is the parameter's row count are per-row state (see the class
            docstring).
        """
        first: dict[int, int] = {}
        for index, param in self._indexed_params():
            first.setdefault(id(param), index)
        state = {}
        for key, value in self.state.items():
            if key in first and value:
                state[first[key]] = {name: _device.to_host(v).copy() if _checks.is_array(v)
                                     else copy.deepcopy(v) for name, v in value.items()
                                     if v is not None}
                clock = self._clocks.get(key)
                if clock is not None and "step" in value:
                    # Replays of a captured step advance the device's count, not the host's.
                    value["step"] = state[first[key]]["step"] = clock.step()
        groups = []
        for group in self.param_groups:
            packed = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
            packed["params"] = [first[id(p)] for p in group["params"]]
            groups.append(packed)
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore options and state saved by :meth:`state_dict` (PyTorch's layout).

        The saved groups' options replace the current ones; their parameters
        stay the optimiser's own, matched by position. State arrays are copied
        onto each parameter's device; float arrays are cast to the
        parameter's dtype (as PyTorch does), other arrays must have the dtype
        the optimiser uses. Everything is checked before anything changes.

        Parameters
        ----------
        state_dict : dict
            ``{"state": {...}, "param_groups": [...]}``. Arrays may be NumPy
            arrays, CUDA arrays or anything ``numpy.asarray`` accepts (PyTorch
            CPU tensors); ``None`` entries are ignored, and so are PyTorch's
            implementation flags (``foreach``, ``capturable``,
            ``differentiable``, ``fused``) when they are off, so a PyTorch
            optimiser's ``state_dict()`` of the same options loads.

        Raises
        ------
        TypeError
            Not a dict of that layout, or a state value of the wrong kind.
        ValueError
            Another number of groups or of parameters in a group, invalid or
            unknown options, a state entry for no parameter, an unknown or
            missing state name, or an array of the wrong shape.
        """
        if not isinstance(state_dict, dict) or set(state_dict) != {"state", "param_groups"}:
            raise TypeError("state_dict: expected a dict with exactly the entries 'state' and "
                            f"'param_groups', got {_checks.quote(state_dict)}")
        saved_groups, saved_state = state_dict["param_groups"], state_dict["state"]
        if not isinstance(saved_groups, (list, tuple)) or not isinstance(saved_state, dict):
            raise TypeError("state_dict: expected 'param_groups' to be a list and 'state' a "
                            "dict")
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(f"state_dict: has {len(saved_groups)} parameter group(s), this "
                             f"optimiser has {len(self.param_groups)}")
        groups, owner = self._load_groups(saved_groups)
        state = {}
        for key, values in saved_state.items():
            index = _checks.check_int(key, "state_dict['state'] key")
            if index not in owner:
                raise ValueError(f"state_dict: state for parameter {index}, but the saved groups "
                                 f"list {len(owner)} parameter(s)")
            param, group = owner[index]
            state[id(param)] = self._load_param_state(values, param, group, index)
        # The loaded options go into the current group dicts, which the hooks of
        # fuse_with_backward hold: a fused optimiser steps with the loaded options too.
        for current, loaded in zip(self.param_groups, groups, strict=True):
            current.clear()
            current.update(loaded)
        self.state = state
        self._clocks.clear()  # remade from the loaded step counts at the next step
        self._replays.clear()

    def _load_groups(self, saved_groups):
        """New groups (saved options, current parameters) and ``index -> (param, group)``."""
        groups, owner = [], {}
        for i, (saved, current) in enumerate(zip(saved_groups, self.param_groups, strict=True)):
            where = f"state_dict['param_groups'][{i}]"
            if not isinstance(saved, dict) or "params" not in saved:
                raise TypeError(f"{where}: expected a dict with a 'params' entry")
            indices = list(saved["params"])
            if len(indices) != len(current["params"]):
                raise ValueError(f"{where}: lists {len(indices)} parameter(s), the optimiser's "
                                 f"group {i} has {len(current['params'])}")
            saved = {k: v for k, v in saved.items() if not (k in TORCH_ONLY_FLAGS and not v)}
            unknown = set(saved) - {"params", *self._OPTIONS}
            if unknown:
                raise ValueError(f"{where}: unknown option(s) {sorted(unknown)}")
            options = self._check_options({**{k: current[k] for k in self._OPTIONS},
                                           **{k: v for k, v in saved.items() if k != "params"}})
            group = {"params": current["params"], **options}
            groups.append(group)
            for index, param in zip(indices, current["params"], strict=True):
                owner[_checks.check_int(index, f"{where}['params'] entry")] = (param, group)
        return groups, owner

    def _load_param_state(self, values, param, group, index):
        """Checked copy of one parameter's saved state, on the parameter's device."""
        where = f"state_dict['state'][{index}]"
        if not isinstance(values, dict):
            raise TypeError(f"{where}: expected a dict, got {_checks.type_name(values)}")
        data = param.data
        arrays, scalars = self._spec(data, group)
        values = {k: v for k, v in values.items() if v is not None}
        unknown = set(values) - set(arrays) - set(scalars)
        if unknown:
            raise ValueError(f"{where}: unknown state {sorted(map(str, unknown))} for "
                             f"{type(self).__name__} with these options (expected "
                             f"{sorted([*arrays, *scalars])})")
        missing = (set(arrays) | set(scalars)) - set(values)
        if values and missing:
            raise ValueError(f"{where}: missing state {sorted(missing)}")
        loaded = {}
        for name, spec in arrays.items():
            if name in values:
                loaded[name] = self._load_array(values[name], spec, data, f"{where}[{name!r}]")
        for name, start in scalars.items():
            if name in values:
                loaded[name] = _load_scalar(values[name], start, f"{where}[{name!r}]")
        return loaded

    @staticmethod
    def _load_array(value, spec: StateArray, data, name: str):
        host = _device.to_host(value) if _checks.is_array(value) else np.asarray(value)
        if tuple(host.shape) != tuple(spec.shape):
            raise ValueError(f"{name}: expected shape {tuple(spec.shape)} (for a parameter of "
                             f"shape {tuple(data.shape)}), got {tuple(host.shape)}")
        want = np.dtype(spec.dtype)
        castable = host.dtype == want or (host.dtype.kind == "f" and want.kind == "f")
        if not castable:
            raise TypeError(f"{name}: expected dtype {want}, got {host.dtype}")
        host = np.array(host, dtype=want, copy=True, order="C")
        return _device.to_device(host, _device.device_of(data))


def _load_scalar(value, start, name: str):
    """A saved scalar as the type of its starting value (0-d arrays and tensors accepted)."""
    if not isinstance(value, (bool, int, float, np.generic)):
        array = np.asarray(value)
        if array.shape != ():
            raise TypeError(f"{name}: expected a scalar, got shape {array.shape}")
        value = array.item()
    if isinstance(start, bool):
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{name}: expected a bool, got {_checks.quote(value)}")
        return bool(value)
    if isinstance(start, int):
        if float(value) != int(value) or value < 0:
            raise ValueError(f"{name}: expected a whole number >= 0, got {_checks.quote(value)}")
        return int(value)
    return float(value)


def _grad_key(grad):
    """What :meth:`Optimizer._check` reads of a private :class:`SparseRows` gradient (its
    shape, and where it lives: the type of its rows' array), or None for any other
    gradient."""
    if type(grad) is not SparseRows or not grad._private:
        return None
    return grad._num_rows, grad._source().shape[1], type(grad._indices)


def _signature():
    """``numbapos._gpuhost.plans.signature`` (imported once the CUDA backend is in use)."""
    global _signature
    from .._gpuhost.plans import signature

    _signature = lambda: signature  # noqa: E731
    return signature


class HookHandles:
    """The hooks :meth:`Optimizer.fuse_with_backward` registered; ``remove()`` unregisters them."""

    def __init__(self, handles):
        self._handles = list(handles)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
