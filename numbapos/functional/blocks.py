"""The BERT and GPT-2 embedding blocks as fused ops, forward and backward.

BERT: ``Dropout(LayerNorm(word[ids] + position[pos] + token_type[types]))``;
GPT-2: ``Dropout(wte[ids] + wpe[pos])``. One Numba kernel per block gathers
the rows, sums them, normalises (BERT) and applies dropout, token by token, so
the output is written once and nothing else of size ``(N, L, D)`` is stored
for the backward pass: BERT's backward recomputes the row sum from the tables
(three row reads per token, cheaper than writing and re-reading an
``(N, L, D)`` cache) and both blocks regenerate the dropout mask from
``(seed, counter, index)``. Masks are those of :func:`numbapos.functional.dropout`
applied to the block's output, element for element.

Gradients are deterministic: the LayerNorm parameter gradients are summed in
fixed token chunks, the tables by the row-bucketed embedding backward.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import _checks
from ..kernels.cpu import blocks as kernels
from ..kernels.cpu.dropout import keep_threshold
from .dropout import dropout_backward
from .embedding import embedding_backward
from .normalization import check_eps, chunk_rows

# Below this many output elements a parallel launch costs more than it saves.
PARALLEL_MIN_ELEMENTS = 1 << 15

# Token-type tables up to this many rows get their gradient summed inside the
# fused backward kernel (per-chunk partial tables); larger ones are scattered
# like the other tables.
FUSED_TYPE_GRAD_MAX_ROWS = 16


class BertEmbeddingsGrads(NamedTuple):
    """Gradients of :func:`bert_embeddings_forward`; None where not requested."""

    word_embeddings: object
    position_embeddings: object
    token_type_embeddings: object
    ln_weight: np.ndarray | None
    ln_bias: np.ndarray | None


class GPT2EmbeddingsGrads(NamedTuple):
    """Gradients of :func:`gpt2_embeddings`; None where not requested."""

    wte: object
    wpe: object


class TableOptions(NamedTuple):
    """How a table's gradient is scattered (the settings of its ``nn.Embedding``)."""

    padding_idx: int | None = None
    scale_grad_by_freq: bool = False
    sparse: bool = False


PLAIN = TableOptions()


# ------------------------------------------------------------------ validation


def check_ids(input_ids, size: int, name: str = "input_ids", size_name: str = "vocab_size"):
    """``input_ids`` of shape (N, L) or (L,), each in ``[0, size)``: (ids, flat int64 copy-free)."""
    ids = _checks.check_index_array(input_ids, name)
    if ids.ndim not in (1, 2):
        raise ValueError(f"{name}: expected shape (N, L) or (L,), got {ids.shape}")
    flat = np.ascontiguousarray(ids).reshape(-1).astype(np.int64, copy=False)
    _checks.check_index_range(flat, size, name, size_name)
    return ids, flat


def _broadcast_ids(values, name, shape):
    """An id array of ``shape``, or of shape (L,) / (1, L) broadcast over the batch."""
    arr = _checks.check_index_array(values, name)
    length = shape[-1]
    allowed = {tuple(shape), (length,)} | ({(1, length)} if len(shape) == 2 else set())
    if arr.shape not in allowed:
        want = " or ".join(str(s) for s in sorted(allowed, key=len, reverse=True))
        raise ValueError(f"{name}: expected shape {want} (matching input_ids), got {arr.shape}")
    full = np.broadcast_to(arr, shape)
    return np.ascontiguousarray(full).reshape(-1).astype(np.int64, copy=False)


def default_positions(shape, past_length, max_positions, size_name):
    """Flat positions ``past_length .. past_length + L - 1`` repeated over the batch."""
    length = shape[-1]
    if past_length + length > max_positions:
        raise ValueError(
            f"past_length + L = {past_length} + {length} = {past_length + length} exceeds "
            f"{size_name}={max_positions}: positions must stay below {max_positions}"
        )
    batch = shape[0] if len(shape) == 2 else 1
    return np.tile(np.arange(past_length, past_length + length, dtype=np.int64), batch)


def explicit_positions(position_ids, shape, max_positions, size_name):
    """Flat ``position_ids`` (shape of the ids, or (L,) / (1, L)), each in range."""
    flat = _broadcast_ids(position_ids, "position_ids", shape)
    _checks.check_index_range(flat, max_positions, "position_ids", size_name)
    return flat


