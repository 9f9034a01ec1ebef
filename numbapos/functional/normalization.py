"""Layer normalisation over the last dimension, forward and backward."""

from __future__ import annotations

import numpy as np

from .. import _checks
from ..kernels.cpu import normalization as kernels

# Below this many elements a parallel launch costs more than it saves.
PARALLEL_MIN_ELEMENTS = 1 << 15

# The weight/bias gradients are summed per chunk of rows, then over the chunks in
# order. The chunking depends only on the number of rows (never on the thread
# count), so the result is bit-identical however many threads run; at most
# MAX_CHUNKS partial rows are kept.
MIN_CHUNK_ROWS = 16
MAX_CHUNKS = 256


def chunk_rows(num_rows: int) -> int:
    """Rows per chunk of the deterministic weight/bias reduction (a function of the row count)."""
    return max(MIN_CHUNK_ROWS, -(-num_rows // MAX_CHUNKS))


def check_eps(eps, name: str = "eps") -> float:
    """``eps`` as a finite float >= 0."""
    eps = _checks.check_real(eps, name)
    if eps < 0 or not np.isfinite(eps):
        raise ValueError(f"{name}: expected a finite number >= 0, got {eps}")
    return eps


def _check_x(x, name="x"):
    x = _checks.check_float_array(x, name)
    if x.ndim == 0 or x.shape[-1] == 0:
        raise ValueError(
            f"{name}: expected at least one dimension with a non-empty last dimension "
            f"(the one normalised), got shape {x.shape}"
        )
    return x


def _check_affine(param, name, x):
    """``weight`` / ``bias``: None or a (D,) array of x's dtype."""
    if param is None:
        return None
    _checks.check_float_array(param, name, ndim=1)
    return _checks.check_float_like(param, name, x.shape[-1:], x.dtype,
                                    "the last dimension of x", "the dtype of x")


def _rows(x):
    return np.ascontiguousarray(x).reshape(-1, x.shape[-1])


def _forward(x, weight, bias, eps, out):
    """Validated forward: returns (y, mean, rstd) with mean/rstd of shape x.shape[:-1]."""
    dim = x.shape[-1]
    if out is None:
        out = np.empty(x.shape, dtype=x.dtype)
    mean = np.empty(x.shape[:-1], dtype=x.dtype)
    rstd = np.empty(x.shape[:-1], dtype=x.dtype)
    if x.size == 0:
        return out, mean, rstd
    w = np.ones(dim, dtype=x.dtype) if weight is None else np.ascontiguousarray(weight)
    b = np.zeros(dim, dtype=x.dtype) if bias is None else np.ascontiguousarray(bias)
    kernel = (kernels.layer_norm_rows_parallel if x.size >= PARALLEL_MIN_ELEMENTS
              else kernels.layer_norm_rows)
    kernel(_rows(x), w, b, eps, out.reshape(-1, dim), mean.reshape(-1), rstd.reshape(-1))
    return out, mean, rstd


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
    eps = check_eps(eps)
    if out is not None:
        _checks.check_out(out, x.shape, x.dtype, avoid=(x, weight, bias))
    return _forward(x, weight, bias, eps, out)


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


def _backward(grad_y, x, mean, rstd, weight, want_w, want_b, out):
    """Validated backward: (grad_x, grad_weight or None, grad_bias or None)."""
    dim = x.shape[-1]
    grad_x = np.empty(x.shape, dtype=x.dtype) if out is None else out
    grad_w = np.zeros(dim, dtype=x.dtype) if want_w else None
    grad_b = np.zeros(dim, dtype=x.dtype) if want_b else None
    num_rows = x.size // dim
    if num_rows == 0:
        return grad_x, grad_w, grad_b
    rows = chunk_rows(num_rows)
    n_chunks = -(-num_rows // rows)
    part_w = np.zeros((n_chunks, dim if want_w else 0), dtype=x.dtype)
    part_b = np.zeros((n_chunks, dim if want_b else 0), dtype=x.dtype)
    w = np.ones(dim, dtype=x.dtype) if weight is None else np.ascontiguousarray(weight)
    kernel = (kernels.layer_norm_backward_chunks_parallel if x.size >= PARALLEL_MIN_ELEMENTS
              else kernels.layer_norm_backward_chunks)
    kernel(_rows(grad_y), _rows(x), np.ascontiguousarray(mean).reshape(-1),
           np.ascontiguousarray(rstd).reshape(-1), w, want_w, want_b, rows,
           grad_x.reshape(-1, dim), part_w, part_b)
    if want_w:
        kernels.sum_partials(part_w, grad_w)
    if want_b:
        kernels.sum_partials(part_b, grad_b)
    return grad_x, grad_w, grad_b


def check_stats(stat, name, x):
    """``mean`` / ``rstd`` of a forward pass: shape ``x.shape[:-1]``, x's dtype."""
    return _checks.check_float_like(stat, name, x.shape[:-1], x.dtype, "x.shape[:-1]",
                                    "the dtype of x")


def layer_norm_backward(grad_y, x, mean, rstd, weight=None, bias=None, out=None):
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

    Returns
    -------
    grad_x : ndarray, shape of ``x``
    grad_weight : ndarray of shape (D,) or None
        None when ``weight`` is None.
    grad_bias : ndarray of shape (D,) or None
        None when both ``weight`` and ``bias`` are None.

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
    mean = check_stats(mean, "mean", x)
    rstd = check_stats(rstd, "rstd", x)
    weight = _check_affine(weight, "weight", x)
    bias = _check_affine(bias, "bias", x)
    if out is not None:
        _checks.check_out(out, x.shape, x.dtype, avoid=(x, grad_y, mean, rstd, weight))
    return _backward(grad_y, x, mean, rstd, weight, weight is not None,
                     weight is not None or bias is not None, out)
