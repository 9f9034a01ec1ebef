"""Where arrays live, and the kernel namespace for them.

``backend(*arrays)`` returns :mod:`numbapos.kernels.cpu` for NumPy arrays and
:mod:`numbapos.kernels.cuda` for CUDA arrays: Numba device arrays (the CUDA
simulator's included) and any object with ``__cuda_array_interface__`` (CuPy
arrays, PyTorch CUDA tensors), which :func:`adopt` wraps without a copy.
``numba.cuda`` and the CUDA kernels are imported only when a CUDA array or
``device="cuda"`` asks for them, so ``import numbapos`` works without a GPU
and without numba-cuda.
"""

from __future__ import annotations

import importlib
import os
import sys

import numpy as np

DEVICES = ("cpu", "cuda")

_INSTALL_HINT = (
    'install the CUDA extra (pip install "numbapos[cuda]") on a machine with an NVIDIA GPU '
    "and driver, or set NUMBA_ENABLE_CUDASIM=1 before importing numba to use Numba's CUDA "
    "simulator"
)


_numba_array_types: dict = {}  # type -> whether its instances are Numba device arrays

# type -> the device of its instances, for the types that tell it: NumPy arrays and the
# Numba device array types met so far (every op asks this of each of its arrays). Other
# objects (a PyTorch tensor, a list) are told one by one.
_DEVICE_OF_TYPE: dict = {np.ndarray: "cpu"}


def _is_numba_device_array(x) -> bool:
    """A Numba device array (real or simulated), without importing numba.cuda."""
    kind = type(x)
    found = _numba_array_types.get(kind)
    if found is None:  # once per type
        module = kind.__module__ or ""
        found = _numba_array_types[kind] = (module.startswith(("numba.cuda", "numba_cuda"))
                                            and hasattr(kind, "copy_to_host"))
        if found:
            _DEVICE_OF_TYPE[kind] = "cuda"
    return found


def is_cuda_array(x) -> bool:
    """True for a Numba device array or an object exposing ``__cuda_array_interface__``."""
    if type(x) is np.ndarray:
        return False
    if _is_numba_device_array(x):
        return True
    # Per object: a PyTorch tensor's class has the attribute, a CPU tensor raises on it.
    return not isinstance(x, np.ndarray) and hasattr(x, "__cuda_array_interface__")


def device_of(x) -> str:
    """``"cuda"`` for CUDA arrays, ``"cpu"`` for anything else (NumPy arrays, lists, scalars)."""
    found = _DEVICE_OF_TYPE.get(type(x))
    if found is None:
        found = "cuda" if is_cuda_array(x) else "cpu"
    return found


def torch_kind(x) -> str | None:
    """``"device"`` for a ``torch.device``, ``"dtype"`` for a ``torch.dtype``, else None.

    Told by the type's name and module, so torch is never imported here.
    """
    kind = type(x)
    if (kind.__module__ or "").partition(".")[0] == "torch" and kind.__name__ in ("device",
                                                                                  "dtype"):
        return kind.__name__
    return None


def is_device_spelling(x) -> bool:
    """Whether ``x`` is spelt as a device (``"cpu"``, ``"cuda"``, ``"cuda:N"``, a
    ``torch.device``), valid or not; used to tell a device from a dtype."""
    if torch_kind(x) == "device":
        return True
    return isinstance(x, str) and (x in DEVICES or x.startswith(("cpu:", "cuda:")))


_DEVICE_HINT = "also accepted: 'cuda:N' for the current CUDA device N, a torch.device"


def current_cuda_device() -> int:
    """The number of the CUDA device numbapos runs on (Numba's current device; 0 on the
    simulator)."""
    _require_cuda()
    from numba import cuda

    return int(getattr(cuda.get_current_device(), "id", 0))


