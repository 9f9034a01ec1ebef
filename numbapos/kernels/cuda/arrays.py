"""Array helpers of the CUDA backend, with the CPU backend's names.

Arrays are Numba device arrays. Kernels use grid-stride loops, so any grid
size is correct; :func:`grid` picks one from the work size. Allocations and
copies go to numbapos's current stream (:mod:`.streams`), as launches do.
"""

from __future__ import annotations

import numpy as np
from numba import config as numba_config
from numba import cuda

from ..._gpuhost import fastlaunch, plans, streams
from ..._gpuhost.launch import launch
from . import errors

__all__ = ["DEFERRED_INDEX_ERRORS", "DEVICE", "add_", "add_rows_", "asarray", "concat_rows",
           "contiguous", "empty", "full", "to_host", "zeros"]

DEVICE = "cuda"
# Index errors are recorded by kernels and raised by a later call (see errors.py).
DEFERRED_INDEX_ERRORS = True

# Threads per block of the elementwise and per-row kernels: a multiple of the
# warp size, and a power of two for the shared-memory tree reductions.
THREADS = 128
# A grid large enough to fill any current GPU; grid-stride loops do the rest. Numba's
# simulator runs every thread of every block as a Python thread, so there a few blocks
# do the work (and the tests drive every grid-stride loop past its first block).
MAX_BLOCKS = 4 if numba_config.ENABLE_CUDASIM else 4096


def grid(work: int, threads: int = THREADS) -> int:
    """Blocks for ``work`` items at one item per thread (at least 1, at most MAX_BLOCKS)."""
    return max(1, min(MAX_BLOCKS, -(-int(work) // threads)))


@cuda.jit
def _fill(out, value):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, out.size, stride):
        out[i] = value


@cuda.jit
def _cast(src, out):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, out.size, stride):
        out[i] = src[i]


@cuda.jit
def _add(out, x, word):
    # Gradient accumulation: nothing is added while an index error is pending.
    if errors.is_pending(word):
        return
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, out.size, stride):
        out[i] += x[i]


@cuda.jit
def _add_rows(dense, rows, values, used, word):
    # One block per listed row (grid-stride over rows), threads along D. Rows are
    # unique, so no two threads write one element. ``used[0]`` rows are real;
    # nothing is written while an index error is pending.
    if errors.is_pending(word):
        return
    dim = dense.shape[1]
    for j in range(cuda.blockIdx.x, used[0], cuda.gridDim.x):
        row = rows[j]
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            dense[row, d] += values[j, d]


@cuda.jit
def _concat_rows(rows_a, values_a, used_a, rows_b, values_b, used_b, pad, rows_out,
                 values_out):
    # One block per slot of rows_out (grid-stride), threads along D: slot i < len(rows_a)
    # copies a's row i when it is real, the others b's row i - len(rows_a) to
    # used_a + that; slots from used_a + used_b on get the row ``pad``.
    count_a = used_a[0]
    end = count_a + used_b[0]
    size_a = rows_a.shape[0]
    dim = values_out.shape[1]
    for i in range(cuda.blockIdx.x, rows_out.shape[0], cuda.gridDim.x):
        if i >= end and cuda.threadIdx.x == 0:
            rows_out[i] = pad
        if i < size_a:
            if i < count_a:
                if cuda.threadIdx.x == 0:
                    rows_out[i] = rows_a[i]
                for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
                    values_out[i, d] = values_a[i, d]
        else:
            j = i - size_a
            if j < used_b[0]:
                if cuda.threadIdx.x == 0:
                    rows_out[count_a + j] = rows_b[j]
                for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
                    values_out[count_a + j, d] = values_b[j, d]


def concat_rows(rows_a, values_a, used_a, rows_b, values_b, used_b, pad, rows_out, values_out):
    """The real rows of two sparse gradients, one after the other (the CPU twin's result),
    with the counts ``used_*`` read on the device: nothing is read back."""
    if rows_out.size:
        used_a, used_b = (asarray(np.array([u, 0], np.int64)) if isinstance(u, int) else u
                          for u in (used_a, used_b))
        launch(_concat_rows, grid(rows_out.size * THREADS), _row_threads(values_out.shape[1]),
               rows_a, values_a, used_a, rows_b, values_b, used_b, np.int64(pad), rows_out,
               values_out)


