"""Reusing a module's large CPU output once nobody holds it any more.

A fresh NumPy array of tens of megabytes costs a page fault per 4 KiB page on
its first write (the kernel zero-fills every page), often as much as the
lookup that fills it: glibc returns blocks above its mmap threshold (at most
32 MiB) to the operating system on free, so every step of a training loop
faults its embedding output in again. A module therefore keeps the memory of
its last large output and writes the next output into it, but only once the
array it handed out is gone.

Ownership is tracked explicitly, not by reference-count arithmetic (which
Python 3.14 changed: locals may be borrowed references, and
``sys.getrefcount`` may read lower than the references that keep an object
alive). The module keeps the memory as an anonymous ``mmap`` and hands out a
new ``ndarray`` over it for each output, holding only a weak reference to
that array. NumPy points every view of the handed-out array (slices,
``.T``, ``.view(dtype)``, ``np.frombuffer``), every buffer export
(``memoryview``) and every PyTorch tensor made from it (``torch.from_numpy``)
at the array itself, never past it to the ``mmap`` (it stops collapsing view
chains at a base that is not an ndarray), so the weak reference is alive
exactly while anything can still read or write the output. The memory is
reused only when it is dead. That holds on any interpreter, 3.14's included:
an object is freed only when its last strong reference goes, however the
interpreter counts them. (Someone who takes ``output.base``, the ``mmap``,
and keeps it alone bypasses this; nothing numbapos or NumPy does hands it out.)

Results never change, only where they are written.
"""

from __future__ import annotations

import mmap
import weakref

import numpy as np

# Smaller outputs come from NumPy's and malloc's caches anyway.
MIN_BYTES = 1 << 20


class OutputBuffer:
    """One module's reusable output memory (CPU, C-contiguous arrays over it)."""

    __slots__ = ("_memory", "_handed")

    def __init__(self):
        self._memory: mmap.mmap | None = None
        self._handed: weakref.ref | None = None  # the array over _memory handed out last

    @property
    def in_use(self) -> bool:
        """Whether the array handed out last (or anything viewing it) is still alive."""
        return self._handed is not None and self._handed() is not None

    @property
    def capacity(self) -> int:
        """Bytes of memory kept (0: none)."""
        return 0 if self._memory is None else len(self._memory)

    def take(self, shape, dtype):
        """An array for the next output of ``shape`` and ``dtype``, or None to let the op allocate.

        None for outputs under :data:`MIN_BYTES`. Otherwise a new array over
        the kept memory when the previous one is gone and the memory fits
        (at least the bytes asked for, at most twice), else over new memory
        (kept in place of the old).
        """
        dtype = np.dtype(dtype)
        shape = tuple(int(n) for n in shape)
        nbytes = dtype.itemsize
        for n in shape:
            nbytes *= n
        if nbytes < MIN_BYTES:
            return None
        if self.in_use or not nbytes <= self.capacity <= 2 * nbytes:
            self._handed = None
            self._memory = mmap.mmap(-1, nbytes)
        array = np.ndarray(shape, dtype, buffer=self._memory)
        self._handed = weakref.ref(array)
        return array

    def clear(self) -> None:
        """Forget the kept memory (freed once no array over it is left)."""
        self._memory = None
        self._handed = None
