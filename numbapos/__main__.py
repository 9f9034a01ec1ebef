"""Command line: ``python -m numbapos info`` and ``python -m numbapos demo``."""

from __future__ import annotations

import argparse
import platform
import sys


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
    pool = numbapos._pool.pool_settings()
    print(f"threads  {pool['threads']} of {pool['pool_size']} (numba threading layer: "
          f"{pool['layer']}; idle threads: {pool['wait']})")
    print("devices  cpu: available")
    print(f"         cuda: {_cuda_status()}")
    return 0


def _int_at_least(minimum: int, what: str):
    """An argparse type: an integer >= ``minimum``, else a clear argparse error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    from numbapos import __version__
    from numbapos.demo import POSITIONS

    parser = argparse.ArgumentParser(
        prog="python -m numbapos",
        description="numbapos: embedding layers and positional encodings with Numba kernels.")
    parser.add_argument("--version", action="version", version=f"numbapos {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, threads and usable devices",
                   description="Print versions, Numba threads and usable devices.")
    demo = sub.add_parser(
        "demo", help="train a tiny next-token model with and without positions",
        description="Train a tiny next-token model, built only from numbapos parts, on a "
                    "synthetic corpus where the next token depends on the position; compare "
                    "it with the same model without positions.")
    demo.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                      help="where to train (default: cpu)")
    demo.add_argument("--steps", type=_int_at_least(1, "a positive integer"), default=300,
                      help="SGD steps per model (default: 300)")
    demo.add_argument("--seed", type=_int_at_least(0, "an integer >= 0"), default=0,
                      help="seed of data and weights")
    demo.add_argument("--positions", choices=POSITIONS, default="learned",
                      help="position encoding of the model (default: learned)")
    demo.add_argument("--layer-norm", action=argparse.BooleanOptionalAction, default=True,
                      help="LayerNorm before the tied output head (default: on)")
    demo.add_argument("--plot", metavar="PATH", default=None,
                      help="write a PNG of position similarities and loss curves "
                           "(needs matplotlib)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    from numbapos import _device
    from numbapos.demo import run

    if args.device == "cuda" and not _device.cuda_available():
        parser.error(f"--device cuda: {_device._cuda_problem()}; install numbapos[cuda] on a "
                     "machine with an NVIDIA GPU, or set NUMBA_ENABLE_CUDASIM=1 (slow)")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error('--plot needs matplotlib: pip install "numbapos[plot]"')
    return run(args.steps, args.seed, args.device, args.positions, args.layer_norm, args.plot,
               show_progress=not args.no_progress)


if __name__ == "__main__":
    sys.exit(main())
