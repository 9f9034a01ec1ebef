"""``numbapos.warmup``, ``python -m numbapos warmup``: later processes load what it compiles."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from numba.core.registry import CPUDispatcher

import numbapos
from numbapos import _warmup
from numbapos.__main__ import main
from numbapos.kernels import cpu

ROOT = Path(__file__).resolve().parents[1]

# A user's first training step: sparse Embedding forward + backward + SGD(momentum).
FIRST_STEP = """
import json
import numpy as np
from numbapos import _warmup, nn, optim
emb = nn.Embedding(50, 8, sparse=True, seed=0)
opt = optim.SGD(emb.parameters(), lr=0.1, momentum=0.9)
ids = np.array([[1, 2, 2, 7]])
emb.backward(np.ones_like(emb(ids)))
opt.step()
misses = {d.py_func.__name__: d.stats.cache_misses.total() for d in _warmup.kernel_dispatchers()}
hits = sum(d.stats.cache_hits.total() for d in _warmup.kernel_dispatchers())
print(json.dumps({"compiled": {k: v for k, v in misses.items() if v}, "loaded": hits}))
"""
# A lookup alone (forward + sparse backward, no optimiser) as the warm-up's
# "embedding" group makes it, with a padding row: at a fifth of the cold compile
# time of "embedding,sgd". (Without padding_idx a small lookup takes its own
# kernel, gather_rows_checked, which the "sgd" and "optimisers" groups compile.)
FIRST_LOOKUP = FIRST_STEP.replace(
    "opt = optim.SGD(emb.parameters(), lr=0.1, momentum=0.9)\n", "").replace(
    "opt.step()\n", "").replace("sparse=True, seed=0", "sparse=True, padding_idx=0, seed=0")


def _python(args, cache_dir, timeout=240):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


# The warm-up into an empty cache, and a new process's first step: a lookup with
# its sparse backward by default; the whole training step (SGD's four compiled
# variants, about four fifths of the cold compile time) under the exhaustive marker.
@pytest.mark.parametrize("script, ops", [
    pytest.param(FIRST_LOOKUP, "embedding", id="lookup"),
    pytest.param(FIRST_STEP, "embedding,sgd", id="training_step", marks=pytest.mark.exhaustive),
])
def test_warmup_fills_the_cache_a_new_process_loads(tmp_path, script, ops):
    cold = _python(["-c", script], tmp_path / "cold")
    assert cold.returncode == 0, cold.stderr
    assert json.loads(cold.stdout)["compiled"], "a fresh cache should have compiled kernels"

    cache = tmp_path / "warm"
    run = _python(["-m", "numbapos", "warmup", "--dtypes", "float32", "--index-dtypes",
                   "int64", "--ops", ops], cache)
    assert run.returncode == 0, run.stderr
    assert str(cache) in run.stdout and "kernel signatures compiled" in run.stdout
    assert list(cache.rglob("*.nbi")) and list(cache.rglob("*.nbc"))

    first = _python(["-c", script], cache)
    assert first.returncode == 0, first.stderr
    report = json.loads(first.stdout)
    assert report["compiled"] == {}, f"compiled despite the warm-up: {report['compiled']}"
    assert report["loaded"] > 0

    again = _python(["-m", "numbapos", "warmup", "--dtypes", "float32", "--index-dtypes",
                     "int64", "--ops", ops, "--quiet"], cache)
    assert again.returncode == 0 and again.stdout == "", again.stderr


def _launched(area) -> set:
    """The @njit functions that the plain Python launchers of ``area`` call."""
    found = set()

    def walk(code):
        for name in code.co_names:
            obj = vars(area).get(name)
            if isinstance(obj, CPUDispatcher):
                found.add(obj.py_func.__name__)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const)

    for obj in vars(area).values():
        if isinstance(obj, types.FunctionType) and obj.__module__ == area.__name__:
            walk(obj.__code__)
    return found


COVERAGE = """
import json, sys
import numbapos
from numbapos.kernels import cpu
numbapos.warmup(dtypes=sys.argv[1].split(","), index_dtypes=sys.argv[2].split(","),
                verbose=False)
print(json.dumps({area.__name__: {name: [str(sig) for sig in d.signatures]
                                  for name, d in vars(area).items() if hasattr(d, "signatures")}
                  for area in cpu.AREAS}))
