"""Device clocks: an optimiser's step count and learning rate, a dropout counter.

Optimiser clocks
----------------

A captured step (:mod:`.graphs`) replays kernels with the scalar arguments
they were captured with, so whatever changes from step to step must be read
from device memory and advanced there. A :class:`Clock` holds ``[lr, step]``
(float64) on the device; each optimiser step launches one tick kernel that
advances ``step`` (for the optimisers that count steps) and writes the
step's scalars (Adam's step size and bias correction, Adagrad's decayed rate,
the learning rate), cast to the parameter's dtype, to a small device array
that the update kernels read in place of the host's values
(:class:`LiveHyper`). The values are computed by the same float64 code as the
CPU's (:mod:`numbapos.kernels.stepvalues`): bit-identical results.

The learning rate is written to the device by :meth:`Clock.set_lr` only when
it changes (one small stream-ordered copy), outside any capture: a replay
first copies the current ``group["lr"]`` of every clock its step ticked, so a
scheduler that sets it between replays is obeyed. The tick does nothing
while an index error is pending, like every kernel that modifies state.

Counters: dropout, stochastic rounding
--------------------------------------
A :class:`DeviceCounter` holds a counter that keys a hash in device memory:
that of one dropout stream (:class:`numbapos.nn.Dropout`, the blocks'
dropout), or a 16-bit table's rounding step (:mod:`numbapos.optim`). Each
draw launches a one-thread kernel that copies the counter into a fresh
``(1,)`` array (this forward's counter: its kernels and its backward's read
it; an op that draws itself, the BERT block, puts it in its block of outputs
and plans the draw with its own launch) and advances the counter, so every
replay of a captured step draws the masks the next eager steps would. The
host keeps the authoritative count (``host``, the module's ``counter``
buffer): it advances it itself, eagerly and at each replay
(:meth:`DeviceCounter.replayed`), and never reads the device; a value set on
the host (the ``counter`` setter, ``load_state_dict``) is copied to the
device at the next draw or replay. The draw advances
whatever an index error: the counter counts forwards, as on the host.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import cuda

from ..._args import ClockKind
from ..._gpuhost import streams
from ..._gpuhost.launch import launch
from .. import stepvalues
from . import arrays, errors

__all__ = []  # not launchers: the CUDA optimiser ops use them

# What a tick computes (SGD's: the learning rate alone); functional.optim names them.
SGD, ADAM, ADAGRAD = ClockKind.SGD, ClockKind.ADAM, ClockKind.ADAGRAD
_SGD, _ADAM = int(ClockKind.SGD), int(ClockKind.ADAM)  # the kernel's (see numbapos._args)
LR, STEP = 0, 1  # the entries of a clock's values


class LiveHyper(NamedTuple):
    """A hyper-parameter tuple whose step-dependent fields the kernels read from ``dyn``."""

    hyper: object
    dyn: object


class Clock:
    """``[lr, step]`` of one parameter on the device (see the module).

    ``source`` returns the learning rate the host wants now (the optimiser's
    ``group["lr"]``); a replay of a captured step re-reads it.
    """

    def __init__(self, lr: float, step: int = 0, source=None):
        self.values = arrays.asarray(np.array([lr, step], np.float64))
        self.lr = float(lr)
        self.source = source
        self._dyn: dict = {}

    def set_lr(self, lr: float) -> None:
        """Make the device's learning rate ``lr`` (a stream-ordered copy when it changed)."""
        lr = float(lr)
        if lr == self.lr:
            return
        streams.refuse_in_capture(f"changing the learning rate ({self.lr} -> {lr}); set it "
                                  "between replays")
        self.values[LR:LR + 1].copy_to_device(np.array([lr]), stream=streams.current())
        self.lr = lr

    def refresh(self) -> None:
        """Copy the host's current learning rate (``source()``) to the device if it changed."""
        if self.source is not None:
            self.set_lr(self.source())

    def step(self) -> int:
        """The step count on the device (a copy to the host: synchronises)."""
        return int(arrays.to_host(self.values)[STEP])

    def dyn(self, dtype, size: int = 3):
        """The device array the step's scalars are written to, in ``dtype`` (made once)."""
        key = np.dtype(dtype)
        found = self._dyn.get(key)
        if found is None:
            found = self._dyn[key] = arrays.zeros((size,), key)
        return found


