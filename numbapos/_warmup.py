"""Compile the CPU kernels into Numba's on-disk cache before the first real call.

Every CPU kernel is ``@njit(cache=True)``: compiled on its first call for the
argument types it gets (float32 or float64 data, int32 or int64 indices), then
saved to the cache and loaded, not compiled, by later processes. :func:`warmup`
makes those first calls on tiny inputs through the public ops and modules, so
a Docker image or a CI cache can carry the machine code. The ops it drives are
the table :data:`CASES`: a new op gets one entry there.

The CPU launchers choose a serial or a parallel body by the size of the work
(:mod:`numbapos.config`'s ``parallel_min_elements``, read at each call). Tiny
inputs reach only the serial bodies, so each case runs twice: once as is and
once under ``config.override(parallel_min_elements=0)``, which sends the same
inputs to the parallel bodies. The override ends with the case; numbapos work
in other threads during a warm-up picks its bodies by it meanwhile (the same
results, at another speed).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

try:
    import fcntl
except ImportError:  # Windows: warm-ups run in one process
    fcntl = None

from . import _checks, _device, _numba_internals, config, nn, optim
from . import functional as F
from ._docs import fill_doc
from ._grad_mode import no_grad
from .sparse import SparseRows

DTYPES = ("float32", "float64")
INDEX_DTYPES = ("int32", "int64")
# What a warm-up compiles unless told otherwise: the dtypes most programs run
# (float32 tables, NumPy's and PyTorch's int64 ids); the others are opt-in.
DEFAULT_DTYPES = ("float32",)
DEFAULT_INDEX_DTYPES = ("int64",)
#: Worker processes a warm-up starts at most by default (each up to 1 GB while compiling).
MAX_PROCESSES = 4

# Tiny shapes: a batch of 2 sequences of 4 tokens, tables of 8 rows of 4 features.
_IDS = [[1, 2, 2, 0], [3, 1, 0, 0]]
_ROWS, _DIM = 8, 4


def _ids(index_dtype) -> np.ndarray:
    return np.array(_IDS, dtype=index_dtype)


def _activation(dtype, shape=(2, 4, _DIM)) -> np.ndarray:
    return np.random.default_rng(0).normal(size=shape).astype(dtype)


def _train(module, *inputs, **kwargs) -> None:
    """One forward and backward of ``module`` (a gradient of ones)."""
    y = module(*inputs, **kwargs)
    module.backward(np.ones_like(y))


def _embedding(dtype, index_dtype) -> None:
    ids = _ids(index_dtype)
    for sparse in (False, True):
        emb = nn.Embedding(_ROWS, _DIM, padding_idx=0, sparse=sparse, dtype=dtype, seed=0)
        _train(emb, ids)
        emb(ids, out=np.empty(ids.shape + (_DIM,), dtype))
        F.embedding_backward(np.ones(ids.shape + (_DIM,), dtype), ids, _ROWS,
                             scale_grad_by_freq=True, sparse=sparse)
    F.embedding(ids, emb.weight.data)  # small lookups without padding: one checked pass
    # Lookups whose output outgrows the cache write it with non-temporal stores
    # (config's stream_min_bytes): that variant too, on a tiny output.
    with config.override(stream_min_bytes=0):
        F.embedding(ids, emb.weight.data, out=np.empty(ids.shape + (_DIM,), dtype))


def _bag(dtype, index_dtype) -> None:
    # embedding_bag in every mode, 1-D with offsets and 2-D, with and without padding,
    # weighted sums, max_norm; dense and sparse table gradients, the weights' gradient.
    ids = _ids(index_dtype)
    flat, offsets = ids.reshape(-1), np.array([0, 3, 3], dtype=index_dtype)
    weight = _activation(dtype, (_ROWS, _DIM))
    grad = np.ones((3, _DIM), dtype)
    psw = np.ones(flat.shape, dtype)
    for pad in (None, 0):
        for mode in ("sum", "mean", "max"):
            F.embedding_bag(flat, weight, offsets, mode=mode, padding_idx=pad)
            F.embedding_bag(ids, weight, mode=mode, padding_idx=pad)
            for sparse in (False, True):
                F.embedding_bag_backward(grad, flat, weight, offsets, mode=mode, sparse=sparse,
                                         padding_idx=pad, scale_grad_by_freq=mode != "max")
                F.embedding_bag_backward(grad, flat, weight, offsets, mode=mode, sparse=sparse,
                                         padding_idx=pad)
        F.embedding_bag(flat, weight, offsets, mode="sum", per_sample_weights=psw,
                        padding_idx=pad)
        F.embedding_bag_backward(grad, flat, weight, offsets, mode="sum",
                                 per_sample_weights=psw, padding_idx=pad)
    F.embedding_bag(flat, weight.copy(), offsets, max_norm=1.0)
    _train(nn.EmbeddingBag(_ROWS, _DIM, mode="sum", dtype=dtype, seed=0), flat, offsets)


def _collection(dtype, index_dtype) -> None:
    # A collection of sum / mean / max tables (a table reading two features, a feature read
    # by two tables): forward, dense and sparse table gradients, weighted sums and the
    # weights' gradient, the module's forward and backward.
    from .functional.collection import (
        CollectionLayout,
        embedding_bag_collection,
        embedding_bag_collection_backward,
    )
    from .jagged import KeyedJaggedArray
    from .nn.collection import EmbeddingBagCollection, EmbeddingBagConfig

    values = np.array([1, 2, 0, 3, 1, 2], dtype=index_dtype)
    lengths = np.array([2, 0, 1, 1, 1, 1], dtype=index_dtype)
    kjt = KeyedJaggedArray(["a", "b", "c"], values, lengths=lengths,
                           weights=np.ones(values.shape, dtype))
    for weighted, poolings in ((False, ("sum", "mean", "max")), (True, ("sum",) * 3)):
        layout = CollectionLayout([("t0", _ROWS, _DIM, poolings[0], ["a", "b"]),
                                   ("t1", _ROWS, 3, poolings[1], ["b", "c"]),
                                   ("t2", _ROWS, 2, poolings[2], ["c"])], weighted)
        flat = _activation(dtype, (layout.num_elements,))
        out = embedding_bag_collection(kjt, flat, layout)
        for sparse in (False, True):
            embedding_bag_collection_backward(np.ones_like(out), kjt, flat, layout,
                                              sparse=sparse)
    bad = KeyedJaggedArray(["a", "b", "c"], np.array([_ROWS, 0, 0, 0, 0, 0], index_dtype),
                           lengths=lengths, weights=np.ones(values.shape, dtype))
    try:  # the search for the first bad id runs only on a bad one
        embedding_bag_collection(bad, flat, layout)
    except IndexError:
        pass
    ebc = EmbeddingBagCollection([EmbeddingBagConfig("t0", _ROWS, _DIM, ["a", "b", "c"])],
                                 dtype=dtype, seed=0)
    ebc.backward(np.ones_like(ebc(kjt).values()))


def _renorm(dtype, index_dtype) -> None:
    ids = _ids(index_dtype)
    table = _activation(dtype, (_ROWS, _DIM))
    for norm_type in (2.0, 1.0, float("inf")):
        F.embedding(ids, table, max_norm=0.5, norm_type=norm_type)


def _padding(dtype, index_dtype) -> None:
    ids = _ids(index_dtype)
    F.padding_mask(ids, padding_idx=0)
    F.positions_from_padding(ids, padding_idx=0)
    F.positions_from_attention_mask(ids != 0)


def _positional(dtype, index_dtype) -> None:
    x = _activation(dtype)
    learned = nn.LearnedPosEmbedding(8, _DIM, dropout=0.1, seed=0, dtype=dtype)
    _train(learned, x)
    _train(learned, x, position_ids=np.array([[0, 1, 2, 3], [2, 3, 4, 5]], index_dtype))
    _train(nn.SinusoidalPosEmbedding(), x)
    for kind in ("learnable_addition", "learnable_mult_addition", "transformers"):
        _train(nn.PositionalEmbedding(8, _DIM, type=kind, seed=0, dtype=dtype), x)


def _rotary(dtype, index_dtype) -> None:
    q = _activation(dtype, (2, 2, 4, _DIM))
    k = _activation(dtype, (2, 1, 4, _DIM))
    rope = nn.RotaryEmbedding(_DIM)
    _train_pair(rope, q, k, offset=3)
    _train_pair(rope, q, k, position_ids=np.array([[0, 1, 2, 3], [5, 6, 7, 8]], index_dtype))
    rope = nn.RotaryEmbedding(_DIM, layout="interleaved", head_axis=2, float32_angle=True)
    _train_pair(rope, q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3))  # (B, L, H, D)
    inv_freq, _ = F.rope_frequencies(_DIM, partial_rotary_factor=0.5)
    F.apply_rotary(q, 0, inv_freq, out=q.copy(), partial_rotary_factor=0.5)
    x = q.copy()
    F.apply_rotary(x, 0, inv_freq, out=x, partial_rotary_factor=0.5)  # in place
    # Outputs larger than the cache are written with non-temporal stores: that variant too.
    with config.override(stream_min_bytes=0):
        F.apply_rotary(_activation(dtype, (1, 1, 16, _DIM)), 0, inv_freq,  # 16-row tiles
                       partial_rotary_factor=0.5)
    rope = nn.RotaryEmbedding(_DIM, mrope_section=(1, 1, 0))  # multimodal: 3 position streams
    _train_pair(rope, q, k, position_ids=np.array([[[0, 1, 2, 3]], [[0, 1, 1, 2]],
                                                   [[0, 0, 1, 1]]], index_dtype))
    for half in ("bfloat16", "float16"):  # 16-bit q and k: the kernels read their bits
        dt = _checks.check_table_dtype(half)
        _train_pair(nn.RotaryEmbedding(_DIM), q.astype(dt), k.astype(dt), offset=3)
        x = q.astype(dt)
        F.apply_rotary(x, 0, inv_freq, out=x, partial_rotary_factor=0.5)  # in place
        with config.override(stream_min_bytes=0):
            F.apply_rotary(_activation(dtype, (1, 1, 16, _DIM)).astype(dt), 0, inv_freq,
                           partial_rotary_factor=0.5)


def _train_pair(module, q, k, **kwargs) -> None:
    """One forward and backward of a module taking and returning (q, k)."""
    q_rot, k_rot = module(q, k, **kwargs)
    module.backward(np.ones_like(q_rot), np.ones_like(k_rot))


def _rope_index(dtype, index_dtype) -> None:
    # <|vision_start|> 1, image 3, video 4, <|vision_end|> 2: one image, one video
    ids = np.array([[5, 1, 3, 3, 2, 6, 1, 4, 4, 4, 4, 2, 7]], index_dtype)
    grids = dict(image_grid_thw=np.array([[1, 2, 4]]), video_grid_thw=np.array([[2, 2, 4]]))
    tokens = dict(spatial_merge_size=2, image_token_id=3, video_token_id=4,
                  vision_start_token_id=1)
    for mask in (None, np.ones(ids.shape, np.int64)):
        F.rope_index(ids, attention_mask=mask, **tokens, **grids)  # Qwen2-VL
        F.rope_index(ids, attention_mask=mask, second_per_grid_ts=np.array([0.5], np.float32),
                     tokens_per_second=2, **tokens, **grids)  # Qwen2.5-VL


def _alibi(dtype, index_dtype) -> None:
    scores = _activation(dtype, (2, 2, 3, 4))
    mask = np.array([[0, 1, 1, 1], [1, 1, 1, 1]])
    for mode in ("symmetric", "mpt", "bloom"):
        alibi = nn.ALiBi(2, mode=mode, trainable=True, dtype=dtype)
        _train(alibi, scores, attention_mask=mask if mode == "bloom" else None)
        F.alibi_bias(F.alibi_slopes(2, dtype=dtype), 3, 4, mode=mode)


def _relative(dtype, index_dtype) -> None:
    rel = np.array([-200, -9, -1, 0, 2, 130], index_dtype)
    F.relative_position_bucket(rel)
    F.log_bucket_position(rel, 8, 32)
    F.relative_positions(3, 4, 8, 32)
    bias = nn.RelativePositionBias(2, num_buckets=8, max_distance=16, dtype=dtype)
    _train(bias, 3, 4, offset=1)
    scores = _activation(dtype, (2, 2, 3, 4))
    bias.add_(scores)
    bias.backward(np.ones_like(scores))


def _resize(dtype, index_dtype) -> None:
    table = _activation(dtype, (_ROWS, _DIM))
    for mode in ("linear", "copy", "repeat_last"):
        F.resize_pos_table(table, 12, mode=mode, num_prefix_rows=1)
    F.resize_pos_table(table, 10, mode="init", fill=table[:2])
    learned = nn.LearnedPosEmbedding(_ROWS, _DIM, seed=0, dtype=dtype)
    _train(learned, _activation(dtype), position_ids=np.array([0.5, 1.0, 2.25, 7.0]))


def _init(dtype, index_dtype) -> None:
    table = np.empty((_ROWS, _DIM), dtype)
    F.keyed_normal_(table, seed=0)
    F.keyed_normal_(table[:2], seed=0, rows=np.array([3, 7], index_dtype))


def _sinusoid(dtype, index_dtype) -> None:
    F.sinusoidal_pos_embedding(4, 6, dtype=dtype)
    F.sinusoidal_pos_embedding(3, 5, dtype=dtype, offset=2)
    F.sinusoidal_pos_embedding(3, 5, dtype=dtype, layout="concat")
    F.timestep_embedding(np.array([0.0, 1.5, 999.0]), 7, dtype=dtype, flip_sin_to_cos=True)


def _dropout(dtype, index_dtype) -> None:
    _train(nn.Dropout(0.5, seed=0), _activation(dtype))
    F.dropout_mask((2, 3), 0.5, seed=0)


def _layer_norm(dtype, index_dtype) -> None:
    x = _activation(dtype)
    _train(nn.LayerNorm(_DIM, dtype=dtype), x)
    _train(nn.LayerNorm(_DIM, elementwise_affine=False, dtype=dtype), x)


def _bert(dtype, index_dtype) -> None:
    ids = _ids(index_dtype)
    block = nn.BertEmbeddings(_ROWS, _DIM, 8, 2, seed=0, dtype=dtype)
    _train(block, ids, token_type_ids=(ids % 2).astype(index_dtype))
    block.eval()
    with no_grad():
        block(ids)


def _gpt2(dtype, index_dtype) -> None:
    ids = _ids(index_dtype)
    block = nn.GPT2Embeddings(_ROWS, 8, _DIM, seed=0, dtype=dtype)
    _train(block, ids)
    _train(block, ids, attention_mask=ids != 0)
    block.eval()
    with no_grad():
        block(np.array([[3]], index_dtype), past_length=3)  # one token of generation


def _sgd(dtype, index_dtype, variants=None) -> None:
    rows = np.array([1, 3], index_dtype)
    # The sparse kernels are compiled per variant (with or without momentum, the
    # usual options or any others): each of the four is reached by this group and
    # the next (with weight decay, compiled as long as the first two together).
    for options in _SGD_VARIANTS[:2] if variants is None else variants:
        dense = nn.Parameter(np.zeros((_ROWS, _DIM), dtype))
        sparse = nn.Parameter(np.zeros((_ROWS, _DIM), dtype))
        opt = optim.SGD([dense, sparse], lr=0.1, **options)
        for _ in range(2):  # the first step starts the momentum, the second uses it
            dense.grad = np.ones((_ROWS, _DIM), dtype)
            sparse.grad = SparseRows(rows, np.ones((2, _DIM), dtype), _ROWS)
            opt.step()
        emb = nn.Embedding(_ROWS, _DIM, sparse=True, dtype=dtype, seed=0)
        optim.SGD(emb.parameters(), lr=0.1, **options).fuse_with_backward()
        for _ in range(2):  # the update fused with the sparse backward
            _train(emb, _ids(index_dtype))


_SGD_VARIANTS = ({}, {"momentum": 0.9}, {"weight_decay": 0.01},
                 {"momentum": 0.9, "nesterov": True, "weight_decay": 0.01})


def _sgd_weight_decay(dtype, index_dtype) -> None:
    _sgd(dtype, index_dtype, _SGD_VARIANTS[2:])


# The optimisers besides SGD, with the options that reach other kernels, and whether
# they take SparseRows gradients too. A numbapos without one skips it.
_OPTIMISERS = (
    ("Adam", {}, True),
    ("Adam", {"amsgrad": True, "weight_decay": 0.01}, False),
    ("AdamW", {}, True),
    ("Adagrad", {}, True),
)
# FBGEMM's row-wise Adagrad: its four-row kernels take 40 % of a float32 warm-up's
# compilation (about 60 of 146 s), for an optimiser few users run: opt-in.
_ROWWISE = (
    ("RowWiseAdagrad", {}, True),
    ("RowWiseAdagrad", {"weight_decay": 0.01, "weight_decay_mode": "l2"}, True),
)


def _optimisers(dtype, index_dtype, optimisers=_OPTIMISERS) -> None:
    rows = np.array([1, 3], index_dtype)
    for name, options, takes_sparse in optimisers:
        kind = getattr(optim, name, None)
        if kind is None:
            continue
        dense = nn.Parameter(np.zeros((_ROWS, _DIM), dtype))
        sparse = nn.Parameter(np.zeros((_ROWS, _DIM), dtype))
        opt = kind([dense, sparse] if takes_sparse else [dense], **options)
        for _ in range(2):
            dense.grad = np.ones((_ROWS, _DIM), dtype)
            sparse.grad = SparseRows(rows, np.ones((2, _DIM), dtype), _ROWS)
            opt.step()
        if takes_sparse:
            emb = nn.Embedding(_ROWS, _DIM, sparse=True, dtype=dtype, seed=0)
            kind(emb.parameters(), **options).fuse_with_backward()
            for _ in range(2):  # the update fused with the sparse backward
                _train(emb, _ids(index_dtype))


def _rowwise_adagrad(dtype, index_dtype) -> None:
    _optimisers(dtype, index_dtype, _ROWWISE)


def _quantized(dtype, index_dtype) -> None:
    ids = _ids(index_dtype)
    table = _activation(dtype, (_ROWS, _DIM + 1))  # an odd D: the 4-bit tail column too
    for bits in (8, 4):
        module = nn.QuantizedEmbedding.from_float(table, bits=bits, padding_idx=0)
        module(ids)
        module(ids, out=np.empty(ids.shape + (_DIM + 1,), np.float32))
        module.dequantize()


def _quantized_bag(dtype, index_dtype) -> None:
    # Pooled int8 / int4 lookups: every mode, 1-D with offsets and 2-D, padding, weighted sums.
    ids = _ids(index_dtype)
    flat, offsets = ids.reshape(-1), np.array([0, 3, 3], dtype=index_dtype)
    table = _activation(dtype, (_ROWS, _DIM + 1))  # an odd D: the 4-bit tail column too
    psw = np.ones(flat.shape, np.float32)
    for bits in (8, 4):
        for mode in ("sum", "mean", "max"):
            bag = nn.QuantizedEmbeddingBag.from_float(table, bits=bits, mode=mode,
                                                      padding_idx=0)
            bag(flat, offsets)
            bag(ids)
        nn.QuantizedEmbeddingBag.from_float(table, bits=bits, mode="sum")(flat, offsets, psw)


def _half(dtype, index_dtype) -> None:
    # bfloat16 / float16 tables: lookups to float32 and to the table's dtype, max-norm,
    # a dense SGD step and the sparse steps of every optimiser (fused with the lookup's
    # gradient, and from summed rows) written back with stochastic rounding.
    ids = _ids(index_dtype)
    for half in ("bfloat16", "float16"):
        emb = nn.Embedding(_ROWS, _DIM, dtype=half, seed=0)
        opt = optim.SGD(emb.parameters(), lr=0.1, momentum=0.9)
        _train(emb, ids)
        opt.step()
        for make in (lambda p: optim.SGD(p, lr=0.1, momentum=0.9), optim.Adam, optim.Adagrad,
                     optim.RowWiseAdagrad):
            emb = nn.Embedding(_ROWS, _DIM, dtype=half, sparse=True, seed=0)
            opt = make(emb.parameters())
            for summed in (False, True):
                _train(emb, ids)
                if summed:
                    emb.weight.grad.materialize()
                opt.step()
                emb.zero_grad()
        emb = nn.Embedding(_ROWS, _DIM, dtype=half, seed=0, max_norm=1.0, out_dtype=half)
        emb(ids)
        F.widen_table(emb.weight.data, rows=np.arange(2))  # the functional op's sparse form
        # The BERT / GPT-2 blocks' fused kernels on 16-bit tables.
        _bert(half, index_dtype)
        _gpt2(half, index_dtype)


class Case(NamedTuple):
    """One entry of the warm-up: ``run(dtype, index_dtype)`` calls the ops on tiny inputs.

    ``indexed`` False: the kernels do not see the index dtype (run once per dtype).
    ``default`` False: an opt-in group, run only when named (or with ``ops="all"``).
    ``seconds``: about how long it compiles (float32, int64, one process, the
    development VM); worker processes take the longest groups first.
    """

    name: str
    what: str
    run: Callable[[str, str], None]
    indexed: bool = True
    default: bool = True
    seconds: float = 1.0


#: What :func:`warmup` drives, in order. Add a line here for each new op.
CASES: tuple[Case, ...] = (
    Case("embedding", "lookup (allocating, out=), dense and sparse backward", _embedding,
         seconds=4.6),
    Case("bag", "embedding_bag in every mode (1-D and 2-D, padding, weights, max_norm), dense "
         "and sparse gradients, EmbeddingBag fwd + bwd", _bag, seconds=3.0),
    Case("collection", "EmbeddingBagCollection: sum / mean / max / weighted tables in one "
         "kernel per direction, dense and sparse gradients", _collection, seconds=2.0),
    Case("renorm", "max_norm clipping for norm_type 2, 1 and inf", _renorm, seconds=0.7),
    Case("padding", "padding_mask, positions_from_padding / _attention_mask", _padding,
         seconds=0.2),
    Case("positional", "learned, sinusoidal and NeoML positional modules, fwd + bwd",
         _positional, seconds=5.4),
    Case("sinusoid", "sinusoidal_pos_embedding (both layouts), timestep_embedding", _sinusoid,
         indexed=False, seconds=0.1),
    Case("rotary", "RotaryEmbedding fwd + bwd (offset, position ids, both layouts, "
         "multimodal sections, bfloat16 / float16 q and k), apply_rotary in place and streamed",
         _rotary, seconds=11.2),
    Case("rope_index", "rope_index of Qwen2-VL / Qwen2.5-VL (images, video, mask)", _rope_index,
         seconds=0.5),
    Case("alibi", "ALiBi fwd + bwd with trained slopes, alibi_bias, every mode", _alibi,
         indexed=False, seconds=6.5),
    Case("relative", "RelativePositionBias (T5) fwd, add_ + bwd, relative_position_bucket, "
         "DeBERTa log_bucket_position and relative_positions", _relative, seconds=10.0),
    Case("resize", "resize_pos_table in every mode, fractional positions fwd + bwd", _resize,
         indexed=False, seconds=1.2),
    Case("init", "keyed_normal_ (the keyed initialiser of sharded tables)", _init, seconds=0.4),
    Case("dropout", "Dropout fwd + bwd, dropout_mask", _dropout, indexed=False, seconds=0.3),
    Case("layer_norm", "LayerNorm fwd + bwd, with and without affine", _layer_norm,
         indexed=False, seconds=2.8),
    Case("bert", "BertEmbeddings fwd + bwd (train), fwd (eval)", _bert, seconds=4.9),
    Case("gpt2", "GPT2Embeddings fwd + bwd, attention mask, 1-token fwd", _gpt2, seconds=1.0),
    Case("sgd", "SGD dense and sparse, without and with momentum, fused with the sparse "
         "backward", _sgd, seconds=10.5),
    Case("sgd_weight_decay", "SGD with weight decay, without and with Nesterov momentum, "
         "dense, sparse and fused", _sgd_weight_decay, seconds=20.0),
    Case("optimisers", "Adam (also AMSGrad), AdamW, Adagrad where numbapos has them, dense "
         "and sparse", _optimisers, seconds=10.0),
    Case("quantized", "int8 / int4 row-wise tables: quantise, look up (with padding), "
         "dequantise", _quantized, seconds=7.6),
    Case("quantized_bag", "int8 / int4 pooled lookups (sum / mean / max, 1-D and 2-D, "
         "padding, weights)", _quantized_bag, seconds=8.0),
    Case("rowwise_adagrad", "RowWiseAdagrad dense and sparse, with and without L2 weight "
         "decay (opt-in)", _rowwise_adagrad, default=False, seconds=59.0),
    Case("half", "bfloat16 / float16 tables: lookups to float32 and to the table's dtype, "
         "max_norm, every optimiser's sparse step and SGD's dense one with stochastic "
         "rounding, the BERT / GPT-2 blocks (opt-in)", _half, default=False,
         indexed=True, seconds=20.0),
)
CASE_NAMES = tuple(case.name for case in CASES)


class WarmupResult(NamedTuple):
    """What one case did for one pair of dtypes (serial and parallel kernels)."""

    case: str
    dtype: str
    index_dtype: str
    seconds: float
    compiled: int
    loaded: int


def kernel_dispatchers() -> list:
    """Every ``@njit`` function of :mod:`numbapos.kernels.cpu`, once each."""
    from numba.core.registry import CPUDispatcher

    cpu = _device.kernels_for("cpu")
    found = {}
    for area in cpu.AREAS:
        for obj in vars(area).values():
            for one in (obj if isinstance(obj, cpu.jit.SerialParallel) else (obj,)):
                if isinstance(one, CPUDispatcher) and one.py_func.__module__.startswith(
                        "numbapos.kernels"):
                    found[id(one)] = one
    return list(found.values())


def _cache_counts(dispatchers) -> tuple[int, int]:
    """(signatures compiled, signatures loaded from the cache) so far in this process."""
    compiled = loaded = 0
    for dispatcher in dispatchers:
        stats = dispatcher.stats
        compiled += sum(stats.cache_misses.values())
        loaded += sum(stats.cache_hits.values())
    return compiled, loaded


def cache_location() -> str | None:
    """The folder Numba caches numbapos's CPU kernels in (None: no writable cache).

    ``NUMBA_CACHE_DIR`` when set (a subfolder per source folder), else the
    ``__pycache__`` next to ``numbapos/kernels/cpu/*.py`` when writable, else
    Numba's per-user cache folder.
    """
    return kernel_dispatchers()[0].stats.cache_path


@contextmanager
def _parallel_bodies(parallel: bool) -> Iterator[None]:
    """Make the CPU launchers pick their parallel bodies (or, unchanged, the serial ones).

    ``parallel_min_elements`` is overridden to 0 and ``adaptive_threads`` off
    (on a busy machine the launchers would pick the serial kernels).
    """
    threshold = {"parallel_min_elements": 0, "adaptive_threads": False} if parallel else {}
    with config.override(**threshold):
        yield


def _dtype_name(value) -> str:
    return np.dtype(value).name


def _names(values, name: str, allowed: Sequence[str], convert=str) -> tuple[str, ...]:
    """``values`` as a non-empty tuple of names from ``allowed`` (ValueError otherwise)."""
    if isinstance(values, (str, np.dtype, type)):
        values = [values]
    try:
        names = [convert(v) for v in values]
    except TypeError:
        raise ValueError(f"{name}: expected names from {list(allowed)}, got "
                         f"{_checks.quote(values)}") from None
    bad = [v for v in names if v not in allowed]
    if not names or bad:
        raise ValueError(f"{name}: expected one or more of {list(allowed)}, got "
                         f"{_checks.quote(bad or values)}")
    return tuple(dict.fromkeys(names))


def _run_case(case: Case, dtype: str, index_dtype: str, dispatchers) -> WarmupResult:
    """Run ``case`` through the serial, then the parallel kernels; count what it compiled."""
    before = _cache_counts(dispatchers)
    start = time.perf_counter()
    for parallel in (False, True):
        try:
            with _parallel_bodies(parallel):
                case.run(dtype, index_dtype)
        except Exception as exc:
            kind = "parallel" if parallel else "serial"
            raise RuntimeError(f"warmup: {case.name} ({dtype}, {index_dtype}, {kind} kernels) "
                               f"failed: {type(exc).__name__}: {exc}") from exc
    after = _cache_counts(dispatchers)
    return WarmupResult(case.name, dtype, index_dtype if case.indexed else "-",
                        time.perf_counter() - start, after[0] - before[0], after[1] - before[1])


def _cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _processes(processes, tasks: int) -> int:
    """How many processes compile ``tasks`` tasks (``processes`` checked; None: by cores)."""
    if processes is None:
        if fcntl is None or not _numba_internals.can_lock_cache_saves():
            return 1  # nothing keeps the workers' cache writes apart
        return max(1, min(_cores(), MAX_PROCESSES, tasks))
    if isinstance(processes, bool) or not isinstance(processes, int | np.integer):
        raise TypeError(f"processes: expected None or an integer, got "
                        f"{type(processes).__name__}")
    if processes < 1:
        raise ValueError(f"processes: expected an integer >= 1, got {int(processes)}")
    if processes > 1 and fcntl is None:
        raise ValueError("processes: more than 1 needs POSIX file locks (fcntl), which this "
                         "platform lacks; use processes=1")
    if not _numba_internals.can_lock_cache_saves():
        return 1  # the fallback: nothing keeps the workers' cache writes apart
    return max(1, min(int(processes), tasks))


# --- Worker processes --------------------------------------------------------------
#
# Numba saves a cache entry by reading the kernel's index file, adding the entry and
# writing the index back, then its machine code under the first free number: two
# processes saving signatures of one kernel at once can lose an index entry, or
# write one signature's code under the other's entry. The workers therefore take an
# exclusive lock on one file (from the parent) around each save, and a shared one
# around each load. The workers are plain subprocesses (``python -c``), not
# multiprocessing's: a script calling numbapos.warmup() without a ``__main__``
# guard is not imported again.

_MARK = "numbapos-warmup-result "
_WORKER = "import numbapos._warmup as w; w._serve()"


def _lock_cache_files(lock_path: str) -> None:
    """Make this process's Numba cache loads and saves take ``lock_path``'s lock."""
    handle = open(lock_path, "a+b")  # noqa: SIM115 - kept open for the process's life

    def locked(method, exclusive):
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH

        def wrapper(self, *args, **kwargs):
            fcntl.flock(handle, mode)
            try:
                return method(self, *args, **kwargs)
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return wrapper

    # Without the lock (the public fallback) _processes gave the warm-up one worker.
    _numba_internals.lock_cache_saves(locked)


def _serve() -> None:
    """A worker: run the tasks read from stdin (a JSON line each), one result line each."""
    _lock_cache_files(os.environ["NUMBAPOS_WARMUP_LOCK"])
    cases = {case.name: case for case in CASES}
    dispatchers = kernel_dispatchers()
    out = sys.stdout
    sys.stdout = sys.stderr  # anything the ops print stays out of the results
    for line in sys.stdin:
        name, dtype, index_dtype = json.loads(line)
        try:
            reply = {"result": _run_case(cases[name], dtype, index_dtype, dispatchers)}
        except RuntimeError as exc:
            reply = {"error": str(exc)}
        out.write(_MARK + json.dumps(reply) + "\n")
        out.flush()


def _run_in_processes(tasks, count: int, report) -> list:
    """Run ``tasks`` ((case, dtype, index_dtype) each) in ``count`` worker processes.

    Each worker takes the next task when done with its last; ``report(result)``
    is called in this thread as each ends. Returns the results in task order.
    """
    import subprocess
    import tempfile
    import threading
    from queue import Empty, Queue

    todo: Queue = Queue()
    # the longest groups first, so that no worker is left with one long group at the end
    for number in sorted(range(len(tasks)), key=lambda n: -tasks[n][0].seconds):
        todo.put((number, tasks[number]))
    done: Queue = Queue()
    stop = threading.Event()
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="numbapos-warmup-") as folder:
        env = dict(os.environ, NUMBAPOS_WARMUP_LOCK=os.path.join(folder, "cache.lock"),
                   PYTHONPATH=os.pathsep.join(
                       [package_root, *filter(None, [os.environ.get("PYTHONPATH")])]))

        procs = []

        def work():
            proc = subprocess.Popen([sys.executable, "-c", _WORKER], env=env, text=True,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE)
            procs.append(proc)
            try:
                while not stop.is_set():
                    try:
                        number, (case, dtype, index_dtype) = todo.get_nowait()
                    except Empty:
                        break
                    try:
                        proc.stdin.write(json.dumps([case.name, dtype, index_dtype]) + "\n")
                        proc.stdin.flush()
                    except BrokenPipeError:  # killed (another group failed) or crashed
                        pass
                    for line in proc.stdout:
                        if line.startswith(_MARK):
                            reply = json.loads(line[len(_MARK):])
                            break
                    else:
                        reply = {"error": f"warmup: {case.name} ({dtype}, {index_dtype}): the "
                                          f"worker process ended (status {proc.wait()})"}
                    done.put((number, reply))
                    if "error" in reply:
                        break
            finally:
                try:
                    proc.stdin.close()
                except BrokenPipeError:
                    pass
                if stop.is_set():
                    proc.kill()
                proc.wait()
                done.put(None)

        threads = [threading.Thread(target=work, daemon=True) for _ in range(count)]
        for thread in threads:
            thread.start()
        results, running, error = {}, count, None
        try:
            while running:
                item = done.get()
                if item is None:
                    running -= 1
                    continue
                number, reply = item
                if "error" in reply:
                    error = error or reply["error"]
                    break
                results[number] = WarmupResult(*reply["result"])
                report(results[number])
        finally:
            stop.set()
            if running:  # an error or an interrupt: the other groups are not waited for
                for proc in list(procs):
                    proc.kill()
            for thread in threads:
                thread.join()
    if error is not None:
        raise RuntimeError(error)
    return [results[number] for number in range(len(tasks))]


def _group_list() -> str:
    """The groups of :data:`CASES` for :func:`warmup`'s docstring (read, not repeated)."""
    import textwrap

    def names(cases):
        return ", ".join(f'``"{case.name}"``' for case in cases)

    text = (names(case for case in CASES if case.default) + ". Opt-in, run when named or "
            'with ``"all"``: ' + names(case for case in CASES if not case.default) + ".")
    return textwrap.fill(text, 80, break_on_hyphens=False)


@fill_doc(default_groups=_group_list())
def warmup(dtypes=DEFAULT_DTYPES, index_dtypes=DEFAULT_INDEX_DTYPES, ops=None, verbose=True,
           file=None, processes=None):
    """Compile numbapos's CPU kernels into Numba's on-disk cache.

    Runs each op group of the table ``numbapos._warmup.CASES`` on tiny inputs
    for every pair of data and index dtypes, through its serial and its
    parallel kernel, so that later processes load the machine code from the
    cache instead of compiling it (``python -m numbapos warmup`` from the
    command line). The groups are shared among ``processes`` worker processes
    (one per core by default), which compile into the same cache. Kernels
    already in the cache are loaded, not compiled again, so a second warm-up
    is quick.

    Parameters
    ----------
    dtypes : sequence of {"float32", "float64"}, default ("float32",)
        Data dtypes to compile for.
    index_dtypes : sequence of {"int32", "int64"}, default ("int64",)
        Index dtypes to compile for (NumPy's and PyTorch's default integer is int64).
    ops : sequence of str or "all", optional
        Op groups to run. Default: every group but the opt-in ones:
        {default_groups}
    verbose : bool, default True
        Print a line per group as it ends (time, signatures compiled and
        loaded) and a total.
    file : file object, optional
        Where to print (default ``sys.stdout``).
    processes : int, optional
        Worker processes compiling in parallel (default: one per core, at most
        :data:`MAX_PROCESSES` and one per group; 1: in this process). Each
        needs up to 1 GB of memory while it compiles.

    Returns
    -------
    list of WarmupResult
        One per group and pair of dtypes: ``case``, ``dtype``, ``index_dtype``,
        ``seconds``, ``compiled`` and ``loaded`` (kernel signatures compiled,
        or loaded from the cache, counting kernels called by other kernels).

    Raises
    ------
    TypeError
        ``processes`` is not an integer.
    ValueError
        A dtype or op name not listed above; ``processes`` < 1.
    RuntimeError
        An op failed; the message names the group and dtypes (in this process,
        the cause is chained).

    Notes
    -----
    The cache is ``NUMBA_CACHE_DIR`` when set, else the ``__pycache__`` folders
    next to the installed package (the first line printed names it). Entries are
    keyed by the kernel's source, its argument types and the CPU model, so a
    cache built on one machine is used on another only with the same CPU model
    (or with ``NUMBA_CPU_NAME=generic`` set both when warming and when running).
    """
    dtypes = _names(dtypes, "dtypes", DTYPES, _dtype_name)
    index_dtypes = _names(index_dtypes, "index_dtypes", INDEX_DTYPES, _dtype_name)
    if ops is None:
        wanted = tuple(case.name for case in CASES if case.default)
    elif isinstance(ops, str) and ops == "all":
        wanted = CASE_NAMES
    else:
        wanted = _names(ops, "ops", CASE_NAMES)
    tasks = [(case, dtype, index_dtype) for dtype in dtypes for index_dtype in index_dtypes
             for case in CASES
             if case.name in wanted and (case.indexed or index_dtype == index_dtypes[0])]
    count = _processes(processes, len(tasks))
    out = sys.stdout if file is None else file

    def say(text):
        if verbose:
            print(text, file=out, flush=True)

    dispatchers = kernel_dispatchers()
    location = cache_location()
    workers = f", {count} processes" if count > 1 else ""
    say(f"numbapos warmup: {', '.join(dtypes)} x {', '.join(index_dtypes)}, "
        f"{len(tasks)} groups{workers}, serial and parallel kernels, into "
        f"{location or 'no cache (not writable): nothing is kept'}")
    start = time.perf_counter()
    finished = 0

    def report(result):
        nonlocal finished
        finished += 1
        say(f"  [{finished:{len(str(len(tasks)))}d}/{len(tasks)}] {result.case:<16} "
            f"{result.dtype:<8} {result.index_dtype:<6} {result.seconds:7.2f} s  "
            f"{result.compiled:3d} compiled, {result.loaded:3d} from the cache")

    if count > 1:
        results = _run_in_processes(tasks, count, report)
    else:
        results = []
        for case, dtype, index_dtype in tasks:
            results.append(_run_case(case, dtype, index_dtype, dispatchers))
            report(results[-1])
    compiled = sum(r.compiled for r in results)
    loaded = sum(r.loaded for r in results)
    say(f"done in {time.perf_counter() - start:.1f} s: {compiled} kernel signatures compiled, "
        f"{loaded} loaded from the cache")
    return results
