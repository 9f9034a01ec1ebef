"""Command line: ``python -m numbapos info | demo | warmup | bench``."""

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
    try:
        numbapos.config.get("spin_count")  # parses every NUMBAPOS_* variable
    except ValueError as err:
        print(f"settings error: {err}", file=sys.stderr)
        return 1
    pool = numbapos._pool.pool_settings()
    print(f"threads  {pool['threads']} of {pool['pool_size']} (numba threading layer: "
          f"{pool['layer']}; idle threads: {pool['wait']})")
    prefetch = numbapos._device.kernels_for("cpu").prefetch
    print(f"prefetch {prefetch.PREFETCH_LINES} cache lines per table row, "
          f"{prefetch.HALF_PREFETCH_LINES} per 16-bit row widened, "
          f"{prefetch.OUTPUT_PREFETCH_LINES} per 16-bit or int8 output row "
          f"(CPU {prefetch.cpu_name()})")
    print("devices  cpu: available")
    print(f"         cuda: {_cuda_status()}")
    print("tables   (format: bytes a row; use; per-row error of a value read back)")
    for name, size, use, bound in numbapos.functional.quantized.TABLE_FORMATS:
        print(f"         {name}: {size} bytes; {use}; {bound}")
    print("settings (numbapos.config; environment variables, read once)")
    for name, variable, value, source, _ in numbapos.config.describe():
        shown = "by CPU" if value is None else value
        print(f"         {name} = {shown}  ({variable}, {source})")
    for variable in numbapos.config.unknown_variables():
        print(f"         warning: {variable} is set but numbapos has no such setting")
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


def _choices(allowed, what: str):
    """An argparse type: a comma-separated list of names from ``allowed``."""
    def parse(text: str) -> tuple:
        names = tuple(name.strip() for name in text.split(",") if name.strip())
        bad = [name for name in names if name not in allowed]
        if not names or bad:
            raise argparse.ArgumentTypeError(
                f"expected {what} from {', '.join(allowed)} (comma-separated), got {text!r}")
        return names

    return parse


def _add_warmup(sub) -> None:
    from numbapos import _warmup

    warm = sub.add_parser(
        "warmup", help="compile the CPU kernels into Numba's on-disk cache",
        description="Compile the CPU kernels (serial and parallel bodies) for float32 data "
                    "and int64 indices into Numba's on-disk cache, so later processes start "
                    "without compiling: for Docker images and CI caches. Op groups are shared "
                    "among worker processes, one per core. The cache is NUMBA_CACHE_DIR when "
                    "set, else the __pycache__ folders of the installed package.")
    warm.add_argument("--dtypes", type=_choices(_warmup.DTYPES, "data dtypes"),
                      default=_warmup.DEFAULT_DTYPES, help="default: float32; or float32,float64")
    warm.add_argument("--index-dtypes", type=_choices(_warmup.INDEX_DTYPES, "index dtypes"),
                      default=_warmup.DEFAULT_INDEX_DTYPES, help="default: int64; or int32,int64")
    opt_in = [case.name for case in _warmup.CASES if not case.default]
    warm.add_argument("--ops", type=_choices(_warmup.CASE_NAMES, "op groups"), default=None,
                      help=f"only these op groups (default: all but the opt-in "
                           f"{','.join(opt_in)}; the groups: {','.join(_warmup.CASE_NAMES)})")
    warm.add_argument("--all", action="store_true",
                      help="every op group (opt-in ones too) for float32,float64 x int32,int64 "
                           "(several times as long; not with --dtypes, --index-dtypes, --ops)")
    warm.add_argument("-j", "--processes", type=_int_at_least(1, "an integer >= 1"),
                      default=None, metavar="N",
                      help="worker processes (default: one per core, at most "
                           f"{_warmup.MAX_PROCESSES}); 1 compiles in this process")
    warm.add_argument("--quiet", action="store_true", help="print nothing unless it fails")


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
                    "it with the same model without positions. With --task recsys: train a "
                    "click model on an EmbeddingBagCollection and compare it with per-id "
                    "click rates.")
    demo.add_argument("--task", choices=("lm", "recsys"), default="lm",
                      help="lm: the next-token model (default); recsys: the click model")
    demo.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                      help="where to train (default: cpu)")
    # The lm task's own options default to None here, so that --task recsys can refuse them.
    demo.add_argument("--steps", type=_int_at_least(1, "a positive integer"), default=None,
                      help="SGD steps per model (default: 300)")
    demo.add_argument("--epochs", type=_int_at_least(1, "a positive integer"), default=None,
                      help="--task recsys: passes over the training impressions (default: 3)")
    demo.add_argument("--seed", type=_int_at_least(0, "an integer >= 0"), default=0,
                      help="seed of data and weights")
    demo.add_argument("--positions", choices=POSITIONS, default=None,
                      help="position encoding of the model (default: learned)")
    demo.add_argument("--layer-norm", action=argparse.BooleanOptionalAction, default=None,
                      help="LayerNorm before the tied output head (default: on)")
    demo.add_argument("--plot", metavar="PATH", default=None,
                      help="write a PNG of position similarities and loss curves "
                           "(--task recsys: loss and AUC curves; needs matplotlib)")
    demo.add_argument("--no-progress", action="store_true", help="no progress bars")
    _add_warmup(sub)
    bench = sub.add_parser(
        "bench", help="time numbapos next to NumPy and PyTorch, print a table",
        description="Time the headline cases of benchmarks/ (lookups, backward passes, the "
                    "sparse training step, LayerNorm, the BERT and GPT-2 blocks, rotary q and k) "
                    "next to NumPy and PyTorch (optional), and how the cost grows with D and "
                    "the batch; print median ms, GB/s and the ratios. Sides are warmed up, then "
                    "timed in interleaved rounds. On a GPU (--device cuda) also print each op's "
                    "host cost: microseconds, launches, allocations and Python calls per call.")
    bench.add_argument("--quick", action="store_true",
                       help="fewer rounds and scaling points (well under a minute)")
    bench.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                       help="where to time (default: cpu); cuda compares with PyTorch CUDA "
                            "and CuPy when installed")
    bench.add_argument("--plot", metavar="PATH", default=None,
                       help="write the scaling curves to a PNG (needs matplotlib)")
    bench.add_argument("--repeat", metavar="N", type=_int_at_least(3, "an integer >= 3"),
                       default=None, help="rounds per case (default: 30, or 5 with --quick)")
    bench.add_argument("--only", metavar="TEXT", default=None,
                       help="time only the cases whose names contain TEXT (e.g. lookup)")
    bench.add_argument("--size", choices=("full", "quick", "tiny"), default=None,
                       help=argparse.SUPPRESS)  # tiny: tests and the CUDA simulator
    return parser


