"""Reusing a module's large CPU output once nobody holds it any more.

A fresh NumPy array of tens of megabytes costs a page fault per 4 KiB page on
its first write (the kernel zero-fills every page), often as much as the
lookup that fills it: glibc returns blocks above its mmap threshold (at most
32 MiB) to the operating system on free, so every step of a training loop
faults its embedding output in again. A module therefore keeps its last large
output and writes the next one into it, but only when the reference count
shows that the module holds the only reference: a caller still holding the
previous output (or a view of it, or a PyTorch tensor made from it) keeps
it, and the module allocates a new array. Results never change, only where
they are written.
"""

from __future__ import annotations

import sys

import numpy as np

# Smaller outputs come from NumPy's and malloc's caches anyway.
MIN_BYTES = 1 << 20

# sys.getrefcount of the kept array inside take(): the slot, the local name and
# getrefcount's own argument.
_ONLY_US = 3


class OutputBuffer:
    """One module's reusable output (CPU, C-contiguous)."""

    __slots__ = ("_array",)

    def __init__(self):
        self._array = None

    def take(self, shape, dtype):
        """An array for the next output of ``shape`` and ``dtype``, or None to let the op allocate.

        None for outputs under MIN_BYTES. Otherwise the kept array when no one
        else references it and it has that shape and dtype, else a new one
        (kept in its place).
        """
        dtype = np.dtype(dtype)
        size = 1
        for n in shape:
            size *= n
        if size * dtype.itemsize < MIN_BYTES:
            return None
        kept = self._array
        if (kept is not None and kept.shape == tuple(shape) and kept.dtype == dtype
                and sys.getrefcount(kept) == _ONLY_US):
            return kept
        self._array = None
        kept = np.empty(shape, dtype)
        self._array = kept
        return kept

    def clear(self) -> None:
        """Forget the kept array (its memory is freed once no one else holds it)."""
        self._array = None
