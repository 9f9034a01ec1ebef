"""``numbapos.warmup``, ``python -m numbapos warmup``: later processes load what it compiles.

Also the serial/parallel pairs of every launcher (``arrays.pick``: two
compilations of one ``prange`` body), which must compute the same bits, or a
result would depend on the size of the call and the load of the machine:
checked for every pair the warm-up drives. That test compiles every kernel of the default warm-up
into the project's cache, so it runs first here, and the warm-up's own test
below then loads what it finds (under ``pytest -n 2 --dist loadfile`` one file
runs in one process: kept apart, the two tests compiled the same kernels twice,
each in its own process).
"""

import copy
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from numba.core.registry import CPUDispatcher

import numbapos
from numbapos import _numba_internals, _warmup
from numbapos.__main__ import main
from numbapos.kernels import cpu
from numbapos.kernels.cpu import AREAS, arrays, jit

ROOT = Path(__file__).resolve().parents[2]


def _same(a, b, where):
    if isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b, err_msg=where, strict=True)
        assert a.tobytes() == b.tobytes(), where  # -0.0 against 0.0, NaN payloads
    elif isinstance(a, tuple):
        for x, y in zip(a, b, strict=True):
            _same(x, y, where)


# Each group and dtype compiles its parallel kernels once more (most of this file's time
# on a cold cache). The default run compares the pairs of the groups below in float32;
# the exhaustive sweeps (pytest -m exhaustive, which CI runs too) the other groups'
# float32 pairs and every group's float64 ones. The other groups' pairs are either
# compared by their own file in the default run too (quantised tables, LayerNorm,
# dropout: test_<area>.py::test_serial_and_parallel_kernels_agree*) or are the
# pairs of rotary, ALiBi and the BERT block, and the SGD / Adam / Adagrad dense and
# row pairs (test_optim_kernels.py runs both kernels of each against a scalar loop,
# every option, in the default run; the fused row-group pairs the groups above reach).
PAIR_GROUPS = ("embedding", "renorm", "padding", "positional", "sinusoid", "resize", "init",
               "gpt2", "rope_index", "relative", "bag", "collection")
OTHER_GROUPS = tuple(case.name for case in _warmup.CASES if case.name not in PAIR_GROUPS)
# The pairs only the other groups reach (named, so that a new pair is reached by the
# default groups or listed here, where the exhaustive run checks it is reached).
OTHER_PAIRS = {"_apply", "_table", "_fill", "_add", "_slope_grad", "_bert_forward",
               "_bert_backward", "_quantize8", "_quantize4", "_dequantize8", "_dequantize4",
               "_gather8", "_gather4", "_layer_norm_rows", "_backward_chunks",
               "_dropout_apply", "_dropout_keep_mask", "_rowwise_dense",
               "_half_widen", "_half_copy_rows", "_half_renorm", "_store_rows", "_widen_at",
               "_sgd_dense", "_sgd", "_adam_dense", "_adam", "_adagrad_dense", "_adagrad",
               "_rowwise"}


