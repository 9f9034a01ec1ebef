"""CPU kernels for rotary position embeddings (RoPE): the cos / sin table and the rotation.

Launchers (``__all__``, twinned in ``kernels/cuda/rotary.py``) take validated
arrays and caller-owned outputs. The op runs in two steps:

1. :func:`rotary_table` fills ``cos`` / ``sin`` of shape ``(P, L, R/2)`` (``P``
   rows of positions, 1 when the batch shares them): one float64 angle, sine and
   cosine per position and frequency, however many heads (and q and k) use it.
   :func:`~numbapos.kernels.sincos.sincos` reduces the float64 angle to about
   2**-100 and is within one float64 ulp, so a float32 table is within one
   rounding of the true value at any position up to 2**20; it is the same code,
   and the same bits, on the GPU.
2. :func:`rotary_apply` rotates the channel pairs of ``x`` (``(B, A, C, D)``:
   heads then positions, or positions then heads) with the table, and copies
   the channels past ``R`` unchanged. Each pair is read before it is written,
   so ``out`` may be ``x`` itself. Every element is computed on its own (no
   sums), so the result does not depend on the thread count.
"""

import numpy as np
from numba import prange

from ..sincos import sincos
from .arrays import option, pick
from .jit import kernel
from .rowcopy import copy_row, put_row, streams

__all__ = ["rotary_apply", "rotary_pick_frequencies", "rotary_table"]

# Rows per non-temporal tile: each tile ends with a store fence, which costs
# about as much as streaming a few rows.
MIN_STREAM_TILE = 8


# ---------------------------------------------------------------- launchers


def rotary_table(positions, offset, inv_freq, angles, cos, sin):
    """``cos[p, l, i] = scale * cos(sign * pos * inv_freq[i])`` (``sin`` likewise).

    ``pos`` is ``offset + positions[p, l]``, or ``offset + l`` when ``positions``
    is None; ``angles`` is a :class:`~numbapos._args.RotaryAngles`. ``inv_freq``
    is float64 on this device; ``cos`` / ``sin`` are ``(P, L, R/2)`` of the data's
    dtype.
    """
    if cos.size:
        pick(_table, cos.size * 8)(positions, offset, inv_freq, angles, cos, sin)


def rotary_pick_frequencies(positions, threshold, short, long, out):
    """``out[:] = long`` if ``max(positions) + 1 > threshold``, else ``short`` (LongRoPE's
    choice by the sequence length; no positions count as length 0).

    ``positions`` is a flat int array; ``short`` / ``long`` / ``out`` float64 vectors.
    """
    use_long = positions.size and int(positions.max()) + 1 > threshold
    out[:] = long if use_long else short


def rotary_apply(x, cos, sin, interleaved, head_axis, out):
    """Rotate the first ``R = 2 * cos.shape[2]`` channels of every row of ``x`` by the table.

    ``x`` / ``out`` are ``(B, H, L, D)`` (``head_axis == 1``) or ``(B, L, H, D)``
    (``head_axis == 2``); ``cos`` / ``sin`` are ``(1 or B, L, R/2)``. Pairs are
    ``(i, i + R/2)`` or, with ``interleaved``, ``(2i, 2i + 1)``.
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
                             scratch, stream)


def _tile_rows(inner: int) -> int:
    """Rows streamed together (one fence each): the largest divisor of ``inner`` up to 32."""
    for tile in range(min(32, inner), 0, -1):
        if inner % tile == 0:
            return tile
    return 1


# ---------------------------------------------------------------- cos / sin table


@kernel(parallel=True)
def _table(positions, offset, inv_freq, angles, cos, sin):
    """Fill the ``(P, L, R/2)`` table, the positions split across threads: each position's
    row holds the cos and sin of each frequency, scaled."""
    seq = cos.shape[1]
    for k in prange(cos.shape[0] * seq):
        p = k // seq
        l = k - p * seq
        if positions is None:
            pos = offset + l
        else:
            pos = offset + positions[p, l]
        crow = cos[p, l]
        srow = sin[p, l]
        for i in range(inv_freq.size):
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


@kernel(inline="always")
def _rotate_row(src, dst, c, s, interleaved):
    """``dst = R(c, s) src`` on the pairs, the channels past ``2 * c.size`` copied."""
    half = c.size
    if interleaved:
        for i in range(half):
            x0 = src[2 * i]
            x1 = src[2 * i + 1]
            dst[2 * i] = x0 * c[i] - x1 * s[i]
            dst[2 * i + 1] = x1 * c[i] + x0 * s[i]
    else:
        for i in range(half):
            x0 = src[i]
            x1 = src[i + half]
            dst[i] = x0 * c[i] - x1 * s[i]
            dst[i + half] = x1 * c[i] + x0 * s[i]
    for d in range(2 * half, src.size):
        dst[d] = src[d]


@kernel(inline="always")
def _rotate_row_(row, c, s, interleaved):
    """:func:`_rotate_row` in place. One array, so LLVM sees that iteration ``i`` touches
    only ``i`` and ``i + R/2`` and vectorises the loop (with two arrays that may be one it
    cannot)."""
    half = c.size
    if interleaved:
        for i in range(half):
            x0 = row[2 * i]
            x1 = row[2 * i + 1]
            row[2 * i] = x0 * c[i] - x1 * s[i]
            row[2 * i + 1] = x1 * c[i] + x0 * s[i]
    else:
        for i in range(half):
            x0 = row[i]
            x1 = row[i + half]
            row[i] = x0 * c[i] - x1 * s[i]
            row[i + half] = x1 * c[i] + x0 * s[i]


@kernel(parallel=True)
def _apply(x, cos, sin, interleaved, head_axis, outer, inner, tile, out, scratch, stream):
    """Rotate every row of ``x`` (``(B * A * C / tile, tile * D)``: tiles of ``tile`` rows)
    into ``out`` (None: in place), the ``B * A`` outer indices split across threads.

    Outer index ``k = b * A + a`` owns ``C / tile`` tiles; with ``stream`` each
    tile is rotated in ``scratch[k]`` and then written with non-temporal stores.
    """
    half = cos.shape[2]
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
                    _rotate_row_(x[r, t * dim:(t + 1) * dim], c, s, interleaved)
                elif stream is None:
                    _rotate_row(x[r, t * dim:(t + 1) * dim], out[r, t * dim:(t + 1) * dim], c,
                                s, interleaved)
                else:
                    _rotate_row_(scratch[k, t * dim:t * dim + 2 * half], c, s, interleaved)
            if stream is not None:
                put_row(out, r, scratch, k, stream)
