"""The CUDA backend: ``@cuda.jit`` kernels behind launchers with the CPU backend's names.

Imported only by :func:`numbapos._device.kernels_for` when a CUDA array or
``device="cuda"`` asks for it; on a machine without a GPU it runs on Numba's
CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before Numba is imported).
"""

from . import memory

memory.install()  # before Numba makes its first CUDA context (see memory.py)

from . import (  # noqa: E402
    alibi,
    arrays,
    blocks,
    dropout,
    embedding,
    init,
    normalization,
    optim,
    positional,
    resize,
    rotary,
)
from .alibi import *  # noqa: E402, F403
from .arrays import *  # noqa: E402, F403
from .blocks import *  # noqa: E402, F403
from .dropout import *  # noqa: E402, F403
from .embedding import *  # noqa: E402, F403
from .init import *  # noqa: E402, F403
from .normalization import *  # noqa: E402, F403
from .optim import *  # noqa: E402, F403
from .positional import *  # noqa: E402, F403
from .resize import *  # noqa: E402, F403
from .rotary import *  # noqa: E402, F403

AREAS = (alibi, arrays, blocks, dropout, embedding, init, normalization, optim, positional,
         resize, rotary)
__all__ = sorted(name for area in AREAS for name in area.__all__)
