"""The sinusoidal position table, against the NumPy formula and PyTorch CPU.

numbapos rotates (sin, cos) one position at a time in float64 and re-anchors with
a direct sin/cos every few hundred positions; the NumPy and PyTorch peers
evaluate the usual formula (the Annotated Transformer's / PyTorch tutorial's
``sin(position * div_term)``, ``cos(position * div_term)``) in float32.
``numbapos-out`` fills a preallocated buffer (``out=``); the other cases allocate.

Target: >= 10x the NumPy formula. Group by shape to read the ratios::

    python -m pytest benchmarks/test_bench_sinusoid.py --benchmark-only \
        --benchmark-group-by=group,param:shape
"""

import math

import numpy as np
import pytest
from conftest import IMPLEMENTATIONS, skip_without_torch, torch

import numbapos.functional as F

SHAPES = [(2048, 768), (65536, 512)]
BASE = 10000.0


def numpy_formula(seq_len, embed_dim):
    position = np.arange(seq_len, dtype=np.float32)[:, None]
    div_term = np.exp(np.arange(0, embed_dim, 2, dtype=np.float32)
                      * np.float32(-math.log(BASE) / embed_dim))
    pe = np.zeros((seq_len, embed_dim), dtype=np.float32)
    pe[:, 0::2] = np.sin(position * div_term)
    pe[:, 1::2] = np.cos(position * div_term)
    return pe


def torch_formula(seq_len, embed_dim):
    position = torch.arange(seq_len, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, embed_dim, 2, dtype=torch.float32)
                         * (-math.log(BASE) / embed_dim))
    pe = torch.zeros(seq_len, embed_dim)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


@pytest.mark.benchmark(group="sinusoid")
@pytest.mark.parametrize("impl", IMPLEMENTATIONS[:1] + ["numbapos-out"] + IMPLEMENTATIONS[1:])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{s}x{d}" for s, d in SHAPES])
def test_sinusoid_table(benchmark, shape, impl):
    skip_without_torch(impl)
    seq_len, embed_dim = shape
    if impl == "numbapos":
        F.sinusoidal_pos_embedding(seq_len, embed_dim)  # compile / load the kernel first
        result = benchmark(F.sinusoidal_pos_embedding, seq_len, embed_dim)
    elif impl == "numbapos-out":
        out = np.empty(shape, dtype=np.float32)
        F.sinusoidal_pos_embedding(seq_len, embed_dim, out=out)
        result = benchmark(F.sinusoidal_pos_embedding, seq_len, embed_dim, out=out)
    elif impl == "numpy":
        result = benchmark(numpy_formula, seq_len, embed_dim)
    else:
        with torch.no_grad():
            result = benchmark(torch_formula, seq_len, embed_dim).numpy()
    assert result.shape == shape and result.dtype == np.float32
    # float32 formulas lose accuracy at large angles; compare the first positions only
    head = F.sinusoidal_pos_embedding(64, embed_dim, dtype=np.float64)
    np.testing.assert_allclose(result[:64], head, rtol=0, atol=1e-4)
