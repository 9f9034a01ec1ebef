"""Module: the base of every layer (forward/backward pairing, parameters, buffers, state)."""

from __future__ import annotations

import inspect
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import NamedTuple

import numpy as np

from .. import _checks, _device, config
from .._grad_mode import _STATE
from ..sparse import SparseRows
from ._outputs import OutputBuffer
from ._records import _CALLS, _MAX_GONE, _paired, _reachable, _Record, _recorded
from .parameter import Parameter


def max_pending() -> int:
    """Unconsumed forward records a module keeps per channel (config's ``max_pending_records``)."""
    return config.get("max_pending_records")


def _is_dtype_name(text: str) -> bool:
    """Whether NumPy reads ``text`` as a dtype, or it names a 16-bit table dtype
    (``"bfloat16"``, ``"half"``): ``to()`` takes it for one."""
    try:
        np.dtype(text)
    except TypeError:
        if text.strip() == "float":
            return True
        try:
            return _checks.is_half_dtype(_checks.check_table_dtype(text))
        except TypeError:
            return False
    return True


_WARNED_UNREGISTERED: set = set()

# Each assignment or deletion of a Module attribute (a child, a parameter, a setting such as
# an Embedding's max_norm) replaces this token: what a module derives from such attributes
# holds while the token it was made under is the current one (Module._derived).
_EDITS = [object()]


def _holds_state(value) -> bool:
    items = value.values() if isinstance(value, dict) else value
    return any(isinstance(item, (Module, Parameter)) for item in items)


def _warn_unregistered(module, name: str, value) -> None:
    """Warn (once per module class and attribute) that a plain list, tuple or dict of
    modules or parameters is not registered: PyTorch drops those silently."""
    key = (type(module), name)
    if key in _WARNED_UNREGISTERED or not _holds_state(value):
        return
    _WARNED_UNREGISTERED.add(key)
    kind = type(value).__name__
    container = "nn.ModuleDict" if isinstance(value, dict) else "nn.ModuleList"
    warnings.warn(
        f"{type(module).__name__}.{name}: a {kind} of modules or parameters is a plain "
        "attribute, not registered: what it holds is left out of parameters(), "
        "state_dict(), to(), train() / eval() and zero_grad() (PyTorch ignores it silently "
        f"too). Hold modules in {container} (or nn.Sequential), and assign each Parameter "
        "to an attribute of its own",
        UserWarning, stacklevel=3)


