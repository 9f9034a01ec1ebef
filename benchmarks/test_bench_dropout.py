"""Dropout forward on a BERT-base activation, against NumPy and PyTorch CPU.

numbapos hashes (seed, counter, index) per element and writes the result in one
pass; the NumPy peer draws ``rng.random`` and multiplies by the mask; PyTorch
runs ``torch.nn.functional.dropout`` in training mode.
"""

import numpy as np
import pytest
from conftest import IMPLEMENTATIONS, skip_without_torch, torch

import numbapos.functional as F

BATCH, SEQ, DIM = 32, 128, 768
P = 0.1


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(0).normal(size=(BATCH, SEQ, DIM)).astype(np.float32)


@pytest.mark.benchmark(group="dropout")
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_dropout(benchmark, x, impl):
    skip_without_torch(impl)
    if impl == "numbapos":
        out = np.empty_like(x)
        F.dropout(x, P, seed=1, out=out)
        result = benchmark(F.dropout, x, P, 1, out=out)
    elif impl == "numpy":
        rng = np.random.default_rng(1)
        scale = np.float32(1 / (1 - P))

        def numpy_dropout():
            keep = rng.random(x.shape, dtype=np.float32) >= P
            return x * keep * scale

        result = benchmark(numpy_dropout)
    else:
        t = torch.from_numpy(x)
        with torch.no_grad():
            result = benchmark(torch.nn.functional.dropout, t, P, True).numpy()
    kept = result != 0
    assert abs(kept.mean() - (1 - P)) < 0.01
    np.testing.assert_allclose(result[kept], x[kept] / np.float32(1 - P), rtol=1e-6)


@pytest.mark.benchmark(group="dropout_alloc")
@pytest.mark.parametrize("impl", ["numbapos", "torch"])
def test_dropout_allocating(benchmark, x, impl):
    skip_without_torch(impl)
    if impl == "numbapos":
        F.dropout(x, P, seed=1)
        benchmark(F.dropout, x, P, 1)
    else:
        t = torch.from_numpy(x)
        with torch.no_grad():
            benchmark(torch.nn.functional.dropout, t, P, True)
