"""CUDA launchers and kernels for layer normalisation over the last dimension.

Twin of :mod:`numbapos.kernels.cpu.normalization` (same ``__all__``, signatures
and results). Rows are ``(R, D)`` C-contiguous device arrays.

Per-row work (the forward pass, the input gradient) takes one block of
:func:`.reduce.tree_threads` threads per row (a warp for D <= 32, up to
:data:`~numbapos.kernels.cuda.arrays.THREADS`; blocks stride over the rows); the threads
walk along D, so a warp reads consecutive elements, and the row sums are the shared-
memory tree reductions of :mod:`.reduce`. Nothing is read back to the host; the gradient
kernels return at once while an index error is pending (:mod:`.errors`). The statistics
are those of the CPU (corrected two-pass: a first mean, then the sum and the sum of
squares of the deviations from it) in the input's dtype; only the order of the additions
inside a row differs, so float32 results agree with the CPU's to a few ulp.

The weight and bias gradients are sums over rows. As on the CPU they are cut
into the fixed chunks of :func:`numbapos._args.chunk_rows` rows: one thread per
``(chunk, d)`` adds its chunk's rows in row order into a partial row, and a
second kernel adds the partials in chunk order, one thread per ``d``. No
atomics; the CPU adds the same terms in the same order, so these gradients are
bit-identical to the CPU's.

FMA contraction: NVVM fuses ``acc + a * b`` into one fused multiply-add by
default (its ``-fma=1``, which Numba leaves on without fastmath) while the CPU
rounds the product first. The products that feed the bit-exact chunk sums go
through :func:`~numbapos.kernels.cuda.fpmath.mul_for` (libdevice
``__nv_fmul_rn`` / ``__nv_dmul_rn``, PTX ``mul.rn``, which is never
contracted). Inside the row reductions and the
normalisation contraction is left on: those are compared with a tolerance.
"""

import math
from functools import cache

from numba import cuda

from ..._args import chunk_rows, num_chunks
from ..._gpuhost.launch import launch
from . import errors
from .arrays import MAX_BLOCKS, THREADS, absent, empty, full, grid
from .fpmath import mul_for, numba_float
from .reduce import block_sum, block_sum2, tree_threads

__all__ = ["layer_norm_backward_rows", "layer_norm_rows"]


# ---------------------------------------------------------------- shared device helpers

def row_blocks(rows: int) -> int:
    """Blocks of a one-block-per-row kernel (blocks stride over the rows)."""
    return max(1, min(MAX_BLOCKS, int(rows)))


@cuda.jit(device=True)
def moments(first, c, q, n, eps, zero, one, inf):
    """``(mean, rstd)`` from a first mean and the sums of the deviations from it.

    As :func:`numbapos.kernels.cpu.normalization.row_moments`: ``var`` is the
    biased variance clamped at 0, ``rstd = 1 / sqrt(var + eps)``, and ``inf``
    when ``var + eps == 0`` (the output is then NaN, as in PyTorch). All
    arguments are of the data's dtype.
    """
    shift = c / n
    var = q / n - shift * shift
    if var < zero:
        var = zero
    den = math.sqrt(var + eps)
    if den == zero:
        rstd = inf
    else:
        rstd = one / den
    return first + shift, rstd


@cuda.jit
def sum_partials(part, out, err):
    """``out[m] = part[0, m] + part[1, m] + ...`` added in chunk order, one thread per m.

    A gradient: nothing is written while an index error is pending."""
    if errors.is_pending(err):
        return
    chunks = part.shape[0]
    for m in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        s = part[0, m]
        for c in range(1, chunks):
            s += part[c, m]
        out[m] = s


@cuda.jit(device=True)
def _sum_column(part, out, m):
    s = part[0, m]
    for c in range(1, part.shape[0]):
        s += part[c, m]
    out[m] = s


