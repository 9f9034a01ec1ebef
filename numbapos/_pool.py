"""Numba's CPU thread pool: how its threads wait between kernels, and how many run.

Numba's default threading layer on Linux is OpenMP (GNU libgomp). Between two
parallel kernels libgomp's idle threads spin for about 300,000 iterations
before they sleep. Alone on a machine that saves a wake-up; next to another
busy process (a second trainer, Ray actors, data-loader or server workers,
``pytest -n``) the spinning threads steal the cores the other process needs,
and both slow down several-fold instead of sharing the cores.

:func:`start_pool` therefore loads the threading layer with a bounded spin
(``GOMP_SPINCOUNT`` = :data:`SPIN_COUNT` = 10,000 iterations, about 0.1 ms on
the development VM) unless the user chose a policy (``OMP_WAIT_POLICY``,
``GOMP_SPINCOUNT``, ``NUMBAPOS_SPIN_COUNT`` (:mod:`numbapos.config`'s
``spin_count``) or a ``NUMBA_THREADING_LAYER`` other than OpenMP/default).
The CPU launchers call it at the first launch of a parallel kernel
(:func:`numbapos.kernels.cpu.arrays.runs_parallel`), not at import: a
process that only runs small, serial calls never starts the pool. The
variable is set only while the layer loads (libgomp reads it once, then)
and removed afterwards, so libraries loaded later (PyTorch's own OpenMP
runtime) keep their defaults.

The trade-off, measured on the 2-core development VM
(``benchmarks/test_bench_contention.py``): waking a sleeping team costs
50-150 us there, a spinning one answers in about 5 us. 10,000 iterations keep
the team awake across the Python work between the kernels of a training step
(a small sparse step: 0.32 ms, against 0.37 ms with 1,000 iterations, which
lets the team sleep, and wake, between kernels), and two processes sharing the cores run
x2.1 their solo step (OpenMP's own 300,000: x3.6-3.8; passive: x1.6-1.8). Its
cost: once the team has gone to sleep, a parallel call made after the caller
idled for milliseconds waits 0.3-0.6 ms for it (the hypervisor gives an idle
virtual CPU away); latency-bound services set ``NUMBAPOS_SPIN_COUNT=0``.
Results never depend on any of this: every kernel is deterministic for any
thread count and layer.

Busy cores. Numba splits a parallel loop into one equal share per thread
(OpenMP's static schedule; ``numba.set_parallel_chunksize`` only makes the
shares smaller, still assigned in advance), so a kernel ends when its
slowest thread does: with another process busy on one of two cores, the
thread sharing that core finishes its half a time slice late, and a 0.7 ms
lookup took 2.3 ms, slower than its serial kernel. So
:func:`usable_threads` (config's ``adaptive_threads``, on by default; Linux)
looks, at most every :data:`LOAD_WINDOW_S`, at how much CPU time the other
processes used on this process's cores (``/proc/stat`` less this process's
own ``getrusage``), and the launchers use only the cores they leave free:
the serial kernel when one is left, fewer threads than the pool's
otherwise (never more than :func:`set_num_threads` asked for).
"""

from __future__ import annotations

import os
import threading
import time

import numba
import numpy as np

from . import _numba_internals, config

__all__ = ["LOAD_WINDOW_S", "SPIN_COUNT", "get_num_threads", "pool_settings", "set_num_threads",
           "start_pool", "usable_threads"]

SPIN_COUNT = config.SETTINGS["spin_count"].default

# Environment variables by which a user has already chosen how threads wait.
_USER_CHOICES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")

_lock = threading.Lock()
_spin_set: str | None = None  # the GOMP_SPINCOUNT numbapos chose, when it did
started = False  # start_pool() has run (the launchers' cheap check)


def _chosen_spin_count() -> str | None:
    """The spin count numbapos should set, or None when the user decided."""
    if any(os.environ.get(name) for name in _USER_CHOICES):
        return None
    layer = os.environ.get("NUMBA_THREADING_LAYER", "default").lower()
    if layer not in ("default", "safe", "forksafe", "threadsafe", "omp"):
        return None
    return str(config.get("spin_count"))


def start_pool() -> None:
    """Load Numba's threading layer now, with a bounded OpenMP spin-wait.

    Does nothing when the pool is already running (it was started by other
    code; its wait policy stays whatever that code's environment gave it).
    """
    global _spin_set, started
    with _lock:
        if _numba_internals.pool_started() is not False:  # running, or cannot be known
            started = True
            return
        spin = _chosen_spin_count()
        if spin is not None:
            os.environ["GOMP_SPINCOUNT"] = spin
        try:
            _numba_internals.start_thread_pool()
        except Exception:  # noqa: BLE001 - no usable layer: Numba says why at the first kernel
            pass
        finally:
            if spin is not None:
                os.environ.pop("GOMP_SPINCOUNT", None)
        started = True
        if spin is not None and numba.threading_layer() == "omp":
            _spin_set = spin


def set_num_threads(n: int) -> None:
    """Use ``n`` threads for numbapos's parallel CPU kernels, from the calling thread.

    Numba's thread count is per calling thread (a thread that never calls
    this uses all of them); ``n`` may not exceed the pool's size,
    ``NUMBA_NUM_THREADS`` (by default the number of cores), which is fixed
    once the pool starts. Results are identical for every ``n``.

    Raises
    ------
    TypeError
        ``n`` is not an integer.
    ValueError
        ``n`` is not in ``[1, NUMBA_NUM_THREADS]``.
    """
    if isinstance(n, bool) or not isinstance(n, int | np.integer):
        raise TypeError(f"n: expected an integer number of threads, got {type(n).__name__}")
    limit = numba.config.NUMBA_NUM_THREADS
    if not 1 <= int(n) <= limit:
        raise ValueError(f"n: expected 1 <= n <= {limit} (NUMBA_NUM_THREADS, the pool's size), "
                         f"got {int(n)}")
    start_pool()
    numba.set_num_threads(int(n))
    _local.cap = _local.applied = int(n)
    _local.window = None  # the next launch looks at the free cores again


