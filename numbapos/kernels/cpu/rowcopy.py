"""``copy_row(dst, i, src, j)``: ``dst[i, :] = src[j, :]`` as one ``memcpy`` where it can be.

``put_row(dst, i, src, j, stream)`` is the same copy, with non-temporal
stores when ``stream`` is True (None: ``copy_row``): for outputs larger than
the last-level cache, see :data:`STREAM_MIN_BYTES`.

A lookup copies whole table rows. Written as an element loop, LLVM vectorises
it but keeps a runtime overlap check and a scalar tail per row; the C
library's ``memcpy`` moves a 3 KB row (D = 768, float32) in fewer, wider
stores (the copy is most of a small call; ``docs/performance.rst``).

The caller guarantees that ``dst`` and ``src`` do not overlap (a lookup's
``out`` never shares memory with the table: the functional ops check it).
Rows that are not contiguous (a column-sliced or transposed table) take the
element loop, so any 2-D layout gives the same result.
"""

import platform

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ... import config
from .jit import kernel
from .rowaddress import row_address

__all__ = ["STREAM_MIN_BYTES", "copy_row", "put_row", "streams"]

STREAM_MIN_BYTES = 32 << 20
"""The default of :mod:`numbapos.config`'s ``stream_min_bytes``: outputs of at least
this many bytes are written with non-temporal stores (:func:`streams`).

A store to a line not in the cache first reads that line from memory (to
merge it), so an ordinary copy of N bytes moves 3N; a non-temporal store
writes whole lines past the cache and moves 2N. But the written rows then are not
in the cache: an output that fits in the last-level cache (32 MB there) is
read back by its consumer faster from there, so smaller outputs keep ordinary
stores. (The processor's reported cache size is not trusted: VMs report the
host's.)
"""

_X86 = platform.machine().lower() in ("x86_64", "amd64")


_I64 = ir.IntType(64)
_BYTE_PTR = ir.IntType(8).as_pointer()


def _row_pair(dst, i, src, j) -> bool:
    """The intrinsics' typing: two 2-D arrays of one dtype and two integer row numbers."""
    return (isinstance(dst, types.Array) and isinstance(src, types.Array)
            and dst.ndim == 2 and src.ndim == 2 and dst.dtype == src.dtype
            and isinstance(i, types.Integer) and isinstance(j, types.Integer))


def _row_addresses(context, builder, signature, args):
    """``(address of dst[i], address of src[j], bytes per row)`` as i64 values."""
    dst_type, i_type, src_type, j_type = signature.args
    src_array = context.make_array(src_type)(context, builder, args[2])
    size = builder.mul(builder.extract_value(src_array.shape, 1),
                       ir.Constant(_I64, src_type.dtype.bitwidth // 8))
    return (row_address(context, builder, dst_type, args[0], args[1], i_type),
            row_address(context, builder, src_type, args[2], args[3], j_type), size)


@intrinsic
def _memcpy_row(typingctx, dst, i, src, j):
    """``memcpy`` of ``src[j]`` onto ``dst[i]`` (2-D, one dtype, both rows contiguous)."""
    if not _row_pair(dst, i, src, j):
        return None

    def codegen(context, builder, signature, args):
        to, source, size = _row_addresses(context, builder, signature, args)
        cgutils.raw_memcpy(builder, builder.inttoptr(to, _BYTE_PTR),
                           builder.inttoptr(source, _BYTE_PTR), size, 1)
        return context.get_dummy_value()

    return types.void(dst, i, src, j), codegen


@intrinsic
def _stream_row(typingctx, dst, i, src, j):
    """``src[j]`` onto ``dst[i]`` with non-temporal stores (x86; 2-D, one dtype, rows contiguous).

    Bytes up to the first 64-byte boundary of the destination row and after the
    last one go by ``memcpy``; the 64-byte blocks between by one non-temporal
    vector store each (one ``vmovntdq`` with AVX-512, two or four without).
    An ``sfence`` ends the row, so the weakly ordered stores are visible
    before anything the thread stores later (the parallel loop's join).
    """
    if not _row_pair(dst, i, src, j):
        return None

    def codegen(context, builder, signature, args):
        to, source, size = _row_addresses(context, builder, signature, args)

        def const(value):
            return ir.Constant(_I64, value)

        byte_ptr = _BYTE_PTR
        # Bytes to the destination's next 64-byte boundary (at most the row).
        head = builder.and_(builder.sub(const(0), to), const(63))
        head = builder.select(builder.icmp_unsigned("<", size, head), size, head)
        cgutils.raw_memcpy(builder, builder.inttoptr(to, byte_ptr),
                           builder.inttoptr(source, byte_ptr), head, 1)
        blocks = builder.lshr(builder.sub(size, head), const(6))
        block = ir.VectorType(ir.IntType(32), 16)
        block_ptr = block.as_pointer()
        to_blocks = builder.inttoptr(builder.add(to, head), block_ptr)
        from_blocks = builder.inttoptr(builder.add(source, head), block_ptr)
        nontemporal = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        with cgutils.for_range(builder, blocks) as loop:
            value = builder.load(builder.gep(from_blocks, [loop.index]), align=1)
            store = builder.store(value, builder.gep(to_blocks, [loop.index]), align=64)
            store.set_metadata("nontemporal", nontemporal)
        done = builder.add(head, builder.shl(blocks, const(6)))
        cgutils.raw_memcpy(builder, builder.inttoptr(builder.add(to, done), byte_ptr),
                           builder.inttoptr(builder.add(source, done), byte_ptr),
                           builder.sub(size, done), 1)
        sfence = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse.sfence")
        builder.call(sfence, [])
        return context.get_dummy_value()

    return types.void(dst, i, src, j), codegen


@kernel(inline="always")
def put_row(dst, i, src, j, stream):
    """:func:`copy_row`, with non-temporal stores when ``stream`` is True (None: not).

    ``stream`` picks the code when the kernel is compiled (see
    :func:`.arrays.option`); rows that are not contiguous, and processors
    other than x86-64, take :func:`copy_row`. The bits are the same either way.
    """
    if stream is None:
        copy_row(dst, i, src, j)
    elif _X86 and src.strides[1] == src.itemsize and dst.strides[1] == dst.itemsize:
        _stream_row(dst, i, src, j)
    else:
        copy_row(dst, i, src, j)


@kernel(inline="always")
def copy_row(dst, i, src, j):
    """``dst[i, :] = src[j, :]`` for 2-D arrays of one dtype that do not overlap."""
    dim = src.shape[1]
    if src.strides[1] == src.itemsize and dst.strides[1] == dst.itemsize:
        _memcpy_row(dst, i, src, j)
    else:
        for d in range(dim):
            dst[i, d] = src[j, d]


def streams(nbytes: int) -> bool:
    """Whether an output of ``nbytes`` is written with non-temporal stores (config's
    ``stream_min_bytes``, :data:`STREAM_MIN_BYTES` by default)."""
    return nbytes >= config.get("stream_min_bytes")
