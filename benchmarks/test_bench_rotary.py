"""Rotary embeddings of q and k, against transformers and against copying them (the memory limit).

Shape: q and k of (8, 32, 1024, 128) float32, as Llama-7B's attention holds a
batch of 8 sequences of 1024 tokens. Sides:

- ``numbapos``: ``nn.RotaryEmbedding`` forward on q and k (one cos / sin table,
  new outputs; the module reuses its released outputs, as in a training loop);
- ``numbapos_inplace``: ``functional.rotary_qk`` with ``out_q=q, out_k=k``;
- ``copy``: ``q.copy(), k.copy()``, reading and writing the same bytes once into
  new arrays (as the op returns new arrays);
- ``copy_into``: ``np.copyto`` into kept arrays (no page faults): the memory limit;
- ``transformers``: ``LlamaRotaryEmbedding`` (cos, sin) + ``apply_rotary_pos_emb``
  (PyTorch CPU, same threads).

Targets: ``numbapos`` at least 3x faster than ``transformers`` and within 1.5x
of ``copy``.

Group ``multimodal rotary q, k (8, 32, 1024, 128)``: ``functional.rotary_qk``
(new outputs) with three position streams ``(3, B, L)`` and Qwen2-VL's chunked
or Qwen3-VL's interleaved sections, next to today's 1-D ``rotary_qk`` with
positions ``(B, L)`` (the same table size) and with an offset (one table row
per position). Target: multimodal within 1.2x of 1-D.

Group ``16-bit rotary q, k (8, 32, 1024, 128)``: the same q and k in float32,
bfloat16 and float16, through ``nn.RotaryEmbedding`` (outputs reused, as in a
training loop) and ``functional.rotary_qk`` in place. The kernel reads and
writes the 16-bit bits (half the bytes). Target: bfloat16 at least 1.5x
faster than float32::

    python -m pytest benchmarks/test_bench_rotary.py --benchmark-only \
        --benchmark-group-by=group
"""

import numpy as np
import pytest
from conftest import torch

import numbapos.functional as F
from numbapos import nn

SHAPE = (8, 32, 1024, 128)
SIDES = ["numbapos", "numbapos_inplace", "copy", "copy_into", "transformers"]


@pytest.fixture(scope="module")
def qk():
    rng = np.random.default_rng(0)
    return (rng.standard_normal(SHAPE, dtype=np.float32),
            rng.standard_normal(SHAPE, dtype=np.float32))


def _transformers_side(q, k):
    if torch is None:
        pytest.skip("PyTorch is not installed")
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    batch, heads, seq, dim = SHAPE
    config = transformers.LlamaConfig(hidden_size=heads * dim, num_attention_heads=heads,
                                      max_position_embeddings=4096)
    rope = LlamaRotaryEmbedding(config)
    q_t, k_t = torch.from_numpy(q), torch.from_numpy(k)
    ids = torch.arange(seq)[None].expand(batch, -1)

    def call():
        with torch.no_grad():
            cos, sin = rope(q_t, ids)
            return apply_rotary_pos_emb(q_t, k_t, cos, sin)
    return call


@pytest.mark.benchmark(group="rotary q, k (8, 32, 1024, 128)")
@pytest.mark.parametrize("side", SIDES)
def test_rotary_qk(benchmark, qk, side):
    q, k = qk
    if side == "numbapos":
        rope = nn.RotaryEmbedding(SHAPE[3]).eval()
        rope(q, k)  # compile / load the kernels first
        q_rot, _ = benchmark(rope, q, k)
        inv_freq = rope.inv_freq
        np.testing.assert_allclose(q_rot[:, :, :64], F.apply_rotary(q[:, :, :64], 0, inv_freq))
    elif side == "numbapos_inplace":
        q2, k2 = q.copy(), k.copy()
        inv_freq, _ = F.rope_frequencies(SHAPE[3])
        F.rotary_qk(q2, k2, 0, inv_freq, out_q=q2, out_k=k2)
        benchmark(F.rotary_qk, q2, k2, 0, inv_freq, out_q=q2, out_k=k2)
    elif side == "copy":
        benchmark(lambda: (q.copy(), k.copy()))
    elif side == "copy_into":
        q2, k2 = np.empty_like(q), np.empty_like(k)
        benchmark(lambda: (np.copyto(q2, q), np.copyto(k2, k)))
    else:
        benchmark(_transformers_side(q, k))


MROPE_SIDES = ["1d_offset", "1d_positions", "mrope_chunked", "mrope_interleaved"]


@pytest.mark.benchmark(group="multimodal rotary q, k (8, 32, 1024, 128)")
@pytest.mark.parametrize("side", MROPE_SIDES)
def test_multimodal_rotary_qk(benchmark, qk, side):
    q, k = qk
    batch, _, seq, dim = SHAPE
    inv_freq, _ = F.rope_frequencies(dim, 1e6)
    text = np.tile(np.arange(seq), (batch, 1))
    # An image grid in the middle of each row: height and width streams differ from time.
    streams = np.stack([text, text, text])
    streams[1, :, 256:768] = 256 + np.arange(512) // 32
    streams[2, :, 256:768] = 256 + np.arange(512) % 32
    kwargs = {"1d_offset": dict(position_ids=0),
              "1d_positions": dict(position_ids=text),
              "mrope_chunked": dict(position_ids=streams, mrope_section=(16, 24, 24)),
              "mrope_interleaved": dict(position_ids=streams, mrope_section=(24, 20, 20),
                                        mrope_interleaved=True)}[side]
    ids = kwargs.pop("position_ids")
    F.rotary_qk(q, k, ids, inv_freq, **kwargs)  # compile / load the kernels first
    q_rot, _ = benchmark(F.rotary_qk, q, k, ids, inv_freq, **kwargs)
    if side.startswith("mrope"):  # the text rows of every sequence: the 1-D rotary's bits
        want = F.apply_rotary(q[:, :, :256], text[:, :256], inv_freq)
        np.testing.assert_array_equal(q_rot[:, :, :256], want)


HALF_SIDES = ["float32", "bfloat16", "float16"]


@pytest.mark.benchmark(group="16-bit rotary q, k (8, 32, 1024, 128)")
@pytest.mark.parametrize("call", ["module", "inplace"])
@pytest.mark.parametrize("side", HALF_SIDES)
def test_16_bit_rotary_qk(benchmark, qk, side, call):
    from numbapos._checks import check_table_dtype

    q, k = (x.astype(check_table_dtype(side)) for x in qk)
    if call == "module":
        rope = nn.RotaryEmbedding(SHAPE[3]).eval()
        rope(q, k)  # compile / load the kernels first
        q_rot, _ = benchmark(rope, q, k)
    else:
        inv_freq, _ = F.rope_frequencies(SHAPE[3])
        F.rotary_qk(q[:1, :1], k[:1, :1], 0, inv_freq)
        q_rot, _ = benchmark(F.rotary_qk, q, k, 0, inv_freq, out_q=q, out_k=k)
    assert q_rot.dtype == q.dtype
