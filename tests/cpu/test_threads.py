"""The CPU thread pool: numbapos's wait policy, the user's overrides, and results that do
not depend on either (each configuration runs in a fresh process: the pool starts once)."""

import os
import subprocess
import sys
import textwrap

import pytest

import numbapos
from numbapos import _numba_internals

BERT_STEP = textwrap.dedent("""
    import hashlib, json, os
    import numpy as np
    import numbapos
    from numbapos import nn
    rng = np.random.default_rng(0)
    block = nn.BertEmbeddings(500, 96, 64, 2, hidden_dropout_prob=0.1, seed=3)
    ids = rng.integers(0, 500, size=(16, 64)); types = rng.integers(0, 2, size=(16, 64))
    y = block(ids, token_type_ids=types)
    block.backward(rng.normal(size=y.shape).astype(np.float32))
    digest = hashlib.sha256(y.tobytes())
    for p in block.parameters():
        digest.update(p.grad.tobytes())
    settings = numbapos._pool.pool_settings()
    print(json.dumps({"digest": digest.hexdigest(), "env_spin": os.environ.get("GOMP_SPINCOUNT"),
                      **settings}))
""")


def run_python(code, **env):
    """Run ``code`` in a fresh interpreter with ``env`` added (None removes a variable)."""
    full = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "NUMBA_THREADING_LAYER")}
    full.update({k: v for k, v in env.items() if v is not None})
    done = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True,
                          text=True, timeout=300)
    return done


