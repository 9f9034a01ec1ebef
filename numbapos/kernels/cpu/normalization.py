"""CPU kernels for layer normalisation over the last dimension, forward and backward.

Rows are ``(R, D)`` C-contiguous views; every row is normalised on its own, so
the forward pass and the input gradient split across threads by row. Row
statistics are computed in the input's dtype with the corrected two-pass
algorithm (a first mean, then the sum and the sum of squares of the deviations
from it), which keeps float32 within a few ulp of a float64 reference even
when the mean is large next to the spread.

The weight and bias gradients are sums over rows. To make them bit-identical
for any thread count, rows are cut into chunks whose size depends only on the
number of rows, each chunk is summed by one thread into its own partial row,
and the partials are then added in chunk order.

The reductions over one row are compiled with ``fastmath={"reassoc"}`` so LLVM
can vectorise them: the summation order then depends on the row length and the
compiled code, never on threads. No other fast-math flag is used (NaN and inf
propagate as usual). They stay functions of their own (Numba's IR inlining
would compile them with the caller's flags); the backward's reduction also adds
the row's weight and bias terms in the same pass (a row is read twice, not
five times). The elementwise row steps are inlined into the kernels
(``inline="always"``, no fast-math anywhere on that path), so that they cost
no call per row and step.
"""

import numpy as np
from numba import prange

from ..._args import chunk_rows, num_chunks
from .arrays import pick
from .jit import kernel

__all__ = ["layer_norm_backward_rows", "layer_norm_rows"]


def _affine(param, dim, dtype, value):
    return np.full(dim, value, dtype=dtype) if param is None else param


def layer_norm_rows(x, weight, bias, eps, y, mean, rstd):
    """Normalise each row of ``x`` (``(R, D)``) into ``y``; per-row ``mean`` and ``rstd``.

    ``weight`` / ``bias`` are ``(D,)`` or None (ones / zeros).
    """
    if x.shape[0] == 0:
        return
    dim = x.shape[1]
    weight = _affine(weight, dim, x.dtype, 1)
    bias = _affine(bias, dim, x.dtype, 0)
    pick(_layer_norm_rows, x.size)(x, weight, bias, eps, y, mean, rstd)


def layer_norm_backward_rows(grad_y, x, mean, rstd, weight, grad_x, grad_weight, grad_bias):
    """Input gradient of each row into ``grad_x``; ``grad_weight`` / ``grad_bias`` summed.

    ``grad_weight`` / ``grad_bias`` are ``(D,)`` outputs, or None when not
    wanted. They are summed per fixed chunk of rows (:func:`~numbapos.kernels.args.chunk_rows`)
    and the chunks added in order, so the bits do not depend on the thread count.
    """
    dim = x.shape[1]
    num_rows = x.shape[0]
    want_w = grad_weight is not None
    want_b = grad_bias is not None
    if num_rows == 0:
        for out in (grad_weight, grad_bias):
            if out is not None:
                out[:] = 0
        return
    # Each chunk zeroes its own partial rows in the kernel, in its thread's cache.
    part_w = np.empty((num_chunks(num_rows), dim if want_w else 0), dtype=x.dtype)
    part_b = np.empty((num_chunks(num_rows), dim if want_b else 0), dtype=x.dtype)
    weight = _affine(weight, dim, x.dtype, 1)
    pick(_backward_chunks, x.size)(grad_y, x, mean, rstd, weight, want_w, want_b,
                                   chunk_rows(num_rows), grad_x, part_w, part_b)
    if want_w:
        _sum_partials(part_w, grad_weight)
    if want_b:
        _sum_partials(part_b, grad_bias)


@kernel(fastmath={"reassoc"})
def row_sum(v):
    """Sum of a 1-D array in its own dtype."""
    s = v.dtype.type(0)
    for d in range(v.size):
        s += v[d]
    return s


# error_model="numpy": with eps = 0 a constant row has var + eps = 0, and rstd must
# become inf (a NaN output, as in PyTorch), not a ZeroDivisionError from the kernel.
@kernel(fastmath={"reassoc"}, error_model="numpy")
def row_moments(v, first_mean, eps):
    """``(mean, rstd)`` of a row given a first estimate of its mean (corrected two-pass).

    ``rstd = 1 / sqrt(var + eps)`` with the biased variance, as PyTorch.
    """
    dt = v.dtype.type
    n = dt(v.size)
    c = dt(0)
    q = dt(0)
    for d in range(v.size):
        t = v[d] - first_mean
        c += t
        q += t * t
    shift = c / n
    var = q / n - shift * shift
    if var < dt(0):
        var = dt(0)
    return first_mean + shift, dt(1) / np.sqrt(var + dt(eps))


