"""``python -m numbapos bench``: arguments, table, timing order, plot, and the CUDA path."""

import io
import re

import pytest

from numbapos import bench
from numbapos.__main__ import main
from numbapos.bench import cases, data, peers, report
from numbapos.bench.timing import Plan, interleaved_medians


@pytest.fixture
def cuda_device():
    import numbapos

    if not numbapos.cuda_available():
        pytest.skip("CUDA is not available (no GPU and the simulator is off)")
    return "cuda"


@pytest.mark.parametrize("argv, message", [
    (["--repeat", "2"], "--repeat: expected an integer >= 3, got 2"),
    (["--repeat", "many"], "--repeat: expected an integer >= 3, got 'many'"),
    (["--device", "tpu"], "--device: invalid choice: 'tpu'"),
    (["--size", "huge"], "--size: invalid choice: 'huge'"),
])
def test_cli_refuses_bad_arguments(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("info", "demo", "warmup", "bench"):
        assert command in out
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert all(flag in out for flag in ("--quick", "--device", "--plot", "--repeat", "--only"))
    assert "--size" not in out  # the tests' sizes stay hidden


def test_plot_without_matplotlib_is_a_usage_error(monkeypatch, capsys):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--plot", "x.png"])
    assert exit_info.value.code == 2
    assert "--plot needs matplotlib" in capsys.readouterr().err


def test_rows_show_medians_bandwidth_and_ratios():
    row = report.Row("lookup", {"numbapos": 0.002, "torch": 0.005}, moved=4_000_000,
                     note="a note")
    line, note = report.format_row(row, ["numpy", "torch"]).split("\n")
    assert line.split() == ["lookup", "2", "2.0", "-", "5", "-", "2.50x"]
    assert note == "    (a note)"
    titles = report.header(["numpy", "torch"])
    assert titles.split() == ["case", "numbapos", "ms", "GB/s", "NumPy", "ms", "PyTorch", "ms",
                              "vs", "NumPy", "vs", "PyTorch"]
    assert len(titles) == len(line)  # columns line up
    missing = report.format_row(report.Row("x", {}), ["torch"])
    assert missing.split() == ["x", "-", "-", "-", "-"]


def test_sides_are_warmed_then_timed_in_rotating_turns():
    calls = []
    sides = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    synced = []
    medians = interleaved_medians(sides, Plan(rounds=3, warmup_s=0.0, min_round_s=0.0,
                                              budget_s=10.0), {"b": lambda: synced.append(1)})
    assert set(medians) == {"a", "b", "c"} and all(t >= 0 for t in medians.values())
    assert calls[:6] == ["a", "a", "b", "b", "c", "c"]  # warm-up: at least two calls each
    assert calls[6:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert len(synced) == 5  # b's queue waited for after each call


def test_rounds_stop_after_the_budget_but_never_below_three():
    calls = []
    interleaved_medians({"a": lambda: calls.append(1)},
                        Plan(rounds=50, warmup_s=0.0, min_round_s=0.0, budget_s=0.0))
    assert len(calls) == 2 + 3


def test_short_calls_are_repeated_within_a_round():
    calls = []
    interleaved_medians({"a": lambda: calls.append(1)},
                        Plan(rounds=3, warmup_s=0.0, min_round_s=1e-3, budget_s=10.0))
    assert len(calls) > 2 + 3 * 10


def test_peers_say_why_they_cannot_run():
    assert peers.available("numbapos", "cuda") is None
    assert peers.available("numpy", "cuda") == "CPU only"
    assert peers.available("cupy", "cpu") == "CUDA only"
    torch = pytest.importorskip("torch")
    assert peers.available("torch", "cpu") is None
    if not torch.cuda.is_available():
        assert peers.available("torch", "cuda") == "no CUDA device"


def test_every_case_has_numbapos_and_a_peer():
    every = cases.headline(data.FULL) + [p.case for p in cases.scaling(data.FULL)]
    names = [case.name for case in every]
    assert len(set(names)) == len(names)
    for case in every:
        assert "numbapos" in case.sides and len(case.sides) >= 2, case.name
        assert len(case.name) < report.NAME_WIDTH, case.name  # the table's name column
    assert {p.axis for p in cases.scaling(data.FULL)} == {"D", "batch"}
    assert sorted({p.value for p in cases.scaling(data.FULL) if p.axis == "D"}) == [64, 256, 1024]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    pytest.importorskip("matplotlib")
    path = tmp_path_factory.mktemp("bench") / "scaling.png"
    out = io.StringIO()
    code = bench.run(quick=True, size="tiny", repeat=3, plot=str(path), file=out)
    return code, out.getvalue(), path


NUMBER = r"(\d+(\.\d+)?(e-?\d+)?|-)"


def test_quick_run_prints_every_case_with_numbers(quick_run):
    code, out, _ = quick_run
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith("numbapos ") and "bench on cpu" in lines[0]
    assert lines[3] == report.header(["numpy", "torch"])
    for case in cases.headline(data.TINY) + [p.case for p in cases.scaling(data.TINY)]:
        row = next(line for line in lines if line.startswith(case.name + " "))
        cells = row[report.NAME_WIDTH:].split()
        assert len(cells) == 6, row
        assert re.fullmatch(r"\d+(\.\d+)?(e-?\d+)?", cells[0]), row  # numbapos always timed
        assert all(re.fullmatch(NUMBER, c) or re.fullmatch(r"\d+\.\d\dx|-", c) for c in cells)
    assert "How the cost grows with D" in out
    assert "error" not in out


def test_quick_run_draws_the_scaling_curves(quick_run):
    _, out, path = quick_run
    assert f"scaling curves written to {path}" in out
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_a_failing_numbapos_side_is_reported_and_exits_1(monkeypatch):
    def broken(x, device):
        raise RuntimeError("kernel exploded")

    case = cases.Case("broken case", data.Shape(10, 4, 1, 2), {"numbapos": broken,
                                                                "numpy": peers.numpy_take})
    monkeypatch.setattr(cases, "headline", lambda sizes: [case])
    monkeypatch.setattr(cases, "scaling", lambda sizes: [])
    out = io.StringIO()
    assert bench.run(quick=True, size="tiny", repeat=3, file=out) == 1
    text = out.getvalue()
    assert "error: broken case, numbapos: RuntimeError: kernel exploded" in text
    row = next(line for line in text.splitlines() if line.startswith("broken case"))
    assert row.split()[2] == "-"  # no numbapos time; NumPy's still shown


def test_cuda_device_on_the_simulator(cuda_device):
    out = io.StringIO()
    code = bench.run(quick=True, device="cuda", size="tiny", repeat=3, only="lookup", file=out)
    text = out.getvalue()
    assert code == 0, text
    assert "bench on cuda" in text and "NumPy" not in text.splitlines()[3]
    lookups = [line for line in text.splitlines() if line.startswith("lookup")]
    assert len(lookups) == 3 + len(data.TINY.dims) + len(data.TINY.batches)
    for line in lookups:
        assert re.fullmatch(r"\d+(\.\d+)?(e-?\d+)?", line[report.NAME_WIDTH:].split()[0]), line


def test_every_numbapos_side_runs_on_the_simulator(cuda_device):
    from numbapos import _device

    for case in cases.headline(data.TINY):
        if "Bert" in case.name or "LayerNorm" in case.name:
            continue  # minutes on the simulator; their kernels have their own CUDA tests
        result = case.sides["numbapos"](data.inputs(case.shape), "cuda")()
        if result is not None and not isinstance(result, tuple):
            assert _device.device_of(getattr(result, "values", result)) == "cuda", case.name


def test_without_pytorch_the_table_says_so(monkeypatch):
    def missing():
        raise ImportError("No module named 'torch'")

    monkeypatch.setattr(peers, "_torch", missing)
    out = io.StringIO()
    assert bench.run(quick=True, size="tiny", repeat=3, only="lookup, 3 tokens", file=out) == 0
    lines = out.getvalue().splitlines()
    assert "PyTorch not installed" in lines[0]
    row = next(line for line in lines if line.startswith("lookup, 3 tokens"))
    cells = row[report.NAME_WIDTH:].split()
    assert cells[3] == "-" and cells[5] == "-"  # PyTorch ms, vs PyTorch
    assert re.fullmatch(r"\d+\.\d\dx", cells[4])  # vs NumPy still there


def test_each_timed_block_starts_after_the_settle_pause(monkeypatch):
    from numbapos.bench import timing

    events = []
    monkeypatch.setattr(timing.time, "sleep", lambda s: events.append(("sleep", s)))
    interleaved_medians({"a": lambda: events.append("a")},
                        Plan(rounds=3, warmup_s=0.0, min_round_s=0.0, budget_s=10.0,
                             settle_s=0.002))
    assert events == ["a", "a"] + [("sleep", 0.002), "a"] * 3  # no pause in the warm-up
    assert bench.plan_for(True, None).settle_s > 0 and bench.plan_for(False, 7).rounds == 7
