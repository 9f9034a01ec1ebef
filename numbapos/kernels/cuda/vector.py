"""16-byte vector loads and stores for the row kernels, and the host test that allows them.

Why: a row copy written element by element compiles to alternating
``ld.global.f32`` / ``st.global.f32`` (Numba must assume the output may
alias the input, so each store waits for its load): 4 bytes in flight per
thread, a few per cent of HBM bandwidth. :func:`load_lanes` / :func:`store_lanes`
move 16 bytes at once through a ``<N x T>*`` with ``align 16`` (N = 16 /
itemsize: 4 float32, 2 float64, 8 uint16), which NVVM emits as one
``ld.global.v4.f32`` / ``st.global.v4.f32`` (``.v2.f64``, ``.v4.b32``); a
kernel that loads two or more vectors before it stores them keeps 32 bytes
or more in flight per thread.

When: a 16-byte access must be 16-byte aligned, or the GPU faults. The
launchers call :func:`aligned` on the host (a few attribute reads, no
transfer) and launch the vector kernel only when every array's data pointer
and row stride are multiples of 16 bytes, its rows are contiguous and a row
is a whole number of vectors; anything else (a table view such as
``table[:, 1:]``, D % 4 != 0 for float32) takes the scalar kernel, with the
same results.

One kernel body serves both: it moves ``lanes`` adjacent columns at a time
(one element, or one 16-byte vector) and computes them with :func:`per_lane`,
``lanes`` being a compile-time constant (an argument of the kernel's
factory), so the scalar and the vector kernel are each compiled to the code a
hand-written twin gives.

On Numba's CUDA simulator, which runs kernels as Python and cannot run an
LLVM intrinsic, the helpers are the plain Python functions below (element by
element, so the bits are those of the scalar kernels); they also assert the
alignment the hardware would demand, so a wrong host decision fails the
simulated tests instead of faulting on a GPU.
"""

from numba import config

from .arrays import THREADS

__all__ = []  # device helpers, not launchers

VECTOR_BYTES = 16


def lanes(dtype) -> int:
    """Elements of ``dtype`` in one 16-byte vector."""
    return VECTOR_BYTES // dtype.itemsize


def address(arr) -> int:
    """The device address of ``arr``'s first element (the simulator's host address there).

    A Numba device array's pointer is read directly (what its
    ``__cuda_array_interface__`` reports, without building that dict).
    """
    pointer = getattr(arr, "device_ctypes_pointer", None)
    if pointer is not None:
        return pointer.value or 0
    interface = getattr(arr, "__cuda_array_interface__", None)
    if interface is not None:
        return interface["data"][0]
    return arr.__array_interface__["data"][0]  # the simulator's arrays: NumPy in disguise


def aligned(*arrays) -> bool:
    """Whether every 2-D array can be read and written by whole 16-byte vectors.

    True when each one's data pointer and row stride (bytes) are multiples of
    16, its last axis is contiguous and its row length in bytes is a multiple
    of 16. Empty arrays never are (the scalar kernels handle them).
    """
    for arr in arrays:
        itemsize = arr.dtype.itemsize
        rows, dim = arr.shape
        if rows == 0 or dim == 0 or (dim * itemsize) % VECTOR_BYTES:
            return False
        row_stride, col_stride = arr.strides
        if (col_stride != itemsize or (rows > 1 and row_stride % VECTOR_BYTES)
                or address(arr) % VECTOR_BYTES):
            return False
    return True