@pytest.mark.parametrize("dtype, groups", [
    pytest.param("float32", PAIR_GROUPS, id="float32"),
    pytest.param("float32", OTHER_GROUPS, id="float32-other_groups",
                 marks=pytest.mark.exhaustive),
    pytest.param("float64", PAIR_GROUPS + OTHER_GROUPS, id="float64",
                 marks=pytest.mark.exhaustive),
])
def test_every_serial_parallel_pair_computes_the_same_bits(monkeypatch, dtype, groups):
    """Each pick runs both kernels on copies of its arguments and compares every array."""
    compared = set()

    def both(kernels, work):
        serial, parallel = kernels

        def run(*args):
            mine, theirs = copy.deepcopy(args), copy.deepcopy(args)
            got_serial = serial(*mine)
            got_parallel = parallel(*theirs)
            where = parallel.py_func.__name__
            _same(got_serial, got_parallel, where)
            for x, y in zip(mine, theirs, strict=True):
                _same(x, y, where)
            compared.add(where)
            return parallel(*args)
        return run

    for area in AREAS:
        if hasattr(area, "pick"):
            monkeypatch.setattr(area, "pick", both)
    monkeypatch.setattr(arrays, "pick", both)
    for case in _warmup.CASES:
        if case.name in groups:
            with _warmup._parallel_bodies(True):
                case.run(dtype, "int64")
    # Every pair of the kernel modules that a launcher picks from was reached (by these
    # groups: those of the others, listed above).
    sources = "".join(Path(area.__file__).read_text() for area in AREAS)
    written = {name for area in AREAS for name, obj in vars(area).items()
               if isinstance(obj, jit.SerialParallel)
               and (f"pick({name}," in sources or f"_run({name}," in sources)}
    if set(groups) >= set(PAIR_GROUPS):
        expected = written if set(groups) >= set(OTHER_GROUPS) else written - OTHER_PAIRS
    else:
        expected = OTHER_PAIRS
    assert expected <= compared, f"not driven by the warm-up: {sorted(expected - compared)}"


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
    # (No run of the script on an empty cache first: it loads kernels from the warm
    # cache below, each of which it would compile on an empty one.)
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
            for one in (obj if isinstance(obj, jit.SerialParallel) else (obj,)):
                if isinstance(one, CPUDispatcher):
                    found.add(one.py_func.__name__)
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                walk(const)

    for obj in vars(area).values():
        if isinstance(obj, types.FunctionType) and obj.__module__ == area.__name__:
            walk(obj.__code__)
    return found


# A warm-up (worker processes, the project's cache), then the same warm-up again in
# this process: everything loaded, nothing compiled, and the kernels it reached.
COVERAGE = """
import json, sys
import numbapos
from numbapos.kernels import cpu
dtypes, index_dtypes = sys.argv[1].split(","), sys.argv[2].split(",")
ops = {"default": None, "all": "all"}.get(sys.argv[3], sys.argv[3].split(","))
numbapos.warmup(dtypes, index_dtypes, ops, verbose=False, processes=2)
again = numbapos.warmup(dtypes, index_dtypes, ops, verbose=False, processes=1)
print(json.dumps({"compiled": {f"{r.case} {r.dtype} {r.index_dtype}": r.compiled
                               for r in again if r.compiled},
                  "signatures": {area.__name__: {d.py_func.__name__: [str(sig)
                                                                      for sig in d.signatures]
                                                 for obj in vars(area).values()
                                                 for d in (obj if isinstance(
                                                     obj, cpu.jit.SerialParallel) else (obj,))
                                                 if hasattr(d, "signatures")}
                                 for area in cpu.AREAS}}))
"""

# Kernels and signatures that only opt-in groups reach (the default warm-up leaves them
# out): area -> prefixes of the kernels' names, and text of their signatures (the sparse
# optimisers' 16-bit tables are uint16 arrays).
OPT_IN_KERNELS = {"numbapos.kernels.cpu.optim": (("_rowwise",), "array(uint16"),
                  "numbapos.kernels.cpu.embedding": (("_half_",), None),
                  "numbapos.kernels.cpu.convert": (("_",), None)}


def _opt_in(signatures, area):
    """``(name, signature)`` of every compiled signature of ``area``'s opt-in kernels."""
    prefixes, text = OPT_IN_KERNELS[area]
    return [(name, sig) for name, sigs in signatures[area].items() for sig in sigs
            if name.startswith(prefixes) or (text and text in sig)]