def check_device(device, name: str = "device") -> str:
    """``device`` as ``"cpu"`` or ``"cuda"``; TypeError / ValueError otherwise.

    Accepts PyTorch's spellings: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` where N
    is the current CUDA device (numbapos runs on Numba's current device; any
    other N raises ValueError saying how to select it) and ``torch.device``
    objects (recognised without importing torch). Asking for CUDA where
    neither a GPU nor the simulator can be used raises RuntimeError saying
    how to get one.
    """
    if torch_kind(device) == "device":
        kind, index, shown = device.type, device.index, repr(device)
    elif isinstance(device, str):
        shown = repr(device[:200])
        kind, colon, number = device.partition(":")
        index = None
        if colon:
            if not number.isdigit() or not number.isascii():
                raise ValueError(f"{name}: expected 'cpu' or 'cuda', got {shown} (a device "
                                 f"number must be a non-negative integer; {_DEVICE_HINT})")
            index = int(number)
    else:
        raise TypeError(f"{name}: expected 'cpu' or 'cuda', got {type(device).__name__} "
                        f"{repr(device)[:200]} ({_DEVICE_HINT})")
    if kind not in DEVICES:
        raise ValueError(f"{name}: expected 'cpu' or 'cuda', got {shown} ({_DEVICE_HINT})")
    if kind == "cpu":
        if index not in (None, 0):
            raise ValueError(f"{name}: expected 'cpu' or 'cpu:0', got {shown}")
        return "cpu"
    _require_cuda()
    if index is not None:
        current = current_cuda_device()
        if index != current:
            raise ValueError(
                f"{name}: got {shown}, but numbapos runs on the current CUDA device, "
                f"cuda:{current}; pass 'cuda' (or 'cuda:{current}'), or make device {index} "
                f"current first with numba.cuda.select_device({index})"
            )
    return "cuda"


def cuda_available() -> bool:
    """Whether ``device="cuda"`` can be used: a CUDA GPU with numba-cuda, or the simulator.

    Never raises; imports ``numba.cuda`` on first use (not at ``import numbapos``).
    """
    try:
        _require_cuda()
    except RuntimeError:
        return False
    return True


_CUDA_ERROR: str | None = None
_CUDA_CHECKED = False


def _require_cuda() -> None:
    global _CUDA_ERROR, _CUDA_CHECKED
    if not _CUDA_CHECKED:
        _CUDA_ERROR = _cuda_problem()
        _CUDA_CHECKED = True
        if _CUDA_ERROR is None:
            # Starting the CUDA backend now, before numbapos makes its first device
            # array, lets it install its caching allocator (_gpuhost/memory.py).
            kernels_for("cuda")
    if _CUDA_ERROR is not None:
        raise RuntimeError(f"device 'cuda' is not available ({_CUDA_ERROR}): {_INSTALL_HINT}")


def _cuda_problem() -> str | None:
    """None if CUDA can be used, else why not."""
    try:
        from numba import cuda
    except ImportError as err:
        return f"numba.cuda cannot be imported: {err}"
    if simulator_enabled():
        return None
    try:
        if cuda.is_available():
            return None
    except Exception as err:  # driver errors come in many types
        return f"{type(err).__name__}: {err}"
    return "no CUDA driver or GPU was found"


def simulator_enabled() -> bool:
    """Whether Numba runs CUDA kernels on its CPU simulator."""
    if "numba" in sys.modules:
        from numba import config

        return bool(config.ENABLE_CUDASIM)
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


_NAMESPACES: dict = {}


def cuda_launches() -> int:
    """How many CUDA kernels numbapos has launched in this process (0 before CUDA's use)."""
    if not backend_loaded("cuda"):
        return 0
    from ._gpuhost import launch

    return launch.launches()


def plan_cache(op: str):
    """A new plan cache for ``op`` on the CUDA host path (``_gpuhost/plans.py``)."""
    from ._gpuhost import plans

    return plans.PlanCache(op)


def backend_loaded(device: str) -> bool:
    """Whether ``device``'s kernel namespace has been started (see :func:`kernels_for`)."""
    return device in _NAMESPACES


def kernels_for(device: str):
    """The kernel namespace of ``device`` (``"cpu"`` or ``"cuda"``), imported and
    started (its ``start()``: the CUDA allocator) on first use.

    For ``"cuda"`` it first raises an index error that a kernel queued by an
    earlier call recorded and the host can now see (a read of mapped host
    memory, no synchronisation; see ``_gpuhost/errors.py``): every op
    reaches its kernels through here.
    """
    namespace = _NAMESPACES.get(device)
    if namespace is not None:
        if device == "cuda":
            namespace.errors.raise_pending()
        return namespace
    if namespace is None:
        if device == "cuda":
            _require_cuda()  # which, the first time, starts the backend itself
            if device in _NAMESPACES:
                return _NAMESPACES[device]
        namespace = importlib.import_module(f"numbapos.kernels.{device}")
        namespace.start()
        _NAMESPACES[device] = namespace
    return namespace


