"""Inverted dropout with a reproducible, counter-based mask.

The mask of a call is a pure function of ``(seed, counter, element index)``
(see :mod:`numbapos.kernels.cpu.dropout`): the same arguments give the same
mask for any thread count, any split of the work and, later, on the GPU. The
backward pass regenerates the mask instead of storing it.
"""

from __future__ import annotations

import numpy as np

from .. import _checks
from ..kernels.cpu import dropout as kernels

# Below this many elements a parallel launch costs more than it saves.
PARALLEL_MIN_ELEMENTS = 1 << 15


def _check_common(p, seed, counter):
    p = _checks.check_unit_interval(p, "p")
    seed = _checks.check_uint64(seed, "seed")
    counter = _checks.check_uint64(counter, "counter")
    return p, seed, counter


def _apply(x, p, seed, counter, out, forward):
    """Validate ``out``, then run the mask-and-scale kernel on ``x`` (already checked)."""
    if out is not None:
        # out may be x itself (in place: each element reads and writes only itself),
        # but no other array that overlaps x.
        _checks.check_out(out, x.shape, x.dtype, avoid=() if out is x else (x,))
    else:
        out = np.empty(x.shape, dtype=x.dtype)
    if x.size == 0:
        return out
    flat = np.ascontiguousarray(x).reshape(-1)
    threshold = np.uint64(kernels.keep_threshold(p))
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    if x.size >= PARALLEL_MIN_ELEMENTS:
        kernel = kernels.dropout_forward_parallel if forward else kernels.dropout_backward_parallel
    else:
        kernel = kernels.dropout_forward if forward else kernels.dropout_backward
    kernel(flat, np.uint64(seed), np.uint64(counter), threshold, scale, out.reshape(-1))
    return out


def _identity(x, out):
    if out is None:
        return x
    _checks.check_out(out, x.shape, x.dtype, avoid=() if out is x else (x,))
    if out is not x:
        np.copyto(out, x)
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
    counter : int, default 0
        Non-negative integer below ``2**64`` that selects the mask for this call.
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
        ``seed`` or ``counter`` is not an integer.
    ValueError
        ``p`` outside ``[0, 1]``; ``seed`` or ``counter`` negative or
        ``>= 2**64``; ``out`` of the wrong shape or dtype, not C-contiguous, or
        overlapping ``x``.

    See Also
    --------
    dropout_backward, dropout_mask, numbapos.nn.Dropout
    """
    x = _checks.check_float_array(x, "x")
    p, seed, counter = _check_common(p, seed, counter)
    if not training or p == 0.0:
        return _identity(x, out)
    return _apply(x, p, seed, counter, out, forward=True)


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
    grad_output = _checks.check_float_array(grad_output, "grad_output")
    p, seed, counter = _check_common(p, seed, counter)
    if not training or p == 0.0:
        return _identity(grad_output, out)
    return _apply(grad_output, p, seed, counter, out, forward=False)


def dropout_mask(shape, p, seed, counter=0):
    """The boolean keep-mask that :func:`dropout` uses for an input of ``shape``.

    Parameters
    ----------
    shape : int or tuple of int
        Shape of the input (non-negative sizes).
    p, seed, counter
        As for :func:`dropout`.

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
    p, seed, counter = _check_common(p, seed, counter)
    mask = np.empty(shape, dtype=np.bool_)
    if mask.size == 0:
        return mask
    threshold = np.uint64(kernels.keep_threshold(p))
    kernel = (kernels.dropout_keep_mask_parallel if mask.size >= PARALLEL_MIN_ELEMENTS
              else kernels.dropout_keep_mask)
    kernel(np.uint64(seed), np.uint64(counter), threshold, mask.reshape(-1))
    return mask
