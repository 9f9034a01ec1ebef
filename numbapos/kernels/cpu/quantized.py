"""CPU launchers and kernels of the int8 / int4 row-wise quantised tables (inference).

The format is FBGEMM's fused row-wise one, byte for byte what
``torch.ops.quantized.embedding_bag_byte_prepack`` / ``embedding_bag_4bit_prepack``
make: a row of the 8-bit table is its D codes, then its float32 scale and
float32 bias (``D + 8`` bytes); a row of the 4-bit table is ``ceil(D / 2)``
bytes of codes, two per byte, the even column in the low nibble, then a
float16 scale and a float16 bias. Element ``d`` of a row reads back as
``fma(scale, code, bias)`` in float32 (one rounding), as FBGEMM's lookup
kernels compute it.

Launchers (``__all__``, twinned in ``kernels/cuda/quantized.py``) take
validated arrays and caller-owned outputs; the ``@njit`` bodies trust their
inputs and never allocate. The scale and bias, at byte offsets that need not
be aligned, are written byte by byte; the lookups read them byte by byte
(float16 by the shared :mod:`numbapos.kernels.rowwise` helpers), the bags with
one unaligned load each (float16 widened by F16C where the CPU has it). The
bags pool their leading columns in registers (:class:`~.bag.Lanes`), each
lane doing its column's operations in index order: the same bits.
"""

import platform
import sys

import llvmlite.binding as ll
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils, config
from numba.extending import intrinsic

from ..halfbits import F16, half_to_f32_bits
from ..rowwise import (
    code_4bit,
    code_8bit,
    f16_from_bits,
    f16_to_bits,
    row_overflows,
    scale_bias_4bit,
    scale_bias_8bit,
    unquantizable,
)
from ..scalar import f32_bits, f32_from_bits
from .arrays import option, pick
from .bag import (
    MAX,
    MEAN,
    _bag_bounds,
    add_lanes,
    count_entries,
    fma_lanes,
    greater_lanes,
    load_lanes,
    load_nibble_lanes,
    store_lanes,
    zeros16,
    zeros32,
    zeros64,
    zeros128,
)
from .jit import kernel
from .prefetch import (
    AHEAD,
    half_prefetch_listed,
    prefetch_output_ahead,
    read_once_prefetch_listed,
)
from .rowaddress import row_address
from .wide import LANES, decode8_block

__all__ = ["dequantize_rows", "gather_quantized_rows", "pool_quantized_bags", "quantize_rows"]


# ---------------------------------------------------------------- launchers


def quantize_rows(table, bits, out):
    """Quantise the float32 ``(V, D)`` ``table`` into the packed uint8 ``(V, W)`` ``out``.

    Returns -1, or the first row that cannot be quantised (NaN, an infinity,
    or a scale or bias that would overflow): ``out`` is then partly written
    (the caller's fresh buffer, dropped).
    """
    num_rows, dim = table.shape
    if num_rows == 0:
        return -1
    bad = _first_bad_row(table, bits)
    if bad >= 0:
        return bad
    if bits == 8:
        pick(_quantize8, table.size)(table, out)
    else:
        pick(_quantize4, table.size)(table, out)
    return -1


def dequantize_rows(packed, bits, dim, out):
    """``out[r] = decode(packed[r])``: the float32 ``(V, dim)`` table of a packed one."""
    if out.size:
        if bits == 8:
            pick(_dequantize8, out.size)(packed, out)
        else:
            pick(_dequantize4, out.size)(packed, out)


def gather_quantized_rows(flat, packed, bits, dim, padding_idx, out):
    """``out[i] = decode(packed[flat[i]])`` (zeros where ``flat[i] == padding_idx``).

    ``flat`` is range-checked, ``out`` is ``(N, dim)`` float32 and
    ``padding_idx`` is -1 for none.
    """
    if out.size:
        if bits == 8:
            kernel = pick(_gather8, out.size)
        else:
            kernel = pick(_gather4, out.size)
        kernel(flat, packed, np.int64(padding_idx), out)


