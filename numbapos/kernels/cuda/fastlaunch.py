"""Cheaper launches on a real GPU: the compiled kernel resolved once per signature.

``kernel[blocks, threads, stream](*args)`` configures a launch (an
``lru_cache`` lookup), builds a ``_LaunchConfiguration``, types every
argument through the C dispatcher, selects a launch-config dispatcher and
only then calls the compiled kernel's ``launch``. :func:`launch` skips all of
that after the first launch of a signature: it keys a cache on the
dispatcher and the arguments' Numba types (cached per device array by Numba
itself, so reading them is an attribute lookup), and calls the compiled
``_Kernel.launch`` directly with the stream already converted to a
``cuda.core`` stream.

That uses numba-cuda internals (``dispatcher.overloads``, ``_Kernel.launch``,
``driver._to_core_stream``), so it is used only on a real GPU, only where
:func:`supported` finds them (the ``cuda`` extra pins the numba-cuda minor
versions it was written against), and never for kernels compiled with
``debug`` or launch-config-sensitive ones. Anything else, and the first
launch of each signature (which compiles), takes the ordinary path.
``NUMBAPOS_CUDA_FAST_LAUNCH=0`` (setting ``cuda_fast_launch``) turns it off.
"""

from __future__ import annotations

import inspect

from numba import config as numba_config

__all__ = []  # not launchers


def supported() -> bool:
    """Whether the installed numba-cuda has every internal the fast path relies on."""
    try:
        from numba.cuda import dispatcher
        from numba.cuda.cudadrv import driver
        from numba.cuda.typing.typeof import Purpose, typeof  # noqa: F401
    except ImportError:
        return False
    kernel = getattr(dispatcher, "_Kernel", None)
    if kernel is None or not callable(getattr(kernel, "launch", None)):
        return False
    wanted = ["self", "args", "griddim", "blockdim", "stream", "sharedmem"]
    if list(inspect.signature(kernel.launch).parameters) != wanted:
        return False
    # ``overloads`` is set per dispatcher instance: launch() checks it on each kernel.
    return callable(getattr(driver, "_to_core_stream", None))


# On a real GPU with the internals there; whether to use it is the setting
# ``cuda_fast_launch`` (NUMBAPOS_CUDA_FAST_LAUNCH), read at every launch.
ENABLED = not numba_config.ENABLE_CUDASIM and supported()

_compiled: dict = {}  # (dispatcher, argtypes) -> compiled _Kernel
_core_streams: dict = {}  # id(stream) -> (stream, cuda.core stream)


def _typeof():
    import numpy as np
    from numba.cuda.typing.typeof import Purpose, typeof

    # Scalars by their Python type (what typeof answers for every value of those types).
    scalars = {kind: typeof(kind(0), Purpose.argument)
               for kind in (bool, float, np.bool_, np.int8, np.int16, np.int32, np.int64,
                            np.uint8, np.uint16, np.uint32, np.uint64, np.float32, np.float64)}

    named: dict = {}  # (named tuple class, field types) -> its Numba type

    def of(value):
        found = scalars.get(type(value))
        if found is not None:
            return found
        cached = getattr(value, "_numba_type_", None)  # Numba device arrays cache theirs
        if cached is not None:
            return cached
        if isinstance(value, tuple) and hasattr(value, "_fields"):
            # The hyper-parameters and row groups: typed from their fields' types.
            key = (type(value), tuple(map(of, value)))
            found = named.get(key)
            if found is None:
                found = named[key] = typeof(value, Purpose.argument)
            return found
        return typeof(value, Purpose.argument)
    return of


_type_of = _typeof() if ENABLED else None


def _core_stream(stream):
    """``stream`` as the ``cuda.core`` stream ``_Kernel.launch`` takes (converted once)."""
    found = _core_streams.get(id(stream))
    if found is None or found[0] is not stream:
        from numba.cuda.cudadrv import driver

        if len(_core_streams) > 64:  # streams made and dropped by the hundred: start over
            _core_streams.clear()
        found = _core_streams[id(stream)] = (stream, driver._to_core_stream(stream))
    return found[1]


def launch(kernel, blocks, threads, stream, args) -> bool:
    """Launch through the cached compiled kernel; False (nothing launched) where the
    ordinary path must do it."""
    try:
        key = (kernel, tuple(map(_type_of, args)))
    except Exception:
        return False  # an argument Numba types only through its C dispatcher
    compiled = _compiled.get(key)
    if compiled is None:
        compiled = getattr(kernel, "overloads", {}).get(key[1])
        if (compiled is None or getattr(compiled, "debug", False)
                or getattr(compiled, "launch_config_sensitive", False)
                or getattr(kernel, "_launch_config_sensitive", False)):
            return False  # compile (or launch specially) on the ordinary path first
        _compiled[key] = compiled
    compiled.launch(args, _dim3(blocks), _dim3(threads), _core_stream(stream), 0)
    return True


def _dim3(extent) -> tuple:
    """A grid or block extent as the 3-tuple numba-cuda's launch takes."""
    if isinstance(extent, tuple):
        return tuple(int(e) for e in extent) + (1,) * (3 - len(extent))
    return (int(extent), 1, 1)
