"""The stream numbapos queues its GPU work on, per thread, and the captured step's state.

Every launch (:mod:`.launch`), allocation (:mod:`.memory`) and copy of the
CUDA backend (:mod:`.arrays`) goes to :func:`current`: Numba's legacy default
stream (``0``) unless a :func:`numbapos.cuda.stream` context chose another.
The choice is per thread, as PyTorch's current stream is; contexts nest and
restore what was current before them.

:func:`as_numba_stream` turns what a user passes into an object Numba
launches on: a Numba stream, a ``cuda.core`` ``Stream`` (both as they are),
or any object exposing a stream handle (``__cuda_stream__``, CuPy's ``.ptr``,
PyTorch's ``.cuda_stream``) wrapped with ``cuda.external_stream``. Numba's
simulator cannot wrap external streams; there such an object gets a simulated
stream of its own (the simulator runs everything in order anyway).
"""

from __future__ import annotations

import contextlib
import functools
import threading

from numba import config as numba_config
from numba import cuda

__all__ = []  # not launchers

SIMULATED = bool(numba_config.ENABLE_CUDASIM)

class _Local(threading.local):
    # Class defaults: a thread that never set them reads these without the slow miss
    # (an AttributeError raised and caught inside getattr: about 0.4 us).
    stream = 0
    capture = None


_local = _Local()


def current():
    """The stream numbapos launches on in this thread: a stream object, or 0 (legacy default)."""
    return _local.stream


def handle(stream) -> int:
    """An integer that identifies ``stream`` (its driver handle; ``id`` on the simulator)."""
    if not stream:
        return 0
    if SIMULATED:
        return id(stream)
    return int(stream.__cuda_stream__()[1])


_array_streams: dict = {}  # raw handle -> Numba stream wrapping it, for device arrays


def for_arrays(stream):
    """``stream`` as Numba's device arrays take it (their ``stream=``).

    An array keeps that stream and reports ``int(stream)`` in its
    ``__cuda_array_interface__``, which a ``cuda.core`` stream (the captured
    step's, or one a user made current) does not support in numba-cuda 0.30:
    such a stream is passed as a Numba stream wrapping the same handle.
    """
    if not stream or SIMULATED or not _is_core_stream(stream):
        return stream
    raw = handle(stream)
    found = _array_streams.get(raw)
    if found is None:
        if len(_array_streams) > 64:  # streams made and dropped by the hundred: start over
            _array_streams.clear()
        found = _array_streams[raw] = cuda.external_stream(raw)
    return found


def _is_core_stream(stream) -> bool:
    from numba.cuda.cudadrv import driver

    return not isinstance(stream, driver.Stream)


def wait(stream) -> None:
    """Block the host until ``stream``'s queued work is done (a Numba or ``cuda.core`` stream)."""
    sync = getattr(stream, "synchronize", None) or stream.sync
    sync()


@contextlib.contextmanager
def using(stream):
    """Make ``stream`` (already converted by :func:`as_numba_stream`) current in this thread."""
    before = current()
    _local.stream = stream
    try:
        yield stream
    finally:
        _local.stream = before


def _handle_of(obj, name: str) -> int | None:
    """The raw stream handle an external object exposes, or None if it exposes none."""
    if hasattr(obj, "__cuda_stream__"):
        got = obj.__cuda_stream__()
        if (not isinstance(got, tuple) or len(got) != 2 or isinstance(got[1], bool)
                or not _is_int(got[1])):
            raise TypeError(f"{name}: __cuda_stream__() must return (version, handle) with an "
                            f"integer handle, got {got!r:.200}")
        return int(got[1])
    for attribute in ("cuda_stream", "ptr"):  # PyTorch, CuPy
        value = getattr(obj, attribute, None)
        if value is not None and _is_int(value) and not isinstance(value, bool):
            return int(value)
    return None


def _is_int(value) -> bool:
    try:
        return int(value) == value
    except (TypeError, ValueError):
        return False


def _native_kinds() -> tuple:
    """Stream classes Numba launches on as they are."""
    if SIMULATED:
        return (cuda.stream,)
    from numba.cuda.cudadrv import driver

    kinds = [driver.Stream]
    core = getattr(driver, "ExperimentalStream", None)
    if core is not None:
        kinds.append(core)
    return tuple(kinds)


_externals: dict = {}  # raw handle -> Numba stream


