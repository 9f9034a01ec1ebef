"""``kernel(...)``: the ``@njit`` every CPU kernel is compiled with.

``cache=True`` (compiled once per machine, then loaded), ``nogil=True`` (other
Python threads run meanwhile) and Numba's runtime (NRT) off where Numba lets
us (:func:`numbapos._numba_internals.no_nrt_options`). The kernels never
allocate: their arrays come from the launchers, so reference counting has
nothing to manage, and without NRT a call from Python does not wrap each array
argument in a fresh reference-counted ``MemInfo`` and a row view costs no
atomic increment of the whole array's count (``docs/performance.rst``). A
kernel that allocated would fail to compile without NRT, so the tests would
say so.

``kernel(parallel=True)`` compiles one ``prange`` body twice: a serial kernel
(``prange`` is ``range`` there) for small work and a parallel one, returned
together as :class:`SerialParallel`; a launcher picks one by the size of the
work (:func:`.arrays.pick`). Numba's on-disk cache keys a function by its
qualified name and its types, not by the ``parallel`` option, so the serial
compilation is made from a copy of the function under its own qualified name
(``<name>__serial``): two cache entries, each a cache hit in a new process.
"""

from types import FunctionType
from typing import NamedTuple

from numba import njit
from numba.core.dispatcher import Dispatcher

from ..._numba_internals import no_nrt_options

__all__ = ["SerialParallel", "kernel"]

SERIAL_SUFFIX = "__serial"


class SerialParallel(NamedTuple):
    """The two compilations of one ``prange`` body; both compute the same bits."""

    serial: Dispatcher
    parallel: Dispatcher


def kernel(*, parallel=False, **options):
    """``@njit(cache=True, nogil=True, _nrt=False, **options)``; with ``parallel=True`` a
    :class:`SerialParallel` pair compiled from the one body."""
    options = dict(cache=True, nogil=True, **no_nrt_options(), **options)

    def compile_(func):
        if not parallel:
            return njit(**options)(func)
        return SerialParallel(njit(**options)(_renamed(func)),
                              njit(parallel=True, **options)(func))
    return compile_


def _renamed(func):
    """A copy of ``func`` (same code, globals, defaults) under ``<qualname>__serial``."""
    copy = FunctionType(func.__code__, func.__globals__, func.__name__ + SERIAL_SUFFIX,
                        func.__defaults__, func.__closure__)
    copy.__qualname__ = func.__qualname__ + SERIAL_SUFFIX
    copy.__module__ = func.__module__
    copy.__doc__ = func.__doc__
    copy.__kwdefaults__ = func.__kwdefaults__
    return copy