# The groups whose kernels the serial/parallel pair test above has already put in the
# project's cache (float32, int64 indices) by default: the warm-up caches what a later
# warm-up loads; every group for both float dtypes and both index dtypes, compiling the
# rest, under the exhaustive marker, which also checks that the warm-up reaches every
# kernel the launchers call (that needs every group's kernels compiled, about twice
# what the default run's pair test compiles).
@pytest.mark.slow
@pytest.mark.parametrize("dtypes, index_dtypes, ops", [
    pytest.param("float32", "int64", ",".join(PAIR_GROUPS), id="pair_groups"),
    pytest.param("float32,float64", "int32,int64", "all", id="all",
                 marks=pytest.mark.exhaustive),
])
def test_warmup_caches_every_launched_kernel_for_each_float_dtype(dtypes, index_dtypes, ops):
    # A fresh process (this one has compiled kernels for other tests), the project's cache.
    run = subprocess.run([sys.executable, "-c", COVERAGE, dtypes, index_dtypes, ops], cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["compiled"] == {}, "the workers left these to compile again: " + \
        str(report["compiled"])
    signatures = report["signatures"]
    # The opt-in groups' kernels are left out unless named.
    for area in OPT_IN_KERNELS:
        opt_in = _opt_in(signatures, area)
        assert bool(opt_in) == (ops == "all"), opt_in
    if ops != "all":
        return
    wanted = set(dtypes.split(","))
    missing = []
    for area in cpu.AREAS:
        # Quantised tables are float32 by their format: their kernels never see float64.
        # 16-bit tables reach their kernels as uint16 bits (float64 scalars at most) and
        # are trained with float32 state: there only whether a kernel was compiled counts.
        for name in sorted(_launched(area)):
            if area is cpu.convert or name.startswith("_half_"):
                expected = set()
            else:
                expected = wanted & {"float32"} if area is cpu.quantized else wanted
            sigs = signatures[area.__name__][name]
            if not any(f"Array(float{bits}" in s for s in sigs for bits in (32, 64)):
                expected = set()  # no float arrays (T5 / DeBERTa buckets: a float32 constant)
            floats = {dtype for dtype in ("float32", "float64") if any(dtype in s for s in sigs)}
            # (a kernel may take float64 arrays besides its data: every wanted dtype appears)
            if not sigs or (floats and not expected <= floats):
                missing.append(f"{area.__name__}.{name}: {sigs}")
    assert not missing, "kernels the warm-up does not compile (add them to CASES):\n" + \
        "\n".join(missing)
    serial = [name for area in cpu.AREAS for name in _launched(area)
              if name.endswith(jit.SERIAL_SUFFIX)]
    assert serial, "expected the serial compilations of parallel bodies among the launched kernels"


# Worker processes compiling signatures of the same kernels at once (int32 and
# int64 indices): Numba's index files must keep every entry.
LOAD_AGAIN = """
import json
import numbapos
again = numbapos.warmup(["float32"], ["int32", "int64"], ["padding", "init"], verbose=False,
                        processes=1)
print(json.dumps({"compiled": sum(r.compiled for r in again),
                  "loaded": sum(r.loaded for r in again)}))
"""


@pytest.mark.skipif(not _numba_internals.can_lock_cache_saves(),
                    reason="NUMBAPOS_NUMBA_INTERNALS=0: the warm-up runs one worker")
def test_worker_processes_fill_one_cache_without_losing_entries(tmp_path):
    cache = tmp_path / "cache"
    run = _python(["-m", "numbapos", "warmup", "--index-dtypes", "int32,int64", "--ops",
                   "padding,init", "-j", "2"], cache)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "4 groups, 2 processes" in lines[0]
    assert sorted(line.split()[1] for line in lines[1:-1]) == ["init", "init", "padding",
                                                               "padding"]
    assert [line.split()[0] for line in lines[1:-1]] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"]
    compiled = int(lines[-1].split(": ")[1].split()[0])
    assert compiled > 0
    again = _python(["-c", LOAD_AGAIN], cache)
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    # (two workers may both compile a kernel both groups call: counted twice above)
    assert report["compiled"] == 0 and 0 < report["loaded"] <= compiled, report


def test_a_failing_group_in_a_worker_process_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    cases = {case.name: case for case in _warmup.CASES}
    reported = []
    # float16 data: init refuses it in its worker, which reports the group and takes no
    # other; the parent raises once the workers are done (padding never sees the dtype).
    tasks = [(cases["init"], "float16", "int64"), (cases["padding"], "float16", "int64")]
    with pytest.raises(RuntimeError, match=r"warmup: init \(float16, int64, serial "
                                           r"kernels\) failed: (TypeError|ValueError): "):
        _warmup._run_in_processes(tasks, 2, reported.append)
    assert [r.case for r in reported] in ([], ["padding"])
    # A worker that dies (here: a group it does not know) is reported too.
    unknown = _warmup.Case("unknown", "", lambda d, i: None)
    with pytest.raises(RuntimeError, match=r"warmup: unknown \(float32, int64\): the worker "
                                           r"process ended \(status 1\)"):
        _warmup._run_in_processes([(unknown, "float32", "int64")], 1, reported.append)


def test_bad_names_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match="dtypes: .*float16"):
        numbapos.warmup(dtypes=["float16"], verbose=False)
    with pytest.raises(ValueError, match="index_dtypes: .*uint8"):
        numbapos.warmup(index_dtypes="uint8", verbose=False)
    with pytest.raises(ValueError, match="ops: .*nope"):
        numbapos.warmup(ops=["embedding", "nope"], verbose=False)
    with pytest.raises(ValueError, match="dtypes: "):
        numbapos.warmup(dtypes=[], verbose=False)
    with pytest.raises(ValueError, match="processes: .* >= 1, got 0"):
        numbapos.warmup(processes=0, verbose=False)
    with pytest.raises(TypeError, match="processes: .*str"):
        numbapos.warmup(processes="2", verbose=False)