def row_threads(dim: int, per_thread: int = 1) -> int:
    """Threads of a per-row block without reductions: whole warps covering ``dim`` with
    ``per_thread`` columns (or vectors) each, at most THREADS."""
    return min(THREADS, -(-dim // (32 * per_thread)) * 32)


def _check_aligned(arr, i, j, count):
    assert count * arr.dtype.itemsize in (VECTOR_BYTES, 2 * VECTOR_BYTES), "not whole vectors"
    row = arr[i]
    offset = row.__array_interface__["data"][0] + j * row.strides[0]
    assert offset % VECTOR_BYTES == 0, "a 16-byte vector access at a misaligned address"
    assert row.strides[0] == arr.dtype.itemsize, "a 16-byte vector access along a strided row"


def load_lanes(arr, i, j, lanes):
    """``arr[i, j : j + lanes]`` as a ``lanes``-tuple: one element (``lanes`` 1), or one
    16-byte load (``lanes * itemsize == 16``: ``&arr[i, j]`` 16-byte aligned, see
    :func:`aligned`). ``lanes`` must be a compile-time constant."""
    if lanes == 1:
        return (arr[i, j],)
    _check_aligned(arr, i, j, lanes)
    return tuple([arr[i, j + k] for k in range(lanes)])


def store_lanes(arr, i, j, values):
    """``arr[i, j : j + len(values)] = values`` (cast to ``arr``'s dtype): one element, or
    whole 16-byte vectors (one or two), aligned as for :func:`load_lanes`."""
    if len(values) > 1:
        _check_aligned(arr, i, j, len(values))
    for k, value in enumerate(values):
        arr[i, j + k] = value


def per_lane(f, lanes, *args):
    """``(f(0, *args), f(1, *args), ..., f(n - 1, *args))``: the device function ``f`` of
    each of ``n`` lanes, ``lanes`` being ``n`` (1, 2, 4 or 8, a compile-time constant) or
    a tuple of ``n`` items; each call gets its lane index as a constant, as in a
    hand-unrolled kernel. (An int passed on in ``args`` is no constant in ``f``: a
    helper that needs the lane count as one is defined in its kernel's factory.)"""
    n = len(lanes) if isinstance(lanes, tuple) else lanes
    return tuple([f(k, *args) for k in range(n)])


def fold_lanes(f, state, values, *args):
    """``state`` through ``f(state, x, *args)`` for each ``x`` of the tuple ``values`` in
    turn (a sum over the lanes in their order, say).

    One lane is a plain call. Several are a loop, which NVVM unrolls but which keeps
    it from unrolling the row loop around it: what the hand-written vector kernels
    compiled to (one lane leaves the scalar kernels' row loops to NVVM's unroller).
    """
    for x in values:
        state = f(state, x, *args)
    return state


if not config.ENABLE_CUDASIM:  # pragma: no cover - compiled for real GPUs only
    from llvmlite import ir
    from numba.cuda import cgutils, types
    from numba.cuda.extending import intrinsic, overload

    _GLOBAL = 1  # NVPTX's global address space

    def _vector_args(array, i, j):
        """The vector's type for a 2-D array of numbers and integer indices, else None."""
        if not (isinstance(array, types.Array) and array.ndim == 2
                and isinstance(array.dtype, (types.Integer, types.Float))
                and isinstance(i, types.Integer) and isinstance(j, types.Integer)):
            return None
        width = array.dtype.bitwidth // 8
        if VECTOR_BYTES % width:
            return None
        return types.UniTuple(array.dtype, VECTOR_BYTES // width)

    def _vector_type(dtype):
        """The LLVM type 16 bytes of ``dtype`` move as: ``<N x T>`` for 32- and 64-bit
        elements, ``<4 x i32>`` for narrower ones (NVPTX splits ``<8 x i16>`` into two
        8-byte accesses, and LLVM folds a bitcast of the loaded words back into that)."""
        bits = dtype.bitwidth
        if bits < 32:
            return ir.VectorType(ir.IntType(32), VECTOR_BYTES // 4)
        element = ir.IntType(bits) if isinstance(dtype, types.Integer) else (
            ir.FloatType() if bits == 32 else ir.DoubleType())
        return ir.VectorType(element, VECTOR_BYTES * 8 // bits)

    def _unpack(builder, vector, dtype):
        """The elements of a loaded vector, in memory order (narrow ones cut out of the
        32-bit words by shifts: the GPU is little-endian)."""
        count = vector.type.count
        words = [builder.extract_element(vector, ir.Constant(ir.IntType(32), k))
                 for k in range(count)]
        bits = dtype.bitwidth
        if bits >= 32:
            return words
        narrow = ir.IntType(bits)
        return [builder.trunc(builder.lshr(word, ir.Constant(word.type, shift)), narrow)
                for word in words for shift in range(0, 32, bits)]

    def _pack(builder, values, vtype, dtype):
        """A vector of type ``vtype`` holding ``values`` (elements of ``dtype``) in memory
        order: the inverse of :func:`_unpack`."""
        bits = dtype.bitwidth
        if bits < 32:
            per = 32 // bits
            words = []
            for k in range(0, len(values), per):
                word = ir.Constant(ir.IntType(32), 0)
                for m in range(per):
                    part = builder.zext(values[k + m], ir.IntType(32))
                    word = builder.or_(word, builder.shl(part, ir.Constant(ir.IntType(32),
                                                                             m * bits)))
                words.append(word)
            values = words
        vector = ir.Constant(vtype, ir.Undefined)
        for k, value in enumerate(values):
            vector = builder.insert_element(vector, value, ir.Constant(ir.IntType(32), k))
        return vector

    def _vector_pointer(context, builder, aryty, ary, ity, i, jty, j, vtype):
        """``&ary[i, j]`` as a global-memory pointer to the vector type ``vtype`` (device
        arrays live in global memory; saying so keeps ``ld.global`` for strided views,
        where NVVM would otherwise emit generic loads)."""
        array = context.make_array(aryty)(context, builder, value=ary)
        indices = [context.cast(builder, i, ity, types.intp),
                   context.cast(builder, j, jty, types.intp)]
        ptr = cgutils.get_item_pointer(context, builder, aryty, array, indices)
        ptr = builder.bitcast(ptr, vtype.as_pointer())
        return builder.addrspacecast(ptr, vtype.as_pointer(_GLOBAL))

    @intrinsic
    def _load16(typingctx, array, i, j):
        tuple_type = _vector_args(array, i, j)
        if tuple_type is None:
            return None

        def codegen(context, builder, sig, args):
            aryty, ity, jty = sig.args
            vtype = _vector_type(aryty.dtype)
            ptr = _vector_pointer(context, builder, aryty, args[0], ity, args[1], jty, args[2],
                                  vtype)
            vector = builder.load(ptr, align=VECTOR_BYTES)
            values = _unpack(builder, vector, aryty.dtype)
            return context.make_tuple(builder, sig.return_type, values)

        return tuple_type(array, i, j), codegen

    @intrinsic
    def _store16(typingctx, array, i, j, values):
        tuple_type = _vector_args(array, i, j)
        if (tuple_type is None or not isinstance(values, types.UniTuple)
                or values.count != tuple_type.count
                or not isinstance(values.dtype, (types.Integer, types.Float))):
            return None

        def codegen(context, builder, sig, args):
            aryty, ity, jty, valty = sig.args
            vtype = _vector_type(aryty.dtype)
            ptr = _vector_pointer(context, builder, aryty, args[0], ity, args[1], jty, args[2],
                                  vtype)
            values = [context.cast(builder, builder.extract_value(args[3], k), valty.dtype,
                                   aryty.dtype) for k in range(valty.count)]
            builder.store(_pack(builder, values, vtype, aryty.dtype), ptr, align=VECTOR_BYTES)
            return context.get_dummy_value()

        return types.void(array, i, j, values), codegen

    def _literal(lanes):
        """A lane count: the value of an int literal, or the length of a tuple."""
        if isinstance(lanes, types.BaseTuple):
            return len(lanes)
        return lanes.literal_value if isinstance(lanes, types.IntegerLiteral) else None

    @overload(load_lanes, target="cuda", inline="always")
    def _load_lanes_cuda(arr, i, j, lanes):
        tuple_type = _vector_args(arr, i, j)
        if tuple_type is None or _literal(lanes) not in (1, tuple_type.count):
            return None  # (a non-literal lanes is retried as its literal)
        if _literal(lanes) == 1:
            return lambda arr, i, j, lanes: (arr[i, j],)
        return lambda arr, i, j, lanes: _load16(arr, i, j)

    @overload(store_lanes, target="cuda", inline="always")
    def _store_lanes_cuda(arr, i, j, values):
        tuple_type = _vector_args(arr, i, j)
        if tuple_type is None or not isinstance(values, types.UniTuple):
            return None
        n = tuple_type.count
        if values.count == 1:
            def store_one(arr, i, j, values):
                arr[i, j] = values[0]
            return store_one
        if values.count == n:
            return lambda arr, i, j, values: _store16(arr, i, j, values)
        if values.count == 2 * n:
            def store_two(arr, i, j, values):
                _store16(arr, i, j, values[:n])
                _store16(arr, i, j + n, values[n:])
            return store_two
        return None

    # One implementation per lane count: each lane's call gets its index as a constant.
    _PER_LANE = {
        1: lambda f, lanes, *args: (f(0, *args),),
        2: lambda f, lanes, *args: (f(0, *args), f(1, *args)),
        3: lambda f, lanes, *args: (f(0, *args), f(1, *args), f(2, *args)),
        4: lambda f, lanes, *args: (f(0, *args), f(1, *args), f(2, *args), f(3, *args)),
        8: lambda f, lanes, *args: (f(0, *args), f(1, *args), f(2, *args), f(3, *args),
                                    f(4, *args), f(5, *args), f(6, *args), f(7, *args)),
    }

    @overload(per_lane, target="cuda")  # (the inliner takes no *args; NVVM inlines it)
    def _per_lane_cuda(f, lanes, *args):
        return _PER_LANE.get(_literal(lanes))

    def _fold_one(f, state, values, *args):
        return f(state, values[0], *args)

    @overload(fold_lanes, target="cuda")
    def _fold_lanes_cuda(f, state, values, *args):
        return _fold_one if len(values) == 1 else fold_lanes  # (the loop above)

