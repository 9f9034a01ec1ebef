"""numbapos.distributed without Ray: in-process shards, and checkpoints resharded offline."""

import json
import subprocess
import sys

import numpy as np
import pytest
from training import assert_same_bits, train_steps

from numbapos import nn, optim
from numbapos.distributed import ShardedEmbedding, checkpoint


def _batches(count, num_rows, dim, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, num_rows, size=(3, 8)),
             rng.standard_normal((3, 8, dim)).astype(np.float32)) for _ in range(count)]


OPTIMIZERS = [
    (optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    (optim.Adam, {"lr": 0.05}),
    (optim.AdamW, {"lr": 0.05, "weight_decay": 0.1, "betas": (0.8, 0.99)}),
    (optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01}),
    (optim.RowWiseAdagrad, {"lr": 0.1}),
]


@pytest.mark.parametrize("optimizer, kwargs", OPTIMIZERS,
                         ids=[o.__name__ for o, _ in OPTIMIZERS])
@pytest.mark.parametrize("num_shards", [1, 2, 3])
def test_local_shards_train_like_one_process(num_shards, optimizer, kwargs):
    batches = _batches(5, 30, 4, seed=num_shards)
    batches[2][0][:] = 2  # a batch of padding only: no rows to update, steps still count
    emb = nn.Embedding(30, 4, padding_idx=2, max_norm=1.0, sparse=True,
                       init=nn.init.keyed_normal(7))
    emb.weight.data[2] = 0
    opt = optimizer(emb.parameters(), **kwargs)
    want = train_steps(emb, opt, batches)
    table = ShardedEmbedding(30, 4, num_shards, padding_idx=2, max_norm=1.0, seed=7,
                             optimizer=optimizer, optimizer_kwargs=kwargs, backend="local")
    got = train_steps(table, None, batches)
    for a, b in zip(got, want, strict=True):
        assert_same_bits(a, b)
    assert_same_bits(table.to_embedding().weight.data, emb.weight.data)


def test_offline_reshard_moves_rows_and_their_state(tmp_path):
    table = ShardedEmbedding(11, 3, 2, seed=1, optimizer_kwargs={"lr": 0.1, "momentum": 0.5},
                             backend="local")
    train_steps(table, None, _batches(2, 11, 3))
    table.save(tmp_path / "two")
    whole = table.to_embedding().weight.data
    momentum = np.empty_like(whole)
    for index, shard in enumerate(table._shards):
        momentum[index::2] = shard._shard.optimizer.state_dict()["state"][0]["momentum_buffer"]
    assert checkpoint.main([str(tmp_path / "two"), str(tmp_path / "three"),
                            "--num-shards", "3"]) == 0
    manifest = checkpoint.read_manifest(tmp_path / "three")
    assert manifest["num_shards"] == 3 and manifest["step"] == table.step
    for index in range(3):
        data = checkpoint.read_shard(tmp_path / "three" / manifest["shards"][index])
        np.testing.assert_array_equal(data["weight"], whole[index::3])
        np.testing.assert_array_equal(data["rows"]["momentum_buffer"], momentum[index::3])
        assert data["scalars"] == {"dense_started": False}
    # A manifest of another format is refused.
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="format"):
        checkpoint.read_manifest(bad)
    with pytest.raises(ValueError, match="num_shards"):
        checkpoint.reshard(tmp_path / "two", tmp_path / "x", 12)


def test_command_line_entry_point():
    result = subprocess.run([sys.executable, "-m", "numbapos.distributed", "--help"],
                            capture_output=True, text=True, check=True)
    assert "--num-shards" in result.stdout and result.stderr == ""


def test_backend_is_checked():
    with pytest.raises(ValueError, match="backend"):
        ShardedEmbedding(4, 2, 1, optimizer_kwargs={"lr": 0.1}, backend="mpi")
