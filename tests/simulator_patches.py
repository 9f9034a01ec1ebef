"""Two changes to Numba's CUDA simulator (numba-cuda) that the tests install (conftest.py).

The simulator runs every CUDA thread of a block as a Python thread: it starts one
``threading.Thread`` per CUDA thread (about 100 us each) and then polls them from
the launching thread in a busy loop until they finish, which takes the GIL from
the threads doing the work. That was about 40 % of the suite's time.

- :func:`install_sequential_blocks`: a kernel that has no barrier anywhere in its
  code (no ``syncthreads``, warp or grid synchronisation, found by
  :func:`uses_barriers`) runs its block's threads one after another in the
  launching thread. Without a barrier CUDA guarantees no order or overlap between
  a block's threads, so running them in turn is one of the schedules a GPU may
  use. A kernel that does synchronise runs as before, one Python thread per CUDA
  thread, but the threads wait at a barrier (a condition variable) instead of
  being polled. A barrier reached in a kernel judged barrier-free (a call the
  scan cannot see) raises ``RuntimeError`` rather than deadlocking or running
  unsynchronised.
- :func:`install_atomic_shared_arrays`: a race in ``cuda.shared.array`` fixed.
"""

import sys
import threading
import types

import numpy as np

# A name containing one of these marks code that synchronises threads: syncthreads
# (and _count/_and/_or), syncwarp, the shfl/ballot/match warp functions, activemask,
# lanemask and cooperative groups' grid sync.
_BARRIER_WORDS = ("sync", "shfl", "ballot", "activemask", "lanemask", "match_", "this_grid")

_barrier_scans: dict = {}


def _code_names(code):
    """Every name a code object and the code nested in it (lambdas, inner functions) uses."""
    yield from code.co_names
    yield from code.co_freevars
    yield from code.co_cellvars
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _code_names(const)


def _python_function(obj):
    """The Python function behind a kernel, device function or jitted function, if any."""
    if isinstance(obj, types.FunctionType):
        return obj
    for attribute in ("py_func", "fn"):
        inner = getattr(obj, attribute, None)
        if isinstance(inner, types.FunctionType):
            return inner
    return None


def _referenced(function):
    """The objects a function can call: its globals by the names it uses, and its closure."""
    for cell in function.__closure__ or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            pass
    for name in _code_names(function.__code__):
        if name in function.__globals__:
            yield function.__globals__[name]


def uses_barriers(kernel_function) -> bool:
    """Whether a kernel's code, or code it reaches through the functions it calls (by
    global name or closure, device functions included), names a synchronising call."""
    cached = _barrier_scans.get(kernel_function)
    if cached is not None:
        return cached
    found, pending, seen = False, [kernel_function], set()
    while pending and not found:
        function = pending.pop()
        if function in seen:
            continue
        seen.add(function)
        if any(word in name for name in _code_names(function.__code__)
               for word in _BARRIER_WORDS):
            found = True
        for obj in _referenced(function):
            callee = None if isinstance(obj, types.ModuleType) else _python_function(obj)
            if callee is not None:
                pending.append(callee)
    _barrier_scans[kernel_function] = found
    return found


def _located(error, thread_idx, block_idx):
    """``error`` retyped with the thread and block in its message, as the simulator does."""
    where = f"tid={list(thread_idx)} ctaid={list(block_idx)}"
    return type(error)(where if str(error) == "" else f"{where}: {error}")


class _SequentialThread:
    """What ``threading.current_thread()`` gives the simulator's kernel API while a
    barrier-free block runs its threads in turn: the current CUDA thread's indices."""

    def __init__(self, block_idx):
        self.blockIdx = block_idx
        self.threadIdx = None
        self.thread_id = 0

    def syncthreads(self, *_):
        raise RuntimeError(
            "simulator: a kernel judged barrier-free (tests/simulator_patches.py) reached "
            "a barrier; add the call's name to _BARRIER_WORDS")

    syncthreads_count = syncthreads_and = syncthreads_or = syncthreads


class _Barrier:
    """The state a block's threads share: how many run, how many wait at the barrier."""

    def __init__(self, threads):
        self.condition = threading.Condition(threading.Lock())
        self.running = threads
        self.waiting = 0
        self.generation = 0
        self.error = None  # (exception, traceback) of the first thread that raised

    def release_if_all_wait(self):
        # Threads that have returned take no part, as in the simulator and on a GPU.
        if self.running and self.waiting == self.running:
            self.waiting = 0
            self.generation += 1
            self.condition.notify_all()