def positions_from_attention_mask(attention_mask, length=None, pad_position=1):
    """Position ids from an attention mask, Hugging Face's generation convention.

    What ``transformers`` 4.x's ``prepare_inputs_for_generation`` does for
    GPT-2 and other decoders::

        position_ids = attention_mask.cumsum(-1) - 1
        position_ids.masked_fill_(attention_mask == 0, 1)
        position_ids = position_ids[:, -L:]       # when a cache holds past tokens

    so real tokens are numbered 0, 1, 2, ... from the first real token of each
    row (left padding is skipped; a left-padded and a right-padded batch give
    the same positions to the same tokens) and padding gets position 1.
    ``transformers`` 5.x fills padding with 0 instead (``pad_position=0``);
    the positions of real tokens are the same, and padding is masked out of
    attention anyway. Unlike :func:`positions_from_padding`, which reads
    padding from the token ids and numbers from ``past_length``, the mask
    here covers the past tokens too.

    Parameters
    ----------
    attention_mask : array_like of bool or int, shape (N, S) or (S,)
        1 (True) at real tokens, 0 at padding, over the past and the current
        tokens (``S = past_length + L``).
    length : int, optional
        Number L of current tokens: the result keeps the last L columns.
        Default: all S.
    pad_position : int, default 1
        Position given to padding (``masked_fill`` value).

    Returns
    -------
    ndarray of int64, shape (N, L) or (L,)

    Raises
    ------
    TypeError
        A mask that is not bool or integer; a non-integer ``length`` or
        ``pad_position``.
    ValueError
        A mask that is not 1-D/2-D, holds values other than 0 and 1, or is
        shorter than ``length``; a negative ``length``, or a ``pad_position``
        outside ``[0, 2**63)``.
    """
    mask = _checks.check_attention_mask(attention_mask)
    total = mask.shape[-1]
    if length is None:
        length = total
    length = _checks.check_int(length, "length", minimum=0)
    pad_position = _checks.check_int64(pad_position, "pad_position", minimum=0)
    if length > total:
        raise ValueError(
            f"attention_mask: has {total} columns, fewer than the {length} current tokens"
        )
    mask = mask.astype(np.int64)
    positions = np.cumsum(mask, axis=-1) - 1
    positions[mask == 0] = pad_position
    return np.ascontiguousarray(positions[..., total - length:])


def _mask_positions(attention_mask, shape, past_length, max_positions, size_name):
    mask = _checks.check_attention_mask(attention_mask)
    length = shape[-1]
    expected = shape[:-1] + (past_length + length,)
    if mask.shape != expected:
        raise ValueError(
            f"attention_mask: expected shape {expected} (input_ids.shape with past_length + L "
            f"= {past_length} + {length} columns), got {mask.shape}"
        )
    positions = positions_from_attention_mask(mask, length).reshape(-1)
    if positions.size and positions.max() >= max_positions:
        raise ValueError(
            f"attention_mask: gives position {int(positions.max())}, but {size_name}="
            f"{max_positions}: positions must stay below {max_positions}"
        )
    return positions


def check_dropout(p, seed, training, counter):
    """``(active, p, seed, counter)``; dropout is active when training with p > 0."""
    p = _checks.check_unit_interval(p, "p")
    seed = _checks.check_uint64(seed, "seed")
    counter = _checks.check_uint64(counter, "counter")
    return bool(training) and p > 0.0, p, seed, counter


def _dropout_args(drop):
    active, p, seed, counter = drop
    if not active:
        return np.uint64(0), np.uint64(0), np.uint64(0), 1.0, False
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    return np.uint64(seed), np.uint64(counter), np.uint64(keep_threshold(p)), scale, True


def _table(weight, name):
    weight = _checks.check_weight(weight, name)
    return np.ascontiguousarray(weight)


def _check_tables(tables, names):
    """Same dtype and same D for every table; returns the contiguous tables."""
    tables = [_table(t, n) for t, n in zip(tables, names, strict=True)]
    first = tables[0]
    for table, name in zip(tables[1:], names[1:], strict=True):
        if table.dtype != first.dtype:
            raise TypeError(f"{name}: expected dtype {first.dtype} (that of {names[0]}), "
                            f"got {table.dtype}")
        if table.shape[1] != first.shape[1]:
            raise ValueError(f"{name}: expected {first.shape[1]} columns (the hidden size of "
                             f"{names[0]}), got shape {table.shape}")
    return tables


