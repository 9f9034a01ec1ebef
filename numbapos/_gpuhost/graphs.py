"""Captured training steps: one call of a step recorded as a CUDA graph, then replayed.

:func:`capture` follows PyTorch's recipe (``torch.cuda.graphs``): warm up on a
side stream, capture one call on that stream, replay with static inputs. The
pieces that make a replay correct live beside the code they concern:

- every launch, allocation and copy goes to the capturing stream
  (:mod:`.streams`, :mod:`.launch`);
- the allocator serves the capture from the blocks its warm-up left cached
  (from the driver, with the capture mode relaxed, where those run short) and
  never hands a block the graph uses to anyone else (:mod:`.memory`); under
  any other memory manager each allocation while capturing is the manager's,
  made with the capture mode relaxed and kept by the capture
  (:func:`.memory.prepare_capture`);
- the optimisers' step counts and learning rates, and the dropout counters,
  live on the device and are advanced by kernels of the step (:mod:`.clock`);
- a host round trip (a copy between host and device, a synchronisation)
  inside the step raises RuntimeError
  (:func:`.streams.refuse_in_capture`) instead of breaking the capture.

The graph is built with ``cuda.core``'s ``GraphBuilder`` (stream capture on the
side stream, ``thread_local`` mode, so a forbidden driver call from this thread
fails instead of being recorded). A capture that fails, by the step's own
error or by such a call, is ended before the error propagates, so the stream
stops capturing at once (:func:`_end_failed`). Numba's simulator has no
graphs: there the captured call runs eagerly (with the same checks) while its
launches and device copies are recorded with their arguments, and
:meth:`CapturedStep.replay` runs that record again, as a graph would: the
step's Python code does not run, so a value baked into a kernel argument shows
up there as a wrong result.
"""

from __future__ import annotations

import contextlib

from numba import cuda

from . import errors, memory, streams
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
    memory.prepare_capture()
    builder = home.create_graph_builder()
    state = streams.Capture(builder.stream, home)
    # No cuMemFree of arrays Numba (or the memory manager) frees meanwhile: it cannot be
    # captured. A failed capture is ended inside, before that cleanup may run.
    with cuda.defer_cleanup():
        builder.begin_building("thread_local")
        ending = False
        try:
            with streams.capture_state(state):
                outputs = step()
            ending = True
            builder.end_building()
        except BaseException as err:
            _end_failed(builder)
            builder = state = None  # the failed capture's, out of the traceback's frame
            refused = _refused_call(err, ending)
            if refused is None:
                raise  # the step's own error
            raise RuntimeError(refused) from err
    graph = builder.complete()
    captured = CapturedStep(step, outputs, graph, state)
    captured._replay(False)  # the captured call's own step, so it counts as on the simulator
    return captured


def _end_failed(builder) -> None:
    """End ``builder``'s capture after an error, so that its stream no longer captures.

    ``end_building`` ends a capture that is still valid. An invalidated one (a call
    the capture refused) it refuses to end (cuda.core 1.2 raises), which would leave
    the stream capturing, and this thread unable to synchronise or allocate, until
    the builder is collected: that one is ended at the driver.
    """
    with contextlib.suppress(Exception):
        builder.end_building()
    driver = streams.bindings()
    stream = streams.handle(builder.stream)
    none = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE
    if driver.cuStreamIsCapturing(stream)[1] != none:
        driver.cuStreamEndCapture(stream)  # CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: expected
    err, status = driver.cuStreamIsCapturing(stream)
    if status != none:
        raise RuntimeError(f"numbapos.cuda.capture: the failed capture could not be ended "
                           f"(its stream's capture status: {status!r}, {err!r})")
    with contextlib.suppress(Exception):
        builder.close()  # its graph, never completed


# CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900) ... CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD (908)
_CAPTURE_ERRORS = range(900, 909)


def _refused_call(err: BaseException, ending: bool) -> str | None:
    """The message for ``err`` where it says that the capture refused a CUDA call of the
    step (raised by the step, or found by ``end_building`` where ``ending``: the step
    did not raise it), else None (the step's own error)."""
    from numba.cuda.cudadrv.driver import CudaAPIError

    if (isinstance(err, CudaAPIError) and int(err.code) in _CAPTURE_ERRORS) or (
            "CUDA_ERROR_STREAM_CAPTURE" in str(err)):  # cuda.core's CUDAError
        what = f"the step made a CUDA call that a captured step cannot contain ({err})"
    elif ending and "invalidated" in str(err):
        what = (f"a CUDA call of the step that a captured step cannot contain invalidated "
                f"the capture, and the step did not raise its error ({err})")
    else:
        return None
    return (f"numbapos.cuda.capture: {what}; the capture was ended and nothing was recorded. "
            f"A CUDA graph replays device work only: do host synchronisations, copies "
            f"between host and device and CUDA calls made outside numbapos "
            f"(numba.cuda.synchronize, numba.cuda.to_device, ...) before or after the "
            f"captured step")
