"""Command line: ``python -m numbapos info`` and ``python -m numbapos demo``."""

from __future__ import annotations

import argparse
import platform
import sys
import time


def _cuda_status() -> str:
    from numbapos import _device

    if not _device.cuda_available():
        return f"unavailable ({_device._cuda_problem()})"
    if _device.simulator_enabled():
        return "Numba's CUDA simulator (NUMBA_ENABLE_CUDASIM=1): correct, not fast"
    from numba import cuda

    name = cuda.get_current_device().name
    return f"available ({name.decode() if isinstance(name, bytes) else name})"


def info() -> int:
    """Print versions, threads and usable devices."""
    import numba
    import numpy

    import numbapos

    print(f"numbapos {numbapos.__version__}")
    print(f"python   {platform.python_version()} ({platform.machine()})")
    print(f"numpy    {numpy.__version__}")
    print(f"numba    {numba.__version__}")
    print(f"threads  {numba.get_num_threads()} (numba threading layer: "
          f"{numba.config.THREADING_LAYER})")
    print("devices  cpu: available")
    print(f"         cuda: {_cuda_status()}")
    return 0


def demo(steps: int = 200, seed: int = 0) -> int:
    """Train a tiny embedding model with sparse gradients and SGD; print the loss."""
    import numpy as np

    from numbapos import nn, optim

    rng = np.random.default_rng(seed)
    vocab, dim, batch, length = 1000, 32, 16, 24
    targets = rng.normal(size=(vocab, dim)).astype(np.float32)
    emb = nn.Embedding(vocab, dim, padding_idx=0, sparse=True, seed=seed + 1)
    opt = optim.SGD(emb.parameters(), lr=10.0, momentum=0.9)
    print(f"demo: fit a {vocab}x{dim} Embedding(sparse=True) to random targets, "
          f"batches of {batch}x{length}, SGD(lr=10, momentum=0.9)")
    start = time.perf_counter()
    for step in range(1, steps + 1):
        ids = rng.integers(0, vocab, size=(batch, length))
        out = emb(ids)
        diff = out - targets[ids]
        diff[ids == 0] = 0.0
        tokens = ids.size
        loss = float(np.sum(diff * diff)) / tokens
        emb.zero_grad()
        emb.backward(2.0 * diff / tokens)
        opt.step()
        if step == 1 or step % 50 == 0:
            print(f"  step {step:4d}  loss {loss:.5f}")
    elapsed = time.perf_counter() - start
    print(f"done in {elapsed:.2f} s ({elapsed / steps * 1e3:.2f} ms/step, JIT compile included)")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m numbapos", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, threads and usable devices")
    demo_parser = sub.add_parser("demo", help="train a tiny embedding model")
    demo_parser.add_argument("--steps", type=int, default=200)
    demo_parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    return demo(args.steps, args.seed)


if __name__ == "__main__":
    sys.exit(main())
