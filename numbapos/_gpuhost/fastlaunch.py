"""Cheaper launches on a real GPU: each signature resolved once, its parameters packed
by hand and launched with ``cuLaunchKernel``.

``kernel[blocks, threads, stream](*args)`` configures a launch (an
``lru_cache`` lookup), builds a ``_LaunchConfiguration``, types every
argument through the C dispatcher and selects a launch-config dispatcher;
then the compiled kernel's ``launch`` builds a ``cuda.core`` strided memory
view and a parameter holder per argument. On an H100 host that came to about
150 us per launch, more than most embedding kernels run. :func:`launch`
skips all of it after the first launch of a signature: it keys a cache on
the dispatcher and the arguments' Numba types (cached per device array by
Numba itself, so reading them is an attribute lookup), flattens the
arguments as numba-cuda's ``_Kernel._prepare_args`` does (an array is its
meminfo, parent, size, itemsize, data pointer, shape and strides; a tuple its
members), packs them with :mod:`struct` into a buffer whose parameter
pointers were laid out once, and calls the driver's ``cuLaunchKernel`` with
the compiled function's handle (:class:`_Direct`). Signatures with a type it
does not pack, and arguments that are not device memory (a host array Numba
would copy), go through the compiled kernel's own ``launch``.

That uses numba-cuda internals (``dispatcher.overloads``, ``_Kernel.launch``,
``_codelibrary.get_cufunc``, ``driver._to_core_stream``), so it is used only
on a real GPU, only where :func:`supported` finds them (the ``cuda`` extra
pins the numba-cuda minor versions it was written against), and never for
kernels compiled with ``debug``, cooperative or launch-config-sensitive
ones, or with argument extensions. Anything else, and the first launch of
each signature (which compiles), takes the ordinary path.
``NUMBAPOS_CUDA_FAST_LAUNCH=0`` (setting ``cuda_fast_launch``) turns it off.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import struct
import threading
import weakref

import numpy as np
from numba import config as numba_config

from . import streams

__all__ = []  # not launchers


def supported() -> bool:
    """Whether the installed numba-cuda has every internal the fast path relies on."""
    try:
        from numba.cuda import dispatcher
        from numba.cuda.cudadrv import driver
        from numba.cuda.typing.typeof import Purpose, typeof  # noqa: F401
    except ImportError:
        return False
    kernel = getattr(dispatcher, "_Kernel", None)
    if kernel is None or not callable(getattr(kernel, "launch", None)):
        return False
    wanted = ["self", "args", "griddim", "blockdim", "stream", "sharedmem"]
    if list(inspect.signature(kernel.launch).parameters) != wanted:
        return False
    # ``overloads`` is set per dispatcher instance: launch() checks it on each kernel.
    if not callable(getattr(driver, "_to_core_stream", None)):
        return False
    try:
        bindings = streams.bindings()
    except ImportError:
        return False
    return all(callable(getattr(bindings, name, None))
               for name in ("cuLaunchKernel", "cuCtxGetCurrent"))


# On a real GPU with the internals there; whether to use it is the setting
# ``cuda_fast_launch`` (NUMBAPOS_CUDA_FAST_LAUNCH), read at every launch.
ENABLED = not numba_config.ENABLE_CUDASIM and supported()

_compiled: dict = {}  # (dispatcher, ids of argtypes) -> _Direct, or the compiled _Kernel
_signatures: list = []  # the argtypes keyed in _compiled, kept alive (their ids stay theirs)
_core_streams: dict = {}  # id(stream) -> (stream, cuda.core stream)
_stream_handles: dict = {}  # id(stream) -> (stream, raw handle)


def _typeof():
    import numpy as np
    from numba.cuda.typing.typeof import Purpose, typeof

    # Scalars by their Python type (what typeof answers for every value of those types).
    scalars = {kind: typeof(kind(0), Purpose.argument)
               for kind in (bool, float, np.bool_, np.int8, np.int16, np.int32, np.int64,
                            np.uint8, np.uint16, np.uint32, np.uint64, np.float32, np.float64)}

    tuples: dict = {}  # (tuple class, member types) -> its Numba type

    def of(value):
        found = scalars.get(type(value))
        if found is not None:
            return found
        cached = getattr(value, "_numba_type_", None)  # Numba device arrays cache theirs
        if cached is not None:
            return cached
        if isinstance(value, tuple):
            # The records of numbapos._args (hyper-parameters, row groups, ids, tables,
            # dropout, rounding) and tuples of tags: typed from their members' types.
            # Keyed by the members' type ids (hashing Numba types costs microseconds): the
            # cached tuple type holds its members, so while it lives their ids are theirs,
            # and Numba interns types, so an equal member type is that same object.
            key = (type(value), tuple(map(id, map(of, value))))
            found = tuples.get(key)
            if found is None:
                found = tuples[key] = typeof(value, Purpose.argument)
            return found
        return typeof(value, Purpose.argument)
    return of


_type_of = _typeof() if ENABLED else None


def _core_stream(stream):
    """``stream`` as the ``cuda.core`` stream ``_Kernel.launch`` takes (converted once)."""
    found = _core_streams.get(id(stream))
    if found is None or found[0] is not stream:
        from numba.cuda.cudadrv import driver

        if len(_core_streams) > 64:  # streams made and dropped by the hundred: start over
            _core_streams.clear()
        found = _core_streams[id(stream)] = (stream, driver._to_core_stream(stream))
    return found[1]


def _stream_handle(stream) -> int:
    """``stream``'s raw driver handle (0: the legacy default stream), converted once."""
    if not stream:
        return 0
    found = _stream_handles.get(id(stream))
    if found is None or found[0] is not stream:
        if len(_stream_handles) > 64:
            _stream_handles.clear()
        found = _stream_handles[id(stream)] = (stream, streams.handle(stream))
    return found[1]


