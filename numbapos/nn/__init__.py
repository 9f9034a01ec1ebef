"""Layers with parameters: forward caches, backward accumulates gradients."""

from . import init
from .embedding import Embedding
from .module import IncompatibleKeys, Module
from .parameter import Parameter

__all__ = [
    "Embedding",
    "IncompatibleKeys",
    "Module",
    "Parameter",
    "init",
]
