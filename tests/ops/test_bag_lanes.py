"""The CPU bag kernels' register lanes (kernels/cpu/bag.py ``Lanes``): float32 and int8 /
int4 bags pool 128, 64, 32 and 16 columns at a time, then the last columns one by one.
Every width combination gives PyTorch's and the NumPy reference's bits, serial or
parallel."""

import os
import subprocess
import sys

import numpy as np
import pytest
import reference as ref

import numbapos
from numbapos.functional.bag import embedding_bag
from numbapos.functional.quantized import quantize_rowwise, quantized_embedding_bag

torch = pytest.importorskip("torch")

# 16 (one block); 112 = 64 + 32 + 16; 200 = 128 + 64 + 8 one by one; 263 = 2 * 128 + 7.
DIMS = [16, 112, 200, 263]
NUM = 30


def _bags(rng, bags=7, longest=9):
    sizes = rng.integers(0, longest + 1, bags)
    sizes[1] = 0  # an empty bag
    ids = rng.integers(0, NUM, int(sizes.sum()))
    ids[::4] = 3  # the padding row, when there is one (a bag of padding only, often)
    return ids, np.concatenate([[0], np.cumsum(sizes)[:-1]])


def _serial_and_parallel(call):
    """``call()`` with the serial kernels and with the parallel ones: the same bytes."""
    with numbapos.config.override(parallel_min_elements=1 << 62):
        serial = call()
    with numbapos.config.override(parallel_min_elements=0):
        parallel = call()
    assert serial.tobytes() == parallel.tobytes()
    return serial


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("mode, pad, weighted", [
    ("sum", None, False), ("sum", 3, False), ("mean", None, False), ("mean", 3, False),
    ("max", 3, False), ("sum", None, True), ("sum", 3, True)])
def test_float32_bags_are_torch_bits_at_every_width(rng, dim, mode, pad, weighted):
    weight = rng.standard_normal((NUM, dim)).astype(np.float32)
    ids, offsets = _bags(rng)
    psw = rng.standard_normal(ids.shape).astype(np.float32) if weighted else None
    got = _serial_and_parallel(lambda: embedding_bag(ids, weight, offsets, mode=mode,
                                                     per_sample_weights=psw, padding_idx=pad))
    expected = torch.nn.functional.embedding_bag(
        torch.from_numpy(ids), torch.from_numpy(weight), torch.from_numpy(offsets), mode=mode,
        per_sample_weights=None if psw is None else torch.from_numpy(psw), padding_idx=pad)
    assert got.tobytes() == expected.numpy().tobytes()
    assert got.tobytes() == ref.embedding_bag(ids, weight, offsets, mode, psw, False,
                                              pad).tobytes()


def test_strided_float32_table_pools_as_a_contiguous_one(rng):
    wide = rng.standard_normal((NUM, 256)).astype(np.float32)
    ids, offsets = _bags(rng)
    got = embedding_bag(ids, wide[:, ::2], offsets, mode="sum")
    assert got.tobytes() == embedding_bag(ids, wide[:, ::2].copy(), offsets,
                                          mode="sum").tobytes()


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("mode, pad, weighted", [
    ("sum", None, False), ("sum", 3, True), ("mean", 3, False), ("max", None, False),
    ("max", 3, False)])
def test_quantized_bags_are_reference_bits_at_every_width(rng, bits, dim, mode, pad, weighted):
    table = rng.normal(size=(NUM, dim)) * rng.uniform(0.01, 100.0, size=(NUM, 1))
    packed = quantize_rowwise(table.astype(np.float32), bits)
    ids, offsets = _bags(rng)
    psw = rng.standard_normal(ids.shape).astype(np.float32) if weighted else None
    got = _serial_and_parallel(lambda: quantized_embedding_bag(
        ids, packed, bits, offsets, mode=mode, per_sample_weights=psw, padding_idx=pad,
        dim=dim))
    assert got.tobytes() == ref.quantized_embedding_bag(ids, packed, bits, dim, offsets, mode,
                                                        psw, False, pad).tobytes()
    if mode == "sum" and pad is None and dim % 2 == 0:  # PyTorch packs even D only
        op = (torch.ops.quantized.embedding_bag_byte_rowwise_offsets if bits == 8
              else torch.ops.quantized.embedding_bag_4bit_rowwise_offsets)
        expected = op(torch.from_numpy(packed), torch.from_numpy(ids),
                      torch.from_numpy(offsets))
        assert got.tobytes() == expected.numpy().tobytes()


WIDEN_ALL_HALVES = """
import sys
import numpy as np
from numba import njit
from numbapos.kernels.cpu.quantized import CONVERTS_HALF, _f16_value

@njit
def widen(bits, out):
    for k in range(bits.size):
        out[k] = _f16_value(bits[k])

bits = np.arange(1 << 16).astype(np.uint16)
got = np.empty(bits.size, np.float32)
widen(bits, got)
want = bits.view(np.float16).astype(np.float32)
nan = np.isnan(want)
assert np.array_equal(np.isnan(got), nan)
assert got[~nan].tobytes() == want[~nan].tobytes()
print(CONVERTS_HALF)
"""


@pytest.mark.parametrize("cpu", [None, "generic"])
def test_int4_scales_widen_exactly_with_and_without_f16c(tmp_path, cpu):
    # The 4-bit rows' float16 scale and bias: one instruction where the CPU converts
    # float16 (F16C), integer operations elsewhere (NUMBA_CPU_NAME=generic: no F16C).
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    if cpu:
        env.update(NUMBA_CPU_NAME=cpu, NUMBA_CPU_FEATURES="")
    run = subprocess.run([sys.executable, "-c", WIDEN_ALL_HALVES], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    if cpu:
        assert run.stdout.strip() == "False"
