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

from ..._args import DropoutArgs
from ..._gpuhost import streams
from ..._gpuhost.launch import launch
from ..hash import dropout_key, keeps
from . import arrays, errors
from .arrays import THREADS, grid

__all__ = ["dropout_apply", "dropout_keep_mask"]


def no_counter():
    """The empty uint64 device array a kernel's ``live`` gets when the host's value holds."""
    return arrays.absent(np.uint64)


def kernel_drop(drop, dtype=None):
    """``drop`` (a :class:`~numbapos._args.DropoutArgs`) as the kernels take it: ``scale``
    cast to ``dtype`` (as the CPU kernels cast it; kept when None) and ``live`` the
    device counter, or an empty array when the counter is the host's ``drop.counter``
    (refused while capturing when active)."""
    live = drop.live
    if live is None:
        if drop.active:
            streams.refuse_in_capture(streams.DROPOUT)
        live = no_counter()
    scale = drop.scale if dtype is None else dtype.type(drop.scale)
    return DropoutArgs(drop.seed, drop.counter, drop.threshold, scale, bool(drop.active), live)


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
    # The scale is cast on the host exactly as the CPU kernel casts it.
    drop = kernel_drop(drop, out.dtype)
    if x.size:
        launch(_dropout_apply, grid(x.size), THREADS, x, drop, out, errors.device_word())


def dropout_keep_mask(drop, out):
    """``out[i] = kept(i)`` over a flat bool ``out``."""
    drop = kernel_drop(drop)
    if out.size:
        launch(_dropout_keep_mask, grid(out.size), THREADS, drop, out)


@cuda.jit(device=True)
def drop_key(drop):
    """The dropout key of a kernel's :class:`~numbapos._args.DropoutArgs` (see
    :func:`counter_key`)."""
    return counter_key(drop.seed, drop.counter, drop.live)


@cuda.jit
def _dropout_apply(x, drop, out, err):
    """``out[i] = x[i] * (scale or 0)``; ``drop.scale`` is of ``out``'s dtype.

    Returns at once while an index error is pending."""
    if errors.is_pending(err):
        return
    key = drop_key(drop)
    zero = out.dtype.type(0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        out[i] = x[i] * (drop.scale if keeps(key, i, drop.threshold) else zero)


@cuda.jit
def _dropout_keep_mask(drop, out):
    key = drop_key(drop)
    for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[i] = keeps(key, i, drop.threshold)
