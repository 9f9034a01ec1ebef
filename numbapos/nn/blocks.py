"""The BERT and GPT-2 embedding blocks, with Hugging Face's parameter names."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .. import _checks, _device
from .. import functional as F
from .._docs import MODULE, fill_doc
from .._grad_mode import _STATE
from . import _resize
from . import init as initializers
from .dropout import Dropout
from .embedding import Embedding
from .module import Module
from .normalization import LayerNorm
from .parameter import Parameter

# BERT and GPT-2 initialise their tables from N(0, initializer_range**2).
INITIALIZER_RANGE = 0.02
_INT64 = np.dtype(np.int64)  # the ids a block's kernels read when not as given

# Docstring text of both blocks, written once (see numbapos/_docs.py).
_doc = fill_doc(MODULE, {
    "input_ids": """\
input_ids : array_like of int, shape (N, L) or (L,)
    Token ids in ``[0, vocab_size)``.""",
    "bad_grad_output": """\
TypeError, ValueError
    ``grad_output`` not of the output's shape and dtype (the record is kept).""",
})


def _table_maker(dim, dtype, rng, weights):
    """``table(rows, key, padding_idx=None)``: a child Embedding of width ``dim``, drawn from
    N(0, 0.02^2) with ``rng`` in ``dtype``, or over ``weights[key]`` when weights are given."""
    init = initializers.normal(0.0, INITIALIZER_RANGE)

    def table(rows, key, padding_idx=None):
        if weights is not None:
            return Embedding(rows, dim, padding_idx=padding_idx, _weight=weights[key])
        return Embedding(rows, dim, padding_idx=padding_idx, dtype=dtype, init=init, seed=rng)

    return table


def _output(block, input_ids, word: Embedding, out):
    """``out``, or the block's reused output buffer (the word table's width and gradient dtype)."""
    if out is not None:
        return out
    weight = word.weight
    return block._output_buffer(input_ids, np.shape(input_ids) + (weight.shape[1],),
                                _checks.grad_dtype(weight.dtype))


def _resize_table(block, table: Embedding, new_len, mode, num_prefix_rows, optimizer, seed):
    table.num_embeddings = _resize.resize_param_(
        block, table.weight, new_len, mode, num_prefix_rows,
        initializers.normal(0.0, INITIALIZER_RANGE), seed, optimizer,
        "resize_position_embeddings")
    return block


def _options(embedding: Embedding) -> F.TableOptions:
    return F.TableOptions(embedding.padding_idx, embedding.scale_grad_by_freq, embedding.sparse,
                          embedding.max_norm, embedding.norm_type)


def _bert_setup(block):
    """What a forward of ``block`` derives from its children's settings (kept by
    ``Module._derived``): the tables' options, whether one clips rows (``max_norm``), and
    ``(name, the module whose weight it is)`` for each parameter its backward reads (every
    child Embedding's table, in child order, and the LayerNorm weight)."""
    options = (_options(block.word_embeddings), _options(block.position_embeddings),
               _options(block.token_type_embeddings))
    watched = tuple((f"{name}.weight", child) for name, child in block._modules.items()
                    if isinstance(child, Embedding))
    return (options, any(opts.max_norm is not None for opts in options),
            watched + (("LayerNorm.weight", block.LayerNorm),))


def _forward_options(*tables: Embedding):
    """The tables' options for a forward call: None when no table clips (the fast path)."""
    if all(table.max_norm is None for table in tables):
        return None
    return tuple(_options(table) for table in tables)


def _snapshot(ids, name):
    """A private copy of an id argument, so a later backward sees what this forward saw."""
    if ids is None or isinstance(ids, (int, np.integer)):
        return ids
    if _checks.is_array(ids):
        return _device.copy(ids)
    view = _checks.host_view(ids, name)
    return np.array(ids if view is None else view, copy=True)


def _snapshots(past_length, **ids):
    """The id arguments of a forward, each :func:`_snapshot`, and its ``past_length``."""
    return {name: _snapshot(value, name) for name, value in ids.items()} | {
        "past_length": past_length}


def _bump_clipped(embeddings) -> None:
    """Mark the tables that ``max_norm`` may have clipped in place as changed."""
    for embedding in embeddings:
        if embedding.max_norm is not None:
            embedding.weight.bump_version()


def _wanted(params) -> tuple:
    """Which of ``params`` (None where the block has none) get a gradient."""
    wanted = []  # a loop, not a comprehension: no call of its own
    for p in params:
        wanted.append(p is not None and p.requires_grad)
    return tuple(wanted)