def run_step(**env):
    import json

    done = run_python(BERT_STEP, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def default_run():
    return run_step()


# The pool's start with numbapos's wait policy goes through Numba's internals; with
# NUMBAPOS_NUMBA_INTERNALS=0 Numba starts it by itself, with the environment's policy.
needs_internals = pytest.mark.skipif(not _numba_internals.enabled(),
                                     reason="NUMBAPOS_NUMBA_INTERNALS=0: Numba starts the pool")


@needs_internals
def test_numbapos_sets_the_wait_policy_and_restores_the_environment(default_run):
    if default_run["layer"] != "omp":
        pytest.skip(f"threading layer {default_run['layer']}: the spin count is OpenMP's")
    assert f"GOMP_SPINCOUNT={numbapos._pool.SPIN_COUNT} set by numbapos" in default_run["wait"]
    assert default_run["env_spin"] is None  # set only while the layer loaded


@pytest.mark.parametrize("env, shown", [
    ({"OMP_WAIT_POLICY": "PASSIVE"}, "OMP_WAIT_POLICY=PASSIVE"),
    ({"GOMP_SPINCOUNT": "123"}, "GOMP_SPINCOUNT=123"),
    ({"NUMBAPOS_SPIN_COUNT": "2000"}, "spin 2000 iterations"),
])
@needs_internals
def test_the_users_choice_wins(default_run, env, shown):
    if default_run["layer"] != "omp":
        pytest.skip("OpenMP layer not in use")
    assert shown in run_step(**env)["wait"]


@pytest.mark.parametrize("env", [
    {"OMP_WAIT_POLICY": "PASSIVE"},
    {"NUMBA_THREADING_LAYER": "workqueue"},
    {"NUMBA_NUM_THREADS": "1"},
])
def test_results_do_not_depend_on_layer_wait_policy_or_threads(default_run, env):
    assert run_step(**env)["digest"] == default_run["digest"]


def test_bad_spin_count_is_a_clear_error():
    done = run_python("import numpy as np, numbapos.functional as F\n"
                      "F.embedding(np.arange(2), np.ones((2, 2)))", NUMBAPOS_SPIN_COUNT="lots")
    assert done.returncode != 0
    assert "NUMBAPOS_SPIN_COUNT: expected an integer >= 0, got 'lots'" in done.stderr


def test_set_num_threads_validates_and_is_per_thread():
    before = numbapos.get_num_threads()
    limit = numbapos._pool.pool_settings()["pool_size"]
    with pytest.raises(TypeError, match="n: expected an integer"):
        numbapos.set_num_threads(1.5)
    with pytest.raises(ValueError, match=rf"n: expected 1 <= n <= {limit}.*got 0"):
        numbapos.set_num_threads(0)
    with pytest.raises(ValueError, match=rf"got {limit + 1}"):
        numbapos.set_num_threads(limit + 1)
    try:
        numbapos.set_num_threads(1)
        assert numbapos.get_num_threads() == 1
    finally:
        numbapos.set_num_threads(before)
    assert numbapos.get_num_threads() == before



# --- Busy cores: the launchers use the cores other processes leave free ----------------


class _FakeNumba:
    """numba's per-thread count, as _pool sees it: get/set recorded."""

    def __init__(self, count):
        self.count, self.sets = count, []

    def get_num_threads(self):
        return self.count

    def set_num_threads(self, n):
        self.count = n
        self.sets.append(n)


class _Clock:
    def __init__(self):
        self.now = 100.0

    def monotonic(self):
        return self.now


@pytest.fixture
def load(monkeypatch):
    """Scripted load: ``load.step(others, own)`` moves time on by a window in which the
    other processes used ``others`` cores and this one ``own``; 4 cores, numba at 4."""
    import threading
    import types

    from numbapos import _pool

    clock, fake = _Clock(), _FakeNumba(4)
    state = types.SimpleNamespace(busy=0.0, own=0.0, fake=fake, clock=clock, available=True)

    def sample():
        return (clock.now, state.busy, state.own) if state.available else None

    def step(others, own=1.0):
        seconds = 1.5 * _pool.LOAD_WINDOW_S
        clock.now += seconds
        state.busy += (others + own) * seconds
        state.own += own * seconds

    state.step = step
    monkeypatch.setattr(_pool, "numba", fake)
    monkeypatch.setattr(_pool, "time", clock)
    monkeypatch.setattr(_pool, "_sample", sample)
    monkeypatch.setattr(_pool, "_cores", lambda: {0, 1, 2, 3})
    monkeypatch.setattr(_pool, "_local", threading.local())
    monkeypatch.setattr(_pool, "_last", None)
    monkeypatch.setattr(_pool, "_free", None)
    monkeypatch.setattr(_pool, "_window", 0)
    with numbapos.config.override(adaptive_threads=True):
        yield state


def test_a_busy_neighbour_takes_threads_away_and_gives_them_back(load):
    from numbapos import _pool

    assert _pool.usable_threads() == 4  # nothing measured yet: every thread
    load.step(others=1.0)
    assert _pool.usable_threads() == 3 and load.fake.sets == [3]
    assert _pool.usable_threads() == 3 and load.fake.sets == [3]  # same window: no new look
    load.step(others=3.0)
    assert _pool.usable_threads() == 1  # one free core: the serial kernel
    assert load.fake.sets == [3] and load.fake.count == 3  # (numba's count left alone)
    load.step(others=0.2)  # a light neighbour does not count
    assert _pool.usable_threads() == 4 and load.fake.sets == [3, 4]
    load.step(others=0.5)  # half a core busy does
    assert _pool.usable_threads() == 3


def test_the_free_cores_never_exceed_the_threads_asked_for(load):
    from numbapos import _pool

    _pool.usable_threads()
    load.fake.set_num_threads(2)  # the user's own count (numba's or numbapos's function)
    load.fake.sets.clear()
    load.step(others=0.0)
    assert _pool.usable_threads() == 2 and load.fake.sets == []
    load.step(others=2.6)
    assert _pool.usable_threads() == 1
    load.step(others=0.0)
    assert _pool.usable_threads() == 2 and load.fake.sets == []


def test_switched_off_or_unmeasurable_every_thread_runs(load):
    from numbapos import _pool

    _pool.usable_threads()
    load.step(others=1.0)
    assert _pool.usable_threads() == 3
    with numbapos.config.override(adaptive_threads=False):
        assert _pool.usable_threads() == 4 and load.fake.count == 4  # the thread's own count
    load.available = False  # no /proc/stat
    load.step(others=3.0)
    assert _pool.usable_threads() == 4


def test_one_free_core_sends_launchers_to_their_serial_kernels(monkeypatch):
    from numbapos import _pool
    from numbapos.kernels.cpu import arrays, jit

    free = [1]
    monkeypatch.setattr(_pool, "usable_threads", lambda: free[0])
    kernels = jit.SerialParallel(object(), object())
    assert not arrays.runs_parallel(1 << 30)
    assert arrays.pick(kernels, 1 << 30) is kernels.serial
    free[0] = 2
    assert arrays.runs_parallel(1 << 30)
    assert arrays.pick(kernels, 1 << 30) is kernels.parallel
    assert not arrays.runs_parallel(1)  # small work: serial whatever the load


def test_the_other_processes_load_is_measured_here():
    """On Linux the sample reads /proc/stat; the arithmetic gives whole free threads."""
    from numbapos import _pool

    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat")
    first = _pool._sample()
    assert first is not None and first[1] > 0 and first[2] > 0
    assert _pool._free_threads((0.0, 10.0, 1.0), (0.1, 10.2, 1.1), 2) == 1  # others: 1 core
    assert _pool._free_threads((0.0, 10.0, 1.0), (0.1, 10.12, 1.1), 2) == 2  # others: 0.2
    assert _pool._free_threads((0.0, 10.0, 1.0), (0.1, 10.5, 1.1), 2) == 1  # never below 1
    assert _pool._free_threads((0.0, 10.0, 1.0), (0.1, 10.3, 1.1), 8) == 6