def backend(*arrays):
    """The kernel namespace for where ``arrays`` live; None entries are ignored.

    Raises
    ------
    TypeError
        Arrays on different devices (both named).
    RuntimeError
        CUDA arrays where CUDA cannot be used.
    """
    device = None
    first = None
    for x in arrays:
        if x is None:
            continue
        here = device_of(x)
        if device is None:
            device, first = here, x
        elif here != device:
            raise TypeError(
                f"arrays on different devices: a {type(first).__name__} on {device!r} and a "
                f"{type(x).__name__} on {here!r}; move them to one device first "
                "(numbapos.to_device)"
            )
    return kernels_for(device or "cpu")


def bfloat16_dtype() -> np.dtype:
    """NumPy's bfloat16, ``ml_dtypes.bfloat16`` (imported on first use)."""
    try:
        import ml_dtypes
    except ImportError as err:  # pragma: no cover - a dependency of numbapos
        raise TypeError("bfloat16 arrays need the ml_dtypes package (pip install "
                        "ml_dtypes)") from err
    return np.dtype(ml_dtypes.bfloat16)


def torch_bfloat16_bits(x):
    """The ``int16`` view of a PyTorch bfloat16 tensor (same memory, any device), or None.

    NumPy has no bfloat16 of its own, so neither ``np.asarray`` nor DLPack can
    read such a tensor on the CPU, and the ``"<V2"`` of its
    ``__cuda_array_interface__`` is no type Numba computes with on the GPU: its
    bits can be read, then viewed as ``ml_dtypes.bfloat16``. The values arrive
    unchanged, without a copy and without a detour through float32. torch is
    never imported here.
    """
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported
    if torch is None or getattr(x, "dtype", None) is not torch.bfloat16:
        return None
    return x.view(torch.int16)


def is_bfloat16(x) -> bool:
    """Whether ``x`` (an array of any library, or a dtype) is ``ml_dtypes.bfloat16``,
    without importing ml_dtypes."""
    dtype = getattr(x, "dtype", x)
    if not isinstance(dtype, np.dtype):
        return False
    found = _BFLOAT16.get(dtype)
    if found is None:  # once per dtype: NumPy works a dtype's name out in Python
        if len(_BFLOAT16) >= 256:
            _BFLOAT16.clear()
        found = _BFLOAT16[dtype] = dtype.name == "bfloat16"
    return found


_BFLOAT16: dict = {}  # dtype -> whether it is ml_dtypes.bfloat16


def adopt(x):
    """A CUDA array as a Numba device array, without a copy; anything else unchanged.

    Objects with ``__cuda_array_interface__`` (CuPy, PyTorch CUDA tensors) are
    wrapped with ``numba.cuda.as_cuda_array`` once per object: later calls with the
    same object and interface build the wrapper from a cache (see
    ``_gpuhost/fastlaunch.adopt``); they share memory with ``x``. A
    bfloat16 PyTorch tensor is wrapped through its ``int16`` view and comes
    back as a Numba array of dtype ``ml_dtypes.bfloat16`` (see
    :func:`torch_bfloat16_bits`), as the CPU path views it.
    """
    if isinstance(x, np.ndarray) or _is_numba_device_array(x):
        return x
    if hasattr(x, "__cuda_array_interface__"):
        _require_cuda()
        from numba import cuda

        if not hasattr(cuda, "as_cuda_array"):  # Numba's CUDA simulator cannot adopt memory
            raise TypeError(f"{type(x).__name__}: arrays of other libraries need a real GPU; "
                            "Numba's CUDA simulator only runs its own device arrays")
        bits = torch_bfloat16_bits(x)
        if bits is not None:
            return device_view(cuda.as_cuda_array(bits), bfloat16_dtype())
        from ._gpuhost import fastlaunch  # wrapped once per object (see fastlaunch.adopt)

        return fastlaunch.adopt(x, x.__cuda_array_interface__, cuda.as_cuda_array)
    return x