def _accumulate(params, grads) -> None:
    """Hand each computed gradient to its parameter (``grads`` None when none was wanted)."""
    for param, grad in zip(params, grads or (None,) * len(params), strict=True):
        if param is not None and grad is not None:
            param._accumulate_computed(grad)


# ------------------------------------------------------------------ checkpoints


def _prefix_hint(state_dict, prefix, suffix):
    found = [k for k in state_dict if isinstance(k, str) and k.endswith(suffix)]
    if not found:
        return ""
    other = found[0][: len(found[0]) - len(suffix)]
    return f"; the state dict has {found[0]!r}: pass prefix={other!r}"


def _host_array(value, name):
    """A state dict's value as a host array; a PyTorch bfloat16 tensor (which NumPy cannot
    view) as an ``ml_dtypes.bfloat16`` view of its bits, without a copy."""
    if str(getattr(value, "dtype", "")) == "torch.bfloat16":
        import torch

        value = value.detach().cpu().contiguous().view(torch.int16).numpy().view(
            _checks.bfloat16_dtype())
    return _device.to_host(_checks.as_array(value, name))


def _load_arrays(state_dict, prefix, suffixes, aliases=None, *, tables=(), keep_dtype=False):
    """The arrays at ``prefix + suffix`` and the dtype of the block's ``tables``.

    bfloat16 / float16 arrays are widened to float32 (exactly), except the
    ``tables`` with ``keep_dtype``. The tables must then share one dtype and
    the other arrays (the LayerNorm's) have the tables' arithmetic dtype:
    theirs, or float32 for 16-bit tables (a 16-bit LayerNorm array is widened).
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"state_dict: expected a mapping of names to arrays, got "
                        f"{type(state_dict).__name__}")
    if not isinstance(prefix, str):
        raise TypeError(f"prefix: expected a str, got {type(prefix).__name__}")
    aliases = aliases or {}
    arrays = {}
    for suffix in suffixes:
        key = prefix + suffix
        if key not in state_dict and prefix + aliases.get(suffix, "\0") in state_dict:
            key = prefix + aliases[suffix]
        if key not in state_dict:
            raise KeyError(f"state_dict: missing {prefix + suffix!r}"
                           f"{_prefix_hint(state_dict, prefix, suffix)}")
        value = _host_array(state_dict[key], f"state_dict[{key!r}]")
        if _checks.is_half_dtype(value.dtype) and not (keep_dtype and suffix in tables):
            value = value.astype(np.float32)  # exact
        if value.dtype not in _checks.FLOAT_DTYPES and not _checks.is_half_dtype(value.dtype):
            raise ValueError(f"state_dict[{key!r}]: expected a bfloat16, float16, float32 or "
                             f"float64 array, got dtype {value.dtype}")
        arrays[suffix] = (key, value)
    table_dtypes = {value.dtype for suffix, (_, value) in arrays.items() if suffix in tables}
    dtype = arrays[tables[0]][1].dtype if len(table_dtypes) == 1 else None
    if dtype is not None and _checks.is_half_dtype(dtype):
        # The LayerNorm computes in float32 beside 16-bit tables: float32 or 16-bit arrays
        # (widened above) are taken; a float64 one is not rounded silently.
        expected = {s: dtype if s in tables else np.dtype(np.float32) for s in arrays}
    else:
        expected = dict.fromkeys(arrays, dtype)
    if any(value.dtype != expected[s] for s, (_, value) in arrays.items()):
        listing = ", ".join(f"{key!r}: {value.dtype}" for key, value in arrays.values())
        raise ValueError(f"state_dict: mismatched dtypes ({listing}); the tables of the block "
                         f"must share one dtype, and the other tensors have it too (float32 "
                         f"beside bfloat16 / float16 tables kept with keep_dtype=True)")
    return arrays, dtype


def _check_shape(arrays, suffix, expected):
    key, value = arrays[suffix]
    ok = value.ndim == len(expected) and all(
        want is None or got == want for got, want in zip(value.shape, expected, strict=True))
    if not ok:
        want = "(" + ", ".join("?" if w is None else str(w) for w in expected) + \
               ("," if len(expected) == 1 else "") + ")"
        raise ValueError(f"state_dict[{key!r}]: expected shape {want}, got {value.shape}")
    return value


def _owned_weights(arrays, prefix, shapes):
    """The arrays of ``shapes`` (suffix: expected shape), checked in order, then refused
    when empty, as owning C-contiguous copies."""
    weights = {suffix: _check_shape(arrays, suffix, shape) for suffix, shape in shapes.items()}
    for name, value in weights.items():
        if value.size == 0:
            raise ValueError(f"state_dict[{prefix + name!r}]: is empty (shape {value.shape})")
    return {name: np.array(value, order="C", copy=True) for name, value in weights.items()}


def _block_dtypes(dtype):
    """``(table dtype, LayerNorm dtype)`` of a block made with ``dtype``: 16-bit tables
    compute in float32, so their block's LayerNorm parameters are float32."""
    dtype = _checks.check_table_dtype(dtype)
    return dtype, _checks.grad_dtype(dtype)


