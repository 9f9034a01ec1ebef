"""CUDA launchers and kernels for resized tables and fractional positions.

Twin of :mod:`numbapos.kernels.cpu.resize` (same ``__all__``, signature and
bits): one thread per element, threads along the row; the two products go
through uncontracted float64 multiplies, so no FMA changes a bit.
"""

import math

from numba import cuda, float64, int64

from ..._gpuhost.launch import launch
from . import errors
from .arrays import THREADS, grid
from .fpmath import mul_f64

__all__ = ["blend_rows", "fractional_rows", "scale_rows"]


def blend_rows(table, index0, index1, weight0, weight1, out):
    """``out[n] = weight0[n] * table[index0[n]] + weight1[n] * table[index1[n]]``.

    ``index0`` / ``index1`` are int64 and ``weight0`` / ``weight1`` float64
    device arrays, one entry per row of ``out``.
    """
    if out.size:
        launch(_blend, grid(out.size), THREADS, table, index0, index1, weight0, weight1, out)


def fractional_rows(positions, num_positions, index0, index1, weight0, weight1):
    """The two rows and weights of float ``positions`` in a table of ``num_positions`` rows.

    Entry ``n`` of the (device) outputs is for ``p = positions[n % positions.size]``:
    ``index0 = min(floor(p), M - 1)``, ``index1 = min(index0 + 1, M - 1)``,
    ``weight1 = p - index0``, ``weight0 = 1 - weight1``, computed on the device
    (nothing read back). A position outside ``[0, M - 1]`` (NaN included) is
    recorded as the deferred error (``position_ids`` / ``max_len``, its value
    rounded away from the range to an integer: NaN as -1) and gets row 0 with
    weights 0. Returns -1 (the CPU twin's "no bad position"), always.
    """
    if index0.size:
        word, host = errors.words()
        launch(_fractional_rows, grid(index0.size), THREADS, positions, int64(num_positions),
               index0, index1, weight0, weight1, word, host, errors.tag("position_ids", "max_len"))
        errors.after_launch()
    return -1


def scale_rows(values, weights, out):
    """``out[n] = weights[n] * values[n]`` for ``(N, D)`` arrays and float64 ``weights``."""
    if out.size:
        launch(_scale, grid(out.size), THREADS, values, weights, out)


@cuda.jit
def _scale(values, weights, out):
    dim = out.shape[1]
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        n = k // dim
        d = k - n * dim
        out[n, d] = mul_f64(weights[n], float64(values[n, d]))


@cuda.jit
def _blend(table, index0, index1, weight0, weight1, out):
    dim = out.shape[1]
    for k in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        n = k // dim
        d = k - n * dim
        w1 = weight1[n]
        if w1 == 0.0:
            out[n, d] = table[index0[n], d]
        else:
            out[n, d] = (mul_f64(weight0[n], float64(table[index0[n], d]))
                         + mul_f64(w1, float64(table[index1[n], d])))


@cuda.jit
def _fractional_rows(positions, num_positions, index0, index1, weight0, weight1, err,
                     err_host, which):
    last = num_positions - 1
    for n in range(cuda.grid(1), index0.size, cuda.gridsize(1)):
        k = n % positions.size
        p = float64(positions[k])
        if not (p >= 0.0 and p <= float64(last)):  # NaN included
            if p != p:
                value = int64(-1)
            elif p < 0.0:
                value = int64(math.floor(p)) if p > -9.0e18 else int64(-(2 ** 62))
            else:
                value = int64(math.ceil(p)) if p < 9.0e18 else int64(2 ** 62)
            errors.record(err, err_host, int64(k), value, num_positions, which)
            index0[n] = 0
            index1[n] = 0
            weight0[n] = 0.0
            weight1[n] = 0.0
            continue
        i0 = min(int64(math.floor(p)), last)
        w1 = p - float64(i0)
        index0[n] = i0
        index1[n] = min(i0 + 1, last)
        weight1[n] = w1
        weight0[n] = 1.0 - w1