@kernel(inline="always")
def normalize_row(v, mean, rstd, weight, bias, out):
    """``out = (v - mean) * rstd * weight + bias``."""
    for d in range(v.size):
        out[d] = (v[d] - mean) * rstd * weight[d] + bias[d]


@kernel(inline="always")
def normalize_row_(v, mean, rstd, weight, bias):
    """``v = (v - mean) * rstd * weight + bias`` in place.

    Same arithmetic as :func:`normalize_row`. A separate function because LLVM
    only vectorises :func:`normalize_row` after a runtime check that ``out``
    and ``v`` do not overlap, which fails when they are the same row.
    """
    for d in range(v.size):
        v[d] = (v[d] - mean) * rstd * weight[d] + bias[d]


@kernel(inline="always")
def layer_norm_row(v, weight, bias, eps, out):
    """Normalise one row into ``out``; returns ``(mean, rstd)``."""
    first = row_sum(v) / v.dtype.type(v.size)
    mean, rstd = row_moments(v, first, eps)
    normalize_row(v, mean, rstd, weight, bias, out)
    return mean, rstd


@kernel(parallel=True)
def _layer_norm_rows(x, weight, bias, eps, y, mean, rstd):
    """Forward pass over the rows of ``x``, rows split across threads."""
    for i in prange(x.shape[0]):
        m, r = layer_norm_row(x[i], weight, bias, eps, y[i])
        mean[i] = m
        rstd[i] = r


@kernel(fastmath={"reassoc"})
def grad_moments(gy, v, weight, mean, rstd, want_w, want_b, part_w, part_b):
    """``(sum g, sum g * xhat)`` over a row, ``g = gy * weight``, ``xhat = (v - mean) * rstd``.

    In the same pass adds the row's weight and bias gradient terms
    (``gy * xhat`` and ``gy``) to ``part_w`` / ``part_b`` when wanted: one read
    of the row for the sums and the partials, instead of three.
    """
    zero = gy.dtype.type(0)
    sg = zero
    sgx = zero
    if want_w and want_b:
        for d in range(gy.size):
            xhat = (v[d] - mean) * rstd
            g = gy[d] * weight[d]
            sg += g
            sgx += g * xhat
            part_w[d] += gy[d] * xhat
            part_b[d] += gy[d]
    else:
        for d in range(gy.size):
            g = gy[d] * weight[d]
            sg += g
            sgx += g * ((v[d] - mean) * rstd)
        if want_w:
            for d in range(gy.size):
                part_w[d] += gy[d] * ((v[d] - mean) * rstd)
        if want_b:
            for d in range(gy.size):
                part_b[d] += gy[d]
    return sg, sgx


@kernel(inline="always")
def layer_norm_row_backward(gy, v, mean, rstd, weight, want_w, want_b, gx, part_w, part_b):
    """Input gradient of one row into ``gx``; adds the row's weight/bias terms to the partials.

    ``gx = rstd * (g - mean(g) - xhat * mean(g * xhat))`` with ``g = gy * weight``:
    two passes over the row, the sums (:func:`grad_moments`) and then ``gx``.
    """
    n = v.dtype.type(v.size)
    sg, sgx = grad_moments(gy, v, weight, mean, rstd, want_w, want_b, part_w, part_b)
    a = sg / n
    b = sgx / n
    for d in range(v.size):
        xhat = (v[d] - mean) * rstd
        gx[d] = rstd * (gy[d] * weight[d] - a - xhat * b)


@kernel(parallel=True)
def _backward_chunks(grad_y, x, mean, rstd, weight, want_w, want_b, chunk_rows, grad_x, part_w,
                     part_b):
    """Backward pass, the chunks of ``chunk_rows`` rows split across threads.

    ``part_w`` / ``part_b`` have one row per chunk (``(n_chunks, 0)`` when that
    gradient is not wanted), which the chunk zeroes first.
    """
    n_chunks = (x.shape[0] + chunk_rows - 1) // chunk_rows
    for c in prange(n_chunks):
        start = c * chunk_rows
        stop = min(start + chunk_rows, x.shape[0])
        zero_rows(part_w[c:c + 1])
        zero_rows(part_b[c:c + 1])
        for i in range(start, stop):
            layer_norm_row_backward(grad_y[i], x[i], mean[i], rstd[i], weight, want_w, want_b,
                                    grad_x[i], part_w[c], part_b[c])


@kernel(inline="always")
def zero_rows(part):
    """``part[:] = 0`` for a 2-D array (a chunk's partial rows)."""
    for r in range(part.shape[0]):
        for d in range(part.shape[1]):
            part[r, d] = 0


@kernel()
def _sum_partials(part, out):
    """``out = part[0] + part[1] + ...``, added in row order (deterministic)."""
    dim = part.shape[1]
    for d in range(dim):
        out[d] = part[0, d]
    for c in range(1, part.shape[0]):
        for d in range(dim):
            out[d] += part[c, d]
