"""Every op of ``python -m numbapos bench --quick`` quiet, beside a busy process, and serial.

A busy neighbour is one process spinning in a Python loop (``while True:
pass``), optionally pinned to the last core. It is started once and
switched on and off with SIGCONT / SIGSTOP, so the conditions of each op
are timed in the same seconds, round by round, the order rotating, each
after 0.3 s of unmeasured calls in its state (numbapos looks at the other
processes' load over the last 0.1 s, when a call samples it: after a sleep
its first window would still describe the previous condition):

- ``quiet``: the neighbour stopped; numbapos as configured;
- ``busy``: the neighbour running; numbapos as configured;
- ``busy_serial``: the neighbour running; every launcher forced to its serial
  kernel (``parallel_min_elements`` above any size);
- ``quiet_serial``: the neighbour stopped, the serial kernels.

Prints a table and, with ``--json PATH``, writes the medians (ms) and the
ratios ``busy / quiet`` (target <= 2.2) and ``busy / busy_serial`` (target <=
1, with the noise of a shared machine). Linux only (signals, affinity)::

    python benchmarks/busy_neighbour.py [--rounds 7] [--pin] [--only lookup]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from statistics import median

import numbapos
from numbapos import config
from numbapos.bench import cases
from numbapos.bench.data import QUICK, inputs

SERIAL = 1 << 62  # parallel_min_elements above any work: every launcher serial
CONDITIONS = ("quiet", "busy", "busy_serial", "quiet_serial")


def _neighbour(pin: bool) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    if pin:
        os.sched_setaffinity(proc.pid, {max(os.sched_getaffinity(0))})
    os.kill(proc.pid, signal.SIGSTOP)
    return proc


def _per_call(fn, min_s: float) -> float:
    """Seconds per call of ``fn``, repeated for at least ``min_s``."""
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_s:
            return elapsed / calls


def measure(rounds: int = 7, pin: bool = False, only: str | None = None,
            min_s: float = 0.05, settle_s: float = 0.3) -> dict:
    """``{case: {condition: median ms, ...}}`` for the numbapos side of each case."""
    neighbour = _neighbour(pin)
    results = {}
    try:
        for case in cases.headline(QUICK):
            if only is not None and only not in case.name:
                continue
            fn = case.sides["numbapos"](inputs(case.shape), "cpu")
            fn()
            with config.override(parallel_min_elements=SERIAL):
                fn()
            times = {c: [] for c in CONDITIONS}
            for r in range(rounds):
                for i in range(len(CONDITIONS)):
                    condition = CONDITIONS[(r + i) % len(CONDITIONS)]
                    os.kill(neighbour.pid,
                            signal.SIGSTOP if condition.startswith("quiet") else signal.SIGCONT)
                    threshold = SERIAL if condition.endswith("serial") else \
                        config.get("parallel_min_elements")
                    with config.override(parallel_min_elements=threshold):
                        # Calls, unmeasured, for settle_s after the switch: numbapos's view
                        # of the other processes' load (a window of 0.1 s, sampled only by
                        # calls) then describes this condition, not the previous one.
                        _per_call(fn, settle_s)
                        times[condition].append(_per_call(fn, min_s))
            row = {c: median(t) * 1e3 for c, t in times.items()}
            row["busy_over_quiet"] = row["busy"] / row["quiet"]
            row["busy_over_serial"] = row["busy"] / row["busy_serial"]
            results[case.name] = row
    finally:
        os.kill(neighbour.pid, signal.SIGCONT)
        neighbour.kill()
        neighbour.wait()
    return results


def _adaptive():
    return config.get("adaptive_threads") if "adaptive_threads" in config.SETTINGS else "n/a"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pin", action="store_true", help="pin the neighbour to the last core")
    parser.add_argument("--only", default=None)
    parser.add_argument("--json", default=None, metavar="PATH")
    args = parser.parse_args(argv)
    with open("/proc/loadavg") as f:
        load_before = f.read().split()[:4]
    results = measure(args.rounds, args.pin, args.only)
    with open("/proc/loadavg") as f:
        load_after = f.read().split()[:4]
    print(f"numbapos {numbapos.__version__}, {numbapos.get_num_threads()} threads, neighbour "
          f"{'pinned' if args.pin else 'not pinned'}, load {' '.join(load_before)} -> "
          f"{' '.join(load_after)}; adaptive threads: {_adaptive()}")
    print("median ms per call; serial: every launcher's serial kernel")
    print(f"{'case':<44} {'quiet':>8} {'busy':>8} {'serial':>8} {'serial':>8} {'busy/':>6} "
          f"{'busy/':>7}")
    print(f"{'':<44} {'':>8} {'':>8} {'busy':>8} {'quiet':>8} {'quiet':>6} {'serial':>7}")
    for name, row in results.items():
        print(f"{name[:44]:<44} {row['quiet']:8.3f} {row['busy']:8.3f} "
              f"{row['busy_serial']:8.3f} {row['quiet_serial']:8.3f} "
              f"{row['busy_over_quiet']:6.2f} {row['busy_over_serial']:7.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"load": [load_before, load_after], "pinned": args.pin,
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
