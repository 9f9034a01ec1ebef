"""CUDA launchers and kernels for positional embeddings.

Twin of :mod:`numbapos.kernels.cpu.positional` (same ``__all__``, signatures
and results). Activations arrive as ``(N, L, D)`` device arrays, position
tables as ``(M, D)``. Elementwise kernels walk the flat element index with a
grid-stride loop, so the threads of a warp read and write consecutive ``d``.
The batch reductions give each output element to ONE thread, which sums over
``n = 0 .. N-1`` in order: no atomics, and the same bits as the CPU.

FMA contraction: NVVM fuses ``a * b + c`` into one fused multiply-add by default
(its ``-fma=1``, which Numba leaves on even without fastmath), while the CPU
kernels round the product and the sum separately. The products that feed a sum
(``a * x + b``, ``grad_a += g * x``) therefore go through
:mod:`~numbapos.kernels.cuda.fpmath`'s ``mul_f32`` / ``mul_f64``, libdevice's
``__nv_fmul_rn`` / ``__nv_dmul_rn`` (PTX ``mul.rn``, which is never
contracted), so the GPU rounds as the CPU does. On the simulator they are plain
multiplies (NumPy scalars never fuse).
"""

import math

import numpy as np
from numba import cuda, float64

from .arrays import THREADS, asarray, grid
from .fpmath import mul_f32, mul_f64

__all__ = ["add_gathered_rows", "add_rows", "mult_add", "mult_add_backward",
           "positions_from_padding", "sinusoid_fill", "sum_over_batch"]


# ---------------------------------------------------------------- launchers


def sinusoid_fill(inv_freq, offset, out):
    """``out[r, 2i] = sin((offset + r) w_i)``, ``out[r, 2i+1] = cos((offset + r) w_i)``.

    ``inv_freq`` is a host float64 array of the ``ceil(D / 2)`` frequencies.
    Each element is computed directly (angle and sin/cos in float64, then cast
    to ``out``'s dtype), so no recurrence error accumulates down the table.
    """
    if out.size:
        freq = asarray(np.ascontiguousarray(inv_freq, dtype=np.float64))
        _sinusoid_fill[grid(out.size), THREADS](freq, np.int64(offset), out)


def add_rows(x, table, start, out):
    """``out[n, l] = x[n, l] + table[start + l]`` for ``(N, L, D)`` ``x`` / ``out``."""
    if x.size:
        _add_rows[grid(x.size), THREADS](x, table, np.int64(start), out)


def add_gathered_rows(x, table, positions, out):
    """``out[n, l] = x[n, l] + table[positions[n, l]]``; ``positions`` (N, L) or (1, L)."""
    if x.size:
        shared = positions.shape[0] == 1
        _add_gathered_rows[grid(x.size), THREADS](x, table, positions, shared, out)


def sum_over_batch(grad, start, out):
    """``out[start + l] = sum over n of grad[n, l]`` (batch order); other rows of ``out`` zero."""
    if out.size:
        zero = out.dtype.type(0)
        _sum_over_batch[grid(out.size), THREADS](grad, np.int64(start), zero, out)


def mult_add(x, a, b, out):
    """``out[n, l] = a[l] * x[n, l] + b[l]`` elementwise."""
    if x.size:
        kernel = _MULT_ADD[np.dtype(x.dtype)]
        kernel[grid(x.size), THREADS](x, a, b, out)


def mult_add_backward(grad, x, a, grad_x, grad_a, grad_b):
    """``grad_x = grad * a[:L]``; ``grad_a[l] = sum_n grad * x``; ``grad_b[l] = sum_n grad``.

    ``grad_a`` / ``grad_b`` (``(M, D)``) are fully written, zero in rows ``>= L``.
    """
    if grad_a.size:
        kernel = _MULT_ADD_BACKWARD[np.dtype(grad_a.dtype)]
        zero = grad_a.dtype.type(0)
        kernel[grid(grad_a.size), THREADS](grad, x, a, zero, grad_x, grad_a, grad_b)


def positions_from_padding(ids, padding_idx, past, pad_position, out):
    """Per row ``r`` of ``ids`` (R, L): real tokens numbered from ``past[r]``, padding
    ``pad_position``.

    ``past`` is an ``(R,)`` int64 device array and ``out`` ``(R, L)`` int64. The
    numbering is a sequential scan along the row, so one thread takes a row.
    """
    if ids.size:
        rows = ids.shape[0]
        _positions_from_padding[grid(rows), THREADS](ids, np.int64(padding_idx), past,
                                                     np.int64(pad_position), out)


