"""What ties a module's forward record to its call: outputs, graphs, leftovers.

The machinery behind :class:`~numbapos.nn.Module`'s records (see its docstring
and the module contract in the ``from_pytorch`` guide): a recorded call's
outputs keep its graph alive, a backward may name the forward it means
(``output=``), and a record whose outputs are gone below a later call whose
output is held is a leftover, never consumed.
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref

import numpy as np

from .. import _checks, _device
from .._grad_mode import _STATE

# ---------------------------------------------------------------- what ties a record to its call
#
# A recorded call (a forward, or a method with a ``<name>_backward`` twin such as
# ``attend``) gets a _Graph. Its outputs keep it alive through _OUTPUTS (a weak
# reference to each returned array, a strong one to the graph); so do the graph of
# the call it ran inside (a container's, a model's) and the graphs of later recorded
# calls that took one of its outputs as input. A record holds its graph weakly: once
# nothing holds the graph, its output is gone (PyTorch would have freed such a graph),
# and a later call of the channel whose output is held makes it a leftover
# (Module._leftover).


class _Graph:
    """The liveness of one recorded call (see above): ``held``, the graphs it keeps alive;
    ``pending``, how many of its records modules still hold."""

    __slots__ = ("held", "pending", "__weakref__")

    # No __init__: a recorded call makes its graph and sets both (see _recorded), with no
    # Python call of its own.


def _leads_to_records(graph, memo: dict) -> bool:
    """Whether a pending record is reachable from ``graph``; drops the graphs that lead to
    none from the ``held`` lists on the way (so that ``h = layer(h)`` in a loop keeps a
    bounded chain). Graphs form a DAG: a call holds only graphs of calls that returned
    before it."""
    todo = [(graph, False)]
    while todo:
        node, done = todo.pop()
        if done:
            node.held[:] = [held for held in node.held if memo[held]]
            memo[node] = node.pending > 0 or bool(node.held)
        elif node not in memo:
            memo[node] = None
            todo.append((node, True))
            todo.extend((held, False) for held in node.held if held not in memo)
    return memo[graph]


class _OutputRef(weakref.ref):
    __slots__ = ("key",)


# id(array) -> (weak reference to the array, the graph of the call that returned it)
_OUTPUTS: dict = {}


def _forget_output(ref) -> None:
    entry = _OUTPUTS.get(ref.key)
    if entry is not None and entry[0] is ref:
        del _OUTPUTS[ref.key]


def _graph_of(value):
    """The graph of the recorded call that returned ``value`` (or the NumPy array it views)."""
    while value is not None:
        entry = _OUTPUTS.get(id(value))
        if entry is not None and entry[0]() is value:
            return entry[1]
        value = value.base if isinstance(value, np.ndarray) else None
    return None


def _register_outputs(result, graph) -> bool:
    """Tie the arrays of ``result`` (an array, or a tuple, list or dict of them) to ``graph``;
    whether there was one."""
    if type(result) is np.ndarray:
        items = (result,)
    else:
        items = result.values() if isinstance(result, dict) else (
            result if isinstance(result, (tuple, list)) else (result,))
    tied = False
    for item in items:
        if not isinstance(getattr(item, "shape", None), tuple):
            continue
        try:
            ref = _OutputRef(item, _forget_output)
        except TypeError:  # not weakly referenceable: cannot say when it is gone
            continue
        ref.key = id(item)
        _OUTPUTS[ref.key] = (ref, graph)
        tied = True
    if tied and type(items) is tuple and items[0] is result \
            and _device._is_numba_device_array(result):
        _ARRAYS.add(type(result))
    return tied


# Types whose instances are arrays (a tuple shape, weakly referenceable): a recorded call
# returning one ties it itself (_register_outputs's usual case, inline). Numba's device
# array types are added as they are met (not imported here).
_ARRAYS = {np.ndarray}


class _Calls(threading.local):
    def __init__(self):
        # The recorded calls running on this thread, innermost last, each a frame
        # (module, graph, the records pushed inside it, its positional args).
        self.frames: list[tuple] = []
        self.scopes: list[_Graph] = []   # graphs named by backward(..., output=y), innermost last


_CALLS = _Calls()


def _hold_inputs(graph, values) -> None:
    """Make ``graph`` hold the graphs of the recorded calls whose outputs ``values`` are."""
    memo = None
    for value in values:
        if id(value) not in _OUTPUTS and (not isinstance(value, np.ndarray)
                                          or value.base is None):
            continue  # the usual input: nobody's output, no NumPy view (see _graph_of)
        upstream = _graph_of(value)
        if upstream is not None:
            memo = {} if memo is None else memo
            if upstream not in memo and _leads_to_records(upstream, memo):
                graph.held.append(upstream)


def _recorded(method):
    """Wrap a subclass's ``forward`` (or ``attend``-like method) as a recorded call: records
    pushed inside it are tied to its outputs."""
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if not _STATE.enabled:
            return method(self, *args, **kwargs)
        graph = _Graph()
        graph.held = []
        graph.pending = 0
        for value in args:  # _hold_inputs, only when an input is an output or a NumPy view
            if id(value) in _OUTPUTS or (isinstance(value, np.ndarray)
                                         and value.base is not None):
                _hold_inputs(graph, args)
                break
        if kwargs:
            _hold_inputs(graph, [v for k, v in kwargs.items() if k != "out" and k[:4] != "out_"])
        records = []
        frames = _CALLS.frames
        frames.append((self, graph, records, args))
        try:
            result = method(self, *args, **kwargs)
        finally:
            frames.pop()
        if records or graph.held:
            if frames:
                _, outer, outer_records, _ = frames[-1]
                outer.held.append(graph)
                outer_records.extend(records)
            if type(result) in _ARRAYS:
                ref = _OutputRef(result, _forget_output)
                ref.key = id(result)
                _OUTPUTS[ref.key] = (ref, graph)
            elif not _register_outputs(result, graph) and not frames:
                for record in records:  # no array to follow: kept until consumed or dropped
                    record.graph = None
        return result

    call._numbapos_wrapped = True
    return call


def _output_graph(output, where: str):
    """The graph that ``backward(..., output=output)`` names."""
    items = output if isinstance(output, (tuple, list)) else (output,)
    if not all(isinstance(getattr(item, "shape", None), tuple) for item in items) or not items:
        raise TypeError(f"{where}: output: expected the array a forward returned, got "
                        f"{_checks.type_name(output)}")
    for item in items:
        graph = _graph_of(item)
        if graph is not None:
            return graph
    raise RuntimeError(
        f"{where}: output: this array is not the output of a recorded forward (a forward "
        "under numbapos.no_grad() records nothing; pass the array the forward returned, a "
        "NumPy view of it, or the output of a numbapos forward computed from it)")


def _paired(method):
    """Wrap a subclass's ``backward`` (or ``<name>_backward``) to take ``output=``."""
    @functools.wraps(method)
    def backward(self, *args, output=None, **kwargs):
        if output is None:
            return method(self, *args, **kwargs)
        scopes = _CALLS.scopes
        scopes.append(_output_graph(output, f"{type(self).__name__}.{method.__name__}"))
        try:
            return method(self, *args, **kwargs)
        finally:
            scopes.pop()

    signature = inspect.signature(method)
    params = list(signature.parameters.values())
    at = next((i for i, p in enumerate(params) if p.kind is p.VAR_KEYWORD), len(params))
    params.insert(at, inspect.Parameter("output", inspect.Parameter.KEYWORD_ONLY, default=None))
    backward.__signature__ = signature.replace(parameters=params)
    # No __wrapped__: tools that read the wrapped method's source for its defaults
    # (Sphinx's autodoc_preserve_defaults) would match them against this signature, which
    # has one keyword more; they fall back to the signature's own defaults.
    backward.__wrapped__ = None
    backward._numbapos_wrapped = True
    return backward


