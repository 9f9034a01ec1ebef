"""T5's relative position bias: making it, and adding it into attention scores.

Group ``T5 relative bias (16 heads, 2048 x 2048)``, float32, the bias
``(1, 16, 2048, 2048)`` of a 2048-token encoder:

- ``numbapos``: ``nn.RelativePositionBias(16)`` forward (a new 256 MB array
  each call, as transformers returns one);
- ``numbapos_out``: ``functional.relative_position_bias`` into a kept array;
- ``numpy``: the buckets (NumPy's float32 steps, as transformers') and the
  gather ``weight.T[:, buckets]``;
- ``transformers``: ``T5Attention.compute_bias`` (PyTorch CPU, same threads).

Target: ``numbapos`` at least 3x faster than ``transformers``.

Group ``T5 relative bias added into scores (4, 16, 2048, 2048)`` (1 GiB of
scores, in place):

- ``numbapos``: ``functional.add_relative_position_bias_`` (no bias tensor);
- ``numpy``: ``np.add(scores, bias, out=scores)`` with the bias made beforehand
  (the memory limit: the scores read and written once, the bias read);
- ``torch``: ``scores.add_(bias)`` with the bias made beforehand.

Target: ``numbapos`` within 1.3x of ``numpy``::

    python -m pytest benchmarks/test_bench_relative.py --benchmark-only \
        --benchmark-group-by=group
"""

import numpy as np
import pytest
from conftest import torch

import numbapos
from numbapos.functional import relative as F
from numbapos.nn.relative import RelativePositionBias

HEADS, LENGTH, BATCH = 16, 2048, 4
BIAS_SIDES = ["numbapos", "numbapos_out", "numpy", "transformers"]
ADD_SIDES = ["numbapos", "numpy", "torch"]


@pytest.fixture(scope="module")
def weight():
    return np.random.default_rng(0).standard_normal((32, HEADS), dtype=np.float32)


def _numpy_bias(weight):
    rel = np.arange(LENGTH)[None, :] - np.arange(LENGTH)[:, None]
    sign = (rel > 0) * 16
    n = np.abs(rel)
    with np.errstate(all="ignore"):  # log(0) where n < 8 (not used there)
        scaled = np.log(n.astype(np.float32) / np.float32(8)) / np.float32(np.log(16.0))
        large = np.minimum(8 + (scaled * np.float32(8)).astype(np.int64), 15)
    buckets = sign + np.where(n < 8, n, large)
    return weight.T[:, buckets][None]


def _t5_attention(weight):
    if torch is None:
        pytest.skip("PyTorch is not installed")
    transformers = pytest.importorskip("transformers")
    from transformers.models.t5.modeling_t5 import T5Attention

    config = transformers.T5Config(d_model=HEADS * 64, d_kv=64, num_heads=HEADS)
    attention = T5Attention(config, has_relative_attention_bias=True)
    with torch.no_grad():
        attention.relative_attention_bias.weight.copy_(torch.from_numpy(weight))
    return attention


@pytest.mark.benchmark(group="T5 relative bias (16 heads, 2048 x 2048)")
@pytest.mark.parametrize("side", BIAS_SIDES)
def test_relative_bias(benchmark, weight, side):
    if side == "numbapos":
        bias = RelativePositionBias(HEADS, seed=0)
        np.copyto(bias.weight.data, weight)
        with numbapos.no_grad():
            bias(LENGTH, LENGTH)  # compile / load the kernels first
            got = benchmark(bias, LENGTH, LENGTH)
    elif side == "numbapos_out":
        out = np.empty((1, HEADS, LENGTH, LENGTH), np.float32)
        F.relative_position_bias(weight, LENGTH, LENGTH, out=out)
        got = benchmark(F.relative_position_bias, weight, LENGTH, LENGTH, out=out)
    elif side == "numpy":
        got = benchmark(_numpy_bias, weight)
    else:
        attention = _t5_attention(weight)

        def call():
            with torch.no_grad():
                return attention.compute_bias(LENGTH, LENGTH)
        got = benchmark(call).numpy()
    np.testing.assert_array_equal(got[0, :, ::97, ::89],
                                  F.relative_position_bias(weight, LENGTH, LENGTH)[0, :, ::97,
                                                                                   ::89])


@pytest.fixture(scope="module")
def scores():
    return np.random.default_rng(1).standard_normal((BATCH, HEADS, LENGTH, LENGTH),
                                                    dtype=np.float32)


@pytest.mark.benchmark(group="T5 relative bias added into scores (4, 16, 2048, 2048)")
@pytest.mark.parametrize("side", ADD_SIDES)
def test_add_relative_bias(benchmark, weight, scores, side):
    x = scores.copy()
    bias = F.relative_position_bias(weight, LENGTH, LENGTH)
    if side == "numbapos":
        first = F.add_relative_position_bias_(scores[:1].copy(), weight)  # compiles first
        np.testing.assert_array_equal(first, scores[:1] + bias)
        benchmark(F.add_relative_position_bias_, x, weight)
    elif side == "numpy":
        benchmark(np.add, x, bias, out=x)
    else:
        if torch is None:
            pytest.skip("PyTorch is not installed")
        x_t, bias_t = torch.from_numpy(x), torch.from_numpy(bias)
        benchmark(x_t.add_, bias_t)
