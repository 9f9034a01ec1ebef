"""Stateless ops, forward and backward: validate the inputs, allocate, run a kernel.

``functional`` is the only layer that knows both the checks and the kernels;
modules in :mod:`numbapos.nn` are thin owners of parameters over these ops.
"""

from .blocks import (
    bert_embeddings,
    bert_embeddings_backward,
    bert_embeddings_forward,
    gpt2_embeddings,
    gpt2_embeddings_backward,
    positions_from_attention_mask,
)
from .dropout import dropout, dropout_backward, dropout_mask
from .embedding import embedding, embedding_backward, embedding_renorm_, padding_mask
from .normalization import layer_norm, layer_norm_backward, layer_norm_forward
from .positional import (
    add_positional,
    add_positional_backward,
    positional_mult_add,
    positional_mult_add_backward,
    positions_from_padding,
    sinusoidal_pos_embedding,
)

__all__ = [
    "add_positional",
    "add_positional_backward",
    "bert_embeddings",
    "bert_embeddings_backward",
    "bert_embeddings_forward",
    "dropout",
    "dropout_backward",
    "dropout_mask",
    "embedding",
    "embedding_backward",
    "embedding_renorm_",
    "gpt2_embeddings",
    "gpt2_embeddings_backward",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_forward",
    "padding_mask",
    "positional_mult_add",
    "positional_mult_add_backward",
    "positions_from_attention_mask",
    "positions_from_padding",
    "sinusoidal_pos_embedding",
]
