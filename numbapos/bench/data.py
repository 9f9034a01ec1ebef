"""The inputs of the bench: sizes, shapes, seeded arrays and the blocks the sides share."""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

import numpy as np

from .. import nn
from .._device import to_host

LN_EPS = 1e-12  # BERT's LayerNorm eps (Hugging Face's layer_norm_eps)


class Shape(NamedTuple):
    """A table of ``vocab`` x ``dim`` float32 and a batch of ``batch`` x ``seq`` token ids."""

    vocab: int
    dim: int
    batch: int
    seq: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


class Sizes(NamedTuple):
    """The sizes of one run: ``FULL`` (and ``QUICK``) or ``TINY`` (tests, the simulator)."""

    vocab: int = 30522
    dim: int = 768
    minilm_dim: int = 384
    batch: int = 32
    seq: int = 128
    step_vocab: int = 50_000
    step_seq: int = 512
    gpt2_vocab: int = 50257
    gpt2_positions: int = 1024
    small_tokens: int = 8
    dims: tuple = (64, 256, 1024)
    batches: tuple = (1, 8, 32, 128)
    rope_heads: int = 32
    rope_head_dim: int = 128
    rope_batch: int = 8
    rope_seq: int = 1024
    t5_heads: int = 16
    t5_seq: int = 2048
    bag_vocab: int = 1_000_000
    bag_dim: int = 128
    bags: int = 2048
    bag_size: int = 20
    collection_tables: int = 8


FULL = Sizes()
QUICK = FULL._replace(batches=(1, 8, 32))
TINY = Sizes(vocab=40, dim=8, minilm_dim=4, batch=2, seq=4, step_vocab=50, step_seq=4,
             gpt2_vocab=60, gpt2_positions=16, small_tokens=3, dims=(4, 8), batches=(1, 2),
             rope_heads=2, rope_head_dim=8, rope_batch=1, rope_seq=4, t5_heads=2, t5_seq=6,
             bag_vocab=50, bag_dim=8, bags=3, bag_size=4, collection_tables=2)


class Inputs(NamedTuple):
    """Host arrays of one shape: ``weight`` (V, D), ``ids`` (B, L), ``grad`` (B, L, D)."""

    shape: Shape
    weight: np.ndarray
    ids: np.ndarray
    grad: np.ndarray

    @property
    def grad_rows(self) -> np.ndarray:
        """``grad`` as (B * L, D) rows."""
        return self.grad.reshape(-1, self.shape.dim)


@lru_cache(maxsize=2)
def inputs(shape: Shape) -> Inputs:
    """Seeded random inputs of ``shape`` (the last two shapes are kept)."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((shape.vocab, shape.dim), dtype=np.float32)
    ids = rng.integers(0, shape.vocab, size=(shape.batch, shape.seq))
    grad = rng.standard_normal((shape.batch, shape.seq, shape.dim), dtype=np.float32)
    return Inputs(shape, weight, ids, grad)


BATCHES = 4  # batches of ids a training step cycles through


def batches(x: Inputs, count: int = BATCHES) -> list:
    """``count`` batches of ids of ``x``'s shape: a new batch at each training step."""
    rng = np.random.default_rng(1)
    return [x.ids] + [rng.integers(0, x.shape.vocab, size=x.ids.shape) for _ in range(count - 1)]


def primed(step, x: Inputs, count: int = BATCHES):
    """``step`` after one call per batch: every row the timed steps use has its state.

    A lazily allocated table (momentum buffers) faults its pages in on first
    touch; these first steps take that cost out of the timed ones.
    """
    for _ in range(count):
        step()
    return step


def layer_norm_params(dim: int):
    """Seeded LayerNorm weight and bias of ``dim`` features."""
    rng = np.random.default_rng(2)
    return (rng.normal(1.0, 0.1, dim).astype(np.float32),
            rng.normal(0.0, 0.1, dim).astype(np.float32))


@lru_cache(maxsize=1)
def rope_qk(shape: Shape) -> tuple:
    """Seeded float32 q and k of shape (batch, vocab, seq, dim): the rotary case's ``vocab``
    field counts heads."""
    rng = np.random.default_rng(1)
    size = (shape.batch, shape.vocab, shape.seq, shape.dim)
    return (rng.standard_normal(size, dtype=np.float32),
            rng.standard_normal(size, dtype=np.float32))


def t5_table(shape: Shape) -> np.ndarray:
    """A seeded float32 T5 relative-bias table (buckets, heads): the T5 case's ``vocab`` field
    counts heads, ``dim`` buckets."""
    return np.random.default_rng(2).standard_normal((shape.dim, shape.vocab), dtype=np.float32)


@lru_cache(maxsize=2)
def bert_block(shape: Shape) -> nn.BertEmbeddings:
    """The BERT block of ``shape`` (dropout off, seeded, shared); peers copy its tables."""
    return nn.BertEmbeddings(shape.vocab, shape.dim, max(512, shape.seq),
                             hidden_dropout_prob=0.0, seed=0)


@lru_cache(maxsize=2)
def gpt2_block(shape: Shape, positions: int) -> nn.GPT2Embeddings:
    """The GPT-2 block of ``shape`` (dropout off, seeded, shared); peers copy its tables."""
    return nn.GPT2Embeddings(shape.vocab, positions, shape.dim, embd_pdrop=0.0, seed=0)


def host_tables(block) -> list:
    """The parameters of ``block`` as C-contiguous host arrays, in ``state_dict`` order.

    Buffers (a Dropout's seed and counter) are left out.
    """
    return [np.ascontiguousarray(to_host(p.data)) for p in block.parameters()]


def bag_grad(x: Inputs) -> np.ndarray:
    """A (bags, D) gradient of a pooled result: each bag's first token's row of ``grad``."""
    return np.ascontiguousarray(x.grad[:, 0])


def collection_batches(x: Inputs, tables: int) -> list:
    """``(values, lengths)`` of :func:`collection_ids`'s layout for each of :func:`batches`'s
    batches: a new batch at each training step."""
    rows = x.shape.vocab // tables
    lengths = np.full(tables * x.shape.batch, x.shape.seq, np.int64)
    return [(np.concatenate([ids.reshape(-1) % rows for _ in range(tables)]), lengths)
            for ids in batches(x)]


def collection_ids(x: Inputs, tables: int):
    """``(keys, values, lengths)`` of a key-major jagged batch of ``tables`` features (one
    per table, ``x.shape.vocab // tables`` rows each), every sample a bag of ``x.shape.seq``
    ids: ``x.ids`` split into the tables' ranges."""
    rows = x.shape.vocab // tables
    keys = [f"f{t}" for t in range(tables)]
    values = np.concatenate([x.ids.reshape(-1) % rows for _ in range(tables)])
    lengths = np.full(tables * x.shape.batch, x.shape.seq, np.int64)
    return keys, values, lengths

