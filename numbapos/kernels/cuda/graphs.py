"""Captured training steps: one call of a step recorded as a CUDA graph, then replayed.

:func:`capture` follows PyTorch's recipe (``torch.cuda.graphs``): warm up on a
side stream, capture one call on that stream, replay with static inputs. The
pieces that make a replay correct live beside the code they concern:

- every launch, allocation and copy goes to the capturing stream
  (:mod:`.streams`, :mod:`.launch`);
- the allocator serves the capture from the blocks its warm-up left cached
  (from the driver, with the capture mode relaxed, where those run short) and
  never hands a block the graph uses to anyone else (:mod:`.memory`);
- the optimisers' step counts and learning rates, and the dropout counters,
  live on the device and are advanced by kernels of the step (:mod:`.clock`);
- a host round trip (a copy between host and device, a synchronisation)
  inside the step raises RuntimeError
  (:func:`.streams.refuse_in_capture`) instead of breaking the capture.

The graph is built with ``cuda.core``'s ``GraphBuilder`` (stream capture on the
side stream, ``thread_local`` mode, so a forbidden driver call from this thread
fails instead of being recorded). Numba's simulator has no graphs: there the
captured call runs eagerly (with the same checks) while its launches and
device copies are recorded with their arguments, and :meth:`CapturedStep.replay`
runs that record again, as a graph would: the step's Python code does not run,
so a value baked into a kernel argument shows up there as a wrong result.
"""

from __future__ import annotations

import contextlib

from numba import cuda

from . import errors, streams
from .launch import launch

__all__ = []  # not launchers: numbapos.cuda's capture API


class CapturedStep:
    """A step captured by :func:`numbapos.cuda.capture`; :meth:`replay` runs it again.

    Attributes
    ----------
    outputs
        What the captured call of the step returned. Arrays in it are static:
        each replay writes its results into the same arrays (as PyTorch's
        static outputs), so read them after a replay, before the next.
    """

    def __init__(self, step, outputs, graph, capture):
        self._step = step
        self.outputs = outputs
        self._graph = graph
        self._capture = capture  # keeps the graph's blocks out of the allocator

    def replay(self) -> None:
        """Run the captured step once more, on numbapos's current stream.

        First raises an index error a previous step recorded (as any numbapos
        call does) and copies each optimiser's current learning rate
        (``group["lr"]``, which a scheduler may have changed) and each dropout
        counter set on the host since to the device; then advances the host's
        count of every dropout counter the step draws from (as the replay
        advances the device's), so ``counter`` and ``state_dict()`` stay exact
        without reading the device.
        Asynchronous, as an op: results are ready for the next op on the same
        stream, and for the host after ``numbapos.synchronize()``.
        """
        self._replay(True)

    def _replay(self, count_draws: bool) -> None:
        """:meth:`replay`; without ``count_draws`` for the captured call itself on a GPU,
        whose draws the host counted while capturing (the graph had not run them yet)."""
        errors.raise_pending()
        for clock in {id(c): c for c in self._capture.clocks}.values():
            clock.refresh()
        for counter in {id(c): c for c in self._capture.counters}.values():
            counter.refresh()
        if self._graph is None:
            _replay_recorded(self._capture.recorded)
        else:
            self._graph.launch(_core_stream(streams.current()))
        if count_draws:
            for counter in self._capture.counters:
                counter.replayed()


def _replay_recorded(recorded) -> None:
    """The simulator's graph: the captured call's launches and copies, arguments and all."""
    stream = streams.current()
    for work in recorded:
        if work[0] == "copy":
            work[1].copy_to_device(work[2], stream=stream)
        else:
            kernel, blocks, threads, args = work
            launch(kernel, blocks, threads, *args)


def _core_stream(stream):
    from numba.cuda.cudadrv import driver

    return driver._to_core_stream(stream)


def _side_stream():
    """A new stream to warm up and capture on: non-blocking, from ``cuda.core`` on a GPU."""
    if streams.SIMULATED:
        return cuda.stream()
    from cuda.core import Device

    device = Device(cuda.get_current_device().id)
    device.set_current()
    return device.create_stream()


def capture(step, *, warmup: int = 1) -> CapturedStep:
    """Capture one call of ``step`` (see :func:`numbapos.cuda.capture`)."""
    if not callable(step):
        raise TypeError(f"step: expected a callable (the training step), got "
                        f"{type(step).__name__}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 1:
        raise ValueError(f"warmup: expected an int >= 1 (eager calls before the capture, so "
                         f"that every kernel is compiled and every block cached), got "
                         f"{warmup!r}")
    if streams.capturing() is not None:
        raise RuntimeError("numbapos.cuda.capture: a step is already being captured in this "
                           "thread; captures do not nest")
    # The side stream does not wait for the legacy default stream: the caller's queued
    # work (filling the inputs) must be done first, and the warm-up's before the capture.
    cuda.synchronize()
    errors.raise_pending()
    home = _side_stream()
    with streams.using(home):
        for _ in range(warmup):
            step()
    cuda.synchronize()
    errors.raise_pending()
    if streams.SIMULATED:
        state = streams.Capture(home, home)
        with streams.capture_state(state):
            outputs = step()
        return CapturedStep(step, outputs, None, state)
    builder = home.create_graph_builder()
    builder.begin_building("thread_local")
    state = streams.Capture(builder.stream, home)
    try:
        # No cuMemFree of arrays Numba frees meanwhile: it cannot be captured.
        with cuda.defer_cleanup(), streams.capture_state(state):
            outputs = step()
    except BaseException:
        with contextlib.suppress(Exception):  # the step's own error is the one to see
            builder.end_building()
        raise
    builder.end_building()
    graph = builder.complete()
    captured = CapturedStep(step, outputs, graph, state)
    captured._replay(False)  # the captured call's own step, so it counts as on the simulator
    return captured