def test_opt_in_groups_run_only_when_named_or_with_all(monkeypatch):
    calls = []
    cases = (_warmup.Case("usual", "", lambda d, i: calls.append("usual")),
             _warmup.Case("rare", "", lambda d, i: calls.append("rare"), default=False))
    monkeypatch.setattr(_warmup, "CASES", cases)
    monkeypatch.setattr(_warmup, "CASE_NAMES", ("usual", "rare"))
    assert [r.case for r in numbapos.warmup(verbose=False)] == ["usual"]
    assert [r.case for r in numbapos.warmup(ops=["rare"], verbose=False)] == ["rare"]
    assert [r.case for r in numbapos.warmup(ops="all", verbose=False, processes=1)] == [
        "usual", "rare"]
    assert calls == ["usual"] * 2 + ["rare"] * 2 + ["usual", "usual", "rare", "rare"]


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


@pytest.mark.parametrize("argv", [["--all", "--ops", "sgd"], ["--all", "--dtypes", "float64"],
                                  ["--all", "--index-dtypes", "int32"]])
def test_all_refuses_a_narrower_choice(capsys, argv):
    assert main(["warmup", *argv]) == 2
    assert "--all compiles every group for every dtype" in capsys.readouterr().err


def test_a_failing_op_names_its_case_exits_1_and_restores_the_threshold(monkeypatch, capsys):
    seen = []

    def broken(dtype, index_dtype):
        seen.append(numbapos.config.get("parallel_min_elements"))
        if len(seen) == 2:
            raise ValueError("boom")

    threshold = numbapos.config.get("parallel_min_elements")
    monkeypatch.setattr(_warmup, "CASES", (_warmup.Case("broken", "fails", broken, False),))
    with pytest.raises(RuntimeError, match=r"broken \(float64, int64, parallel kernels\).*boom"):
        numbapos.warmup(dtypes="float64", verbose=False)
    assert seen == [threshold, 0]  # serial bodies first, then every launcher picks parallel
    assert numbapos.config.get("parallel_min_elements") == threshold

    seen.clear()
    assert main(["warmup", "--quiet"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "broken (float32, int64, parallel kernels)" in captured.err
    assert numbapos.config.get("parallel_min_elements") == threshold


def test_report_lists_each_case_once_per_dtype_pair(monkeypatch, capsys):
    calls = []
    cases = (_warmup.Case("indexed", "", lambda d, i: calls.append((d, i))),
             _warmup.Case("plain", "", lambda d, i: calls.append((d, "-")), indexed=False))
    monkeypatch.setattr(_warmup, "CASES", cases)
    results = numbapos.warmup(["float32", "float64"], ["int32", "int64"], processes=1)
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
