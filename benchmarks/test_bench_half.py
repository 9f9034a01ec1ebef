"""Lookups from bfloat16 / float16 tables against numbapos's float32 table (and PyTorch).

16,384 ids drawn uniformly from a table that does not fit in any cache
(V = 1,000,000, D = 256: 1 GB as float32, 512 MB as bfloat16 / float16),
looked up into a preallocated buffer (a first lookup's result: numbapos
allocates cache-line aligned, as PyTorch does; NumPy's ``np.empty`` aligns to
16 bytes, which costs the row stores 10-20 %): to float32 (the default), and to the
table's own dtype (``out_dtype``, a plain row copy, half the bytes written).
Every lookup, whichever implementation makes it, takes the next of 512 batches
of ids, so no call finds its rows in a cache (a cycle of 32 batches per
implementation touched 256 MB of the bfloat16 table, which a 260 MB cache could
hold). PyTorch's peers (where installed) are
``F.embedding`` on a float32 and a bfloat16 table (bfloat16 out; to float32
needs a second pass, ``.float()``).

Targets: bfloat16 -> float32 >= 1.15x and bfloat16 -> bfloat16 >= 1.8x faster
than numbapos's float32 lookup. The float32 output is the same for every
format, which bounds the first gain (about 1.33x).

The training-step group times one sparse step on the same table and ids:
lookup, backward (``SparseRows``), SGD with momentum 0.9 and ``zero_grad``,
on a float32 table and on a bfloat16 one (float32 momentum, stochastic
rounding; ``optimizer.step()`` after the backward, and fused into it; and
with bfloat16 momentum, ``momentum_dtype="bfloat16"``), and on a float16 one. Target:
the bfloat16 step >= 1.1x faster than the float32 one. PyTorch has no peer
worth timing here: its SGD keeps a sparse momentum buffer that grows to every
row seen so far, and its bfloat16 table sums repeated ids' gradients in bfloat16.
"""

import itertools

import numpy as np
import pytest
from conftest import torch

import numbapos.functional as F
from numbapos import nn, optim

ml_dtypes = pytest.importorskip("ml_dtypes")

VOCAB, DIM, IDS, BATCHES = 1_000_000, 256, 16_384, 512
BF16 = np.dtype(ml_dtypes.bfloat16)
IMPLEMENTATIONS = ["numbapos_float32", "numbapos_bf16_to_f32", "numbapos_bf16_to_bf16",
                   "numbapos_f16_to_f32", "numbapos_f16_to_f16", "torch_float32",
                   "torch_bf16_to_bf16"]


@pytest.fixture(scope="module")
def tables():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((VOCAB, DIM), dtype=np.float32)
    halves = {"bf16": weight.astype(BF16), "f16": weight.astype(np.float16)}
    batches = [rng.integers(0, VOCAB, size=IDS) for _ in range(BATCHES)]
    return weight, halves, batches


@pytest.fixture(scope="module")
def lookups():
    """The lookups' turn, shared by every implementation: each call takes fresh ids."""
    return itertools.count()


@pytest.mark.benchmark(group="half_lookup_1m_256")
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_half_lookup(benchmark, tables, lookups, impl):
    weight, halves, batches = tables
    name, kind = impl.split("_", 1)
    turn = lookups
    if name == "numbapos":
        if kind == "float32":
            table, out_dtype = weight, None
        else:
            source, _, target = kind.split("_")
            table = halves[source]
            out_dtype = None if target == "f32" else table.dtype
        out = F.embedding(batches[0], table, out_dtype=out_dtype)  # numbapos's: aligned

        def call():
            return F.embedding(batches[next(turn) % BATCHES], table, out=out,
                               out_dtype=out_dtype)
    else:
        if torch is None:
            pytest.skip("PyTorch is not installed (pip install torch==2.13.0)")
        t_table = torch.from_numpy(weight)
        if kind != "float32":
            t_table = t_table.to(torch.bfloat16)
        t_batches = [torch.from_numpy(ids) for ids in batches]
        t_out = torch.empty((IDS, DIM), dtype=t_table.dtype)

        def call():
            return torch.index_select(t_table, 0, t_batches[next(turn) % BATCHES], out=t_out)
    result = benchmark.pedantic(call, rounds=64, iterations=1, warmup_rounds=16)
    ids = batches[(next(turn) - 1) % BATCHES]  # the last call's
    if name == "numbapos":
        expected = table[ids] if out_dtype is not None else table[ids].astype(np.float32)
        assert np.asarray(result).tobytes() == expected.tobytes()
        benchmark.extra_info["table_MB"] = round(table.nbytes / 2**20, 1)


STEP_IMPLEMENTATIONS = ["numbapos_float32", "numbapos_bf16", "numbapos_bf16_bf16momentum",
                        "numbapos_f16", "numbapos_float32_fused", "numbapos_bf16_fused",
                        "numbapos_f16_fused"]


def training_step(weight, batches, impl):
    """``(call, module)``: one sparse SGD-momentum step per call, on the next batch of ids.

    The optimiser's state is made and every page of it touched before the
    first timed call (a first write to a page of a fresh ``(V, D)`` buffer
    costs a page fault, which the steps of a long run do not pay).
    """
    if impl.startswith("numbapos_float32"):
        table = weight.copy()
    else:
        table = weight.astype(np.float16 if impl.startswith("numbapos_f16") else BF16)
    module = nn.Embedding.from_pretrained(table, freeze=False, sparse=True)
    momentum_dtype = "bfloat16" if "bf16momentum" in impl else None
    opt = optim.SGD(module.parameters(), lr=0.01, momentum=0.9, momentum_dtype=momentum_dtype)
    grad = np.ones((IDS, DIM), np.float32) * np.float32(1e-3)
    if impl.endswith("_fused"):
        opt.fuse_with_backward()
    turn = iter(range(10**9))

    def call():
        module(batches[next(turn) % BATCHES])
        module.backward(grad)
        opt.step()
        module.zero_grad()

    call()
    state = opt.state[id(module.weight)]
    for name in ("momentum_buffer", "row_started"):
        state[name][...] = state[name]
    return call, module


@pytest.mark.benchmark(group="half_sparse_step_1m_256")
@pytest.mark.parametrize("impl", STEP_IMPLEMENTATIONS)
def test_half_sparse_step(benchmark, tables, impl):
    weight, _, batches = tables
    call, module = training_step(weight, batches, impl)
    benchmark.pedantic(call, rounds=32, iterations=1, warmup_rounds=8)
    benchmark.extra_info["table_MB"] = round(module.weight.data.nbytes / 2**20, 1)
