"""The CPU backend: ``@njit`` kernels behind launchers with the CUDA backend's names.

Each area module's ``__all__`` lists its launchers; this namespace re-exports
them all, and :func:`numbapos._device.backend` returns it for NumPy arrays.
Importing it starts nothing: Numba's thread pool starts at the first launch
of a parallel kernel, with numbapos's wait policy (:mod:`numbapos._pool`).
"""

from .. import (
    import_areas,
    stepvalues,  # noqa: F401 (the optimisers' step scalars: functional.optim)
)
from . import (  # the helpers read from outside the backend
    cachestamp,
    jit,  # noqa: F401 (SerialParallel: the warm-up lists every kernel)
    prefetch,  # noqa: F401  (its setting: python -m numbapos info)
)

AREAS = import_areas(__name__, globals())
__all__ = sorted(name for area in AREAS for name in area.__all__)

# Before any kernel loads: cached kernels compiled from other sources or settings go.
cachestamp.refresh()


def start() -> None:
    """Prepare the backend for its first launch: nothing to do here. The thread
    pool starts at the first parallel launch (:func:`.arrays.runs_parallel`)."""

