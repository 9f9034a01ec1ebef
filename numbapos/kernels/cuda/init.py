"""CUDA launcher and kernel of the keyed initialiser.

Twin of :mod:`numbapos.kernels.cpu.init`: the same ``register_jitable``
:func:`numbapos.kernels.hash.keyed_normal`, one thread per element. The random
bits are the CPU's bit for bit; the logarithm and cosine are the GPU's, so
values may differ from the CPU's in the last bits.
"""

from numba import cuda

from ..._gpuhost.launch import launch
from ..hash import keyed_normal
from .arrays import THREADS, grid

__all__ = ["keyed_normal_rows_"]


def keyed_normal_rows_(rows, seed, mean, std, out):
    """``out[j, d] = mean + std * z(seed, rows[j], d)`` for int64 ``rows`` and a 2-D ``out``."""
    if out.size:
        launch(_keyed_normal_rows, grid(out.size), THREADS, rows, seed, mean, std, out)


@cuda.jit
def _keyed_normal_rows(rows, seed, mean, std, out):
    dim = out.shape[1]
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        j = i // dim
        d = i - j * dim
        out[j, d] = mean + std * keyed_normal(seed, rows[j], d)
