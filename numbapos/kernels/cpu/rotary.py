"""CPU kernels for rotary position embeddings (RoPE): the cos / sin table and the rotation.

Launchers (``__all__``, twinned in ``kernels/cuda/rotary.py``) take validated
arrays and caller-owned outputs. The op runs in two steps:

1. :func:`rotary_table` fills ``cos`` / ``sin`` of shape ``(P, L, R/2)`` (``P``
   rows of positions, 1 when the batch shares them): one float64 angle, sine and
   cosine per position and frequency, however many heads (and q and k) use it.
   Positions come as ``S`` streams ``(S, P, L)``; frequency ``i`` reads stream
   ``streams[i]`` (multimodal rotary: Qwen2-VL's temporal / height / width
   sections, ``S = 3``) or stream 0 when ``streams`` is None (the 1-D rotary,
   ``S = 1``): one kernel for both, the same bits where the streams agree.
   :func:`~numbapos.kernels.sincos.sincos` reduces the float64 angle to about
   2**-100 and is within one float64 ulp, so a float32 table is within one
   rounding of the true value at any position up to 2**20; it is the same code,
   and the same bits, on the GPU.
2. :func:`rotary_apply` rotates the channel pairs of ``x`` (``(B, A, C, D)``:
   heads then positions, or positions then heads) with the table, and copies
   the channels past ``R`` unchanged. Each pair is read before it is written,
   so ``out`` may be ``x`` itself. Every element is computed on its own (no
   sums), so the result does not depend on the thread count. A bfloat16 /
   float16 ``x`` comes as its ``uint16`` bits with its format: each element is
   widened exactly to float32 (:func:`~numbapos.kernels.widen.widen`), rotated
   in float32 with the float32 table and rounded to nearest even once, the
   channels past ``R`` included (so a NaN's payload becomes the quiet NaN, as
   a float32 round trip makes it): the bits of the float32 rotation of the
   widened ``x``, rounded, reading and writing half the bytes.
"""

import numpy as np
from numba import prange, types
from numba.extending import overload

from ..halfbits import BF16, F16, half_from_f32_bits
from ..scalar import f32_bits
from ..sincos import sincos
from ..widen import FLOAT_TABLES, widen
from . import prefetch  # (a module: its kernels are not this area's launched kernels)
from .arrays import option, pick
from .jit import kernel
from .prefetch import OUTPUT_AHEAD
from .rowcopy import copy_row, put_row, streams

__all__ = ["rotary_apply", "rotary_pick_frequencies", "rotary_table"]

# Rows per non-temporal tile: each tile ends with a store fence, which costs
# about as much as streaming a few rows.
MIN_STREAM_TILE = 8


# ---------------------------------------------------------------- launchers


def rotary_table(positions, streams, offset, inv_freq, angles, cos, sin):
    """``cos[p, l, i] = scale * cos(sign * pos * inv_freq[i])`` (``sin`` likewise).

    ``pos`` is ``offset + positions[s, p, l]`` with ``s = streams[i]`` (0 when
    ``streams`` is None), or ``offset + l`` when ``positions`` is None;
    ``positions`` is int64 ``(S, P, L)``, ``streams`` an int64 vector of
    ``R/2`` stream indices below ``S``; ``angles`` is a
    :class:`~numbapos._args.RotaryAngles`. ``inv_freq`` is float64 on this
    device; ``cos`` / ``sin`` are ``(P, L, R/2)`` of the data's dtype.
    """
    if cos.size:
        pick(_table, cos.size * 8)(positions, streams, offset, inv_freq, angles, cos, sin)


def rotary_pick_frequencies(positions, threshold, short, long, out):
    """``out[:] = long`` if ``max(positions) + 1 > threshold``, else ``short`` (LongRoPE's
    choice by the sequence length; no positions count as length 0).

    ``positions`` is a flat int array; ``short`` / ``long`` / ``out`` float64 vectors.
    """
    use_long = positions.size and int(positions.max()) + 1 > threshold
    out[:] = long if use_long else short


