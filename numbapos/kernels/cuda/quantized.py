"""CUDA launchers and kernels of the int8 / int4 row-wise quantised tables (inference).

The twin of ``kernels/cpu/quantized.py`` (same ``__all__``, same signatures,
the same bits). Scale and bias sit at unaligned byte offsets of each packed
row, so the kernels read and write them byte by byte and convert with the
shared :mod:`numbapos.kernels.rowwise` helpers. A lookup runs one block per
output row with the threads along D; quantising (an offline conversion) runs
one thread per table row.

A lookup reads nothing back to the host: its indices are checked in the
gather kernel and a bad one raised later (:mod:`.errors`). Quantising keeps
one documented read (:func:`quantize_rows`, the first row that cannot be
quantised): it is a one-time conversion, not a step of a loop.

Every element reads back as ``fma(scale, code, bias)`` in float32, one
rounding, as on the CPU (``cuda.fma``; on the simulator, which would round
twice, an exact emulation).
"""

import math

import numpy as np
from numba import config, cuda, float32, int64

from ..._gpuhost.launch import launch
from ..rowwise import (
    code_4bit,
    code_8bit,
    f16_from_bits,
    f16_to_bits,
    f32_from_bits,
    f32_to_bits,
    row_overflows,
    scale_bias_4bit,
    scale_bias_8bit,
    unquantizable,
)
from . import arrays, errors
from .arrays import MAX_BLOCKS, THREADS, grid
from .bag import MAX, MEAN, _bounds
from .fpmath import mul_rn

__all__ = ["dequantize_rows", "gather_quantized_rows", "pool_quantized_bags", "quantize_rows"]


# ---------------------------------------------------------------- launchers


def quantize_rows(table, bits, out):
    """Quantise the float32 ``(V, D)`` ``table`` into the packed uint8 ``(V, W)`` ``out``.

    Returns -1, or the first row holding a value that cannot be quantised
    (``out`` is then partly written: the caller's fresh buffer, dropped).
    The row number comes back to the host in one small copy: quantising is a
    conversion done once, not a step of a loop.
    """
    num_rows = table.shape[0]
    if num_rows == 0:
        return -1
    bad = arrays.full((1,), num_rows, np.int64)
    launch(_quantize, grid(num_rows), THREADS, table, int(bits), out, bad)
    first = int(bad.copy_to_host()[0])
    return -1 if first == num_rows else first


def dequantize_rows(packed, bits, dim, out):
    """``out[r] = decode(packed[r])``: the float32 ``(V, dim)`` table of a packed one."""
    if out.size:
        launch(_decode_rows, grid(out.shape[0], 1), _row_threads(dim), packed, int(bits),
               np.int64(-1), out)


def gather_quantized_rows(flat, packed, bits, dim, padding_idx, out):
    """``out[i] = decode(packed[flat[i]])`` (zeros where ``flat[i] == padding_idx``).

    ``out`` is ``(N, dim)`` float32 and ``padding_idx`` is -1 for none.
    ``flat`` is range-checked as it is read (one launch): a bad index is
    recorded as the deferred error (:mod:`.errors`, the CPU's ``indices`` /
    ``num_embeddings``) and its output row is zeros, the table not read.
    """
    if out.size:
        word, host = errors.words()
        launch(_gather, grid(flat.size, 1), _row_threads(dim), flat, packed, int(bits),
               np.int64(padding_idx), out, word, host, errors.tag())
        errors.after_launch()


def pool_quantized_bags(flat, offsets, width, packed, bits, mode, padding, per_sample_weights,
                        out):
    """See the CPU twin: one block per bag, threads along D, each column summed in index
    order. A bad id is recorded (deferred, as ``input`` / ``num_embeddings``) and left
    out of its bag; bad offsets were recorded by ``check_bag_offsets``."""
    bags, dim = out.shape
    if bags == 0 or dim == 0:
        return
    word, host = errors.words()
    psw = per_sample_weights if per_sample_weights is not None else out[:0, 0]
    launch(_pool, min(bags, MAX_BLOCKS), _row_threads(dim), flat, offsets, int64(width),
           packed, int(bits), int64(mode), int64(padding), psw,
           1 if per_sample_weights is not None else 0, out, word, host, errors.tag("input"))
    errors.after_launch()


