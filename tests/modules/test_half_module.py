"""Module.to("bfloat16" | "float16"), .bfloat16(), .half(): Embedding tables rounded to
nearest even, everything else left as it is, optimisers keep working."""

import numpy as np
import pytest

import numbapos
from numbapos import nn

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)


class _Tagger(nn.Module):
    """An Embedding and a LayerNorm: only the table becomes 16-bit."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 6, seed=0, sparse=True)
        self.norm = nn.LayerNorm(6)

    def forward(self, ids):
        return self.norm(self.emb(ids))

    def backward(self, grad):
        return self.emb.backward(self.norm.backward(grad))


@pytest.mark.parametrize("spelling, dtype", [("bfloat16", BF16), ("float16", F16),
                                             ("half", F16), (BF16, BF16)], ids=str)
def test_to_a_16_bit_dtype_rounds_embedding_tables_only(spelling, dtype):
    model = _Tagger()
    table = model.emb.weight.data.copy()
    gamma = model.norm.weight.data.copy()
    assert model.to(spelling) is model
    assert model.emb.weight.dtype == dtype
    assert model.emb.weight.data.nbytes == table.nbytes // 2
    np.testing.assert_array_equal(model.emb.weight.data.view(np.uint16),
                                  table.astype(dtype).view(np.uint16))
    assert model.norm.weight.dtype == np.float32
    np.testing.assert_array_equal(model.norm.weight.data, gamma)
    ids = np.array([[1, 4, 4], [10, 0, 3]])
    widened = _Tagger()
    widened.emb.weight.data[...] = table.astype(dtype).astype(np.float32)
    y = model(ids)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, widened(ids))
    model.float()  # back to float32, exactly
    np.testing.assert_array_equal(model.emb.weight.data, table.astype(dtype).astype(np.float32))


def test_bfloat16_and_half_methods():
    assert nn.Embedding(3, 2).bfloat16().weight.dtype == BF16
    assert nn.Embedding(3, 2).half().weight.dtype == F16
    torch = pytest.importorskip("torch")
    assert nn.Embedding(3, 2).to(torch.bfloat16).weight.dtype == BF16


def test_an_optimiser_made_before_keeps_training_the_16_bit_table():
    model = _Tagger()
    opt = numbapos.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, seed=2)
    ids = np.array([1, 4, 4, 7])
    for step in range(3):
        y = model(ids)
        model.backward(np.ones_like(y))
        if step == 1:
            model.to("bfloat16")  # a gradient pending: it becomes float32
            assert model.emb.weight.grad.dtype == np.float32
        opt.step()
        model.zero_grad()
    assert model.emb.weight.dtype == BF16
    state = opt.state_dict()["state"][0]
    assert state["momentum_buffer"].dtype == np.float32 and state["rounding_step"] == 2


def test_float64_bert_blocks_and_bad_dtypes_are_refused():
    # BERT's fused kernels compute in float32 beside 16-bit tables (tests/ops/test_half_blocks.py):
    # a float64 LayerNorm would be rounded silently.
    block = nn.BertEmbeddings(vocab_size=20, hidden_size=8, max_position_embeddings=16,
                              type_vocab_size=2, seed=0, dtype=np.float64)
    with pytest.raises(TypeError, match="BertEmbeddings computes in float32.*float\\(\\)"):
        block.to("bfloat16")
    assert block.word_embeddings.weight.dtype == np.float64  # nothing changed
    with pytest.raises(ValueError, match="bfloat16, float16"):
        nn.Embedding(3, 2).to("int8x")
    with pytest.raises(TypeError, match="dtype"):
        nn.Embedding(3, 2).to(np.int8)


def test_bfloat16_tables_move_to_cuda():
    if not numbapos.cuda_available():
        pytest.skip("CUDA is not available (no GPU and the simulator is off)")
    moved = nn.Embedding(3, 2).to("cuda", "bfloat16")
    assert moved.weight.dtype == BF16 and moved.weight.device == "cuda"
    gpu = nn.Embedding(3, 2, device="cuda")
    assert gpu.bfloat16().weight.dtype == BF16 and gpu.weight.device == "cuda"
    assert gpu.half().weight.dtype == F16