def rotary_apply(x, cos, sin, interleaved, head_axis, out, fmt=FLOAT_TABLES):
    """Rotate the first ``R = 2 * cos.shape[2]`` channels of every row of ``x`` by the table.

    ``x`` / ``out`` are ``(B, H, L, D)`` (``head_axis == 1``) or ``(B, L, H, D)``
    (``head_axis == 2``); ``cos`` / ``sin`` are ``(1 or B, L, R/2)``. Pairs are
    ``(i, i + R/2)`` or, with ``interleaved``, ``(2i, 2i + 1)``. ``fmt`` is
    ``FLOAT_TABLES`` for float32 / float64 ``x`` and ``out``, or the
    :class:`~numbapos._args.TableFormat` (BF16 / F16) of 16-bit ones given as
    their ``uint16`` bits (with a float32 table).
    """
    if x.size:
        same = out.ctypes.data == x.ctypes.data  # out is x (partial overlaps were refused)
        batch, outer, inner, dim = x.shape
        # Large outputs: a tile of rows rotated in a scratch row (in cache), then written
        # with non-temporal stores (see rowcopy.streams): 2 memory passes, not 3.
        # Tiles of fewer than MIN_STREAM_TILE rows (L prime, say) would fence too often.
        tile = _tile_rows(inner)
        stream = option(not same and streams(out.nbytes)
                        and tile >= MIN_STREAM_TILE)
        tile = tile if stream else 1
        scratch = np.empty((batch * outer if stream else 1, tile * dim), x.dtype)
        pick(_apply, x.size)(x.reshape(-1, tile * dim), cos, sin, bool(interleaved), head_axis,
                             outer, inner, tile, None if same else out.reshape(-1, tile * dim),
                             scratch, stream, option(int(fmt) == F16), x.reshape(-1, dim))


def _tile_rows(inner: int) -> int:
    """Rows streamed together (one fence each): the largest divisor of ``inner`` up to 32."""
    for tile in range(min(32, inner), 0, -1):
        if inner % tile == 0:
            return tile
    return 1


# ---------------------------------------------------------------- cos / sin table


@kernel(parallel=True)
def _table(positions, streams, offset, inv_freq, angles, cos, sin):
    """Fill the ``(P, L, R/2)`` table, the positions split across threads: each position's
    row holds the cos and sin of each frequency (at the position of its stream), scaled."""
    seq = cos.shape[1]
    for k in prange(cos.shape[0] * seq):
        p = k // seq
        l = k - p * seq
        crow = cos[p, l]
        srow = sin[p, l]
        first = offset + l if positions is None else offset + positions[0, p, l]
        for i in range(inv_freq.size):
            pos = first
            if positions is not None and streams is not None:  # settled at compile time
                pos = offset + positions[streams[i], p, l]
            if angles.float32_angle:  # transformers' rounding: float32 angle, cos, sin, scale
                a32 = np.float32(np.float32(pos) * np.float32(inv_freq[i]))
                sa, ca = sincos(np.float64(a32))
                c = np.float64(np.float32(ca) * np.float32(angles.scale))
                s = np.float64(np.float32(sa) * np.float32(angles.scale))
            else:
                sa, ca = sincos(np.float64(pos) * inv_freq[i])
                c = ca * angles.scale
                s = sa * angles.scale
            crow[i] = c
            srow[i] = s * angles.sign


# ---------------------------------------------------------------- rotation


def _element(value, like, fmt):
    """``value`` as an element of the array ``like``: as it is into a float array; into
    ``uint16`` bits (a 16-bit array of format ``fmt``) rounded to nearest even."""
    if isinstance(like.dtype.type(0), np.integer):
        return half_from_f32_bits(f32_bits(value), fmt)
    return value


@overload(_element, inline="always")
def _element_jit(value, like, fmt):
    if isinstance(like.dtype, types.Integer):
        return lambda value, like, fmt: half_from_f32_bits(f32_bits(value), fmt)
    return lambda value, like, fmt: value


def _settle_(row, start, fmt):
    """Round trip ``row[start:]`` of 16-bit bits through float32 (NaN payloads become the
    quiet NaN, as the rotated channels' values do); a float row is left as it is."""
    for d in range(start, row.size):
        row[d] = _element(widen(row[d], fmt), row, fmt)


@overload(_settle_, inline="always")
def _settle_jit(row, start, fmt):
    if isinstance(row.dtype, types.Integer):
        def settle(row, start, fmt):
            for d in range(start, row.size):
                row[d] = half_from_f32_bits(f32_bits(widen(row[d], fmt)), fmt)
        return settle
    return lambda row, start, fmt: None


def _prefetch_16_bit(rows, i):
    """Ask for ``rows[i]`` (2-D, to write: :func:`~.prefetch.prefetch_output_ahead`) when
    it holds 16-bit bits; nothing for float rows, nothing past the end. (A hint to the
    compiled kernels' caches: in Python it does nothing.)

    Widening and rounding make a 16-bit row cost about 1.6x a float32 one in
    the cache, and with no request the misses of each row came after the work
    on the one before, not during it: in place, (8, 32, 1024, 128) bfloat16
    took 0.46 ns an element against float32's 0.29 on one thread (0.28 with
    rows asked for 4 ahead). Rotating a tile in the scratch row, the kernel
    asks for the next tile's rows (``nn.RotaryEmbedding`` on q and k, bfloat16:
    40 to 32 ms, float32 45 ms, 2 threads).
    """


