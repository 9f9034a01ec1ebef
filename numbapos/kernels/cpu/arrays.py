"""Array helpers of the CPU backend: allocation and moves, with the CUDA twin's names."""

from __future__ import annotations

import numpy as np

from ... import _pool, config
from ..._alignment import aligned

__all__ = ["DEFERRED_INDEX_ERRORS", "DEVICE", "add_", "add_rows_", "asarray", "concat_rows",
           "contiguous", "empty", "full", "to_host", "zeros"]
# (option and pick are the launchers' helpers, not part of the twinned namespace.)

DEVICE = "cpu"
# Index errors are found before a kernel runs and raised by the op itself (the
# CUDA twin records them on the device and raises them at a later call).
DEFERRED_INDEX_ERRORS = False

# Below config's ``parallel_min_elements`` (2**15) elements of work a parallel
# launch costs more than it saves. The only serial/parallel threshold of the CPU
# launchers. (Raising it to 2**18 to spare mid-sized calls a wake-up of the pool
# doubled a small sparse training step, whose row updates are bound by memory
# latency, not by element count.)


def runs_parallel(work: int) -> bool:
    """Whether ``work`` elements go to a parallel kernel; if so, the pool is started.

    The thread pool starts here, at the first launch that needs it (with
    numbapos's wait policy, :func:`numbapos._pool.start_pool`), not at import.
    When other processes leave this one a single free core (config's
    ``adaptive_threads``, :func:`numbapos._pool.usable_threads`), the serial
    kernel runs: a parallel one would wait for its thread sharing a busy core.
    """
    if work < config.get("parallel_min_elements"):
        return False
    if not _pool.started:
        _pool.start_pool()
    return _pool.usable_threads() > 1


def pick(kernels, work: int):
    """The serial kernel of a :class:`~.jit.SerialParallel` pair for small work, the
    parallel one from ``parallel_min_elements`` on (unless other processes leave this
    one a single free core: :func:`runs_parallel`)."""
    return kernels.parallel if runs_parallel(work) else kernels.serial


def option(value):
    """An on/off option as a CPU kernel argument that picks the compiled code: True or None.

    Numba types ``None`` apart from ``True``, and a kernel's ``if flag is None``
    (in the kernel or in a function inlined into it) is settled when it is
    compiled, so a kernel compiled for one setting holds none of the other's
    code. A first call then compiles only the variant it runs: for the sparse
    SGD rows that is one loop of four, for the gradient sums one of two. A plain ``bool`` would be
    a run-time branch around both loops, both compiled.
    """
    return True if value else None


def empty(shape, dtype) -> np.ndarray:
    """Uninitialised C-contiguous array; from ``ALIGNED_MIN_BYTES`` (1 MB) on, its data
    starts on a 64-byte cache line (:mod:`numbapos._alignment`).

    NumPy aligns its arrays to 16 bytes. Rows written into an array at 16 mod 64
    straddle cache lines, and every other vector store is split in two
    (``docs/performance.rst``); PyTorch aligns to 64 bytes as well.
    """
    return aligned(np.empty, shape, dtype)


def zeros(shape, dtype) -> np.ndarray:
    """Zero-filled C-contiguous array, aligned as :func:`empty`'s (still the OS's lazily
    zeroed pages when large)."""
    return aligned(np.zeros, shape, dtype)


def full(shape, value, dtype) -> np.ndarray:
    """C-contiguous array filled with ``value``, aligned as :func:`empty`'s.

    A fill with +0 comes from :func:`zeros`: large arrays are then the OS's
    lazily zeroed pages, so optimiser state (a momentum buffer as big as the
    table) costs neither time nor memory for the rows a sparse update never
    touches.
    """
    if value == 0 and not np.signbit(value):
        return zeros(shape, dtype)
    out = empty(shape, dtype)
    out[...] = value
    return out


def asarray(host: np.ndarray) -> np.ndarray:
    """A host array on this device (here: itself)."""
    return host


def to_host(x) -> np.ndarray:
    """This device's array as a NumPy array (here: itself)."""
    return x


def contiguous(x, dtype=None) -> np.ndarray:
    """``x`` as a C-contiguous array of ``dtype`` (no copy when it already is one)."""
    return np.ascontiguousarray(x, dtype=dtype)


def add_(out, x):
    """``out += x`` elementwise (same shape and dtype; ``out`` C-contiguous)."""
    np.add(out, x, out=out)


def add_rows_(dense, rows, values, used):
    """``dense[rows[j]] += values[j]`` for unique ``rows[:used]`` (sparse rows into a dense
    array)."""
    dense[rows[:used]] += values[:used]


def concat_rows(rows_a, values_a, used_a, rows_b, values_b, used_b, pad, rows_out, values_out):
    """The real rows of two sparse gradients, one after the other.

    ``rows_out[:used_a]`` / ``values_out[:used_a]`` get ``rows_a[:used_a]`` /
    ``values_a[:used_a]``, the next ``used_b`` slots ``b``'s, and the rows of
    the slots left (``rows_out`` has ``len(rows_a) + len(rows_b)``) are
    ``pad``; their values are left as they are. (``used_*``: ints here,
    device counts on the GPU.)
    """
    end = used_a + used_b
    rows_out[:used_a] = rows_a[:used_a]
    rows_out[used_a:end] = rows_b[:used_b]
    rows_out[end:] = pad
    values_out[:used_a] = values_a[:used_a]
    values_out[used_a:end] = values_b[:used_b]