def pool_quantized_bags(flat, offsets, width, packed, bits, mode, padding, per_sample_weights,
                        out):
    """``out[b]``: the sum, mean or max of the decoded rows ``packed[flat[i]]`` of bag ``b``.

    Bags as for ``pool_bags`` of :mod:`.bag` (``offsets`` / ``width``; ``padding``
    -1 for none, its entries left out; ``mode`` SUM, MEAN or MAX); ``out`` is
    ``(B, D)`` float32, ``flat`` range-checked. A sum is FBGEMM's: per entry
    ``acc = fma(scale * w, code, acc + bias * w)`` in float32 (``w`` the entry's
    weight, the products rounded; without weights ``scale`` and ``bias`` as
    stored), in index order. A mean divides that sum by the number of entries;
    a max takes ``fma(scale, code, bias)``. Bags with no entry give zeros.
    """
    bags, dim = out.shape
    if bags == 0 or dim == 0:
        return
    kernel = pick(_pool, flat.size * dim + out.size)
    lanes = option(packed.flags.c_contiguous and out.flags.c_contiguous)
    kernel(flat, offsets, np.int64(width), packed, option(bits == 4), np.int64(mode),
           np.int64(padding), per_sample_weights, out, lanes)


# ---------------------------------------------------------------- fma


