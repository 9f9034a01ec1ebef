"""Checkpoints of a whole run: nested state through io.save_state / io.load_state (no pickle),
bit-identical resumption, and strict load_state_dict errors worded as PyTorch's."""

import json

import numpy as np
import pytest
from conftest import host, on
from training import assert_same_bits

from numbapos import io, nn, optim

safetensors = pytest.importorskip("safetensors")


# ------------------------------------------------------------------ nested state


def test_nested_state_round_trips_exactly(tmp_path):
    state = {
        "model": {"weight": np.arange(6, dtype=np.float32).reshape(2, 3),
                  "dropout.seed": np.array(2**64 - 1, np.uint64)},
        "step": 12, "lr": 0.1 + 0.2, "name": "run-7", "done": False, "parent": None,
        "history": [1.5, -0.0, float("inf"), [2, "x"], (3, None)],
        "by_index": {0: "zero", 1.5: [True], None: {"deep": np.ones(2, np.int64)}},
        "scalar": np.float32(0.1), "double": np.float64(0.1), "flag": np.bool_(True),
        "empty": {}, "nothing": [],
    }
    path = tmp_path / "run.safetensors"
    io.save_state(state, path, metadata={"format": "np"})
    back = io.load_state(path)
    assert back.keys() == state.keys()
    assert_same_bits(back["model"]["weight"], state["model"]["weight"])
    assert_same_bits(back["model"]["dropout.seed"], state["model"]["dropout.seed"])
    assert_same_bits(back["by_index"][None]["deep"], np.ones(2, np.int64))
    assert back["step"] == 12 and type(back["step"]) is int
    assert back["lr"] == 0.1 + 0.2 and back["done"] is False and back["parent"] is None
    assert back["history"][:3] == [1.5, -0.0, float("inf")]
    assert str(back["history"][1]) == "-0.0"
    assert back["history"][3:] == [[2, "x"], (3, None)]
    assert isinstance(back["history"][4], tuple)
    assert back["by_index"][0] == "zero" and back["by_index"][1.5] == [True]
    for key in ("scalar", "double", "flag"):  # NumPy scalars keep their type
        assert type(back[key]) is type(state[key]) and back[key] == state[key]
    assert back["empty"] == {} and back["nothing"] == []
    # The caller's metadata is kept; the structure sits under numbapos's own key.
    assert io.load_metadata(path) == {"format": "np"}
    with safetensors.safe_open(str(path), framework="numpy") as f:
        tree = json.loads(f.metadata()["numbapos.state"])
        assert "model.weight" in f.keys()
    assert tree["dict"][0][0] == "model"


def test_flat_dicts_are_saved_exactly_as_before(tmp_path):
    arrays = {"a.weight": np.ones((2, 2), np.float32), "b": np.arange(3),
              "c": np.float64(2.5)}  # a NumPy scalar: a 0-d tensor, as before
    path = tmp_path / "flat.safetensors"
    io.save_state(arrays, path)
    with safetensors.safe_open(str(path), framework="numpy") as f:
        assert f.metadata() is None and sorted(f.keys()) == ["a.weight", "b", "c"]
    back = io.load_state(path)
    assert list(back) == ["a.weight", "b", "c"]
    for name, value in arrays.items():
        assert_same_bits(back[name], np.asarray(value))


@pytest.mark.parametrize("state, error, message", [
    ({"a": {"b": object()}}, TypeError, r"state\['a'\]\['b'\]: cannot store a object"),
    ({"a": [nn.LayerNorm(2)]}, TypeError, r"state\['a'\]\[0\].*save its state_dict\(\)"),
    ({"a": {(1, 2): 1}}, TypeError, r"state\['a'\]: dict keys must be str"),
    ({"a": [np.zeros(2, np.complex128)]}, TypeError, "complex128"),
])
def test_bad_nested_state_writes_nothing(tmp_path, state, error, message):
    path = tmp_path / "bad.safetensors"
    with pytest.raises(error, match=message):
        io.save_state(state, path)
    assert not path.exists()


def test_the_reserved_metadata_key_is_refused(tmp_path):
    with pytest.raises(ValueError, match="'numbapos.state' is numbapos's own"):
        io.save_state({"a": np.ones(1)}, tmp_path / "x.safetensors",
                      metadata={"numbapos.state": "{}"})


# ------------------------------------------------------------------ resuming a run


def _model(device, seed):
    model = nn.Sequential(nn.Embedding(20, 6, seed=seed, dtype=np.float32),
                          nn.LayerNorm(6), nn.Dropout(0.25, seed=seed))
    return model.to(device)


def _batches(count, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 20, size=(3, 5)), rng.standard_normal((3, 5, 6)).astype(np.float32))
            for _ in range(count)]


def _train(model, opt, batches, device):
    for ids, grad in batches:
        model(on(device, ids))
        model.backward(on(device, grad))
        opt.step()
        model.zero_grad()


