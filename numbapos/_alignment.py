"""Host arrays on a cache line: NumPy aligns its allocations to 16 bytes, not 64.

A row written into an array that starts at 16 mod 64 straddles cache lines,
and every other vector store is split in two; a row read from one spans one
line more than it needs. numbapos therefore puts the large host arrays it
makes (kernel outputs, gradients and optimiser state through
``kernels.cpu.arrays``, the tables its modules initialise) on a 64-byte
boundary, as PyTorch does. This module imports nothing heavy: making a module
does not load the kernels.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["ALIGNED_MIN_BYTES", "LINE_BYTES", "aligned", "aligned_copy"]

LINE_BYTES = 64
"""The boundary large arrays start on (a cache line)."""

ALIGNED_MIN_BYTES = 1 << 20
"""Arrays from this size on are aligned; smaller ones stay NumPy's own (an aligned one
costs about 1 us more to make, and lies in the cache anyway)."""


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
