"""Layer normalisation over the last dimension, forward and backward."""

from __future__ import annotations

from .. import _checks
from ._common import backend_for


def _check_x(x, name="x"):
    x = _checks.check_float_array(x, name)
    if x.ndim == 0 or x.shape[x.ndim - 1] == 0:
        raise ValueError(
            f"{name}: expected at least one dimension with a non-empty last dimension "
            f"(the one normalised), got shape {tuple(x.shape)}"
        )
    return x


def _check_affine(param, name, x):
    """``weight`` / ``bias``: None or a (D,) array of x's dtype."""
    return _checks.check_vector_param(param, name, x.shape[x.ndim - 1], x.dtype,
                                      "the last dimension of x", "the dtype of x")


def _rows(K, x):
    return K.contiguous(x).reshape(x.size // x.shape[x.ndim - 1], x.shape[x.ndim - 1])


def layer_norm_forward(x, weight=None, bias=None, eps=1e-5, out=None):
    """Layer normalisation over the last dimension, returning the statistics too.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the mean and the
    biased variance of each vector along the last axis (PyTorch's
    ``F.layer_norm(x, (D,), weight, bias, eps)``).

    Parameters
    ----------
    x : ndarray, shape (..., D), float32 or float64
        Input; D >= 1. May be non-contiguous (it is then copied).
    weight : ndarray, shape (D,), optional
        Scale (gamma), same dtype as ``x``; None means ones.
    bias : ndarray, shape (D,), optional
        Shift (beta), same dtype as ``x``; None means zeros.
    eps : float, default 1e-5
        Added to the variance (finite, >= 0).
    out : ndarray, optional
        C-contiguous buffer of ``x``'s shape and dtype for ``y``; must not
        overlap ``x``.

    Returns
    -------
    y : ndarray, shape of ``x``
    mean : ndarray, shape ``x.shape[:-1]``
        Per-vector mean.
    rstd : ndarray, shape ``x.shape[:-1]``
        Per-vector ``1 / sqrt(var + eps)``.

    Raises
    ------
    TypeError
        ``x`` / ``weight`` / ``bias`` not float32/float64 ndarrays, or
        ``weight`` / ``bias`` of another dtype than ``x``.
    ValueError
        ``x`` 0-d or with an empty last dimension; ``weight`` / ``bias`` not of
        shape (D,); ``eps`` negative or not finite; a bad ``out``.

    Notes
    -----
    The statistics are computed in ``x``'s dtype with the corrected two-pass
    algorithm (mean, then sums of deviations from it), which stays within a
    few float32 ulp of a float64 reference even when the mean is large next
    to the spread. Each vector is handled by one thread in a fixed order, so
    the result does not depend on the thread count.
    """
    x = _check_x(x)
    weight = _check_affine(weight, "weight", x)
    bias = _check_affine(bias, "bias", x)
    K = backend_for((x, weight, bias, out), ("x", "weight", "bias", "out"))
    eps = _checks.check_eps(eps)
    out = (K.empty(x.shape, x.dtype) if out is None
           else _checks.check_out(out, x.shape, x.dtype, avoid=(x, weight, bias)))
    mean = K.empty(x.shape[:-1], x.dtype)
    rstd = K.empty(x.shape[:-1], x.dtype)
    rows = x.size // x.shape[x.ndim - 1]
    K.layer_norm_rows(_rows(K, x), weight, bias, eps, out.reshape(rows, x.shape[x.ndim - 1]),
                      mean.reshape(rows), rstd.reshape(rows))
    return out, mean, rstd


def layer_norm(x, weight=None, bias=None, eps=1e-5, out=None):
    """Layer normalisation over the last dimension (PyTorch's ``F.layer_norm`` with shape (D,)).

    Parameters and errors are those of :func:`layer_norm_forward`, which also
    returns the per-vector mean and ``rstd`` that :func:`layer_norm_backward`
    needs.

    Returns
    -------
    ndarray, shape of ``x``
        ``(x - mean) / sqrt(var + eps) * weight + bias``.
    """
    return layer_norm_forward(x, weight, bias, eps, out)[0]


def _check_stats(stat, name, x):
    """``mean`` / ``rstd`` of a forward pass: shape ``x.shape[:-1]``, x's dtype."""
    return _checks.check_float_like(stat, name, x.shape[:-1], x.dtype, "x.shape[:-1]",
                                    "the dtype of x")


def layer_norm_backward(grad_y, x, mean, rstd, weight=None, bias=None, out=None, *,
                        output_mask=(True, True)):
    """Gradients of :func:`layer_norm_forward` wrt ``x``, ``weight`` and ``bias``.

    With ``xhat = (x - mean) * rstd`` and ``g = grad_y * weight``::

        grad_x      = rstd * (g - mean(g) - xhat * mean(g * xhat))   (means over D)
        grad_weight = sum over vectors of grad_y * xhat
        grad_bias   = sum over vectors of grad_y

    Parameters
    ----------
    grad_y : ndarray, shape of ``x``
        Gradient of the loss wrt the forward output, ``x``'s dtype.
    x : ndarray, shape (..., D), float32 or float64
        The forward input.
    mean, rstd : ndarray, shape ``x.shape[:-1]``
        As returned by :func:`layer_norm_forward` for ``x``.
    weight : ndarray, shape (D,), optional
        The forward's weight; None if it had none.
    bias : ndarray, shape (D,), optional
        The forward's bias. Only its presence matters: ``grad_bias`` is computed
        when ``weight`` or ``bias`` is given.
    out : ndarray, optional
        C-contiguous buffer of ``x``'s shape and dtype for ``grad_x``; must not
        overlap the inputs.
    output_mask : (bool, bool), default (True, True)
        Whether to compute ``grad_weight`` and ``grad_bias`` at all (as
        PyTorch's ``native_layer_norm_backward``): False skips that sum and
        returns None in its place, e.g. for a frozen parameter.

    Returns
    -------
    grad_x : ndarray, shape of ``x``
    grad_weight : ndarray of shape (D,) or None
        None when ``weight`` is None or masked out.
    grad_bias : ndarray of shape (D,) or None
        None when both ``weight`` and ``bias`` are None, or masked out.

    Raises
    ------
    TypeError, ValueError
        As for :func:`layer_norm_forward`; also ``grad_y`` not of ``x``'s shape
        and dtype, ``mean`` / ``rstd`` not of shape ``x.shape[:-1]`` and
        ``x``'s dtype.

    Notes
    -----
    ``grad_weight`` and ``grad_bias`` are sums over all vectors. They are
    accumulated per fixed-size chunk of vectors (the chunking depends only on
    the number of vectors) and the chunk sums are added in order, so the
    results are bit-identical for any thread count.
    """
    x = _check_x(x)
    grad_y = _checks.check_float_like(grad_y, "grad_y", x.shape, x.dtype, "the shape of x",
                                      "the dtype of x")
    mean = _check_stats(mean, "mean", x)
    rstd = _check_stats(rstd, "rstd", x)
    weight = _check_affine(weight, "weight", x)
    bias = _check_affine(bias, "bias", x)
    K = backend_for((x, grad_y, mean, rstd, weight, bias, out),
                    ("x", "grad_y", "mean", "rstd", "weight", "bias", "out"))
    if not isinstance(output_mask, tuple) or len(output_mask) != 2:
        raise TypeError(f"output_mask: expected a tuple of two bools, got "
                        f"{_checks.quote(output_mask)}")
    want_w = weight is not None and bool(output_mask[0])
    want_b = (weight is not None or bias is not None) and bool(output_mask[1])
    out = (K.empty(x.shape, x.dtype) if out is None
           else _checks.check_out(out, x.shape, x.dtype, avoid=(x, grad_y, mean, rstd, weight)))
    dim = x.shape[x.ndim - 1]
    rows = x.size // dim
    grad_w = K.empty((dim,), x.dtype) if want_w else None
    grad_b = K.empty((dim,), x.dtype) if want_b else None
    K.layer_norm_backward_rows(_rows(K, grad_y), _rows(K, x), K.contiguous(mean).reshape(rows),
                               K.contiguous(rstd).reshape(rows), weight,
                               out.reshape(rows, dim), grad_w, grad_b)
    return out, grad_w, grad_b
