"""Parallel kernels compiled in a background thread, their serial twins meanwhile.

The serial/parallel pairs of every launcher (``arrays.pick``) must compute the
same bits, or a cold-cache first call would differ from later ones: checked in
``test_warmup.py`` for every pair the warm-up drives (it compiles what the
warm-up does, so it shares that file's process and cache). The background
thread itself is tested here in fresh processes with their own cold Numba cache.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import numbapos
from numbapos.kernels.cpu import background

ROOT = Path(__file__).resolve().parents[1]


def _environment(monkeypatch, value):
    monkeypatch.setenv(background.ENV, value)
    numbapos.config.reset()  # the environment is read once; read it again


def test_switch_reads_the_environment(monkeypatch):
    _environment(monkeypatch, "1")
    assert background.enabled()
    with background.foreground():
        assert not background.enabled()
        with background.foreground():
            assert not background.enabled()
        assert not background.enabled()
    assert background.enabled()
    with numbapos.config.override(background_compile=False):
        assert not background.enabled()
    _environment(monkeypatch, "0")
    assert not background.enabled()
    _environment(monkeypatch, "yes")
    with pytest.raises(ValueError, match="NUMBAPOS_BACKGROUND_COMPILE: expected 0 or 1, got 'yes'"):
        background.enabled()
    monkeypatch.undo()
    numbapos.config.reset()


def test_patches_numba_only_on_the_versions_it_is_tested_with():
    assert background.numba_supported()  # the installed Numba is inside the declared bounds
    assert background.numba_supported("0.59.0") and background.numba_supported("0.68.1")
    assert not background.numba_supported("0.58.1")
    assert not background.numba_supported("0.69.0rc1")
    assert not background.numba_supported("1.0.0") and not background.numba_supported("dev")


def test_wait_returns_at_once_with_nothing_queued():
    # The tests run with the background compiler on, as users do: let whatever
    # earlier tests queued finish first.
    assert background.wait(timeout=600)
    assert background.pending() == 0
    assert background.wait(timeout=0.0)


# One process: a sparse Embedding step just above the parallel threshold.
_STEP = textwrap.dedent("""
    import json, os, sys, threading, time
    import numpy as np
    import numbapos
    from numbapos import nn
    from numbapos.kernels.cpu import background, embedding

    def step():
        emb = nn.Embedding(1000, 64, sparse=True, seed=3)
        ids = np.random.default_rng(1).integers(0, 1000, size=(8, 64))
        y = emb(ids)
        emb.backward(np.arange(y.size, dtype=np.float32).reshape(y.shape) / 7)
        return y, emb.weight.grad.indices, emb.weight.grad.values

    parallel = embedding._sum_row_segments_parallel
    mode = sys.argv[1]
    if mode in ("exit", "fork"):  # compile at once: exit or fork finds the thread at it
        background.QUIET_SECONDS = 0.0
    first = step()
    report = {"parallel_at_first": len(parallel.signatures), "pending": background.pending()}
    if mode == "exit":  # leave while the background thread compiles the last queued kernel
        # (the backward's: the lookup's kernel, queued first, may take longer to compile
        # than the serial step, and a kernel still waiting at exit is not compiled)
        for _ in range(12000):
            if background.pending() <= 1:
                break
            time.sleep(0.01)
        time.sleep(0.05)  # the worker has taken it from the queue
        print(json.dumps(report))
        sys.exit(0)
    if mode == "fork" and report["pending"]:
        time.sleep(0.05)
        report["compiling_at_fork"] = background.pending()
        pid = os.fork()
        if pid == 0:  # the child compiles a kernel of its own, then leaves
            from numba import njit
            os._exit(0 if njit(lambda x: x + 1)(1) == 2 else 3)
        for _ in range(600):  # a child that inherited a held compiler lock never ends
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.05)
        else:
            os.kill(pid, 9)
            status = "hung"
        report["child"] = status
    report["waited"] = numbapos.wait_for_compiles(timeout=120)
    for _ in range(100):  # the thread ends once its queue is empty
        if threading.active_count() == 1:
            break
        time.sleep(0.01)
    report["threads"] = threading.active_count()
    report["parallel_after"] = len(parallel.signatures)
    later = step()
    report["same_bits"] = all(a.tobytes() == b.tobytes() for a, b in zip(first, later))
    np.savez(sys.argv[2], *first)
    print(json.dumps(report))
