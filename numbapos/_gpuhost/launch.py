"""The one way the CUDA backend launches a kernel: on numbapos's current stream.

Every launcher calls ``launch(kernel, blocks, threads, *args)`` instead of
``kernel[blocks, threads](*args)``, so the stream a :func:`numbapos.cuda.stream`
context chose (:mod:`.streams`) reaches every kernel, a captured step
(:mod:`.graphs`) records every kernel, and the host cost of a launch is paid
in one place (:mod:`.fastlaunch` on a real GPU).
"""

from __future__ import annotations

from .. import config as settings
from . import fastlaunch, plans, streams

__all__ = []  # not launchers


_launches = plans.LAUNCHES  # launches made so far (benchmarks report launches per op)


def launches() -> int:
    """How many kernels numbapos has launched in this process."""
    return _launches[0]


def launch(kernel, blocks, threads, *args) -> None:
    """Launch ``kernel`` (a ``@cuda.jit`` dispatcher) on ``blocks`` x ``threads`` with ``args``,
    on the current stream."""
    _launches[0] += 1
    stream = streams.current()
    if streams.SIMULATED:
        streams.record(kernel, blocks, threads, args)
    else:
        plans.note_launch(kernel, blocks, threads, stream, args)
    if (fastlaunch.ENABLED and settings.get("cuda_fast_launch")
            and fastlaunch.launch(kernel, blocks, threads, stream, args)):
        return
    kernel[blocks, threads, stream](*args)
