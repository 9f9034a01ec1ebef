"""Containers of modules: ModuleList, ModuleDict and Sequential (PyTorch's interfaces).

A module held in a container is registered as the container's child, named by
its position (``"0"``, ``"1"``...) or its key, so ``parameters()``,
``state_dict()`` (``"layers.0.weight"``), ``to()``, ``train()`` / ``eval()``
and ``zero_grad()`` reach it. A plain list, tuple or dict of modules assigned
to a module attribute is not registered (a warning says so).
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping

from .. import _checks
from .module import Module


def _check_module(module, where: str) -> Module:
    if not isinstance(module, Module):
        raise TypeError(f"{where}: expected a numbapos Module, got {_checks.type_name(module)}")
    return module


def _index(idx, size: int, where: str) -> int:
    """``idx`` as a position in ``[0, size)`` (negative counts from the end)."""
    try:
        idx = operator.index(idx)
    except TypeError:
        raise TypeError(f"{where}: indices must be integers or slices, got "
                        f"{_checks.type_name(idx)}") from None
    if not -size <= idx < size:
        raise IndexError(f"{where}: index {idx} is out of range for {size} module(s)")
    return idx % size


class _Indexed(Module):
    """Shared by ModuleList and Sequential: children named "0", "1"... in order."""

    def _items(self) -> list[Module]:
        return list(self._modules.values())

    def _renumber(self, modules: list[Module]) -> None:
        for name in list(self._modules):
            delattr(self, name)
        for i, module in enumerate(modules):
            self.add_module(str(i), module)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[Module]:
        return iter(self._items())

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return type(self)._from_items(list(self._modules.items())[idx])
        return self._items()[_index(idx, len(self), f"{type(self).__name__}[]")]

    def __setitem__(self, idx, module) -> None:
        idx = _index(idx, len(self), f"{type(self).__name__}[]")
        _check_module(module, f"{type(self).__name__}[{idx}]")
        setattr(self, list(self._modules)[idx], module)

    def __delitem__(self, idx) -> None:
        modules = self._items()
        if isinstance(idx, slice):
            del modules[idx]
        else:
            del modules[_index(idx, len(self), f"del {type(self).__name__}[]")]
        self._renumber(modules)

    def append(self, module: Module):
        """Add ``module`` at the end; returns self."""
        self.add_module(str(len(self)),
                        _check_module(module, f"{type(self).__name__}.append"))
        return self

    def extend(self, modules: Iterable[Module]):
        """Append each of ``modules`` (checked first: a bad one adds nothing); returns self."""
        if isinstance(modules, Module) and not isinstance(modules, _Indexed):
            raise TypeError(f"{type(self).__name__}.extend: expected an iterable of modules, "
                            f"got {_checks.type_name(modules)}")
        modules = list(modules)
        for i, module in enumerate(modules):
            _check_module(module, f"{type(self).__name__}.extend: item {i}")
        for module in modules:
            self.append(module)
        return self

    def insert(self, index: int, module: Module) -> None:
        """Insert ``module`` before position ``index`` (as ``list.insert``)."""
        _check_module(module, f"{type(self).__name__}.insert")
        modules = self._items()
        modules.insert(operator.index(index), module)
        self._renumber(modules)

    def pop(self, index: int = -1) -> Module:
        """Remove and return the module at ``index`` (default the last)."""
        module = self[index]
        del self[index]
        return module

    def __iadd__(self, modules):
        return self.extend(modules)

    def __add__(self, other):
        if not isinstance(other, _Indexed):
            return NotImplemented
        return type(self)._from_items(list(enumerate(self._items() + other._items())))

    def __dir__(self):
        return [key for key in super().__dir__() if not key.isdigit()]


class ModuleList(_Indexed):
    """Holds child modules in a list (PyTorch's ``nn.ModuleList``).

    Indexing, slicing (a new ModuleList of the same modules), ``len``,
    iteration, ``append``, ``extend``, ``insert``, ``pop``, ``del`` and ``+=``
    work as on a list; the modules are registered as children ``"0"``,
    ``"1"``... (state dict keys ``"0.weight"``). A ModuleList has no forward:
    call its modules yourself.

    Parameters
    ----------
    modules : iterable of Module, optional

    Examples
    --------
    >>> from numbapos import nn
    >>> layers = nn.ModuleList([nn.Embedding(4, 2, seed=0), nn.LayerNorm(2)])
    >>> layers.append(nn.Dropout(0.1, seed=0))
    ModuleList(...)
    >>> len(layers), list(layers.state_dict())[:2]
    (3, ['0.weight', '1.weight'])
    """

    def __init__(self, modules: Iterable[Module] | None = None):
        super().__init__()
        if modules is not None:
            self.extend(modules)

    @classmethod
    def _from_items(cls, items):
        return cls([module for _, module in items])


class Sequential(_Indexed):
    """Chains modules: ``forward`` feeds each one's output to the next (``nn.Sequential``).

    :meth:`backward` runs the children's backwards in reverse order, each on
    the gradient the next one returned, and returns the gradient with respect
    to the Sequential's input (None when the first module takes indices, as
    :class:`Embedding`). Children record their own forwards, so forwards and
    backwards pair up last in, first out as for any module. Indexing, slicing
    (a new Sequential), ``len``, iteration, ``append``, ``extend``,
    ``insert``, ``pop`` and ``del`` work as for :class:`ModuleList`.

    Parameters
    ----------
    *modules : Module
        The modules in order, named ``"0"``, ``"1"``...; or a single
        ``OrderedDict`` (any mapping) of names to modules.

    Examples
    --------
    >>> import numpy as np
    >>> from numbapos import nn
    >>> model = nn.Sequential(nn.Embedding(10, 4, seed=0), nn.LayerNorm(4))
    >>> y = model(np.array([[1, 2, 3]]))
    >>> model.backward(np.ones_like(y)) is None    # the ids have no gradient
    True
    >>> list(model.state_dict())
    ['0.weight', '1.weight', '1.bias']
    """

    def __init__(self, *modules):
        super().__init__()
        if len(modules) == 1 and isinstance(modules[0], Mapping):
            for name, module in modules[0].items():
                self.add_module(name, _check_module(module, f"Sequential: {name!r}"))
        else:
            for i, module in enumerate(modules):
                _check_module(module, f"Sequential: argument {i}")
            for module in modules:
                self.append(module)

    @classmethod
    def _from_items(cls, items):
        return cls(OrderedDict((str(name), module) for name, module in items))

    def append(self, module: Module) -> Sequential:
        """Add ``module`` at the end (named by its position); returns self."""
        name = str(len(self))
        if name in self._modules:  # named children from a mapping: find a free number
            name = str(max((int(k) for k in self._modules if k.isdigit()), default=-1) + 1)
        self.add_module(name, _check_module(module, "Sequential.append"))
        return self

    def forward(self, x):
        """Run each module on the previous one's output; returns the last output."""
        for module in self:
            x = module(x)
        return x

    def backward(self, grad_output):
        """Run the children's backwards, last to first; returns the input gradient.

        Raises
        ------
        RuntimeError
            A child before the first returned None (it takes no gradient, so
            the modules before it cannot get one), or any child's own error
            (a backward with no recorded forward...).
        """
        grad = grad_output
        modules = self._items()
        for position in range(len(modules) - 1, -1, -1):
            if grad is None:
                raise RuntimeError(
                    f"Sequential.backward: module {position + 1} "
                    f"({type(modules[position + 1]).__name__}) returned no input gradient, "
                    f"so module {position} ({type(modules[position]).__name__}) cannot get "
                    "one: only the first module may take indices")
            grad = modules[position].backward(grad)
        return grad