def as_numba_stream(obj, name: str = "stream"):
    """``obj`` as a stream Numba launches on (see the module); TypeError naming ``name``
    for anything else.

    ``None`` means Numba's legacy default stream (``0``).
    """
    if obj is None:
        return 0
    if isinstance(obj, _native_kinds()):
        return obj
    raw = _handle_of(obj, name)
    if raw is None:
        raise TypeError(
            f"{name}: expected a CUDA stream (a numba.cuda stream, a cuda.core Stream, or an "
            "object with __cuda_stream__, a CuPy stream's .ptr or a PyTorch stream's "
            f".cuda_stream), got {type(obj).__name__} {repr(obj)[:200]}")
    if raw == 0 and not SIMULATED:
        return 0
    # One wrapper per handle (a handle names one stream; fastlaunch caches per wrapper).
    # The simulator cannot wrap external streams: a simulated stream stands in.
    found = _externals.get(raw)
    if found is None:
        found = _externals[raw] = cuda.stream() if SIMULATED else cuda.external_stream(raw)
    return found


# ---------------------------------------------------------------- captured steps


class Capture:
    """What the CUDA backend needs to know while a step is captured (see :mod:`.graphs`).

    ``stream`` is the stream capturing (current while capturing); ``home`` the
    stream the step was warmed up on, whose cached blocks the capture takes.
    Every block handed out while capturing belongs to the capture from then
    on: freed, it goes to the capture's own pool (``free``, reused only by
    later allocations of the same capture, which the graph orders after its
    earlier users) and never back to the allocator, since every replay writes
    it again. ``kept`` holds the memory allocated while capturing through a
    memory manager other than numbapos's pool (:func:`.memory.prepare_capture`):
    never given back while the capture lives, for the same reason. ``clocks``
    lists the optimiser clocks the step ticked, ``counters`` the dropout
    counters it drew from (once per draw).
    """

    def __init__(self, stream, home):
        self.stream = stream
        self.home = home
        self.free: dict = {}
        self.kept: list = []
        self.clocks: list = []
        self.counters: list = []
        # On the simulator, which has no graphs, the capture records the device work
        # itself (launches with their arguments, device-to-device copies) to replay it.
        self.recorded: list | None = [] if SIMULATED else None

    def take(self, bucket: int):
        """A block of ``bucket`` bytes this capture freed, or None."""
        blocks = self.free.get(bucket)
        return blocks.pop() if blocks else None

    def give(self, bucket: int, block) -> None:
        """Keep ``block`` (this capture's) for its own later allocations."""
        self.free.setdefault(bucket, []).append(block)


def capturing() -> Capture | None:
    """The capture in progress in this thread, or None."""
    return _local.capture


@contextlib.contextmanager
def capture_state(state: Capture):
    """Mark ``state`` as the capture in progress in this thread (its stream current)."""
    if capturing() is not None:
        raise RuntimeError("numbapos.cuda.capture: a step is already being captured in this "
                           "thread; captures do not nest")
    _local.capture = state
    try:
        with using(state.stream):
            yield state
    finally:
        _local.capture = None


@functools.cache
def bindings():
    """cuda-bindings' driver module (the one numba-cuda itself calls), imported once."""
    from cuda.bindings import driver

    return driver


@contextlib.contextmanager
def relaxed_capture_mode():
    """This thread's stream capture mode relaxed for the duration (CUDA's
    ``cuThreadExchangeStreamCaptureMode``), so that a driver call a
    ``thread_local`` capture refuses, such as ``cuMemAlloc``, may run; the
    mode is restored afterwards. Does nothing on the simulator."""
    if SIMULATED:
        yield
        return
    driver = bindings()
    relaxed = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
    err, before = driver.cuThreadExchangeStreamCaptureMode(relaxed)
    _check(err, "cuThreadExchangeStreamCaptureMode")
    try:
        yield
    finally:
        err, _ = driver.cuThreadExchangeStreamCaptureMode(before)
        _check(err, "cuThreadExchangeStreamCaptureMode")


def _check(err, call: str) -> None:
    if err != bindings().CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{call} failed: {err!r}")


def record(*work) -> None:
    """Note one piece of device work (``(kernel, blocks, threads, args)`` or
    ``("copy", destination, source)``) for the simulator's replay of a capture."""
    capture = capturing()
    if capture is not None and capture.recorded is not None:
        capture.recorded.append(work)


def refuse_in_capture(what: str) -> None:
    """RuntimeError when ``what`` (a host round trip) is asked for while a step is captured."""
    if capturing() is not None:
        raise RuntimeError(
            f"numbapos.cuda.capture: {what} cannot be part of a captured step (a CUDA graph "
            "replays device work only: no host synchronisation or copy between host and "
            "device may happen while capturing); keep such data on the device "
            "(e.g. SparseRows from a lookup's backward, not host row lists) or do it outside "
            "the captured step")


DROPOUT = ("training-mode dropout with an integer counter (a host value baked into the "
           "kernel: every replay would draw the same mask); use numbapos.nn.Dropout (or a "
           "block's dropout), whose counter lives on the device, or pass a device counter")
ROUNDING = ("stochastic rounding with an integer rounding_step (a host value baked into the "
            "kernel: every replay would round with the same bits); the optimisers pass a "
            "device counter on CUDA, as must a direct call of the functional op")
