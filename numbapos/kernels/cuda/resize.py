"""CUDA launchers and kernels for resized tables and fractional positions.

Twin of :mod:`numbapos.kernels.cpu.resize` (same ``__all__``, signature and
bits): one thread per element, threads along the row; the two products go
through uncontracted float64 multiplies, so no FMA changes a bit.
"""

from numba import cuda, float64

from .arrays import THREADS, grid
from .fpmath import mul_f64

__all__ = ["blend_rows", "scale_rows"]


def blend_rows(table, index0, index1, weight0, weight1, out):
    """``out[n] = weight0[n] * table[index0[n]] + weight1[n] * table[index1[n]]``.

    ``index0`` / ``index1`` are int64 and ``weight0`` / ``weight1`` float64
    device arrays, one entry per row of ``out``.
    """
    if out.size:
        _blend[grid(out.size), THREADS](table, index0, index1, weight0, weight1, out)


def scale_rows(values, weights, out):
    """``out[n] = weights[n] * values[n]`` for ``(N, D)`` arrays and float64 ``weights``."""
    if out.size:
        _scale[grid(out.size), THREADS](values, weights, out)


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