@cuda.jit
def sum_partials3(part0, part1, part2, out0, out1, out2, err):
    """:func:`sum_partials` of three gradients at once (an empty ``out`` is none), one
    thread per element of the three ``out``; each added in chunk order (the same bits)."""
    if errors.is_pending(err):
        return
    n0 = out0.size
    n01 = n0 + out1.size
    for m in range(cuda.grid(1), n01 + out2.size, cuda.gridsize(1)):
        if m < n0:
            _sum_column(part0, out0, m)
        elif m < n01:
            _sum_column(part1, out1, m - n0)
        else:
            _sum_column(part2, out2, m - n01)


@cuda.jit
def fill(out, value):
    """``out[:] = value`` over a flat ``out``."""
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = value


def fill_zero(out):
    """Zero a C-contiguous device array of any shape."""
    if out.size:
        flat = out.reshape(out.size)
        launch(fill, grid(flat.size), THREADS, flat, flat.dtype.type(0))


def add_partials(part, out):
    """``out`` (any shape) = the sum over the first axis of ``part`` (``(C,) + out.shape``)."""
    if out.size:
        flat = out.reshape(out.size)
        launch(sum_partials, grid(flat.size), THREADS, part.reshape(part.shape[0], flat.size),
               flat, errors.device_word())


def add_partials_together(pairs):
    """:func:`add_partials` of up to three ``(part, out)`` pairs (``out`` non-empty, of one
    dtype) in one launch."""
    pairs = [(part.reshape(part.shape[0], out.size), out.reshape(out.size))
             for part, out in pairs if out.size]
    if not pairs:
        return
    dtype = pairs[0][1].dtype
    total = sum(out.size for _, out in pairs)
    pairs += [(absent(dtype, 2), absent(dtype))] * (3 - len(pairs))
    (p0, o0), (p1, o1), (p2, o2) = pairs
    launch(sum_partials3, grid(total), THREADS, p0, p1, p2, o0, o1, o2, errors.device_word())


# ---------------------------------------------------------------- launchers


def layer_norm_rows(x, weight, bias, eps, y, mean, rstd):
    """Normalise each row of ``x`` (``(R, D)``) into ``y``; per-row ``mean`` and ``rstd``.

    ``weight`` / ``bias`` are ``(D,)`` or None (ones / zeros).
    """
    rows, dim = x.shape
    if rows == 0:
        return
    dt = x.dtype.type
    weight = full((dim,), 1, x.dtype) if weight is None else weight
    bias = full((dim,), 0, x.dtype) if bias is None else bias
    launch(_forward_kernel(x.dtype), row_blocks(rows), tree_threads(dim), x, weight, bias,
           dt(eps), y, mean, rstd)


def layer_norm_backward_rows(grad_y, x, mean, rstd, weight, grad_x, grad_weight, grad_bias):
    """Input gradient of each row into ``grad_x``; ``grad_weight`` / ``grad_bias`` summed.

    ``grad_weight`` / ``grad_bias`` are ``(D,)`` outputs, or None when not
    wanted. They are summed per fixed chunk of rows (:func:`numbapos._args.chunk_rows`)
    and the chunks added in order, so the bits equal the CPU's.
    """
    rows, dim = x.shape
    if rows == 0:
        for out in (grad_weight, grad_bias):
            if out is not None:
                fill_zero(out)
        return
    weight = full((dim,), 1, x.dtype) if weight is None else weight
    word = errors.device_word()
    launch(_backward_x_kernel(x.dtype), row_blocks(rows), tree_threads(dim), grad_y, x, mean,
           rstd, weight, grad_x, word)
    want_w = grad_weight is not None
    want_b = grad_bias is not None
    if not (want_w or want_b):
        return
    chunks = num_chunks(rows)
    part_w = partials(want_w, (chunks, dim), x.dtype)
    part_b = partials(want_b, (chunks, dim), x.dtype)
    launch(_partials_kernel(x.dtype), grid(chunks * dim), THREADS, grad_y, x, mean, rstd, chunks,
           chunk_rows(rows), part_w, part_b, word)
    if want_w:
        add_partials(part_w, grad_weight)
    if want_b:
        add_partials(part_b, grad_bias)


