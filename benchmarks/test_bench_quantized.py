"""Lookups from int8 / int4 row-wise quantised tables against the float32 table and PyTorch.

16,384 ids drawn uniformly from a table that does not fit in any cache
(V = 1,000,000, D = 256: 1 GB as float32, 264 MB as int8, 132 MB as int4),
looked up to float32 into a preallocated buffer (a first lookup's result,
cache-line aligned as numbapos and PyTorch allocate). Every call, whichever
implementation makes it, takes the next of 512 batches of ids, so no call finds
its rows in a cache: 512 batches touch 1.6 GB of the int4 table, several
times any last-level cache (with 32 batches reused per implementation, the
rows an implementation read 32 calls before could still be in a 260 MB cache,
which favours whoever keeps rows there over read-once prefetches). PyTorch's peer is its
quantised bag op with one id per bag (``offsets = arange``), the op behind
``torch.ao.nn.quantized.Embedding``, on the same packed bytes; its result is
allocated by each call.

Targets: int8 >= 1.3x and int4 >= 1.35x faster than numbapos's float32
lookup, and faster than PyTorch's quantised ops.

The ``quantized_bag_sum_int*`` groups time issue 37's bags (2,048 bags of 20 ids,
D = 128) summed from the packed tables against PyTorch's quantised bag ops.
"""

import itertools

import numpy as np
import pytest
from conftest import torch

import numbapos.functional as F

VOCAB, DIM, IDS, BATCHES = 1_000_000, 256, 16_384, 512
IMPLEMENTATIONS = ["numbapos_float32", "numbapos_int8", "numbapos_int4", "torch_int8",
                   "torch_int4"]


@pytest.fixture(scope="module")
def tables():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((VOCAB, DIM), dtype=np.float32)
    packed = {bits: F.quantize_rowwise(weight, bits) for bits in (8, 4)}
    batches = [rng.integers(0, VOCAB, size=IDS) for _ in range(BATCHES)]
    return weight, packed, batches, itertools.count()


@pytest.mark.benchmark(group="quantized_lookup_1m_256")
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_quantized_lookup(benchmark, tables, impl):
    weight, packed, batches, turn = tables
    out = F.embedding(batches[0], weight)  # numbapos's own output: cache-line aligned
    name, kind = impl.split("_")
    bits = 8 if kind == "int8" else 4
    if name == "numbapos":
        if kind == "float32":
            def call():
                return F.embedding(batches[next(turn) % BATCHES], weight, out=out)
        else:
            def call():
                return F.quantized_embedding(batches[next(turn) % BATCHES], packed[bits], bits,
                                             out=out)
    else:
        if torch is None:
            pytest.skip("PyTorch is not installed (pip install torch==2.13.0)")
        op = (torch.ops.quantized.embedding_bag_byte_rowwise_offsets if bits == 8
              else torch.ops.quantized.embedding_bag_4bit_rowwise_offsets)
        t_packed = torch.from_numpy(packed[bits])
        t_batches = [torch.from_numpy(ids) for ids in batches]
        offsets = torch.arange(IDS)

        def call():
            return op(t_packed, t_batches[next(turn) % BATCHES], offsets).numpy()
    result = benchmark.pedantic(call, rounds=64, iterations=1, warmup_rounds=16)
    ids = batches[(next(turn) - 1) % BATCHES]  # the last call's
    if kind == "float32":
        np.testing.assert_array_equal(result, weight[ids])
    else:
        want = F.quantized_embedding(ids, packed[bits], bits)
        assert result.tobytes() == want.tobytes()
    table_bytes = weight.nbytes if kind == "float32" else packed[bits].nbytes
    benchmark.extra_info["table_MB"] = round(table_bytes / 2**20, 1)


BAG_VOCAB, BAG_DIM, BAGS, PER_BAG = 1_000_000, 128, 2048, 20


@pytest.fixture(scope="module")
def bag_tables():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((BAG_VOCAB, BAG_DIM), dtype=np.float32)
    packed = {bits: F.quantize_rowwise(weight, bits) for bits in (8, 4)}
    ids = rng.integers(0, BAG_VOCAB, BAGS * PER_BAG)
    return packed, ids, np.arange(0, BAGS * PER_BAG, PER_BAG)


@pytest.mark.parametrize("impl", ["numbapos", "torch"])
@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_bag_sum(benchmark, bag_tables, impl, bits):
    """Issue 37's bags (V = 1e6, D = 128, 2,048 bags of 20 ids, the same ids every call)
    summed from the int8 / int4 table; the group is the bit width. Target: int4 as fast
    as PyTorch's ``embedding_bag_4bit_rowwise_offsets``."""
    benchmark.group = f"quantized_bag_sum_int{bits}"
    packed, ids, offsets = bag_tables
    if impl == "numbapos":
        out = np.empty((BAGS, BAG_DIM), np.float32)
        result = benchmark(F.quantized_embedding_bag, ids, packed[bits], bits, offsets,
                           mode="sum", out=out)
    else:
        if torch is None:
            pytest.skip("PyTorch is not installed (pip install torch==2.13.0)")
        op = (torch.ops.quantized.embedding_bag_byte_rowwise_offsets if bits == 8
              else torch.ops.quantized.embedding_bag_4bit_rowwise_offsets)
        args = torch.from_numpy(packed[bits]), torch.from_numpy(ids), torch.from_numpy(offsets)
        result = benchmark(op, *args).numpy()
    want = F.quantized_embedding_bag(ids, packed[bits], bits, offsets, mode="sum")
    assert result.tobytes() == want.tobytes()