# ------------------------------------------------------------------ BERT


@_doc
class BertEmbeddings(Module):
    """BERT's embedding block: ``Dropout(LayerNorm(word + position + token_type))``.

    Hugging Face's ``BertEmbeddings`` with the same child names, so its
    parameters are ``word_embeddings.weight``, ``position_embeddings.weight``,
    ``token_type_embeddings.weight``, ``LayerNorm.weight`` and
    ``LayerNorm.bias``. Forward and backward are each one fused Numba kernel
    over the tokens (gather, sum, LayerNorm and dropout in cache), followed in
    the backward by deterministic scatters into the tables.

    Parameters
    ----------
    vocab_size : int
        Rows V of the word table.
    hidden_size : int
        Width D of every table.
    max_position_embeddings : int, default 512
        Rows of the position table.
    type_vocab_size : int, default 2
        Rows of the token-type table.
    pad_token_id : int or None, default 0
        Passed to the word table as ``padding_idx``: that row starts at zero
        and never receives a gradient (as in Hugging Face).
    layer_norm_eps : float, default 1e-12
    hidden_dropout_prob : float, default 0.1
    seed : int, numpy.random.Generator or None
        Seeds the table initialisation (N(0, 0.02**2), BERT's
        ``initializer_range``) and the dropout mask stream.
    dtype : float32, float64, bfloat16 or float16, default float32
        Dtype of the three tables. float32 / float64: the LayerNorm
        parameters, the output and the arithmetic have it too. bfloat16
        (``"bfloat16"``, ``ml_dtypes.bfloat16``, ``torch.bfloat16``) or
        float16 (``"float16"``, ``"half"``): the tables take half the memory
        (drawn in float32 and rounded to nearest even), the fused kernels
        widen their rows exactly to float32, and the LayerNorm parameters,
        the output and the gradients are float32: bit for bit the float32
        block run on the widened tables. The optimisers update such tables
        in float32 and store them back with stochastic rounding (see
        :mod:`numbapos.functional.half`). Both work on either device.
    {device}

    Attributes
    ----------
    word_embeddings, position_embeddings, token_type_embeddings : Embedding
    LayerNorm : LayerNorm
        Weight ones, bias zeros at initialisation.
    dropout : Dropout

    Notes
    -----
    The backward pass recomputes each token's row sum from the tables instead
    of caching an ``(N, L, D)`` array in the forward pass, so call
    :meth:`backward` before the tables change (before the optimiser step).
    The dropout mask is the ``dropout`` child's: a training forward uses its
    ``counter`` and advances it, exactly as ``self.dropout(y)`` would on the
    LayerNorm output, so the fused block and the unfused chain of children draw
    the same mask. A child ``nn.Embedding``'s ``max_norm``, ``sparse``,
    ``scale_grad_by_freq`` and ``padding_idx`` settings are honoured, and
    frozen parameters (``requires_grad=False``) get no gradient computed.

    ``to("bfloat16")`` / :meth:`bfloat16` / :meth:`half` round the three
    tables to 16 bits and leave the LayerNorm float32 (a float64 block is
    refused: call :meth:`float` first); :meth:`float` widens them back.
    """

    _fused_tables = True  # 16-bit tables: its LayerNorm must be float32 (see Module.to)

    def __init__(self, vocab_size, hidden_size, max_position_embeddings=512, type_vocab_size=2,
                 pad_token_id=0, layer_norm_eps=1e-12, hidden_dropout_prob=0.1, seed=None,
                 dtype=np.float32, device="cpu", *, _weights=None):
        super().__init__()
        vocab_size = _checks.check_int(vocab_size, "vocab_size", minimum=1)
        hidden_size = _checks.check_int(hidden_size, "hidden_size", minimum=1)
        max_position_embeddings = _checks.check_int(max_position_embeddings,
                                                    "max_position_embeddings", minimum=1)
        type_vocab_size = _checks.check_int(type_vocab_size, "type_vocab_size", minimum=1)
        pad_token_id = _checks.check_padding_idx(pad_token_id, vocab_size, "pad_token_id")
        dtype, ln_dtype = _block_dtypes(dtype)
        layer_norm_eps = _checks.check_eps(layer_norm_eps, "layer_norm_eps")
        hidden_dropout_prob = _checks.check_unit_interval(hidden_dropout_prob,
                                                          "hidden_dropout_prob")
        rng = _checks.as_rng(seed)
        table = _table_maker(hidden_size, dtype, rng, _weights)
        self.word_embeddings = table(vocab_size, "word_embeddings.weight", pad_token_id)
        self.position_embeddings = table(max_position_embeddings, "position_embeddings.weight")
        self.token_type_embeddings = table(type_vocab_size, "token_type_embeddings.weight")
        layer_norm = LayerNorm(hidden_size, eps=layer_norm_eps, dtype=ln_dtype)
        if _weights is not None:
            layer_norm.weight = Parameter(_weights["LayerNorm.weight"])
            layer_norm.bias = Parameter(_weights["LayerNorm.bias"])
        self.LayerNorm = layer_norm
        self.dropout = Dropout(hidden_dropout_prob, seed=rng)
        self.pad_token_id = pad_token_id
        self._place(device)

    # The sizes are the tables' (a resize changes them).
    vocab_size = property(lambda self: self.word_embeddings.num_embeddings)
    hidden_size = property(lambda self: self.word_embeddings.embedding_dim)
    max_position_embeddings = property(lambda self: self.position_embeddings.num_embeddings)
    type_vocab_size = property(lambda self: self.token_type_embeddings.num_embeddings)

    # -------------------------------------------------------------- contract

    def _arrays(self):
        ln = self.LayerNorm
        return (self.word_embeddings.weight.data, self.position_embeddings.weight.data,
                self.token_type_embeddings.weight.data,
                None if ln.weight is None else ln.weight.data,
                None if ln.bias is None else ln.bias.data)

    def _table_options(self):
        return self._derived("_bert_setup", _bert_setup)[0]

    @_doc
    def forward(self, input_ids, token_type_ids=None, position_ids=None, past_length=0,
                out=None):
        """Embed ``input_ids``; returns ``input_ids.shape + (hidden_size,)``.

        Parameters
        ----------
        {input_ids}
        token_type_ids : array_like of int, optional
            Segment ids in ``[0, type_vocab_size)``, shape of ``input_ids`` (or
            (L,) / (1, L), broadcast over the batch). Default: 0 everywhere.
        position_ids : array_like of int, optional
            Positions in ``[0, max_position_embeddings)``, same shapes allowed.
            Default: ``past_length .. past_length + L - 1`` for every row.
        past_length : int, default 0
            Tokens already processed (Hugging Face's
            ``past_key_values_length``); shifts the default positions only.
        out : ndarray, optional
            C-contiguous result buffer of the output's shape and dtype.

        Raises
        ------
        TypeError
            Non-integer ids.
        ValueError
            Ids not 1-D/2-D; ``token_type_ids`` / ``position_ids`` of another
            shape; ``past_length`` negative or ``past_length + L`` above
            ``max_position_embeddings``; a bad ``out``.
        IndexError
            An id, token type or position out of range (named, with the range).
        """
        word, position, token_type = (self.word_embeddings, self.position_embeddings,
                                      self.token_type_embeddings)
        options, clips, weights = self._derived("_bert_setup", _bert_setup)
        ln = self.LayerNorm
        gamma, beta = ln.weight, ln.bias
        data = word.weight.data
        arrays = (data, position.weight.data, token_type.weight.data,
                  None if gamma is None else gamma.data, None if beta is None else beta.data)
        dropout = self.dropout
        # On CUDA the forward draws the dropout counter itself, into its block of outputs.
        drop = dropout._draw(_device.device_of(data), defer=True)
        if out is None and type(input_ids) is np.ndarray:
            out = _output(self, input_ids, word, out)
        recording = _STATE.enabled  # self._recording()
        # A recorded forward on CUDA ids gets its ids snapshot in its record (in the
        # block of its output), written by the forward kernel as it reads the ids: in
        # the dtype it reads them in (as given; int64 where a table clips rows and the
        # ids are checked before the kernel; the forward checks that it is so).
        copy = None
        if recording and type(input_ids) is type(data) and type(data) is not np.ndarray:
            copy = _INT64 if clips else input_ids.dtype
        y, record = F.blocks._bert_forward_call(
            input_ids, *arrays, token_type_ids, position_ids, past_length, ln.eps,
            drop["p"], drop["seed"], drop["training"], drop["counter"], out, options, True,
            copy)
        # A counter the op drew lies in its record: the backward finds it there.
        drew = hasattr(drop["counter"], "draw_into")
        dropout._advance(drop, record if drew else None)
        if clips:
            _bump_clipped((word, position, token_type))
        if recording:
            ids = {"input_ids": None if copy is not None else _snapshot(input_ids, "input_ids"),
                   "token_type_ids": None if token_type_ids is None
                   else _snapshot(token_type_ids, "token_type_ids"),
                   "position_ids": None if position_ids is None
                   else _snapshot(position_ids, "position_ids"),
                   "past_length": past_length}
            # The backward recomputes each token's row sum from the tables and reads
            # the LayerNorm weight: they are watched, not copied.
            watched = []
            for name, owner in weights:
                param = owner.weight
                if param is not None:
                    watched.append((name, param, param.data, param._version))
            self._save_for_backward((ids, record, (y.shape[:-1], drew, copy), y.dtype, drop,
                                     options, tuple(watched)))
        return y

    @_doc
    def backward(self, grad_output):
        """Accumulate the gradients of the matching :meth:`forward`; returns None (ids have none).

        Fills ``word_embeddings.weight.grad`` (padding row excluded),
        ``position_embeddings.weight.grad`` (summed over the batch),
        ``token_type_embeddings.weight.grad``, ``LayerNorm.weight.grad`` and
        ``LayerNorm.bias.grad``; frozen parameters are skipped.

        Raises
        ------
        RuntimeError
            No recorded forward is left, or a table or the LayerNorm weight
            changed since it (the gradient would be computed from new values).
        {bad_grad_output}
        """
        ids, record, recorded, dtype, drop, options, watched = self._saved_context()
        ln = self.LayerNorm
        params = (self.word_embeddings.weight, self.position_embeddings.weight,
                  self.token_type_embeddings.weight, ln.weight, ln.bias)
        want = _wanted(params)
        word, position, token_type, gamma, beta = self._arrays()
        _checks.check_float_like(grad_output, "grad_output",
                                 tuple(recorded[0]) + (word.shape[1],), dtype,
                                 "the shape of the matching forward's output",
                                 "that of the forward's output")
        self._check_unchanged(watched)
        grads = None
        if any(want):
            grads = F.blocks._bert_backward_call(
                (grad_output, ids["input_ids"], word, position, token_type, record, None,
                 gamma, beta),
                dict(token_type_ids=ids["token_type_ids"], position_ids=ids["position_ids"],
                     past_length=ids["past_length"], padding_idx=None, sparse=False,
                     table_options=options, output_mask=want, recorded=recorded, **drop))
        self._release()
        _accumulate(params, grads)
        return None

    # -------------------------------------------------------------- checkpoints

    @classmethod
    def from_hf_state_dict(cls, state_dict, prefix="embeddings.", *, pad_token_id=0,
                           layer_norm_eps=1e-12, hidden_dropout_prob=0.1, seed=None,
                           keep_dtype=False):
        """Build the block from a Hugging Face BERT state dict (NumPy arrays).

        Reads ``{prefix}word_embeddings.weight``,
        ``{prefix}position_embeddings.weight``,
        ``{prefix}token_type_embeddings.weight``, ``{prefix}LayerNorm.weight``
        and ``{prefix}LayerNorm.bias`` (the TensorFlow-era names
        ``LayerNorm.gamma`` / ``LayerNorm.beta`` are accepted too, as
        ``transformers`` does) and infers every size from them. Other entries,
        such as the encoder's weights or the ``embeddings.position_ids``
        buffer, are ignored, so a whole-model checkpoint loads directly::

            state = numbapos.io.load_state("bert-base-uncased/model.safetensors")
            emb = BertEmbeddings.from_hf_state_dict(state)              # BertModel
            emb = BertEmbeddings.from_hf_state_dict(state, "bert.embeddings.")  # *For* heads

        A bfloat16 checkpoint keeps half the table memory when both steps
        keep its dtype::

            state = numbapos.io.load_state(path, keep_dtype=True)
            emb = BertEmbeddings.from_hf_state_dict(state, keep_dtype=True)

        Parameters
        ----------
        state_dict : mapping of str to array_like
            E.g. from :func:`numbapos.io.load_state`, or a PyTorch
            ``state_dict()`` directly (its CPU tensors are viewed as NumPy
            arrays; anything NumPy can view works).
        prefix : str, default "embeddings."
            Prepended to every name (``"bert.embeddings."`` for task models).
        pad_token_id, layer_norm_eps, hidden_dropout_prob, seed
            Not stored in the weights: as for :class:`BertEmbeddings`
            (``seed`` only seeds the dropout stream here).
        keep_dtype : bool, default False
            Keep bfloat16 / float16 tables as such (half the memory of
            float32; see ``dtype`` of :class:`BertEmbeddings`), as
            :func:`numbapos.io.load_state`'s ``keep_dtype`` keeps them in the
            state dict. The LayerNorm parameters are float32 either way
            (widened exactly when stored in 16 bits).

        Returns
        -------
        BertEmbeddings
            Owning copies of the arrays. bfloat16 / float16 weights are
            widened to float32 (exactly) unless ``keep_dtype``; float32 and
            float64 are kept.

        Raises
        ------
        KeyError
            A required tensor is missing (named; a prefix that would match is
            suggested).
        TypeError
            ``state_dict`` not a mapping, or a value that is not an array.
        ValueError
            A tensor with the wrong number of dimensions or a hidden size that
            disagrees with the word table, a non-float dtype, or tensors of
            different dtypes (the LayerNorm may be float32 beside 16-bit
            tables).
        """
        tables = ("word_embeddings.weight", "position_embeddings.weight",
                  "token_type_embeddings.weight")
        arrays, dtype = _load_arrays(
            state_dict, prefix, tables + ("LayerNorm.weight", "LayerNorm.bias"),
            aliases={"LayerNorm.weight": "LayerNorm.gamma", "LayerNorm.bias": "LayerNorm.beta"},
            tables=tables, keep_dtype=keep_dtype)
        dim = _check_shape(arrays, "word_embeddings.weight", (None, None)).shape[1]
        shapes = dict.fromkeys(tables, (None, dim))
        shapes |= {"LayerNorm.weight": (dim,), "LayerNorm.bias": (dim,)}
        weights = _owned_weights(arrays, prefix, shapes)
        return cls(weights["word_embeddings.weight"].shape[0], dim,
                   weights["position_embeddings.weight"].shape[0],
                   weights["token_type_embeddings.weight"].shape[0], pad_token_id=pad_token_id,
                   layer_norm_eps=layer_norm_eps, hidden_dropout_prob=hidden_dropout_prob,
                   seed=seed, dtype=dtype, _weights=weights)

    @_doc
    def resize_position_embeddings(self, new_len, mode="linear", *, num_prefix_rows=0,
                                   optimizer=None, seed=None):
        """Resize the position table to ``new_len`` rows, in place (longer contexts).

        The rows come from :func:`numbapos.functional.resize_pos_table`; with
        ``mode="init"`` new rows are drawn from N(0, 0.02^2) as the block
        initialises its tables. The table's :class:`Parameter` stays (optimisers
        keep it), with the new table as ``data``, no gradient, a new version.

        Parameters
        ----------
        new_len : int
        mode : {"linear", "copy", "repeat_last", "init"}, default "linear"
            ``"copy"`` with ``num_prefix_rows=2`` is Longformer's conversion of
            RoBERTa's table.
        num_prefix_rows : int, default 0
        optimizer : numbapos.optim.Optimizer, optional
            Optimiser of the table: its per-row state keeps the rows whose values
            are kept (all old rows, but only the prefix for ``"linear"``) and
            starts the others as a fresh parameter's state starts; step counts
            are kept. Without it, an optimiser that has state for the table
            refuses its next step (the shape changed).
        {resize_seed}

        Raises
        ------
        TypeError, ValueError
            As for :func:`~numbapos.functional.resize_pos_table`; an optimiser
            that does not hold the table.
        {pending_forwards}
        """
        return _resize_table(self, self.position_embeddings, new_len, mode, num_prefix_rows,
                             optimizer, seed)

    def extra_repr(self) -> str:
        return (f"vocab_size={self.vocab_size}, hidden_size={self.hidden_size}, "
                f"max_position_embeddings={self.max_position_embeddings}, "
                f"type_vocab_size={self.type_vocab_size}, pad_token_id={self.pad_token_id}")


