"""Fast first calls: parallel kernels missing from the cache compile in a background thread.

A parallel (``prange``) kernel takes two to four times as long to compile as
the same loop serial: Numba's parfor passes, and LLVM optimising the loop body
twice (once in the kernel, once in the gufunc that runs it on the threads).
On a cold cache the first sparse training step at V = 50,000, D = 768 spent
3.2 of its 3.6 s compiling, 2.8 s of that in its three parallel kernels (AMD
EPYC VM); with this module the step takes 1.8 s.

The launchers that choose by size between a serial kernel and a parallel
twin taking the same arguments do so through :func:`.arrays.pick`, and the
twins compute the same bits (``tests/test_background_compile.py`` runs every
such pair both ways). (The fused row-group updates, whose two kernels take
scratch of different shapes, and the always-parallel max-norm clipping
compile as Numba does by itself.) So when a call needs a parallel kernel that
is neither compiled in this process nor in Numba's on-disk cache, this module
runs its serial twin for that call (compiling that, which is quick) and queues
the parallel kernel for one background thread. The thread waits until the
calling threads have compiled nothing for :data:`QUIET_SECONDS` (a step's own
first compilations go first), compiles the kernel, and Numba writes it to the
cache; from then on calls run it. With a warm cache nothing changes: the
parallel kernel is loaded at its first call, as before.

``NUMBAPOS_BACKGROUND_COMPILE=0`` (:mod:`numbapos.config`'s
``background_compile``) turns this off (every kernel compiles in the
calling thread when first needed); ``python -m numbapos warmup`` compiles in
the foreground either way, and :func:`wait` blocks until the queue is empty.

Safety:

- ``os.fork`` waits for a background compilation in progress (it takes
  Numba's compiler lock first), so a child process never inherits a lock that
  no thread of it will release; the child starts with an empty queue.
- At interpreter exit the thread finishes the kernel it is compiling (so the
  cache gets it) and takes no other.
- It replaces one private method of Numba's dispatchers, so it is active only
  on the Numba versions it is tested with (:data:`NUMBA_VERSIONS`, the bounds
  of the ``numba`` requirement); on any other version every kernel compiles as
  Numba does by itself.
- Any failure to compile in the background (or a Numba whose internals this
  module does not know) leaves the kernel to be compiled in the foreground at
  its next call, which raises as it would have.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections import deque
from contextlib import contextmanager

import numba
from numba.core import event
from numba.core.compiler_lock import global_compiler_lock

from ... import config

__all__ = ["ENV", "NUMBA_VERSIONS", "QUIET_SECONDS", "enabled", "foreground", "install",
           "installed", "numba_supported", "pending", "wait"]

# How long the calling threads must have compiled nothing before the background
# thread starts a kernel: long enough to span the gaps between the first
# compilations of one training step, short against a parallel compilation (0.3-1.3 s).
QUIET_SECONDS = 0.1

ENV = config.SETTINGS["background_compile"].variable

# The Numba minor versions whose dispatcher internals this module is tested with
# (first, last), the bounds of pyproject.toml's numba requirement.
NUMBA_VERSIONS = ((0, 59), (0, 68))


def numba_supported(version: str | None = None) -> bool:
    """Whether the installed (or given) Numba is one this module may patch."""
    parts = (version or numba.__version__).split(".")
    try:
        minor = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return False
    return NUMBA_VERSIONS[0] <= minor <= NUMBA_VERSIONS[1]


_cv = threading.Condition()
_queue: deque = deque()  # (parallel dispatcher, argument types), oldest first
_pending: set = set()
_failed: set = set()
_worker: threading.Thread | None = None
_stopping = False
_foreground_depth = 0  # foreground() nesting
_compiling = 0  # compilations in progress in threads other than the worker
_last_compile_end = 0.0
installed: set = set()  # ids of the parallel dispatchers hooked
_hooks_registered = False


def enabled() -> bool:
    """Whether parallel kernels missing from the cache compile in the background now.

    Raises
    ------
    ValueError
        ``NUMBAPOS_BACKGROUND_COMPILE`` is set to something other than 0 or 1.
    """
    return config.get("background_compile") and _foreground_depth == 0


@contextmanager
def foreground():
    """Within this block, kernels compile in the calling thread (as for the warm-up)."""
    global _foreground_depth
    with _cv:
        _foreground_depth += 1
    try:
        yield
    finally:
        with _cv:
            _foreground_depth -= 1


def pending() -> int:
    """How many parallel kernels are queued or compiling in the background."""
    with _cv:
        return len(_queue)


def wait(timeout: float | None = None) -> bool:
    """Block until no parallel kernel is queued or compiling; False if ``timeout`` ran out."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _cv:
        while _queue:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            _cv.wait(left)
    return True


