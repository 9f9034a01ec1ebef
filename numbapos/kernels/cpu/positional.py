"""CPU kernels for positional embeddings: the sinusoid table (interleaved or
concatenated), diffusion timestep embeddings, adding a table of positions to a
batch, NeoML's multiply-add, their batch reductions, and positions computed from
padding.

Launchers (``__all__``, twinned in ``kernels/cuda/positional.py``) take
validated arrays and caller-owned outputs; the ``@njit`` bodies trust them. Activations arrive as
``(N, L, D)`` arrays (a 2-D input is viewed as ``N = 1``); position tables are
``(M, D)`` with ``M >= L``. Every output row is written by one thread, and sums
over the batch run in batch order, so results do not depend on the thread count.
"""

import numpy as np
from numba import prange

from .arrays import pick
from .jit import kernel

__all__ = ["add_gathered_rows", "add_rows", "mult_add", "mult_add_backward",
           "positions_from_mask", "positions_from_padding", "sinusoid_fill", "sum_over_batch",
           "timestep_fill"]

# The sinusoid recurrence is re-anchored with a direct sin/cos at least this often.
# Its float64 error grows about 1e-16 per step, so 256 steps stay near 1e-13: far
# inside the 1e-10 bound, while the anchors stay a small part of the fill.
SINUSOID_MAX_BLOCK = 256
# Fewer rows than this per block and the anchors' sin/cos start to dominate.
SINUSOID_MIN_BLOCK = 32
# Shorter tables are cut into about this many blocks, so that they still spread
# over the threads.
SINUSOID_TARGET_BLOCKS = 16


