"""A minimal memory manager plugin for Numba, neither Numba's own nor numbapos's pool.

Selected with ``NUMBA_CUDA_MEMORY_MANAGER=capture_manager`` (capture_checks.py runs
numbapos's captured steps under it, on the stub driver): every device array gets a
block of its own from ``cuMemAlloc``, given back with ``cuMemFree`` when the array
goes, or once cleanup is no longer deferred (``defer_cleanup``, as the EMM plugin
interface asks). ``ALLOCATIONS`` counts the blocks it handed out; ``CAPTURED`` maps
each block handed out while a stream captured (the stub driver's ``capturing``) to
whether it has been freed since.
"""

from __future__ import annotations

import contextlib
import weakref

from numba.cuda.cudadrv.driver import (
    HostOnlyCUDAMemoryManager,
    MemoryInfo,
    MemoryPointer,
    driver,
)

ALLOCATIONS = [0]
CAPTURED: dict = {}


def _capturing() -> bool:
    from stub import counters

    return counters()["capturing"] > 0


class PlainMemoryManager(HostOnlyCUDAMemoryManager):
    """``cuMemAlloc`` per array, ``cuMemFree`` when it dies (later while deferred)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._deferring = 0
        self._pending = []

    def initialize(self):
        pass

    def memalloc(self, size):
        pointer = driver.cuMemAlloc(size)
        ALLOCATIONS[0] += 1
        if _capturing():
            CAPTURED[int(pointer)] = False

        def free():
            if self._deferring:
                self._pending.append(pointer)
            else:
                self._free(pointer)

        return MemoryPointer(weakref.proxy(self.context), pointer, size, finalizer=free)

    @contextlib.contextmanager
    def defer_cleanup(self):
        self._deferring += 1
        try:
            with super().defer_cleanup():
                yield
        finally:
            self._deferring -= 1
        while not self._deferring and self._pending:
            self._free(self._pending.pop())

    @staticmethod
    def _free(pointer):
        driver.cuMemFree(pointer)
        if int(pointer) in CAPTURED:
            CAPTURED[int(pointer)] = True

    def get_memory_info(self):
        free, total = driver.cuMemGetInfo()
        return MemoryInfo(free=free, total=total)

    def get_ipc_handle(self, memory):
        raise NotImplementedError("no IPC in this test plugin")

    @property
    def interface_version(self):
        return 1


_numba_memory_manager = PlainMemoryManager