@pytest.mark.parametrize("make_opt", [
    lambda ps: optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01),
    lambda ps: optim.Adam(ps, lr=0.05, betas=(0.8, 0.99)),
    lambda ps: optim.AdamW(ps, lr=0.05, amsgrad=True),
], ids=["sgd-momentum", "adam", "adamw-amsgrad"])
def test_a_restored_run_continues_bit_identically(tmp_path, device, make_opt):
    # Two steps before the checkpoint (every state array and scalar has moved off its
    # start) and two after (a state not restored, or restored wrong, shows in the
    # first; the second uses the state the first restored step wrote). Each step is
    # several simulated kernel launches on CUDA: more steps catch nothing more.
    batches = _batches(4)
    # The uninterrupted run.
    model = _model(device, seed=1)
    opt = make_opt(model.parameters())
    _train(model, opt, batches, device)
    # The same run, interrupted after 2 steps and restored into fresh objects.
    first = _model(device, seed=1)
    first_opt = make_opt(first.parameters())
    _train(first, first_opt, batches[:2], device)
    path = tmp_path / "run.safetensors"
    io.save_state({"model": first.state_dict(), "optimizer": first_opt.state_dict(),
                   "step": 2, "config": {"name": "tiny", "dims": [20, 6]}}, path)
    restored = _model(device, seed=99)  # other initial values and another dropout stream
    restored_opt = make_opt(restored.parameters())
    checkpoint = io.load_state(path)
    restored.load_state_dict(checkpoint["model"])
    restored_opt.load_state_dict(checkpoint["optimizer"])
    assert checkpoint["step"] == 2 and checkpoint["config"] == {"name": "tiny", "dims": [20, 6]}
    _train(restored, restored_opt, batches[2:], device)
    for (name, want), got in zip(model.state_dict().items(), restored.state_dict().values(),
                                 strict=True):
        assert_same_bits(host(got), host(want)), name
    want_state = opt.state_dict()["state"]
    got_state = restored_opt.state_dict()["state"]
    assert want_state.keys() == got_state.keys()
    for index, values in want_state.items():
        for key, value in values.items():
            if isinstance(value, np.ndarray):
                assert_same_bits(got_state[index][key], value)
            else:
                assert got_state[index][key] == value


# ------------------------------------------------------------------ strict loads


def test_strict_load_errors_are_pytorchs():
    emb = nn.Embedding(3, 2, seed=0)
    before = emb.weight.data.copy()
    with pytest.raises(RuntimeError) as info:
        emb.load_state_dict({"wieght": np.zeros((3, 2), np.float32)})
    message = str(info.value)
    assert message.startswith(
        'Error(s) in loading state_dict for Embedding:\n\tMissing key(s) in state_dict: '
        '"weight". \n\tUnexpected key(s) in state_dict: "wieght". \n\t'
        'Missing parameter(s): "weight".')
    assert "strict=False" in message
    np.testing.assert_array_equal(emb.weight.data, before)
    # Which way round PyTorch words it, when torch is here.
    torch = pytest.importorskip("torch")
    with pytest.raises(RuntimeError) as peer:
        torch.nn.Embedding(3, 2).load_state_dict({"wieght": torch.zeros(3, 2)})
    assert message.startswith(str(peer.value).rstrip())


def test_missing_buffers_are_named_as_buffers():
    class WithBuffer(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(3, 2, seed=0)
            self.register_buffer("scale", np.ones(2, np.float32))

    model = WithBuffer()
    with pytest.raises(RuntimeError, match='Missing parameter\\(s\\): "table.weight"; buffer\\(s'
                                           '\\): "scale"\\.'):
        model.load_state_dict({})
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\) in state_dict: \"x\", \"y\". "):
        model.load_state_dict({**model.state_dict(), "x": np.ones(1), "y": np.ones(1)})
    result = model.load_state_dict({"scale": np.ones(2)}, strict=False)
    assert result.missing_keys == ["table.weight"] and result.unexpected_keys == []


def test_a_state_without_the_dropout_stream_loads_and_keeps_the_stream():
    model = nn.BertEmbeddings(10, 4, max_position_embeddings=6, type_vocab_size=2,
                              hidden_dropout_prob=0.5, seed=3)
    model.dropout.counter = 5
    seed = model.dropout.seed
    state = {k: v.copy() + 1 for k, v in model.state_dict().items()
             if k not in ("dropout.seed", "dropout.counter")}
    assert len(state) == len(model.state_dict()) - 2
    result = model.load_state_dict(state)  # strict
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert model.dropout.seed == seed and model.dropout.counter == 5
    np.testing.assert_array_equal(model.word_embeddings.weight.data,
                                  state["word_embeddings.weight"])
    # Given, they are loaded.
    full = {k: v.copy() for k, v in model.state_dict().items()}
    full["dropout.counter"] = np.array(9, np.uint64)
    model.load_state_dict(full)
    assert model.dropout.counter == 9
    # Only the stream may be left out.
    del full["LayerNorm.bias"]
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "LayerNorm.bias"'):
        model.load_state_dict(full)