def _row_threads(dim: int) -> int:
    return min(THREADS, max(32, -(-dim // 32) * 32))


_FACTORIES: dict = {}  # (shape, dtype, stream, id(context)) -> fastlaunch.ArrayFactory


def empty(shape, dtype):
    """Uninitialised C-contiguous device array."""
    stream = streams.for_arrays(streams.current())
    if not streams.SIMULATED:
        # Arrays of a shape, dtype and stream made before come from a factory (the
        # constructor below costs about 5 us of host time, the factory's copy 1 us).
        context = errors.current_context()
        try:
            # The context by id (Numba's is unhashable): the factory holds it, so the id
            # stays its own while the entry lives.
            key = (shape, dtype, stream, id(context))
            factory = _FACTORIES.get(key)
        except TypeError:  # an unhashable shape (a list): the constructor checks it
            key = factory = None
        if factory is not None:
            made = factory()[0]
            plans.note_allocation(made)
            return made
        made = _construct(shape, dtype, stream, context)
        if made is not None:
            if key is not None and made.size:
                if len(_FACTORIES) >= 1024:
                    _FACTORIES.clear()
                _FACTORIES[key] = fastlaunch.ArrayFactory.like(made, context)
            plans.note_allocation(made)
            return made
        plans.note_allocation(None)  # a null pointer: no plan can place it
    return cuda.device_array(shape, dtype=np.dtype(dtype), stream=stream)


def _construct(shape, dtype, stream, context):
    """A new C-contiguous DeviceNDArray (None when it holds no bytes)."""
    # What cuda.device_array does, without its two lookups of the current context
    # (tens of microseconds each where Numba did not make the context current).
    from numba.cuda.api_util import prepare_shape_strides_dtype
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    shape, strides, dtype = prepare_shape_strides_dtype(shape, None, np.dtype(dtype), "C")
    nbytes = dtype.itemsize
    for extent in shape:
        nbytes *= extent
    if not nbytes:
        return None  # an empty array gets Numba's own null pointer
    return DeviceNDArray(shape, strides, dtype, stream=stream,
                         gpu_data=context.memalloc(nbytes))


_ABSENT: dict = {}  # (dtype, ndim) -> an empty device array


def absent(dtype, ndim: int = 1):
    """The empty device array a kernel gets in place of an absent one (None on the host).

    Kernels take the records of :mod:`numbapos._args`; an array field that is
    None there (no LayerNorm weight, computed position ids, no device counter)
    reaches a kernel as this array, which the kernel tests with ``.size``. Made
    once per dtype and rank (an empty array holds no memory).
    """
    key = (np.dtype(dtype), ndim)
    found = _ABSENT.get(key)
    if found is None:
        found = _ABSENT[key] = empty((0,) * ndim, key[0])
        found._numbapos_persistent = True  # a plan may keep it (see .plans)
    return found


def full(shape, value, dtype):
    """C-contiguous device array filled with ``value``."""
    out = empty(shape, dtype)
    if out.size:
        flat = out.reshape(out.size)
        launch(_fill, grid(out.size), THREADS, flat, flat.dtype.type(value))
    return out


def zeros(shape, dtype):
    """Zero-filled C-contiguous device array."""
    return full(shape, 0, dtype)


def _standard_strides(x: np.ndarray) -> bool:
    """Whether ``x`` has exactly the strides of a fresh C-ordered array of its shape.

    NumPy calls ``x[None]`` (stride 0 on the new axis) C-contiguous, but Numba's
    device arrays keep those strides and then refuse them as non-contiguous.
    """
    step = x.itemsize
    for extent, stride in zip(reversed(x.shape), reversed(x.strides), strict=True):
        if stride != step:
            return False
        step *= extent
    return True


def asarray(host):
    """A host array copied to the GPU, with standard C strides (0-d arrays stay 0-d)."""
    streams.refuse_in_capture("a copy from the host to the device")
    plans.note_allocation(None)  # host data, which a plan's replay would not copy again
    host = np.asarray(host)
    if not _standard_strides(host):
        host = np.array(host, order="C", copy=True)
    return cuda.to_device(host, stream=streams.for_arrays(streams.current()))


def copy(x):
    """A C-contiguous copy of the device array ``x``, queued on the current stream
    (see :func:`copy_into`)."""
    out = empty(x.shape, x.dtype)
    if out.size == 0:
        return out
    plans.note_allocation(None)  # a copy, which a plan's replay would not make
    return copy_into(out, x)


def copy_into(out, x):
    """``out`` (a C-contiguous device array of ``x``'s shape and dtype) filled with a copy
    of the device array ``x``, queued on the current stream; returns ``out``.

    A C-contiguous ``x`` is copied by one ``cuMemcpyDtoDAsync`` (Numba's
    ``copy_to_device`` looks up the context and builds views first: hundreds of
    microseconds of host time); other layouts, and the simulator, take Numba's
    copy.
    """
    if x.size == 0:
        return out
    stream = streams.current()
    if streams.SIMULATED or not x.is_c_contiguous():
        out.copy_to_device(x, stream=stream)
        streams.record("copy", out, x)
        return out
    driver = streams.bindings()
    err, = driver.cuMemcpyDtoDAsync(out.gpu_data.device_pointer_value,
                                    x.gpu_data.device_pointer_value,
                                    x.size * x.dtype.itemsize, streams.handle(stream))
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuMemcpyDtoDAsync failed: {err!r}")
    return out


def to_host(x) -> np.ndarray:
    """A device array copied to a NumPy array (after the current stream's work on it)."""
    streams.refuse_in_capture("a copy from the device to the host")
    stream = streams.current()
    out = x.copy_to_host(stream=stream)
    if stream:
        streams.wait(stream)
    return out


def contiguous(x, dtype=None):
    """``x`` as a C-contiguous device array of ``dtype`` (no copy when it already is one).

    Device arrays reach the launchers C-contiguous (``numbapos._checks``
    refuses others), so only a dtype change copies, elementwise on the GPU.
    """
    if dtype is None or np.dtype(dtype) == x.dtype:
        return x
    out = empty(x.shape, dtype)
    if x.size:
        launch(_cast, grid(x.size), THREADS, x.reshape(x.size), out.reshape(x.size))
    return out


def add_(out, x):
    """``out += x`` elementwise (same shape and dtype, both C-contiguous)."""
    if out.size:
        launch(_add, grid(out.size), THREADS, out.reshape(out.size), x.reshape(x.size),
               errors.device_word())


def add_rows_(dense, rows, values, used):
    """``dense[rows[j]] += values[j]`` for unique ``rows[:used]`` (``used``: an int, or a
    device array whose first entry is the count)."""
    if rows.size:
        if isinstance(used, int):
            used = asarray(np.array([used, 0], np.int64))
        launch(_add_rows, grid(rows.size * THREADS), THREADS, dense, rows, values, used,
               errors.device_word())
