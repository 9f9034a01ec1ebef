"""LayerNorm: layer normalisation over the last dimension (PyTorch's ``nn.LayerNorm``)."""

from __future__ import annotations

import numbers

import numpy as np

from .. import _checks
from .. import functional as F
from .._docs import MODULE, fill_doc
from .module import Module
from .parameter import Parameter


def _normalized_dim(normalized_shape) -> int:
    if isinstance(normalized_shape, (tuple, list)):
        if len(normalized_shape) != 1:
            raise ValueError(
                f"normalized_shape: only normalisation over the last dimension is supported, "
                f"so pass an int or a 1-tuple; got {_checks.quote(tuple(normalized_shape))} "
                f"(flatten the trailing dimensions into one first)"
            )
        normalized_shape = normalized_shape[0]
    if isinstance(normalized_shape, (bool, np.bool_)) or not isinstance(
            normalized_shape, numbers.Integral):
        raise TypeError(
            f"normalized_shape: expected an int or a 1-tuple of int, got "
            f"{_checks.quote(normalized_shape)}"
        )
    return _checks.check_int(normalized_shape, "normalized_shape", minimum=1)


@fill_doc(MODULE)
class LayerNorm(Module):
    """Normalise each vector along the last dimension, then scale and shift it.

    ``y = (x - mean) / sqrt(var + eps) * weight + bias`` with the mean and the
    biased variance of each vector, as PyTorch's ``nn.LayerNorm``.

    Parameters
    ----------
    normalized_shape : int or 1-tuple of int
        Size D of the last dimension. Only the last dimension can be
        normalised: a longer tuple raises ValueError.
    eps : float, default 1e-5
        Added to the variance (finite, >= 0).
    elementwise_affine : bool, default True
        Learn ``weight`` (initialised to ones) and ``bias`` (zeros). When False
        the module has no parameters.
    bias : bool, default True
        With ``elementwise_affine``, whether to learn ``bias`` (as PyTorch's
        ``bias=`` argument).
    dtype : float32 or float64, default float32
        Dtype of the parameters; inputs must have the same dtype.
    {device}

    Attributes
    ----------
    weight : Parameter of shape (D,) or None
    bias : Parameter of shape (D,) or None
    """

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True,
                 dtype=np.float32, device="cpu"):
        super().__init__()
        self.normalized_shape = (_normalized_dim(normalized_shape),)
        self.eps = _checks.check_eps(eps)
        self.elementwise_affine = bool(elementwise_affine)
        self.dtype = _checks.check_float_dtype(dtype)
        dim = self.normalized_shape[0]
        if self.elementwise_affine:
            self.weight = Parameter(np.ones(dim, dtype=self.dtype))
            self.bias = Parameter(np.zeros(dim, dtype=self.dtype)) if bias else None
        else:
            self.weight = None
            self.bias = None
        self._place(device)

    def _check_input(self, x):
        x = _checks.check_float_array(x, "x")
        dim = self.normalized_shape[0]
        if x.ndim == 0 or x.shape[x.ndim - 1] != dim:
            raise ValueError(
                f"x: expected last dimension normalized_shape={dim}, got shape "
                f"{tuple(x.shape)}"
            )
        if self.weight is not None and x.dtype != self.dtype:
            raise TypeError(
                f"x: expected dtype {self.dtype} (the dtype of the parameters), got {x.dtype}"
            )
        return x

    def _params(self):
        """(weight, bias) arrays; the functional op checks them (``.data`` may be replaced)."""
        weight = None if self.weight is None else self.weight.data
        bias = None if self.bias is None else self.bias.data
        return weight, bias

    def forward(self, x, out=None):
        """Normalise ``x`` of shape (..., D); returns an array of the same shape.

        Parameters
        ----------
        x : ndarray, float32 or float64
            Same dtype as the parameters when ``elementwise_affine``.
        out : ndarray, optional
            Result buffer, as for :func:`numbapos.functional.layer_norm`.

        Raises
        ------
        TypeError
            ``x`` not a float ndarray, or of another dtype than the parameters.
        ValueError
            Last dimension of ``x`` not D; a bad ``out``.
        """
        x = self._check_input(x)
        weight, bias = self._params()
        if out is None:
            out = self._output_buffer(x, x.shape, x.dtype)
        y, mean, rstd = F.layer_norm_forward(x, weight, bias, self.eps, out)
        if self._recording():
            # x is copied (the caller may reuse its buffer); the weight is watched.
            self._save_for_backward((self._copy_for_backward(x), mean, rstd,
                                     self._watch((("weight", self.weight),))))
        return y

    def backward(self, grad_output):
        """Gradient wrt the matching forward's input; accumulates ``weight`` / ``bias`` grads.

        Frozen parameters (``requires_grad=False``) accumulate nothing, and
        their gradient is not computed.

        Raises
        ------
        RuntimeError
            No recorded forward is left, or ``weight`` changed since it.
        TypeError, ValueError
            ``grad_output`` not of the forward input's shape and dtype (the
            record is kept).
        """
        x, mean, rstd, watched = self._saved_context()
        grad_output = _checks.check_float_like(
            grad_output, "grad_output", x.shape, x.dtype,
            "the shape of the matching forward's input", "the dtype of that input")
        self._check_unchanged(watched)
        want_w = self.weight is not None and self.weight.requires_grad
        want_b = self.bias is not None and self.bias.requires_grad
        weight, bias = self._params()
        grad_x, grad_w, grad_b = F.layer_norm_backward(grad_output, x, mean, rstd, weight, bias,
                                                       output_mask=(want_w, want_b))
        self._release()
        if want_w:
            self.weight.accumulate_grad(grad_w, fresh=True)
        if want_b:
            self.bias.accumulate_grad(grad_b, fresh=True)
        return grad_x

    def extra_repr(self) -> str:
        parts = [f"{self.normalized_shape}, eps={self.eps}",
                 f"elementwise_affine={self.elementwise_affine}"]
        if self.elementwise_affine and self.bias is None:
            parts.append("bias=False")
        return ", ".join(parts)
