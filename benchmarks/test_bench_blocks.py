"""The BERT and GPT-2 embedding blocks and LayerNorm against NumPy and PyTorch CPU.

BERT-base shapes: batch 32, sequence 128, hidden 768, vocabulary 30522.
Target: the fused BERT block forward >= 2x PyTorch (3 x nn.Embedding +
nn.LayerNorm + dropout in eval mode, under ``torch.no_grad``), also at MiniLM
width (D = 384, groups ``bert_block_384`` / ``bert_block_train_384`` /
``gpt2_block_384``).

Run with ``pytest benchmarks/test_bench_blocks.py --benchmark-group-by=group``.
"""

import numpy as np
import pytest
from conftest import IMPLEMENTATIONS, skip_without_torch, torch

from numbapos import functional as F
from numbapos import nn, no_grad

VOCAB, HIDDEN, MAX_POS, TYPES = 30522, 768, 512, 2
MINILM_HIDDEN = 384
BATCH, SEQ = 32, 128
EPS = 1e-12
P_DROP = 0.1


_BERT_DATA = {}


def _bert_data(hidden):
    """Block, ids, token types and output gradient at width ``hidden`` (made once)."""
    if hidden not in _BERT_DATA:
        _BERT_DATA[hidden] = _make_bert_data(hidden)
    return _BERT_DATA[hidden]


def _make_bert_data(hidden):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCAB, size=(BATCH, SEQ))
    types = rng.integers(0, TYPES, size=(BATCH, SEQ))
    grad = rng.normal(size=(BATCH, SEQ, hidden)).astype(np.float32)
    block = nn.BertEmbeddings(VOCAB, hidden, MAX_POS, TYPES, hidden_dropout_prob=P_DROP, seed=0)
    block.LayerNorm.weight.data[:] = rng.normal(1.0, 0.1, hidden)
    block.LayerNorm.bias.data[:] = rng.normal(0.0, 0.1, hidden)
    return block, ids, types, grad


@pytest.fixture(scope="module")
def data():
    return _bert_data(HIDDEN)


# BERT-base width, and MiniLM's (D = 384, the rest as BERT-base) in groups of its own.
WIDTHS = [HIDDEN, MINILM_HIDDEN]


def _group(name, width):
    return name if width == HIDDEN else f"{name}_{width}"


def _tables(block):
    return (block.word_embeddings.weight.data, block.position_embeddings.weight.data,
            block.token_type_embeddings.weight.data, block.LayerNorm.weight.data,
            block.LayerNorm.bias.data)


def _numpy_bert_forward(ids, types, word, pos, tt, gamma, beta):
    total = word[ids] + tt[types] + pos[np.arange(ids.shape[1])]
    mean = total.mean(axis=-1, keepdims=True)
    centred = total - mean
    rstd = 1.0 / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + np.float32(EPS))
    xhat = centred * rstd
    return xhat * gamma + beta, xhat, rstd