@overload(_prefetch_16_bit)
def _prefetch_16_bit_jit(rows, i):
    if isinstance(rows.dtype, types.Integer):
        return lambda rows, i: prefetch.prefetch_output_ahead(rows, i - OUTPUT_AHEAD)
    return lambda rows, i: None


@kernel(inline="always")
def _rotate_row(src, dst, c, s, interleaved, f16):
    """``dst = R(c, s) src`` on the pairs, the channels past ``2 * c.size`` copied (16-bit
    bits: read as float32, rounded to nearest even; ``f16`` None for bfloat16)."""
    fmt = BF16 if f16 is None else F16  # a constant of each compilation
    half = c.size
    if interleaved:
        for i in range(half):
            x0 = widen(src[2 * i], fmt)
            x1 = widen(src[2 * i + 1], fmt)
            dst[2 * i] = _element(x0 * c[i] - x1 * s[i], dst, fmt)
            dst[2 * i + 1] = _element(x1 * c[i] + x0 * s[i], dst, fmt)
    else:
        for i in range(half):
            x0 = widen(src[i], fmt)
            x1 = widen(src[i + half], fmt)
            dst[i] = _element(x0 * c[i] - x1 * s[i], dst, fmt)
            dst[i + half] = _element(x1 * c[i] + x0 * s[i], dst, fmt)
    for d in range(2 * half, src.size):
        dst[d] = _element(widen(src[d], fmt), dst, fmt)


@kernel(inline="always")
def _rotate_row_(row, c, s, interleaved, f16):
    """:func:`_rotate_row` in place. One array, so LLVM sees that iteration ``i`` touches
    only ``i`` and ``i + R/2`` and vectorises the loop (with two arrays that may be one it
    cannot)."""
    fmt = BF16 if f16 is None else F16
    half = c.size
    if interleaved:
        for i in range(half):
            x0 = widen(row[2 * i], fmt)
            x1 = widen(row[2 * i + 1], fmt)
            row[2 * i] = _element(x0 * c[i] - x1 * s[i], row, fmt)
            row[2 * i + 1] = _element(x1 * c[i] + x0 * s[i], row, fmt)
    else:
        for i in range(half):
            x0 = widen(row[i], fmt)
            x1 = widen(row[i + half], fmt)
            row[i] = _element(x0 * c[i] - x1 * s[i], row, fmt)
            row[i + half] = _element(x1 * c[i] + x0 * s[i], row, fmt)
    _settle_(row, 2 * half, fmt)


@kernel(parallel=True)
def _apply(x, cos, sin, interleaved, head_axis, outer, inner, tile, out, scratch, stream, f16,
           rows):
    """Rotate every row of ``x`` (``(B * A * C / tile, tile * D)``: tiles of ``tile`` rows)
    into ``out`` (None: in place), the ``B * A`` outer indices split across threads.

    Outer index ``k = b * A + a`` owns ``C / tile`` tiles; with ``stream`` each
    tile is rotated in ``scratch[k]`` and then written with non-temporal stores.
    ``f16``: True for float16 bits, None for bfloat16 bits or float rows.
    ``rows`` is ``x`` as ``(B * A * C, D)``, the rows 16-bit ``x`` asks for ahead
    (:func:`_prefetch_16_bit`).
    """
    dim = x.shape[1] // tile
    tiles = inner // tile
    for k in prange(x.shape[0] * tile // inner):
        b = k // outer
        a = k - b * outer
        pb = 0 if cos.shape[0] == 1 else b
        for g in range(tiles):
            r = k * tiles + g
            if stream is not None:
                copy_row(scratch, k, x, r)
            for t in range(tile):
                m = g * tile + t
                l = m if head_axis == 1 else a
                c = cos[pb, l]
                s = sin[pb, l]
                if out is None:
                    _prefetch_16_bit(rows, r * tile + t + OUTPUT_AHEAD)
                    _rotate_row_(x[r, t * dim:(t + 1) * dim], c, s, interleaved, f16)
                elif stream is None:
                    _rotate_row(x[r, t * dim:(t + 1) * dim], out[r, t * dim:(t + 1) * dim], c,
                                s, interleaved, f16)
                else:
                    _prefetch_16_bit(rows, (r + 1) * tile + t)  # for the next copy_row
                    _rotate_row_(scratch[k, t * dim:(t + 1) * dim], c, s, interleaved, f16)
            if stream is not None:
                put_row(out, r, scratch, k, stream)