""")


def _run(mode, cache, tmp_path, background_compile="1"):
    # (adaptive threads off: on a busy machine the step would run only serial kernels)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT),
               NUMBAPOS_BACKGROUND_COMPILE=background_compile, NUMBAPOS_ADAPTIVE_THREADS="0")
    env.pop("NUMBA_ENABLE_CUDASIM", None)
    done = subprocess.run([sys.executable, "-c", _STEP, mode, str(tmp_path / f"{mode}.npz")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_cold_cache_runs_serial_twins_then_the_compiled_parallel_kernels(tmp_path):
    cold = _run("fork", tmp_path / "cache", tmp_path)
    # The first call ran the serial twin; the parallel kernel came later, same bits.
    assert cold["parallel_at_first"] == 0 and cold["pending"] >= 1
    # fork waited for the compilation in progress; the child could compile a kernel of its own
    assert cold["compiling_at_fork"] >= 1 and cold["child"] == 0
    assert cold["waited"] and cold["parallel_after"] == 1 and cold["same_bits"]
    assert cold["threads"] == 1  # no thread lingers once the queue is empty
    # The background thread wrote the cache: a new process loads the parallel kernel at once.
    warm = _run("warm", tmp_path / "cache", tmp_path)
    assert warm["parallel_at_first"] == 1 and warm["pending"] == 0 and warm["same_bits"]
    # Compiled in the calling thread (switched off): the same bits again.
    off = _run("off", tmp_path / "cache-off", tmp_path, background_compile="0")
    assert off["parallel_at_first"] == 1 and off["pending"] == 0
    for mode in ("warm", "off"):
        with np.load(tmp_path / "fork.npz") as a, np.load(tmp_path / f"{mode}.npz") as b:
            for key in a.files:
                assert a[key].tobytes() == b[key].tobytes()


def test_exit_during_a_background_compile_is_clean_and_keeps_the_kernel(tmp_path):
    left = _run("exit", tmp_path / "cache", tmp_path)  # exits with status 0
    assert left["parallel_at_first"] == 0
    # The kernel being compiled at exit was finished and cached: the next process loads it.
    # (A kernel still waiting for its turn at exit is not: the next process queues it again.)
    again = _run("warm", tmp_path / "cache", tmp_path)
    assert again["parallel_at_first"] == 1 and again["same_bits"]


def test_wait_for_compiles_checks_its_timeout():
    import numbapos

    assert numbapos.wait_for_compiles() and numbapos.wait_for_compiles(0) is True
    assert numbapos.wait_for_compiles(timeout=np.float32(0.5))
    with pytest.raises(TypeError, match="timeout: expected None or a number of seconds, got str"):
        numbapos.wait_for_compiles("1")
    with pytest.raises(TypeError, match="got bool"):
        numbapos.wait_for_compiles(True)
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError, match="timeout: expected seconds >= 0"):
            numbapos.wait_for_compiles(bad)


@pytest.mark.usefixtures("foreground_compile")
def test_install_hooks_a_dispatcher_once():
    from numba import njit, prange

    @njit
    def serial(x):
        return x.sum()

    @njit(parallel=True)
    def parallel(x):
        total = 0.0
        for i in prange(x.size):
            total += x[i]
        return total

    background.install(serial, parallel)
    hook = parallel._compile_for_args
    background.install(serial, parallel)
    assert parallel._compile_for_args is hook
    # Switched off (foreground_compile), a miss compiles in the calling thread.
    assert parallel(np.ones(5)) == 5.0 and len(parallel.signatures) == 1
