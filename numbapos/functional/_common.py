"""Steps every functional op shares: pick the backend, flatten and range-check indices."""

from __future__ import annotations

import numpy as np

from .. import _checks, _device

# Small calls (at most this many output elements) on plain NumPy arrays take a fast
# path: one serial kernel call that range-checks while it gathers. Anything unusual
# (other types or dtypes, options, bad indices) goes the full way, which also
# writes the error messages.
SMALL_WORK = 1 << 15
INDEX_DTYPES = (np.dtype(np.int64), np.dtype(np.int32))
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


class Planned:
    """An op's plans for the GPU host path (:mod:`numbapos._gpuhost.plans`).

    ``call(full, arrays, options, ...)`` (see ``PlanCache.call``) runs ``full()`` (the op's
    ordinary path) until the CUDA backend is in use, then goes through the
    op's plan cache, which replays the launches ``full`` made for the same
    call signature (see that module for what an op may plan). From then on
    ``call`` is the cache's own (no call of this object in between).
    """

    __slots__ = ("op", "cache", "call")

    def __init__(self, op: str):
        self.op = op
        self.cache = None
        self.call = self._until_cuda

    def _until_cuda(self, full, arrays, options, outputs=(), avoid=(), unpack=None,
                    pack=None):
        if not _device.backend_loaded("cuda"):
            return full()
        self.cache = _device.plan_cache(self.op)
        self.call = self.cache.call
        return self.call(full, arrays, options, outputs, avoid, unpack, pack)


def cpu_kernels():
    """The CPU kernel namespace (imported on first use)."""
    return _device.kernels_for("cpu")


def backend_for(arrays, names):
    """The kernel namespace for the data arrays (all on one device, else TypeError)."""
    if all(type(x) is np.ndarray or x is None for x in arrays):  # the common case, kept fast
        return _device.kernels_for("cpu")
    device = _checks.check_same_device(arrays, names)
    return _device.kernels_for(device)


def on_backend(K, indices, name: str = "indices"):
    """Checked integer ``indices`` on K's device, C-contiguous and flat.

    Host indices (arrays, lists, scalars) for CUDA data are copied to the GPU;
    CUDA indices for CPU data raise TypeError.
    """
    indices = _checks.check_index_array(indices, name)
    where = "cpu" if type(indices) is np.ndarray else _device.device_of(indices)
    if where != K.DEVICE:
        if K.DEVICE == "cpu":
            raise TypeError(f"{name}: is a CUDA array but the data is on 'cpu'; move them to "
                            "one device first (numbapos.to_device)")
        indices = K.asarray(indices)
    return indices


def flatten(K, indices):
    """``indices`` as a flat C-contiguous array of K's device (no copy when possible)."""
    return _device.reshaped(K.contiguous(indices), (indices.size,))


def check_range(K, flat, size: int, name: str = "indices", size_name: str = "num_embeddings",
                checked_by_kernel: bool = False):
    """IndexError unless every value of ``flat`` lies in ``[0, size)``.

    On the CPU the check runs now and raises here. On the GPU it is deferred
    (``K.DEFERRED_INDEX_ERRORS``): a kernel records a bad index and a later
    call raises (``kernels/cuda/errors.py``); with ``checked_by_kernel`` the
    op's own kernels check as they read, so no separate launch is needed.
    """
    if flat.size == 0 or (checked_by_kernel and K.DEFERRED_INDEX_ERRORS):
        return
    bad = K.check_indices(flat, size, name, size_name)
    if bad >= 0:
        _checks.raise_index_error(flat, bad, size, name, size_name)