def _reachable(graph) -> set:
    seen, todo = {graph}, [graph]
    while todo:
        for held in todo.pop().held:
            if held not in seen:
                seen.add(held)
                todo.append(held)
    return seen


class _Record:
    """One recorded call's context for its backward, and what names it in messages.

    ``dead_since``: the number of the first later call on the channel that
    found the record's outputs gone (None while they are held).
    """

    __slots__ = ("context", "graph", "number", "training", "shapes", "dead_since")

    # (Module._save_for_backward sets these fields itself, without a call of __init__.)
    def __init__(self, context, graph, number, training, shapes):
        self.context, self.graph, self.number = context, graph, number
        self.training, self.shapes, self.dead_since = training, shapes, None

    @property
    def alive(self) -> bool:
        """Whether something still holds its call's graph (a record without one: always)."""
        return self.graph is None or self.graph() is not None

    @property
    def held(self) -> bool:
        """Whether its call's outputs are known to be held (tied to a live graph)."""
        return self.graph is not None and self.graph() is not None

    def let_go(self) -> None:
        """Its module no longer holds it (consumed, dropped or discarded)."""
        graph = None if self.graph is None else self.graph()
        if graph is not None:
            graph.pending -= 1

    def describe(self, channel: str) -> str:
        mode = {True: "training mode", False: "eval mode"}.get(self.training)
        parts = [mode] if mode else []
        if self.shapes:
            shapes = ", ".join(str(s) for s in self.shapes)
            parts.append(f"input shape{'s' if len(self.shapes) > 1 else ''} {shapes}")
        return f"{channel} call #{self.number}" + (f" ({', '.join(parts)})" if parts else "")

    def __reduce__(self):  # a copy has no outputs to follow: kept until consumed or dropped
        return (_Record, (self.context, None, self.number, self.training, self.shapes))


# Records a module let go of (dropped by the bound, leftovers) are remembered for the message
# of a backward that finds nothing left, and consumed calls for telling leftovers: this many.
_MAX_GONE = 64
