"""Layers with parameters: forward caches, backward accumulates gradients."""

from . import init
from .dropout import Dropout
from .embedding import Embedding
from .module import IncompatibleKeys, Module
from .normalization import LayerNorm
from .parameter import Parameter
from .positional import LearnedPosEmbedding, PositionalEmbedding, SinusoidalPosEmbedding

__all__ = [
    "Dropout",
    "Embedding",
    "IncompatibleKeys",
    "LayerNorm",
    "LearnedPosEmbedding",
    "Module",
    "Parameter",
    "PositionalEmbedding",
    "SinusoidalPosEmbedding",
    "init",
]
