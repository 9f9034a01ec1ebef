"""The module layer's fast paths (issue 36's host cost) keep the general behaviour: zero_grad's
walk of the parameters, the tables a BERT block's record watches, the output registry."""

import numpy as np
import pytest

from numbapos import nn
from numbapos.nn import _records


def _tree():
    shared = nn.Embedding(7, 3, seed=0)
    inner = nn.Sequential(shared, nn.LayerNorm(3))
    model = nn.Sequential(inner, shared, nn.Sequential(inner, nn.Embedding(5, 3, seed=1)))
    model.tied = nn.Embedding(7, 3, _weight=shared.weight.data)
    model.tied.weight = shared.weight  # the same Parameter under a second module
    return model


def test_parameter_list_is_parameters_in_order():
    model = _tree()
    fast = model._parameter_list()
    assert [id(p) for p in fast] == [id(p) for p in model.parameters()]
    assert len(fast) == len({id(p) for p in fast}) == 4


def test_zero_grad_uses_an_overridden_traversal():
    class Partial(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Embedding(4, 2, seed=0)
            self.b = nn.Embedding(4, 2, seed=1)

        def parameters(self):
            yield self.a.weight

    model = Partial()
    for param in (model.a.weight, model.b.weight):
        param.grad = np.ones(param.shape, np.float32)
    model.zero_grad()
    assert model.a.weight.grad is None
    assert model.b.weight.grad is not None


@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad_reaches_shared_parameters(set_to_none):
    model = _tree()
    for param in model.parameters():
        param.grad = np.ones(param.shape, np.float32)
    model.zero_grad(set_to_none=set_to_none)
    for param in model.parameters():
        assert param.grad is None if set_to_none else not param.grad.any()


def test_bert_record_watches_a_replaced_child_table():
    block = nn.BertEmbeddings(11, 4, 16, hidden_dropout_prob=0.1, seed=0)
    ids = np.array([[1, 2, 3]])
    block(ids)
    block.backward(np.ones((1, 3, 4), np.float32))
    block.word_embeddings = nn.Embedding(11, 4, padding_idx=0, seed=3)
    block(ids)
    block.word_embeddings.weight.bump_version()
    with pytest.raises(RuntimeError, match="parameter 'word_embeddings.weight' was modified"):
        block.backward(np.ones((1, 3, 4), np.float32))
    block._release()
    block.position_embeddings.weight.data[0, 0] += 0  # same data, same version: no change
    block(ids)
    assert block.backward(np.ones((1, 3, 4), np.float32)) is None


def test_bert_dropout_counter_moves_once_per_training_forward():
    block = nn.BertEmbeddings(11, 4, 16, hidden_dropout_prob=0.1, seed=0)
    ids = np.array([[1, 2, 3]])
    block(ids)
    block(ids)
    assert block.dropout.counter == 2
    block.eval()
    block(ids)
    assert block.dropout.counter == 2


def test_an_array_output_is_tied_to_its_call():
    layer = nn.Embedding(5, 2, seed=0)
    y = layer(np.array([1, 2]))
    assert np.ndarray in _records._ARRAYS
    assert _records._graph_of(y) is not None
    assert _records._graph_of(y[0]) is _records._graph_of(y)  # a view, through .base