def _row_threads(dim: int) -> int:
    """Whole warps covering ``dim``, at most THREADS."""
    return min(THREADS, -(-dim // 32) * 32)


# ---------------------------------------------------------------- fma


if config.ENABLE_CUDASIM:
    def _fma_exact(a, b, c):
        """``a * b + c`` rounded once to float32, for float32 ``a``, ``b``, ``c``.

        The product is exact in float64; the sum is rounded to float64 *to
        odd* (two-sum error term), after which one rounding to float32 is
        the correctly rounded result (53 >= 24 + 2 bits).
        """
        p = float(a) * float(b)
        c = float(c)
        s = p + c
        if math.isinf(s) or math.isnan(s):
            return np.float32(s)
        back = s - p
        err = (p - (s - back)) + (c - back)
        if err != 0.0 and not int(np.float64(s).view(np.int64)) & 1:
            s = float(np.nextafter(s, math.inf if err > 0.0 else -math.inf))
        return np.float32(s)

    fma32 = cuda.jit(device=True)(_fma_exact)
else:  # pragma: no cover - compiled for real GPUs only
    @cuda.jit(device=True)
    def fma32(a, b, c):
        return cuda.fma(a, b, c)


# ---------------------------------------------------------------- kernels


@cuda.jit(device=True)
def _read_u32(packed, r, at):
    return (int(packed[r, at]) | (int(packed[r, at + 1]) << 8)
            | (int(packed[r, at + 2]) << 16) | (int(packed[r, at + 3]) << 24))


@cuda.jit(device=True)
def _read_u16(packed, r, at):
    return int(packed[r, at]) | (int(packed[r, at + 1]) << 8)


@cuda.jit(device=True)
def _write_bytes(packed, r, at, value, count):
    for k in range(count):
        packed[r, at + k] = np.uint8((value >> (8 * k)) & 0xFF)


@cuda.jit(device=True)
def _scale_bias(packed, bits, dim, r):
    """Row ``r``'s scale and bias as float32 (stored as float16 with 4 bits)."""
    if bits == 8:
        return (f32_from_bits(_read_u32(packed, r, dim)),
                f32_from_bits(_read_u32(packed, r, dim + 4)))
    width = (dim + 1) // 2
    return (f16_from_bits(_read_u16(packed, r, width)),
            f16_from_bits(_read_u16(packed, r, width + 2)))


@cuda.jit(device=True)
def _code(packed, bits, r, d):
    """Code ``d`` of row ``r`` as float32 (4 bits: the even column in the low nibble)."""
    if bits == 8:
        return np.float32(packed[r, d])
    return np.float32((packed[r, d // 2] >> (4 * (d % 2))) & 15)


@cuda.jit(device=True)
def _decode(packed, bits, dim, r, d):
    """Element ``d`` of the packed row ``r``: ``fma(scale, code, bias)`` in float32."""
    scale, bias = _scale_bias(packed, bits, dim, r)
    return fma32(_code(packed, bits, r, d), scale, bias)


@cuda.jit
def _quantize(table, bits, out, bad):
    """One thread per row: check it (first bad row into ``bad[0]``), then quantise it."""
    dim = table.shape[1]
    for r in range(cuda.grid(1), table.shape[0], cuda.gridsize(1)):
        if dim == 0:
            if bits == 4:
                _write_bytes(out, r, 0, f16_to_bits(np.float32(1.0)), 2)
                _write_bytes(out, r, 2, 0, 2)
            else:
                _write_bytes(out, r, 0, 0, 8)
            continue
        low = table[r, 0]
        high = low
        ok = True
        for d in range(dim):
            x = table[r, d]
            if unquantizable(x):
                ok = False
            # Comparisons, not min / max (PTX min.f32 returns -0.0 for a tie of zeros;
            # the CPU, as FBGEMM, keeps the first of equal values).
            if x < low:
                low = x
            if x > high:
                high = x
        if not ok or row_overflows(low, high, bits):
            cuda.atomic.min(bad, 0, r)
            continue
        if bits == 8:
            scale, bias, inverse = scale_bias_8bit(low, high)
            for d in range(dim):
                out[r, d] = np.uint8(code_8bit(table[r, d], bias, inverse))
            _write_bytes(out, r, dim, f32_to_bits(scale), 4)
            _write_bytes(out, r, dim + 4, f32_to_bits(bias), 4)
        else:
            scale, bias, inverse = scale_bias_4bit(low, high)
            width = (dim + 1) // 2
            for j in range(width):
                code = code_4bit(table[r, 2 * j], bias, inverse)
                if 2 * j + 1 < dim:
                    code |= code_4bit(table[r, 2 * j + 1], bias, inverse) << 4
                out[r, j] = np.uint8(code)
            _write_bytes(out, r, width, f16_to_bits(scale), 2)
            _write_bytes(out, r, width + 2, f16_to_bits(bias), 2)


@cuda.jit
def _decode_rows(packed, bits, padding_idx, out):
    """``out[r] = decode(packed[r])``: one block per row, threads along D."""
    dim = out.shape[1]
    for r in range(cuda.blockIdx.x, out.shape[0], cuda.gridDim.x):
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            out[r, d] = _decode(packed, bits, dim, r, d)


@cuda.jit
def _gather(flat_idx, packed, bits, padding_idx, out, err, err_host, which):
    """``out[i] = decode(packed[flat_idx[i]])``, zeros for padding: a block per output row.

    The index is read and checked once per row (thread 0 records a bad one;
    its row is zeros)."""
    dim = out.shape[1]
    for i in range(cuda.blockIdx.x, flat_idx.size, cuda.gridDim.x):
        r = int64(flat_idx[i])
        bad = r < 0 or r >= packed.shape[0]
        if bad and cuda.threadIdx.x == 0:
            errors.record(err, err_host, int64(i), r, int64(packed.shape[0]), which)
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            if bad or r == padding_idx:
                out[i, d] = np.float32(0.0)
            else:
                out[i, d] = _decode(packed, bits, dim, r, d)


@cuda.jit
def _pool(flat, offsets, width, packed, bits, mode, padding, psw, weighted, out, word, host,
          which):
    """A block per bag, a thread per column: ``acc = fma(code, scale * w, acc + bias * w)``
    per entry in index order (the products not fused, as on the CPU), a mean divided by
    the count, a max of ``fma(code, scale, bias)`` keeping the first on ties.

    The block stages ``blockDim`` of the bag's entries at a time in shared memory: each
    id read and checked once (a bad one recorded and skipped, as padding is), its row's
    scale and bias decoded once (times the weight), then every thread reads them from
    there for its column."""
    rows_s = cuda.shared.array(THREADS, int64)
    scales_s = cuda.shared.array(THREADS, float32)
    biases_s = cuda.shared.array(THREADS, float32)
    bags, dim = out.shape
    size = int64(flat.size)
    t = cuda.threadIdx.x
    step = cuda.blockDim.x
    for b in range(cuda.blockIdx.x, bags, cuda.gridDim.x):
        start, end = _bounds(offsets, width, size, b)
        for d0 in range(0, dim, step):  # every thread, so the barriers are uniform
            d = d0 + t
            acc = np.float32(0.0)
            used = 0
            for first in range(start, end, step):
                cuda.syncthreads()  # the previous entries were read
                i = first + t
                r = int64(-1)
                if i < end:
                    r = errors.checked(word, host, flat[i], i, packed.shape[0], which)
                    if r == padding:
                        r = -1
                    if r >= 0:
                        scale, bias = _scale_bias(packed, bits, dim, r)
                        if weighted and mode != MAX:
                            w = np.float32(psw[i])
                            scale, bias = mul_rn(scale, w), mul_rn(bias, w)
                        scales_s[t] = scale
                        biases_s[t] = bias
                rows_s[t] = r
                cuda.syncthreads()
                if d >= dim:
                    continue
                for j in range(min(step, end - first)):
                    r = rows_s[j]
                    if r < 0:
                        continue
                    code = _code(packed, bits, r, d)
                    if mode == MAX:
                        value = fma32(code, scales_s[j], biases_s[j])
                        if used == 0 or value > acc:
                            acc = value
                    else:
                        acc = fma32(code, scales_s[j], acc + biases_s[j])
                    used += 1
            if d >= dim:
                continue
            if mode == MEAN and used > 1:
                acc /= np.float32(used)
            out[b, d] = acc