def _check_ln_param(param, name, dim, dtype):
    if param is None:
        return None
    _checks.check_float_array(param, name, ndim=1)
    param = _checks.check_float_like(param, name, (dim,), dtype, "the hidden size",
                                     "that of the tables")
    return np.ascontiguousarray(param)


class BertInputs(NamedTuple):
    """Validated, flattened inputs of the BERT block (all int64, length T)."""

    shape: tuple
    word_ids: np.ndarray
    pos_ids: np.ndarray
    type_ids: np.ndarray


def bert_inputs(input_ids, token_type_ids, position_ids, past_length, vocab_size,
                max_position_embeddings, type_vocab_size) -> BertInputs:
    """Validate the index inputs of the BERT block (see :func:`bert_embeddings_forward`)."""
    past_length = _checks.check_int(past_length, "past_length", minimum=0)
    ids, word_ids = check_ids(input_ids, vocab_size)
    shape = ids.shape
    if token_type_ids is None:
        if type_vocab_size == 0 and word_ids.size:
            raise IndexError(
                "token_type_ids: the default token type 0 is out of range for "
                "type_vocab_size=0; the token-type table needs at least one row"
            )
        type_ids = np.zeros(word_ids.size, dtype=np.int64)
    else:
        type_ids = _broadcast_ids(token_type_ids, "token_type_ids", shape)
        _checks.check_index_range(type_ids, type_vocab_size, "token_type_ids",
                                  "type_vocab_size")
    if position_ids is None:
        pos_ids = default_positions(shape, past_length, max_position_embeddings,
                                    "max_position_embeddings")
    else:
        pos_ids = explicit_positions(position_ids, shape, max_position_embeddings,
                                     "max_position_embeddings")
    return BertInputs(shape, word_ids, pos_ids, type_ids)


def gpt2_inputs(input_ids, past_length, position_ids, attention_mask, vocab_size, n_positions):
    """Validate the index inputs of the GPT-2 block: (shape, flat ids, flat positions)."""
    past_length = _checks.check_int(past_length, "past_length", minimum=0)
    ids, flat = check_ids(input_ids, vocab_size)
    shape = ids.shape
    if position_ids is not None:
        pos = explicit_positions(position_ids, shape, n_positions, "n_positions")
    elif attention_mask is not None:
        pos = _mask_positions(attention_mask, shape, past_length, n_positions, "n_positions")
    else:
        pos = default_positions(shape, past_length, n_positions, "n_positions")
    return shape, flat, pos


# ------------------------------------------------------------------ BERT


def bert_forward(inputs: BertInputs, word, position, token_type, ln_weight, ln_bias, eps, drop,
                 out=None):
    """Run the fused BERT kernel on validated inputs; returns (y, mean, rstd)."""
    dim = word.shape[1]
    dtype = word.dtype
    shape = inputs.shape + (dim,)
    y = np.empty(shape, dtype=dtype) if out is None else out
    mean = np.empty(inputs.shape, dtype=dtype)
    rstd = np.empty(inputs.shape, dtype=dtype)
    num_tokens = inputs.word_ids.size
    if num_tokens == 0:
        return y, mean, rstd
    gamma = np.ones(dim, dtype) if ln_weight is None else ln_weight
    beta = np.zeros(dim, dtype) if ln_bias is None else ln_bias
    seed, counter, threshold, scale, use_dropout = _dropout_args(drop)
    kernel = (kernels.bert_forward_parallel if num_tokens * dim >= PARALLEL_MIN_ELEMENTS
              else kernels.bert_forward)
    kernel(inputs.word_ids, inputs.pos_ids, inputs.type_ids, word, position, token_type, gamma,
           beta, eps, seed, counter, threshold, scale, use_dropout, y.reshape(num_tokens, dim),
           mean.reshape(-1), rstd.reshape(-1))
    return y, mean, rstd