class ModuleDict(Module):
    """Holds child modules by name (PyTorch's ``nn.ModuleDict``), in insertion order.

    The mapping interface: ``d[key]``, ``d[key] = module``, ``del d[key]``,
    ``key in d``, ``len``, iteration over keys, ``keys()``, ``values()``,
    ``items()``, ``update()``, ``pop()``, ``clear()``. Keys are the child
    names (state dict keys ``"key.weight"``): non-empty strings without dots
    that are not attributes of the ModuleDict (``"to"``, ``"training"``...).

    Parameters
    ----------
    modules : mapping or iterable of (str, Module) pairs, optional
    """

    def __init__(self, modules=None):
        super().__init__()
        if modules is not None:
            self.update(modules)

    def __getitem__(self, key: str) -> Module:
        try:
            return self._modules[key]
        except (KeyError, TypeError):
            raise KeyError(key) from None

    def __setitem__(self, key: str, module: Module) -> None:
        self.add_module(key, _check_module(module, f"ModuleDict[{key!r}]"))

    def __delitem__(self, key: str) -> None:
        if not isinstance(key, str) or key not in self._modules:
            raise KeyError(key)
        delattr(self, key)

    def __len__(self) -> int:
        return len(self._modules)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._modules))

    def __contains__(self, key) -> bool:
        return key in self._modules

    def keys(self):
        """The names, in insertion order."""
        return self._modules.keys()

    def values(self):
        """The modules, in insertion order."""
        return self._modules.values()

    def items(self):
        """``(name, module)`` pairs, in insertion order."""
        return self._modules.items()

    def pop(self, key: str) -> Module:
        """Remove ``key`` and return its module."""
        module = self[key]
        del self[key]
        return module

    def clear(self) -> None:
        """Remove every module."""
        for key in list(self._modules):
            delattr(self, key)

    def update(self, modules) -> None:
        """Add or replace modules from a mapping or an iterable of ``(name, module)`` pairs.

        Every pair is checked before any is added.
        """
        if isinstance(modules, (Mapping, ModuleDict)):
            pairs = list(modules.items())
        else:
            if isinstance(modules, Module) or not isinstance(modules, Iterable):
                raise TypeError("ModuleDict.update: expected a mapping or an iterable of "
                                f"(name, module) pairs, got {_checks.type_name(modules)}")
            pairs = []
            for i, pair in enumerate(modules):
                if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                    raise TypeError(f"ModuleDict.update: item {i}: expected a (name, module) "
                                    f"pair, got {_checks.type_name(pair)}")
                pairs.append(tuple(pair))
        for key, module in pairs:
            if not isinstance(key, str):
                raise TypeError(f"ModuleDict: key: expected a str, got {_checks.type_name(key)}")
            _check_module(module, f"ModuleDict[{key!r}]")
            if not key or "." in key:
                raise KeyError(f"ModuleDict: key: expected a non-empty name without dots, got "
                               f"{_checks.quote(key)}")
            if key not in self._modules and hasattr(self, key):
                raise KeyError(f"ModuleDict: key {key!r} is an attribute of ModuleDict")
        for key, module in pairs:
            self[key] = module


__all__ = ["ModuleDict", "ModuleList", "Sequential"]