def launch(kernel, blocks, threads, stream, args) -> bool:
    """Launch through the cached signature; False (nothing launched) where the ordinary
    path must do it."""
    try:
        argtypes = tuple(map(_type_of, args))
    except Exception:
        return False  # an argument Numba types only through its C dispatcher
    # Numba interns its types (one object per type), so their ids name the signature
    # without hashing each type in Python; the cache keeps the types alive.
    key = (kernel, tuple(map(id, argtypes)))
    entry = _compiled.get(key)
    if entry is None:
        compiled = getattr(kernel, "overloads", {}).get(argtypes)
        if (compiled is None or getattr(compiled, "debug", False)
                or getattr(compiled, "launch_config_sensitive", False)
                or getattr(kernel, "_launch_config_sensitive", False)):
            return False  # compile (or launch specially) on the ordinary path first
        entry = _compiled[key] = _Direct.make(compiled, argtypes) or compiled
        _signatures.append(argtypes)
    if type(entry) is _Direct and entry.launch(args, blocks, threads, stream):
        return True
    compiled = entry.compiled if type(entry) is _Direct else entry
    compiled.launch(args, _dim3(blocks), _dim3(threads), _core_stream(stream), 0)
    return True


# ---------------------------------------------------------------- packed parameters

_ARRAY, _VALUE, _HALF = "array", "value", "half"


class _NotPacked(Exception):
    """A type or value the packed launch does not handle: the compiled kernel's launch does."""


def _layout(argtypes) -> tuple[tuple, list]:
    """``(spec, codes)``: how each argument flattens (an array, a value, a float16's bits or
    a tuple's own spec) and the :mod:`struct` code of every kernel parameter, in
    numba-cuda's order (``_Kernel._prepare_args``). :class:`_NotPacked` for other types."""
    from numba.core import types

    codes: list = []

    def walk(ty):
        if isinstance(ty, types.Array):
            codes.extend("q" * (5 + 2 * ty.ndim))  # meminfo, parent, size, itemsize, data
            return _ARRAY
        if isinstance(ty, types.Boolean):
            codes.append("?")
            return _VALUE
        if isinstance(ty, types.Integer):
            codes.append({8: "b", 16: "h", 32: "i", 64: "q"}[ty.bitwidth]
                         if ty.signed else {8: "B", 16: "H", 32: "I", 64: "Q"}[ty.bitwidth])
            return _VALUE
        if ty == types.float16:
            codes.append("H")  # its bits
            return _HALF
        if ty in (types.float32, types.float64):
            codes.append("f" if ty == types.float32 else "d")
            return _VALUE
        if isinstance(ty, types.BaseTuple):
            return tuple(walk(member) for member in ty)
        raise _NotPacked(ty)

    try:
        spec = tuple(walk(ty) for ty in argtypes)
    except (_NotPacked, KeyError, TypeError):
        raise _NotPacked(argtypes) from None
    return spec, codes


