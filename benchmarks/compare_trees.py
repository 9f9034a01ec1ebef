"""Two source trees of numbapos timed against each other, interleaved: a restructuring's check.

    python benchmarks/compare_trees.py OLD_TREE NEW_TREE [--rounds 6] [--only TEXT]
    python benchmarks/compare_trees.py TREE TREE --new-env NUMBAPOS_PREFETCH_LINES=0

Each round starts one process per tree, in alternating order (old, new, then new,
old, ...); a process imports the numbapos of its tree (``PYTHONPATH``), warms every
case up, then times each case's numbapos side (the cases of ``python -m numbapos
bench``, plus the 16-bit, quantised, optimiser and position ops below) and prints the
minimum seconds of a call. The report gives, per case, each tree's minimum over
all rounds and their ratio, new / old: what the machine's drift and neighbours add
to one process shows up in both trees' rounds alike. The first process of each tree
compiles its kernels into that tree's cache; its round is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

SECONDS_PER_CASE = 0.25  # timed calls per case and process, after a warm-up of as long


def _extra_cases():
    """Ops outside the bench command's table, through the public API only (both trees)."""
    import ml_dtypes
    import numpy as np

    from numbapos import functional as F
    from numbapos import nn, no_grad, optim

    rng = np.random.default_rng(0)
    vocab, dim, tokens = 200_000, 256, 16_384
    table = rng.standard_normal((vocab, dim), dtype=np.float32)
    bf16 = table.astype(ml_dtypes.bfloat16)
    ids = rng.integers(0, vocab, tokens)
    cases = {}
    out32 = np.empty((tokens, dim), np.float32)
    out16 = np.empty((tokens, dim), ml_dtypes.bfloat16)
    cases["bfloat16 lookup -> float32"] = lambda: F.embedding(ids, bf16, out=out32)
    cases["bfloat16 lookup -> bfloat16"] = lambda: F.embedding(ids, bf16, out=out16,
                                                               out_dtype=ml_dtypes.bfloat16)
    quantized = nn.QuantizedEmbedding.from_float(nn.Embedding.from_pretrained(table), bits=8)
    cases["int8 lookup"] = lambda: quantized(ids)

    def sparse_step(module, opt, grad):
        def step():
            module.zero_grad()
            module(ids[:4096])
            module.backward(grad)
            opt.step()
        return step

    grad = np.ones((4096, dim), np.float32)
    for name, make in (("SGD momentum", lambda p: optim.SGD(p, lr=0.1, momentum=0.9)),
                       ("Adam", lambda p: optim.Adam(p, lr=1e-3)),
                       ("Adagrad", lambda p: optim.Adagrad(p, lr=0.1)),
                       ("RowWiseAdagrad", lambda p: optim.RowWiseAdagrad(p, lr=0.1))):
        emb = nn.Embedding.from_pretrained(table.copy(), freeze=False, sparse=True)
        cases[f"sparse {name} step, 4096 ids"] = sparse_step(emb, make(emb.parameters()), grad)
    emb16 = nn.Embedding.from_pretrained(bf16.copy(), freeze=False, sparse=True)
    cases["bfloat16 sparse SGD momentum step, 4096 ids"] = sparse_step(
        emb16, optim.SGD(emb16.parameters(), lr=0.1, momentum=0.9), grad)
    x = rng.standard_normal((32, 128, 768), dtype=np.float32)
    cases["dropout p=0.1, 32x128x768"] = lambda: F.dropout(x, 0.1, seed=1)
    cases["sinusoid table 2048x768"] = lambda: F.sinusoidal_pos_embedding(2048, 768)
    scores = rng.standard_normal((4, 12, 128, 128), dtype=np.float32)
    alibi, ln = nn.ALiBi(12), nn.LayerNorm(768)

    def inference(module, value):
        def call():
            with no_grad():
                return module(value)
        return call

    cases["ALiBi 4x12x128x128"] = inference(alibi, scores)
    cases["LayerNorm module fwd, 32x128x768"] = inference(ln, x)
    return cases


def child(only: str | None) -> None:
    from numbapos.bench import cases as bench_cases
    from numbapos.bench.data import FULL, inputs

    calls = {}
    for case in bench_cases.headline(FULL):
        if "numbapos" in case.sides:
            calls[case.name] = case.sides["numbapos"](inputs(case.shape), "cpu")
    calls.update(_extra_cases())
    if only:  # any of the comma-separated texts
        calls = {name: fn for name, fn in calls.items()
                 if any(text in name for text in only.split(","))}
    best = {}
    for name, fn in calls.items():
        for _phase in ("warm", "time"):  # the first pass warms the case up
            times = []
            end = time.perf_counter() + SECONDS_PER_CASE
            while time.perf_counter() < end or len(times) < 3:
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
        best[name] = min(times)
    print(json.dumps(best))


def _run(tree: str, only: str | None, extra_env=()) -> dict:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree))
    env.update(item.split("=", 1) for item in extra_env)
    args = [sys.executable, os.path.abspath(__file__), "--child"]
    if only:
        args += ["--only", only]
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False,
                          cwd=os.path.abspath(tree))
    if done.returncode:
        raise SystemExit(f"{tree}: {done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("old", nargs="?")
    parser.add_argument("new", nargs="?")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--only")
    parser.add_argument("--new-env", action="append", default=[], metavar="VAR=VALUE",
                        help="an environment setting of the new side's processes only")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.only)
        return
    sides = {"old": (args.old, ()), "new": (args.new, args.new_env)}
    for tree, env in sides.values():  # compile into each tree's cache: not counted
        _run(tree, args.only, env)
    results = {"old": [], "new": []}
    for r in range(args.rounds):
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        for which in order:
            results[which].append(_run(*sides[which][:1], args.only, sides[which][1]))
        print(f"round {r + 1} of {args.rounds} done", file=sys.stderr)
    names = list(results["old"][0])
    width = max(len(n) for n in names)
    print(f"{'case':<{width}}  {'old ms':>9}  {'new ms':>9}  new/old")
    for name in names:
        old = min(run[name] for run in results["old"]) * 1e3
        new = min(run[name] for run in results["new"]) * 1e3
        print(f"{name:<{width}}  {old:9.3f}  {new:9.3f}  {new / old:6.3f}")


if __name__ == "__main__":
    main()
