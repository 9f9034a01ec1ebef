"""First calls of a fresh process, cold cache and after ``python -m numbapos warmup``.

Runs each first step in a new process with its own ``NUMBA_CACHE_DIR``: empty
(cold: every kernel compiled when first called) or filled by ``python -m
numbapos warmup --dtypes float32 --index-dtypes int64`` (warm: every kernel
loaded). Prints the wall and CPU seconds of the first step (imports
excluded), the time of the next ones, and, cold, the CPU seconds of each
kernel compiled (nested compiles counted in their caller).
CPU seconds are what an idle machine's wall time would be: on a busy shared
machine the wall time mostly measures the neighbours.

    python benchmarks/first_calls.py             # both steps, issue shapes
    python benchmarks/first_calls.py --top 12    # more kernels per step

Steps: ``Embedding(sparse=True)`` forward + backward + SGD(momentum=0.9) at
V = 50,000, D = 768, 32 x 512 tokens; ``BertEmbeddings`` forward + backward +
SGD(momentum=0.9) at BERT-base size, 32 x 128 tokens.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = {"embedding": (50_000, 768, (32, 512)), "bert": (30522, 768, (32, 128))}


def child(step: str) -> None:
    """First steps in this (fresh) process; prints a JSON report."""
    import threading

    import numpy as np
    from numba.core import event

    compiles = []  # (thread, kernel, CPU seconds of that thread)

    class Timer(event.Listener):
        def __init__(self):
            self.started = threading.local()

        def on_start(self, ev):
            self.started.__dict__.setdefault("stack", []).append(time.thread_time())

        def on_end(self, ev):
            stack = self.started.stack
            seconds = time.thread_time() - stack.pop()
            if not stack:  # top level: nested compiles are part of it
                func = ev.data["dispatcher"].py_func
                compiles.append((threading.current_thread().name,
                                 f"{func.__module__.rsplit('.', 1)[-1]}.{func.__name__}",
                                 seconds))

    event.register("numba:compile", Timer())
    from numbapos import nn, optim

    vocab, dim, shape = STEPS[step]
    module = (nn.Embedding(vocab, dim, sparse=True, seed=0) if step == "embedding"
              else nn.BertEmbeddings(vocab, dim, seed=0))
    opt = optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    ids = np.random.default_rng(0).integers(0, vocab, size=shape)
    grad = np.ones(shape + (dim,), np.float32)
    times = []
    start = time.perf_counter()
    while len(times) < 3:
        wall, cpu = time.perf_counter(), time.process_time()
        module.zero_grad()
        module(ids)
        module.backward(grad)
        opt.step()
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    ready = time.perf_counter() - start
    wall = time.perf_counter()
    module.zero_grad()
    module(ids)
    module.backward(grad)
    opt.step()
    steady = time.perf_counter() - wall
    print(json.dumps({"first": times[0], "second": times[1], "steps": len(times),
                      "ready": ready, "steady": steady, "compiles": compiles}))


def run_child(step: str, cache: str) -> dict:
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, __file__, "--child", step], env=env, check=True,
                          capture_output=True, text=True)
    return json.loads(done.stdout.splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--child", choices=sorted(STEPS), help=argparse.SUPPRESS)
    parser.add_argument("--top", type=int, default=8, help="kernels listed per cold step")
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    with tempfile.TemporaryDirectory() as tmp:
        warm = os.path.join(tmp, "warm")
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "numbapos", "warmup", "--dtypes", "float32",
                        "--index-dtypes", "int64", "--quiet"], cwd=ROOT, check=True,
                       env=dict(os.environ, NUMBA_CACHE_DIR=warm))
        print(f"warmup (float32, int64): {time.perf_counter() - start:.1f} s wall")
        for step in STEPS:
            cold = run_child(step, os.path.join(tmp, f"cold-{step}"))
            hot = run_child(step, warm)
            print(f"{step}: first step, cold cache: {cold['first'][0]:.2f} s wall "
                  f"({cold['first'][1]:.2f} s CPU), then {cold['second'][0] * 1e3:.0f} ms, "
                  f"{cold['steady'] * 1e3:.1f} ms a step; after warmup: {hot['first'][0]:.2f} s "
                  f"wall ({hot['first'][1]:.2f} s CPU)")
            compiles = sorted(cold["compiles"], key=lambda item: -item[2])
            print(f"  compiling, cold: {sum(c[2] for c in compiles):.2f} s CPU in "
                  f"{len(compiles)} kernels; the largest:")
            for _, name, seconds in compiles[:args.top]:
                print(f"    {seconds:5.2f} s  {name}")
            if hot["compiles"]:
                print(f"  compiled despite the warm-up: {[c[1] for c in hot['compiles']]}")


if __name__ == "__main__":
    main()