def install_sequential_blocks():
    """Run barrier-free blocks in the launching thread and wait at barriers without polling."""
    from numba.cuda.simulator import kernel as sim_kernel
    from numba.cuda.simulator import kernelapi

    current = threading.local()

    class ThreadingSeenByKernels:
        # The kernel API asks threading.current_thread() for the CUDA thread's
        # indices: a sequential block answers with its _SequentialThread.
        def __getattr__(self, name):
            return getattr(threading, name)

        def current_thread(self):
            sequential = getattr(current, "thread", None)
            return sequential if sequential is not None else threading.current_thread()

    kernelapi.threading = ThreadingSeenByKernels()

    class BlockThread(sim_kernel.BlockThread):
        def __init__(self, target, manager, block_idx, thread_idx, debug, barrier):
            super().__init__(target, manager, block_idx, thread_idx, debug)
            self._barrier = barrier

        def run(self):
            barrier = self._barrier
            try:
                threading.Thread.run(self)
            except Exception as error:
                self.exception = (_located(error, self.threadIdx, self.blockIdx),
                                  sys.exc_info()[2])
            with barrier.condition:
                barrier.running -= 1
                if self.exception is not None and barrier.error is None:
                    barrier.error = self.exception
                    barrier.condition.notify_all()  # the waiting threads abort
                else:
                    barrier.release_if_all_wait()

        def syncthreads(self):
            barrier = self._barrier
            with barrier.condition:
                if barrier.error is not None:
                    raise RuntimeError("abort flag set on syncthreads call")
                generation = barrier.generation
                barrier.waiting += 1
                barrier.release_if_all_wait()
                while barrier.generation == generation and barrier.error is None:
                    barrier.condition.wait()
                if barrier.error is not None:
                    raise RuntimeError("abort flag set on syncthreads clear")

    def run_threads(manager, grid_point, args):
        points = list(np.ndindex(*manager._block_dim))
        barrier = _Barrier(len(points))

        def target():
            manager._f(*args)

        threads = [BlockThread(target, manager, grid_point, point, manager._debug, barrier)
                   for point in points]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if barrier.error is not None:
            raise barrier.error[0].with_traceback(barrier.error[1])

    def run_in_turn(manager, grid_point, args):
        dim_x, dim_y, _ = manager._block_dim
        thread = _SequentialThread(kernelapi.Dim3(*grid_point))
        outer, current.thread = getattr(current, "thread", None), thread
        error = None
        try:
            with np.errstate(divide="raise") if manager._debug else np.errstate():
                for x, y, z in np.ndindex(*manager._block_dim):
                    thread.threadIdx = kernelapi.Dim3(x, y, z)
                    thread.thread_id = x + dim_x * (y + dim_y * z)
                    try:
                        manager._f(*args)
                    except Exception as raised:
                        error = (_located(raised, thread.threadIdx, thread.blockIdx),
                                 sys.exc_info()[2])
                        break
        finally:
            current.thread = outer
        if error is not None:
            raise error[0].with_traceback(error[1])

    def run(self, grid_point, *args):
        if uses_barriers(self._f):
            run_threads(self, grid_point, args)
        else:
            run_in_turn(self, grid_point, args)

    sim_kernel.BlockManager.original_run = sim_kernel.BlockManager.run
    sim_kernel.BlockManager.run = run


def install_atomic_shared_arrays():
    """Work around a race in Numba's CUDA simulator (numba-cuda's ``FakeCUDAShared.array``).

    The simulator gives a block's ``cuda.shared.array`` to the first of its threads
    that asks (a dict get, then a separate set): a thread switch in between hands
    two threads of one block different arrays, and a tree reduction over them
    returns garbage for that block (seen as one wrong LayerNorm row now and then).
    ``dict.setdefault`` does both steps at once. Arrays stay identified by the
    line that asks for them, as in the original; dynamic shared memory (shape 0)
    keeps the original code.
    """
    from numba.core import types as numba_types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support

    original = kernelapi.FakeCUDAShared.array

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:
            return original(self, shape, dtype, alignment)
        if isinstance(dtype, numba_types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        return self._allocations.setdefault(key, np.empty(shape, dtype))

    kernelapi.FakeCUDAShared.array = array


def install():
    """Both changes; a no-op where numba-cuda is missing (no CUDA test runs then)."""
    try:
        import numba.cuda.simulator.kernel  # noqa: F401
    except ImportError:
        return
    install_atomic_shared_arrays()
    install_sequential_blocks()