class IncompatibleKeys(NamedTuple):
    """What :meth:`Module.load_state_dict` did not match (non-strict loads)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """Base class of numbapos layers: reverse-mode pairing of forwards and backwards.

    A module owns :class:`Parameter` objects, buffers (:meth:`register_buffer`)
    and child modules, registered by plain attribute assignment. Layers follow
    a forward/backward contract with no autograd::

        y = module(x)              # forward; records what backward needs
        gx = module.backward(gy)   # accumulates parameter grads, returns grad wrt x

    Every forward records its own context (index arrays and any input its
    backward reads are copied), in training and in eval mode alike, and every
    :meth:`backward` consumes the most recent unconsumed record, last in first
    out as reverse mode runs:
    ``ya = m(a); yb = m(b); m.backward(gb); m.backward(ga)`` accumulates both
    gradients, as a shared or tied layer needs. ``m.backward(g, output=y)``
    consumes the record of the forward that returned ``y`` instead, wherever
    it is (or, for a container or a module whose forward calls others, the
    latest record of this module within the call that returned ``y``).

    A record is tied to its forward's output, as PyTorch's graph is to the
    tensors computed from it: the array returned (or a NumPy view of it), the
    output of a later numbapos forward that took it as input, or the output
    of the module call it ran inside (a container's, a model subclass's)
    hold it. A record whose output is gone stays consumable (an intermediate
    result, ``x = m(ids) * s``, need not be kept) until it is a leftover: a
    forward whose output was gone when the module ran another forward on the
    same channel whose output is still held. No backward can be meant for a
    leftover (PyTorch would have freed its graph: an evaluation call whose
    output was dropped, under a training forward whose gradient was already
    taken), so the backward that reaches one discards it and pairs with the
    record below, or raises ``RuntimeError`` naming the leftover's call when
    none is left. Code that calls one module several times before the
    backwards keeps each output it will backward through (or none of them),
    or calls the module inside a module whose output it keeps.

    A backward with nothing recorded raises ``RuntimeError``, naming the
    leftover or dropped record it would have consumed, if any; a gradient of
    another shape than that forward's output raises ``ValueError`` and keeps
    the record. Parameters the backward reads
    (a LayerNorm's weight, a block's tables) must not change in between: a
    change made through :meth:`load_state_dict`, ``max_norm`` clipping,
    ``to(dtype)``, replacing ``.data`` or anything that calls
    :meth:`Parameter.bump_version` raises ``RuntimeError`` at the backward.
    Inside :class:`numbapos.no_grad` a forward records nothing.

    As in PyTorch, :meth:`train` / :meth:`eval` switch dropout and nothing
    else: a backward in eval mode is the gradient of the eval-mode forward
    (dropout off). A module keeps at most ``max_pending_records`` (64,
    :mod:`numbapos.config`) unconsumed records per channel and drops the
    oldest beyond that, so a loop of forwards that never runs a backward
    (inference without ``no_grad``) holds a bounded amount of memory; a
    backward that would need a dropped record raises ``RuntimeError``.

    Subclasses implement :meth:`forward` and :meth:`backward`, using
    :meth:`_recording`, :meth:`_save_for_backward`, :meth:`_saved_context` and
    :meth:`_release` (one mechanism for every layer). A subclass's
    ``forward`` and ``backward`` are wrapped when the class is defined (the
    call ties records to its outputs; the backward takes ``output=``), and
    so is any public method ``name`` with a ``name_backward`` twin, whose
    records go to channel ``"name"`` (:meth:`Embedding.attend` and
    ``attend_backward``).
    """

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name, value in list(vars(cls).items()):
            if (not inspect.isfunction(value) or getattr(value, "_numbapos_wrapped", False)
                    or name.startswith("_")):
                continue
            if name == "backward" or name.endswith("_backward"):
                if "output" not in inspect.signature(value).parameters:
                    setattr(cls, name, _paired(value))
            elif name == "forward" or callable(getattr(cls, f"{name}_backward", None)):
                setattr(cls, name, _recorded(value))

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_non_persistent", set())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_saved", {})      # channel -> [_Record], oldest first
        object.__setattr__(self, "_gone", {})       # channel -> notes on records let go
        object.__setattr__(self, "_current", {})    # channel -> the record a backward reads
        object.__setattr__(self, "_numbered", {})   # channel -> records pushed so far
        object.__setattr__(self, "_consumed", {})   # channel -> the latest consumed records
        object.__setattr__(self, "_warned_pending", False)
        object.__setattr__(self, "_outputs", OutputBuffer())
        object.__setattr__(self, "_copies", OutputBuffer())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"{type(self).__name__}.__init__ must call super().__init__() before "
                f"assigning attributes (got {name!r})"
            )
        _EDITS[0] = object()
        if name in self._buffers and not isinstance(getattr(type(self), name, None), property):
            self._buffers[name] = None if value is None else _checks.as_array(value, name)
            object.__setattr__(self, name, self._buffers[name])
            return
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        elif isinstance(value, (list, tuple, dict)):
            _warn_unregistered(self, name, value)
        object.__setattr__(self, name, value)

    def add_module(self, name: str, module: Module) -> None:
        """Register ``module`` as the child ``name`` (PyTorch's ``add_module``).

        The same as ``setattr(self, name, module)`` for names that are not
        identifiers (``"0"``, as the containers use).

        Raises
        ------
        TypeError
            ``name`` not a str, or ``module`` not a :class:`Module`.
        KeyError
            ``name`` empty, dotted, or an attribute that is not a child module.
        """
        if not isinstance(name, str):
            raise TypeError(f"add_module: name: expected a str, got {_checks.type_name(name)}")
        if not name or "." in name:
            raise KeyError(f"add_module: name: expected a non-empty name without dots, got "
                           f"{_checks.quote(name)}")
        if not isinstance(module, Module):
            raise TypeError(f"add_module: {name!r}: expected a numbapos Module, got "
                            f"{_checks.type_name(module)}")
        if name not in self._modules and hasattr(self, name):
            raise KeyError(f"add_module: attribute {name!r} already exists")
        setattr(self, name, module)

    register_module = add_module

    def __delattr__(self, name):
        _EDITS[0] = object()
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        self._buffers.pop(name, None)
        self._non_persistent.discard(name)
        object.__delattr__(self, name)

    # ------------------------------------------------------------ contract

    def forward(self, *args, **kwargs):
        """Compute the output; outside :class:`numbapos.no_grad` record what backward needs."""
        raise NotImplementedError(f"{type(self).__name__} does not implement forward")

    def backward(self, grad_output, *, output=None):
        """Consume the latest recorded forward; accumulate parameter grads, return input grad.

        Parameters
        ----------
        grad_output : array
            The gradient with respect to that forward's output.
        output : array, optional
            Pair with the forward that returned this array (wherever its
            record is) instead of the latest one; see :class:`Module`.
        """
        raise NotImplementedError(f"{type(self).__name__} does not implement backward")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ------------------------------------------------------------ forward records

    def _recording(self) -> bool:
        """Whether a forward now records for a backward: outside :class:`numbapos.no_grad`,
        in either mode (the mode is dropout's business only)."""
        return _STATE.enabled

    def _derived(self, name: str, make):
        """``make(self)``, kept under ``name`` until a Module attribute is next assigned
        anywhere: what a forward derives from its children's settings, made once."""
        kept = self.__dict__.get(name)
        if kept is None or kept[0] is not _EDITS[0]:
            kept = self.__dict__[name] = (_EDITS[0], make(self))
        return kept[1]

    def _save_for_backward(self, context, channel: str = "forward") -> None:
        """Push ``context`` (owned values only: copies, scalars) for the next backward.

        The record is tied to the outputs of the recorded call running (see
        :class:`Module`); records of the channel whose outputs are gone are
        marked with this call's number (a leftover once this call's output is
        held). Beyond ``max_pending_records`` unconsumed records the oldest is
        dropped (and noted, so that the backward that would have consumed it
        raises); in training mode that warns once, as a training forward
        whose backward never runs is usually a bug.
        """
        stack = self._saved.get(channel)
        if stack is None:
            stack = self._saved[channel] = []
        numbered = self._numbered
        number = numbered[channel] = numbered.get(channel, 0) + 1
        for record in stack:  # record.alive, inline: no call per pending record
            if record.dead_since is None:
                graph = record.graph
                if graph is not None and graph() is None:
                    record.dead_since = number
        record = _Record.__new__(_Record)  # its __init__'s fields set here: no call of its own
        record.context, record.number, record.dead_since = context, number, None
        record.training = self.__dict__.get("training")
        frames = _CALLS.frames
        if frames:
            module, graph, records, args = frames[-1]
            shapes = None
            if module is self:
                shapes = []  # a loop, not a generator: no call of its own
                for a in args:
                    shape = getattr(a, "shape", None)
                    if isinstance(shape, tuple):
                        shapes.append(shape)
                shapes = tuple(shapes)
            record.graph, record.shapes = weakref.ref(graph), shapes
            records.append(record)
            graph.pending += 1
        else:
            record.graph = record.shapes = None
        stack.append(record)
        limit = config._current  # max_pending(), inline: get() once the settings are read
        limit = (config.get("max_pending_records") if limit is None
                 else limit["max_pending_records"])
        if len(stack) > limit:
            self._note_gone(channel, stack.pop(0), "dropped")
            if self.__dict__.get("training", False) and not self._warned_pending:
                object.__setattr__(self, "_warned_pending", True)
                warnings.warn(
                    f"{type(self).__name__} holds {len(stack)} training-mode {channel} calls "
                    "that no backward has consumed and dropped the oldest (a backward that "
                    "would need it raises): call backward once per forward, or run forwards "
                    "that need no gradient under numbapos.no_grad() (the limit is "
                    "numbapos.config's max_pending_records)",
                    UserWarning, stacklevel=3)

    def _note_gone(self, channel: str, record: _Record, why: str) -> None:
        record.let_go()
        record.context = None  # only its description is needed now (made when read)
        notes = self._gone.setdefault(channel, [])
        notes.append((record, why))
        if len(notes) > _MAX_GONE:
            del notes[0]

    def _newest_held(self, channel: str):
        """The latest call of ``channel`` (pending or consumed) whose output is still held."""
        calls = [*self._saved.get(channel, ()), *self._consumed.get(channel, ())]
        return max((r for r in calls if r.held), key=lambda r: r.number, default=None)

    @staticmethod
    def _leftover(record: _Record, newest) -> bool:
        """Whether ``record``'s output was gone when a call ran whose output is still held
        (``newest``, from :meth:`_newest_held`)."""
        return (newest is not None and record.dead_since is not None
                and record.dead_since <= newest.number and not record.alive)

    def _saved_context(self, channel: str = "forward", call: str = "backward"):
        """The record this backward consumes (not removed); RuntimeError if there is none.

        The latest unconsumed record that is not a leftover (leftovers on top
        are discarded), or within ``backward(..., output=y)`` the latest one
        of the call that returned ``y``.
        """
        name = type(self).__name__
        stack = self._saved.get(channel) or []
        scopes = _CALLS.scopes
        if not scopes and stack:
            record = stack[-1]
            graph = record.graph
            # The usual case: the latest record, not a leftover (its output is held, or it
            # has no graph, or no later call found its output gone).
            if graph is None or record.dead_since is None or graph() is not None:
                self._current[channel] = record
                return record.context
        if scopes:
            scope = scopes[-1]
            within = _reachable(scope)
            record = next((r for r in reversed(stack)
                           if r.graph is not None and r.graph() in within), None)
            if record is None:
                raise RuntimeError(
                    f"{name}.{call}: output: no pending {channel} of this {name} returned "
                    f"that array or went into it: its record was consumed by an earlier "
                    f"{call} (PyTorch also refuses a second backward through the same "
                    f"graph) or dropped (max_pending_records), or the array comes from "
                    f"another module's {channel}")
            self._current[channel] = record
            return record.context
        newest, leftovers = None, []
        # stack[-1].alive, inline (no call): its graph is gone
        while stack and stack[-1].graph is not None and stack[-1].graph() is None \
                and stack[-1].dead_since is not None:
            newest = newest or self._newest_held(channel)
            if not self._leftover(stack[-1], newest):
                break
            leftovers.append(stack.pop())
        for leftover in reversed(leftovers):  # the top one is named first
            self._note_gone(channel, leftover,
                            f"a leftover: its output was gone when {channel} call "
                            f"#{leftover.dead_since} ran, and the output of "
                            f"{newest.describe(channel)} was still held")
        if stack:
            record = stack[-1]
            self._current[channel] = record
            return record.context
        notes = self._gone.get(channel)
        if not notes:
            raise RuntimeError(
                f"{name}.{call} called before {channel}, or more often than "
                f"{channel} was recorded: each {call} consumes one recorded {channel} "
                f"(last in, first out), and a {channel} under numbapos.no_grad() records "
                "nothing"
            )
        record, why = notes.pop()
        what = record.describe(channel)
        if why == "dropped":
            raise RuntimeError(
                f"{name}.{call}: the {channel} this {call} belongs to, {what}, was "
                f"dropped: a module keeps at most {max_pending()} unconsumed {channel} "
                f"records (numbapos.config's max_pending_records, "
                f"NUMBAPOS_MAX_PENDING_RECORDS) and drops the oldest. Run each {call} "
                f"sooner, raise the limit, or run forwards that need no gradient under "
                "numbapos.no_grad()")
        raise RuntimeError(
            f"{name}.{call}: no recorded {channel} is left for this {call}. The one it "
            f"would have consumed, {what}, is {why}: a {channel} whose output nobody "
            f"holds gets no gradient (as in PyTorch), so it was discarded. If this {call} "
            f"is for it, keep its output until the {call} (or a view of it, or the output "
            f"of a numbapos forward computed from it, or call the module inside a Module "
            f"whose output you keep) or pass output=; otherwise this is one {call} too "
            f"many, or its {channel} ran under numbapos.no_grad()")

    def _release(self, channel: str = "forward") -> None:
        """Consume the record :meth:`_saved_context` gave (after the gradient was validated)."""
        stack = self._saved[channel]
        record = self._current.pop(channel, None)
        at = len(stack) - 1
        if stack and stack[at] is not record:  # not the latest (backward(..., output=y))
            at = next((i for i in range(len(stack) - 1, -1, -1) if stack[i] is record), at)
        record = stack.pop(at)
        graph = None if record.graph is None else record.graph()  # record.let_go(), inline
        if graph is not None:
            graph.pending -= 1
        record.context = None
        consumed = self._consumed.setdefault(channel, [])
        consumed.append(record)
        del consumed[:-_MAX_GONE]

    def pending_backwards(self, channel: str = "forward") -> int:
        """How many recorded forwards of this module a backward can still consume.

        Leftovers (records whose output was gone when a later forward ran
        whose output is still held) are not counted.

        Parameters
        ----------
        channel : str, default "forward"
            ``"attend"`` counts :meth:`Embedding.attend` calls.

        Returns
        -------
        int
        """
        newest = self._newest_held(channel)
        return sum(not self._leftover(r, newest) for r in self._saved.get(channel, ()))

    @staticmethod
    def _watch(named_params) -> tuple:
        """Snapshot ``(name, param, data, version)`` of parameters a backward will read."""
        return tuple((name, p, p.data, p._version) for name, p in named_params if p is not None)

    def _check_unchanged(self, watched, call: str = "backward") -> None:
        """RuntimeError if a watched parameter changed since its forward."""
        for name, param, data, version in watched:
            if param.data is not data or param._version != version:
                raise RuntimeError(
                    f"{type(self).__name__}.{call}: parameter {name!r} was modified after the "
                    f"forward this {call} belongs to (load_state_dict, max_norm clipping, a "
                    "new .data or another bump_version() call); its gradient would be "
                    f"computed from the new values. Run the {call} before changing parameters"
                )

    # ------------------------------------------------------------ traversal

    def named_children(self) -> Iterator[tuple[str, Module]]:
        """The direct child modules with their attribute names."""
        yield from self._modules.items()

    def children(self) -> Iterator[Module]:
        """The direct child modules."""
        for _, module in self.named_children():
            yield module

    def named_modules(self, prefix: str = "", memo=None) -> Iterator[tuple[str, Module]]:
        """This module and every descendant, each once, with dotted names."""
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name, memo)

    def modules(self) -> Iterator[Module]:
        """This module and every descendant, each once."""
        for _, module in self.named_modules():
            yield module

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """Every parameter with its dotted name (``"LayerNorm.weight"``), each once."""
        seen = set()
        for module_name, module in self.named_modules(prefix):
            for name, param in module._parameters.items():
                if param is None or id(param) in seen:
                    continue
                seen.add(id(param))
                yield (f"{module_name}.{name}" if module_name else name), param

    def parameters(self) -> Iterator[Parameter]:
        """Every parameter, each once."""
        for _, param in self.named_parameters():
            yield param

    def _parameter_list(self) -> list | None:
        """:meth:`parameters` as a list, walked without generators (each resumption of one is a
        Python call): the same parameters in the same order; None where a module of the tree
        overrides the traversal (then use :meth:`parameters`)."""
        found, seen, done, todo = [], set(), set(), [self]
        while todo:
            module = todo.pop()
            if id(module) in done:
                continue
            kind = type(module)
            if (kind.named_modules is not Module.named_modules
                    or module is self and (kind.parameters is not Module.parameters
                                           or kind.named_parameters
                                           is not Module.named_parameters)):
                return None
            done.add(id(module))
            for param in module._parameters.values():
                if param is not None and id(param) not in seen:
                    seen.add(id(param))
                    found.append(param)
            todo.extend(reversed(module._modules.values()))
        return found

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, object]]:
        """Every buffer (non-persistent ones included) with its dotted name."""
        for module_name, module in self.named_modules(prefix):
            for name, buf in module._buffers.items():
                if buf is not None:
                    yield (f"{module_name}.{name}" if module_name else name), buf

    def buffers(self) -> Iterator[object]:
        """Every buffer array."""
        for _, buf in self.named_buffers():
            yield buf

    def apply(self, fn) -> Module:
        """Call ``fn(module)`` on every child (recursively), then on self; returns self."""
        for child in self.children():
            child.apply(fn)
        fn(self)
        return self

    def register_buffer(self, name: str, tensor, persistent: bool = True) -> None:
        """Register an array that is state but not a parameter (PyTorch's ``register_buffer``).

        Buffers are in :meth:`state_dict` (when ``persistent``), restored by
        :meth:`load_state_dict`, moved by :meth:`to` (0-d buffers, scalars that
        kernels take as arguments such as :class:`Dropout`'s seed and counter,
        stay on the host) and cast by ``to(dtype)`` when they are float.
        Assigning the attribute later replaces the array.

        Parameters
        ----------
        name : str
            Attribute name, without dots.
        tensor : array_like or None
            Any array NumPy can view, or a CUDA array; None reserves the name.
        persistent : bool, default True
            Whether :meth:`state_dict` includes it.

        Raises
        ------
        TypeError
            ``name`` not a str, or ``tensor`` not an array.
        KeyError
            ``name`` empty, dotted, or already an attribute of another kind.
        """
        if not isinstance(name, str):
            raise TypeError(f"register_buffer: name: expected a str, got "
                            f"{_checks.type_name(name)}")
        if not name or "." in name:
            raise KeyError(f"register_buffer: name: expected a non-empty name without dots, "
                           f"got {_checks.quote(name)}")
        if name not in self._buffers and (name in self.__dict__ or name in self._parameters):
            raise KeyError(f"register_buffer: attribute {name!r} already exists")
        value = None if tensor is None else _checks.as_array(tensor, name)
        _EDITS[0] = object()
        self._buffers[name] = value
        if persistent:
            self._non_persistent.discard(name)
        else:
            self._non_persistent.add(name)
        if not isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)

    # ------------------------------------------------------------ state

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset every parameter's gradient.

        Parameters
        ----------
        set_to_none : bool, default True
            True drops the gradients (``grad = None``, as PyTorch's default).
            False zeroes dense gradients in place (arrays others hold see the
            zeros) and empties row-sparse ones.
        """
        # The tree's parameters change only where a Module attribute is assigned.
        params = self._derived("_parameters_walked", Module._parameter_list)
        for param in self.parameters() if params is None else params:
            grad = param.grad
            if set_to_none or grad is None:
                param.grad = None
            elif isinstance(grad, SparseRows):
                values = _device.empty((0, grad.shape[1]), grad.dtype, grad.device)
                param.grad = SparseRows(_device.to_device(np.zeros(0, np.int64), grad.device),
                                        values, grad.shape[0])
            elif isinstance(grad, np.ndarray):
                grad[...] = 0
            else:
                grad.copy_to_device(np.zeros(grad.shape, grad.dtype))

    def requires_grad_(self, requires_grad: bool = True) -> Module:
        """Set ``requires_grad`` on every parameter (False freezes the module); returns self."""
        for param in self.parameters():
            param.requires_grad = bool(requires_grad)
        return self

    @property
    def device(self) -> str:
        """Where the module computes, ``"cpu"`` or ``"cuda"``: its parameters' device (see
        :meth:`to`); for a module without parameters, the device it was given."""
        for param in self.parameters():
            return param.device
        return self.__dict__.get("_device", "cpu")

    def _place(self, device) -> None:
        """End of a constructor: move to ``device`` unless it is None (stay where built)."""
        if device is not None:
            self.to(device=device)

    def to(self, *args, device=None, dtype=None) -> Module:
        """Move and/or cast this module in place, as PyTorch's ``Module.to``; returns self.

        ``to("cuda")``, ``to(torch.float64)``, ``to("cpu", np.float64)`` and the
        keyword forms work as in PyTorch; a positional argument is a device
        when it is spelt as one (``"cpu"``, ``"cuda"``, ``"cuda:N"``, a
        ``torch.device``) and a dtype otherwise (float32 / float64 as a NumPy
        dtype, its name, or a ``torch`` dtype). Parameters, their gradients and
        float buffers are converted (integer buffers keep their dtype, 0-d
        buffers stay on the host). Recorded forwards and cached tables are
        dropped, so call it between steps, not between a forward and its
        backward. Everything is checked before anything changes.

        bfloat16 / float16 (``"bfloat16"``, ``"float16"``, ``"half"``, the
        ``ml_dtypes`` / NumPy / ``torch`` dtypes) convert only the tables of
        :class:`~numbapos.nn.Embedding` layers, rounded to nearest even:
        unlike PyTorch, every other parameter and buffer (LayerNorm's, say)
        stays as it is, since numbapos computes everything else in float32 or
        float64. Their gradients become float32, and an optimiser made before
        keeps working (its state of a 16-bit table is float32, as it was).
        The BERT / GPT-2 embedding blocks convert their tables (their fused
        kernels widen 16-bit rows to float32); a block whose fused kernels
        compute in float32 beside 16-bit tables (BERT's, with its LayerNorm)
        is refused while its other parameters are not float32 (call
        :meth:`float` first).

        Parameters
        ----------
        *args : device and/or dtype, at most one of each
        device : str or torch.device, optional
            ``"cpu"``, ``"cuda"`` or ``"cuda:N"`` (N the current CUDA device).
        dtype : float32, float64, bfloat16 or float16, optional

        Raises
        ------
        TypeError, ValueError
            A bad device (the message names ``device``), a dtype other than
            these four (names ``dtype``), an argument that is neither, or more
            than one of each; a 16-bit dtype for a float64 BERT block.
        RuntimeError
            CUDA where it cannot be used.
        """
        if len(args) > 2:
            raise TypeError(f"to: expected at most a device and a dtype, got {len(args)} "
                            "arguments")
        for arg in args:
            if _device.is_device_spelling(arg):
                if device is not None:
                    raise TypeError(f"to: got two devices, {device!r} and {arg!r}")
                device = arg
            else:
                if isinstance(arg, str) and not _is_dtype_name(arg):
                    raise ValueError(
                        f"to: expected a device ('cpu', 'cuda', 'cuda:N', a torch.device) or a "
                        f"dtype (float32, float64, bfloat16, float16), got "
                        f"{_checks.quote(arg)}")
                if dtype is not None:
                    raise TypeError(f"to: got two dtypes, {dtype!r} and {arg!r}")
                dtype = arg
        device = None if device is None else _device.check_device(device, "device")
        _EDITS[0] = object()  # buffers, dtype and device set below
        tables = None
        if dtype is not None:
            dtype = _checks.check_table_dtype(dtype, "dtype")
            if _checks.is_half_dtype(dtype):
                tables = self._half_tables(dtype)
        for param in self.parameters():
            if dtype is not None and tables is None:
                param._cast(dtype)
            if device is not None:
                param.to(device)
        for param in tables or ():
            param._cast(dtype)
        for _, module in self.named_modules():
            for name, buf in module._buffers.items():
                if buf is None:
                    continue
                if dtype is not None and tables is None and buf.dtype in _checks.FLOAT_DTYPES:
                    where = _device.device_of(buf)
                    buf = _device.to_device(_device.to_host(buf).astype(dtype), where)
                if device is not None and buf.ndim > 0:
                    buf = _device.to_device(buf, device)
                module._buffers[name] = buf
                if name in module.__dict__:
                    object.__setattr__(module, name, buf)
            if dtype is not None and tables is None and "dtype" in module.__dict__:
                object.__setattr__(module, "dtype", dtype)
            if device is not None:
                object.__setattr__(module, "_device", device)
            module._on_device_change()
        return self

    def cpu(self) -> Module:
        """Move every parameter and buffer to the host: ``to("cpu")``; returns self."""
        return self.to(device="cpu")

    def cuda(self, device=None) -> Module:
        """Move every parameter and buffer to the GPU: ``to("cuda")``; returns self.

        Parameters
        ----------
        device : int, str or torch.device, optional
            As PyTorch's: a device number (must be the current CUDA device) or
            a CUDA device spelling; default the current device.
        """
        if device is None:
            device = "cuda"
        elif isinstance(device, int) and not isinstance(device, bool):
            device = f"cuda:{device}"
        if _device.check_device(device, "device") != "cuda":
            raise ValueError(f"device: cuda() expects a CUDA device, got {device!r}")
        return self.to(device="cuda")

    def float(self) -> Module:
        """Cast float parameters and buffers to float32: ``to(np.float32)``; returns self."""
        return self.to(dtype=np.float32)

    def double(self) -> Module:
        """Cast float parameters and buffers to float64: ``to(np.float64)``; returns self."""
        return self.to(dtype=np.float64)

    def half(self) -> Module:
        """Cast the tables of Embedding layers to float16: ``to("float16")``; returns self."""
        return self.to(dtype=_checks.FLOAT16)

    def bfloat16(self) -> Module:
        """Cast the tables of Embedding layers to bfloat16: ``to("bfloat16")``; returns self."""
        return self.to(dtype=_checks.bfloat16_dtype())

    # Which parameter of a layer may hold a bfloat16 / float16 table (Embedding's
    # "weight"), and whether a block reads its children's tables in fused kernels
    # that compute in float32 beside 16-bit tables: then to(16-bit dtype) refuses it
    # while its other parameters (BERT's LayerNorm) are not float32.
    _half_table: str | None = None
    _fused_tables = False

    def _half_tables(self, dtype) -> list:
        """The parameters ``to(dtype)`` makes 16-bit (checked, nothing changed)."""
        tables = []
        for _, module in self.named_modules():
            if type(module)._half_table is not None:
                tables.append(getattr(module, type(module)._half_table))
        kept = {id(table) for table in tables}
        for name, module in self.named_modules():
            if not type(module)._fused_tables:
                continue
            other = next(((n, p) for n, p in module.named_parameters()
                          if id(p) not in kept and p.dtype != np.float32), None)
            if other is not None:
                raise TypeError(f"dtype: {type(module).__name__} "
                                f"{'(' + name + ') ' if name else ''}computes in float32 "
                                f"beside {dtype} tables, but its {other[0]} is {other[1].dtype}: "
                                f"call .float() first")
        return tables

    def _on_device_change(self) -> None:
        """Drop recorded forwards; subclasses with device-dependent caches extend this."""
        for stack in self._saved.values():
            for record in stack:
                record.let_go()
        self._saved.clear()
        self._gone.clear()
        self._current.clear()
        self._consumed.clear()
        self._outputs.clear()
        self._copies.clear()

    def _copy_for_backward(self, x):
        """A private copy of the input ``x`` for a record, in a reused buffer when large.

        The buffer is the copy an earlier record held, once its backward has
        consumed it (see :mod:`numbapos.nn._outputs`): no fresh pages per step.
        """
        if type(x) is np.ndarray:
            kept = self._copies.take(x.shape, x.dtype)
            if kept is not None:
                np.copyto(kept, x)
                return kept
        return _device.copy(x)

    def _output_buffer(self, source, shape, dtype):
        """Where this forward may write its output: a reused array, or None to allocate.

        Only for NumPy ``source`` (the input whose shape fixes the output's)
        and large outputs; the array is this module's previous output when no
        one else holds it any more (see :mod:`numbapos.nn._outputs`).
        """
        if type(source) is not np.ndarray:
            return None
        return self._outputs.take(shape, dtype)

    def train(self, mode: bool = True) -> Module:
        """Set training mode on this module and its children; returns self.

        As in PyTorch the mode changes only what depends on it, here dropout
        (:class:`Dropout` and the blocks' dropout children); forwards record
        for a backward in either mode (:class:`numbapos.no_grad` turns that off).
        """
        for _, module in self.named_modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self) -> Module:
        """Evaluation mode: dropout off; same as ``train(False)``.

        Forwards still record for a backward (the gradient of the eval-mode
        output); use :class:`numbapos.no_grad` for inference loops, or rely on
        the bound on unconsumed records (see :class:`Module`).
        """
        return self.train(False)

    def _state_items(self):
        """(dotted name, Parameter or buffer array) of the state dict, in its order."""
        seen = set()
        for module_name, module in self.named_modules():
            dot = f"{module_name}." if module_name else ""
            for name, param in module._parameters.items():
                if param is not None and id(param) not in seen:
                    seen.add(id(param))
                    yield dot + name, param
            for name, buf in module._buffers.items():
                if buf is not None and name not in module._non_persistent:
                    yield dot + name, buf

    def state_dict(self, prefix: str = "", keep_vars: bool = False) -> OrderedDict:
        """Parameters and persistent buffers by dotted name, as NumPy arrays.

        On the CPU, as in PyTorch, the arrays are the module's own (no copy):
        copy them if you need a snapshot that later training does not change.
        Arrays on the GPU are copied to the host.

        Parameters
        ----------
        prefix : str, default ""
            Prepended to every name (``"encoder."``).
        keep_vars : bool, default False
            Give the :class:`Parameter` objects themselves (and buffers as
            stored, on their device) instead of host arrays.

        Returns
        -------
        OrderedDict
            Each module's parameters, then its buffers, then its children's.
        """
        if not isinstance(prefix, str):
            raise TypeError(f"prefix: expected a str, got {_checks.type_name(prefix)}")
        out = OrderedDict()
        for name, value in self._state_items():
            if keep_vars:
                out[prefix + name] = value
            else:
                out[prefix + name] = _device.to_host(value.data if isinstance(value, Parameter)
                                                     else value)
        return out

    def load_state_dict(self, state, strict: bool = True) -> IncompatibleKeys:
        """Copy arrays from ``state`` into the parameters and buffers, in place.

        As PyTorch's ``copy_``, each value is cast to the dtype of the
        parameter or buffer it goes into (a float64 array loads into a float32
        module as float32; a float32 one into a bfloat16 / float16 table
        rounded to nearest even; a bfloat16 one, from
        ``io.load_state(path, keep_dtype=True)``, into a bfloat16 table bit
        for bit). Every array is checked before any is copied, so a
        failed load changes nothing.

        Parameters
        ----------
        state : mapping of str to array_like
            As returned by :meth:`state_dict`: host arrays, PyTorch CPU tensors
            (detached) or any array NumPy can view, or CUDA arrays; copied to
            wherever each parameter lives.
        strict : bool, default True
            Require exactly this module's names: missing or unexpected names
            raise ``RuntimeError`` (PyTorch's message), before anything is
            copied. When False both are only reported. Either way the state
            of a dropout stream (:class:`Dropout`'s ``seed`` and ``counter``
            buffers) may be left out: the module then keeps its current
            stream (as PyTorch's BatchNorm accepts a state without
            ``num_batches_tracked``), and the names are not reported.

        Returns
        -------
        IncompatibleKeys
            ``(missing_keys, unexpected_keys)``.

        Raises
        ------
        RuntimeError
            Missing or unexpected names (strict only), listed as PyTorch does
            (``Error(s) in loading state_dict for Embedding: ...``), with the
            missing parameters and buffers named as such.
        ValueError
            An array whose shape differs.
        TypeError
            ``state`` not a mapping, a value that is not an array, or of a
            dtype that cannot be cast to a real number (complex, object, str).
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"load_state_dict: expected a mapping of names to arrays, got "
                            f"{_checks.type_name(state)}")
        own = OrderedDict(self._state_items())
        optional = set(self._optional_state_names())
        missing = [name for name in own if name not in state and name not in optional]
        unexpected = [name for name in state if name not in own]
        if strict and (missing or unexpected):
            raise RuntimeError(self._load_error(own, missing, unexpected))
        updates = []
        for name, target in own.items():
            if name not in state:
                continue
            value = state[name]
            if isinstance(value, Parameter):
                value = value.data
            value = _checks.as_array(value, f"state[{name!r}]")
            data = target.data if isinstance(target, Parameter) else target
            if tuple(value.shape) != tuple(data.shape):
                raise ValueError(
                    f"load_state_dict: {name!r} has shape {tuple(value.shape)}, "
                    f"expected {tuple(data.shape)}"
                )
            if value.dtype.kind not in "biuf" and not _checks.is_half_dtype(value.dtype):
                raise TypeError(
                    f"load_state_dict: {name!r} has dtype {value.dtype}, which cannot be cast "
                    f"to the {data.dtype} of the module"
                )
            updates.append((target, data, value))
        for target, data, value in updates:
            host = _device.to_host(value)
            if _device.device_of(data) == "cpu":
                np.copyto(data, host, casting="unsafe")
            else:
                _device.copy_from_host_(data, host)
            if isinstance(target, Parameter):
                target.bump_version()
        return IncompatibleKeys(missing, unexpected)

    def _optional_state_names(self):
        """Dotted names :meth:`load_state_dict` accepts to be missing (each module's
        :attr:`_optional_state`, such as a dropout stream's seed and counter)."""
        for module_name, module in self.named_modules():
            dot = f"{module_name}." if module_name else ""
            for name in type(module)._optional_state:
                yield dot + name

    _optional_state: tuple[str, ...] = ()

    def _load_error(self, own, missing, unexpected) -> str:
        """PyTorch's message for a strict load that does not match, and what each missing
        name is."""
        def names(keys):
            return ", ".join(f'"{k}"' for k in keys)

        lines = []
        if missing:
            lines.append(f"Missing key(s) in state_dict: {names(missing)}. ")
        if unexpected:
            lines.append(f"Unexpected key(s) in state_dict: {names(unexpected)}. ")
        if missing:
            params = [k for k in missing if isinstance(own[k], Parameter)]
            buffers = [k for k in missing if not isinstance(own[k], Parameter)]
            kinds = [f"{label}: {names(keys)}" for label, keys in
                     (("parameter(s)", params), ("buffer(s)", buffers)) if keys]
            lines.append("Missing " + "; ".join(kinds) + ".")
        lines.append("Nothing was loaded; load_state_dict(state, strict=False) loads the keys "
                     "that match and returns the others as (missing_keys, unexpected_keys).")
        return (f"Error(s) in loading state_dict for {type(self).__name__}:\n\t"
                + "\n\t".join(lines))

    # ------------------------------------------------------------ display

    def extra_repr(self) -> str:
        """The module's own settings, shown by ``repr`` (override in subclasses)."""
        return ""

    def __repr__(self) -> str:
        extra = self.extra_repr()
        extra_lines = extra.split("\n") if extra else []
        child_lines = [f"({name}): {child!r}".replace("\n", "\n  ")
                       for name, child in self._modules.items()]
        lines = extra_lines + child_lines
        text = f"{type(self).__name__}("
        if len(extra_lines) == 1 and not child_lines:
            text += extra_lines[0]
        elif lines:
            text += "\n  " + "\n  ".join(lines) + "\n"
        return text + ")"
