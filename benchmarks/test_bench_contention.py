"""Steady beside other processes: the BERT block training step alone and with a twin,
and every op of ``bench --quick`` beside a busy process.

Two processes on the same cores, each running the BERT block forward +
backward in a loop, should each take about twice their solo time (the cores
are shared), not several times it (idle OpenMP threads spinning on cores the
other process needs). A second group times a mid-sized lookup that follows a
pause (the pool has gone idle): what waking the threads costs under each wait
policy. A third runs ``busy_neighbour.py``: each op of ``python -m numbapos
bench --quick`` with a spinning process switched on and off (its quiet time,
its busy time, its serial kernel's), with numbapos's adaptive threads and
without. Each configuration runs in fresh interpreters; the
medians and their ratios land in ``extra_info`` of one benchmark row per
configuration (the row's own time is that of the whole experiment)::

    pytest benchmarks/test_bench_contention.py --benchmark-columns=rounds -s
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

LOOP = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    from numbapos import nn
    rng = np.random.default_rng(0)
    block = nn.BertEmbeddings(30522, 768, 512, 2, hidden_dropout_prob=0.1, seed=0)
    ids = rng.integers(0, 30522, size=(32, 128)); types = rng.integers(0, 2, size=(32, 128))
    grad = rng.normal(size=(32, 128, 768)).astype(np.float32)
    def step():
        block.zero_grad(); block(ids, token_type_ids=types); block.backward(grad)
    for _ in range(5):
        step()
    times, end = [], time.perf_counter() + float(sys.argv[1])
    while time.perf_counter() < end:
        t = time.perf_counter(); step(); times.append(time.perf_counter() - t)
    print(json.dumps({"median_ms": float(np.median(times)) * 1e3, "steps": len(times)}))
""")

# A mid-sized parallel call after a gap, as between the kernels of a program
# doing other work: after 100 us of Python work (the pool may still be awake)
# and after a 2 ms sleep (it has gone to sleep): what each wait policy costs.
AFTER_PAUSE = textwrap.dedent("""
    import json, time
    import numpy as np
    import numbapos.functional as F
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(30522, 768)).astype(np.float32)
    ids = rng.integers(0, 30522, size=(1, 512))
    out = np.empty((1, 512, 768), np.float32)
    def busy(seconds):
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    medians = {}
    for name, wait in (("busy_100us", lambda: busy(1e-4)), ("sleep_2ms", lambda: time.sleep(2e-3))):
        times = []
        for i in range(205):
            wait()
            t = time.perf_counter(); F.embedding(ids, weight, out=out)
            times.append(time.perf_counter() - t)
        medians[name] = float(np.median(times[5:])) * 1e3
    print(json.dumps(medians))
""")

CONFIGS = {
    "numbapos default": {},
    "NUMBAPOS_ADAPTIVE_THREADS=0 (every thread, always)": {"NUMBAPOS_ADAPTIVE_THREADS": "0"},
    "GOMP_SPINCOUNT=1000": {"GOMP_SPINCOUNT": "1000"},
    "GOMP_SPINCOUNT=0 (passive)": {"GOMP_SPINCOUNT": "0"},
    "OpenMP's own spin (GOMP_SPINCOUNT=300000)": {"GOMP_SPINCOUNT": "300000"},
}


def _start(env, seconds, script=LOOP):
    full = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    full.update(env)
    return subprocess.Popen([sys.executable, "-c", script, str(seconds)], env=full,
                            stdout=subprocess.PIPE, text=True)


def _result(proc, key="median_ms"):
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0
    report = json.loads(out.strip().splitlines()[-1])
    return report if key is None else report[key]


@pytest.mark.benchmark(group="contention_bert_train_step")
@pytest.mark.parametrize("config", list(CONFIGS))
def test_two_processes_share_the_cores(benchmark, config):
    env = CONFIGS[config]

    def experiment():
        solo = _result(_start(env, 8))
        pair = [_start(env, 10), _start(env, 10)]
        both = [_result(p) for p in pair]
        return solo, both

    solo, both = benchmark.pedantic(experiment, rounds=1, iterations=1)
    benchmark.extra_info.update({
        "solo_median_ms": round(solo, 2),
        "pair_median_ms": [round(b, 2) for b in both],
        "pair_over_solo": round(max(both) / solo, 2),
    })
    print(f"\n{config}: solo {solo:.2f} ms, pair {both[0]:.2f} / {both[1]:.2f} ms, "
          f"x{max(both) / solo:.2f}")


@pytest.mark.benchmark(group="contention_wake_after_pause")
@pytest.mark.parametrize("config", list(CONFIGS))
def test_a_call_after_a_gap_finds_the_pool_quickly(benchmark, config):
    """A 512-token lookup at D = 768 after 100 us of work / a 2 ms sleep, medians of 200."""
    medians = benchmark.pedantic(
        lambda: _result(_start(CONFIGS[config], 0, AFTER_PAUSE), key=None), rounds=1, iterations=1)
    benchmark.extra_info.update({k + "_ms": round(v, 4) for k, v in medians.items()})
    print(f"\n{config}: 512-token lookup after 100 us of work {medians['busy_100us'] * 1e3:.0f} us,"
          f" after a 2 ms sleep {medians['sleep_2ms'] * 1e3:.0f} us")


# Adaptive threads (the default) against every thread always (the static split).
NEIGHBOUR_CONFIGS = {
    "adaptive threads (default)": {},
    "NUMBAPOS_ADAPTIVE_THREADS=0": {"NUMBAPOS_ADAPTIVE_THREADS": "0"},
}


@pytest.mark.benchmark(group="contention_busy_neighbour")
@pytest.mark.parametrize("pinned", [False, True], ids=["neighbour_free", "neighbour_pinned"])
@pytest.mark.parametrize("config", list(NEIGHBOUR_CONFIGS))
def test_every_quick_op_beside_a_busy_process(benchmark, config, pinned, tmp_path):
    """busy / quiet (target <= 2.2) and busy / serial kernel (target <= 1) of every op."""
    script = os.path.join(os.path.dirname(__file__), "busy_neighbour.py")
    path = tmp_path / "result.json"
    env = {k: v for k, v in os.environ.items() if k != "NUMBAPOS_ADAPTIVE_THREADS"}
    env.update(NEIGHBOUR_CONFIGS[config])

    def experiment():
        args = [sys.executable, script, "--rounds", "5", "--json", str(path)]
        done = subprocess.run(args + (["--pin"] if pinned else []), env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr
        print("\n" + done.stdout)
        return json.loads(path.read_text())

    report = benchmark.pedantic(experiment, rounds=1, iterations=1)
    rows = report["results"]
    benchmark.extra_info.update({
        "load": report["load"],
        "worst_busy_over_quiet": round(max(r["busy_over_quiet"] for r in rows.values()), 2),
        "worst_busy_over_serial": round(max(r["busy_over_serial"] for r in rows.values()), 2),
        "cases": {name: {k: round(v, 3) for k, v in row.items()} for name, row in rows.items()},
    })
