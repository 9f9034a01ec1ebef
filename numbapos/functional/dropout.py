"""Inverted dropout with a reproducible, counter-based mask.

The mask of a call is a pure function of ``(seed, counter, element index)``
(see :mod:`numbapos.kernels.hash`): the same arguments give the same
mask for any thread count, any split of the work and, later, on the GPU. The
backward pass regenerates the mask instead of storing it.
"""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from .._args import DropoutArgs
from ._common import backend_for


def _check_out(x, out, others=()):
    """``out`` checked, or None: it may be ``x`` itself (each element reads and writes only
    itself), but no other array that overlaps ``x``, nor any of ``others``."""
    if out is None:
        return None
    same = out is x or (_device.is_cuda_array(out) and _device.adopt(out) is x)
    return _checks.check_out(out, x.shape, x.dtype, avoid=tuple(others) + (() if same else (x,)))


def _apply(x, name, p, seed, counter, training, out):
    """Mask and scale ``x`` (checked as ``name``), or pass it through when dropout is off."""
    x = _checks.check_float_array(x, name)
    p, seed, counter = _checks.check_dropout_args(p, seed, counter)
    K = backend_for((x, out), ("x", "out"))
    _checks.check_counter_device(counter, K.DEVICE)
    out = _check_out(x, out)
    if not training or p == 0.0:
        if out is None or out is x:
            return x
        K.dropout_apply(K.contiguous(x).reshape(x.size), DropoutArgs.make(0.0, 0, 0),
                        out.reshape(x.size))
        return out
    if out is None:
        out = K.empty(x.shape, x.dtype)
    if x.size:
        K.dropout_apply(K.contiguous(x).reshape(x.size), DropoutArgs.make(p, seed, counter),
                        out.reshape(x.size))
    return out


def dropout(x, p, seed, training=True, counter=0, out=None):
    """Inverted dropout: zero each element with probability ``p``, scale the rest by 1/(1-p).

    Element ``i`` (its flat C-order index in ``x``) is kept iff
    ``dropout_bits(seed, counter, i) >= keep_threshold(p)``, a hash of the three
    integers, so a given ``(seed, counter)`` always draws the same mask, on any
    number of threads. Use a new ``counter`` for every call that needs a fresh
    mask (:class:`numbapos.nn.Dropout` does this for you).

    Parameters
    ----------
    x : ndarray, float32 or float64
        Input of any shape; may be non-contiguous.
    p : float
        Probability of dropping an element, in ``[0, 1]``. ``p = 1`` gives zeros.
    seed : int
        Non-negative integer below ``2**64``.
    training : bool, default True
        False makes this the identity.
    counter : int or CUDA array, default 0
        Non-negative integer below ``2**64`` that selects the mask for this call.
        With CUDA data it may also be a device counter, a CUDA array of one
        uint64 holding that integer: the kernel reads it from device memory
        when it runs (nothing is copied to the host), so a step captured with
        :func:`numbapos.cuda.capture` draws the mask of the value the array
        holds at each replay. An integer counter is baked into the captured
        kernel, so active dropout with one cannot be captured (RuntimeError);
        :class:`numbapos.nn.Dropout` keeps its counter on the device and
        advances it there.
    out : ndarray, optional
        C-contiguous buffer of ``x``'s shape and dtype for the result. It may be
        ``x`` itself (in-place dropout) but must not otherwise overlap ``x``.

    Returns
    -------
    ndarray
        ``x * mask / (1 - p)`` in ``x``'s dtype (the scale is rounded to that
        dtype). Dropped elements are multiplied by zero, so NaN and inf in
        ``x`` give NaN there, as in PyTorch. With ``training=False`` or
        ``p == 0`` nothing is computed and ``x`` itself is returned, not a copy
        (PyTorch does the same), unless ``out`` is given: then ``x`` is copied
        into ``out`` and ``out`` is returned.

    Raises
    ------
    TypeError
        ``x`` is not a float32/float64 ndarray; ``p`` is not a real number;
        ``seed`` or ``counter`` is not an integer (or ``counter`` a device
        counter with data on the CPU).
    ValueError
        ``p`` outside ``[0, 1]``; ``seed`` or ``counter`` negative or
        ``>= 2**64``; a device counter that is not one uint64; ``out`` of the
        wrong shape or dtype, not C-contiguous, or overlapping ``x``.
    RuntimeError
        Active dropout with an integer ``counter`` inside a captured step
        (:func:`numbapos.cuda.capture`).

    See Also
    --------
    dropout_backward, dropout_mask, numbapos.nn.Dropout
    """
    return _apply(x, "x", p, seed, counter, training, out)


def dropout_backward(grad_output, p, seed, training=True, counter=0, out=None):
    """Gradient of :func:`dropout` with respect to its input.

    The mask is regenerated from ``(seed, counter)``; pass the values the
    forward call used. The result is ``grad_output * mask / (1 - p)``.

    Parameters
    ----------
    grad_output : ndarray, float32 or float64
        Gradient with respect to the output of the forward call (same shape).
    p, seed, training, counter, out
        As for :func:`dropout`.

    Returns
    -------
    ndarray
        The gradient with respect to ``x``; ``grad_output`` itself when
        ``training=False`` or ``p == 0`` (and ``out`` is not given).

    Raises
    ------
    TypeError, ValueError
        As for :func:`dropout`, naming ``grad_output``.
    """
    return _apply(grad_output, "grad_output", p, seed, counter, training, out)


def dropout_mask(shape, p, seed, counter=0, device="cpu"):
    """The boolean keep-mask that :func:`dropout` uses for an input of ``shape``.

    Parameters
    ----------
    shape : int or tuple of int
        Shape of the input (non-negative sizes).
    p, seed, counter
        As for :func:`dropout`.
    device : {"cpu", "cuda"}, default "cpu"
        Where the mask is made (the same bits on either).

    Returns
    -------
    ndarray of bool, shape ``shape``
        True where the element is kept. ``dropout(x, p, seed, counter=c)``
        equals ``np.where(mask, x * scale, x * 0)`` with
        ``scale = x.dtype.type(1 / (1 - p))``.

    Raises
    ------
    TypeError
        A non-integer size, ``p``, ``seed`` or ``counter`` of the wrong type.
    ValueError
        A negative size, or ``p`` / ``seed`` / ``counter`` out of range.
    """
    if isinstance(shape, tuple):
        shape = tuple(_checks.check_int(n, f"shape[{k}]", minimum=0) for k, n in enumerate(shape))
    else:
        shape = (_checks.check_int(shape, "shape", minimum=0),)
    p, seed, counter = _checks.check_dropout_args(p, seed, counter)
    K = _device.kernels_for(_device.check_device(device))
    _checks.check_counter_device(counter, K.DEVICE)
    mask = K.empty(shape, np.bool_)
    if mask.size:
        K.dropout_keep_mask(DropoutArgs.make(p, seed, counter), mask.reshape(mask.size))
    return mask
