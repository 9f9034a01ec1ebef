"""What docs/guide/positions.rst says of ``float32_angle=True`` against transformers: the same
float32 angles, cos / sin rounded once from float64 (correctly rounded), hence within 1 ulp
of PyTorch's float32 CPU cos / sin, which are not correctly rounded.
"""

import numpy as np
import pytest

import numbapos.functional as F

HEAD_DIM, POSITIONS = 128, 256


def _ulps(a, b):
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


def test_float32_angle_cos_sin_are_within_one_ulp_of_transformers():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(hidden_size=4 * HEAD_DIM, num_attention_heads=4,
                         max_position_embeddings=POSITIONS)
    hf = LlamaRotaryEmbedding(config)
    cos, sin = hf(torch.zeros(1, POSITIONS, HEAD_DIM), torch.arange(POSITIONS)[None])
    half = HEAD_DIM // 2
    cos, sin = cos[0, :, :half].numpy(), sin[0, :, :half].numpy()
    inv_freq = hf.inv_freq.double().numpy()
    # A unit first half rotates into (cos | sin) exactly: 1 * c - 0 * s and 0 * c + 1 * s.
    unit = np.zeros((1, 1, POSITIONS, HEAD_DIM), np.float32)
    unit[..., :half] = 1
    got = F.apply_rotary(unit, np.arange(POSITIONS), inv_freq, float32_angle=True)[0, 0]
    ours_cos, ours_sin = got[:, :half], got[:, half:]

    angle = np.arange(POSITIONS, dtype=np.float32)[:, None] * inv_freq.astype(np.float32)
    np.testing.assert_array_equal(ours_cos, np.cos(angle.astype(np.float64)).astype(np.float32))
    np.testing.assert_array_equal(ours_sin, np.sin(angle.astype(np.float64)).astype(np.float32))
    for ours, theirs in ((ours_cos, cos), (ours_sin, sin)):
        assert _ulps(ours, theirs).max() <= 1
        assert np.count_nonzero(ours != theirs) < 0.1 * ours.size  # about 5% measured
