"""A caching allocator for Numba's device arrays (an EMM plugin), as PyTorch and CuPy use.

Numba's default memory manager calls ``cuMemAlloc`` for every device array and
frees it (with a device synchronisation) soon after it dies: a few hundred
microseconds per allocation, more than most embedding kernels take. This
manager keeps freed blocks in size buckets and hands them out again, so a
training loop that allocates the same shapes every step stops calling the
driver after its first step.

**Streams.** Freed blocks are kept per stream (:class:`StreamPools`): a
block goes back to the pool of the stream that was current (numbapos's
:func:`numbapos.cuda.stream`, see :mod:`.streams`) when it was allocated, and
is handed out again only to an allocation made while that stream is current.
Work on one stream runs in order, so whatever gets a recycled block runs after
every kernel that used it before; a block is never handed to another stream
whose work might overtake the old user's. As with PyTorch's allocator, an
array used on a stream other than its own must be kept alive (or that stream
synchronised) until the work there is done. While a step is captured
(:mod:`.graphs`) allocations are served from the blocks the warm-up left
cached on the capture's stream; on a miss the block comes from the driver,
with this thread's capture mode relaxed around the ``cuMemAlloc`` (the
pattern CUDA documents for ``cuThreadExchangeStreamCaptureMode``, and what
PyTorch's allocator does): the capture's ``thread_local`` mode refuses that
call otherwise. A step's first warm-up leaves fewer blocks cached than the
next step needs whenever arrays of one step live on into the next (a
forward's saved inputs, last step's outputs). Every block handed out while
capturing belongs to the capture from then on (:class:`.streams.Capture`):
the graph writes it on every replay, so it is never recycled for other work.
Under any other memory manager a capture still works (:func:`prepare_capture`):
each allocation while capturing is the manager's own, made with the capture
mode relaxed, and kept by the capture.

Sizes are rounded up to 512 bytes below 1 MiB and to an eighth of the next
power of two above, so a block serves requests of nearly the same size. On
an out-of-memory error the cache is emptied and the allocation retried once.

It is installed when the CUDA backend is first used (``_device.kernels_for``
calls :func:`install` once, before any launch), only if Numba has
made no CUDA context yet, the user has not chosen another manager
(``NUMBA_CUDA_MEMORY_MANAGER``) and ``NUMBAPOS_CUDA_MEMORY_POOL`` is not
``0``. :func:`empty_cache` gives the cached blocks back to the driver.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import defaultdict

from numba import config, cuda

from .. import config as settings
from . import streams

__all__ = []  # not launchers

SMALL = 1 << 20
ALIGN = 512


def bucket_size(size: int) -> int:
    """The size of the block that serves a request of ``size`` bytes."""
    if size <= SMALL:
        return max(ALIGN, -(-size // ALIGN) * ALIGN)
    step = 1 << (size.bit_length() - 3)
    return -(-size // step) * step


class StreamPools:
    """Freed blocks by (stream, size bucket): a block is only reused on its own stream."""

    def __init__(self):
        self._free = defaultdict(list)
        self._lock = threading.Lock()

    def take(self, stream: int, bucket: int):
        """A cached block of ``bucket`` bytes freed on ``stream``, or None."""
        with self._lock:
            blocks = self._free.get((stream, bucket))
            return blocks.pop() if blocks else None

    def give(self, stream: int, bucket: int, block) -> None:
        """Keep ``block`` for the next allocation of ``bucket`` bytes on ``stream``."""
        with self._lock:
            self._free[stream, bucket].append(block)

    def clear(self) -> None:
        """Forget every cached block."""
        with self._lock:
            self._free.clear()

    def cached(self) -> int:
        """How many blocks are cached."""
        with self._lock:
            return sum(len(blocks) for blocks in self._free.values())


def _manager_class():
    """The plugin class, built on Numba's own manager (None if its internals moved)."""
    try:
        from numba.cuda.cudadrv.driver import (
            CudaAPIError,
            MemoryPointer,
            NumbaCUDAMemoryManager,
            binding,
        )
    except ImportError:
        return None

    out_of_memory = binding.CUresult.CUDA_ERROR_OUT_OF_MEMORY

    class CachingMemoryManager(NumbaCUDAMemoryManager):
        """Numba's manager with freed device blocks cached per stream and size bucket."""

        serves_captures = True  # its memalloc serves a capture itself (prepare_capture)

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.pools = StreamPools()
            self._context_proxy = None  # weakref.proxy(self.context), made once

        def memalloc(self, size):
            bucket = bucket_size(size)
            capture = streams.capturing()
            if capture is not None:
                return self._capture_alloc(capture, size, bucket)
            stream = streams.handle(streams.current())
            block = self.pools.take(stream, bucket)
            if block is None:
                try:
                    block = super().memalloc(bucket)
                except CudaAPIError as err:
                    if err.code != out_of_memory:
                        raise
                    self.empty_cache()
                    block = super().memalloc(bucket)
            proxy = self._context_proxy
            if proxy is None:
                proxy = self._context_proxy = weakref.proxy(self.context)
            return MemoryPointer(proxy, block.device_pointer, size,
                                 finalizer=functools.partial(self.pools.give, stream, bucket,
                                                             block))

        def _capture_alloc(self, capture, size, bucket):
            # The capture's own freed blocks first, then those its warm-up left cached.
            block = capture.take(bucket)
            if block is None:
                block = self.pools.take(streams.handle(capture.home), bucket)
            if block is None:
                with streams.relaxed_capture_mode():
                    block = super().memalloc(bucket)

            def give_back():
                capture.give(bucket, block)  # the graph's from now on (see streams.Capture)

            return MemoryPointer(weakref.proxy(self.context), block.device_pointer, size,
                                 finalizer=give_back)

        def empty_cache(self):
            """Drop the cached blocks; Numba's own finalizers free them."""
            self.pools.clear()
            self.deallocations.clear()

        def reset(self):
            self.empty_cache()
            super().reset()

    return CachingMemoryManager


