"""What a captured GPU step needs from the layers above: state that advances on the device.

:func:`numbapos.cuda.capture` records a training step as a CUDA graph, whose
replays run its kernels again with the scalar arguments they were captured
with. Whatever changes from one step to the next must therefore live in
device memory and be advanced there: a dropout stream's counter and a 16-bit
table's rounding step (:func:`device_counter`), an optimiser's step count
and learning rate (:func:`device_clock`). And whatever needs the host in the
middle of a step (a copy to the host, a value read back) must refuse to run
while a step is being captured (:func:`refuse_in_capture`).

These helpers are what :mod:`numbapos.nn` and :mod:`numbapos.optim` use
instead of reaching the CUDA backend themselves; they make CUDA objects (the
first call imports and starts the CUDA backend, and, like every op, raises
an index error that an earlier GPU call deferred). The objects themselves
are described in ``numbapos/kernels/cuda/clock.py``.
"""

from __future__ import annotations

from .. import _device

__all__ = ["device_clock", "device_counter", "refuse_in_capture"]


def device_counter(source, sink, what: str = "dropout counter"):
    """A counter kept in GPU memory that each draw hands to the kernels and advances.

    The host keeps the authoritative count: ``source()`` returns it and
    ``sink(value)`` stores a new one (after a replay of a captured step drew
    once more). Each :meth:`draw` copies the device's counter into a fresh
    ``(1,)`` uint64 CUDA array (what the functional ops take as ``counter=``
    or ``rounding_step=``) and advances the device's counter by one, in one
    one-thread launch, so the replays of a captured step draw what the next
    eager steps would. A value set on the host is copied to the device at the
    next draw or replay.

    Parameters
    ----------
    source : callable
        ``source() -> int``: the counter the host holds now.
    sink : callable
        ``sink(int)``: store the host's counter (a replay advanced it).
    what : str, default "dropout counter"
        What the counter counts, for error messages ("rounding step" for a
        16-bit table's stochastic rounding).

    Returns
    -------
    DeviceCounter
        ``draw()`` (a ``(1,)`` uint64 CUDA array), ``refresh()``,
        ``replayed()``, ``host`` (the count once the queued work is done),
        ``values`` (the device's counter).

    Raises
    ------
    RuntimeError
        CUDA cannot be used, or a step is being captured (make the counter
        during the warm-up: its first use on CUDA).
    IndexError
        An index error deferred by an earlier GPU call.
    """
    return _device.kernels_for("cuda").clock.DeviceCounter(source, sink, what)


def device_clock(lr: float, step: int = 0, source=None):
    """An optimiser's clock on the GPU: ``[lr, step]`` of one parameter, in device memory.

    The CUDA optimiser ops take it as ``clock=``: each update advances its
    step count on the device (for the optimisers that count steps) and reads
    the step's scalars from there, so the replays of a captured step advance
    it too. The learning rate is copied to the device when it changes.

    Parameters
    ----------
    lr : float
        The learning rate to start with.
    step : int, default 0
        The step count to start from (the optimiser state's ``"step"``).
    source : callable, optional
        ``source() -> float``: the learning rate the host wants now (an
        optimiser's ``group["lr"]``); a replay re-reads it.

    Returns
    -------
    Clock
        ``set_lr(lr)``, ``refresh()``, ``step()`` (the device's count: a copy
        to the host, which synchronises), ``values``.

    Raises
    ------
    RuntimeError
        CUDA cannot be used.
    IndexError
        An index error deferred by an earlier GPU call.
    """
    return _device.kernels_for("cuda").clock.Clock(lr, step, source=source)


def refuse_in_capture(what: str) -> None:
    """Raise if a GPU step is being captured: ``what`` needs the host mid-step.

    Parameters
    ----------
    what : str
        What cannot be captured and what to do instead; the message reads
        ``"numbapos.cuda.capture: {what} cannot be part of a captured step
        ..."``.

    Raises
    ------
    RuntimeError
        A step is being captured on this thread (:func:`numbapos.cuda.capture`),
        or CUDA cannot be used.
    IndexError
        An index error deferred by an earlier GPU call.
    """
    _device.kernels_for("cuda")
    from .._gpuhost import streams

    streams.refuse_in_capture(what)
