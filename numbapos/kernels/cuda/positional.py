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

Nothing here reads data back to the host. Kernels that read position ids check
them as they go and record a bad one in the deferred error word
(:mod:`.errors`) instead of reading out of bounds.
"""

import math

import numpy as np
from numba import cuda, float64, int64

from ..._gpuhost.launch import launch
from . import errors
from .arrays import THREADS, absent, asarray, grid
from .fpmath import mul_f32, mul_f64

__all__ = ["add_gathered_rows", "add_rows", "mult_add", "mult_add_backward",
           "positions_from_mask", "positions_from_padding", "sinusoid_fill", "sum_over_batch",
           "timestep_fill"]


# ---------------------------------------------------------------- launchers


def sinusoid_fill(inv_freq, offset, out, concat=False):
    """``out[r, 2i] = sin((offset + r) w_i)``, ``out[r, 2i+1] = cos((offset + r) w_i)``.

    ``inv_freq`` is a host float64 array of the ``ceil(D / 2)`` frequencies (with
    ``concat``, the ``D // 2`` frequencies of the ``[sin | cos]`` layout, an odd
    D's last channel zero). Each element is computed directly (angle and sin/cos
    in float64, then cast to ``out``'s dtype), so no recurrence error accumulates
    down the table.
    """
    if out.size:
        freq = asarray(np.ascontiguousarray(inv_freq, dtype=np.float64))
        launch(_sinusoid_fill, grid(out.size), THREADS, freq, np.int64(offset), bool(concat),
               out)


def timestep_fill(timesteps, freq, scale, flip, out):
    """``out[n] = [sin(a) | cos(a)]`` (``[cos(a) | sin(a)]`` with ``flip``) for the angles
    ``a_i = scale * (timesteps[n] * freq[i])``, in float64; an odd D's last channel zero.

    ``timesteps`` is an (N,) device array of numbers (read as float64 by the
    kernel), ``freq`` a host float64 array of the ``D // 2`` frequencies.
    """
    if out.size:
        freq = asarray(np.ascontiguousarray(freq, dtype=np.float64))
        launch(_timestep_fill, grid(out.size), THREADS, timesteps, freq, np.float64(scale),
               bool(flip), out)


def add_rows(x, table, start, out):
    """``out[n, l] = x[n, l] + table[start + l]`` for ``(N, L, D)`` ``x`` / ``out``."""
    if x.size:
        launch(_add_rows, grid(x.size), THREADS, x, table, np.int64(start), out)


def add_gathered_rows(x, table, positions, out):
    """``out[n, l] = x[n, l] + table[positions[n, l]]``; ``positions`` (N, L) or (1, L).

    Positions are range-checked as they are read: a bad one is recorded as the
    deferred error (``position_ids`` / ``max_len``, its flat position in
    ``positions``) and its row of ``out`` is ``x`` unchanged (the table is not read).
    """
    if x.size:
        shared = positions.shape[0] == 1
        word, host = errors.words()
        launch(_add_gathered_rows, grid(x.size), THREADS, x, table, positions, shared, out, word,
               host, errors.tag("position_ids", "max_len"))
        errors.after_launch()


def sum_over_batch(grad, start, out):
    """``out[start + l] = sum over n of grad[n, l]`` (batch order); other rows of ``out`` zero."""
    if out.size:
        zero = out.dtype.type(0)
        launch(_sum_over_batch, grid(out.size), THREADS, grad, np.int64(start), zero, out)


def mult_add(x, a, b, out):
    """``out[n, l] = a[l] * x[n, l] + b[l]`` elementwise."""
    if x.size:
        kernel = _MULT_ADD[np.dtype(x.dtype)]
        launch(kernel, grid(x.size), THREADS, x, a, b, out)


def mult_add_backward(grad, x, a, grad_x, grad_a, grad_b):
    """``grad_x = grad * a[:L]``; ``grad_a[l] = sum_n grad * x``; ``grad_b[l] = sum_n grad``.

    ``grad_a`` / ``grad_b`` (``(M, D)``) are fully written, zero in rows ``>= L``.
    """
    if grad_a.size:
        kernel = _MULT_ADD_BACKWARD[np.dtype(grad_a.dtype)]
        zero = grad_a.dtype.type(0)
        launch(kernel, grid(grad_a.size), THREADS, grad, x, a, zero, grad_x, grad_a, grad_b)


def positions_from_padding(ids, padding_idx, past, pad_position, out):
    """Per row ``r`` of ``ids`` (R, L): real tokens numbered from ``past[r]``, padding
    ``pad_position``.

    ``past`` is an ``(R,)`` int64 device array (or a host int: the same for every
    row) and ``out`` ``(R, L)`` int64. The numbering is a sequential scan along the
    row, so one thread takes a row. A ``past[r]`` outside ``[0, 2**63 - L]``
    (the host checks host values; device values are checked here) is recorded as
    the deferred error (``past_length``) and its row is all ``pad_position``.
    """
    if ids.size:
        rows, seq = ids.shape
        top = np.iinfo(np.int64).max
        max_past = top - max(seq - 1, 0)  # past_length + L - 1 must fit in int64
        on_host = isinstance(past, (int, np.integer))
        start = np.int64(past if on_host else 0)
        past = absent(np.int64) if on_host else past  # empty: every row starts at ``start``
        word, host = errors.words()
        launch(_positions_from_padding, grid(rows), THREADS, ids, np.int64(padding_idx), past,
               start, np.int64(pad_position), np.int64(max_past), np.int64(min(max_past,
               top - 1) + 1), out, word, host, errors.tag("past_length", "past_length_bound"))
        errors.after_launch()


def positions_from_mask(mask, pad_position, max_positions, out, name="attention_mask",
                        size_name="n_positions"):
    """Positions of an attention mask (R, S) of 0 / 1 into ``out`` (R, L), L <= S: the CPU
    twin's numbering, on the device.

    One thread per row scans it (masks are short). A value other than 0 and 1, or
    (``max_positions >= 0``) a position at or past ``max_positions``, is recorded
    as the deferred error (the CPU's ValueError, raised by a later call); the
    scan goes on treating a bad value as padding.
    """
    if mask.size and out.size:
        word, host = errors.words()
        launch(_positions_from_mask, grid(mask.shape[0]), THREADS, mask,
               np.int64(pad_position), np.int64(max_positions), out, word, host,
               errors.tag(name, "", "binary"), errors.tag(name, size_name, "position"))
        errors.after_launch()


# ---------------------------------------------------------------- sinusoid table


@cuda.jit
def _sinusoid_fill(inv_freq, offset, concat, out):
    """One thread per element, threads along D. Interleaved, channel ``d`` uses
    frequency ``d // 2``: sin for even ``d``, cos for odd ``d`` (odd D ends with an
    unpaired sin). With ``concat``, channels ``[0, H)`` are sin and ``[H, 2H)`` cos
    of frequency ``d mod H`` (``H = D // 2``), an odd D's last channel zero."""
    dim = out.shape[1]
    half = dim // 2
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        r = k // dim
        d = k - r * dim
        if concat:
            if d >= 2 * half:
                out[r, d] = 0
                continue
            i = d - half if d >= half else d
            use_sin = d < half
        else:
            i = d // 2
            use_sin = d % 2 == 0
        # mul.rn: the angle is the correctly rounded float64 product, as on the CPU.
        angle = mul_f64(float64(offset + r), inv_freq[i])
        if use_sin:
            out[r, d] = math.sin(angle)
        else:
            out[r, d] = math.cos(angle)


@cuda.jit
def _timestep_fill(timesteps, freq, scale, flip, out):
    """One thread per element: channel ``d`` of row ``n`` is the sin or cos of
    ``scale * (t_n * freq[d mod H])`` in float64, as on the CPU (``H = D // 2``;
    ``flip`` puts cos first; an odd D's last channel zero)."""
    dim = out.shape[1]
    half = freq.size
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        n = k // dim
        d = k - n * dim
        if d >= 2 * half:
            out[n, d] = 0
            continue
        i = d - half if d >= half else d
        angle = mul_f64(scale, mul_f64(float64(timesteps[n]), freq[i]))
        if (d < half) != flip:
            out[n, d] = math.sin(angle)
        else:
            out[n, d] = math.cos(angle)


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
def _add_gathered_rows(x, table, positions, shared, out, err, err_host, which):
    dim = x.shape[2]
    seq = x.shape[1]
    for k in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        n, l, d = _unravel(k, seq, dim)
        pn = 0 if shared else n
        row = int64(positions[pn, l])
        if row < 0 or row >= table.shape[0]:
            if d == 0:
                errors.record(err, err_host, int64(pn * seq + l), row, int64(table.shape[0]),
                              which)
            out[n, l, d] = x[n, l, d]
        else:
            out[n, l, d] = x[n, l, d] + table[row, d]


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
def _positions_from_padding(ids, padding_idx, past, start, pad_position, max_past, bound, out,
                            err, err_host, which):
    """One thread per row: a sequential scan along L (rows are short, and the scan's
    running count makes the row one thread's work), from ``past[r]``, or from ``start``
    when ``past`` is empty."""
    seq = ids.shape[1]
    for r in range(cuda.grid(1), ids.shape[0], cuda.gridsize(1)):
        next_position = int64(past[r]) if past.size else start
        if next_position < 0 or next_position > max_past:
            errors.record(err, err_host, int64(r), next_position, bound, which)
            for l in range(seq):
                out[r, l] = pad_position
            continue
        for l in range(seq):
            if ids[r, l] == padding_idx:
                out[r, l] = pad_position
            else:
                out[r, l] = next_position
                next_position += 1


# ---------------------------------------------------------------- positions from a mask


@cuda.jit
def _positions_from_mask(mask, pad_position, max_positions, out, err, err_host, binary_tag,
                         position_tag):
    """One thread per row: the running count of real tokens along the row (see
    :func:`positions_from_mask`); flat positions are the mask's for a bad value and
    ``out``'s for a position out of range, as the CPU reports them."""
    total = mask.shape[1]
    length = out.shape[1]
    skip = total - length
    for r in range(cuda.grid(1), mask.shape[0], cuda.gridsize(1)):
        count = int64(0)
        for s in range(total):
            value = int64(mask[r, s])
            if value != 0 and value != 1:
                errors.record(err, err_host, int64(r * total + s), value, int64(0), binary_tag)
                value = int64(0)
            position = pad_position
            if value == 1:
                position = count
                count += 1
            if s >= skip:
                out[r, s - skip] = position
                if max_positions >= 0 and position >= max_positions:
                    errors.record(err, err_host, int64(r * length + s - skip), position,
                                  max_positions, position_tag)
