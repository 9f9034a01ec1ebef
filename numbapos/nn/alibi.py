"""ALiBi: linear attention biases per head, with slopes that may be trained."""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from .. import functional as F
from ..functional.alibi import MODES
from ..functional.arrays import contiguous
from .module import Module
from .parameter import Parameter


class ALiBi(Module):
    """Adds ALiBi biases to attention scores (BLOOM, MPT, bidirectional encoders).

    ``forward(scores)`` returns ``scores + slopes[h] * dist`` (see
    :func:`numbapos.functional.alibi_bias` for ``dist`` in each ``mode``);
    ``backward(grad)`` returns ``grad`` (the bias does not depend on the
    scores) and, when the slopes are trained, accumulates their gradient
    ``sum grad * dist`` (deterministic; transformers' BLOOM and MPT keep their
    slopes fixed and offer none).

    Parameters
    ----------
    num_heads : int
        Number of heads H.
    max_bias : float, default 8.0
        Sets the initial slopes, :func:`numbapos.functional.alibi_slopes`.
    mode : {"symmetric", "mpt", "bloom"}, default "symmetric"
    trainable : bool, default False
        Whether the slopes get gradients (``slopes.requires_grad``).
    dtype : float32 or float64, default float32
    device : {"cpu", "cuda"}, default "cpu"

    Attributes
    ----------
    slopes : Parameter, shape (H,)

    Examples
    --------
    >>> import numpy as np
    >>> from numbapos.nn import ALiBi
    >>> alibi = ALiBi(2, trainable=True)
    >>> y = alibi(np.zeros((1, 2, 3, 3), np.float32))
    >>> float(y[0, 0, 0, 2])
    -0.125
    >>> alibi.backward(np.ones((1, 2, 3, 3), np.float32)).shape
    (1, 2, 3, 3)
    >>> alibi.slopes.grad
    array([-8., -8.], dtype=float32)
    """

    def __init__(self, num_heads, max_bias=8.0, mode="symmetric", trainable=False,
                 dtype=np.float32, device="cpu"):
        super().__init__()
        self.num_heads = _checks.check_int(num_heads, "num_heads", minimum=1)
        self.max_bias = _checks.check_positive(max_bias, "max_bias")
        if not isinstance(mode, str) or mode not in MODES:
            raise ValueError(f"mode: expected one of {list(MODES)}, got {_checks.quote(mode)}")
        self.mode = mode
        self.slopes = Parameter(F.alibi_slopes(self.num_heads, self.max_bias, dtype))
        self.slopes.requires_grad = bool(trainable)
        self._place(device)

    def forward(self, scores, attention_mask=None):
        """Return ``scores + bias`` (a new array).

        Parameters
        ----------
        scores : ndarray, shape (B, H, Lq, Lk), float32 or float64
        attention_mask : array_like of 0 / 1, shape (Lk,) or (B, Lk), optional
            ``mode="bloom"`` only.

        Raises
        ------
        TypeError, ValueError
            As for :func:`numbapos.functional.add_alibi_`.
        """
        scores = _checks.check_float_array(scores, "scores", ndim=4)
        out = _device.copy(scores)
        F.add_alibi_(out, self.slopes.data, mode=self.mode, attention_mask=attention_mask)
        if self._recording():
            mask = None if attention_mask is None else _device.copy(
                _checks.check_attention_mask(attention_mask))
            self._save_for_backward((tuple(scores.shape), mask))
        return out

    def backward(self, grad_output):
        """Accumulate the slopes' gradient (when trained); return ``grad_output``.

        Raises
        ------
        RuntimeError
            No recorded forward is left.
        TypeError, ValueError
            ``grad_output`` not a float array of the forward's shape (the record is kept).
        """
        shape, mask = self._saved_context()
        grad_output = _checks.check_float_array(grad_output, "grad_output", ndim=4)
        _checks.check_same_shape(grad_output, shape, "grad_output",
                                 "the shape of the matching forward's scores")
        grad = None
        if self.slopes.requires_grad:
            grad = F.alibi_slopes_grad(grad_output, mode=self.mode, attention_mask=mask)
            if grad.dtype != self.slopes.dtype:
                grad = contiguous(grad, self.slopes.dtype)  # on its device
        self._release()
        if grad is not None:
            self.slopes.accumulate_grad(grad, fresh=True)
        return grad_output

    def extra_repr(self) -> str:
        return f"{self.num_heads}, max_bias={self.max_bias}, mode={self.mode!r}"
