"""numbapos: embedding layers and positional encodings with Numba kernels.

Subpackages
-----------
functional
    Stateless ops, forward and backward (``embedding``, ``embedding_backward``, ...).
nn
    Layers with parameters (``Embedding``, ...) and the ``Module`` base.
optim
    ``SGD``, ``Adam``/``AdamW``, ``Adagrad``, ``RowWiseAdagrad`` for dense and
    row-sparse gradients, checkpointable with ``state_dict``.
io
    ``save_state`` / ``load_state`` for safetensors files (needs the ``io`` extra).
cuda
    GPU streams (``numbapos.cuda.stream(s)``) and captured training steps
    (``numbapos.cuda.capture(step)``, replayed as CUDA graphs).
config
    Runtime settings (the ``NUMBAPOS_*`` variables) and ``config.override(...)``.
distributed
    ``ShardedEmbedding``: a table sharded over Ray actors (imported on its own,
    ``import numbapos.distributed``; needs the ``distributed`` extra).

Gradients
---------
Modules pair each training-mode forward with one ``backward`` (last in, first
out); :class:`no_grad` (a context manager and decorator) turns the recording
off for inference, :func:`is_grad_enabled` tells whether it is on.

Devices
-------
Every op runs where its arrays live: NumPy arrays on the CPU, CUDA arrays
(Numba device arrays, CuPy, PyTorch CUDA tensors) on the GPU. Modules take
``device="cpu" | "cuda"``. :func:`cuda_available` says whether the GPU (or
Numba's CUDA simulator) can be used; :func:`to_device` / :func:`to_host` move
arrays. ``import numbapos`` never imports ``numba.cuda``. GPU ops are
asynchronous: they queue their kernels and return; :func:`synchronize` waits
for them and raises an index error they found (as the next numbapos call and
every copy to the host also do).
"""

from . import config, cuda, functional, io, nn, optim
from ._device import (
    cuda_available,
    cuda_empty_cache,
    device_of,
    synchronize,
    to_device,
    to_host,
)
from ._grad_mode import is_grad_enabled, no_grad
from ._pool import get_num_threads, set_num_threads
from ._warmup import warmup
from .jagged import JaggedArray, KeyedArray, KeyedJaggedArray
from .sparse import SparseRows

__version__ = "0.1.0"

__all__ = ["JaggedArray", "KeyedArray", "KeyedJaggedArray", "SparseRows", "__version__",
           "config", "cuda", "cuda_available", "cuda_empty_cache",
           "device_of",
           "functional", "get_num_threads", "io", "is_grad_enabled", "nn", "no_grad", "optim",
           "set_num_threads", "synchronize", "to_device", "to_host",
           "warmup"]
