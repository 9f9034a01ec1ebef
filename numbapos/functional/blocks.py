"""The BERT and GPT-2 embedding blocks as fused ops, forward and backward.

BERT: ``Dropout(LayerNorm(word[ids] + position[pos] + token_type[types]))``;
GPT-2: ``Dropout(wte[ids] + wpe[pos])``. One kernel per block gathers
the rows, sums them, normalises (BERT) and applies dropout, token by token, so
the output is written once and nothing else of size ``(N, L, D)`` is stored
for the backward pass: BERT's backward recomputes the row sum from the tables
(three row reads per token, cheaper than writing and re-reading an
``(N, L, D)`` cache) and both blocks regenerate the dropout mask from
``(seed, counter, index)``. Masks are those of :func:`numbapos.functional.dropout`
applied to the block's output, element for element.

Gradients are deterministic: the LayerNorm parameter gradients are summed in
fixed token chunks, the tables by the row-bucketed embedding backward.

The tables may be float32 / float64, or bfloat16 / float16 (all three / both
of one dtype): the kernels then read the rows as their ``uint16`` bits and
widen them exactly to float32 (:mod:`numbapos.functional.half`), and
everything else is float32, as for a float32 block run on the widened tables,
bit for bit: the LayerNorm parameters, the output, the statistics, the
gradients (dense or :class:`~numbapos.sparse.SparseRows`, summed in float32).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from .. import _checks, _device
from .._args import BertIds, BertTables, DropoutArgs, RowGroups, TableFormat, TiledIds
from ..sparse import SparseRows
from . import _common
from ._common import Planned, backend_for, check_range, flatten, on_backend
from .embedding import _check_clippable, _scatter
from .half import half_format

_UINT16 = np.dtype(np.uint16)

# Token-type tables up to this many rows get their gradient summed inside the
# fused backward kernel (per-chunk partial tables); larger ones are scattered
# like the other tables.
FUSED_TYPE_GRAD_MAX_ROWS = 16


class BertEmbeddingsGrads(NamedTuple):
    """Gradients of :func:`bert_embeddings_forward`; None where not requested."""

    word_embeddings: object
    position_embeddings: object
    token_type_embeddings: object
    ln_weight: object
    ln_bias: object


class GPT2EmbeddingsGrads(NamedTuple):
    """Gradients of :func:`gpt2_embeddings`; None where not requested."""

    wte: object
    wpe: object


class TableOptions(NamedTuple):
    """The settings of one table of a block (those of its ``nn.Embedding``).

    ``max_norm`` / ``norm_type`` clip looked-up rows in the forward pass;
    ``padding_idx``, ``scale_grad_by_freq`` and ``sparse`` shape its gradient.
    """

    padding_idx: int | None = None
    scale_grad_by_freq: bool = False
    sparse: bool = False
    max_norm: float | None = None
    norm_type: float = 2.0


PLAIN = TableOptions()


# ------------------------------------------------------------------ validation


def _check_options(options, row_counts, names):
    """One checked TableOptions per table (padding_idx wrapped by its row count)."""
    if options is None:
        return (PLAIN,) * len(row_counts)
    if not isinstance(options, (tuple, list)) or len(options) != len(row_counts):
        raise TypeError(f"table_options: expected a tuple of {len(row_counts)} TableOptions "
                        f"({', '.join(names)}), got {_checks.quote(options)}")
    checked = []
    for opts, rows, name in zip(options, row_counts, names, strict=True):
        if not isinstance(opts, TableOptions):
            raise TypeError(f"table_options: expected TableOptions for {name}, got "
                            f"{type(opts).__name__}")
        padding_idx = _checks.check_padding_idx(opts.padding_idx, rows,
                                                 f"table_options ({name}): padding_idx")
        max_norm, norm_type = _checks.check_max_norm(opts.max_norm, opts.norm_type)
        checked.append(TableOptions(padding_idx, bool(opts.scale_grad_by_freq),
                                    bool(opts.sparse), max_norm, norm_type))
    return tuple(checked)


def _check_mask(output_mask, count, names):
    if output_mask is None:
        return (True,) * count
    if not isinstance(output_mask, (tuple, list)) or len(output_mask) != count:
        raise TypeError(f"output_mask: expected a tuple of {count} bools ({', '.join(names)}), "
                        f"got {_checks.quote(output_mask)}")
    return tuple(bool(flag) for flag in output_mask)


def _check_tables(tables, names):
    """Same dtype and same D for every table (float or 16-bit, 2-D, one device)."""
    tables = [_checks.check_table(t, n) for t, n in zip(tables, names, strict=True)]
    first = tables[0]
    for table, name in zip(tables[1:], names[1:], strict=True):
        if table.dtype != first.dtype:
            raise TypeError(f"{name}: expected dtype {first.dtype} (that of {names[0]}), "
                            f"got {table.dtype}")
        if table.shape[1] != first.shape[1]:
            raise ValueError(f"{name}: expected {first.shape[1]} columns (the hidden size of "
                             f"{names[0]}), got shape {tuple(table.shape)}")
    return tables


def _bert_tables(word, position, token_type, ln_weight, ln_bias):
    names = ("word_embeddings", "position_embeddings", "token_type_embeddings")
    word, position, token_type = _check_tables((word, position, token_type), names)
    dim = word.shape[1]
    if dim == 0:
        raise ValueError(f"word_embeddings: expected a hidden size >= 1 (LayerNorm normalises "
                         f"over it), got shape {tuple(word.shape)}")
    dtype, what = _compute_dtype(word.dtype)
    ln_weight = _checks.check_vector_param(ln_weight, "ln_weight", dim, dtype,
                                           "the hidden size", what)
    ln_bias = _checks.check_vector_param(ln_bias, "ln_bias", dim, dtype,
                                         "the hidden size", what)
    return BertTables(word, position, token_type, ln_weight, ln_bias)


def _compute_dtype(table_dtype):
    """The dtype of the arithmetic, the output and the gradients for tables of
    ``table_dtype`` (float32 for 16-bit tables), and its description for messages."""
    if _checks.is_half_dtype(table_dtype):
        return np.dtype(np.float32), f"float32, the arithmetic of {table_dtype} tables"
    return table_dtype, "that of the tables"


def _kernel_tables(K, tables):
    """The block's arrays as the kernels take them, C-contiguous, and the tables' format
    code: 16-bit tables (the 2-D arrays) as their ``uint16`` bits; the LayerNorm
    vectors of a BERT block (float32 beside them) as they are."""
    fmt = (half_format(tables[0].dtype) if _checks.is_half_dtype(tables[0].dtype)
           else TableFormat.FLOAT)
    kernel = []
    for table in tables:
        if table is not None:
            table = K.contiguous(table)
            if fmt != TableFormat.FLOAT and table.ndim == 2:
                table = table.view(_UINT16)
        kernel.append(table)
    return kernel, fmt


def _counter_for_plan(counter, training, p):
    """``(device counter or None, the counter as a plan option)`` of a block's GPU call, or
    None where it cannot be planned. A device counter is one of the op's arrays (for a
    counter the op draws from, :func:`_draws`, the one it advances); an integer one with
    active dropout changes at every step."""
    if hasattr(counter, "draw_into"):  # _draws(counter), without its call
        return counter.values, "drawn by the op"
    if isinstance(counter, (int, np.integer)):
        return None if training and p else (None, counter)
    return counter, None


def _draws(counter) -> bool:
    """Whether ``counter`` is a dropout module's device counter
    (``numbapos.kernels.cuda.clock.DeviceCounter``, ``nn.Dropout._draw(defer=True)``), which
    the op draws from itself: the draw's one-thread launch is the op's (planned with it)
    and its ``(1,)`` result lies in the op's block of outputs."""
    return hasattr(counter, "draw_into")


