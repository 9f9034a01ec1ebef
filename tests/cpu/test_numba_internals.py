"""Numba's private interfaces: used in ``numbapos/_numba_internals.py`` alone, each with a
public fallback that gives the same results (``NUMBAPOS_NUMBA_INTERNALS=0``)."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from numbapos import _numba_internals

ROOT = Path(__file__).resolve().parents[2]

# A sparse training step and a BERT block step through the parallel kernels: the bytes of
# every result, printed as hex digests.
STEP = """
import hashlib
import numpy as np
import numbapos
from numbapos import _numba_internals, nn, optim
with numbapos.config.override(parallel_min_elements=0, adaptive_threads=False):
    emb = nn.Embedding(300, 16, sparse=True, seed=1)
    opt = optim.Adam(emb.parameters(), lr=0.01)
    ids = np.random.default_rng(0).integers(0, 300, size=(8, 64))
    for _ in range(2):
        emb.zero_grad()
        y = emb(ids)
        emb.backward(np.cos(y))
        opt.step()
    print(_numba_internals.enabled(), bool(_numba_internals.no_nrt_options()),
          hashlib.sha256(y.tobytes() + emb.weight.data.tobytes()).hexdigest())
"""


def _run(internals: str) -> list[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBAPOS_NUMBA_INTERNALS=internals)
    done = subprocess.run([sys.executable, "-c", STEP], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.slow
def test_the_public_fallbacks_give_the_same_bits():
    on, off = _run("1"), _run("0")
    assert on[:2] == ["True", "True"] and off[:2] == ["False", "False"]
    assert on[2] == off[2]


def test_a_bad_setting_names_the_variable(monkeypatch):
    from numbapos import config

    monkeypatch.setenv("NUMBAPOS_NUMBA_INTERNALS", "maybe")
    config.reset()
    try:
        with pytest.raises(ValueError, match="NUMBAPOS_NUMBA_INTERNALS: expected 0 or 1"):
            config.get("numba_internals")
    finally:
        monkeypatch.delenv("NUMBAPOS_NUMBA_INTERNALS")
        config.reset()


def test_the_fallbacks_do_nothing_and_say_so(monkeypatch):
    monkeypatch.setattr(_numba_internals, "enabled", lambda: False)
    assert _numba_internals.no_nrt_options() == {}
    assert _numba_internals.pool_started() is None
    assert _numba_internals.start_thread_pool() is False
    assert _numba_internals.can_lock_cache_saves() is False
    assert _numba_internals.lock_cache_saves(lambda method, exclusive: method) is False


def test_warmup_runs_in_one_process_without_cache_locks(monkeypatch):
    from numbapos import _warmup

    monkeypatch.setattr(_numba_internals, "can_lock_cache_saves", lambda: False)
    assert _warmup._processes(None, 8) == 1
    assert _warmup._processes(2, 8) == 1


def _private_numba_imports(path: Path) -> list[str]:
    """``from numba.<private> import ...`` / ``numba.<x>._name`` uses in one source file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("numba."):
            if node.module.startswith(("numba.core.caching", "numba.np.ufunc")):
                found.append(node.module)
        if isinstance(node, ast.keyword) and node.arg == "_nrt":
            found.append("_nrt")
    return found


def test_numba_internals_are_used_in_one_module():
    used = {str(path.relative_to(ROOT)): names
            for path in sorted((ROOT / "numbapos").rglob("*.py"))
            if (names := _private_numba_imports(path))}
    assert set(used) == {"numbapos/_numba_internals.py"}, used
