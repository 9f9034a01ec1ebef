"""``python -m numbapos bench``: numbapos next to NumPy and PyTorch, without pytest.

Times the headline cases of ``benchmarks/`` (lookups, backward passes, the
sparse training step, LayerNorm, the BERT and GPT-2 blocks, rotary q and k) and
how their cost grows with the embedding dimension and the batch, then prints one table:
median milliseconds, GB/s where the bytes moved are known, and the ratio
against each peer. Every side is warmed up first (JIT compilation excluded),
the sides of a case are timed in interleaved rounds and the medians compared,
so the ratios come from one run on the same machine state.

Modules: :mod:`.data` (sizes and inputs), :mod:`.cases` (the cases and
numbapos's side), :mod:`.peers` (NumPy, PyTorch, CuPy), :mod:`.timing`
(interleaved medians), :mod:`.report` (table and plot), :mod:`.hostcost` (on a
GPU, the host's cost per op: microseconds, launches, allocations, Python calls).
"""

from __future__ import annotations

import sys

import numba

from .. import __version__, _device
from . import cases, hostcost, peers, report
from .data import FULL, QUICK, TINY, inputs
from .timing import Plan, interleaved_medians

SIZES = {"full": FULL, "quick": QUICK, "tiny": TINY}
SETTLE_S = 0.003  # pause before each timed block: the other side's threads stop spinning
PEERS = {"cpu": ("numpy", "torch"), "cuda": ("cupy", "torch")}


def plan_for(quick: bool, repeat: int | None) -> Plan:
    """The timing plan of a ``--quick`` run or a full one; ``repeat`` overrides the rounds."""
    if quick:
        return Plan(rounds=repeat or 5, warmup_s=0.05, min_round_s=2e-4, budget_s=0.5,
                    settle_s=SETTLE_S)
    return Plan(rounds=repeat or 30, warmup_s=0.3, min_round_s=1e-3, budget_s=5.0,
                settle_s=SETTLE_S)


def _peer_versions(device: str) -> str:
    parts = []
    for side in PEERS[device]:
        problem = peers.available(side, device)
        parts.append(f"{report.NAMES[side]} {problem or peers.version(side)}")
    return ", ".join(parts)


def _threads(device: str) -> str:
    """Numba's threads, PyTorch's set to the same number (fair on the CPU); or the GPU."""
    if device == "cuda":
        from numba import cuda

        if _device.simulator_enabled():
            return "Numba's CUDA simulator (the times say nothing about a GPU)"
        name = cuda.get_current_device().name
        return name.decode() if isinstance(name, bytes) else str(name)
    threads = numba.get_num_threads()
    if peers.available("torch", "cpu") is None:
        peers._torch().set_num_threads(threads)
    return f"{threads} threads (Numba and PyTorch)"


def time_case(case, device: str, plan: Plan, errors: list) -> report.Row:
    """Median seconds of every side of ``case`` that can run on ``device``.

    A side that raises while being set up or on its first call is left out of
    the row and its error appended to ``errors`` as ``(case, side, message)``.
    """
    x = inputs(case.shape)
    calls, syncs = {}, {}
    for side, make in case.sides.items():
        if peers.available(side, device) is not None:
            continue
        try:
            fn = make(x, device)
            fn()  # compiles numbapos's kernels; peers allocate their caches
        except Exception as exc:  # a broken peer must not hide the other rows
            errors.append((case.name, side, f"{type(exc).__name__}: {exc}"))
            continue
        calls[side] = fn
        sync = peers.sync(side, device)
        if sync is not None:
            syncs[side] = sync
    seconds = interleaved_medians(calls, plan, syncs) if calls else {}
    return report.Row(case.name, seconds, case.moved(case.shape) if case.moved else None,
                      case.note)


def _host_cost(sizes, quick: bool, only, errors: list, say) -> None:
    """The host-cost table of :mod:`.hostcost` (a real GPU only)."""
    if _device.simulator_enabled():
        say("Host cost per op: not measured on Numba's CUDA simulator (its kernels run as "
            "Python on the host); numbapos's tests measure it against a stub CUDA driver.")
        return
    calls = 50 if quick else hostcost.CALLS
    say(f"Host cost per op call (batch {sizes.batch}x{sizes.seq}, D={sizes.dim}, "
        f"V={sizes.vocab}):")
    say(report.host_header())
    failed = []
    for cost in hostcost.run(sizes, calls, only, errors=failed):
        say(report.format_host(cost))
    errors.extend((name, "numbapos", message) for name, message in failed)
    say(report.host_legend(calls))


def run(quick=False, device="cpu", plot=None, repeat=None, size=None, only=None,
        file=None) -> int:
    """Time the bench cases and print the table; 1 when a numbapos side failed.

    Parameters
    ----------
    quick : bool
        Fewer rounds, shorter warm-ups, fewer scaling points (well under a minute).
    device : {"cpu", "cuda"}
        Where every side runs (the NumPy side only on the CPU, CuPy's only on CUDA).
    plot : str, optional
        Write the scaling curves to this PNG (needs matplotlib).
    repeat : int, optional
        Rounds per case (default 5 with ``quick``, else 30).
    size : {"full", "quick", "tiny"}, optional
        The sizes (default: "quick" with ``quick``, else "full"); "tiny" is for
        tests and Numba's CUDA simulator.
    only : str, optional
        Time only the cases whose names contain this text (e.g. ``"lookup"``).
    file : file object, optional
        Where to print (default ``sys.stdout``).
    """
    out = sys.stdout if file is None else file
    sizes = SIZES[size or ("quick" if quick else "full")]
    plan = plan_for(quick, repeat)
    columns = PEERS[device]

    def say(text=""):
        print(text, file=out, flush=True)

    say(f"numbapos {__version__} bench on {device}: {_threads(device)}; "
        f"{_peer_versions(device)}")
    say(f"{plan.rounds} interleaved rounds per case (fewer after {plan.budget_s:g} s), "
        "median ms per call, float32")
    say()
    say(report.header(columns))
    errors = []
    for case in cases.headline(sizes):
        if only is not None and only not in case.name:
            continue
        say(report.format_row(time_case(case, device, plan, errors), columns))
    say()
    say("How the cost grows with D (batch "
        f"{sizes.batch}x{sizes.seq}) and with the batch (D={sizes.dim}):")
    points = []
    for point in cases.scaling(sizes):
        if only is not None and only not in point.case.name:
            continue
        row = time_case(point.case, device, plan, errors)
        points.append((point.op, point.axis, point.value, row))
        say(report.format_row(row, columns))
    say()
    say(report.legend(columns))
    if device == "cuda":
        say()
        _host_cost(sizes, quick, only, errors, say)
    for name, side, message in errors:
        say(f"error: {name}, {report.NAMES[side]}: {message}")
    if plot is not None:
        report.plot(points, plot, f"numbapos {__version__} on {device}, {_threads(device)}")
        say(f"scaling curves written to {plot}")
    return 1 if any(side == "numbapos" for _, side, _ in errors) else 0
