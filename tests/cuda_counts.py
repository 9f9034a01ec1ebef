"""Count what an op asks of the GPU, on Numba's CUDA simulator.

The simulator runs everything synchronously on the host, so it cannot show a
stall; but it can count the calls that would cost one on a GPU::

    with count_cuda_traffic() as c:
        numbapos.functional.embedding(ids, weight)
    assert c.launches == 1 and c.device_to_host == 0 and c.synchronizations == 0

- ``launches``: kernel launches (``kernel[grid, block](...)``; device
  functions and calls made inside a running kernel are not launches);
- ``device_to_host``: copies from the device to the host
  (``DeviceNDArray.copy_to_host``, reading one element of a device array on
  the host, ``x[i]``, and NumPy reading one, ``np.asarray(x)``: each a copy
  on a GPU);
- ``synchronizations``: ``cuda.synchronize()`` and ``stream.synchronize()``;
- ``host_to_device``: ``cuda.to_device`` and ``DeviceNDArray.copy_to_device``
  (asynchronous for pageable memory only up to a small size, and each a
  separate transfer: counted apart, tests keep them at zero where they can);
- ``device_to_device``: ``DeviceNDArray.copy_to_device`` from another device
  array (no transfer over the bus, no synchronisation).

``c.kernels`` lists the launched kernels' names in order, for messages.
Only the simulator is patched (``NUMBA_ENABLE_CUDASIM=1``), and only inside
the ``with`` block.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

_ABSENT = object()
# NumPy methods that FakeCUDAArray forwards to its wrapped array and that read the data
# (a DeviceNDArray has none of them: on a GPU each needs a copy to the host).
_HOST_READS = frozenset({
    "all", "any", "argmax", "argmin", "argsort", "astype", "clip", "copy", "cumsum", "dot",
    "flatten", "item", "max", "mean", "min", "nonzero", "prod", "round", "sort", "std", "sum",
    "tobytes", "tolist", "var",
})


@dataclass
class CudaTraffic:
    """What the code inside one :func:`count_cuda_traffic` block asked of the GPU."""

    launches: int = 0
    device_to_host: int = 0
    synchronizations: int = 0
    host_to_device: int = 0
    device_to_device: int = 0
    kernels: list = field(default_factory=list)

    def __str__(self) -> str:
        return (f"{self.launches} launches ({', '.join(self.kernels)}), "
                f"{self.device_to_host} device-to-host copies, "
                f"{self.synchronizations} synchronisations, "
                f"{self.host_to_device} host-to-device copies, "
                f"{self.device_to_device} device-to-device copies")


@contextlib.contextmanager
def count_cuda_traffic():
    """Count launches, copies and synchronisations on the CUDA simulator (see the module)."""
    from numba import config, cuda

    if not config.ENABLE_CUDASIM:
        raise RuntimeError("count_cuda_traffic needs Numba's CUDA simulator "
                           "(NUMBA_ENABLE_CUDASIM=1)")
    from numba.cuda import simulator
    from numba.cuda.simulator import api
    from numba.cuda.simulator import kernel as sim_kernel
    from numba.cuda.simulator.cudadrv import devicearray

    counts = CudaTraffic()
    fake_kernel = sim_kernel.FakeCUDAKernel
    fake_array = devicearray.FakeCUDAArray
    saved = []
    # Depth of the simulator's own copies and launches, whose NumPy work on the wrapped
    # arrays is no extra traffic: only the host program's reads are counted.
    inside = [0]

    def host_side() -> bool:
        return inside[0] == 0 and not sim_kernel._kernel_context

    def patch(owner, name, make):
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        saved.append((owner, name, original))
        setattr(owner, name, make(original))

    def internal(original):
        def run(*args, **kwargs):
            inside[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                inside[0] -= 1
        return run

    def counted_call(original):
        original = internal(original)

        def __call__(self, *args):
            if not self._device and host_side():
                counts.launches += 1
                counts.kernels.append(getattr(self.fn, "__name__", "?"))
            return original(self, *args)
        return __call__

    def counted_copy_to_host(original):
        original = internal(original)

        def copy_to_host(self, *args, **kwargs):
            if host_side():
                counts.device_to_host += 1
            return original(self, *args, **kwargs)
        return copy_to_host

    def counted_getitem(original):
        def __getitem__(self, idx):
            result = original(self, idx)
            if host_side() and not isinstance(result, fake_array):
                counts.device_to_host += 1  # one element read on the host
            return result
        return __getitem__

    def counted_getattr(original):
        def __getattr__(self, name):
            if name in _HOST_READS and host_side():
                counts.device_to_host += 1  # a NumPy method on the data: a copy on a GPU
            return original(self, name)
        return __getattr__

    def host_view(name):
        def read(self):
            if host_side():
                counts.device_to_host += 1  # NumPy reading a device array: a copy on a GPU
            return getattr(self._ary, name)
        return property(read)

    def counted_copy_to_device(original):
        original = internal(original)

        def copy_to_device(self, ary, *args, **kwargs):
            if host_side():
                if isinstance(ary, fake_array):
                    counts.device_to_device += 1
                else:
                    counts.host_to_device += 1
            return original(self, ary, *args, **kwargs)
        return copy_to_device

    def counted_to_device(original):
        original = internal(original)

        def to_device(*args, **kwargs):
            if host_side():
                counts.host_to_device += 1
            return original(*args, **kwargs)
        return to_device

    def counted_sync(original):
        def synchronize(*args, **kwargs):
            counts.synchronizations += 1
            return original(*args, **kwargs)
        return synchronize

    patch(fake_kernel, "__call__", counted_call)
    patch(fake_array, "copy_to_host", counted_copy_to_host)
    patch(fake_array, "__getitem__", counted_getitem)
    patch(fake_array, "__getattr__", counted_getattr)
    patch(fake_array, "copy_to_device", counted_copy_to_device)
    # FakeCUDAArray hands NumPy its wrapped array through __getattr__; properties count it.
    for name in ("__array_struct__", "__array_interface__"):
        saved.append((fake_array, name, _ABSENT))
        setattr(fake_array, name, host_view(name))
    for module in (simulator, cuda, devicearray):
        if hasattr(module, "to_device"):
            patch(module, "to_device", counted_to_device)
    for module in (simulator, cuda, api):
        if hasattr(module, "synchronize"):
            patch(module, "synchronize", counted_sync)
    patch(api.stream, "synchronize", counted_sync)
    try:
        yield counts
    finally:
        for owner, name, original in reversed(saved):
            if original is _ABSENT:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


@contextlib.contextmanager
def deferred_raises(device, exc, match=None, *, within=False, deferred=None):
    """``pytest.raises(exc, match=match)`` for the code in the block, where the error is
    raised on ``device``.

    On CUDA an ``IndexError`` (or, with ``deferred=True``, ``exc``: the ValueError of an
    attention mask's values) is found by a kernel and deferred: the block itself must
    NOT raise it, and the next ``numbapos.synchronize()`` must (with the same message).
    With ``within`` (a block of several numbapos calls, e.g. a module's backward) a later
    call of the block may raise it instead, once the host sees the error word. Any other
    error, or any error on the CPU, must be raised by the block.
    """
    import re

    import pytest

    import numbapos

    if deferred is None:
        deferred = exc is IndexError
    if device == "cuda" and deferred:
        raised = None
        try:
            yield
        except exc as err:
            if not within:
                raise AssertionError(f"{exc.__name__} raised by the op itself, not deferred "
                                     f"to the next synchronising call: {err}") from err
            raised = err
        if raised is None:
            with pytest.raises(exc, match=match):
                numbapos.synchronize()
        elif match is not None:
            assert re.search(match, str(raised)), f"{match!r} not found in {raised}"
        numbapos.synchronize()  # cleared: nothing more is pending
    else:
        with pytest.raises(exc, match=match):
            yield
