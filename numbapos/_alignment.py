"""Host arrays on a cache line: NumPy aligns its allocations to 16 bytes, not 64.

A row written into an array that starts at 16 mod 64 straddles cache lines,
and every other vector store is split in two; a row read from one spans one
line more than it needs. numbapos therefore puts the large host arrays it
makes (kernel outputs, gradients and optimiser state through
``kernels.cpu.arrays``, the tables its modules initialise) on a 64-byte
boundary, as PyTorch does. This module imports nothing heavy: making a module
does not load the kernels.

Tables are read and written a row at a time at random places. NumPy already
advises transparent huge pages for its large allocations (Linux), but inside a
``malloc``'ed block that does not start on a 2 MB boundary; the tables the
modules initialise from :data:`HUGE_PAGE_MIN_BYTES` on lie instead in a
private anonymous mapping of their own, advised (``madvise(MADV_HUGEPAGE)``)
before the first touch and used from a 2 MB boundary: pooled lookups of 40,960
random rows of a 512 MB table took 10-15 % less time than from NumPy's own
array (three interleaved runs on a 2-core Xeon VM). Where ``mmap`` has no such
advice (macOS, Windows) or the kernel refuses it, they are ordinary aligned
arrays.
"""

from __future__ import annotations

import math
import mmap

import numpy as np

__all__ = ["ALIGNED_MIN_BYTES", "HUGE_PAGE_MIN_BYTES", "LINE_BYTES", "aligned",
           "aligned_copy", "table_copy", "table_empty"]

LINE_BYTES = 64
"""The boundary large arrays start on (a cache line)."""

ALIGNED_MIN_BYTES = 1 << 20
"""Arrays from this size on are aligned; smaller ones stay NumPy's own (an aligned one
costs about 1 us more to make, and lies in the cache anyway)."""

HUGE_PAGE_MIN_BYTES = 32 << 20
"""Tables from this size on lie in memory advised for transparent huge pages."""

HUGE_PAGE_BYTES = 2 << 20


def aligned(allocate, shape, dtype) -> np.ndarray:
    """``allocate(shape, dtype=dtype)`` (``np.empty`` or ``np.zeros``), C-contiguous; from
    :data:`ALIGNED_MIN_BYTES` on, a view of ``allocate``'s bytes starting on a
    :data:`LINE_BYTES` boundary (the view owns nothing; its base keeps the memory)."""
    dtype = np.dtype(dtype)
    shape = (shape,) if np.ndim(shape) == 0 else tuple(shape)
    nbytes = dtype.itemsize * math.prod(shape)
    if nbytes < ALIGNED_MIN_BYTES:
        return allocate(shape, dtype=dtype)
    raw = allocate(nbytes + LINE_BYTES, dtype=np.uint8)
    start = -raw.ctypes.data % LINE_BYTES
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def aligned_copy(values, dtype) -> np.ndarray:
    """A fresh C-contiguous copy of ``values`` cast to ``dtype`` (as ``np.array(values,
    dtype)`` casts), aligned as :func:`aligned`'s arrays."""
    values = np.asarray(values)
    out = aligned(np.empty, values.shape, dtype)
    out[...] = values
    return out


def table_copy(values, dtype) -> np.ndarray:
    """:func:`aligned_copy` for a table that kernels read and write by rows: a
    :func:`table_empty` array holding ``values`` cast to ``dtype``."""
    values = np.asarray(values)
    out = table_empty(values.shape, dtype)
    out[...] = values
    return out


def table_empty(shape, dtype) -> np.ndarray:
    """An uninitialised C-contiguous table: from :data:`HUGE_PAGE_MIN_BYTES` on, in memory
    advised for transparent huge pages (see the module's docstring), else as
    :func:`aligned`'s. An ordinary writable NumPy array either way (it pickles, views and
    copies as any other)."""
    dtype = np.dtype(dtype)
    shape = (shape,) if np.ndim(shape) == 0 else tuple(shape)
    nbytes = dtype.itemsize * math.prod(shape)
    raw = _huge_page_bytes(nbytes) if nbytes >= HUGE_PAGE_MIN_BYTES else None
    if raw is None:
        return aligned(np.empty, shape, dtype)
    return raw.view(dtype).reshape(shape)


def _huge_page_bytes(nbytes: int):
    """``nbytes`` of fresh anonymous memory on a :data:`HUGE_PAGE_BYTES` boundary, advised
    for huge pages before anything touches it; None where that advice is not available."""
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is None:
        return None
    # Private: Linux backs shared anonymous memory (mmap's default) with huge pages only
    # where shmem_enabled allows it, which it does not by default.
    memory = mmap.mmap(-1, nbytes + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        memory.madvise(advice)
    except OSError:  # a kernel without THP: ordinary pages, still a fresh zeroed mapping
        return None
    raw = np.frombuffer(memory, np.uint8)
    start = -raw.ctypes.data % HUGE_PAGE_BYTES
    return raw[start:start + nbytes]