def install(serial, parallel) -> None:
    """Let ``parallel``'s first call for new argument types run ``serial`` meanwhile.

    Replaces the ``parallel`` dispatcher's compile-on-miss method, which Numba
    calls only when no compiled version matches the arguments: calls that
    match one cost nothing more. Idempotent.
    """
    with _cv:  # two threads' first calls must not wrap the hook in another
        if id(parallel) in installed:
            return
        installed.add(id(parallel))
        # Numba's C dispatcher looks this method up on the instance at each miss.
        compile_here = getattr(parallel, "_compile_for_args", None)
        if compile_here is None or not numba_supported():  # compile as Numba does
            return
        parallel._compile_for_args = _hook(serial, parallel, compile_here)


def _hook(serial, parallel, compile_here):
    """``parallel``'s compile-on-miss method; ``compile_here`` is Numba's own."""

    def compile_for_args(*args, **kws):
        """Return what runs this call: the parallel kernel when ready, else ``serial``."""
        if kws or not enabled():
            return compile_here(*args, **kws)
        try:
            key = (parallel, tuple(parallel.typeof_pyval(a) for a in args))
        except Exception:  # noqa: BLE001 - untypable: Numba's own path explains why
            return compile_here(*args)
        with _cv:
            if key in _pending:
                return serial
            if key in _failed:
                return compile_here(*args)
        loaded = _load_cached(*key)
        if loaded is None:
            return compile_here(*args)
        if loaded:
            return parallel
        _submit(key)
        return serial

    return compile_for_args


def _load_cached(dispatcher, argtypes):
    """Load ``dispatcher``'s version for ``argtypes`` from the disk cache, as Numba's compile does.

    True when it is now compiled, False when the cache lacks it or the
    background thread holds Numba's compiler lock (it then loads or compiles
    the kernel itself: a calling thread never waits for it here), None when
    this Numba's internals are not the ones expected (compile in the foreground).
    """
    try:
        lock = global_compiler_lock._lock
        if not lock.acquire(False):
            return False
        try:
            if argtypes in dispatcher.overloads:
                return True
            cres = dispatcher._cache.load_overload(argtypes, dispatcher.targetctx)
            if cres is None:
                return False
            dispatcher.targetctx.insert_user_function(cres.entry_point, cres.fndesc,
                                                      [cres.library])
            dispatcher.add_overload(cres)
            dispatcher._cache_hits[argtypes] += 1
            return True
        finally:
            lock.release()
    except AttributeError:
        return None


def _submit(key) -> None:
    global _worker, _last_compile_end
    with _cv:
        if key in _pending:
            return
        _register_hooks()
        # The caller is about to compile the serial twin: count the quiet time from
        # now, or the worker could take Numba's lock first and make the caller wait.
        _last_compile_end = time.monotonic()
        _pending.add(key)
        _queue.append(key)
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(target=_work, name="numbapos-compile", daemon=True)
            _worker.start()
        _cv.notify_all()


def _work() -> None:
    global _worker
    while True:
        with _cv:
            if _stopping:
                return
            if not _queue:  # done: no thread lingers (a later fork then sees one thread)
                _worker = None
                return
            dispatcher, argtypes = key = _queue[0]
            # Let the calling threads finish the compilations their step needs first.
            while not _stopping and (_compiling or
                                     time.monotonic() - _last_compile_end < QUIET_SECONDS):
                _cv.wait(QUIET_SECONDS)
            if _stopping:
                return
        try:
            dispatcher.compile(argtypes)
        except Exception:  # noqa: BLE001 - the foreground compiles it again and raises
            with _cv:
                _failed.add(key)
        with _cv:
            _queue.popleft()
            _pending.discard(key)
            _cv.notify_all()


class _ForegroundCompiles(event.Listener):
    """Counts the compilations of threads other than the worker (Numba's compile events)."""

    def on_start(self, ev):
        global _compiling
        if threading.current_thread() is not _worker:
            with _cv:
                _compiling += 1

    def on_end(self, ev):
        global _compiling, _last_compile_end
        if threading.current_thread() is not _worker:
            with _cv:
                _compiling = max(0, _compiling - 1)
                _last_compile_end = time.monotonic()


def _register_hooks() -> None:
    """Once, before the first background compilation: compile events, fork and exit handlers."""
    global _hooks_registered
    if _hooks_registered:
        return
    _hooks_registered = True
    event.register("numba:compile", _ForegroundCompiles())
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
    atexit.register(_stop)


def _before_fork() -> None:
    # Numba's lock first (the worker holds it while compiling, never while holding _cv).
    global_compiler_lock.acquire()
    _cv.acquire()


def _after_fork_in_parent() -> None:
    _cv.release()
    global_compiler_lock.release()


def _after_fork_in_child() -> None:
    global _cv, _queue, _pending, _worker, _compiling, _stopping
    # The worker does not exist here: start over with fresh state (and a fresh condition,
    # as the parent's is held by this thread in a copy no other thread can wake).
    _cv = threading.Condition()
    _queue, _pending, _worker, _compiling, _stopping = deque(), set(), None, 0, False
    global_compiler_lock.release()


def _stop() -> None:
    """At exit: let the worker finish the kernel it is compiling, then end it."""
    global _stopping
    with _cv:
        _stopping = True
        _cv.notify_all()
        worker = _worker
    if worker is not None and worker is not threading.current_thread():
        worker.join()
