"""numbapos: embedding layers and positional encodings with Numba kernels.

Subpackages
-----------
functional
    Stateless ops, forward and backward (``embedding``, ``embedding_backward``, ...).
nn
    Layers with parameters (``Embedding``, ...) and the ``Module`` base.
optim
    ``SGD`` for dense and row-sparse gradients.
io
    ``save_state`` / ``load_state`` for safetensors files (needs the ``io`` extra).
"""

from . import functional, io, nn, optim
from .sparse import SparseRows

__version__ = "0.1.0"

__all__ = ["SparseRows", "__version__", "functional", "io", "nn", "optim"]
