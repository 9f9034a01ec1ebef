"""The CPU backend: ``@njit`` kernels behind launchers with the CUDA backend's names.

Each area module's ``__all__`` lists its launchers; this namespace re-exports
them all, and :func:`numbapos._device.backend` returns it for NumPy arrays.
Importing it starts nothing: Numba's thread pool starts at the first launch
of a parallel kernel, with numbapos's wait policy (:mod:`numbapos._pool`).
"""

from .. import stepvalues  # noqa: F401 (the optimisers' step scalars: functional.optim)
from . import (
    alibi,
    arrays,
    blocks,
    cachestamp,
    dropout,
    embedding,
    half,
    halfoptim,
    init,
    jit,  # noqa: F401 (SerialParallel: the warm-up lists every kernel)
    normalization,
    optim,
    positional,
    prefetch,  # noqa: F401  (its setting: python -m numbapos info)
    quantized,
    resize,
    rotary,
)
from .alibi import *  # noqa: F403
from .arrays import *  # noqa: F403
from .blocks import *  # noqa: F403
from .dropout import *  # noqa: F403
from .embedding import *  # noqa: F403
from .half import *  # noqa: F403
from .halfoptim import *  # noqa: F403
from .init import *  # noqa: F403
from .normalization import *  # noqa: F403
from .optim import *  # noqa: F403
from .positional import *  # noqa: F403
from .quantized import *  # noqa: F403
from .resize import *  # noqa: F403
from .rotary import *  # noqa: F403

AREAS = (alibi, arrays, blocks, dropout, embedding, half, halfoptim, init, normalization, optim,
         positional, quantized, resize, rotary)
__all__ = sorted(name for area in AREAS for name in area.__all__)

# Before any kernel loads: cached kernels compiled from other sources or settings go.
cachestamp.refresh()


def start() -> None:
    """Prepare the backend for its first launch: nothing to do here. The thread
    pool starts at the first parallel launch (:func:`.arrays.runs_parallel`)."""

