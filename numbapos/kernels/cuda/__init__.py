"""The CUDA backend: ``@cuda.jit`` kernels behind launchers with the CPU backend's names.

Imported only by :func:`numbapos._device.kernels_for` when a CUDA array or
``device="cuda"`` asks for it; on a machine without a GPU it runs on Numba's
CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before Numba is imported).
"""

from . import arrays
from .arrays import *  # noqa: F403

AREAS = [arrays]
__all__ = sorted(name for area in AREAS for name in area.__all__)
