"""Layers with parameters: forward caches, backward accumulates gradients."""

from . import init
from .blocks import BertEmbeddings, GPT2Embeddings
from .dropout import Dropout
from .embedding import Embedding
from .module import IncompatibleKeys, Module
from .normalization import LayerNorm
from .parameter import Parameter
from .positional import LearnedPosEmbedding, PositionalEmbedding, SinusoidalPosEmbedding
from .quantized import QuantizedEmbedding

__all__ = [
    "BertEmbeddings",
    "Dropout",
    "Embedding",
    "GPT2Embeddings",
    "IncompatibleKeys",
    "LayerNorm",
    "LearnedPosEmbedding",
    "Module",
    "Parameter",
    "PositionalEmbedding",
    "QuantizedEmbedding",
    "SinusoidalPosEmbedding",
    "init",
]
