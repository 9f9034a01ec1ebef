"""CUDA launchers and kernels for rotary position embeddings (RoPE).

Twin of :mod:`numbapos.kernels.cpu.rotary` (same ``__all__``, signatures and
two steps):

1. ``_table``: one thread per (position row, position, frequency) reads the
   position of the frequency's stream (multimodal rotary) and forms the
   angle in float64, takes its sine and cosine with
   :func:`~numbapos.kernels.sincos.sincos` (the CPU's code, products through
   ``mul.rn``: the CPU's bits) and stores them in the data's dtype. Every head
   of q and k then reuses the value: the float64 work is ``P * L * R/2``
   evaluations, not one per element.
2. ``_apply``: one thread per channel pair (or passed-through channel) of a
   row, threads along the channels, so a warp reads and writes consecutive
   addresses of one row; each thread reads its pair before writing it, so
   ``out`` may be ``x``.

The products go through :func:`~numbapos.kernels.scalar.mul_rn` (``mul.rn``,
which :mod:`~numbapos.kernels.cuda.fpmath` registers: never contracted into an
FMA), so the rotation, like the table, has the CPU's bits. A bfloat16 /
float16 ``x`` comes as its ``uint16`` bits: each element is widened to
float32, rotated there and rounded to nearest even once, as on the CPU.
"""

import numpy as np
from numba import config, cuda, float32, float64, int64
from numba.extending import register_jitable

from ..._args import RotaryAngles
from ..._gpuhost.launch import launch
from .. import sincos as _sincos
from ..halfbits import half_from_f32_bits
from ..scalar import f32_bits, mul_rn
from ..sincos import sincos
from ..widen import FLOAT_TABLES, widen
from . import fpmath  # noqa: F401 (registers mul_rn's uncontracted multiply on the GPU)
from .arrays import THREADS, absent, grid

if not config.ENABLE_CUDASIM:  # pragma: no cover - compiled for real GPUs only
    from numba.cuda import libdevice, types
    from numba.cuda.extending import overload

    @overload(_sincos.mul, target="cuda", inline="always")
    def _mul_rn_cuda(a, b):
        """sincos's products as ``mul.rn`` (never contracted into an FMA)."""
        if a == types.float64 and b == types.float64:
            return lambda a, b: libdevice.dmul_rn(a, b)
        return None

__all__ = ["rotary_apply", "rotary_pick_frequencies", "rotary_table"]

# ---------------------------------------------------------------- launchers


def rotary_table(positions, streams, offset, inv_freq, angles, cos, sin):
    """``cos[p, l, i] = scale * cos(sign * pos * inv_freq[i])`` (``sin`` likewise).

    ``pos`` is ``offset + positions[s, p, l]`` with ``s = streams[i]`` (0 when
    ``streams`` is None), or ``offset + l`` when ``positions`` is None;
    ``positions`` is int64 ``(S, P, L)``, ``streams`` an int64 device vector of
    ``R/2`` stream indices below ``S``; ``angles`` is a
    :class:`~numbapos._args.RotaryAngles`. ``inv_freq`` is a float64 device
    array; ``cos`` / ``sin`` are ``(P, L, R/2)``.
    """
    if cos.size:
        positions = absent(np.int64, 3) if positions is None else positions  # empty: l
        streams = absent(np.int64, 1) if streams is None else streams  # empty: stream 0
        angles = RotaryAngles(float64(angles.scale), float64(angles.sign),
                              bool(angles.float32_angle))
        launch(_table, grid(cos.size), THREADS, positions, streams, np.int64(offset), inv_freq,
               angles, cos, sin)


def rotary_pick_frequencies(positions, threshold, short, long, out):
    """``out[:] = long`` if ``max(positions) + 1 > threshold``, else ``short`` (LongRoPE's
    choice by the sequence length; no positions count as length 0), decided on the
    device: one launch of one block, nothing read back to the host.

    ``positions`` is a flat int device array; ``short`` / ``long`` / ``out`` float64.
    """
    if out.size:
        launch(_pick_frequencies, 1, THREADS, positions, np.int64(threshold), short, long, out)


def rotary_apply(x, cos, sin, interleaved, head_axis, out, fmt=FLOAT_TABLES):
    """Rotate the first ``R = 2 * cos.shape[2]`` channels of every row of ``x`` by the table.

    ``x`` / ``out`` are ``(B, H, L, D)`` (``head_axis == 1``) or ``(B, L, H, D)``
    (``head_axis == 2``); ``cos`` / ``sin`` are ``(1 or B, L, R/2)``. Pairs are
    ``(i, i + R/2)`` or, with ``interleaved``, ``(2i, 2i + 1)``. ``fmt`` is
    ``FLOAT_TABLES`` for float32 / float64 ``x`` and ``out``, or the
    :class:`~numbapos._args.TableFormat` (BF16 / F16) of 16-bit ones given as
    their ``uint16`` bits (with a float32 table): widened exactly, rotated in
    float32, rounded to nearest even once (the channels past ``R`` included).
    """
    if x.size:
        dim = x.shape[3]
        half = cos.shape[2]
        items = x.size // dim * (dim - half)
        kernel = _APPLY[np.dtype(x.dtype)]
        launch(kernel, grid(items), THREADS, x, cos, sin, bool(interleaved), np.int64(head_axis),
               out, np.int64(fmt))


