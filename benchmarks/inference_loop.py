"""Eval-mode inference loops with and without ``numbapos.no_grad()`` (issue: modes follow PyTorch).

A loop of eval-mode ``BertEmbeddings`` forwards at BERT-base sizes (V = 30522,
D = 768, 32 x 128 tokens) that never calls ``backward``: without ``no_grad``
every forward records for a backward, and the module keeps at most
``max_pending_records`` of them. This prints the time of each loop (the
minimum over interleaved repeats) and the memory the records hold at the end.

    python benchmarks/inference_loop.py [--forwards 1000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc

import numpy as np

import numbapos
from numbapos import nn


def run(block, ids, forwards, grad_mode):
    start = time.perf_counter()
    if grad_mode:
        for _ in range(forwards):
            block(ids)
    else:
        with numbapos.no_grad():
            for _ in range(forwards):
                block(ids)
    return time.perf_counter() - start


def held_bytes(forwards, ids):
    """Bytes allocated through Python's allocator after ``forwards`` eval forwards without
    no_grad, beyond a fresh block's (output arrays excluded: the module reuses one)."""
    block = nn.BertEmbeddings(30522, 768, 512, 2, seed=0).eval()
    block(ids)
    block._saved.clear()
    gc.collect()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    for _ in range(forwards):
        block(ids)
    gc.collect()
    final, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return final - base, block.pending_backwards()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--forwards", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 30522, size=(32, 128))
    block = nn.BertEmbeddings(30522, 768, 512, 2, seed=0).eval()
    run(block, ids, 50, True)  # compile and warm both paths
    run(block, ids, 50, False)
    times = {True: [], False: []}
    for _ in range(args.repeats):
        for grad_mode in (False, True):
            times[grad_mode].append(run(block, ids, args.forwards, grad_mode))
    recorded, plain = min(times[True]), min(times[False])
    held, pending = held_bytes(args.forwards, ids)
    record = held / max(pending, 1)
    print(f"{args.forwards} eval forwards, 32 x 128 tokens, D = 768 "
          f"(max_pending_records = {numbapos.config.get('max_pending_records')})")
    print(f"  under no_grad:   {plain:.3f} s ({1e3 * plain / args.forwards:.3f} ms per forward)")
    print(f"  without no_grad: {recorded:.3f} s ({1e3 * recorded / args.forwards:.3f} ms per "
          f"forward), {recorded / plain:.3f}x")
    print(f"  records held at the end: {pending}, {held / 2**20:.2f} MiB "
          f"({record / 2**10:.1f} KiB each; one output is "
          f"{32 * 128 * 768 * 4 / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