"""


# Every kernel for float32 (int64 indices: what the serial/parallel pair test has
# already put in the project's cache) by default; for both float dtypes and both
# index dtypes, compiling the rest, under the exhaustive marker.
@pytest.mark.slow
@pytest.mark.parametrize("dtypes, index_dtypes", [
    pytest.param("float32", "int64", id="float32"),
    pytest.param("float32,float64", "int32,int64", id="all", marks=pytest.mark.exhaustive),
])
def test_warmup_compiles_every_launched_kernel_for_each_float_dtype(dtypes, index_dtypes):
    # A fresh process (this one has compiled kernels for other tests), the project's cache.
    run = subprocess.run([sys.executable, "-c", COVERAGE, dtypes, index_dtypes], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    signatures = json.loads(run.stdout)
    wanted = set(dtypes.split(","))
    missing = []
    for area in cpu.AREAS:
        # Quantised tables are float32 by their format: their kernels never see float64.
        expected = wanted & {"float32"} if area is cpu.quantized else wanted
        for name in sorted(_launched(area)):
            sigs = signatures[area.__name__][name]
            floats = {dtype for dtype in ("float32", "float64") if any(dtype in s for s in sigs)}
            # (a kernel may take float64 arrays besides its data: every wanted dtype appears)
            if not sigs or (floats and not expected <= floats):
                missing.append(f"{area.__name__}.{name}: {sigs}")
    assert not missing, "kernels the warm-up does not compile (add them to CASES):\n" + \
        "\n".join(missing)
    parallel = [name for area in cpu.AREAS for name in _launched(area) if "parallel" in name]
    assert parallel, "expected parallel kernel bodies among the launched kernels"


def test_bad_names_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match="dtypes: .*float16"):
        numbapos.warmup(dtypes=["float16"], verbose=False)
    with pytest.raises(ValueError, match="index_dtypes: .*uint8"):
        numbapos.warmup(index_dtypes="uint8", verbose=False)
    with pytest.raises(ValueError, match="ops: .*nope"):
        numbapos.warmup(ops=["embedding", "nope"], verbose=False)
    with pytest.raises(ValueError, match="dtypes: "):
        numbapos.warmup(dtypes=[], verbose=False)


@pytest.mark.parametrize("argv, message", [
    (["--dtypes", "float16"], "--dtypes: expected data dtypes from float32, float64"),
    (["--index-dtypes", "int64,int8"], "--index-dtypes: expected index dtypes"),
    (["--ops", ""], "--ops: expected op groups"),
])
def test_cli_refuses_bad_lists(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["warmup", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_failing_op_names_its_case_exits_1_and_restores_the_threshold(monkeypatch, capsys):
    seen = []

    def broken(dtype, index_dtype):
        seen.append(numbapos.config.get("parallel_min_elements"))
        if len(seen) == 2:
            raise ValueError("boom")

    threshold = numbapos.config.get("parallel_min_elements")
    monkeypatch.setattr(_warmup, "CASES", (_warmup.Case("broken", "fails", broken, False),))
    with pytest.raises(RuntimeError, match=r"broken \(float64, int32, parallel kernels\).*boom"):
        numbapos.warmup(dtypes="float64", verbose=False)
    assert seen == [threshold, 0]  # serial bodies first, then every launcher picks parallel
    assert numbapos.config.get("parallel_min_elements") == threshold

    seen.clear()
    assert main(["warmup", "--quiet"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "broken (float32, int32, parallel kernels)" in captured.err
    assert numbapos.config.get("parallel_min_elements") == threshold


def test_report_lists_each_case_once_per_dtype_pair(monkeypatch, capsys):
    calls = []
    cases = (_warmup.Case("indexed", "", lambda d, i: calls.append((d, i))),
             _warmup.Case("plain", "", lambda d, i: calls.append((d, "-")), indexed=False))
    monkeypatch.setattr(_warmup, "CASES", cases)
    results = numbapos.warmup(["float32", "float64"], ["int32", "int64"])
    assert [(r.case, r.dtype, r.index_dtype) for r in results] == [
        ("indexed", "float32", "int32"), ("plain", "float32", "-"),
        ("indexed", "float32", "int64"),
        ("indexed", "float64", "int32"), ("plain", "float64", "-"),
        ("indexed", "float64", "int64")]
    assert len(calls) == 2 * len(results)  # serial and parallel bodies
    out = capsys.readouterr().out
    assert out.startswith("numbapos warmup: float32, float64 x int32, int64")
    lines = out.splitlines()
    assert len(lines) == len(results) + 2 and lines[-1].startswith("done in ")
    assert all(" compiled, " in line and "from the cache" in line for line in lines[1:])


def test_cache_location_is_numbas():
    location = _warmup.cache_location()
    expected = os.environ.get("NUMBA_CACHE_DIR") or str(Path(cpu.__file__).parent / "__pycache__")
    assert location is not None and location.startswith(expected)


def test_the_docstring_and_the_cli_list_every_op_group(capsys):
    for name in _warmup.CASE_NAMES:
        assert f'``"{name}"``' in numbapos.warmup.__doc__
    with pytest.raises(SystemExit):
        main(["warmup", "--help"])
    assert ",".join(_warmup.CASE_NAMES) in capsys.readouterr().out.replace("\n", "").replace(
        " ", "")
