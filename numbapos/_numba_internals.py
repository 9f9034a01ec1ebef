"""Numba's private interfaces that numbapos uses, in this one module.

Each is detected when this module is imported and has a public fallback with
the same results, so a Numba release that renames one costs speed, never
correctness, and numbapos's ``numba`` requirement needs no upper bound:

- ``no_nrt_options``: the CPU kernels compile with Numba's runtime off
  (the ``_nrt`` target option), so a call does not wrap each array in a
  reference-counted ``MemInfo``; fallback: the runtime on (slower calls).
- ``start_thread_pool``: the thread pool starts at numbapos's first parallel
  launch with numbapos's wait policy (``numba.np.ufunc.parallel``'s
  ``_launch_threads``); fallback: Numba starts it at the first parallel
  kernel, with the environment's policy.
- ``lock_cache_saves``: the parallel warm-up's worker processes take a file
  lock around each save and load of Numba's cache index
  (``numba.core.caching.IndexDataCacheFile``); fallback: the warm-up runs in
  one process.

``NUMBAPOS_NUMBA_INTERNALS=0`` (:mod:`numbapos.config`'s ``numba_internals``,
read once, at the first use of any of these) takes every fallback; CI runs the
CPU, module, optimiser and stub-driver tests once more that way (with
``NUMBAPOS_CUDA_FAST_LAUNCH=0``, the same switch for numba-cuda's internals).
"""

from __future__ import annotations

from functools import cache

from . import config

__all__ = ["ENV", "can_lock_cache_saves", "enabled", "lock_cache_saves", "no_nrt_options",
           "pool_started", "start_thread_pool"]

ENV = config.SETTINGS["numba_internals"].variable


@cache
def enabled() -> bool:
    """Whether numbapos may use Numba's private interfaces (fixed for the process)."""
    return config.get("numba_internals")


@cache
def _has_nrt_option() -> bool:
    try:
        from numba.core.cpu import CPUTargetOptions
    except ImportError:
        return False
    return hasattr(CPUTargetOptions, "_nrt")


@cache
def _parallel_module():
    try:
        from numba.np.ufunc import parallel
    except ImportError:
        return None
    if hasattr(parallel, "_is_initialized") and callable(getattr(parallel, "_launch_threads",
                                                                 None)):
        return parallel
    return None


@cache
def _cache_file_class():
    try:
        from numba.core import caching
    except ImportError:
        return None
    found = getattr(caching, "IndexDataCacheFile", None)
    if found is not None and callable(getattr(found, "save", None)) and callable(
            getattr(found, "load", None)):
        return found
    return None


def no_nrt_options() -> dict:
    """``{"_nrt": False}`` where Numba has that target option (and internals are on), else
    ``{}``: the extra ``@njit`` options of every CPU kernel."""
    return {"_nrt": False} if enabled() and _has_nrt_option() else {}


def _pool_module():
    return _parallel_module() if enabled() else None


def pool_started() -> bool | None:
    """Whether Numba's thread pool runs; None where that cannot be known (fallback)."""
    parallel = _pool_module()
    return None if parallel is None else bool(parallel._is_initialized)


def start_thread_pool() -> bool:
    """Start Numba's thread pool now; False (nothing done) in the fallback, where the pool
    starts at the first parallel kernel."""
    parallel = _pool_module()
    if parallel is None:
        return False
    parallel._launch_threads()
    return True


def can_lock_cache_saves() -> bool:
    """Whether :func:`lock_cache_saves` can lock (not the fallback)."""
    return enabled() and _cache_file_class() is not None


def lock_cache_saves(locked) -> bool:
    """Wrap the save and load of Numba's cache index with ``locked(method, exclusive)``;
    False (nothing done) in the fallback, where the caller must not share a cache folder
    between processes compiling at once."""
    cache_file = _cache_file_class() if enabled() else None
    if cache_file is None:
        return False
    cache_file.save = locked(cache_file.save, True)
    cache_file.load = locked(cache_file.load, False)
    return True
