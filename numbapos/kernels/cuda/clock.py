"""Optimiser clocks: a parameter's step count and learning rate in device memory.

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
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import cuda

from .. import stepvalues
from . import arrays, errors, streams
from .launch import launch

__all__ = []  # not launchers: the CUDA optimiser ops use them

SGD, ADAM, ADAGRAD = 0, 1, 2  # what a tick computes (SGD's: the learning rate alone)
LR, STEP = 0, 1


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


_NONE: dict = {}


def split(hyper, dtype):
    """``(hyper, dyn)`` for a kernel: ``dyn`` empty for a plain hyper tuple (host values)."""
    if isinstance(hyper, LiveHyper):
        return hyper.hyper, hyper.dyn
    key = np.dtype(dtype)
    found = _NONE.get(key)
    if found is None:
        found = _NONE[key] = arrays.empty((0,), key)
    return hyper, found


def tick(clock: Clock, hyper, dtype, kind: int, beta1=0.0, beta2=0.0, weight_decay=0.0,
         sparse=False, lr_decay=0.0) -> LiveHyper:
    """Advance ``clock`` by one step on the device and return ``hyper`` reading its values.

    ``kind`` is SGD (the learning rate only, no step), ADAM or ADAGRAD; the
    options are the float64 values the host's hyper-parameters were made from.
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
    if kind == SGD:
        dyn[0] = lr
        return
    step = values[STEP] + 1.0
    values[STEP] = step
    if kind == ADAM:
        decay, neg_step_size, root = stepvalues.adam_scalars(lr, beta1, beta2, weight_decay,
                                                             step, sparse)
        dyn[0] = decay
        dyn[1] = neg_step_size
        dyn[2] = root
    else:
        dyn[0] = stepvalues.adagrad_neg_clr(lr, lr_decay, step)
