"""CUDA launchers and kernels for inverted dropout with a counter-based mask.

Twin of :mod:`numbapos.kernels.cpu.dropout`. The mask bit of element ``i`` is
:func:`numbapos.kernels.hash.keeps` of ``(key(seed, counter), i)``, the same
``register_jitable`` SplitMix64 code the CPU compiles, so both devices draw the
same mask bit for bit. Each element is one multiply (``x * scale`` or ``x * 0``
in the data's dtype), so the output is bit-identical to the CPU's as well. Nothing is read back to
the host.

The counter is a kernel argument, or (a :class:`~numbapos._args.DropoutArgs`
with ``live``) read by the kernel from a ``(1,)`` device array: a device
counter (:class:`.clock.DeviceCounter`), which a captured step's replays
advance. Active dropout with an integer counter cannot be captured (every
replay would draw the captured call's mask): it raises RuntimeError there.
"""

import numpy as np
from numba import cuda

from ..hash import dropout_key, keeps
from . import arrays, errors, streams
from .arrays import THREADS, grid
from .launch import launch

__all__ = ["dropout_apply", "dropout_keep_mask"]

_NO_COUNTER: list = []


def no_counter():
    """The empty uint64 device array a kernel's ``live`` gets when the host's value holds."""
    if not _NO_COUNTER:
        _NO_COUNTER.append(arrays.empty((0,), np.uint64))
    return _NO_COUNTER[0]


def counter_args(drop):
    """``(counter, live)`` of a kernel: ``live`` the device counter, or an empty array when
    the counter is the host's ``drop.counter`` (refused while capturing when active)."""
    if drop.live is not None:
        return drop.counter, drop.live
    if drop.active:
        streams.refuse_in_capture(streams.DROPOUT)
    return drop.counter, no_counter()


@cuda.jit(device=True)
def counter_key(seed, counter, live):
    """The dropout key of ``(seed, counter)``, or of ``(seed, live[0])`` when ``live`` (a
    device counter) is not empty."""
    if live.size:
        return dropout_key(seed, live[0])
    return dropout_key(seed, counter)


def dropout_apply(x, drop, out):
    """``out[i] = x[i] * (scale if kept(i) else 0)`` over flat ``x`` / ``out``.

    Forward and backward alike (the gradient of ``x * m`` is ``grad * m``).
    Dropped elements are multiplied by zero, so NaN and inf propagate as in
    PyTorch; ``out`` may be ``x`` itself. ``drop`` is a
    :class:`~numbapos._args.DropoutArgs`; an inactive one (threshold 0, scale
    1) copies ``x``, as on the CPU. The backward writes a gradient, so nothing
    is written while an index error is pending (:mod:`.errors`).
    """
    counter = counter_args(drop)
    if x.size:
        dtype = out.dtype.type
        # The scale is cast on the host exactly as the CPU kernel casts it.
        launch(_dropout_apply, grid(x.size), THREADS, x, drop.seed, *counter, drop.threshold,
               dtype(drop.scale), dtype(0), out, errors.device_word())


def dropout_keep_mask(drop, out):
    """``out[i] = kept(i)`` over a flat bool ``out``."""
    counter = counter_args(drop)
    if out.size:
        launch(_dropout_keep_mask, grid(out.size), THREADS, drop.seed, *counter,
               drop.threshold, out)


@cuda.jit
def _dropout_apply(x, seed, counter, live, threshold, scale, zero, out, err):
    """``out[i] = x[i] * (scale or zero)``; ``scale`` / ``zero`` are of ``out``'s dtype.

    Returns at once while an index error is pending."""
    if errors.is_pending(err):
        return
    key = counter_key(seed, counter, live)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        out[i] = x[i] * (scale if keeps(key, i, threshold) else zero)


@cuda.jit
def _dropout_keep_mask(seed, counter, live, threshold, out):
    key = counter_key(seed, counter, live)
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = keeps(key, i, threshold)