def partials(wanted: bool, shape, dtype):
    """The per-chunk partial sums of one gradient, or an empty array when it is not wanted
    (the partials kernels sum into the non-empty ones only)."""
    if wanted:
        return empty(shape, dtype)
    return absent(dtype, len(shape))


# ---------------------------------------------------------------- kernels (one set per dtype)


@cache
def _forward_kernel(dtype):
    nbt = numba_float(dtype)

    @cuda.jit
    def layer_norm_forward(x, weight, bias, eps, y, mean, rstd):
        """One block per row: moments by tree reductions, then ``y`` and the statistics."""
        sh = cuda.shared.array((2, THREADS), nbt)
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x  # a power of two, tree_threads(...)
        rows, dim = x.shape
        zero = nbt(0)
        one = nbt(1)
        inf = nbt(math.inf)
        n = nbt(dim)
        for i in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            acc = zero
            for d in range(tid, dim, nt):
                acc += x[i, d]
            first = block_sum(sh, acc, tid, nt) / n
            c = zero
            q = zero
            for d in range(tid, dim, nt):
                t = x[i, d] - first
                c += t
                q += t * t
            c, q = block_sum2(sh, c, q, tid, nt)
            m, r = moments(first, c, q, n, eps, zero, one, inf)
            for d in range(tid, dim, nt):
                y[i, d] = (x[i, d] - m) * r * weight[d] + bias[d]
            if tid == 0:
                mean[i] = m
                rstd[i] = r

    return layer_norm_forward


@cache
def _backward_x_kernel(dtype):
    nbt = numba_float(dtype)

    @cuda.jit
    def layer_norm_backward_x(grad_y, x, mean, rstd, weight, grad_x, err):
        """One block per row: ``grad_x = rstd * (g - mean(g) - xhat * mean(g * xhat))``.

        A gradient: returns at once while an index error is pending."""
        if errors.is_pending(err):
            return
        sh = cuda.shared.array((2, THREADS), nbt)
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x  # a power of two, tree_threads(...)
        rows, dim = x.shape
        zero = nbt(0)
        n = nbt(dim)
        for i in range(cuda.blockIdx.x, rows, cuda.gridDim.x):
            m = mean[i]
            r = rstd[i]
            sg = zero
            sgx = zero
            for d in range(tid, dim, nt):
                g = grad_y[i, d] * weight[d]
                grad_x[i, d] = g
                sg += g
                sgx += g * ((x[i, d] - m) * r)
            sg, sgx = block_sum2(sh, sg, sgx, tid, nt)
            a = sg / n
            b = sgx / n
            for d in range(tid, dim, nt):
                xhat = (x[i, d] - m) * r
                grad_x[i, d] = r * (grad_x[i, d] - a - xhat * b)

    return layer_norm_backward_x


@cache
def _partials_kernel(dtype):
    nbt = numba_float(dtype)
    mul = mul_for(dtype)

    @cuda.jit
    def layer_norm_partials(grad_y, x, mean, rstd, chunks, chunk, part_w, part_b, err):
        """One thread per ``(chunk, d)``: its chunk's ``gy * xhat`` / ``gy`` in row order
        into the partials that are not empty (nothing while an index error is pending)."""
        if errors.is_pending(err):
            return
        want_w = part_w.size != 0
        want_b = part_b.size != 0
        rows, dim = x.shape
        zero = nbt(0)
        for k in range(cuda.grid(1), chunks * dim, cuda.gridsize(1)):
            c = k // dim
            d = k - c * dim
            start = c * chunk
            stop = min(start + chunk, rows)
            pw = zero
            pb = zero
            for i in range(start, stop):
                g = grad_y[i, d]
                if want_w:
                    pw += mul(g, (x[i, d] - mean[i]) * rstd[i])
                if want_b:
                    pb += g
            if want_w:
                part_w[c, d] = pw
            if want_b:
                part_b[c, d] = pb

    return layer_norm_partials