def split(hyper, dtype):
    """``(hyper, dyn)`` for a kernel: ``dyn`` empty for a plain hyper tuple (host values)."""
    if isinstance(hyper, LiveHyper):
        return hyper.hyper, hyper.dyn
    return hyper, arrays.absent(dtype)


def tick(clock: Clock, hyper, dtype, kind: ClockKind, beta1=0.0, beta2=0.0, weight_decay=0.0,
         sparse=False, lr_decay=0.0) -> LiveHyper:
    """Advance ``clock`` by one step on the device and return ``hyper`` reading its values.

    ``kind`` (a :class:`~numbapos._args.ClockKind`) is SGD (the learning rate only, no
    step), ADAM or ADAGRAD; the options are the float64 values the host's
    hyper-parameters were made from.
    """
    capture = streams.capturing()
    if capture is not None:
        capture.clocks.append(clock)  # a replay refreshes its learning rate first
    dyn = clock.dyn(dtype)
    launch(_tick, 1, 1, clock.values, errors.device_word(), np.int64(kind), np.float64(beta1),
           np.float64(beta2), np.float64(weight_decay), bool(sparse), np.float64(lr_decay), dyn)
    return LiveHyper(hyper, dyn)


@cuda.jit
def _tick(values, word, kind, beta1, beta2, weight_decay, sparse, lr_decay, dyn):
    """One thread: ``values[STEP] += 1`` (but for SGD), then the step's scalars into ``dyn``."""
    if cuda.grid(1) != 0 or errors.is_pending(word):
        return
    lr = values[LR]
    if kind == _SGD:
        dyn[0] = lr
        return
    step = values[STEP] + 1.0
    values[STEP] = step
    if kind == _ADAM:
        decay, neg_step_size, root = stepvalues.adam_scalars(lr, beta1, beta2, weight_decay,
                                                             step, sparse)
        dyn[0] = decay
        dyn[1] = neg_step_size
        dyn[2] = root
    else:
        dyn[0] = stepvalues.adagrad_neg_clr(lr, lr_decay, step)


# ---------------------------------------------------------------- counters


class DeviceCounter:
    """The next value of one counter (a dropout stream's, a rounding step), on the device
    (see the module).

    ``source`` returns the counter the host holds (the module's buffer) and
    ``sink`` stores a new one there; :attr:`host` is what the device will
    hold once the queued work is done.
    """

    def __init__(self, source, sink, what: str = "dropout counter"):
        streams.refuse_in_capture(f"making a {what} on the device (its first use on CUDA: "
                                  "let the warm-up run it)")
        self.source = source
        self.sink = sink
        self.what = what
        self.host = int(source())
        self.values = arrays.asarray(np.array([self.host], np.uint64))

    def refresh(self) -> None:
        """Copy the host's counter to the device if it was set there (a stream-ordered copy)."""
        value = int(self.source())
        if value != self.host:
            streams.refuse_in_capture(f"setting a {self.what} ({self.host} -> {value}); set "
                                      "it between replays")
            self.values.copy_to_device(np.array([value], np.uint64), stream=streams.current())
            self.host = value

    def draw(self):
        """The counter of this draw, in a new ``(1,)`` device array, the device's counter
        advanced by one (one launch); the caller advances the host's (:meth:`advanced`)."""
        drawn = self.prepared().draw_into(arrays.empty((1,), np.uint64))
        self.host += 1
        return drawn

    def prepared(self):
        """Itself, ready for a draw by an op (:meth:`draw_into`): the host's value copied if
        it was set there, the draw noted by a capture. The op's caller then advances
        :attr:`host` once the op ran."""
        if int(self.source()) != self.host:  # refresh()'s check, without its call
            self.refresh()
        capture = streams._local.capture  # streams.capturing(), read directly
        if capture is not None:
            capture.counters.append(self)  # each replay advances the host's count too
        return self

    def draw_into(self, drawn):
        """Launch the draw into ``drawn`` (a ``(1,)`` uint64 device array, in an op's block of
        outputs); returns ``drawn``."""
        launch(_draw, 1, 1, self.values, drawn)
        return drawn

    def replayed(self) -> None:
        """A replay drew once more from this counter: advance the host's count."""
        self.host += 1
        self.sink(self.host)


@cuda.jit
def _draw(values, drawn):
    """One thread: ``drawn[0] = values[0]``, then ``values[0] += 1``."""
    if cuda.grid(1) == 0:
        value = values[0]
        drawn[0] = value
        values[0] = value + np.uint64(1)
