"""Error messages stay readable: large bad inputs are never printed whole."""

import numpy as np
import pytest

import numbapos.functional as F
from numbapos import _checks, io, nn, optim

BIG_LIST = np.zeros((64, 768)).tolist()  # repr: ~250,000 characters
BIG_STR = "x" * 100_000
LIMIT = 400  # a message names the argument, what was expected and what came, quoted <= ~200


def _calls():
    weight = np.ones((10, 4), np.float32)
    return [
        ("LayerNorm on a nested list", lambda: nn.LayerNorm(768)(BIG_LIST)),
        ("lookup table as a list", lambda: F.embedding([1, 2], BIG_LIST)),
        ("dropout of a list", lambda: F.dropout(BIG_LIST, 0.1, 0)),
        ("float indices", lambda: F.embedding(BIG_LIST, weight)),
        ("normalized_shape", lambda: nn.LayerNorm(list(range(100_000)))),
        ("positional type", lambda: nn.PositionalEmbedding(4, 8, type=BIG_STR)),
        ("learned init name", lambda: nn.LearnedPosEmbedding(4, 8, init=BIG_STR)),
        ("learned init object", lambda: nn.LearnedPosEmbedding(4, 8, init=BIG_LIST)),
        ("dtype", lambda: nn.Embedding(3, 2, dtype=BIG_STR)),
        ("integer argument", lambda: nn.Embedding(BIG_LIST, 2)),
        ("real argument", lambda: F.dropout(np.ones(3), BIG_LIST, 0)),
        ("device", lambda: nn.Embedding(3, 2, device=BIG_STR)),
        ("checkpoint path", lambda: io.save_state({"a": np.ones(2)}, BIG_LIST)),
        ("table options", lambda: F.gpt2_embeddings([1], weight, weight, table_options=BIG_LIST)),
        ("optimiser parameters", lambda: optim.SGD([BIG_LIST], lr=0.1)),
        ("attention mask", lambda: F.positions_from_attention_mask(BIG_STR)),
    ]


@pytest.mark.parametrize("name, call", _calls(), ids=[name for name, _ in _calls()])
def test_large_bad_inputs_give_short_messages(name, call):
    with pytest.raises((TypeError, ValueError, IndexError)) as info:
        call()
    message = str(info.value)
    assert len(message) <= LIMIT, f"{name}: {len(message)} characters: {message[:300]}..."


def test_quote_caps_at_about_200_characters():
    assert len(_checks.quote(BIG_STR)) <= _checks.MAX_QUOTE + 3
    assert _checks.quote("short") == "'short'"
