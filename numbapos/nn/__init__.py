"""Layers with parameters: forward caches, backward accumulates gradients."""

from . import init
from .dropout import Dropout
from .embedding import Embedding
from .module import IncompatibleKeys, Module
from .normalization import LayerNorm
from .parameter import Parameter

__all__ = [
    "Dropout",
    "Embedding",
    "IncompatibleKeys",
    "LayerNorm",
    "Module",
    "Parameter",
    "init",
]