def _torch_bert(block):
    word = torch.nn.Embedding.from_pretrained(torch.tensor(_tables(block)[0]), freeze=False,
                                              padding_idx=0)
    pos = torch.nn.Embedding.from_pretrained(torch.tensor(_tables(block)[1]), freeze=False)
    tt = torch.nn.Embedding.from_pretrained(torch.tensor(_tables(block)[2]), freeze=False)
    ln = torch.nn.LayerNorm(_tables(block)[3].shape[0], eps=EPS)
    with torch.no_grad():
        ln.weight.copy_(torch.tensor(_tables(block)[3]))
        ln.bias.copy_(torch.tensor(_tables(block)[4]))
    drop = torch.nn.Dropout(P_DROP)
    positions = torch.arange(SEQ)[None]

    def forward(ids, types):
        # The order of transformers' BertEmbeddings.forward.
        return drop(ln(word(ids) + tt(types) + pos(positions)))

    params = [word.weight, pos.weight, tt.weight, ln.weight, ln.bias]
    return forward, drop, params


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("width", WIDTHS)
def test_bert_block_forward(benchmark, impl, width):
    """Eval-mode forward: gather x3, sum, LayerNorm (dropout is the identity)."""
    skip_without_torch(impl)
    benchmark.group = _group("bert_block", width)
    block, ids, types, _ = _bert_data(width)
    block.eval()
    reference = block(ids, token_type_ids=types)  # also compiles the kernels
    if impl == "numbapos":
        result = benchmark(no_grad()(block), ids, token_type_ids=types)
    elif impl == "numpy":
        tables = _tables(block)
        result = benchmark(lambda: _numpy_bert_forward(ids, types, *tables)[0])
    else:
        forward, drop, _ = _torch_bert(block)
        drop.eval()
        t_ids, t_types = torch.from_numpy(ids), torch.from_numpy(types)
        with torch.no_grad():
            result = benchmark(forward, t_ids, t_types).numpy()
    np.testing.assert_allclose(result, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.benchmark(group="bert_block_out")
def test_bert_block_forward_into_buffer(benchmark, data):
    """numbapos only: the same forward writing into a preallocated ``out`` (no allocation)."""
    block, ids, types, _ = data
    block.eval()
    out = np.empty((BATCH, SEQ, HIDDEN), np.float32)
    block(ids, token_type_ids=types, out=out)
    benchmark(no_grad()(block), ids, token_type_ids=types, out=out)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("width", WIDTHS)
def test_bert_block_forward_backward(benchmark, impl, width):
    """Training step of the block: forward with dropout, backward into all five parameters."""
    skip_without_torch(impl)
    benchmark.group = _group("bert_block_train", width)
    block, ids, types, grad = _bert_data(width)
    hidden = grad.shape[-1]
    if impl == "numbapos":
        block.train()

        def step():
            block.zero_grad()
            block(ids, token_type_ids=types)
            block.backward(grad)
    elif impl == "numpy":
        word, pos, tt, gamma, beta = _tables(block)
        rng = np.random.default_rng(1)
        scale = np.float32(1 / (1 - P_DROP))
        flat_ids, flat_types = ids.reshape(-1), types.reshape(-1)
        flat_pos = np.tile(np.arange(SEQ), BATCH)

        def step():
            y, xhat, rstd = _numpy_bert_forward(ids, types, word, pos, tt, gamma, beta)
            mask = (rng.random(y.shape, dtype=np.float32) >= P_DROP) * scale
            y = y * mask
            g_y = grad * mask
            g_gamma = (g_y * xhat).sum(axis=(0, 1))
            g_beta = g_y.sum(axis=(0, 1))
            g = g_y * gamma
            g_sum = rstd * (g - g.mean(-1, keepdims=True)
                            - xhat * (g * xhat).mean(-1, keepdims=True))
            g_sum = g_sum.reshape(-1, hidden)
            grads = []
            for flat, rows in ((flat_ids, VOCAB), (flat_pos, MAX_POS), (flat_types, TYPES)):
                table_grad = np.zeros((rows, hidden), np.float32)
                np.add.at(table_grad, flat, g_sum)
                grads.append(table_grad)
            grads[0][0] = 0  # padding row
            return y, grads, g_gamma, g_beta
    else:
        forward, drop, params = _torch_bert(block)
        drop.train()
        t_ids, t_types, t_grad = (torch.from_numpy(a) for a in (ids, types, grad))

        def step():
            for param in params:
                param.grad = None
            forward(t_ids, t_types).backward(t_grad)
    step()
    benchmark(step)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("width", WIDTHS)
def test_gpt2_block_forward(benchmark, impl, width):
    """Eval-mode GPT-2 embeddings: wte[ids] + wpe[positions] (GPT-2 small shapes, D = 768 / 384)."""
    skip_without_torch(impl)
    benchmark.group = _group("gpt2_block", width)
    rng = np.random.default_rng(0)
    block = nn.GPT2Embeddings(50257, 1024, width, seed=0).eval()
    ids = rng.integers(0, 50257, size=(BATCH, SEQ))
    reference = block(ids)
    wte, wpe = block.wte.weight.data, block.wpe.weight.data
    if impl == "numbapos":
        result = benchmark(no_grad()(block), ids)
    elif impl == "numpy":
        result = benchmark(lambda: wte[ids] + wpe[np.arange(SEQ)])
    else:
        t_wte, t_wpe = torch.nn.Embedding.from_pretrained(torch.tensor(wte)), \
            torch.nn.Embedding.from_pretrained(torch.tensor(wpe))
        t_ids, positions = torch.from_numpy(ids), torch.arange(SEQ)[None]
        with torch.no_grad():
            result = benchmark(lambda: t_wte(t_ids) + t_wpe(positions)).numpy()
    np.testing.assert_array_equal(result, reference)


@pytest.mark.benchmark(group="layer_norm")
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_layer_norm_forward(benchmark, impl):
    """LayerNorm forward on (32 * 128, 768) float32."""
    skip_without_torch(impl)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * SEQ, HIDDEN)).astype(np.float32)
    weight = rng.normal(1.0, 0.1, HIDDEN).astype(np.float32)
    bias = rng.normal(0.0, 0.1, HIDDEN).astype(np.float32)
    reference = F.layer_norm(x, weight, bias)
    if impl == "numbapos":
        result = benchmark(F.layer_norm, x, weight, bias)
    elif impl == "numpy":
        def forward():
            centred = x - x.mean(-1, keepdims=True)
            var = (centred * centred).mean(-1, keepdims=True)
            return centred / np.sqrt(var + np.float32(1e-5)) * weight + bias
        result = benchmark(forward)
    else:
        t_x, t_w, t_b = (torch.from_numpy(a) for a in (x, weight, bias))
        with torch.no_grad():
            result = benchmark(torch.nn.functional.layer_norm, t_x, (HIDDEN,), t_w, t_b).numpy()
    np.testing.assert_allclose(result, reference, rtol=1e-4, atol=1e-4)


@pytest.mark.benchmark(group="layer_norm_backward")
@pytest.mark.parametrize("impl", ["numbapos", "torch"])
def test_layer_norm_backward(benchmark, impl):
    """LayerNorm backward (input, weight and bias gradients) on (32 * 128, 768) float32."""
    skip_without_torch(impl)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH * SEQ, HIDDEN)).astype(np.float32)
    gy = rng.normal(size=x.shape).astype(np.float32)
    weight = rng.normal(1.0, 0.1, HIDDEN).astype(np.float32)
    bias = np.zeros(HIDDEN, np.float32)
    if impl == "numbapos":
        _, mean, rstd = F.layer_norm_forward(x, weight, bias)
        F.layer_norm_backward(gy, x, mean, rstd, weight, bias)
        benchmark(F.layer_norm_backward, gy, x, mean, rstd, weight, bias)
    else:
        t_x = torch.from_numpy(x).requires_grad_(True)
        t_w = torch.from_numpy(weight).requires_grad_(True)
        t_b = torch.from_numpy(bias).requires_grad_(True)
        out = torch.nn.functional.layer_norm(t_x, (HIDDEN,), t_w, t_b)
        t_gy = torch.from_numpy(gy)
        benchmark(lambda: torch.autograd.grad(out, (t_x, t_w, t_b), t_gy, retain_graph=True))