def to_device(x, device: str):
    """``x`` on ``device``: a NumPy array for ``"cpu"``, a Numba device array for ``"cuda"``.

    Returns ``x`` itself when it already lives there (CUDA arrays of other
    libraries are adopted without a copy). A bfloat16 array
    (``ml_dtypes.bfloat16``, or a PyTorch bfloat16 tensor) goes to the GPU as
    its bits: a Numba device array of dtype ``ml_dtypes.bfloat16``, whose
    ``uint16`` view the kernels read; :func:`to_host` brings the same bits back.
    """
    device = check_device(device)
    if device == "cpu":
        return to_host(x)
    if is_cuda_array(x):
        return adopt(x)
    if torch_bfloat16_bits(x) is not None:
        x = to_host(x)
    if is_bfloat16(x):  # its bits, copied as uint16 (Numba cannot type bfloat16)
        return device_view(kernels_for("cuda").asarray(x.view(np.uint16)), x.dtype)
    return kernels_for("cuda").asarray(x)


def device_view(x, dtype):
    """The device array ``x``'s memory as ``dtype`` (of the same item size), no copy.

    ``DeviceNDArray.view`` of numba-cuda 0.30 fails on a 0-d array (it hands
    its empty strides on as a list, which its descriptor cache cannot hash).
    """
    dtype = np.dtype(dtype)
    if x.ndim or simulator_enabled():
        return x.view(dtype)
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    return DeviceNDArray((), (), dtype, stream=x.stream, gpu_data=x.gpu_data)


def copy_from_host_(x, host) -> None:
    """Copy the host array ``host`` (cast to ``x``'s dtype) into the device array ``x``.

    bfloat16 travels as its ``uint16`` bits: numba-cuda hands host memory to
    the driver through Python's buffer protocol, which has no code for
    ``ml_dtypes.bfloat16`` on a real GPU.
    """
    host = np.ascontiguousarray(host, dtype=x.dtype)
    if is_bfloat16(x):
        x, host = device_view(x, np.uint16), host.view(np.uint16)
    x.copy_to_device(host)


def to_host(x):
    """``x`` as a NumPy array (a copy from the GPU; NumPy arrays are returned as they are).

    A copy from the GPU synchronises, so it first raises any index error
    that queued kernels recorded (see :func:`synchronize`).
    """
    if isinstance(x, np.ndarray):
        return x
    if is_cuda_array(x):
        synchronize()
        return adopt(x).copy_to_host()
    bits = torch_bfloat16_bits(x)
    if bits is not None:
        return np.asarray(bits).view(bfloat16_dtype())
    return np.asarray(x)


def synchronize() -> None:
    """Wait for every kernel numbapos queued on the GPU; raise any index error they found.

    GPU ops return as soon as their kernels are queued, and check indices
    inside those kernels: a bad index is raised as the CPU's ``IndexError``
    by the next numbapos call once the host can see it, and at the latest
    here (and by every call that copies to the host: ``to_host``,
    ``state_dict``, reading a parameter). Nothing was modified by the failing
    op or any op queued after it, and the GPU stays usable. Does nothing when
    CUDA was never used.
    """
    errors = sys.modules.get("numbapos._gpuhost.errors")
    if errors is not None:
        errors.synchronize()


# ---------------------------------------------------------------- array metadata


def is_c_contiguous(x) -> bool:
    """Whether ``x`` (NumPy or Numba device array) is C-contiguous."""
    if isinstance(x, np.ndarray):
        return x.flags.c_contiguous
    return bool(x.is_c_contiguous())


def is_writeable(x) -> bool:
    """Device arrays are always writeable; NumPy arrays say so in their flags."""
    return x.flags.writeable if isinstance(x, np.ndarray) else True


def _byte_range(x):
    """``(first, last + 1)`` byte addresses that ``x`` may touch, or None for empty."""
    if x.size == 0:
        return None
    if isinstance(x, np.ndarray):
        base = x.__array_interface__["data"][0]
    elif hasattr(x, "_ary"):  # the simulator's FakeCUDAArray wraps a NumPy array
        return _byte_range(x._ary)
    elif _is_numba_device_array(x):
        # A Numba device array never moves or changes shape: its range is computed once
        # (building __cuda_array_interface__ costs microseconds on every op otherwise).
        found = x.__dict__.get("_numbapos_byte_range")
        if found is None:
            found = x._numbapos_byte_range = _span(x, x.device_ctypes_pointer.value or 0)
        return found
    else:
        base = x.__cuda_array_interface__["data"][0]
    return _span(x, base)


