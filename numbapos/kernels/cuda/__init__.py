"""The CUDA backend: ``@cuda.jit`` kernels behind launchers with the CPU backend's names.

Imported only by :func:`numbapos._device.kernels_for` when a CUDA array or
``device="cuda"`` asks for it; on a machine without a GPU it runs on Numba's
CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before Numba is imported).

The host side of launching (plans, the native launch, streams, the caching
allocator, graphs) is :mod:`numbapos._gpuhost`. Importing this package changes
nothing outside it: :func:`start`, which :func:`numbapos._device.kernels_for`
calls once before the first launch, installs the caching allocator.
"""

from ..._gpuhost import memory
from .. import import_areas
from . import (  # the helpers read from outside the backend
    clock,  # noqa: F401 (the optimiser ops tick their device clocks through it)
    errors,  # noqa: F401 (``_device`` raises and synchronises through it)
)

AREAS = import_areas(__name__, globals())
__all__ = sorted(name for area in AREAS for name in area.__all__)


def start() -> None:
    """Prepare the backend for its first launch: check that numba-cuda can compile
    with this NumPy, then install the caching allocator, before Numba makes its first
    CUDA context (see :mod:`.memory`)."""
    problem = numpy_incompatibility()
    if problem:
        raise RuntimeError(problem)
    memory.install()


def numpy_incompatibility(import_module=None) -> str | None:
    """Why numba-cuda cannot compile kernels with the installed NumPy, or None.

    numba-cuda up to 0.30 registers ``np.row_stack``, which NumPy 2.5 removed; every
    kernel then fails to compile with an ``AttributeError`` from deep inside Numba
    (seen on a GPU machine with numba-cuda 0.30.4 and NumPy 2.5.2). The module that
    does so is imported here once, so the user reads the cause and the fix instead.
    """
    import importlib

    import numpy as np
    from numba import config

    if hasattr(np, "row_stack") or config.ENABLE_CUDASIM:
        return None
    try:
        (import_module or importlib.import_module)("numba.cuda.np.arrayobj")
    except AttributeError as exc:
        if "row_stack" not in str(exc):
            raise
        import numba_cuda

        return (f"numba-cuda {numba_cuda.__version__} cannot compile kernels with NumPy "
                f"{np.__version__} (it still uses np.row_stack, removed in NumPy 2.5): "
                "install numpy<2.5 (pip install 'numbapos[cuda]' does) or a numba-cuda "
                "that supports this NumPy")
    return None