def _check_dropout(K, p, seed, training, counter) -> DropoutArgs:
    p, seed, counter = _checks.check_dropout_args(p, seed, counter)
    _checks.check_counter_device(counter, K.DEVICE)
    return DropoutArgs.make(p, seed, counter, active=bool(training))


def _flat_ids(K, input_ids, size, name="input_ids", size_name="vocab_size", inline=False):
    """``input_ids`` of shape (N, L) or (L,), each in ``[0, size)``: (shape, flat int64).

    With ``inline`` a GPU kernel of the op checks them as it reads them (no
    separate check launch); the CPU always checks here.
    """
    ids = on_backend(K, input_ids, name)
    if ids.ndim not in (1, 2):
        raise ValueError(f"{name}: expected shape (N, L) or (L,), got {tuple(ids.shape)}")
    flat = _as_ids(K, flatten(K, ids), inline)
    check_range(K, flat, size, name, size_name, checked_by_kernel=inline)
    return tuple(ids.shape), flat


def _as_ids(K, flat, inline):
    """Flat int64 ids; on the GPU, ids that only the forward kernel reads keep int32 (the
    kernel widens them: no cast launch)."""
    return flat if inline and K.DEVICE != "cpu" else K.contiguous(flat, np.int64)


def _check_ids(K, ids, size, name, size_name, inline=False):
    """Range-check flat ids or a :class:`TiledIds` (only its values can be wrong: tiled
    values are the first ``length`` ids, so the first bad position is the CPU's)."""
    if isinstance(ids, TiledIds):
        if ids.values is not None:
            check_range(K, ids.values, size, name, size_name, checked_by_kernel=inline)
        return
    check_range(K, ids, size, name, size_name, checked_by_kernel=inline)


def _full(K, ids, num_tokens):
    """Flat ``(T,)`` int64 ids from flat ids (returned as they are) or a :class:`TiledIds`
    (expanded on the ids' device: one launch on the GPU, no copy)."""
    if not isinstance(ids, TiledIds):
        return ids
    out = K.empty((num_tokens,), np.int64)
    K.tile_ids(ids.values, ids.start, ids.length, out)
    return out


def _ids_array(ids):
    """The array behind flat ids or a :class:`TiledIds` (None for computed ids)."""
    return ids.values if isinstance(ids, TiledIds) else ids


def _broadcast_ids(K, values, name, shape, inline=False):
    """Flat int64 ids of ``shape``, from ``shape`` or (L,) / (1, L) broadcast over the batch.

    On the GPU broadcast ids stay ``(L,)``, as a :class:`TiledIds` that the
    kernels expand (no host round trip)."""
    arr = on_backend(K, values, name)
    length = shape[-1]
    allowed = [tuple(shape)] + ([(1, length)] if len(shape) == 2 else []) + [(length,)]
    if tuple(arr.shape) not in allowed:
        want = " or ".join(str(s) for s in dict.fromkeys(allowed))
        raise ValueError(f"{name}: expected shape {want} (matching input_ids), got "
                         f"{tuple(arr.shape)}")
    if tuple(arr.shape) == tuple(shape):
        return _as_ids(K, flatten(K, arr), inline)
    if K.DEVICE != "cpu":
        return TiledIds(_as_ids(K, flatten(K, arr), inline), 0, length)
    full = np.broadcast_to(K.to_host(arr).reshape(length), shape)  # host ids: no copy
    return K.asarray(np.ascontiguousarray(full, dtype=np.int64).reshape(-1))


def _default_positions(K, shape, past_length, max_positions, size_name):
    """Flat positions ``past_length .. past_length + L - 1`` repeated over the batch (on the
    GPU a :class:`TiledIds` that the kernels compute: nothing is built or copied)."""
    length = shape[-1]
    if past_length + length > max_positions:
        raise ValueError(
            f"past_length + L = {past_length} + {length} = {past_length + length} exceeds "
            f"{size_name}={max_positions}: positions must stay below {max_positions}"
        )
    if K.DEVICE != "cpu":
        return TiledIds(None, past_length, length)
    global _last_default_positions
    batch = shape[0] if len(shape) == 2 else 1
    key = (past_length, length, batch)
    cached = _last_default_positions
    if cached is not None and cached[0] == key:
        return cached[1]
    positions = K.asarray(np.tile(np.arange(past_length, past_length + length, dtype=np.int64),
                                  batch))
    _last_default_positions = (key, positions)
    return positions


# The CPU default positions of the latest call, reused while the shape repeats (every
# step of a training loop): building them cost 10 % of a GPT-2 forward at D = 384.
# Shared between calls, so it only ever goes to kernels, which never write it (and
# stays writeable: a read-only array would be another signature for Numba to
# compile). One (key, array) tuple, swapped atomically.
_last_default_positions = None


