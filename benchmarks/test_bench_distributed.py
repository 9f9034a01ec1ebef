"""ShardedEmbedding on Ray against one process: a training step at V = 1e6, D = 64.

A step is a lookup of N Zipf-distributed ids (N = 16k and 64k), the backward
and an SGD(momentum=0.9) step on the rows used. Implementations in each group:

* ``one process``: ``nn.Embedding(sparse=True)`` + ``optim.SGD``;
* ``local S=k``: ShardedEmbedding(backend="local"): the same driver and shard
  code with the k shards as objects in this process, called one after the
  other (no Ray);
* ``ray S=k``: k shard actors on a local Ray cluster (2 CPUs), 2 // k Numba
  threads each.

``ray S=1`` against ``local S=1`` is Ray's share of a step (two calls, ids and
rows through the object store). ``extra_info`` holds the unique rows per step
and unique rows per second. Skipped without Ray; not part of the default run::

    pytest benchmarks/test_bench_distributed.py --benchmark-group-by=group \\
        --benchmark-columns=min,median,rounds
"""

import os

import numpy as np
import pytest

from numbapos import nn, optim

ray = pytest.importorskip("ray")

from numbapos.distributed import ShardedEmbedding  # noqa: E402

VOCAB, DIM = 1_000_000, 64
SIZES = [16_384, 65_536]
IMPLS = ["one process", "local S=1", "local S=2", "ray S=1", "ray S=2"]
KWARGS = {"lr": 0.01, "momentum": 0.9}


@pytest.fixture(scope="module", autouse=True)
def cluster():
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _batches(size, count=4):
    rng = np.random.default_rng(size)
    return [((rng.zipf(1.2, size=size) - 1) % VOCAB,
             rng.standard_normal((size, DIM)).astype(np.float32)) for _ in range(count)]


class _OneProcess:
    def __init__(self):
        self.emb = nn.Embedding(VOCAB, DIM, sparse=True)
        nn.init.keyed_normal_(self.emb.weight.data, 0)
        self.opt = optim.SGD(self.emb.parameters(), **KWARGS)

    def step(self, ids, grad):
        self.emb(ids)
        self.emb.backward(grad)
        self.opt.step()
        self.emb.zero_grad()

    def close(self):
        pass


class _Sharded:
    def __init__(self, impl):
        backend, shards = impl.split(" S=")
        shards = int(shards)
        self.table = ShardedEmbedding(VOCAB, DIM, shards, seed=0, optimizer=optim.SGD,
                                      optimizer_kwargs=KWARGS, threads=max(1, 2 // shards),
                                      backend=backend)

    def step(self, ids, grad):
        self.table(ids)
        self.table.backward(grad)

    def close(self):
        self.table.close()


@pytest.fixture(scope="module", params=IMPLS)
def model(request):
    made = _OneProcess() if request.param == "one process" else _Sharded(request.param)
    yield request.param, made
    made.close()


@pytest.mark.parametrize("size", SIZES)
def test_training_step(benchmark, model, size):
    impl, made = model
    benchmark.group = f"sharded step, {size} Zipf ids over V=1e6, D=64"
    batches = _batches(size)
    for ids, grad in batches:  # JIT warm-up, momentum started on the common rows
        made.step(ids, grad)
    state = {"i": 0}

    def step():
        ids, grad = batches[state["i"] % len(batches)]
        state["i"] += 1
        made.step(ids, grad)

    benchmark.pedantic(step, rounds=20, iterations=1, warmup_rounds=2)
    unique = np.mean([np.unique(ids).size for ids, _ in batches])
    benchmark.extra_info.update(impl=impl, ids=size, unique_rows=float(unique))
    if benchmark.stats is not None:  # None under --benchmark-disable (a smoke run)
        benchmark.extra_info["unique_rows_per_s"] = float(unique / benchmark.stats["median"])