def install() -> bool:
    """Make the caching manager Numba's memory manager, where that is still possible."""
    if config.ENABLE_CUDASIM or not settings.get("cuda_memory_pool"):
        return False
    if config.CUDA_MEMORY_MANAGER != "default":
        return False  # the user chose a manager (RMM, ...)
    from numba.cuda.cudadrv import driver

    if getattr(driver, "_memory_manager", True) is not None:
        return False  # a context exists already and keeps the manager it was made with
    manager = _manager_class()
    if manager is None:
        return False
    cuda.set_memory_manager(manager)
    return True


_prepare_lock = threading.Lock()


def prepare_capture() -> None:
    """Make the current context's device allocations capturable, whatever its manager.

    numbapos's pool serves a capture itself (above). Any other manager (Numba's
    own, where ``NUMBAPOS_CUDA_MEMORY_POOL=0`` or Numba made the context before
    numbapos could install the pool, or a ``NUMBA_CUDA_MEMORY_MANAGER`` plugin)
    calls the driver from the capturing thread, and ``cuMemAlloc`` is refused
    there (``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED``, which also invalidates the
    capture). So the context's ``memalloc``, through which Numba and numbapos
    make every device array, is wrapped, once per context: an allocation made
    while this thread captures runs with the thread's capture mode relaxed, and
    the capture keeps what it returns (:attr:`.streams.Capture.kept`), since the
    graph uses that memory on every replay and the manager must not hand it to
    other work meanwhile. Other threads, and this one when not capturing, get
    the manager's ``memalloc`` as before.
    """
    if streams.SIMULATED:
        return
    context = cuda.current_context()
    if getattr(context.memory_manager, "serves_captures", False):
        return
    with _prepare_lock:
        if getattr(vars(context).get("memalloc"), "serves_captures", False):
            return
        allocate = context.memalloc  # the manager's (or whoever wrapped it before)

        def memalloc(size):
            capture = streams.capturing()
            if capture is None:
                return allocate(size)
            with streams.relaxed_capture_mode():
                memory = allocate(size)
            capture.kept.append(memory)
            return memory

        memalloc.serves_captures = True
        context.memalloc = memalloc  # shadows Context.memalloc on this context only


def empty_cache() -> None:
    """Give the device blocks cached by this allocator back to the driver."""
    if config.ENABLE_CUDASIM:
        return
    from . import plans

    plans.clear()  # their workspaces go back to the pool first
    manager = cuda.current_context().memory_manager
    if hasattr(manager, "empty_cache"):
        manager.empty_cache()