def get_num_threads() -> int:
    """Threads the calling thread's parallel kernels use (see :func:`set_num_threads`).

    Starts the pool (:func:`start_pool`) if it is not running yet, as Numba's
    own ``numba.get_num_threads`` would, but with numbapos's wait policy.
    """
    start_pool()
    return numba.get_num_threads()


def pool_settings() -> dict:
    """How the pool runs: ``{"layer", "threads", "pool_size", "wait"}``.

    Starts the pool if it is not running yet. ``wait`` describes the
    idle-thread policy: numbapos's bounded spin, the user's
    ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT``, or the layer's own.
    """
    start_pool()
    try:
        layer = numba.threading_layer()
    except ValueError:  # not started yet (NUMBAPOS_NUMBA_INTERNALS=0: the first kernel starts it)
        layer = "not started yet"
    if _spin_set is not None:
        how = "sleep at once" if _spin_set == "0" else f"spin {_spin_set} iterations, then sleep"
        wait = f"{how} (GOMP_SPINCOUNT={_spin_set} set by numbapos)"
    elif layer == "omp" and any(os.environ.get(n) for n in _USER_CHOICES):
        wait = ", ".join(f"{n}={os.environ[n]}" for n in _USER_CHOICES if os.environ.get(n))
    else:
        wait = "the threading layer's default"
    return {"layer": layer, "threads": numba.get_num_threads(),
            "pool_size": numba.config.NUMBA_NUM_THREADS, "wait": wait}


# --- Busy cores ----------------------------------------------------------------------

#: Seconds over which the other processes' use of this process's cores is measured
#: (and how often, at most, the launchers look at it).
LOAD_WINDOW_S = 0.1
# Threads a launcher may use when the others use ``busy`` cores of ``cores``: the free
# cores, rounded down unless nearly whole (a neighbour using a third of a core already
# holds a thread of a static schedule back by a time slice now and then).
_SPARE = 0.25

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_local = threading.local()  # per calling thread: cap (its own thread count), applied, window
_load_lock = threading.Lock()
_last: tuple | None = None  # (monotonic s, busy s on our cores, own CPU s) of the last look
_free: int | None = None  # threads the others leave us (None: not known yet)
_window = 0  # counts the looks, so each calling thread applies a new answer once


def _cores() -> set[int]:
    try:
        return os.sched_getaffinity(0)
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _sample() -> tuple | None:
    """(now, CPU seconds all processes used on our cores, CPU seconds this process used)."""
    import resource

    cores = _cores()
    busy = 0
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if not line.startswith(b"cpu"):
                    break
                fields = line.split()
                if fields[0] == b"cpu" or int(fields[0][3:]) not in cores:
                    continue
                # user nice system idle iowait irq softirq: all but idle and iowait
                busy += sum(int(v) for v in fields[1:4]) + int(fields[6]) + int(fields[7])
    except (OSError, ValueError, IndexError):
        return None
    own = resource.getrusage(resource.RUSAGE_SELF)
    return time.monotonic(), busy / _TICK, own.ru_utime + own.ru_stime


def _free_threads(previous: tuple, now: tuple, cores: int) -> int:
    """Threads the other processes left free between two samples (at least 1)."""
    seconds = now[0] - previous[0]
    others = max(0.0, (now[1] - previous[1]) - (now[2] - previous[2])) / seconds
    return max(1, min(cores, int(cores - others + _SPARE)))


def _look() -> None:
    """Measure the other processes' load if the window has passed (one thread at a time)."""
    global _last, _free, _window
    if not _load_lock.acquire(blocking=False):
        return
    try:
        if _last is not None and time.monotonic() - _last[0] < LOAD_WINDOW_S:
            return
        now = _sample()
        if now is None:  # no /proc/stat: the pool's count; look no more often than this
            _free, now = None, (time.monotonic(), None, None)
        elif _last is not None and _last[1] is not None and now[0] > _last[0]:
            _free = _free_threads(_last, now, len(_cores()))
        _last = now
        _window += 1
    finally:
        _load_lock.release()


def usable_threads() -> int:
    """Threads the calling thread's next parallel kernel should use (1: run the serial one).

    With config's ``adaptive_threads`` on (the default), the cores of this
    process that the other processes left free over the last
    :data:`LOAD_WINDOW_S`, at most the calling thread's own count
    (:func:`set_num_threads`); Numba's count for the calling thread is set to
    it when above 1. Off, or where ``/proc/stat`` is missing, the calling
    thread's own count. Call after :func:`start_pool`.
    """
    if not config.get("adaptive_threads"):
        return _restore()
    if _last is None or time.monotonic() - _last[0] >= LOAD_WINDOW_S:
        _look()
    if getattr(_local, "window", None) == _window:
        return _local.want
    current = numba.get_num_threads()
    if getattr(_local, "applied", None) != current:  # first look, or numba's count was set
        _local.cap = current
    want = _local.cap if _free is None else max(1, min(_local.cap, _free))
    if want > 1 and want != current:  # (1: the launcher runs the serial kernel instead)
        numba.set_num_threads(want)
        current = want
    _local.applied, _local.want, _local.window = current, want, _window
    return want


def _restore() -> int:
    """Adaptive threads off: the calling thread's own count again."""
    if getattr(_local, "window", None) is not None:
        _local.window = None
        if numba.get_num_threads() != _local.cap:
            numba.set_num_threads(_local.cap)
        _local.applied = _local.cap
    return numba.get_num_threads()
