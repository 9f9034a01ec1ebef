"""Shapes that configure nothing silently: ALiBi, the position tables, dropout, LayerNorm and
the BERT / GPT-2 blocks take an input of a shape that would use part of a configured size
(a table wider than the data, a mask shorter or longer than the sequence, more slopes than
heads) only where that is the op's documented meaning (a position table longer than the
sequence); anything else raises, naming the argument, the value and what was expected, and
leaves every array as it was.
"""

import numpy as np
import pytest
from conftest import host, on

import numbapos.functional as F
from numbapos import nn

N, L, D = 2, 5, 4
IDS = np.array([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]])


def _arrays():
    rng = np.random.default_rng(7)
    return {
        "x": rng.standard_normal((N, L, D)).astype(np.float32),
        "table": rng.standard_normal((8, D)).astype(np.float32),
        "wide": rng.standard_normal((8, D + 1)).astype(np.float32),
        "scores": rng.standard_normal((N, 2, 3, L)).astype(np.float32),
        "wte": rng.standard_normal((10, D)).astype(np.float32),
        "wpe": rng.standard_normal((8, D)).astype(np.float32),
        "types": rng.standard_normal((2, D)).astype(np.float32),
        "vec": np.ones(D + 1, np.float32),
        "out": np.full((N, L, D), 7.0, np.float32),
    }


CASES = [
    # ALiBi: the mask must cover exactly the keys, the slopes exactly the heads.
    ("alibi mask shorter than the keys",
     lambda a: F.add_alibi_(a["scores"], F.alibi_slopes(2), mode="bloom",
                            attention_mask=np.ones((N, L - 1), np.int64)),
     ValueError, r"attention_mask: expected shape \(5,\), \(1, 5\) or \(2, 5\).*got \(2, 4\)"),
    ("alibi mask longer than the keys",
     lambda a: F.alibi_bias(F.alibi_slopes(2), 1, L, mode="bloom",
                            attention_mask=np.ones((N, L + 2), np.int64)),
     ValueError, r"attention_mask: expected shape \(5,\).*got \(2, 7\)"),
    ("alibi mask of another batch",
     lambda a: F.alibi_slopes_grad(a["scores"], mode="bloom",
                                   attention_mask=np.ones((N + 1, L), np.int64)),
     ValueError, r"attention_mask: expected shape .*\(2, 5\).*got \(3, 5\)"),
    ("more slopes than heads",
     lambda a: F.add_alibi_(a["scores"], F.alibi_slopes(3)),
     ValueError, r"slopes: 3 slopes for scores with 2 heads"),
    ("ALiBi module of other heads",
     lambda a: nn.ALiBi(3)(a["scores"]),
     ValueError, r"scores: expected 3 heads .*got shape \(2, 2, 3, 5\)"),
    # Position tables: their width is the data's; ids cover exactly the sequence.
    ("position table wider than x",
     lambda a: F.add_positional(a["x"], a["wide"], out=a["out"]),
     ValueError, r"table: has 5 columns but x has last dimension 4"),
    ("position ids shorter than the sequence",
     lambda a: F.add_positional(a["x"], a["table"], position_ids=np.arange(L - 1), out=a["out"]),
     ValueError, r"position_ids: expected shape \(5,\) or \(1, 5\) or \(2, 5\).*got \(4,\)"),
    ("fractional position ids of another batch",
     lambda a: F.add_positional(a["x"], a["table"], position_ids=np.full((N + 1, L), 0.5),
                                out=a["out"]),
     ValueError, r"position_ids: expected shape .*got \(3, 5\)"),
    ("positions past the table",
     lambda a: F.add_positional(a["x"], a["table"], offset=4, out=a["out"]),
     ValueError, r"offset: positions offset=4 .. offset\+L-1=8 \(L=5\) must lie in "
                 r"\[0, max_len=8\)"),
    ("multiply-add tables of different lengths",
     lambda a: F.positional_mult_add(a["x"], a["table"], a["table"][:6], out=a["out"]),
     ValueError, r"b: expected shape \(8, 4\) \(the shape of a\), got \(6, 4\)"),
    ("multiply-add tables shorter than the sequence",
     lambda a: F.positional_mult_add(a["x"], a["table"][:3], a["table"][:3], out=a["out"]),
     ValueError, r"x: sequence is too long: L=5 positions but the tables hold max_len=3"),
    ("sinusoid buffer of another shape",
     lambda a: F.sinusoidal_pos_embedding(L, D + 1, out=a["out"][0]),
     ValueError, r"out"),
    ("learned table of another width",
     lambda a: nn.LearnedPosEmbedding(8, D + 1)(a["x"]),
     ValueError, r"x: last dimension 4 does not match embed_dim=5"),
    ("NeoML layer past max_len",
     lambda a: nn.PositionalEmbedding(3, D)(a["x"]),
     ValueError, r"x: sequence is too long: L=5 but max_len=3"),
    ("fixed sinusoid width",
     lambda a: nn.SinusoidalPosEmbedding(embed_dim=D + 1)(a["x"]),
     ValueError, r"x: last dimension D=4 differs from embed_dim=5"),
    # Dropout and LayerNorm: buffers and parameters of exactly the data's shape.
    ("dropout buffer of another shape",
     lambda a: F.dropout(a["x"], 0.5, 0, out=a["out"][:, :L - 1]),
     ValueError, r"out"),
    ("LayerNorm weight wider than x",
     lambda a: F.layer_norm(a["x"], a["vec"], out=a["out"]),
     ValueError, r"weight: expected shape \(4,\) \(the last dimension of x\), got \(5,\)"),
    ("LayerNorm module of another width",
     lambda a: nn.LayerNorm(D + 1)(a["x"], out=a["out"]),
     ValueError, r"x: expected last dimension normalized_shape=5"),
    # The blocks: ids, masks and LayerNorm vectors of exactly the input's shape.
    ("BERT token types shorter than the sequence",
     lambda a: F.bert_embeddings(IDS, a["wte"], a["wpe"], a["types"],
                                 token_type_ids=np.zeros((N, L - 1), np.int64), out=a["out"]),
     ValueError, r"token_type_ids: expected shape \(2, 5\) or \(1, 5\) or \(5,\).*got \(2, 4\)"),
    ("BERT LayerNorm bias wider than the tables",
     lambda a: F.bert_embeddings(IDS, a["wte"], a["wpe"], a["types"], ln_bias=a["vec"],
                                 out=a["out"]),
     ValueError, r"ln_bias: expected shape \(4,\) \(the hidden size\), got \(5,\)"),
    ("GPT-2 position table of another width",
     lambda a: F.gpt2_embeddings(IDS, a["wte"], a["wide"], out=a["out"]),
     ValueError, r"wpe: expected 4 columns"),
    ("GPT-2 mask shorter than the sequence, beside explicit positions",
     lambda a: F.gpt2_embeddings(IDS, a["wte"], a["wpe"], position_ids=np.arange(L),
                                 attention_mask=np.ones((N, L - 2), np.int64), out=a["out"]),
     ValueError, r"attention_mask: expected shape \(2, 5\) \(input_ids.shape with "
                 r"past_length \+ L = 0 \+ 5 columns\), got \(2, 3\)"),
    ("GPT-2 mask without the cached columns, beside explicit positions",
     lambda a: F.gpt2_embeddings_backward(a["out"], IDS, 10, 8, past_length=2,
                                          position_ids=np.arange(2, 2 + L),
                                          attention_mask=np.ones((N, L), np.int64)),
     ValueError, r"attention_mask: expected shape \(2, 7\)"),
]