def _span(x, base: int):
    """``(first, last + 1)`` byte addresses of non-empty ``x`` whose first element is at
    ``base``."""
    low = high = base
    for extent, stride in zip(x.shape, x.strides, strict=True):
        if stride >= 0:
            high += (extent - 1) * stride
        else:
            low += (extent - 1) * stride
    return low, high + x.dtype.itemsize


def reshaped(x, shape: tuple):
    """``x.reshape(shape)`` for a C-contiguous array; for a Numba device array the view is
    made once per shape and kept on the array (Numba builds a new one for tens of
    microseconds each time, and an op reshapes the same input and output every step)."""
    if isinstance(x, np.ndarray) or not _is_numba_device_array(x) or hasattr(x, "_ary"):
        return x.reshape(shape)
    if x.shape == shape:
        return x
    views = x.__dict__.get("_numbapos_views")
    if views is None:
        views = x._numbapos_views = {}
    found = views.get(shape)
    if found is None:
        found = views[shape] = x.reshape(shape)
    return found


def may_share_memory(a, b) -> bool:
    """Whether two arrays of one device may overlap (a bounds check, like NumPy's)."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return np.may_share_memory(a, b)
    if device_of(a) != device_of(b):
        return False
    ra, rb = _byte_range(a), _byte_range(b)
    if ra is None or rb is None:
        return False
    return ra[0] < rb[1] and rb[0] < ra[1]


def zeros(shape, dtype, device: str = "cpu"):
    """A zero-filled C-contiguous array on ``device``."""
    if is_bfloat16(np.dtype(dtype)):
        return full(shape, 0, dtype, device)
    return kernels_for(check_device(device)).zeros(shape, dtype)


def empty(shape, dtype, device: str = "cpu"):
    """An uninitialised C-contiguous array on ``device``."""
    return kernels_for(check_device(device)).empty(shape, dtype)


def full(shape, value, dtype, device: str = "cpu"):
    """A C-contiguous array on ``device`` filled with ``value``."""
    K = kernels_for(check_device(device))
    if K.DEVICE == "cuda" and is_bfloat16(np.dtype(dtype)):
        # Filled with the value's bits (a kernel cannot take a bfloat16 array).
        pattern = np.full((), value, dtype).view(np.uint16)[()]
        return K.full(shape, pattern, np.uint16).view(dtype)
    return K.full(shape, value, dtype)


def copy(x):
    """A copy of ``x`` on its own device (NumPy in, NumPy out; CUDA in, Numba device array out)."""
    if is_cuda_array(x):
        arrays = _cuda_arrays()
        x = adopt(x)
        if is_bfloat16(x):  # copied as its bits (the simulator cannot cast bfloat16)
            return device_view(arrays.copy(device_view(x, np.uint16)), x.dtype)
        return arrays.copy(x)
    return np.array(x, copy=True)


def copy_into(out, x):
    """``out`` filled with a copy of ``x`` (same shape and dtype, on ``out``'s device;
    queued on the current stream on a GPU); returns ``out``."""
    if isinstance(out, np.ndarray):
        np.copyto(out, x)
        return out
    return _cuda_arrays().copy_into(out, adopt(x))


def _cuda_arrays():
    """``numbapos.kernels.cuda.arrays`` (no kernels_for: an op may be under way)."""
    found = _ARRAYS_MODULE[0]
    if found is None:
        from .kernels.cuda import arrays

        found = _ARRAYS_MODULE[0] = arrays
    return found


_ARRAYS_MODULE = [None]


def cuda_empty_cache() -> None:
    """Give the GPU memory that numbapos's caching allocator holds back to the driver.

    numbapos installs a caching allocator for Numba's device arrays (as PyTorch
    and CuPy have), unless ``NUMBAPOS_CUDA_MEMORY_POOL=0`` or another Numba
    memory manager is configured; freed blocks are kept for reuse. The ops'
    plans (``numbapos/_gpuhost/plans.py``) are dropped too, with the
    workspaces they hold. Nothing happens when CUDA was never used.
    """
    if "numbapos._gpuhost.memory" in sys.modules:
        sys.modules["numbapos._gpuhost.memory"].empty_cache()
