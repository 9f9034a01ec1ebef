"""numbapos's runtime settings: every ``NUMBAPOS_*`` variable, parsed in one place.

Each setting has a name, an environment variable, a default and a parser.
The environment is read once, at the first read of any setting (not at
import, so a bad value raises where numbapos is first used, naming the
variable); :func:`override` changes settings for a block of code, for the
warm-up, tests and benchmarks, instead of patching module constants.
``python -m numbapos info`` prints them all (:func:`describe`).

============================  ==================================  =============================
setting                       variable                            default
============================  ==================================  =============================
``spin_count``                ``NUMBAPOS_SPIN_COUNT``             ``10000``: OpenMP spin before
                                                                  idle threads sleep
``prefetch_lines``            ``NUMBAPOS_PREFETCH_LINES``         by CPU (64 on AMD Zen, else 0)
``parallel_min_elements``     ``NUMBAPOS_PARALLEL_MIN_ELEMENTS``  ``32768``: smaller work runs
                                                                  the serial kernel
``adaptive_threads``          ``NUMBAPOS_ADAPTIVE_THREADS``       ``True``: parallel kernels use
                                                                  the cores other processes
                                                                  leave free
``stream_min_bytes``          ``NUMBAPOS_STREAM_MIN_BYTES``       ``32 MiB``: larger outputs are
                                                                  written with non-temporal stores
``max_pending_records``       ``NUMBAPOS_MAX_PENDING_RECORDS``    ``64``: unconsumed forward
                                                                  records a module keeps
``cuda_memory_pool``          ``NUMBAPOS_CUDA_MEMORY_POOL``       ``True``: numbapos's caching
                                                                  device allocator
``cuda_sync_checks``          ``NUMBAPOS_CUDA_SYNC_CHECKS``       ``False``: index errors on the
                                                                  GPU raise at a later call
``numba_internals``           ``NUMBAPOS_NUMBA_INTERNALS``        ``True``: faster paths through
                                                                  Numba's private interfaces
                                                                  where present (0: public only)
``cuda_fast_launch``          ``NUMBAPOS_CUDA_FAST_LAUNCH``       ``True``: GPU launches call the
                                                                  compiled kernel resolved once
                                                                  per signature
``cuda_native_launch``        ``NUMBAPOS_CUDA_NATIVE_LAUNCH``     ``True``: a planned op launches
                                                                  all its kernels in one native
                                                                  call
============================  ==================================  =============================

When each is read: ``spin_count`` when the thread pool starts (the first
parallel kernel), ``cuda_memory_pool`` when the CUDA backend first launches
(before Numba makes a CUDA context), ``prefetch_lines`` when the CPU kernels
are compiled (it is compiled into them, so it is fixed for the process once
the CPU backend is imported); the others at every call that uses them, so
:func:`override` changes them at once.

Examples
--------
>>> import numbapos
>>> numbapos.config.get("parallel_min_elements")
32768
>>> with numbapos.config.override(parallel_min_elements=0):   # every kernel parallel
...     numbapos.config.get("parallel_min_elements")
0
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NamedTuple

__all__ = ["SETTINGS", "Setting", "describe", "get", "override", "reset", "unknown_variables"]

PREFIX = "NUMBAPOS_"


class Setting(NamedTuple):
    """One runtime setting: its name, variable, default, parser and meaning."""

    name: str
    variable: str
    default: Any
    parse: Callable[[str], Any]
    check: Callable[[Any], Any]
    doc: str


def _flag(variable: str):
    def parse(text: str) -> bool:
        value = text.strip()
        if value not in ("0", "1"):
            raise ValueError(f"{variable}: expected 0 or 1, got {text!r}")
        return value == "1"

    def check(value) -> bool:
        if not isinstance(value, bool):
            raise TypeError(f"{variable[len(PREFIX):].lower()}: expected a bool, got "
                            f"{type(value).__name__}")
        return value

    return parse, check


def _int_between(variable: str, low: int, high: int | None, allow_none: bool = False):
    name = variable[len(PREFIX):].lower()
    span = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"

    def check(value):
        if value is None and allow_none:
            return None
        if isinstance(value, bool) or not hasattr(value, "__index__"):
            raise TypeError(f"{name}: expected {span}, got {type(value).__name__}")
        value = int(value)
        if value < low or (high is not None and value > high):
            raise ValueError(f"{name}: expected {span}, got {value}")
        return value

    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise ValueError(f"{variable}: expected {span}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise ValueError(f"{variable}: expected {span}, got {text!r}")
        return value

    return parse, check


def _setting(name, default, kind, doc, **bounds) -> Setting:
    variable = PREFIX + name.upper()
    if kind == "flag":
        parse, check = _flag(variable)
    else:
        parse, check = _int_between(variable, **bounds)
    return Setting(name, variable, default, parse, check, doc)


SETTINGS: Mapping[str, Setting] = {s.name: s for s in (
    _setting("numba_internals", True, "flag",
             "faster paths through Numba's private interfaces where this Numba has them, each "
             "with a public fallback giving the same results (0: the fallbacks only; read "
             "once, when the CPU backend is first used)"),
    _setting("spin_count", 10_000, "int",
             "OpenMP iterations an idle pool thread spins before it sleeps, set while the pool "
             "starts unless OMP_WAIT_POLICY / GOMP_SPINCOUNT are set (0: sleep at once)",
             low=0, high=None),
    _setting("prefetch_lines", None, "int",
             "cache lines prefetched per table row (default: 64 on AMD Zen, else 0); "
             "compiled into the CPU kernels", low=0, high=64, allow_none=True),
    _setting("parallel_min_elements", 1 << 15, "int",
             "elements of work from which a CPU launcher runs its parallel kernel",
             low=0, high=None),
    _setting("adaptive_threads", True, "flag",
             "parallel kernels use only the cores that other processes left free over the "
             "last 0.1 s (/proc/stat; one: the serial kernel) instead of every thread"),
    _setting("stream_min_bytes", 32 << 20, "int",
             "outputs of at least this many bytes (larger than the last-level cache) are "
             "written with non-temporal stores by the lookup and the rotation",
             low=0, high=None),
    _setting("max_pending_records", 64, "int",
             "forward records a module keeps for backwards not yet run; older ones are dropped "
             "(a backward that would need one raises RuntimeError)", low=1, high=None),
    _setting("cuda_memory_pool", True, "flag",
             "numbapos's caching allocator for CUDA device memory (0: Numba's own)"),
    _setting("cuda_sync_checks", False, "flag",
             "synchronise after every CUDA launcher that checks indices and raise a bad index "
             "there (for debugging, as CUDA_LAUNCH_BLOCKING; 0: errors raise at a later call)"),
    _setting("cuda_fast_launch", True, "flag",
             "launch CUDA kernels through the compiled kernel resolved once per argument "
             "signature (numba-cuda internals, checked; 0: numba-cuda's ordinary launch)"),
    _setting("cuda_native_launch", True, "flag",
             "a planned GPU op launches all its kernels in one call of a compiled function "
             "that calls the driver's cuLaunchKernel (0: one cuda-bindings call per kernel)"),
)}

_lock = threading.Lock()
_from_environment: dict | None = None  # parsed once, at the first read
_overrides: list[dict] = []  # innermost last
_current: dict | None = None  # environment + overrides, what get() returns


def _environment() -> dict:
    """The settings as the environment gives them (parsed at the first call only)."""
    global _from_environment
    if _from_environment is None:
        values = {}
        for setting in SETTINGS.values():
            text = os.environ.get(setting.variable)
            values[setting.name] = setting.default if text is None else setting.parse(text)
        _from_environment = values
    return _from_environment


def _rebuild() -> dict:
    global _current
    values = dict(_environment())
    for layer in _overrides:
        values.update(layer)
    _current = values
    return values


def get(name: str):
    """The value of setting ``name`` now (environment, then any :func:`override`).

    Parameters
    ----------
    name : str
        One of :data:`SETTINGS`.

    Raises
    ------
    KeyError
        An unknown name (the known ones listed).
    ValueError
        A ``NUMBAPOS_*`` variable with a value its setting does not accept
        (raised at the first read of any setting, naming the variable).
    """
    values = _current
    if values is None:
        with _lock:
            values = _rebuild()
    try:
        return values[name]
    except KeyError:
        raise KeyError(f"numbapos.config: no setting {name!r}; the settings are "
                       f"{sorted(SETTINGS)}") from None


@contextmanager
def override(**values) -> Iterator[None]:
    """Use other values for some settings inside a ``with`` block (process-wide).

    Overrides nest, and the previous values come back on exit, also after an
    exception. They apply to every thread, as the environment does; settings
    read only once (``spin_count``, ``cuda_memory_pool``, ``prefetch_lines``,
    see the module docstring) are not changed for a pool, context or kernel
    that already exists.

    Parameters
    ----------
    **values
        ``name=value`` for settings of :data:`SETTINGS`, checked as their
        variables are (``prefetch_lines=None`` restores the choice by CPU).

    Raises
    ------
    KeyError
        An unknown setting name.
    TypeError, ValueError
        A value the setting does not accept; nothing is changed.
    """
    layer = {}
    for name, value in values.items():
        if name not in SETTINGS:
            raise KeyError(f"override: no setting {name!r}; the settings are {sorted(SETTINGS)}")
        layer[name] = SETTINGS[name].check(value)
    with _lock:
        _overrides.append(layer)
        _rebuild()
    try:
        yield
    finally:
        with _lock:
            _overrides.remove(layer)
            _rebuild()


def reset() -> None:
    """Read the environment again at the next :func:`get` (for tests that change it)."""
    global _from_environment, _current
    with _lock:
        _from_environment = None
        _current = None


def unknown_variables() -> list[str]:
    """``NUMBAPOS_*`` variables set in the environment that no setting reads (typos)."""
    known = {s.variable for s in SETTINGS.values()}
    return sorted(name for name in os.environ if name.startswith(PREFIX) and name not in known)


def describe() -> list[tuple[str, str, Any, str, str]]:
    """``(name, variable, value, source, meaning)`` of every setting, for ``info``.

    ``source`` is ``"environment"``, ``"override"`` or ``"default"``.
    """
    rows = []
    for setting in SETTINGS.values():
        value = get(setting.name)
        if any(setting.name in layer for layer in _overrides):
            source = "override"
        elif setting.variable in os.environ:
            source = "environment"
        else:
            source = "default"
        rows.append((setting.name, setting.variable, value, source, setting.doc))
    return rows