def sinusoid_block(seq_len: int) -> int:
    """Rows per anchor block; depends on seq_len only, so the values never depend on
    the thread count or on which kernel (serial or parallel) fills the table."""
    block = -(-seq_len // SINUSOID_TARGET_BLOCKS)
    return min(SINUSOID_MAX_BLOCK, max(SINUSOID_MIN_BLOCK, block))


# ---------------------------------------------------------------- launchers


def sinusoid_fill(inv_freq, offset, out, concat=False):
    """``out[r, 2i] = sin((offset + r) w_i)``, ``out[r, 2i+1] = cos((offset + r) w_i)``.

    ``inv_freq`` is a host float64 array of the ``ceil(D / 2)`` frequencies. With
    ``concat`` the layout is ``[sin | cos]`` instead: ``out[r, i] = sin``,
    ``out[r, H + i] = cos`` for the ``H = D // 2`` frequencies of ``inv_freq``, and
    an odd D's last channel zero.
    """
    step_cos = np.cos(inv_freq)
    step_sin = np.sin(inv_freq)
    block = sinusoid_block(out.shape[0])
    num_blocks = -(-out.shape[0] // block)
    sin_acc = np.empty((num_blocks, inv_freq.size), dtype=np.float64)
    cos_acc = np.empty((num_blocks, inv_freq.size), dtype=np.float64)
    pick(_sinusoid_fill, out.size)(inv_freq, step_cos, step_sin, offset, block, bool(concat),
                                   out, sin_acc, cos_acc)


def timestep_fill(timesteps, freq, scale, flip, out):
    """``out[n] = [sin(a) | cos(a)]`` (``[cos(a) | sin(a)]`` with ``flip``) for the angles
    ``a_i = scale * (timesteps[n] * freq[i])``, in float64; an odd D's last channel zero.

    ``timesteps`` is an (N,) array of numbers, ``freq`` a host float64 array of the
    ``D // 2`` frequencies, ``out`` (N, D).
    """
    times = np.ascontiguousarray(timesteps, dtype=np.float64)
    pick(_timestep_fill, out.size)(times, freq, np.float64(scale), bool(flip), out)


def add_rows(x, table, start, out):
    """``out[n, l] = x[n, l] + table[start + l]`` for ``(N, L, D)`` ``x`` / ``out``."""
    pick(_add_rows, x.size)(x, table, start, out)


def add_gathered_rows(x, table, positions, out):
    """``out[n, l] = x[n, l] + table[positions[n, l]]``; ``positions`` (N, L) or (1, L)."""
    pick(_add_gathered_rows, x.size)(x, table, positions, out)


def sum_over_batch(grad, start, out):
    """``out[start + l] = sum over n of grad[n, l]`` (batch order); other rows of ``out`` zero."""
    out[...] = 0
    pick(_sum_over_batch, grad.size)(grad, start, out)


def mult_add(x, a, b, out):
    """``out[n, l] = a[l] * x[n, l] + b[l]`` elementwise."""
    pick(_mult_add, x.size)(x, a, b, out)


def mult_add_backward(grad, x, a, grad_x, grad_a, grad_b):
    """``grad_x = grad * a[:L]``; ``grad_a[l] = sum_n grad * x``; ``grad_b[l] = sum_n grad``.

    ``grad_a`` / ``grad_b`` (``(M, D)``) are fully written, zero in rows ``>= L``.
    """
    grad_a[...] = 0
    grad_b[...] = 0
    pick(_mult_add_backward, x.size)(grad, x, a, grad_x, grad_a, grad_b)


def positions_from_padding(ids, padding_idx, past, pad_position, out):
    """Per row ``r`` of ``ids`` (R, L): real tokens numbered from ``past[r]``, padding
    ``pad_position``."""
    _positions_from_padding(ids, padding_idx, past, pad_position, out)


def positions_from_mask(mask, pad_position, max_positions, out, name="attention_mask",
                        size_name="n_positions"):
    """Positions of an attention mask (R, S) of 0 / 1 into ``out`` (R, L), L <= S.

    Per row, real tokens (1) are numbered 0, 1, ... in order over all S columns,
    padding (0) gets ``pad_position``; ``out`` receives the last L columns.
    ValueError (nothing written) for a value other than 0 and 1 (the first, in
    flat order) or, when ``max_positions >= 0``, for the first position of
    ``out`` at or past it (``name`` / ``size_name`` name them; the CUDA twin
    records the same as deferred errors). Masks are small: NumPy does it.
    """
    values = mask.astype(np.int64)
    bad = (values != 0) & (values != 1)
    if bad.any():
        value = int(values.reshape(-1)[int(np.argmax(bad.reshape(-1)))])
        raise ValueError(f"{name}: expected only 0 and 1, got {value}")
    positions = np.cumsum(values, axis=1) - 1
    positions[values == 0] = pad_position
    positions = positions[:, values.shape[1] - out.shape[1]:]
    if max_positions >= 0 and positions.size:
        over = (positions >= max_positions).reshape(-1)
        if over.any():
            value = int(positions.reshape(-1)[int(np.argmax(over))])
            raise ValueError(f"{name}: gives position {value}, but {size_name}="
                             f"{max_positions}: positions must stay below {max_positions}")
    out[...] = positions


# ---------------------------------------------------------------- kernels

# ---------------------------------------------------------------- sinusoid table


@kernel(parallel=True)
def _sinusoid_fill(inv_freq, step_cos, step_sin, offset, block, concat, out, sin_acc, cos_acc):
    """Fill ``out`` block by block, the blocks of ``block`` rows split across threads.

    ``inv_freq`` holds the float64 frequencies ``w_i`` (``ceil(D / 2)`` of them
    interleaved, ``D // 2`` with ``concat``), ``step_cos`` / ``step_sin`` their
    cosines and sines; ``sin_acc`` / ``cos_acc`` are float64 scratch of shape
    ``(num_blocks, len(inv_freq))``.

    Each block starts from a direct sin/cos at its first row, then rotates
    (sin, cos) one position at a time:
    ``sin((p+1)w) = sin(pw)cos(w) + cos(pw)sin(w)`` and
    ``cos((p+1)w) = cos(pw)cos(w) - sin(pw)sin(w)``: four multiplies per channel
    pair instead of a sin and a cos. The recurrence runs in float64; its error
    grows about linearly with the rows since the anchor, which the block length
    bounds.
    """
    rows = out.shape[0]
    dim = out.shape[1]
    pairs = dim // 2
    num_freq = inv_freq.size
    for b in prange(sin_acc.shape[0]):
        start = b * block
        stop = min(start + block, rows)
        s = sin_acc[b]
        c = cos_acc[b]
        first = np.float64(offset + start)
        for i in range(num_freq):
            angle = first * inv_freq[i]
            s[i] = np.sin(angle)
            c[i] = np.cos(angle)
        for r in range(start, stop):
            row = out[r]
            if concat:  # [sin | cos], an odd D's last channel zero
                for i in range(pairs):
                    row[i] = s[i]
                    row[pairs + i] = c[i]
                if dim > 2 * pairs:
                    row[dim - 1] = 0
            else:
                for i in range(pairs):
                    row[2 * i] = s[i]
                    row[2 * i + 1] = c[i]
                if num_freq > pairs:  # odd D: the last channel is an unpaired sin
                    row[dim - 1] = s[pairs]
            for i in range(num_freq):
                si = s[i]
                ci = c[i]
                s[i] = si * step_cos[i] + ci * step_sin[i]
                c[i] = ci * step_cos[i] - si * step_sin[i]


@kernel(parallel=True)
def _timestep_fill(times, freq, scale, flip, out):
    """One row per timestep, the rows split across threads; each entry a direct float64
    sin / cos (timesteps are arbitrary numbers: no recurrence)."""
    dim = out.shape[1]
    half = freq.size
    sin_at = half if flip else 0
    cos_at = 0 if flip else half
    for n in prange(out.shape[0]):
        t = times[n]
        for i in range(half):
            angle = scale * (t * freq[i])
            out[n, sin_at + i] = np.sin(angle)
            out[n, cos_at + i] = np.cos(angle)
        if dim > 2 * half:
            out[n, dim - 1] = 0


# ---------------------------------------------------------------- x + P


@kernel(inline="always")
def _add_row(x, table, n, l, trow, out):
    for d in range(x.shape[2]):
        out[n, l, d] = x[n, l, d] + table[trow, d]


@kernel(parallel=True)
def _add_rows(x, table, start, out):
    """``out[n, l] = x[n, l] + table[start + l]`` for x of shape (N, L, D), the N * L rows
    split across threads."""
    seq = x.shape[1]
    for k in prange(x.shape[0] * seq):
        n = k // seq
        l = k - n * seq
        _add_row(x, table, n, l, start + l, out)


@kernel(parallel=True)
def _add_gathered_rows(x, table, positions, out):
    """``out[n, l] = x[n, l] + table[positions[n, l]]``, the N * L rows split across threads.

    ``positions`` has shape (N, L), or (1, L) to share one row of positions.
    """
    shared = positions.shape[0] == 1
    seq = x.shape[1]
    for k in prange(x.shape[0] * seq):
        n = k // seq
        l = k - n * seq
        pn = 0 if shared else n
        _add_row(x, table, n, l, positions[pn, l], out)


@kernel(parallel=True)
def _sum_over_batch(grad, start, out):
    """``out[start + l] += sum over n of grad[n, l]``, summed in batch order; one thread per
    position (same result for any thread count)."""
    for l in prange(grad.shape[1]):
        trow = start + l
        for n in range(grad.shape[0]):
            for d in range(grad.shape[2]):
                out[trow, d] += grad[n, l, d]


# ---------------------------------------------------------------- A * X + B


@kernel(parallel=True)
def _mult_add(x, a, b, out):
    """``out[n, l] = a[l] * x[n, l] + b[l]`` elementwise (rows ``l < L`` of a and b), the
    N * L rows split across threads."""
    seq = x.shape[1]
    for k in prange(x.shape[0] * seq):
        n = k // seq
        l = k - n * seq
        for d in range(x.shape[2]):
            out[n, l, d] = a[l, d] * x[n, l, d] + b[l, d]


@kernel(parallel=True)
def _mult_add_backward(grad, x, a, grad_x, grad_a, grad_b):
    """Gradients of :func:`mult_add`: ``grad_x = grad * a``; ``grad_a[l] += sum_n grad * x``;
    ``grad_b[l] += sum_n grad``. ``grad_a`` and ``grad_b`` rows ``l < L`` must start at zero.
    One thread per position, the batch summed in order.
    """
    for l in prange(grad.shape[1]):
        for n in range(grad.shape[0]):
            for d in range(grad.shape[2]):
                g = grad[n, l, d]
                grad_x[n, l, d] = g * a[l, d]
                grad_a[l, d] += g * x[n, l, d]
                grad_b[l, d] += g


# ---------------------------------------------------------------- positions from padding


@kernel()
def _positions_from_padding(ids, padding_idx, past, pad_position, out):
    """Per row ``r`` of ``ids`` (shape (R, L)): real tokens get ``past[r], past[r] + 1, ...``
    in order, padding tokens get ``pad_position``.
    """
    for r in range(ids.shape[0]):
        next_position = past[r]
        for l in range(ids.shape[1]):
            if ids[r, l] == padding_idx:
                out[r, l] = pad_position
            else:
                out[r, l] = next_position
                next_position += 1
