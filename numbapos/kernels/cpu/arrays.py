"""Array helpers of the CPU backend: allocation and moves, with the CUDA twin's names."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

__all__ = ["DEVICE", "add_", "add_rows_", "asarray", "contiguous", "empty", "full", "to_host",
           "zeros"]

DEVICE = "cpu"

# Below this many elements of work a parallel launch costs more than it saves.
# The only serial/parallel threshold of the CPU launchers.
PARALLEL_MIN_ELEMENTS = 1 << 15


def pick(serial, parallel, work: int):
    """The serial kernel for small work, the parallel one from PARALLEL_MIN_ELEMENTS on."""
    return parallel if work >= PARALLEL_MIN_ELEMENTS else serial


def split_range(count: int, work: int) -> list[tuple[int, int]]:
    """``[0, count)`` cut into one part per thread from PARALLEL_MIN_ELEMENTS of work on.

    Below the threshold (or with one thread) a single part. The parts depend
    only on ``count`` and the thread count; kernels whose items are
    independent (rows of a table) give the same bits for any cut.
    """
    threads = numba.get_num_threads() if work >= PARALLEL_MIN_ELEMENTS else 1
    parts = max(1, min(threads, count))
    return [(count * i // parts, count * (i + 1) // parts) for i in range(parts)]


def run_split(kernel, ranges, *args, scratch=None) -> None:
    """``kernel(*args[, scratch[i]], start, stop)`` for each range, at once.

    The first range runs on the calling thread, the others on a small pool of
    threads: the kernels are serial ``nogil`` bodies. This is how the row
    kernels of a training step run in parallel without Numba's ``parallel=True``,
    whose bodies take several times longer to compile (seconds of a cold first
    step); the work per row is the same.
    """
    def call(i):
        start, stop = ranges[i]
        if scratch is None:
            kernel(*args, start, stop)
        else:
            kernel(*args, scratch[i], start, stop)

    if len(ranges) == 1:
        call(0)
        return
    executor = _executor()
    futures = [executor.submit(call, i) for i in range(1, len(ranges))]
    try:
        call(0)
    finally:
        for future in futures:  # every part finishes (or fails) before this returns
            future.result()


_pool_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid, executor)


def _executor() -> ThreadPoolExecutor:
    """The helper threads of run_split (made anew in a forked child, whose copy has none)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            workers = max(1, numba.config.NUMBA_NUM_THREADS - 1)
            _pool = (os.getpid(), ThreadPoolExecutor(workers, thread_name_prefix="numbapos"))
        return _pool[1]


def _forget_pool_after_fork() -> None:
    # The child has none of the parent's threads, and the lock may have been held.
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_after_fork)


def empty(shape, dtype) -> np.ndarray:
    """Uninitialised C-contiguous array."""
    return np.empty(shape, dtype=dtype)


def zeros(shape, dtype) -> np.ndarray:
    """Zero-filled C-contiguous array."""
    return np.zeros(shape, dtype=dtype)


def full(shape, value, dtype) -> np.ndarray:
    """C-contiguous array filled with ``value``."""
    return np.full(shape, value, dtype=dtype)


def asarray(host: np.ndarray) -> np.ndarray:
    """A host array on this device (here: itself)."""
    return host


def to_host(x) -> np.ndarray:
    """This device's array as a NumPy array (here: itself)."""
    return x


def contiguous(x, dtype=None) -> np.ndarray:
    """``x`` as a C-contiguous array of ``dtype`` (no copy when it already is one)."""
    return np.ascontiguousarray(x, dtype=dtype)


def add_(out, x):
    """``out += x`` elementwise (same shape and dtype; ``out`` C-contiguous)."""
    np.add(out, x, out=out)


def add_rows_(dense, rows, values):
    """``dense[rows[j]] += values[j]`` for unique ``rows`` (sparse rows into a dense array)."""
    dense[rows] += values
