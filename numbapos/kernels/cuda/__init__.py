"""The CUDA backend: ``@cuda.jit`` kernels behind launchers with the CPU backend's names.

Imported only by :func:`numbapos._device.kernels_for` when a CUDA array or
``device="cuda"`` asks for it; on a machine without a GPU it runs on Numba's
CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before Numba is imported).

Importing it changes nothing outside it: :func:`start`, which
:func:`numbapos._device.kernels_for` calls once before the first launch,
installs the caching allocator (:mod:`.memory`).
"""

from . import (
    alibi,
    arrays,
    blocks,
    clock,  # noqa: F401 (the optimiser ops tick their device clocks through it)
    dropout,
    embedding,
    errors,  # noqa: F401 (``_device`` raises and synchronises through it)
    graphs,  # noqa: F401 (numbapos.cuda.capture)
    half,
    halfoptim,
    init,
    launch,  # noqa: F401 (every launcher launches through it)
    memory,
    normalization,
    optim,
    positional,
    quantized,
    resize,
    rotary,
    streams,  # noqa: F401 (numbapos.cuda and the allocator read the current stream)
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


def start() -> None:
    """Prepare the backend for its first launch: the caching allocator, before
    Numba makes its first CUDA context (see :mod:`.memory`)."""
    memory.install()
