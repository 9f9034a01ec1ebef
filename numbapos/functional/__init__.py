"""Stateless ops, forward and backward: validate the inputs, then run the launchers.

Every op takes NumPy or CUDA arrays and runs where they live: it validates
(through :mod:`numbapos._checks`, on metadata), asks
:func:`numbapos._device.backend` for the kernel namespace of that device and
calls its launchers. Modules in :mod:`numbapos.nn` are thin owners of
parameters over these ops, and :mod:`numbapos.optim` updates through them.
"""

from .alibi import add_alibi_, alibi_bias, alibi_slopes, alibi_slopes_grad
from .bag import embedding_bag, embedding_bag_backward
from .blocks import (
    BertEmbeddingsGrads,
    GPT2EmbeddingsGrads,
    TableOptions,
    bert_embeddings,
    bert_embeddings_backward,
    bert_embeddings_forward,
    gpt2_embeddings,
    gpt2_embeddings_backward,
    positions_from_attention_mask,
)
from .collection import (
    CollectionLayout,
    embedding_bag_collection,
    embedding_bag_collection_backward,
    pack_tables,
)
from .dropout import dropout, dropout_backward, dropout_mask
from .embedding import embedding, embedding_backward, embedding_renorm_, padding_mask
from .half import store_rounded_, widen_table
from .init import keyed_normal_
from .normalization import layer_norm, layer_norm_backward, layer_norm_forward
from .optim import (
    adagrad_,
    adam_,
    rowwise_adagrad_,
    sgd_,
    sparse_adagrad_,
    sparse_adam_,
    sparse_rowwise_adagrad_,
    sparse_sgd_,
)
from .positional import (
    add_positional,
    add_positional_backward,
    positional_mult_add,
    positional_mult_add_backward,
    positions_from_padding,
    sinusoidal_pos_embedding,
    timestep_embedding,
)
from .quantized import (
    dequantize_rowwise,
    quantize_rowwise,
    quantized_embedding,
    quantized_embedding_bag,
    rowwise_width,
)
from .relative import (
    add_relative_position_bias_,
    log_bucket_position,
    relative_position_bias,
    relative_position_bias_grad,
    relative_position_bucket,
    relative_positions,
)
from .resize import resize_pos_table
from .rope import rope_frequencies
from .ropeindex import rope_index
from .rotary import apply_rotary, apply_rotary_backward, rotary_qk

__all__ = [
    "BertEmbeddingsGrads",
    "CollectionLayout",
    "GPT2EmbeddingsGrads",
    "TableOptions",
    "adagrad_",
    "adam_",
    "add_alibi_",
    "add_positional",
    "add_positional_backward",
    "add_relative_position_bias_",
    "alibi_bias",
    "alibi_slopes",
    "alibi_slopes_grad",
    "apply_rotary",
    "apply_rotary_backward",
    "bert_embeddings",
    "bert_embeddings_backward",
    "bert_embeddings_forward",
    "dequantize_rowwise",
    "dropout",
    "dropout_backward",
    "dropout_mask",
    "embedding",
    "embedding_backward",
    "embedding_bag",
    "embedding_bag_backward",
    "embedding_bag_collection",
    "embedding_bag_collection_backward",
    "embedding_renorm_",
    "gpt2_embeddings",
    "gpt2_embeddings_backward",
    "keyed_normal_",
    "layer_norm",
    "layer_norm_backward",
    "layer_norm_forward",
    "log_bucket_position",
    "pack_tables",
    "padding_mask",
    "positional_mult_add",
    "positional_mult_add_backward",
    "positions_from_attention_mask",
    "positions_from_padding",
    "quantize_rowwise",
    "quantized_embedding",
    "quantized_embedding_bag",
    "relative_position_bias",
    "relative_position_bias_grad",
    "relative_position_bucket",
    "relative_positions",
    "resize_pos_table",
    "rope_frequencies",
    "rope_index",
    "rotary_qk",
    "rowwise_adagrad_",
    "rowwise_width",
    "sgd_",
    "sinusoidal_pos_embedding",
    "sparse_adagrad_",
    "sparse_adam_",
    "sparse_rowwise_adagrad_",
    "sparse_sgd_",
    "store_rounded_",
    "timestep_embedding",
    "widen_table",
]