def bert_backward(grad_output, inputs: BertInputs, word, position, token_type, ln_weight, mean,
                  rstd, drop, want=(True, True, True, True, True),
                  options=(PLAIN, PLAIN, PLAIN)) -> BertEmbeddingsGrads:
    """Backward of :func:`bert_forward` on validated inputs.

    ``want`` flags (word, position, token_type, ln_weight, ln_bias) pick the
    gradients to compute; ``options`` are the scatter settings of the three
    tables.
    """
    want_word, want_pos, want_type, want_w, want_b = (bool(f) for f in want)
    dim = word.shape[1]
    dtype = word.dtype
    num_tokens = inputs.word_ids.size
    type_opts = options[2]
    fuse_type = (want_type and token_type.shape[0] <= FUSED_TYPE_GRAD_MAX_ROWS
                 and type_opts == PLAIN)
    chunk = chunk_rows(num_tokens)
    n_chunks = max(1, -(-num_tokens // chunk))
    part_w = np.zeros((n_chunks, dim if want_w else 0), dtype=dtype)
    part_b = np.zeros((n_chunks, dim if want_b else 0), dtype=dtype)
    part_t = (np.zeros((n_chunks,) + token_type.shape, dtype=dtype) if fuse_type
              else np.zeros((1, 0, 0), dtype=dtype))
    grad_sum = np.empty((num_tokens, dim), dtype=dtype)
    if num_tokens:
        gamma = np.ones(dim, dtype) if ln_weight is None else ln_weight
        seed, counter, threshold, scale, use_dropout = _dropout_args(drop)
        kernel = (kernels.bert_backward_parallel if num_tokens * dim >= PARALLEL_MIN_ELEMENTS
                  else kernels.bert_backward)
        kernel(np.ascontiguousarray(grad_output).reshape(num_tokens, dim), inputs.word_ids,
               inputs.pos_ids, inputs.type_ids, word, position, token_type, gamma,
               np.ascontiguousarray(mean).reshape(-1), np.ascontiguousarray(rstd).reshape(-1),
               seed, counter, threshold, scale, use_dropout, want_w, want_b, fuse_type, chunk,
               grad_sum, part_w, part_b, part_t)

    def scatter(flat, table, opts):
        return embedding_backward(grad_sum, flat, table.shape[0], padding_idx=opts.padding_idx,
                                  scale_grad_by_freq=opts.scale_grad_by_freq, sparse=opts.sparse)

    grad_word = scatter(inputs.word_ids, word, options[0]) if want_word else None
    grad_pos = scatter(inputs.pos_ids, position, options[1]) if want_pos else None
    if fuse_type:
        grad_type = np.empty(token_type.shape, dtype=dtype)
        kernels.sum_partial_tables(part_t, grad_type)
    else:
        grad_type = scatter(inputs.type_ids, token_type, type_opts) if want_type else None
    grad_w = _sum_chunks(part_w) if want_w else None
    grad_b = _sum_chunks(part_b) if want_b else None
    return BertEmbeddingsGrads(grad_word, grad_pos, grad_type, grad_w, grad_b)


def _sum_chunks(part):
    out = np.empty(part.shape[1], dtype=part.dtype)
    kernels.sum_partial_tables(part.reshape(part.shape[0], 1, part.shape[1]),
                               out.reshape(1, -1))
    return out


def _bert_tables(word_embeddings, position_embeddings, token_type_embeddings, ln_weight,
                 ln_bias):
    word, position, token_type = _check_tables(
        (word_embeddings, position_embeddings, token_type_embeddings),
        ("word_embeddings", "position_embeddings", "token_type_embeddings"))
    dim = word.shape[1]
    if dim == 0:
        raise ValueError(f"word_embeddings: expected a hidden size >= 1 (LayerNorm normalises "
                         f"over it), got shape {word.shape}")
    ln_weight = _check_ln_param(ln_weight, "ln_weight", dim, word.dtype)
    ln_bias = _check_ln_param(ln_bias, "ln_bias", dim, word.dtype)
    return word, position, token_type, ln_weight, ln_bias


def bert_embeddings_forward(input_ids, word_embeddings, position_embeddings,
                            token_type_embeddings, ln_weight=None, ln_bias=None, *,
                            token_type_ids=None, position_ids=None, past_length=0, eps=1e-12,
                            p=0.0, seed=0, training=True, counter=0, out=None):
    """BERT's embedding block, fused; also returns the LayerNorm statistics.

    ``Dropout(LayerNorm(word[input_ids] + position[position_ids] +
    token_type[token_type_ids]))``, as Hugging Face's ``BertEmbeddings``, in one
    pass over the tokens: each token's three rows are gathered, summed and
    normalised in cache, and written once.

    Parameters
    ----------
    input_ids : array_like of int, shape (N, L) or (L,)
        Token ids in ``[0, V)``.
    word_embeddings : ndarray, shape (V, D), float32 or float64
    position_embeddings : ndarray, shape (P, D), same dtype
    token_type_embeddings : ndarray, shape (T, D), same dtype
    ln_weight, ln_bias : ndarray, shape (D,), optional
        LayerNorm scale and shift (None: ones / zeros).
    token_type_ids : array_like of int, optional
        Shape of ``input_ids`` (or (L,) / (1, L), broadcast over the batch),
        each in ``[0, T)``. Default: all 0.
    position_ids : array_like of int, optional
        Shape of ``input_ids`` (or (L,) / (1, L)), each in ``[0, P)``.
        Default: ``past_length, ..., past_length + L - 1`` for every row.
    past_length : int, default 0
        Number of tokens before these (a key/value cache); only shifts the
        default positions.
    eps : float, default 1e-12
        LayerNorm epsilon (BERT's ``layer_norm_eps``).
    p : float, default 0.0
        Dropout probability in ``[0, 1]``.
    seed, counter : int, default 0
        Dropout mask selectors, as in :func:`numbapos.functional.dropout`; the
        mask equals ``dropout(y_before_dropout, p, seed, counter=counter)``'s.
    training : bool, default True
        False disables dropout.
    out : ndarray, optional
        C-contiguous buffer of shape ``input_ids.shape + (D,)`` for ``y``.

    Returns
    -------
    y : ndarray, shape ``input_ids.shape + (D,)``
    mean, rstd : ndarray, shape ``input_ids.shape``
        Per-token LayerNorm statistics of the row sum, for the backward pass.

    Raises
    ------
    TypeError
        Non-integer ids; tables or LayerNorm parameters not float, or of
        different dtypes.
    ValueError
        Ids not 1-D or 2-D; ``token_type_ids`` / ``position_ids`` of another
        shape; tables of different widths; ``past_length + L`` above P;
        ``past_length`` negative; bad ``eps``, ``p``, ``seed``, ``counter`` or
        ``out``.
    IndexError
        An id, token type or position outside its table, named with the valid
        range. Nothing runs and nothing is modified when any error is raised.
    """
    word, position, token_type, ln_weight, ln_bias = _bert_tables(
        word_embeddings, position_embeddings, token_type_embeddings, ln_weight, ln_bias)
    eps = check_eps(eps)
    drop = check_dropout(p, seed, training, counter)
    inputs = bert_inputs(input_ids, token_type_ids, position_ids, past_length, word.shape[0],
                         position.shape[0], token_type.shape[0])
    if out is not None:
        _checks.check_out(out, inputs.shape + (word.shape[1],), word.dtype,
                          avoid=(word, position, token_type, ln_weight, ln_bias,
                                 inputs.word_ids, inputs.pos_ids, inputs.type_ids))
    return bert_forward(inputs, word, position, token_type, ln_weight, ln_bias, eps, drop, out)


def bert_embeddings(input_ids, word_embeddings, position_embeddings, token_type_embeddings,
                    ln_weight=None, ln_bias=None, **kwargs):
    """BERT's embedding block; :func:`bert_embeddings_forward` without the statistics.

    Takes the same arguments (keywords after ``ln_bias``) and raises the same
    errors.

    Returns
    -------
    ndarray, shape ``input_ids.shape + (D,)``
    """
    return bert_embeddings_forward(input_ids, word_embeddings, position_embeddings,
                                   token_type_embeddings, ln_weight, ln_bias, **kwargs)[0]


def bert_embeddings_backward(grad_output, input_ids, word_embeddings, position_embeddings,
                             token_type_embeddings, mean, rstd, ln_weight=None, ln_bias=None, *,
                             token_type_ids=None, position_ids=None, past_length=0, p=0.0,
                             seed=0, training=True, counter=0, padding_idx=None, sparse=False):
    """Gradients of :func:`bert_embeddings_forward` wrt the three tables and the LayerNorm.

    Pass the arguments of the forward call (the tables unchanged since) and
    the ``mean`` / ``rstd`` it returned. The row sums are recomputed from the
    tables and the dropout mask from ``(seed, counter)``.

    Parameters
    ----------
    grad_output : ndarray, shape ``input_ids.shape + (D,)``
        Gradient wrt the block's output, in the tables' dtype.
    input_ids, word_embeddings, position_embeddings, token_type_embeddings
        As for the forward call.
    mean, rstd : ndarray, shape ``input_ids.shape``
        As returned by :func:`bert_embeddings_forward`.
    ln_weight, ln_bias : ndarray, optional
        As for the forward call; ``ln_weight``'s gradient is computed when it
        is given, ``ln_bias``'s when either is given.
    token_type_ids, position_ids, past_length, p, seed, training, counter
        As for the forward call.
    padding_idx : int, optional
        Word id that receives no gradient (BERT's ``pad_token_id``).
    sparse : bool, default False
        Return the word table gradient as :class:`~numbapos.sparse.SparseRows`.

    Returns
    -------
    BertEmbeddingsGrads
        ``(word_embeddings, position_embeddings, token_type_embeddings,
        ln_weight, ln_bias)``; the position gradient is summed over the batch.

    Raises
    ------
    TypeError, ValueError, IndexError
        As for the forward call; also ``grad_output`` / ``mean`` / ``rstd`` of
        the wrong shape or dtype and a ``padding_idx`` outside the vocabulary.
    """
    word, position, token_type, ln_weight, ln_bias = _bert_tables(
        word_embeddings, position_embeddings, token_type_embeddings, ln_weight, ln_bias)
    drop = check_dropout(p, seed, training, counter)
    inputs = bert_inputs(input_ids, token_type_ids, position_ids, past_length, word.shape[0],
                         position.shape[0], token_type.shape[0])
    padding_idx = _checks.check_padding_idx(padding_idx, word.shape[0])
    check_grad(grad_output, inputs.shape + (word.shape[1],), word.dtype)
    mean = check_grad(mean, inputs.shape, word.dtype, "mean")
    rstd = check_grad(rstd, inputs.shape, word.dtype, "rstd")
    want = (True, True, True, ln_weight is not None, ln_weight is not None or ln_bias is not None)
    options = (TableOptions(padding_idx, False, bool(sparse)), PLAIN, PLAIN)
    return bert_backward(grad_output, inputs, word, position, token_type, ln_weight, mean, rstd,
                         drop, want, options)


def check_grad(grad_output, shape, dtype, name="grad_output"):
    """A float array (gradient or statistic) of exactly ``shape`` and ``dtype``."""
    what = "input_ids.shape + (hidden size,)" if name == "grad_output" else "input_ids.shape"
    return _checks.check_float_like(grad_output, name, shape, dtype, what, "that of the tables")


# ------------------------------------------------------------------ GPT-2


def gpt2_forward(shape, ids, pos, wte, wpe, drop, out=None):
    """Run the fused GPT-2 kernel on validated inputs."""
    dim = wte.shape[1]
    y = np.empty(shape + (dim,), dtype=wte.dtype) if out is None else out
    if ids.size == 0:
        return y
    seed, counter, threshold, scale, use_dropout = _dropout_args(drop)
    kernel = (kernels.gpt2_forward_parallel if ids.size * dim >= PARALLEL_MIN_ELEMENTS
              else kernels.gpt2_forward)
    kernel(ids, pos, wte, wpe, seed, counter, threshold, scale, use_dropout,
           y.reshape(ids.size, dim))
    return y


def gpt2_backward(grad_output, ids, pos, vocab_size, n_positions, drop,
                  want=(True, True), options=(PLAIN, PLAIN)):
    """Backward of :func:`gpt2_forward` on validated inputs."""
    active, p, seed, counter = drop
    grad = grad_output.reshape(ids.size, grad_output.shape[-1])
    if active:
        grad = dropout_backward(np.ascontiguousarray(grad), p, seed, counter=counter)

    def scatter(flat, rows, opts):
        return embedding_backward(grad, flat, rows, padding_idx=opts.padding_idx,
                                  scale_grad_by_freq=opts.scale_grad_by_freq, sparse=opts.sparse)

    return GPT2EmbeddingsGrads(
        scatter(ids, vocab_size, options[0]) if want[0] else None,
        scatter(pos, n_positions, options[1]) if want[1] else None,
    )


def gpt2_embeddings(input_ids, wte, wpe, *, past_length=0, position_ids=None,
                    attention_mask=None, p=0.0, seed=0, training=True, counter=0, out=None):
    """GPT-2's embedding block, fused: ``Dropout(wte[input_ids] + wpe[positions])``.

    Parameters
    ----------
    input_ids : array_like of int, shape (N, L) or (L,)
        Token ids in ``[0, V)``.
    wte : ndarray, shape (V, D), float32 or float64
        Token embeddings.
    wpe : ndarray, shape (P, D), same dtype
        Position embeddings.
    past_length : int, default 0
        Number of tokens already in the key/value cache.
    position_ids : array_like of int, optional
        Shape of ``input_ids`` (or (L,) / (1, L)), each in ``[0, P)``. Takes
        precedence over ``attention_mask``.
    attention_mask : array_like of bool or int, optional
        Shape ``(N, past_length + L)`` (``(past_length + L,)`` for 1-D ids), 1 at
        real tokens and 0 at padding. Positions then follow it as in Hugging
        Face's generation (see :func:`positions_from_attention_mask`), so
        left-padded rows number their real tokens from 0.
    p, seed, training, counter
        Dropout, as in :func:`numbapos.functional.dropout` on the sum.
    out : ndarray, optional
        C-contiguous buffer of shape ``input_ids.shape + (D,)``.

    Returns
    -------
    ndarray, shape ``input_ids.shape + (D,)``
        Default positions are ``past_length .. past_length + L - 1``.

    Raises
    ------
    TypeError
        Non-integer ids, a non-bool/integer mask, tables not float or of
        different dtypes.
    ValueError
        Ids not 1-D or 2-D; ``position_ids`` / ``attention_mask`` of the wrong
        shape or a mask with values other than 0/1; positions reaching P
        (``past_length + L > P``); tables of different widths; bad dropout
        arguments or ``out``.
    IndexError
        An id or explicit position outside its table, named with the range.
    """
    wte, wpe = _check_tables((wte, wpe), ("wte", "wpe"))
    drop = check_dropout(p, seed, training, counter)
    shape, ids, pos = gpt2_inputs(input_ids, past_length, position_ids, attention_mask,
                                  wte.shape[0], wpe.shape[0])
    if out is not None:
        _checks.check_out(out, shape + (wte.shape[1],), wte.dtype, avoid=(wte, wpe, ids, pos))
    return gpt2_forward(shape, ids, pos, wte, wpe, drop, out)


def gpt2_embeddings_backward(grad_output, input_ids, vocab_size, n_positions, *, past_length=0,
                             position_ids=None, attention_mask=None, p=0.0, seed=0,
                             training=True, counter=0, sparse=False):
    """Gradients of :func:`gpt2_embeddings` wrt ``wte`` and ``wpe``.

    Parameters
    ----------
    grad_output : ndarray, shape ``input_ids.shape + (D,)``, float32 or float64
    input_ids : array_like of int
        As for the forward call.
    vocab_size, n_positions : int
        Rows of ``wte`` and ``wpe``.
    past_length, position_ids, attention_mask, p, seed, training, counter
        As for the forward call (the mask is regenerated from them).
    sparse : bool, default False
        Return the ``wte`` gradient as :class:`~numbapos.sparse.SparseRows`.

    Returns
    -------
    GPT2EmbeddingsGrads
        ``(wte, wpe)``; the position gradient is summed over the batch.

    Raises
    ------
    TypeError, ValueError, IndexError
        As for the forward call, and for a ``grad_output`` of the wrong shape.
    """
    vocab_size = _checks.check_int(vocab_size, "vocab_size", minimum=1)
    n_positions = _checks.check_int(n_positions, "n_positions", minimum=1)
    drop = check_dropout(p, seed, training, counter)
    shape, ids, pos = gpt2_inputs(input_ids, past_length, position_ids, attention_mask,
                                  vocab_size, n_positions)
    grad_output = _checks.check_float_array(grad_output, "grad_output")
    if grad_output.shape[:-1] != shape or grad_output.ndim != len(shape) + 1:
        raise ValueError(f"grad_output: expected shape input_ids.shape + (D,) = "
                         f"{shape + ('D',)}, got {grad_output.shape}")
    options = (TableOptions(sparse=bool(sparse)), PLAIN)
    return gpt2_backward(grad_output, ids, pos, vocab_size, n_positions, drop, options=options)
