"""CUDA launchers and kernels for rotary position embeddings (RoPE).

Twin of :mod:`numbapos.kernels.cpu.rotary` (same ``__all__``, signatures and
two steps):

1. ``_table``: one thread per (position row, position, frequency) forms the
   angle in float64, takes its sine and cosine with
   :func:`~numbapos.kernels.sincos.sincos` (the CPU's code, products through
   ``mul.rn``: the CPU's bits) and stores them in the data's dtype. Every head
   of q and k then reuses the value: the float64 work is ``P * L * R/2``
   evaluations, not one per element.
2. ``_apply``: one thread per channel pair (or passed-through channel) of a
   row, threads along the channels, so a warp reads and writes consecutive
   addresses of one row; each thread reads its pair before writing it, so
   ``out`` may be ``x``.

The products go through :mod:`~numbapos.kernels.cuda.fpmath`'s uncontracted
multiplies (no FMA), so the rotation, like the table, has the CPU's bits.
"""

import numpy as np
from numba import config, cuda, float32, float64, int64

from ..._args import RotaryAngles
from ..._gpuhost.launch import launch
from .. import sincos as _sincos
from ..sincos import sincos
from .arrays import THREADS, absent, grid
from .fpmath import mul_for

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


def rotary_table(positions, offset, inv_freq, angles, cos, sin):
    """``cos[p, l, i] = scale * cos(sign * pos * inv_freq[i])`` (``sin`` likewise).

    ``pos`` is ``offset + positions[p, l]``, or ``offset + l`` when ``positions``
    is None; ``angles`` is a :class:`~numbapos._args.RotaryAngles`. ``inv_freq``
    is a float64 device array; ``cos`` / ``sin`` are ``(P, L, R/2)``.
    """
    if cos.size:
        positions = absent(np.int64, 2) if positions is None else positions  # empty: l
        angles = RotaryAngles(float64(angles.scale), float64(angles.sign),
                              bool(angles.float32_angle))
        launch(_table, grid(cos.size), THREADS, positions, np.int64(offset), inv_freq, angles,
               cos, sin)


def rotary_pick_frequencies(positions, threshold, short, long, out):
    """``out[:] = long`` if ``max(positions) + 1 > threshold``, else ``short`` (LongRoPE's
    choice by the sequence length; no positions count as length 0), decided on the
    device: one launch of one block, nothing read back to the host.

    ``positions`` is a flat int device array; ``short`` / ``long`` / ``out`` float64.
    """
    if out.size:
        launch(_pick_frequencies, 1, THREADS, positions, np.int64(threshold), short, long, out)


def rotary_apply(x, cos, sin, interleaved, head_axis, out):
    """Rotate the first ``R = 2 * cos.shape[2]`` channels of every row of ``x`` by the table.

    ``x`` / ``out`` are ``(B, H, L, D)`` (``head_axis == 1``) or ``(B, L, H, D)``
    (``head_axis == 2``); ``cos`` / ``sin`` are ``(1 or B, L, R/2)``. Pairs are
    ``(i, i + R/2)`` or, with ``interleaved``, ``(2i, 2i + 1)``.
    """
    if x.size:
        dim = x.shape[3]
        half = cos.shape[2]
        items = x.size // dim * (dim - half)
        kernel = _APPLY[np.dtype(x.dtype)]
        launch(kernel, grid(items), THREADS, x, cos, sin, bool(interleaved), np.int64(head_axis),
               out)


# ---------------------------------------------------------------- cos / sin table


@cuda.jit
def _table(positions, offset, inv_freq, angles, cos, sin):
    """One thread per table entry: the angle of position ``offset + positions[p, l]`` (``l``
    when ``positions`` is empty) and frequency ``i``, as :class:`~numbapos._args.RotaryAngles`
    says."""
    scale = angles.scale
    half = cos.shape[2]
    seq = cos.shape[1]
    for k in range(cuda.grid(1), cos.size, cuda.gridsize(1)):
        row = k // half
        i = k - row * half
        p = row // seq
        l = row - p * seq
        pos = offset + (positions[p, l] if positions.size else l)
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


def _make_apply(mul):
    @cuda.jit
    def kernel(x, cos, sin, interleaved, head_axis, out):
        """Work item ``w`` of a row: pair ``w < R/2``, else channel ``w + R/2`` copied."""
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
                out[b, a, m, d] = x[b, a, m, d]
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
            x0 = x[b, a, m, j0]
            x1 = x[b, a, m, j1]
            out[b, a, m, j0] = mul(x0, c) - mul(x1, s)
            out[b, a, m, j1] = mul(x1, c) + mul(x0, s)

    return kernel


_APPLY = {np.dtype(t): _make_apply(mul_for(t)) for t in (np.float32, np.float64)}


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
