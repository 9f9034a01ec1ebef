"""The CUDA backend: ``@cuda.jit`` kernels behind launchers with the CPU backend's names.

Imported only by :func:`numbapos._device.kernels_for` when a CUDA array or
``device="cuda"`` asks for it; on a machine without a GPU it runs on Numba's
CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before Numba is imported).

Importing it changes nothing outside it: :func:`start`, which
:func:`numbapos._device.kernels_for` calls once before the first launch,
installs the caching allocator (:mod:`.memory`).
"""

from .. import import_areas
from . import (  # the helpers read from outside the backend
    clock,  # noqa: F401 (the optimiser ops tick their device clocks through it)
    errors,  # noqa: F401 (``_device`` raises and synchronises through it)
    graphs,  # noqa: F401 (numbapos.cuda.capture)
    launch,  # noqa: F401 (every launcher launches through it)
    memory,
    streams,  # noqa: F401 (numbapos.cuda and the allocator read the current stream)
)

AREAS = import_areas(__name__, globals())
__all__ = sorted(name for area in AREAS for name in area.__all__)


def start() -> None:
    """Prepare the backend for its first launch: the caching allocator, before
    Numba makes its first CUDA context (see :mod:`.memory`)."""
    memory.install()
