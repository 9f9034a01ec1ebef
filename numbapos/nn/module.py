"""Module: the base of every layer (forward/backward, parameters, state)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import NamedTuple

import numpy as np

from .. import _device
from .parameter import Parameter


class IncompatibleKeys(NamedTuple):
    """What :meth:`Module.load_state_dict` did not match (non-strict loads)."""

    missing_keys: list[str]
    unexpected_keys: list[str]


class Module:
    """Base class of numbapos layers.

    A module owns :class:`Parameter` objects and child modules, registered by
    plain attribute assignment. Layers follow a forward/backward contract with
    no autograd::

        y = module(x)              # forward; caches what backward needs
        gx = module.backward(gy)   # accumulates parameter grads, returns grad wrt x

    Subclasses implement :meth:`forward` and :meth:`backward`.
    """

    def __init__(self):
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "training", True)

    def __setattr__(self, name, value):
        if "_parameters" not in self.__dict__:
            raise AttributeError(
                f"{type(self).__name__}.__init__ must call super().__init__() before "
                f"assigning attributes (got {name!r})"
            )
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        self._parameters.pop(name, None)
        self._modules.pop(name, None)
        object.__delattr__(self, name)

    # ------------------------------------------------------------ contract

    def forward(self, *args, **kwargs):
        """Compute the output and cache what :meth:`backward` needs."""
        raise NotImplementedError(f"{type(self).__name__} does not implement forward")

    def backward(self, grad_output):
        """Accumulate parameter gradients; return the gradient wrt the input."""
        raise NotImplementedError(f"{type(self).__name__} does not implement backward")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # ------------------------------------------------------------ traversal

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield from self._modules.items()

    def children(self) -> Iterator[Module]:
        for _, module in self.named_children():
            yield module

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module and every descendant, with dotted names."""
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """Every parameter with its dotted name (``"LayerNorm.weight"``), each once."""
        seen = set()
        for module_name, module in self.named_modules(prefix):
            for name, param in module._parameters.items():
                if id(param) in seen:
                    continue
                seen.add(id(param))
                yield (f"{module_name}.{name}" if module_name else name), param

    def parameters(self) -> Iterator[Parameter]:
        for _, param in self.named_parameters():
            yield param

    # ------------------------------------------------------------ state

    def zero_grad(self) -> None:
        """Drop every parameter's gradient (sets ``grad`` to None)."""
        for param in self.parameters():
            param.grad = None

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
            self.to(device)

    def to(self, device: str) -> Module:
        """Move every parameter (and gradient) of this module and its children to ``device``.

        In place, like PyTorch's ``Module.to``; returns self. Cached values
        (the last forward's context, position tables) are dropped, so call it
        between steps, not between a forward and its backward.

        Raises
        ------
        TypeError, ValueError
            ``device`` is not ``"cpu"`` or ``"cuda"``.
        RuntimeError
            ``"cuda"`` where CUDA cannot be used.
        """
        device = _device.check_device(device)
        for param in self.parameters():
            param.to(device)
        for _, module in self.named_modules():
            object.__setattr__(module, "_device", device)
            module._on_device_change()
        return self

    def _on_device_change(self) -> None:
        """Drop what depends on the device; subclasses with caches extend this."""
        for name in ("_cache", "_context", "_indices", "_attend_input", "_input_shape", "_last"):
            if name in self.__dict__:
                object.__setattr__(self, name, None)

    def train(self, mode: bool = True) -> Module:
        """Set training mode on this module and its children; returns self."""
        for _, module in self.named_modules():
            object.__setattr__(module, "training", bool(mode))
        return self

    def eval(self) -> Module:
        """Evaluation mode (dropout off); same as ``train(False)``."""
        return self.train(False)

    def state_dict(self) -> OrderedDict[str, np.ndarray]:
        """Parameter arrays by dotted name, as NumPy arrays.

        On the CPU, as in PyTorch, the arrays are the parameters' own (no
        copy): copy them if you need a snapshot that later training does not
        change. Parameters on the GPU are copied to the host.
        """
        return OrderedDict((name, _device.to_host(param.data))
                           for name, param in self.named_parameters())

    def load_state_dict(self, state, strict: bool = True) -> IncompatibleKeys:
        """Copy arrays from ``state`` into the parameters, in place.

        Every array is checked before any is copied, so a failed load changes
        nothing.

        Parameters
        ----------
        state : mapping of str to array_like
            As returned by :meth:`state_dict`: host arrays (or CUDA arrays),
            copied to wherever each parameter lives.
        strict : bool, default True
            Require exactly this module's names: a missing name raises KeyError,
            an unexpected one ValueError. When False both are only reported.

        Returns
        -------
        IncompatibleKeys
            ``(missing_keys, unexpected_keys)``.

        Raises
        ------
        KeyError
            A parameter missing from ``state`` (strict only).
        ValueError
            Unexpected names (strict only), or an array whose shape or dtype does
            not match the parameter's.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"load_state_dict: expected a mapping of names to arrays, got "
                            f"{type(state).__name__}")
        own = OrderedDict(self.named_parameters())
        missing = [name for name in own if name not in state]
        unexpected = [name for name in state if name not in own]
        if strict and missing:
            raise KeyError(f"load_state_dict: missing parameter(s) {missing}")
        if strict and unexpected:
            raise ValueError(f"load_state_dict: unexpected name(s) {unexpected}")
        updates = []
        for name, param in own.items():
            if name not in state:
                continue
            value = state[name]
            value = _device.adopt(value) if _device.is_cuda_array(value) else np.asarray(value)
            if tuple(value.shape) != tuple(param.data.shape):
                raise ValueError(
                    f"load_state_dict: {name!r} has shape {tuple(value.shape)}, "
                    f"expected {tuple(param.data.shape)}"
                )
            if value.dtype != param.data.dtype:
                raise ValueError(
                    f"load_state_dict: {name!r} has dtype {value.dtype}, "
                    f"expected {param.data.dtype}"
                )
            updates.append((param, value))
        for param, value in updates:
            if param.device == "cpu":
                np.copyto(param.data, _device.to_host(value))
            else:
                param.data.copy_to_device(np.ascontiguousarray(value)
                                          if isinstance(value, np.ndarray) else value)
        return IncompatibleKeys(missing, unexpected)

    # ------------------------------------------------------------ display

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"  ({name}): {child!r}".replace("\n", "\n  ")
                 for name, child in self._modules.items()]
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n" + "\n".join(lines) + "\n)"