def _explicit_positions(K, position_ids, shape, max_positions, size_name, inline=False):
    flat = _broadcast_ids(K, position_ids, "position_ids", shape, inline)
    _check_ids(K, flat, max_positions, "position_ids", size_name, inline)
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
        On the mask's device (a CUDA mask is never copied to the host: a value
        other than 0 and 1 there is a deferred ValueError, raised by a later
        call or at :func:`numbapos.synchronize`).

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
    mask = _checks.check_attention_mask(attention_mask)  # on its device
    total = mask.shape[mask.ndim - 1]
    if length is None:
        length = total
    length = _checks.check_int(length, "length", minimum=0)
    pad_position = _checks.check_int64(pad_position, "pad_position", minimum=0)
    if length > total:
        raise ValueError(
            f"attention_mask: has {total} columns, fewer than the {length} current tokens"
        )
    K = _device.kernels_for(_device.device_of(mask))
    out = _mask_to_positions(K, mask, length, pad_position)
    return out.reshape(out.shape[1:]) if mask.ndim == 1 else out


def _mask_to_positions(K, mask, length, pad_position, max_positions=-1, size_name=""):
    """``K.positions_from_mask`` of a checked 1-D / 2-D mask (moved to K's device first):
    ``(rows, length)`` int64, the last ``length`` columns."""
    if _device.device_of(mask) != K.DEVICE:
        mask = K.asarray(mask) if K.DEVICE == "cuda" else _device.to_host(mask)
    rows = 1 if mask.ndim == 1 else mask.shape[0]
    out = K.empty((rows, length), np.int64)
    K.positions_from_mask(mask.reshape(rows, mask.shape[mask.ndim - 1]), pad_position,
                          max_positions, out, "attention_mask", size_name)
    return out


def _checked_mask(attention_mask, shape, past_length):
    """The mask, of exactly ``input_ids.shape`` with ``past_length + L`` columns."""
    mask = _checks.check_attention_mask(attention_mask)
    length = shape[-1]
    expected = shape[:-1] + (past_length + length,)
    if tuple(mask.shape) != expected:
        raise ValueError(
            f"attention_mask: expected shape {expected} (input_ids.shape with past_length + L "
            f"= {past_length} + {length} columns), got {tuple(mask.shape)}"
        )
    return mask


def _mask_positions(K, attention_mask, shape, past_length, max_positions, size_name):
    mask = _checked_mask(attention_mask, shape, past_length)
    return _mask_to_positions(K, mask, shape[-1], 1, max_positions, size_name).reshape(-1)


def _bert_ids(K, input_ids, token_type_ids, position_ids, past_length, tables, inline=False):
    """Validated flat ids of the BERT block: (shape, BertIds).

    On the GPU default and broadcast positions / token types are
    :class:`TiledIds`, and with ``inline`` the ids are range-checked by the
    forward kernel itself (deferred), not by separate launches.
    """
    past_length = _checks.check_int(past_length, "past_length", minimum=0)
    shape, word = _flat_ids(K, input_ids, tables.word.shape[0], inline=inline)
    type_rows = tables.token_type.shape[0]
    if token_type_ids is None:
        if type_rows == 0 and word.size:
            raise IndexError(
                "token_type_ids: the default token type 0 is out of range for "
                "type_vocab_size=0; the token-type table needs at least one row"
            )
        types = (K.zeros((word.size,), np.int64) if K.DEVICE == "cpu"
                 else TiledIds(None, 0, 1))
    else:
        types = _broadcast_ids(K, token_type_ids, "token_type_ids", shape, inline)
        _check_ids(K, types, type_rows, "token_type_ids", "type_vocab_size", inline)
    rows = tables.position.shape[0]
    if position_ids is None:
        pos = _default_positions(K, shape, past_length, rows, "max_position_embeddings")
    else:
        pos = _explicit_positions(K, position_ids, shape, rows, "max_position_embeddings",
                                  inline)
    return shape, BertIds(word, pos, types)


def _gpt2_ids(K, input_ids, past_length, position_ids, attention_mask, vocab_size,
              n_positions, inline=False):
    """Validated flat ids of the GPT-2 block: (shape, ids, positions); as :func:`_bert_ids`."""
    past_length = _checks.check_int(past_length, "past_length", minimum=0)
    shape, flat = _flat_ids(K, input_ids, vocab_size, inline=inline)
    if position_ids is not None:
        if attention_mask is not None:  # not read, but a mask of another shape is a mistake
            _checked_mask(attention_mask, shape, past_length)
        pos = _explicit_positions(K, position_ids, shape, n_positions, "n_positions", inline)
    elif attention_mask is not None:
        pos = _mask_positions(K, attention_mask, shape, past_length, n_positions, "n_positions")
    else:
        pos = _default_positions(K, shape, past_length, n_positions, "n_positions")
    return shape, flat, pos


def _check_grad(grad_output, shape, dtype, name="grad_output", what="that of the tables"):
    """A float array (gradient or statistic) of exactly ``shape`` and ``dtype``."""
    shape_what = ("input_ids.shape + (hidden size,)" if name == "grad_output"
                  else "input_ids.shape")
    return _checks.check_float_like(grad_output, name, shape, dtype, shape_what, what)


def _clip_tables(K, tables, flats, options, names, num_tokens):
    """Clip the looked-up rows of every table with ``max_norm``, after checking that each
    such table is writeable (so nothing is clipped when one is not). A 16-bit table's
    norm is taken in float32 / float64 and its clipped rows rounded to nearest even, as
    :func:`numbapos.functional.embedding` does."""
    for table, opts, name in zip(tables, options, names, strict=True):
        if opts.max_norm is not None:
            _check_clippable(table, name, "its max_norm clips looked-up rows in place")
    for table, flat, opts in zip(tables, flats, options, strict=True):
        if opts.max_norm is not None and num_tokens:
            half = _checks.is_half_dtype(table.dtype)
            K.renorm_used_rows_(table.view(_UINT16) if half else table,
                                _full(K, flat, num_tokens), opts.max_norm, opts.norm_type,
                                half_format(table.dtype) if half else TableFormat.FLOAT)