@pytest.mark.parametrize("name, call, error, match", CASES, ids=[c[0] for c in CASES])
def test_a_shape_that_would_configure_part_of_an_op_raises(name, call, error, match):
    arrays = _arrays()
    before = {k: v.copy() for k, v in arrays.items()}
    with pytest.raises(error, match=match):
        call(arrays)
    for key, value in arrays.items():
        np.testing.assert_array_equal(value, before[key], err_msg=key)


def test_gpt2_mask_beside_positions_is_checked_but_not_read(device):
    rng = np.random.default_rng(3)
    block = nn.GPT2Embeddings(10, 8, D, embd_pdrop=0.0, seed=0, device=device)
    ids = on(device, IDS)
    positions = on(device, np.array([0, 2, 4, 6, 7]))
    mask = on(device, (rng.random((N, L)) < 0.7).astype(np.int64))
    with_mask = host(block(ids, position_ids=positions, attention_mask=mask))
    np.testing.assert_array_equal(with_mask, host(block(ids, position_ids=positions)))
    before, pending, counter = host(block.wte.weight.data).copy(), block.pending_backwards(), \
        block.drop.counter
    with pytest.raises(ValueError, match=r"attention_mask: expected shape \(2, 5\)"):
        block(ids, position_ids=positions, attention_mask=on(device, np.ones((N, 3), np.int64)))
    assert (block.pending_backwards(), block.drop.counter) == (pending, counter)
    np.testing.assert_array_equal(host(block.wte.weight.data), before)


def test_documented_broadcasts_follow_pytorch():
    """The shapes that do broadcast are PyTorch's / transformers' own: (L,) or (1, L) ids
    shared by the batch, a (Lk,) ALiBi mask shared by the batch, position tables longer
    than the sequence read from their first (or offset) row."""
    arrays = _arrays()
    x, table = arrays["x"], arrays["table"]
    shared = F.add_positional(x, table, position_ids=np.array([3, 1, 0, 2, 7]))
    tiled = F.add_positional(x, table, position_ids=np.tile([3, 1, 0, 2, 7], (N, 1)))
    np.testing.assert_array_equal(shared, tiled)
    np.testing.assert_array_equal(F.add_positional(x, table, offset=2), x + table[2:2 + L])
    mask = np.array([0, 1, 1, 1, 1])
    scores = arrays["scores"]
    one = F.add_alibi_(scores.copy(), F.alibi_slopes(2), mode="bloom", attention_mask=mask)
    each = F.add_alibi_(scores.copy(), F.alibi_slopes(2), mode="bloom",
                        attention_mask=np.tile(mask, (N, 1)))
    np.testing.assert_array_equal(one, each)
    a, b = table, table[::-1].copy()
    np.testing.assert_array_equal(F.positional_mult_add(x, a, b), a[:L] * x + b[:L])
