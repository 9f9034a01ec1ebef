"""numbapos.distributed: a table sharded over Ray actors trains bit-identically to one process.

A local Ray cluster (2 CPUs, no dashboard) is started for this module and
shut down after it; the tests skip when Ray is not installed (``pip install
"numbapos[distributed]"``). Each reference run is ``nn.Embedding`` plus the
same optimiser in this process.
"""

import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest
from training import assert_same_bits, train_steps

from numbapos import functional as F
from numbapos import nn, optim
from numbapos.distributed import checkpoint as ckpt

ray = pytest.importorskip("ray")

from numbapos.distributed import ShardedEmbedding, StaleShardError  # noqa: E402
from numbapos.distributed.sharded import unique_id_grad  # noqa: E402

V, D = 23, 5


@pytest.fixture(scope="module", autouse=True)
def cluster():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started = not ray.is_initialized()
    if started:
        # The workers import numbapos from this checkout, whatever else is installed.
        root = str(pathlib.Path(__file__).resolve().parents[2])
        env = {"PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH"))
                                             if p)}
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": env})
    yield
    if started:
        ray.shutdown()


def _batches(steps, seed=0, shape=(4, 6)):
    """Skewed ids (repeats, the padding id 3 often) and random output gradients."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        ids = np.minimum(rng.zipf(1.3, size=shape) - 1, V - 1).astype(np.int64)
        ids[0, 0] = 3
        out.append((ids, rng.standard_normal(shape + (D,)).astype(np.float32)))
    return out


def _reference(options, optimizer, kwargs, seed=0):
    emb = nn.Embedding(V, D, **options)
    nn.init.keyed_normal_(emb.weight.data, seed)
    if emb.padding_idx is not None:
        emb.weight.data[emb.padding_idx] = 0
    return emb, optimizer(emb.parameters(), **kwargs)


SGD_MOMENTUM = (optim.SGD, {"lr": 0.1, "momentum": 0.9})
ADAMW = (optim.AdamW, {"lr": 0.05, "weight_decay": 0.1, "betas": (0.8, 0.99)})
CASES = [
    (1, dict(sparse=True), (optim.Adam, {"lr": 0.05})),
    (2, dict(sparse=True, padding_idx=3, max_norm=1.5, scale_grad_by_freq=True),
     (optim.SGD, {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 0.01})),
    (3, dict(sparse=False, padding_idx=3), SGD_MOMENTUM),
]


@pytest.mark.parametrize("num_shards, options, optimizer", CASES,
                         ids=[f"S={case[0]}" for case in CASES])
def test_training_is_bit_identical_to_one_process(num_shards, options, optimizer):
    batches = _batches(6, seed=num_shards)
    emb, opt = _reference(options, *optimizer)
    want = train_steps(emb, opt, batches)
    with ShardedEmbedding(V, D, num_shards, seed=0, optimizer=optimizer[0],
                          optimizer_kwargs=optimizer[1], **options) as table:
        start = table.to_embedding().weight.data
        got = train_steps(table, None, batches)
        for y_got, y_want in zip(got, want, strict=True):
            assert_same_bits(y_got, y_want)
        assert_same_bits(table.to_embedding().weight.data, emb.weight.data)
        assert table.step == 6 + (6 if options.get("max_norm") else 0)
    fresh, _ = _reference(options, *optimizer)
    assert_same_bits(start, fresh.weight.data)  # keyed initialisation: the one-machine table


def test_from_embedding_keeps_rows_and_options():
    emb = nn.Embedding(V, D, padding_idx=-1, scale_grad_by_freq=True, sparse=True, seed=5)
    batches = _batches(3, seed=9)
    reference = nn.Embedding(V, D, padding_idx=-1, scale_grad_by_freq=True, sparse=True,
                             _weight=emb.weight.data.copy())
    opt = optim.SGD(reference.parameters(), lr=0.2)
    want = train_steps(reference, opt, batches)
    with ShardedEmbedding.from_embedding(emb, num_shards=2, optimizer=optim.SGD,
                                         optimizer_kwargs={"lr": 0.2}) as table:
        assert (table.padding_idx, table.scale_grad_by_freq) == (V - 1, True)
        got = train_steps(table, None, batches)
        back = table.to_embedding()
    for y_got, y_want in zip(got, want, strict=True):
        assert_same_bits(y_got, y_want)
    assert_same_bits(back.weight.data, reference.weight.data)
    assert back.padding_idx == V - 1 and back.sparse


def test_unique_id_grad_equals_embedding_backward():
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 40, size=(7, 9))
    ids[1, 2] = 3
    grad = rng.standard_normal((7, 9, 6)).astype(np.float32)
    grad[0, 0, :] = -0.0
    unique, inverse = np.unique(ids.ravel(), return_inverse=True)
    for padding, scale in [(None, False), (3, True), (39, False)]:
        rows, values = unique_id_grad(grad, unique, inverse.reshape(ids.shape), padding, scale)
        want = F.embedding_backward(grad, ids, 40, padding_idx=padding,
                                    scale_grad_by_freq=scale, sparse=True)
        np.testing.assert_array_equal(rows, want.indices)
        assert values.tobytes() == want.values.tobytes()


def _wait_for_restart(table, index, old_pid, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ray.get(table._shards[index].status.remote())["pid"] != old_pid:
                return
        except ray.exceptions.RayActorError:
            pass
        time.sleep(0.05)
    raise AssertionError("the killed shard was not restarted")


def test_killed_shard_is_restored_and_replayed(tmp_path):
    options = dict(sparse=True, max_norm=2.0)
    batches = _batches(8, seed=4)
    emb, opt = _reference(options, *SGD_MOMENTUM)
    want = train_steps(emb, opt, batches)
    with ShardedEmbedding(V, D, 2, seed=0, optimizer=optim.SGD,
                          optimizer_kwargs=SGD_MOMENTUM[1], checkpoint_dir=tmp_path,
                          checkpoint_every=3, **options) as table:
        got = train_steps(table, None, batches[:5])  # a checkpoint at update 3, two logged since
        assert ckpt.read_manifest(tmp_path)["updates"] == 3
        pid = ray.get(table._shards[1].status.remote())["pid"]
        ray.kill(table._shards[1], no_restart=False)
        _wait_for_restart(table, 1, pid)
        got += train_steps(table, None, batches[5:])
        assert table.recoveries == 1
        for y_got, y_want in zip(got, want, strict=True):
            assert_same_bits(y_got, y_want)
        assert_same_bits(table.to_embedding().weight.data, emb.weight.data)


def test_reshard_on_load_continues_bit_identically(tmp_path):
    options = dict(sparse=True, padding_idx=3)
    batches = _batches(9, seed=6)
    emb, opt = _reference(options, *ADAMW)  # per-row moments, a global step count
    want = train_steps(emb, opt, batches)
    got = []
    with ShardedEmbedding(V, D, 2, seed=0, optimizer=ADAMW[0], optimizer_kwargs=ADAMW[1],
                          **options) as table:
        got += train_steps(table, None, batches[:3])
        table.save(tmp_path / "two")
    with ShardedEmbedding.load(tmp_path / "two", num_shards=3) as table:
        assert table.num_shards == 3 and table.step == 3
        got += train_steps(table, None, batches[3:6])
        table.save(tmp_path / "three")
    with ShardedEmbedding.load(tmp_path / "three", num_shards=2) as table:
        got += train_steps(table, None, batches[6:7])
        # A shard of a loaded table comes back from that checkpoint, resharded again.
        pid = ray.get(table._shards[0].status.remote())["pid"]
        ray.kill(table._shards[0], no_restart=False)
        _wait_for_restart(table, 0, pid)
        got += train_steps(table, None, batches[7:])
        assert table.recoveries == 1
        assert_same_bits(table.to_embedding().weight.data, emb.weight.data)
    for y_got, y_want in zip(got, want, strict=True):
        assert_same_bits(y_got, y_want)
    # The offline tool writes the same shards as loading does.
    manifest = ckpt.reshard(tmp_path / "three", tmp_path / "offline", 2)
    for index in range(2):
        direct = ckpt.gather_shard(tmp_path / "three", ckpt.read_manifest(tmp_path / "three"),
                                   2, index)
        written = ckpt.read_shard(tmp_path / "offline" / manifest["shards"][index])
        assert_same_bits(written["weight"], direct["weight"])
        assert written["rows"].keys() == direct["rows"].keys() == {"exp_avg", "exp_avg_sq"}
        assert written["scalars"] == direct["scalars"] == {"step": 6}
        for name in direct["rows"]:
            assert_same_bits(written["rows"][name], direct["rows"][name])


@pytest.fixture(scope="module")
def table():
    with ShardedEmbedding(V, D, 2, seed=1, optimizer_kwargs={"lr": 0.1}) as shared:
        yield shared


def test_shards_run_one_numba_thread_each(table):
    assert [ray.get(shard.status.remote())["threads"] for shard in table._shards] == [1, 1]


def test_bad_ids_raise_before_any_shard_changes(table):
    before = table.to_embedding().weight.data.copy()
    step = table.step
    with pytest.raises(IndexError, match=f"index {V} .* num_embeddings={V}"):
        table(np.array([[0, 1], [V, 2]]))
    with pytest.raises(IndexError, match="index -1"):
        table(np.array([-1]))
    with pytest.raises(TypeError, match="indices"):
        table(np.array([0.5]))
    table(np.array([1, 2, 2]))
    with pytest.raises(ValueError, match="grad_output"):
        table.backward(np.ones((2, D), np.float32))
    assert table.step == step
    assert_same_bits(table.to_embedding().weight.data, before)


def test_a_step_that_skips_ahead_is_refused_and_a_replay_ignored(table):
    shard, step = table._shards[0], table.step
    rows, values = np.array([0]), np.ones((1, D), np.float32)
    with pytest.raises(StaleShardError, match=f"sent step {step + 2}"):
        ray.get(shard.update.remote(table.trainer, step + 2, rows, values))
    with pytest.raises(StaleShardError, match="sent step"):
        ray.get(shard.lookup.remote(table.trainer, step + 1, rows, False))
    before = ray.get(shard.weights.remote()).copy()
    assert ray.get(shard.update.remote(table.trainer, step, rows, values)) is False
    assert_same_bits(ray.get(shard.weights.remote()), before)


def test_checkpoint_files_and_manifest(table, tmp_path):
    table(np.array([0, 4]))
    table.backward(np.ones((2, D), np.float32))
    first = table.save(tmp_path)
    second = table.save(tmp_path)
    folders = sorted(p.name for p in tmp_path.iterdir())
    assert folders == sorted(["manifest.json", second["shards"][0].split("/")[0]])
    assert first["shards"] != second["shards"]
    assert not list(tmp_path.rglob("*.tmp"))
    with pytest.raises(FileNotFoundError, match="manifest.json"):
        ckpt.read_manifest(tmp_path / "nothing")


def test_bad_arguments_raise_before_actors_start():
    with pytest.raises(ValueError, match="num_shards"):
        ShardedEmbedding(3, 2, num_shards=4)
    with pytest.raises(TypeError, match="lr"):
        ShardedEmbedding(3, 2, num_shards=1, optimizer=optim.SGD)
    with pytest.raises(ValueError, match="momentum"):
        ShardedEmbedding(3, 2, num_shards=1, optimizer_kwargs={"lr": 0.1, "momentum": -1})
    with pytest.raises(ValueError, match="checkpoint_every"):
        ShardedEmbedding(3, 2, num_shards=1, optimizer_kwargs={"lr": 0.1},
                         checkpoint_dir="x")


def test_import_needs_no_ray_and_says_how_to_install_it():
    code = ("import sys; sys.modules['ray'] = None\n"
            "import numbapos, numbapos.distributed as d\n"
            "assert 'ray' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
            "try:\n    d.ShardedEmbedding(4, 2, 1, optimizer_kwargs={'lr': 1.0})\n"
            "except ImportError as e:\n    print(e)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert 'pip install "numbapos[distributed]"' in result.stdout
    plain = subprocess.run([sys.executable, "-c", "import sys, numbapos; print('ray' in "
                            "sys.modules)"], capture_output=True, text=True, check=True)
    assert plain.stdout.strip() == "False"