# ---------------------------------------------------------------- sinusoid table


@cuda.jit
def _sinusoid_fill(inv_freq, offset, out):
    """One thread per element, threads along D. Channel ``d`` uses frequency ``d // 2``:
    sin for even ``d``, cos for odd ``d`` (odd D ends with an unpaired sin)."""
    dim = out.shape[1]
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        r = k // dim
        d = k - r * dim
        # mul.rn: the angle is the correctly rounded float64 product, as on the CPU.
        angle = mul_f64(float64(offset + r), inv_freq[d // 2])
        if d % 2 == 0:
            out[r, d] = math.sin(angle)
        else:
            out[r, d] = math.cos(angle)


# ---------------------------------------------------------------- x + P


@cuda.jit(device=True)
def _unravel(k, seq, dim):
    """``(n, l, d)`` of flat element ``k`` of an ``(N, seq, dim)`` array."""
    row = k // dim
    d = k - row * dim
    n = row // seq
    return n, row - n * seq, d


@cuda.jit
def _add_rows(x, table, start, out):
    dim = x.shape[2]
    seq = x.shape[1]
    for k in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        n, l, d = _unravel(k, seq, dim)
        out[n, l, d] = x[n, l, d] + table[start + l, d]


@cuda.jit
def _add_gathered_rows(x, table, positions, shared, out):
    dim = x.shape[2]
    seq = x.shape[1]
    for k in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        n, l, d = _unravel(k, seq, dim)
        pn = 0 if shared else n
        out[n, l, d] = x[n, l, d] + table[positions[pn, l], d]


@cuda.jit
def _sum_over_batch(grad, start, zero, out):
    """One thread per element of ``out`` (M, D); rows outside ``start .. start + L`` get zero."""
    dim = out.shape[1]
    batch = grad.shape[0]
    seq = grad.shape[1]
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        t = k // dim
        d = k - t * dim
        l = t - start
        acc = zero
        if l >= 0 and l < seq:
            for n in range(batch):  # batch order, as on the CPU
                acc += grad[n, l, d]
        out[t, d] = acc


# ---------------------------------------------------------------- A * X + B


def _make_mult_add(mul):
    @cuda.jit
    def kernel(x, a, b, out):
        dim = x.shape[2]
        seq = x.shape[1]
        for k in range(cuda.grid(1), x.size, cuda.gridsize(1)):
            n, l, d = _unravel(k, seq, dim)
            out[n, l, d] = mul(a[l, d], x[n, l, d]) + b[l, d]

    return kernel


def _make_mult_add_backward(mul):
    @cuda.jit
    def kernel(grad, x, a, zero, grad_x, grad_a, grad_b):
        """One thread per element ``(l, d)`` of ``grad_a`` / ``grad_b`` (M, D): it also
        writes ``grad_x[:, l, d]``, and sums over the batch in order."""
        dim = grad_a.shape[1]
        batch = grad.shape[0]
        seq = grad.shape[1]
        for k in range(cuda.grid(1), grad_a.size, cuda.gridsize(1)):
            l = k // dim
            d = k - l * dim
            acc_a = zero
            acc_b = zero
            if l < seq:
                a_ld = a[l, d]
                for n in range(batch):
                    g = grad[n, l, d]
                    grad_x[n, l, d] = g * a_ld
                    acc_a += mul(g, x[n, l, d])
                    acc_b += g
            grad_a[l, d] = acc_a
            grad_b[l, d] = acc_b

    return kernel


_MULT_ADD = {np.dtype(np.float32): _make_mult_add(mul_f32),
             np.dtype(np.float64): _make_mult_add(mul_f64)}
_MULT_ADD_BACKWARD = {np.dtype(np.float32): _make_mult_add_backward(mul_f32),
                      np.dtype(np.float64): _make_mult_add_backward(mul_f64)}


# ---------------------------------------------------------------- positions from padding


@cuda.jit
def _positions_from_padding(ids, padding_idx, past, pad_position, out):
    """One thread per row: a sequential scan along L (rows are short, and the scan's
    running count makes the row one thread's work)."""
    seq = ids.shape[1]
    for r in range(cuda.grid(1), ids.shape[0], cuda.gridsize(1)):
        next_position = past[r]
        for l in range(seq):
            if ids[r, l] == padding_idx:
                out[r, l] = pad_position
            else:
                out[r, l] = next_position
                next_position += 1
