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

import threading
import weakref

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
    """Freed blocks by (stream, size bucket): a block is only reused on its own stream.

    No lock: a block is given back from an array's ``__del__``, which garbage
    collection may run in the middle of ``take`` or ``give`` on the same
    thread, and each step here (``dict.get`` / ``setdefault``, ``list.pop`` /
    ``append``) is a single operation that is atomic in CPython and
    thread-safe in its free-threaded build.
    """

    def __init__(self):
        self._free: dict = {}

    def take(self, stream: int, bucket: int):
        """A cached block of ``bucket`` bytes freed on ``stream``, or None."""
        blocks = self._free.get((stream, bucket))
        if blocks:
            try:
                return blocks.pop()
            except IndexError:  # another thread took the last one meanwhile
                pass
        return None

    def give(self, stream: int, bucket: int, block) -> None:
        """Keep ``block`` for the next allocation of ``bucket`` bytes on ``stream``."""
        blocks = self._free.get((stream, bucket))
        if blocks is None:
            blocks = self._free.setdefault((stream, bucket), [])
        blocks.append(block)

    def clear(self) -> None:
        """Forget every cached block."""
        self._free.clear()

    def cached(self) -> int:
        """How many blocks are cached."""
        return sum(len(blocks) for blocks in list(self._free.values()))


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

    class Lent(MemoryPointer):
        """A pool block lent to its user: given back when this object dies.

        Not Numba's ``weakref.finalize`` per allocation (about 3 us of the host
        time of every op that allocates) but ``__del__``, which is safe here
        because the block itself never depends on when this object is
        collected: while lent it stays referenced by its manager's ``lent``
        registry, so garbage collection can never run the block's own
        finalizer (which frees its device memory) first, whatever the order
        in which it finalises a cycle holding this object. ``free()`` does
        nothing (``is_managed`` is false): the block goes back when the last
        array or view holding it dies, as PyTorch's tensors do.
        """

        def __del__(self):
            try:
                home, entry, give, key = self._numbapos_lent
                if home.pop(id(entry), None) is not None:
                    give(*key, entry)
            except Exception:  # noqa: BLE001 - interpreter shutdown: nothing to give back to
                pass

    handle = binding.CUdeviceptr(0)
    fields = vars(MemoryPointer(None, handle, 0))
    # Lent objects are made by setting these attributes directly, where Numba's
    # constructor sets exactly these (checked once); else through the constructor.
    direct = fields == {"context": None, "device_pointer": handle, "size": 0,
                        "_cuda_memsize_": 0, "is_managed": False, "refct": 1,
                        "handle": handle, "_owner": None}

    class CachingMemoryManager(NumbaCUDAMemoryManager):
        """Numba's manager with freed device blocks cached per stream and size bucket.

        A block is an ``(owner, handle)`` entry: ``owner`` is what Numba's own
        ``memalloc`` returned (its finalizer frees the memory when the manager
        lets go of it), ``handle`` its device pointer. Every block is always
        either cached in ``pools`` (or a capture's pool) or lent (``lent``, by
        ``id``), so only :meth:`empty_cache` and :meth:`reset` ever free one.
        """

        serves_captures = True  # its memalloc serves a capture itself (prepare_capture)

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.pools = StreamPools()
            self.lent: dict = {}
            self._context_proxy = None  # weakref.proxy(self.context), made once

        def memalloc(self, size):
            bucket = bucket_size(size)
            local = streams._local  # streams.capturing() and .current(), read directly
            if local.capture is not None:
                return self._capture_alloc(local.capture, size, bucket)
            stream = local.stream and streams.handle(local.stream)
            entry = self.pools.take(stream, bucket)
            if entry is None:
                entry = self._fresh(bucket, out_of_memory)
            return self._lend(entry, size, self.pools.give, (stream, bucket))

        def _fresh(self, bucket, retry_on=None):
            """A new ``(owner, handle)`` block of ``bucket`` bytes from the driver."""
            try:
                owner = super().memalloc(bucket)
            except CudaAPIError as err:
                if retry_on is None or err.code != retry_on:
                    raise
                self.empty_cache()
                owner = super().memalloc(bucket)
            return owner, owner.device_pointer

        def _lend(self, entry, size, give, key):
            """A :class:`Lent` pointer of ``size`` bytes on ``entry``, which ``give(*key,
            entry)`` takes back when it dies."""
            proxy = self._context_proxy
            if proxy is None:
                proxy = self._context_proxy = weakref.proxy(self.context)
            self.lent[id(entry)] = entry
            handle = entry[1]
            if direct:
                memory = Lent.__new__(Lent)
                memory.__dict__ = {"context": proxy, "device_pointer": handle, "size": size,
                                   "_cuda_memsize_": size, "is_managed": False, "refct": 1,
                                   "handle": handle, "_owner": None,
                                   "_numbapos_lent": (self.lent, entry, give, key)}
            else:
                memory = Lent(proxy, handle, size)
                memory._numbapos_lent = (self.lent, entry, give, key)
            return memory

        def _capture_alloc(self, capture, size, bucket):
            # The capture's own freed blocks first, then those its warm-up left cached;
            # freed, a block goes to the capture's pool (the graph's from now on, see
            # streams.Capture).
            entry = capture.take(bucket)
            if entry is None:
                entry = self.pools.take(streams.handle(capture.home), bucket)
            if entry is None:
                with streams.relaxed_capture_mode():
                    entry = self._fresh(bucket)
            return self._lend(entry, size, capture.give, (bucket,))

        def empty_cache(self):
            """Drop the cached blocks; Numba's own finalizers free them."""
            self.pools.clear()
            self.deallocations.clear()

        def reset(self):
            # The context's memory is freed: lent blocks are not given back either.
            self.lent.clear()
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
