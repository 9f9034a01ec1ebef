"""The CPU thread pool: numbapos's wait policy, the user's overrides, and results that do
not depend on either (each configuration runs in a fresh process: the pool starts once)."""

import os
import subprocess
import sys
import textwrap

import pytest

import numbapos

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


@pytest.mark.usefixtures("foreground_compile")
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