def _table_grads(K, grad, flats, row_counts, options, wanted, num_tokens):
    """The tables' gradients from the per-token gradient ``grad`` (``(T, D)``, flat ids of
    each table in ``flats``); None for those not ``wanted``."""
    return [_scatter(K, grad, _full(K, flat, num_tokens), rows, opts.padding_idx,
                     opts.scale_grad_by_freq, opts.sparse) if want else None
            for flat, rows, opts, want in zip(flats, row_counts, options, wanted, strict=True)]


def _views(K, dtype, shapes):
    """Arrays of ``shapes`` (None: no array, None returned) as views of one allocation."""
    sizes = [0 if shape is None else int(np.prod(shape)) for shape in shapes]
    block = K.empty((sum(sizes),), dtype)
    views, start = [], 0
    for shape, size in zip(shapes, sizes, strict=True):
        views.append(None if shape is None else block[start:start + size].reshape(shape))
        start += size
    return views


def _by_position_kernel(default_positions, options, wanted):
    """Whether the position table's gradient is one :func:`position_grad` launch: default
    positions (``past_length + t % L``) and a plain dense gradient."""
    return wanted and default_positions and options[:3] == PLAIN[:3]


def _position_grad(K, grad, shape, past_length, out):
    """The position table's gradient ``out`` (``(P, D)``) for default positions: every row
    written, the used ones summed over the batch in the scatter's order (same bits)."""
    K.position_grad(grad, past_length, shape[-1], out)
    return out


def _inline_checks(options):
    """Whether the forward kernel alone checks the ids: not when a table clips rows with
    ``max_norm`` (the clipping reads them first, so they are checked before, with names)."""
    return all(opts.max_norm is None for opts in options)


def _result(K, out, shape, dtype, avoid):
    if out is None:
        return K.empty(shape, dtype)
    return _checks.check_out(out, shape, dtype, avoid=avoid)


# ------------------------------------------------------------------ BERT

_BERT_NAMES = ("word_embeddings", "position_embeddings", "token_type_embeddings")


def bert_embeddings_forward(input_ids, word_embeddings, position_embeddings,
                            token_type_embeddings, ln_weight=None, ln_bias=None, *,
                            token_type_ids=None, position_ids=None, past_length=0, eps=1e-12,
                            p=0.0, seed=0, training=True, counter=0, out=None,
                            table_options=None):
    """BERT's embedding block, fused; also returns the LayerNorm statistics.

    ``Dropout(LayerNorm(word[input_ids] + position[position_ids] +
    token_type[token_type_ids]))``, as Hugging Face's ``BertEmbeddings``, in one
    pass over the tokens: each token's three rows are gathered, summed and
    normalised in cache, and written once.

    Parameters
    ----------
    input_ids : array_like of int, shape (N, L) or (L,)
        Token ids in ``[0, V)``.
    word_embeddings : ndarray, shape (V, D), float32, float64, bfloat16 or float16
    position_embeddings : ndarray, shape (P, D), same dtype
    token_type_embeddings : ndarray, shape (T, D), same dtype
    ln_weight, ln_bias : ndarray, shape (D,), optional
        LayerNorm scale and shift (None: ones / zeros), of the tables' dtype,
        float32 for 16-bit tables (whose rows are widened exactly: ``y``,
        ``mean`` and ``rstd`` are then float32, the float32 block's bits on
        the widened tables).
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
        With CUDA tables ``counter`` may be a device counter (a CUDA array of
        one uint64, read by the kernel: what the blocks' modules pass there,
        so that a captured step draws a fresh mask at each replay).
    training : bool, default True
        False disables dropout.
    out : ndarray, optional
        C-contiguous buffer of shape ``input_ids.shape + (D,)`` for ``y``.
    table_options : tuple of three TableOptions, optional
        Per table (word, position, token type): ``max_norm`` / ``norm_type``
        clip the rows looked up, in place, before the sum (as
        :func:`numbapos.functional.embedding`); the gradient options are used
        by the backward call. Default: no clipping.

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
    return _bert_forward_call(input_ids, word_embeddings, position_embeddings,
                              token_type_embeddings, ln_weight, ln_bias, token_type_ids,
                              position_ids, past_length, eps, p, seed, training, counter, out,
                              table_options, False, None)


_BERT_FORWARDS = Planned("bert_embeddings_forward")
# By (recorded, counter drawn by the op): y, then the record, or mean, rstd and a drawn
# counter.
_BERT_OUTPUTS = {(False, False): (9, 10, 11), (False, True): (9, 10, 11, 13),
                 (True, False): (9, 10), (True, True): (9, 10)}
_BERT_AVOID = tuple((9, i) for i in range(9))  # out= must not overlap an input


def _bert_forward_call(input_ids, word_embeddings, position_embeddings, token_type_embeddings,
                       ln_weight, ln_bias, token_type_ids, position_ids, past_length, eps, p,
                       seed, training, counter, out, table_options, recorded, ids_copy):
    """:func:`bert_embeddings_forward`, planned on the GPU.

    With ``recorded`` (what ``nn.BertEmbeddings`` asks for a recorded forward)
    it returns ``(y, record)``: ``mean``, ``rstd``, the counter the op draws
    from (if it does) and, with ``ids_copy`` (a recorded forward on CUDA ids:
    the dtype the kernel reads them in), a copy of ``input_ids`` that the
    forward kernel writes as it reads them, all in one uint8 ``record`` (see
    :func:`_record_parts`; the caller's record for its backward, which takes
    it as it is) in the block of ``y``: one output to make per call and no
    launch or allocation of their own. Unrecorded, a ``counter`` the op
    draws from (:func:`_draws`) adds the drawn ``(1,)`` counter, last.
    """
    full = functools.partial(  # the ordinary path; cheaper than a closure over all
        _bert_forward, input_ids, word_embeddings, position_embeddings, token_type_embeddings,
        ln_weight, ln_bias, token_type_ids, position_ids, past_length, eps, p, seed, training,
        counter, out, table_options, recorded, ids_copy)
    if type(word_embeddings) is np.ndarray:
        return full()
    planned = _counter_for_plan(counter, training, p)
    if planned is None:
        return full()
    return _BERT_FORWARDS.call(
        full, (input_ids, word_embeddings, position_embeddings, token_type_embeddings, ln_weight,
               ln_bias, token_type_ids, position_ids, planned[0], out, None, None, None, None),
        (past_length, eps, p, seed, bool(training), planned[1], table_options, recorded,
         ids_copy),
        _BERT_OUTPUTS[recorded, planned[1] == "drawn by the op"], _BERT_AVOID)


def _bert_forward(input_ids, word_embeddings, position_embeddings, token_type_embeddings,
                  ln_weight, ln_bias, token_type_ids, position_ids, past_length, eps, p, seed,
                  training, counter, out, table_options, recorded=False, ids_copy=None):
    """:func:`bert_embeddings_forward`'s ordinary path (``recorded``, ``ids_copy``: see
    :func:`_bert_forward_call`)."""
    tables = _bert_tables(word_embeddings, position_embeddings, token_type_embeddings,
                          ln_weight, ln_bias)
    K = backend_for(tables + (out,), _BERT_NAMES + ("ln_weight", "ln_bias", "out"))
    eps = _checks.check_eps(eps)
    source = counter if _draws(counter) else None
    if source is not None:
        counter = source.values  # checked for the drawn counter (the same metadata)
    drop = _check_dropout(K, p, seed, training, counter)
    options = _check_options(table_options, [t.shape[0] for t in tables[:3]], _BERT_NAMES)
    shape, ids = _bert_ids(K, input_ids, token_type_ids, position_ids, past_length, tables,
                           inline=_inline_checks(options))
    dim, dtype = tables.word.shape[1], _compute_dtype(tables.word.dtype)[0]
    if out is not None:
        out = _checks.check_out(out, shape + (dim,), dtype,
                                avoid=tuple(tables) + tuple(_ids_array(i) for i in ids))
    if ids_copy is not None and ids_copy != ids.word.dtype:
        raise RuntimeError(f"internal: an ids copy of dtype {ids_copy} asked for ids the "
                           f"kernel reads as {ids.word.dtype}")
    _clip_tables(K, tables[:3], ids, options, _BERT_NAMES, ids.word.size)
    num_tokens = ids.word.size
    parts = _record_wanted(shape, dtype, source is not None, ids_copy if recorded else None)
    if num_tokens and K.DEVICE == "cuda":
        # y (unless given) and the record's parts in one allocation.
        y, record, (stats, drawn, snapshot) = _bert_outputs(K, out, shape + (dim,), dtype,
                                                            parts, recorded)
    else:
        y = K.empty(shape + (dim,), dtype) if out is None else out
        if recorded:
            record = K.empty((_record_size(parts),), np.uint8)
            stats, drawn, snapshot = _record_parts(K, record, parts)
        else:
            record, snapshot = None, None
            stats = K.empty((2,) + shape, dtype)
            drawn = K.empty((1,), np.uint64) if source is not None else None
    if source is not None:
        drop = drop._replace(live=source.draw_into(drawn))
    mean, rstd = _unstacked(K, stats, shape)
    kernel_tables, fmt = _kernel_tables(K, tables)
    K.bert_forward(ids, BertTables(*kernel_tables), eps, drop, y.reshape(num_tokens, dim),
                   mean.reshape(num_tokens), rstd.reshape(num_tokens), fmt,
                   snapshot=None if snapshot is None or not num_tokens
                   else snapshot.reshape(num_tokens))
    if recorded:
        return y, record
    return (y, mean, rstd) + ((drawn,) if source else ())


def _unstacked(K, stats, shape):
    """``(mean, rstd)``: the two halves of a block's ``(2,) + shape`` statistics."""
    if stats.size:
        return stats[0], stats[1]
    # numba-cuda 0.30 gives the views of an empty device array wrong shapes
    return K.empty(shape, stats.dtype), K.empty(shape, stats.dtype)