# ------------------------------------------------------------------ GPT-2


@_doc
class GPT2Embeddings(Module):
    """GPT-2's input embeddings: ``Dropout(wte[input_ids] + wpe[positions])``.

    The embedding part of Hugging Face's ``GPT2Model``, with its names:
    parameters ``wte.weight`` and ``wpe.weight``, dropout child ``drop``. The
    forward pass is one fused Numba kernel (two row gathers, the sum and the
    dropout mask per token); the backward pass regenerates the mask and
    scatters deterministically into both tables.

    Parameters
    ----------
    vocab_size : int
        Rows V of ``wte``.
    n_positions : int
        Rows of ``wpe`` (the longest context).
    n_embd : int
        Width D of both tables.
    embd_pdrop : float, default 0.1
        Dropout probability.
    seed : int, numpy.random.Generator or None
        Seeds the initialisation (N(0, 0.02**2)) and the dropout stream.
    dtype : float32, float64, bfloat16 or float16, default float32
        Dtype of both tables; the output has it for float32 / float64
        tables, and is float32 for bfloat16 / float16 ones (half the table
        memory; rows widened exactly in the fused kernel, float32 gradients,
        as for :class:`BertEmbeddings`).
    {device}

    Attributes
    ----------
    wte, wpe : Embedding
    drop : Dropout

    Notes
    -----
    With ``attention_mask`` the positions follow Hugging Face's generation
    convention (:func:`numbapos.functional.positions_from_attention_mask`):
    ``cumsum(mask) - 1`` with padding set to 1, last L columns, so left- and
    right-padded batches give each real token the same position.

    ``to("bfloat16")`` / :meth:`bfloat16` / :meth:`half` round both tables to
    16 bits; :meth:`float` widens them back.
    """

    def __init__(self, vocab_size, n_positions, n_embd, embd_pdrop=0.1, seed=None,
                 dtype=np.float32, device="cpu", *, _weights=None):
        super().__init__()
        vocab_size = _checks.check_int(vocab_size, "vocab_size", minimum=1)
        n_positions = _checks.check_int(n_positions, "n_positions", minimum=1)
        n_embd = _checks.check_int(n_embd, "n_embd", minimum=1)
        dtype = _checks.check_table_dtype(dtype)
        embd_pdrop = _checks.check_unit_interval(embd_pdrop, "embd_pdrop")
        rng = _checks.as_rng(seed)
        table = _table_maker(n_embd, dtype, rng, _weights)
        self.wte = table(vocab_size, "wte.weight")
        self.wpe = table(n_positions, "wpe.weight")
        self.drop = Dropout(embd_pdrop, seed=rng)
        self._place(device)

    vocab_size = property(lambda self: self.wte.num_embeddings)
    n_positions = property(lambda self: self.wpe.num_embeddings)
    n_embd = property(lambda self: self.wte.embedding_dim)

    @_doc
    def forward(self, input_ids, past_length=0, position_ids=None, attention_mask=None,
                out=None):
        """Embed ``input_ids``; returns ``input_ids.shape + (n_embd,)``.

        Parameters
        ----------
        {input_ids}
        past_length : int, default 0
            Tokens already in the key/value cache: default positions are
            ``past_length .. past_length + L - 1``.
        position_ids : array_like of int, optional
            Explicit positions (shape of ``input_ids``, or (L,) / (1, L)); take
            precedence over ``attention_mask`` (which must still have its shape).
        attention_mask : array_like of bool or int, optional
            Shape ``(N, past_length + L)``, 1 at real tokens and 0 at padding;
            positions then follow Hugging Face's generation convention.
        out : ndarray, optional
            C-contiguous result buffer.

        Raises
        ------
        TypeError
            Non-integer ids or a non-bool/integer mask.
        ValueError
            Ids not 1-D/2-D; ``position_ids`` / ``attention_mask`` of the wrong
            shape, a mask with values other than 0/1, positions reaching
            ``n_positions``, a negative ``past_length``; a bad ``out``.
        IndexError
            An id or explicit position out of range (named, with the range).
        """
        forward_options = _forward_options(self.wte, self.wpe)
        drop = self.drop._draw(self.device)
        y = F.gpt2_embeddings(input_ids, self.wte.weight.data, self.wpe.weight.data,
                              past_length=past_length, position_ids=position_ids,
                              attention_mask=attention_mask,
                              out=_output(self, input_ids, self.wte, out),
                              table_options=forward_options, **drop)
        self.drop._advance(drop)
        if forward_options is not None:
            _bump_clipped((self.wte, self.wpe))
        if self._recording():
            ids = _snapshots(past_length, input_ids=input_ids, position_ids=position_ids,
                             attention_mask=attention_mask)
            options = forward_options or (_options(self.wte), _options(self.wpe))
            self._save_for_backward((ids, tuple(y.shape), drop, options))
        return y

    @_doc
    def backward(self, grad_output):
        """Accumulate ``wte`` / ``wpe`` gradients of the matching :meth:`forward`; returns None.

        The position gradient is summed over the batch; frozen tables are
        skipped. The backward does not read the tables, so they may change
        in between.

        Raises
        ------
        {no_forward}
        {bad_grad_output}
        """
        ids, shape, drop, options = self._saved_context()
        params = (self.wte.weight, self.wpe.weight)
        want = _wanted(params)
        wte, wpe = self.wte.weight.data, self.wpe.weight.data
        grad_output = _checks.check_float_like(
            grad_output, "grad_output", shape, _checks.grad_dtype(wte.dtype), "the shape of the "
            "matching forward's output", "that of the forward's output")
        grads = None
        if any(want):
            grads = F.gpt2_embeddings_backward(
                grad_output, ids["input_ids"], wte.shape[0], wpe.shape[0],
                past_length=ids["past_length"], position_ids=ids["position_ids"],
                attention_mask=ids["attention_mask"], table_options=options, output_mask=want,
                **drop)
        self._release()
        _accumulate(params, grads)
        return None

    @classmethod
    def from_hf_state_dict(cls, state_dict, prefix="", *, embd_pdrop=0.1, seed=None,
                           keep_dtype=False):
        """Build the block from a Hugging Face GPT-2 state dict (NumPy arrays).

        Reads ``{prefix}wte.weight`` and ``{prefix}wpe.weight``, infers the
        sizes and ignores every other entry. ``GPT2Model`` checkpoints (such as
        ``gpt2/model.safetensors``) use no prefix; ``GPT2LMHeadModel`` state
        dicts saved from PyTorch use ``"transformer."``::

            state = numbapos.io.load_state("gpt2/model.safetensors")
            emb = GPT2Embeddings.from_hf_state_dict(state)
            emb = GPT2Embeddings.from_hf_state_dict(lm_state, prefix="transformer.")

        Parameters
        ----------
        state_dict : mapping of str to array_like
            As for :meth:`BertEmbeddings.from_hf_state_dict`.
        prefix : str, default ""
        embd_pdrop, seed
            As for :class:`GPT2Embeddings` (``seed`` seeds the dropout stream).
        keep_dtype : bool, default False
            Keep bfloat16 / float16 tables as such (half the memory), as for
            :meth:`BertEmbeddings.from_hf_state_dict`.

        Returns
        -------
        GPT2Embeddings
            Owning copies of the arrays; bfloat16 / float16 are widened to
            float32 (exactly) unless ``keep_dtype``.

        Raises
        ------
        KeyError
            ``wte.weight`` or ``wpe.weight`` missing (a matching prefix is
            suggested when the state dict has one).
        TypeError
            ``state_dict`` not a mapping, or a value that is not an array.
        ValueError
            A tensor that is not 2-D, widths that differ, a non-float dtype,
            or the two tensors of different dtypes.
        """
        names = ("wte.weight", "wpe.weight")
        arrays, dtype = _load_arrays(state_dict, prefix, names, tables=names,
                                     keep_dtype=keep_dtype)
        dim = _check_shape(arrays, "wte.weight", (None, None)).shape[1]
        weights = _owned_weights(arrays, prefix, dict.fromkeys(names, (None, dim)))
        wte, wpe = weights["wte.weight"], weights["wpe.weight"]
        return cls(wte.shape[0], wpe.shape[0], dim, embd_pdrop=embd_pdrop, seed=seed,
                   dtype=dtype, _weights=weights)

    def resize_position_embeddings(self, new_len, mode="linear", *, num_prefix_rows=0,
                                   optimizer=None, seed=None):
        return _resize_table(self, self.wpe, new_len, mode, num_prefix_rows, optimizer, seed)

    resize_position_embeddings.__doc__ = BertEmbeddings.resize_position_embeddings.__doc__

    def extra_repr(self) -> str:
        return f"vocab_size={self.vocab_size}, n_positions={self.n_positions}, n_embd={self.n_embd}"