def warmup(args) -> int:
    """Run :func:`numbapos.warmup`; 1 with the error on stderr when an op fails."""
    from numbapos import _warmup

    chosen = (args.ops is not None or args.dtypes != _warmup.DEFAULT_DTYPES
              or args.index_dtypes != _warmup.DEFAULT_INDEX_DTYPES)
    if args.all and chosen:
        print("warmup: --all compiles every group for every dtype; leave out --dtypes, "
              "--index-dtypes and --ops", file=sys.stderr)
        return 2
    try:
        if args.all:
            _warmup.warmup(_warmup.DTYPES, _warmup.INDEX_DTYPES, "all", verbose=not args.quiet,
                           processes=args.processes)
        else:
            _warmup.warmup(args.dtypes, args.index_dtypes, args.ops, verbose=not args.quiet,
                           processes=args.processes)
    except (RuntimeError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    if args.command == "warmup":
        return warmup(args)
    from numbapos import _device

    if args.device == "cuda" and not _device.cuda_available():
        parser.error(f"--device cuda: {_device._cuda_problem()}; install numbapos[cuda] on a "
                     "machine with an NVIDIA GPU, or set NUMBA_ENABLE_CUDASIM=1 (slow)")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            parser.error('--plot needs matplotlib: pip install "numbapos[plot]"')
    if args.command == "bench":
        from numbapos import bench

        return bench.run(args.quick, args.device, args.plot, args.repeat, args.size,
                         args.only)
    return _demo(parser, args)


_LM_OPTIONS = {"steps": 300, "positions": "learned", "layer_norm": True}


def _demo(parser, args) -> int:
    """Run the demo of ``args.task``, refusing the other task's options."""
    if args.task == "recsys":
        for name in _LM_OPTIONS:
            if getattr(args, name) is not None:
                parser.error(f"--{name.replace('_', '-')}: only with --task lm")
        from numbapos import demo_recsys

        epochs = demo_recsys.EPOCHS if args.epochs is None else args.epochs
        return demo_recsys.run(epochs, args.seed, args.device, args.plot,
                               show_progress=not args.no_progress)
    if args.epochs is not None:
        parser.error("--epochs: only with --task recsys")
    for name, default in _LM_OPTIONS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    from numbapos.demo import run

    return run(args.steps, args.seed, args.device, args.positions, args.layer_norm, args.plot,
               show_progress=not args.no_progress)


if __name__ == "__main__":
    sys.exit(main())