@intrinsic
def fma32(typingctx, a, b, c):
    """``a * b + c`` for float32 with one rounding (LLVM's ``llvm.fma.f32``)."""
    if not all(x == types.float32 for x in (a, b, c)):
        return None

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fnty = ir.FunctionType(f32, [f32, f32, f32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.fma.f32")
        return builder.call(fn, args)

    return types.float32(types.float32, types.float32, types.float32), codegen


# ---------------------------------------------------------------- kernels


# Scale and bias sit at byte offsets that need not be aligned: they are read and
# written byte by byte (LLVM merges the bytes into one unaligned access).


@kernel(inline="always")
def _read_u32(packed, r, at):
    return (np.uint32(packed[r, at]) | (np.uint32(packed[r, at + 1]) << np.uint32(8))
            | (np.uint32(packed[r, at + 2]) << np.uint32(16))
            | (np.uint32(packed[r, at + 3]) << np.uint32(24)))


@kernel(inline="always")
def _read_u16(packed, r, at):
    return np.uint32(packed[r, at]) | (np.uint32(packed[r, at + 1]) << np.uint32(8))


@kernel(inline="always")
def _write_bytes(packed, r, at, value, count):
    for k in range(count):
        packed[r, at + k] = np.uint8((value >> (8 * k)) & 0xFF)


@kernel()
def _first_bad_row(table, bits):
    """The first row holding NaN or an infinity, or whose scale or bias would overflow
    (:func:`~..rowwise.row_overflows`), else -1."""
    num_rows, dim = table.shape
    for r in range(num_rows):
        if dim == 0:
            return -1
        low = table[r, 0]
        high = low
        for d in range(dim):
            x = table[r, d]
            if unquantizable(x):
                return r
            low = min(low, x)
            high = max(high, x)
        if row_overflows(low, high, bits):
            return r
    return -1


@kernel(inline="always")
def _row_bounds(table, r):
    low = table[r, 0]
    high = low
    for d in range(1, table.shape[1]):
        x = table[r, d]
        low = min(low, x)
        high = max(high, x)
    return low, high


@kernel(inline="always")
def _quantize8_row(table, out, r):
    dim = table.shape[1]
    if dim == 0:
        _write_bytes(out, r, 0, 0, 8)
        return
    low, high = _row_bounds(table, r)
    scale, bias, inverse = scale_bias_8bit(low, high)
    _write_bytes(out, r, dim, np.int64(f32_bits(scale)), 4)
    _write_bytes(out, r, dim + 4, np.int64(f32_bits(bias)), 4)
    for d in range(dim):
        out[r, d] = np.uint8(code_8bit(table[r, d], bias, inverse))


@kernel(inline="always")
def _quantize4_row(table, out, r):
    dim = table.shape[1]
    width = (dim + 1) // 2
    if dim == 0:
        _write_bytes(out, r, 0, f16_to_bits(np.float32(1.0)), 2)
        _write_bytes(out, r, 2, 0, 2)
        return
    low, high = _row_bounds(table, r)
    scale, bias, inverse = scale_bias_4bit(low, high)
    _write_bytes(out, r, width, f16_to_bits(scale), 2)
    _write_bytes(out, r, width + 2, f16_to_bits(bias), 2)
    for j in range(width):
        code = code_4bit(table[r, 2 * j], bias, inverse)
        if 2 * j + 1 < dim:
            code |= code_4bit(table[r, 2 * j + 1], bias, inverse) << 4
        out[r, j] = np.uint8(code)


@kernel(parallel=True)
def _quantize8(table, out):
    for r in prange(table.shape[0]):
        _quantize8_row(table, out, r)


@kernel(parallel=True)
def _quantize4(table, out):
    for r in prange(table.shape[0]):
        _quantize4_row(table, out, r)


@kernel(inline="always")
def _decode8(packed, r, out, i):
    """``out[i, d] = fma(scale, code, bias)`` for the 8-bit row ``r``: 16 columns per
    vector operation (:mod:`.wide`) where both rows are contiguous, then one by one."""
    dim = out.shape[1]
    scale = f32_from_bits(_read_u32(packed, r, dim))
    bias = f32_from_bits(_read_u32(packed, r, dim + 4))
    done = 0
    if packed.strides[1] == 1 and out.strides[1] == 4:
        done = dim - dim % LANES
        for d in range(0, done, LANES):
            decode8_block(packed, r, out, i, d, scale, bias)
    for d in range(done, dim):
        out[i, d] = fma32(np.float32(packed[r, d]), scale, bias)


@kernel(inline="always")
def _decode4(packed, r, out, i):
    """``out[i, d] = fma(scale, code, bias)`` for the 4-bit row ``r`` (low nibble first)."""
    dim = out.shape[1]
    width = (dim + 1) // 2
    scale = f16_from_bits(_read_u16(packed, r, width))
    bias = f16_from_bits(_read_u16(packed, r, width + 2))
    half = dim // 2
    # The nibbles split in float32 (exact: high = floor(byte / 16), low = byte - 16 * high),
    # which LLVM vectorises from bytes; integer shifts and masks it widened to int64 first.
    for j in range(half):
        byte = np.float32(packed[r, j])
        high = np.floor(byte * np.float32(0.0625))
        low = byte - high * np.float32(16.0)
        out[i, 2 * j] = fma32(low, scale, bias)
        out[i, 2 * j + 1] = fma32(high, scale, bias)
    if dim % 2:
        out[i, dim - 1] = fma32(np.float32(packed[r, half] & 15), scale, bias)


@kernel(inline="always")
def _zero_row(out, i):
    for d in range(out.shape[1]):
        out[i, d] = np.float32(0.0)


@kernel(parallel=True)
def _dequantize8(packed, out):
    for r in prange(out.shape[0]):
        _decode8(packed, r, out, r)


@kernel(parallel=True)
def _dequantize4(packed, out):
    for r in prange(out.shape[0]):
        _decode4(packed, r, out, r)


@kernel(parallel=True)
def _gather8(flat_idx, packed, padding_idx, out):
    """``out[i] = decode8(packed[flat_idx[i]])``, padding rows zero; output rows split
    across threads."""
    for i in prange(flat_idx.size):
        read_once_prefetch_listed(packed, flat_idx, i + AHEAD)
        prefetch_output_ahead(out, i)
        r = flat_idx[i]
        if r == padding_idx:
            _zero_row(out, i)
        else:
            _decode8(packed, r, out, i)


@kernel(parallel=True)
def _gather4(flat_idx, packed, padding_idx, out):
    """``out[i] = decode4(packed[flat_idx[i]])``, padding rows zero; output rows split
    across threads."""
    for i in prange(flat_idx.size):
        read_once_prefetch_listed(packed, flat_idx, i + AHEAD)
        r = flat_idx[i]
        if r == padding_idx:
            _zero_row(out, i)
        else:
            _decode4(packed, r, out, i)


@intrinsic
def _load_bits(typingctx, packed, r, at, bits):
    """The ``bits``-bit (16 or 32, a literal) little-endian integer at byte ``at`` of the
    uint8 row ``packed[r]``, as a uint32: one unaligned load."""
    if not (isinstance(packed, types.Array) and packed.dtype == types.uint8
            and isinstance(bits, types.IntegerLiteral) and bits.literal_value in (16, 32)):
        return None
    width = bits.literal_value

    def codegen(context, builder, signature, args):
        packed_type, r_type, at_type, _ = signature.args
        start = row_address(context, builder, packed_type, args[0], args[1], r_type)
        address = builder.add(start, context.cast(builder, args[2], at_type, types.int64))
        kind = ir.IntType(width)
        value = builder.load(builder.inttoptr(address, kind.as_pointer()), align=1)
        if sys.byteorder == "big":
            swap = cgutils.get_or_insert_function(builder.module, ir.FunctionType(kind, [kind]),
                                                  f"llvm.bswap.i{width}")
            value = builder.call(swap, [value])
        return builder.zext(value, ir.IntType(32)) if width < 32 else value

    return types.uint32(packed, r, at, bits), codegen


def _converts_half() -> bool:
    """Whether the CPU Numba compiles for widens float16 in one instruction (x86's F16C,
    every 64-bit Arm); elsewhere LLVM would compile :func:`_half_value` to a library call."""
    if config.CPU_NAME and config.CPU_NAME != "host":  # its features: NUMBA_CPU_FEATURES
        return "+f16c" in (config.CPU_FEATURES or "")
    if platform.machine().lower() in ("arm64", "aarch64"):
        return True
    return bool(ll.get_host_cpu_features().get("f16c", False))


CONVERTS_HALF = _converts_half()


@intrinsic
def _half_value(typingctx, bits):
    """The float16 with bits ``bits`` (an integer's low 16) as float32: exact, one
    ``vcvtph2ps`` with F16C. The 4-bit rows' scale and bias took 25% of their sum's time
    with :func:`~numbapos.kernels.halfbits.half_to_f32_bits`' integer operations."""
    if not isinstance(bits, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        value = context.cast(builder, args[0], signature.args[0], types.uint32)
        half = builder.bitcast(builder.trunc(value, ir.IntType(16)), ir.HalfType())
        return builder.fpext(half, ir.FloatType())

    return types.float32(bits), codegen


@kernel(inline="always")
def _f16_value(bits):
    if CONVERTS_HALF:
        return _half_value(bits)
    return f32_from_bits(half_to_f32_bits(bits, F16))


@kernel(inline="always")
def _scale_bias(packed, r, dim, four):
    """Row ``r``'s scale and bias as float32 (float16 ones for 4 bits, ``four`` True)."""
    if four is None:
        return (f32_from_bits(_load_bits(packed, r, dim, 32)),
                f32_from_bits(_load_bits(packed, r, dim + 4, 32)))
    width = (dim + 1) // 2
    return (_f16_value(_load_bits(packed, r, width, 16)),
            _f16_value(_load_bits(packed, r, width + 2, 16)))


@kernel(inline="always")
def _add_row(packed, r, four, scale, bias, acc, first):
    """``acc[d] = fma(code_d, scale, acc[d] + bias)`` for ``d >= first`` (even):
    FBGEMM's step of a pooled sum."""
    dim = acc.size
    if four is None:
        for d in range(first, dim):
            acc[d] = fma32(np.float32(packed[r, d]), scale, acc[d] + bias)
    else:
        for j in range(first // 2, dim // 2):  # the nibbles split in float32, as _decode4
            byte = np.float32(packed[r, j])
            high = np.floor(byte * np.float32(0.0625))
            low = byte - high * np.float32(16.0)
            acc[2 * j] = fma32(low, scale, acc[2 * j] + bias)
            acc[2 * j + 1] = fma32(high, scale, acc[2 * j + 1] + bias)
        if dim % 2:
            acc[dim - 1] = fma32(np.float32(packed[r, dim // 2] & 15), scale,
                                 acc[dim - 1] + bias)


@kernel(inline="always")
def _max_into(acc, d, value, first):
    if first or value > acc[d]:  # the earlier entry stays on ties
        acc[d] = value


@kernel(inline="always")
def _max_row(packed, r, four, scale, bias, acc, first, column):
    """``acc[d] = max(acc[d], fma(code_d, scale, bias))`` for ``d >= column`` (even); the
    row itself when ``first``."""
    dim = acc.size
    if four is None:
        for d in range(column, dim):
            _max_into(acc, d, fma32(np.float32(packed[r, d]), scale, bias), first)
    else:
        for j in range(column // 2, dim // 2):  # the nibbles split as in _add_row
            byte = np.float32(packed[r, j])
            high = np.floor(byte * np.float32(0.0625))
            low = byte - high * np.float32(16.0)
            _max_into(acc, 2 * j, fma32(low, scale, bias), first)
            _max_into(acc, 2 * j + 1, fma32(high, scale, bias), first)
        if dim % 2:
            _max_into(acc, dim - 1, fma32(np.float32(packed[r, dim // 2] & 15), scale, bias),
                      first)


@kernel(inline="always")
def _prefetch_packed_ahead(packed, flat, i):
    # To every cache level (prefetcht0), twice the lookups' lookahead. Measured on the
    # Intel VM, 2,048 bags of 20 rows, D = 128: with prefetchnta, as the lookups use, the
    # int8 sum (column loop) took 0.84 ms instead of 0.47 ms with the same ids every call;
    # with new ids every call (rows from memory) 16 rows ahead took the int4 sum (lanes)
    # from 0.58 ms (8 ahead) or 0.49-0.55 ms (prefetchnta) to 0.40 ms.
    half_prefetch_listed(packed, flat, i + 2 * AHEAD)


@kernel(parallel=True)
def _pool(flat, offsets, width, packed, four, mode, padding, psw, out, lanes):
    """One bag per iteration, its entries in index order (bit-identical for any thread
    count); ``four`` (True or None) and ``psw`` (an array or None) pick the compiled code.
    With ``lanes`` (True: ``packed`` and ``out`` C-contiguous) the leading columns pool in
    :class:`~.bag.Lanes` (:func:`_pool_in_lanes`), the others one by one."""
    bags, dim = out.shape
    for b in prange(bags):
        start, end = _bag_bounds(offsets, width, np.int64(flat.size), b)
        done = 0
        if lanes is not None:
            done = _pool_in_lanes(flat, start, end, packed, four, mode, padding, psw, out, b)
        acc = out[b]
        if done < dim:
            _pool_columns(flat, start, end, packed, four, mode, padding, psw, acc, done)
        if mode == MEAN:
            used = count_entries(flat, start, end, padding)
            if used > 1:
                count = np.float32(used)
                for d in range(dim):
                    acc[d] /= count


@kernel(inline="always")
def _pool_columns(flat, start, end, packed, four, mode, padding, psw, acc, first):
    # Columns first .. D of one bag (first even), column by column.
    dim = acc.size
    for d in range(first, dim):
        acc[d] = np.float32(0.0)
    used = 0
    for i in range(start, end):
        _prefetch_packed_ahead(packed, flat, i)
        r = flat[i]
        if r == padding:
            continue
        scale, bias = _scale_bias(packed, r, dim, four)
        if mode == MAX:
            _max_row(packed, r, four, scale, bias, acc, used == 0, first)
        else:
            if psw is not None:
                w = np.float32(psw[i])
                scale, bias = scale * w, bias * w
            _add_row(packed, r, four, scale, bias, acc, first)
        used += 1


@kernel()
def _pool_in_lanes(flat, start, end, packed, four, mode, padding, psw, out, b):
    # Pools bag b's leading columns into out[b] in Lanes; returns how many (a multiple
    # of 16). Not inlined, as bag._sum_in_lanes.
    dim = out.shape[1]
    done = 0
    while dim - done >= 128:
        _pool_block(flat, start, end, packed, four, mode, padding, psw, out, b, done,
                    zeros128())
        done += 128
    if dim - done >= 64:
        _pool_block(flat, start, end, packed, four, mode, padding, psw, out, b, done,
                    zeros64())
        done += 64
    if dim - done >= 32:
        _pool_block(flat, start, end, packed, four, mode, padding, psw, out, b, done,
                    zeros32())
        done += 32
    if dim - done >= 16:
        _pool_block(flat, start, end, packed, four, mode, padding, psw, out, b, done,
                    zeros16())
        done += 16
    return done


@kernel(inline="always")
def _pool_block(flat, start, end, packed, four, mode, padding, psw, out, b, column, acc):
    # Columns column .. + lanes of bag b, each lane _pool_columns's operations in order.
    dim = out.shape[1]
    used = 0
    for i in range(start, end):
        _prefetch_packed_ahead(packed, flat, i)
        r = flat[i]
        if r == padding:
            continue
        scale, bias = _scale_bias(packed, r, dim, four)
        if four is None:
            codes = load_lanes(acc, packed, r, column)
        else:
            codes = load_nibble_lanes(acc, packed, r, column)
        if mode == MAX:
            value = fma_lanes(codes, scale, bias)
            acc = value if used == 0 else greater_lanes(acc, value)
        else:
            if psw is not None:
                w = np.float32(psw[i])
                scale, bias = scale * w, bias * w
            acc = fma_lanes(codes, scale, add_lanes(acc, bias))
        used += 1
    store_lanes(out, b, column, acc)