# ---------------------------------------------------------------- cos / sin table


@cuda.jit
def _table(positions, streams, offset, inv_freq, angles, cos, sin):
    """One thread per table entry: the angle of position ``offset + positions[s, p, l]``
    (``s = streams[i]``, 0 when ``streams`` is empty; ``l`` when ``positions`` is empty)
    and frequency ``i``, as :class:`~numbapos._args.RotaryAngles` says."""
    scale = angles.scale
    half = cos.shape[2]
    seq = cos.shape[1]
    for k in range(cuda.grid(1), cos.size, cuda.gridsize(1)):
        row = k // half
        i = k - row * half
        p = row // seq
        l = row - p * seq
        if positions.size:
            pos = offset + positions[streams[i] if streams.size else 0, p, l]
        else:
            pos = offset + l
        if angles.float32_angle:  # transformers' rounding: float32 angle, cos, sin, scale
            a32 = float32(float32(pos) * float32(inv_freq[i]))
            sa, ca = sincos(float64(a32))
            c = float64(float32(ca) * float32(scale))
            s = float64(float32(sa) * float32(scale))
        else:
            sa, ca = sincos(float64(pos) * inv_freq[i])
            c = ca * scale
            s = sa * scale
        cos[p, l, i] = c
        sin[p, l, i] = s * angles.sign


# ---------------------------------------------------------------- rotation


@register_jitable
def _keep(value, fmt):
    """A float result as it is (float32 / float64 data)."""
    return value


@register_jitable
def _nearest(value, fmt):
    """A float32 result as the 16-bit bits of format ``fmt``, rounded to nearest even."""
    return half_from_f32_bits(f32_bits(value), fmt)


def _make_apply(store):
    @cuda.jit
    def kernel(x, cos, sin, interleaved, head_axis, out, fmt):
        """Work item ``w`` of a row: pair ``w < R/2``, else channel ``w + R/2`` copied (read
        through :func:`~numbapos.kernels.widen.widen`, written through ``store``)."""
        outer = x.shape[1]
        inner = x.shape[2]
        dim = x.shape[3]
        half = cos.shape[2]
        per_row = dim - half
        shared = cos.shape[0] == 1
        items = x.size // dim * per_row
        for k in range(cuda.grid(1), items, cuda.gridsize(1)):
            row = k // per_row
            w = k - row * per_row
            bo = row // inner
            m = row - bo * inner
            b = bo // outer
            a = bo - b * outer
            if w >= half:
                d = w + half
                out[b, a, m, d] = store(widen(x[b, a, m, d], fmt), fmt)
                continue
            l = m if head_axis == 1 else a
            pb = 0 if shared else b
            c = cos[pb, l, w]
            s = sin[pb, l, w]
            if interleaved:
                j0 = 2 * w
                j1 = j0 + 1
            else:
                j0 = w
                j1 = w + half
            x0 = widen(x[b, a, m, j0], fmt)
            x1 = widen(x[b, a, m, j1], fmt)
            out[b, a, m, j0] = store(mul_rn(x0, c) - mul_rn(x1, s), fmt)
            out[b, a, m, j1] = store(mul_rn(x1, c) + mul_rn(x0, s), fmt)

    return kernel


# By the data's dtype: float32 / float64 as they are, 16-bit bits (uint16) in float32.
_APPLY = {np.dtype(np.float32): _make_apply(_keep), np.dtype(np.float64): _make_apply(_keep),
          np.dtype(np.uint16): _make_apply(_nearest)}


_NO_POSITION = -(1 << 62)


@cuda.jit
def _pick_frequencies(positions, threshold, short, long, out):
    """One block: the largest position (integer atomics: any order gives the same max),
    then every thread copies its entries of ``long`` or ``short``."""
    top = cuda.shared.array(1, int64)
    tid = cuda.threadIdx.x
    if tid == 0:
        top[0] = _NO_POSITION
    cuda.syncthreads()
    local = int64(_NO_POSITION)
    for i in range(tid, positions.size, cuda.blockDim.x):
        local = max(local, int64(positions[i]))
    cuda.atomic.max(top, 0, local)
    cuda.syncthreads()
    use_long = top[0] != _NO_POSITION and top[0] + 1 > threshold
    for i in range(tid, out.size, cuda.blockDim.x):
        out[i] = long[i] if use_long else short[i]
