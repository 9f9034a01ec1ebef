"""Layers with parameters: forward caches, backward accumulates gradients."""

from . import init
from .alibi import ALiBi
from .bag import EmbeddingBag
from .blocks import BertEmbeddings, GPT2Embeddings
from .collection import EmbeddingBagCollection, EmbeddingBagConfig
from .containers import ModuleDict, ModuleList, Sequential
from .dropout import Dropout
from .embedding import Embedding
from .module import IncompatibleKeys, Module
from .normalization import LayerNorm
from .parameter import Parameter
from .positional import LearnedPosEmbedding, PositionalEmbedding, SinusoidalPosEmbedding
from .quantized import QuantizedEmbedding, QuantizedEmbeddingBag
from .relative import RelativePositionBias
from .rotary import RotaryEmbedding

__all__ = [
    "ALiBi",
    "BertEmbeddings",
    "Dropout",
    "Embedding",
    "EmbeddingBag",
    "EmbeddingBagCollection",
    "EmbeddingBagConfig",
    "GPT2Embeddings",
    "IncompatibleKeys",
    "LayerNorm",
    "LearnedPosEmbedding",
    "Module",
    "ModuleDict",
    "ModuleList",
    "Parameter",
    "PositionalEmbedding",
    "QuantizedEmbedding",
    "QuantizedEmbeddingBag",
    "RelativePositionBias",
    "RotaryEmbedding",
    "Sequential",
    "SinusoidalPosEmbedding",
    "init",
]