def _offsets(codes) -> list:
    """Each parameter's offset in the buffer ``struct`` packs (native alignment)."""
    offsets, at = [], 0
    for code in codes:
        size = struct.calcsize(code)
        at = -(-at // size) * size
        offsets.append(at)
        at += size
    return offsets


def _array_fields(array) -> tuple:
    """A device array's kernel parameters (computed once per array object)."""
    try:
        return array._numbapos_launch_fields
    except AttributeError:
        pass
    if not getattr(array, "__cuda_memory__", False):
        raise _NotPacked(type(array))  # a host array (Numba copies it) or a foreign one
    view = array._strided_memory_view_shim  # what numba-cuda's launch reads, cached there
    strides = view._layout.strides_in_bytes
    if not strides:
        from numba.cuda.np import numpy_support

        strides = numpy_support.strides_from_shape(
            shape=view.shape, itemsize=view.dtype.itemsize,
            c_contiguous=view._layout.is_contiguous_c,
            f_contiguous=view._layout.is_contiguous_f)
    fields = (0, 0, view.size, view.dtype.itemsize, view.ptr or 0, *view.shape, *strides)
    array._numbapos_launch_fields = fields
    return fields


def _flatten(spec, args, out: list, marks: list | None = None) -> None:
    """Append the kernel parameters of ``args`` (laid out by ``spec``) to ``out``; with
    ``marks``, note where each array's data pointer went (see :func:`flatten_marked`)."""
    if len(spec) != len(args):
        raise _NotPacked(len(args))
    for kind, value in zip(spec, args, strict=False):  # lengths checked above
        if kind is _ARRAY:
            if marks is not None:
                marks.append((len(out) + 4, value))
            out.extend(_array_fields(value))
        elif kind is _VALUE:
            out.append(value)
        elif kind is _HALF:
            out.append(int(np.float16(value).view(np.uint16)))
        else:
            _flatten(kind, value, out, marks)


def _cuda_driver():
    """cuda-bindings' driver module (the tests stand in for it here)."""
    return streams.bindings()


class _Direct:
    """One compiled signature launched with ``cuLaunchKernel`` and packed parameters.

    The parameters are packed into one buffer whose pointer array is built
    once; ``cuLaunchKernel`` copies them before it returns, so a lock around
    packing and launching is all that sharing the buffer between threads needs.
    """

    __slots__ = ("compiled", "spec", "format", "buffer", "pointers", "offsets", "address",
                 "lock", "functions")

    def __init__(self, compiled, spec, codes):
        self.compiled = compiled
        self.spec = spec
        self.format = "@" + "".join(codes)
        self.buffer = ctypes.create_string_buffer(max(struct.calcsize(self.format), 1))
        base = ctypes.addressof(self.buffer)
        self.offsets = _offsets(codes)
        self.pointers = (ctypes.c_void_p * max(len(codes), 1))(
            *(base + offset for offset in self.offsets))
        self.address = ctypes.addressof(self.pointers)
        self.lock = threading.Lock()
        self.functions: dict = {}  # CUDA context handle -> the kernel's function handle

    @classmethod
    def make(cls, compiled, argtypes):
        """A packed launcher for ``compiled``, or None where it must launch itself."""
        if (getattr(compiled, "extensions", None) or getattr(compiled, "cooperative", False)
                or not callable(getattr(getattr(compiled, "_codelibrary", None),
                                        "get_cufunc", None))):
            return None
        try:
            spec, codes = _layout(argtypes)
        except _NotPacked:
            return None
        return cls(compiled, spec, codes)

    def function(self, context: int):
        """The kernel's function handle in CUDA context ``context`` (loaded once)."""
        function = self.functions.get(context)
        if function is None:
            function = self.functions[context] = self.compiled._codelibrary.get_cufunc().handle
        return function

    def launch(self, args, blocks, threads, stream) -> bool:
        """Launch on ``stream``; False (nothing launched) for arguments it does not pack."""
        values: list = []
        try:
            _flatten(self.spec, args, values)
        except _NotPacked:
            return False
        context = current_context_handle()
        if not context:
            return False  # no context in this thread yet: Numba's launch makes it current
        function = self.function(context)
        grid, block, handle = _dim3(blocks), _dim3(threads), _stream_handle(stream)
        with self.lock:
            try:
                struct.pack_into(self.format, self.buffer, 0, *values)
            except struct.error:
                return False  # a value out of its type's range: Numba's launch decides
            launch_kernel(self, function, grid, block, handle)
        return True


def launch_kernel(packed, function, grid, block, stream: int) -> None:
    """``cuLaunchKernel`` of ``function`` with the parameters of ``packed`` (a
    :class:`_Direct` or a plan's step: ``format`` and ``buffer`` hold the packed values,
    ``address`` their pointer array) on the raw ``stream`` handle. Every packed launch
    goes through here (the host-cost tests read the parameters it is given)."""
    driver = _cuda_driver()
    err, = driver.cuLaunchKernel(function, *grid, *block, 0, stream, packed.address, 0)
    if err != driver.CUresult.CUDA_SUCCESS:
        from numba.cuda.cudadrv.driver import CudaAPIError

        raise CudaAPIError(err, "cuLaunchKernel failed")


def current_context_handle() -> int:
    """The raw handle of this thread's current CUDA context (0: none)."""
    driver = _cuda_driver()
    err, context = driver.cuCtxGetCurrent()
    return int(context) if err == driver.CUresult.CUDA_SUCCESS else 0


def direct_for(kernel, args):
    """The packed launcher a launch of ``kernel`` with ``args`` went through, or None."""
    try:
        argtypes = tuple(map(_type_of, args))
    except Exception:
        return None
    entry = _compiled.get((kernel, tuple(map(id, argtypes))))
    return entry if type(entry) is _Direct else None


def flatten_marked(spec, args) -> tuple[list, list]:
    """``(values, marks)``: the kernel parameters of ``args`` and, for each array among
    them, ``(index of its data pointer in values, the array)``."""
    values: list = []
    marks: list = []
    _flatten(spec, args, values, marks)
    return values, marks


def _dim3(extent) -> tuple:
    """A grid or block extent as the 3-tuple numba-cuda's launch takes."""
    if isinstance(extent, tuple):
        return tuple(int(e) for e in extent) + (1,) * (3 - len(extent))
    return (int(extent), 1, 1)


# ---------------------------------------------------------------- one native call


@functools.cache
def native_launcher():
    """``launch_all(table, stream)``: every row of ``table`` (uint64 ``(k, 8)``: function,
    grid x, y, z, block x, y, z, address of its parameter pointers) launched on the raw
    ``stream`` handle by the driver's ``cuLaunchKernel``, called from compiled code; it
    returns -1, or ``row * 1000 + error`` at the first launch that fails (the rest are not
    launched). None where the driver library or Numba cannot give that.

    The function pointer is the one cuda-bindings itself calls: the driver's
    ``cuGetProcAddress`` asked, through cuda-bindings, for ``cuLaunchKernel`` in the
    stream semantics cuda-bindings uses (per-thread default stream where
    ``CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM`` asks for it). Compiled on first
    use and never cached to disk: the pointer is baked in.
    """
    address = _driver_function("cuLaunchKernel")
    if not address:
        return None
    from numba import njit

    u32, u64 = ctypes.c_uint, ctypes.c_uint64
    # CUresult cuLaunchKernel(CUfunction, unsigned gridDimX, gridDimY, gridDimZ, blockDimX,
    # blockDimY, blockDimZ, unsigned sharedMemBytes, CUstream, void **params, void **extra):
    # the handles and pointers pass as 64-bit integers (the same registers).
    prototype = ctypes.CFUNCTYPE(ctypes.c_int, u64, u32, u32, u32, u32, u32, u32, u32, u64,
                                 u64, u64)
    cu_launch_kernel = prototype(address)

    @njit(cache=False, nogil=True)
    def launch_all(table, stream):
        for row in range(table.shape[0]):
            err = cu_launch_kernel(table[row, 0], table[row, 1], table[row, 2],
                                   table[row, 3], table[row, 4], table[row, 5],
                                   table[row, 6], 0, stream, table[row, 7], 0)
            if err != 0:
                return row * 1000 + err
        return -1

    launch_all._keep = cu_launch_kernel  # the ctypes object behind the baked-in pointer
    return launch_all


def _driver_function(name: str) -> int:
    """The address of the driver's ``name`` (its CUDA 12.0 version), as cuda-bindings
    resolves it; 0 where the driver does not give it."""
    import os

    driver = _cuda_driver()
    flags = driver.CUdriverProcAddress_flags
    per_thread = os.environ.get("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "0") not in ("", "0")
    try:
        err, address, status = driver.cuGetProcAddress(
            name.encode(), 12000, flags.CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
            if per_thread else flags.CU_GET_PROC_ADDRESS_DEFAULT)
    except Exception:  # an older cuda-bindings, a driver without the call
        return 0
    found = driver.CUdriverProcAddressQueryResult.CU_GET_PROC_ADDRESS_SUCCESS
    if err != driver.CUresult.CUDA_SUCCESS or status != found:
        return 0
    return int(address)


def raise_launch_failure(code: int) -> None:
    """The CudaAPIError of a failed native launch (``native_launcher``'s return value)."""
    from numba.cuda.cudadrv.driver import CudaAPIError

    row, err = divmod(code, 1000)
    raise CudaAPIError(err, f"cuLaunchKernel of a planned op's kernel {row} failed")


# ---------------------------------------------------------------- outputs


def memory_view(memory, offset: int, size: int, pointer=None):
    """``size`` bytes of the Numba memory pointer ``memory`` from ``offset``, keeping it alive
    (``pointer``: their address, when the caller knows it).

    ``MemoryPointer.view`` also counts references for an explicit ``free()`` (an
    ``OwnedPointer`` with a finalizer: about 3 us); a plan's output views only need
    their block to live as long as they do, which ``owner`` gives. The view's
    attributes are set directly: those ``MemoryPointer(context, pointer, size,
    owner=memory)`` sets, checked once against Numba's own.
    """
    if pointer is None:
        pointer = memory.device_pointer_value + offset
    if not _VIEW:
        _VIEW.append(_view_maker())
    cls, device_pointer, direct = _VIEW[0]
    if not direct:  # Numba's MemoryPointer changed: its constructor
        return cls(memory.context, device_pointer(pointer), size, owner=memory)
    view = cls.__new__(cls)
    view.__dict__ = {"context": memory.context, "_numbapos_address": pointer, "size": size,
                     "_cuda_memsize_": size, "is_managed": False, "refct": 1, "_owner": memory}
    return view


_VIEW: list = []  # (View, CUdeviceptr, whether set directly), made on first use


def _view_maker():
    """``(View, CUdeviceptr, direct)``: ``direct`` when Numba's ``MemoryPointer`` has the
    attributes a view's ``__dict__`` is given here (checked against one it made);
    otherwise views are made by its constructor."""
    from numba.cuda.cudadrv.driver import MemoryPointer, binding

    device_pointer = binding.CUdeviceptr
    handle = device_pointer(0)
    fields = vars(MemoryPointer(None, handle, 0, owner=0))
    expected = {"context": None, "device_pointer": handle, "size": 0, "_cuda_memsize_": 0,
                "is_managed": False, "refct": 1, "handle": handle, "_owner": 0}
    direct = set(fields) == set(expected) and all(
        fields[name] is value or fields[name] == value for name, value in expected.items())

    class View(MemoryPointer):
        """Memory inside another's (a plan's output, an adopted array), made without its
        ``CUdeviceptr``: Numba's ``device_pointer`` and ``handle`` are made from
        ``_numbapos_address`` when first read (numbapos's launches read the address
        from the array's launch fields, so most views never need it: about 0.3 us
        each)."""

        def __getattr__(self, name):  # only for attributes the instance lacks
            if name != "device_pointer" and name != "handle":
                raise AttributeError(f"{type(self).__name__!r} object has no attribute "
                                     f"{name!r}")
            state = self.__dict__
            handle = state["device_pointer"] = state["handle"] = device_pointer(
                state["_numbapos_address"])
            return handle

    return View, device_pointer, direct


_OWN_MEMORY = ("gpu_data", "_strided_memory_view_shim")  # per array, never copied


class ArrayFactory:
    """New device arrays like ``example`` (same shape, dtype, stream), without Numba's
    constructor.

    ``DeviceNDArray(...)`` normalises its shape, builds a descriptor and looks up
    the context on every call (about 10 us); a plan's outputs always have the same
    metadata. The factory keeps the example's attributes but its memory
    (``described``: its plan description, see :mod:`.plans`), and gives each new
    array those attributes, a fresh block from the context's memory manager
    (numbapos's caching pool), and the launch fields and plan description that
    launches and plans would otherwise work out on first use. Returns
    ``(array, data pointer)``.
    """

    __slots__ = ("state", "nbytes", "head", "tail", "signature", "low", "high", "cls",
                 "context")

    def __init__(self, example, described, context):
        self.cls = type(example)
        _type_of(example)  # Numba caches the type in the array's __dict__: copied below
        # Not the memory, nor what describes the example's memory: numba-cuda's own launch
        # reads the data pointer from the cached _strided_memory_view_shim (a new array
        # carrying the example's would have kernels launched the ordinary way read and
        # write the example's old block: found on an H200).
        self.state = {name: value for name, value in example.__dict__.items()
                      if name not in _OWN_MEMORY and not name.startswith("_numbapos")}
        self.nbytes = example.alloc_size
        fields = _array_fields(example)
        self.head, self.tail = fields[:4], fields[5:]
        # The pool's blocks are 512-byte aligned, as the example's was (its signature's).
        self.signature, self.low, self.high = (described[0], described[2] - described[1],
                                               described[3] - described[1])
        self.context = context

    @classmethod
    def like(cls, example, context):
        """A factory of C-contiguous arrays like ``example`` (a fresh C-contiguous one)."""
        from .plans import interned  # (plans imports this module)

        pointer = _array_fields(example)[4]
        signature = interned((example.dtype, example.shape, example.strides, 0))
        return cls(example, (signature, pointer, pointer, pointer + example.alloc_size), context)

    def __call__(self, memory=None, pointer=None):
        """A new array on ``memory`` (a Numba memory pointer, at address ``pointer`` when the
        caller knows it), or on a new block."""
        if memory is None:
            memory = self.context.memalloc(self.nbytes)
        if pointer is None:
            pointer = memory.device_pointer_value
        array = self.cls.__new__(self.cls)
        state = array.__dict__
        state.update(self.state)
        state["gpu_data"] = memory
        state["_numbapos_launch_fields"] = (*self.head, pointer, *self.tail)
        state["_numbapos_plan"] = (self.signature, pointer, pointer + self.low,
                                   pointer + self.high)
        return array, pointer



# ---------------------------------------------------------------- foreign arrays

_ADOPTED: dict = {}  # id(object) -> (weak reference to it, interface key, ArrayFactory)
MAX_ADOPTED = 1024


def _forget_adopted(ref) -> None:
    entry = _ADOPTED.get(ref.key)
    if entry is not None and entry[0] is ref:
        del _ADOPTED[ref.key]


class _AdoptedRef(weakref.ref):
    __slots__ = ("key",)


def adopt(x, interface, wrap):
    """A Numba device array on the memory of ``x`` (a CuPy array, a PyTorch CUDA tensor:
    an object whose ``__cuda_array_interface__`` is ``interface``); ``wrap(x)`` makes it
    the first time (``numba.cuda.as_cuda_array``).

    Later calls with the same object, whose interface says the same (pointer, shape,
    strides, dtype, stream) in the same context, make the array from a factory
    (about 1 us instead of Numba's constructor and its context lookup). The cache
    holds a weak reference to the object and never the object itself (each array
    made holds it, as Numba's does), so a freed object's entry goes with it and a
    new object at its address is wrapped anew. Objects that cannot be weakly
    referenced, masked arrays and interfaces with a stream (whose Numba wrapper
    synchronises it) are wrapped by ``wrap`` every time.
    """
    if interface.get("mask") is not None or interface.get("stream") is not None:
        return wrap(x)
    from . import errors

    context = errors.current_context()
    try:
        key = (interface["data"][0], tuple(interface["shape"]), interface.get("strides"),
               interface["typestr"], id(context))
        hash(key)
    except (KeyError, TypeError, IndexError):
        return wrap(x)  # Numba's wrapper says what is wrong
    entry = _ADOPTED.get(id(x))
    if entry is not None and entry[0]() is x and entry[1] == key:
        factory = entry[2]
        pointer = key[0]
        return factory(_owned_memory(context, pointer, factory.nbytes, x), pointer)[0]
    made = wrap(x)
    from . import plans

    described = plans._described(made)  # None for anything but a Numba device array
    if described is None or not made.size or described[1] != key[0]:
        return made
    try:
        ref = _AdoptedRef(x, _forget_adopted)
    except TypeError:  # not weakly referenceable: wrapped every time
        return made
    ref.key = id(x)
    if len(_ADOPTED) >= MAX_ADOPTED:
        _ADOPTED.clear()
    _ADOPTED[ref.key] = (ref, key, ArrayFactory(made, described, context))
    return made


def _owned_memory(context, pointer: int, size: int, owner):
    """A Numba memory pointer to ``size`` bytes at ``pointer`` that keeps ``owner`` alive
    (what ``numba.cuda.as_cuda_array`` builds, its attributes set directly)."""
    if not _VIEW:
        _VIEW.append(_view_maker())
    cls, device_pointer, direct = _VIEW[0]
    if not direct:
        return cls(context, device_pointer(pointer), size, owner=owner)
    memory = cls.__new__(cls)
    memory.__dict__ = {"context": context, "_numbapos_address": pointer, "size": size,
                       "_cuda_memsize_": size, "is_managed": False, "refct": 1,
                       "_owner": owner}
    return memory