def _record_wanted(shape, dtype, counter: bool, ids_copy) -> list:
    """``[(shape, dtype) or None]`` of a forward's statistics, drawn counter and ids copy
    (None: none), in the order they are laid out (see :func:`_record_parts`)."""
    shape = tuple(shape)
    return [((2,) + shape, np.dtype(dtype)),
            ((1,), np.dtype(np.uint64)) if counter else None,
            (shape, np.dtype(ids_copy)) if ids_copy is not None else None]


def _spans(wanted) -> list:
    """``[(first byte, end byte) or None]`` of each part of ``wanted``, each 16-byte aligned."""
    spans, size = [], 0
    for part in wanted:
        if part is None:
            spans.append(None)
            continue
        nbytes = int(np.prod(part[0])) * part[1].itemsize
        spans.append((size, size + nbytes))
        size += -(-nbytes // 16) * 16
    return spans


def _record_size(wanted) -> int:
    """The bytes of a record of the parts ``wanted`` (see :func:`_record_parts`)."""
    return max(span[1] for span in _spans(wanted) if span is not None)


def _record_parts(K, record, wanted, at: int = 0) -> list:
    """The parts of a recorded forward's ``record`` (from its byte ``at``): a uint8 array
    holding the LayerNorm's mean and rstd as one ``(2,) + shape`` array, then the ``(1,)``
    uint64 dropout counter the forward drew (None: it drew none), then the copy of its
    ids (None: none), each 16-byte aligned (``wanted``: :func:`_record_wanted`)."""
    parts = []
    for part, span in zip(wanted, _spans(wanted), strict=True):
        if part is None:
            parts.append(None)
        elif span[1] > span[0]:
            parts.append(record[at + span[0]:at + span[1]].view(part[1]).reshape(part[0]))
        else:  # numba-cuda 0.30 gives the views of an empty device array wrong shapes
            parts.append(K.empty(*part))
    return parts


def _bert_outputs(K, out, y_shape, dtype, wanted, recorded):
    """``(y, the record or None, its parts)`` of a non-empty GPU forward in one allocation
    (``y`` there only when ``out`` is None, then the parts of ``wanted``, see
    :func:`_record_parts`), each part 16-byte aligned; ``recorded``: the parts also as
    one record."""
    spans = _spans(wanted if out is not None else [(y_shape, np.dtype(dtype))] + wanted)
    end = max(span[1] for span in spans if span is not None)
    block = K.empty((-(-end // 16) * 16,), np.uint8)
    first = 0  # where the record starts: after y, if y is there
    if out is None:
        out = block[spans[0][0]:spans[0][1]].view(dtype).reshape(y_shape)
        first = spans[1][0]
    parts = _record_parts(K, block, wanted, first)
    return out, block[first:end] if recorded else None, parts


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
                             seed=0, training=True, counter=0, padding_idx=None, sparse=False,
                             table_options=None, output_mask=None):
    """Gradients of :func:`bert_embeddings_forward` wrt the three tables and the LayerNorm.

    Pass the arguments of the forward call (the tables unchanged since) and
    the ``mean`` / ``rstd`` it returned. The row sums are recomputed from the
    tables and the dropout mask from ``(seed, counter)``.

    Parameters
    ----------
    grad_output : ndarray, shape ``input_ids.shape + (D,)``
        Gradient wrt the block's output, of the output's dtype (the tables',
        float32 for 16-bit tables: every gradient is then float32).
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
    table_options : tuple of three TableOptions, optional
        Per table (word, position, token type): ``padding_idx``,
        ``scale_grad_by_freq`` and ``sparse`` of its gradient, as for
        :func:`numbapos.functional.embedding_backward`. When given,
        ``padding_idx`` and ``sparse`` must be left at their defaults.
    output_mask : tuple of five bools, optional
        Which gradients to compute (word, position, token type, ln_weight,
        ln_bias); the others come back as None. Default: all that exist.

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
    return _bert_backward_call(
        (grad_output, input_ids, word_embeddings, position_embeddings, token_type_embeddings,
         mean, rstd, ln_weight, ln_bias),
        dict(token_type_ids=token_type_ids, position_ids=position_ids, past_length=past_length,
             p=p, seed=seed, training=training, counter=counter, padding_idx=padding_idx,
             sparse=sparse, table_options=table_options, output_mask=output_mask,
             recorded=None))


def _bert_backward_call(args, keywords):
    """:func:`bert_embeddings_backward` of ``args`` (its positional arguments) and
    ``keywords`` (all of its keywords and ``recorded``), planned on the GPU.

    ``recorded``: None, or ``(input_ids.shape, whether the forward drew its counter, the
    dtype of its ids copy or None)`` where ``mean`` is a recorded forward's record
    (:func:`_bert_forward_call`) and ``rstd`` None; a drawn counter is the one in the
    record (``counter`` is not read), and so are the ids where it holds a copy
    (``input_ids`` is not read)."""
    word_embeddings = args[2]
    if type(word_embeddings) is np.ndarray:
        return _bert_backward(*args, **keywords)
    training, p, output_mask = keywords["training"], keywords["p"], keywords["output_mask"]
    planned = _counter_for_plan(keywords["counter"], training, p)
    if planned is None:
        return _bert_backward(*args, **keywords)  # a counter that changes every step
    device_counter, host_counter = planned
    return _BERT_BACKWARDS.call(
        lambda: _bert_backward(*args, **keywords),
        (*args, keywords["token_type_ids"], keywords["position_ids"], device_counter),
        (keywords["past_length"], p, keywords["seed"], bool(training), host_counter,
         keywords["padding_idx"], bool(keywords["sparse"]), keywords["table_options"],
         None if output_mask is None else tuple(output_mask), keywords["recorded"]),
        unpack=_grads_arrays, pack=_grads_from)


_BERT_BACKWARDS = Planned("bert_embeddings_backward")


def _grads_arrays(grads):
    """A planned backward's gradients as ``(arrays, layout)`` (see ``PlanCache.call``):
    each gradient's arrays (a SparseRows' rows, count and values) and what it was."""
    arrays, layout = [], []
    for grad in grads:
        if grad is None:
            layout.append(None)
        elif isinstance(grad, SparseRows):
            arrays.extend((grad._indices, grad._used, grad._values))
            layout.append(grad.num_rows)
        else:
            arrays.append(grad)
            layout.append(-1)
    return arrays, (type(grads), tuple(layout))


def _grads_from(made, layout):
    kind, fields = layout
    made, grads = iter(made), []
    for field in fields:
        if field is None:
            grads.append(None)
        elif field == -1:
            grads.append(next(made))
        else:
            rows, used, values = next(made), next(made), next(made)
            grads.append(SparseRows._grouped(RowGroups(rows, None, None, None, used), values,
                                             field))
    return kind(*grads)


def _bert_backward(grad_output, input_ids, word_embeddings, position_embeddings,
                   token_type_embeddings, mean, rstd, ln_weight, ln_bias, *, token_type_ids,
                   position_ids, past_length, p, seed, training, counter, padding_idx, sparse,
                   table_options, output_mask, recorded=None):
    """:func:`bert_embeddings_backward`'s ordinary path (``recorded``: see
    :func:`_bert_backward_call`)."""
    tables = _bert_tables(word_embeddings, position_embeddings, token_type_embeddings,
                          ln_weight, ln_bias)
    K = backend_for(tables + (grad_output, mean, rstd),
                    _BERT_NAMES + ("ln_weight", "ln_bias", "grad_output", "mean", "rstd"))
    dim, (dtype, what) = tables.word.shape[1], _compute_dtype(tables.word.dtype)
    if recorded is not None:
        record_shape, drew, ids_copy = recorded
        stats, drawn, copied = _record_parts(K, mean, _record_wanted(record_shape, dtype, drew,
                                                                     ids_copy))
        if drawn is not None:
            counter = drawn
        if copied is not None:
            input_ids = copied
    drop = _check_dropout(K, p, seed, training, counter)
    # Word ids alone (default token types and positions): the backward kernel checks them
    # as it reads them, in place of a check launch; with explicit ids of another kind
    # the separate checks keep the CPU's order of the arguments.
    inline = token_type_ids is None and position_ids is None
    shape, ids = _bert_ids(K, input_ids, token_type_ids, position_ids, past_length, tables,
                           inline=inline)
    if inline:
        ids = ids._replace(word=K.contiguous(ids.word, np.int64))
    if table_options is None:
        padding_idx = _checks.check_padding_idx(padding_idx, tables.word.shape[0])
        table_options = (TableOptions(padding_idx, sparse=bool(sparse)), PLAIN, PLAIN)
    elif padding_idx is not None or sparse:
        raise ValueError("padding_idx / sparse: give them inside table_options, not beside it")
    options = _check_options(table_options, [t.shape[0] for t in tables[:3]], _BERT_NAMES)
    mask = _check_mask(output_mask, 5, _BERT_NAMES + ("ln_weight", "ln_bias"))
    grad_output = _check_grad(grad_output, shape + (dim,), dtype, what=what)
    if recorded is not None:
        mean, rstd = _unstacked(K, _checks.check_float_like(
            stats, "mean", (2,) + shape, dtype, "(2,) + input_ids.shape", what), shape)
    else:
        mean = _check_grad(mean, shape, dtype, "mean", what)
        rstd = _check_grad(rstd, shape, dtype, "rstd", what)
    want_w = mask[3] and tables.gamma is not None
    want_b = mask[4] and (tables.gamma is not None or tables.beta is not None)
    fuse_type = (mask[2] and tables.token_type.shape[0] <= FUSED_TYPE_GRAD_MAX_ROWS
                 and options[2][:3] == PLAIN[:3])
    by_kernel = _by_position_kernel(position_ids is None, options[1], mask[1])
    num_tokens = ids.word.size
    grad_sum = K.empty((num_tokens, dim), dtype)
    # The gradients written whole by the kernels here: views of one allocation.
    grad_pos, grad_type, grad_w, grad_b = _views(K, dtype, (
        tuple(tables.position.shape) if by_kernel else None,
        tuple(tables.token_type.shape) if fuse_type else None,
        (dim,) if want_w else None, (dim,) if want_b else None))
    kernel_tables, fmt = _kernel_tables(K, tables)
    K.bert_backward(K.contiguous(grad_output).reshape(num_tokens, dim), ids,
                    BertTables(*kernel_tables), K.contiguous(mean).reshape(num_tokens),
                    K.contiguous(rstd).reshape(num_tokens), drop, grad_sum, grad_w, grad_b,
                    grad_type, fmt)
    if by_kernel:
        _position_grad(K, grad_sum, shape, _checks.check_int(past_length, "past_length"),
                       grad_pos)
    grad_word, scattered_pos, scattered = _table_grads(
        K, grad_sum, ids, [t.shape[0] for t in tables[:3]], options,
        (mask[0], mask[1] and not by_kernel, mask[2] and not fuse_type), num_tokens)
    return BertEmbeddingsGrads(grad_word, grad_pos if by_kernel else scattered_pos,
                               grad_type if fuse_type else scattered, grad_w, grad_b)


# ------------------------------------------------------------------ GPT-2

_GPT2_NAMES = ("wte", "wpe")


def gpt2_embeddings(input_ids, wte, wpe, *, past_length=0, position_ids=None,
                    attention_mask=None, p=0.0, seed=0, training=True, counter=0, out=None,
                    table_options=None):
    """GPT-2's embedding block, fused: ``Dropout(wte[input_ids] + wpe[positions])``.

    Parameters
    ----------
    input_ids : array_like of int, shape (N, L) or (L,)
        Token ids in ``[0, V)``.
    wte : ndarray, shape (V, D), float32, float64, bfloat16 or float16
        Token embeddings.
    wpe : ndarray, shape (P, D), same dtype
        Position embeddings.
    past_length : int, default 0
        Number of tokens already in the key/value cache.
    position_ids : array_like of int, optional
        Shape of ``input_ids`` (or (L,) / (1, L)), each in ``[0, P)``. Takes
        precedence over ``attention_mask`` (which must still have its shape).
    attention_mask : array_like of bool or int, optional
        Shape ``(N, past_length + L)`` (``(past_length + L,)`` for 1-D ids), 1 at
        real tokens and 0 at padding. Positions then follow it as in Hugging
        Face's generation (see :func:`positions_from_attention_mask`), so
        left-padded rows number their real tokens from 0.
    p, seed, training, counter
        Dropout, as in :func:`numbapos.functional.dropout` on the sum
        (``counter`` an int, or with CUDA tables a device counter).
    out : ndarray, optional
        C-contiguous buffer of shape ``input_ids.shape + (D,)``.
    table_options : tuple of two TableOptions, optional
        ``max_norm`` / ``norm_type`` of ``wte`` and ``wpe``: looked-up rows are
        clipped in place before the sum.

    Returns
    -------
    ndarray, shape ``input_ids.shape + (D,)``
        Default positions are ``past_length .. past_length + L - 1``. Of the
        tables' dtype, float32 for 16-bit tables (rows widened exactly).

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
    if (out is None and position_ids is None and attention_mask is None
            and table_options is None and (p == 0 or not training)):
        y = _small_gpt2(input_ids, wte, wpe, past_length)
        if y is not None:
            return y
    keywords = dict(past_length=past_length, position_ids=position_ids,
                    attention_mask=attention_mask, p=p, seed=seed, training=training,
                    counter=counter, out=out, table_options=table_options)
    if type(wte) is np.ndarray:
        return _gpt2_forward(input_ids, wte, wpe, **keywords)
    # GPU tables: the plan of this call signature, as for the BERT block.
    planned = _counter_for_plan(counter, training, p)
    if planned is None:
        return _gpt2_forward(input_ids, wte, wpe, **keywords)
    device_counter, host_counter = planned
    return _GPT2_FORWARDS.call(
        lambda: _gpt2_forward(input_ids, wte, wpe, **keywords),
        (input_ids, wte, wpe, position_ids, attention_mask, device_counter, out),
        (past_length, p, seed, bool(training), host_counter,
         table_options),
        outputs=(6,), avoid=tuple((6, i) for i in range(6)))


_GPT2_FORWARDS = Planned("gpt2_embeddings")


def _gpt2_forward(input_ids, wte, wpe, *, past_length, position_ids, attention_mask, p, seed,
                  training, counter, out, table_options):
    """:func:`gpt2_embeddings`' ordinary path."""
    wte, wpe = _check_tables((wte, wpe), _GPT2_NAMES)
    K = backend_for((wte, wpe, out), _GPT2_NAMES + ("out",))
    drop = _check_dropout(K, p, seed, training, counter)
    options = _check_options(table_options, (wte.shape[0], wpe.shape[0]), _GPT2_NAMES)
    shape, ids, pos = _gpt2_ids(K, input_ids, past_length, position_ids, attention_mask,
                                wte.shape[0], wpe.shape[0], inline=_inline_checks(options))
    dim = wte.shape[1]
    y = _result(K, out, shape + (dim,), _compute_dtype(wte.dtype)[0],
                avoid=(wte, wpe, ids, _ids_array(pos)))
    _clip_tables(K, (wte, wpe), (ids, pos), options, _GPT2_NAMES, ids.size)
    (wte, wpe), fmt = _kernel_tables(K, (wte, wpe))
    K.gpt2_forward(ids, pos, wte, wpe, drop, y.reshape(ids.size, dim), fmt)
    return y


def _small_gpt2(input_ids, wte, wpe, past_length):
    """A small no-dropout GPT-2 forward on NumPy arrays in one kernel call, or None.

    Generation feeds one token at a time; this path skips everything such a
    call does not need. None (the full path then runs, and raises where it
    should) for anything else: other types or dtypes, large inputs, positions
    past ``wpe``, an id out of range.
    """
    if (type(input_ids) is not np.ndarray or type(wte) is not np.ndarray
            or type(wpe) is not np.ndarray or type(past_length) is not int
            or input_ids.dtype not in _common.INDEX_DTYPES or wpe.dtype != wte.dtype
            or wte.ndim != 2 or wpe.ndim != 2
            or wte.shape[1] != wpe.shape[1] or input_ids.ndim not in (1, 2)
            or not input_ids.flags.c_contiguous or past_length < 0):
        return None
    dtype, fmt = wte.dtype, TableFormat.FLOAT
    if dtype not in _common.FLOAT_DTYPES:
        if not _checks.is_half_dtype(dtype):
            return None
        dtype, fmt = np.dtype(np.float32), half_format(dtype)
        wte, wpe = wte.view(_UINT16), wpe.view(_UINT16)
    length = input_ids.shape[-1]
    dim = wte.shape[1]
    if past_length + length > wpe.shape[0] or input_ids.size * dim > _common.SMALL_WORK:
        return None
    y = np.empty(input_ids.shape + (dim,), dtype)
    K = _common.cpu_kernels()
    bad = K.gpt2_forward_checked(input_ids.reshape(input_ids.size), past_length, max(length, 1),
                                 wte, wpe, y.reshape(input_ids.size, dim), fmt)
    return y if bad < 0 else None


def gpt2_embeddings_backward(grad_output, input_ids, vocab_size, n_positions, *, past_length=0,
                             position_ids=None, attention_mask=None, p=0.0, seed=0,
                             training=True, counter=0, sparse=False, table_options=None,
                             output_mask=None):
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
    table_options : tuple of two TableOptions, optional
        ``padding_idx``, ``scale_grad_by_freq`` and ``sparse`` of the ``wte``
        and ``wpe`` gradients; ``sparse`` must then be left False.
    output_mask : tuple of two bools, optional
        Which of the ``wte`` / ``wpe`` gradients to compute.

    Returns
    -------
    GPT2EmbeddingsGrads
        ``(wte, wpe)``; the position gradient is summed over the batch.

    Raises
    ------
    TypeError, ValueError, IndexError
        As for the forward call, and for a ``grad_output`` of the wrong shape.
    """
    keywords = dict(past_length=past_length, position_ids=position_ids,
                    attention_mask=attention_mask, p=p, seed=seed, training=training,
                    counter=counter, sparse=sparse, table_options=table_options,
                    output_mask=output_mask)
    args = (grad_output, input_ids, vocab_size, n_positions)
    if type(grad_output) is np.ndarray:
        return _gpt2_backward(*args, **keywords)
    planned = _counter_for_plan(counter, training, p)
    if planned is None:
        return _gpt2_backward(*args, **keywords)
    device_counter, host_counter = planned
    return _GPT2_BACKWARDS.call(
        lambda: _gpt2_backward(*args, **keywords),
        (grad_output, input_ids, position_ids, attention_mask, device_counter),
        (vocab_size, n_positions, past_length, p, seed, bool(training),
         host_counter, bool(sparse), table_options,
         None if output_mask is None else tuple(output_mask)),
        unpack=_grads_arrays, pack=_grads_from)


_GPT2_BACKWARDS = Planned("gpt2_embeddings_backward")


def _gpt2_backward(grad_output, input_ids, vocab_size, n_positions, *, past_length,
                   position_ids, attention_mask, p, seed, training, counter, sparse,
                   table_options, output_mask):
    """:func:`gpt2_embeddings_backward`'s ordinary path."""
    vocab_size = _checks.check_int(vocab_size, "vocab_size", minimum=1)
    n_positions = _checks.check_int(n_positions, "n_positions", minimum=1)
    grad_output = _checks.check_float_array(grad_output, "grad_output")
    K = backend_for((grad_output,), ("grad_output",))
    drop = _check_dropout(K, p, seed, training, counter)
    shape, ids, pos = _gpt2_ids(K, input_ids, past_length, position_ids, attention_mask,
                                vocab_size, n_positions)
    if tuple(grad_output.shape[:-1]) != shape or grad_output.ndim != len(shape) + 1:
        raise ValueError(f"grad_output: expected shape input_ids.shape + (D,) = "
                         f"{shape + ('D',)}, got {tuple(grad_output.shape)}")
    if table_options is None:
        table_options = (TableOptions(sparse=bool(sparse)), PLAIN)
    elif sparse:
        raise ValueError("sparse: give it inside table_options, not beside it")
    options = _check_options(table_options, (vocab_size, n_positions), _GPT2_NAMES)
    mask = _check_mask(output_mask, 2, _GPT2_NAMES)
    dim = grad_output.shape[grad_output.ndim - 1]
    grad = K.contiguous(grad_output).reshape(ids.size, dim)
    if drop.active:
        masked = K.empty((ids.size, dim), grad.dtype)
        K.dropout_apply(grad.reshape(grad.size), drop, masked.reshape(grad.size))
        grad = masked
    by_kernel = _by_position_kernel(position_ids is None and attention_mask is None,
                                    options[1], mask[1])
    grad_wte, grad_wpe = _table_grads(K, grad, (ids, pos), (vocab_size, n_positions), options,
                                      (mask[0], mask[1] and not by_kernel), ids.size)
    if by_kernel:
        grad_wpe = _position_grad(K, grad, shape, _checks.check_int(past_length, "past_length"),
                                  K.empty((n_positions, dim), grad.dtype))
    return GPT2EmbeddingsGrads(grad_wte, grad_wpe)
