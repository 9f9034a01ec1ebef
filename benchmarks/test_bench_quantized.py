"""Lookups from int8 / int4 row-wise quantised tables against the float32 table and PyTorch.

16,384 ids drawn uniformly from a table that does not fit in any cache
(V = 1,000,000, D = 256: 1 GB as float32, 264 MB as int8, 132 MB as int4),
looked up to float32 into a preallocated buffer. PyTorch's peer is its
quantised bag op with one id per bag (``offsets = arange``), the op behind
``torch.ao.nn.quantized.Embedding``, on the same packed bytes; its result is
allocated by each call.

Targets: int8 >= 1.3x and int4 >= 1.35x faster than numbapos's float32
lookup, and faster than PyTorch's quantised ops.
"""

import numpy as np
import pytest
from conftest import torch

import numbapos.functional as F

VOCAB, DIM, IDS = 1_000_000, 256, 16_384
IMPLEMENTATIONS = ["numbapos_float32", "numbapos_int8", "numbapos_int4", "torch_int8",
                   "torch_int4"]


@pytest.fixture(scope="module")
def tables():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((VOCAB, DIM), dtype=np.float32)
    packed = {bits: F.quantize_rowwise(weight, bits) for bits in (8, 4)}
    ids = rng.integers(0, VOCAB, size=IDS)
    return weight, packed, ids


@pytest.mark.benchmark(group="quantized_lookup_1m_256")
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_quantized_lookup(benchmark, tables, impl):
    weight, packed, ids = tables
    out = np.empty((IDS, DIM), np.float32)
    name, kind = impl.split("_")
    bits = 8 if kind == "int8" else 4
    if name == "numbapos":
        if kind == "float32":
            call = lambda: F.embedding(ids, weight, out=out)  # noqa: E731
        else:
            call = lambda: F.quantized_embedding(ids, packed[bits], bits, out=out)  # noqa: E731
    else:
        if torch is None:
            pytest.skip("PyTorch is not installed (pip install torch==2.13.0)")
        op = (torch.ops.quantized.embedding_bag_byte_rowwise_offsets if bits == 8
              else torch.ops.quantized.embedding_bag_4bit_rowwise_offsets)
        t_packed, t_ids = torch.from_numpy(packed[bits]), torch.from_numpy(ids)
        offsets = torch.arange(IDS)
        call = lambda: op(t_packed, t_ids, offsets).numpy()  # noqa: E731
    call()
    result = benchmark.pedantic(call, rounds=30, iterations=1, warmup_rounds=3)
    if kind == "float32":
        np.testing.assert_array_equal(result, weight[ids])
    else:
        want = F.quantized_embedding(ids, packed[bits], bits)
        assert result.tobytes() == want.tobytes()
    table_bytes = weight.nbytes if kind == "float32" else packed[bits].nbytes
    benchmark.extra_info["table_MB"] = round(table_bytes / 2**20, 1)
