"""ALiBi: linear attention biases per head, with slopes that may be trained."""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from .. import functional as F
from .._docs import MODULE, fill_doc
from ..functional.alibi import RECIPES, _check_mode
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
    slopes : {"paper", "bloom", "mpt"} or ndarray of shape (H,), optional
        The initial slopes: a ``recipe`` of
        :func:`~numbapos.functional.alibi_slopes`, or the values themselves
        (e.g. a checkpoint's). By default the mode's own: ``"bloom"`` and
        ``"mpt"`` take transformers' float32 slopes (the bits of
        ``build_alibi_tensor`` / ``build_mpt_alibi_tensor``), ``"symmetric"``
        the paper's; ``slopes="paper"`` gives the exact ones in any mode.

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
                 dtype=np.float32, device="cpu", *, slopes=None):
        super().__init__()
        self.num_heads = _checks.check_int(num_heads, "num_heads", minimum=1)
        self.max_bias = _checks.check_positive(max_bias, "max_bias")
        _check_mode(mode)
        self.mode = mode
        dtype = _checks.check_float_dtype(dtype)
        if slopes is None:
            slopes = "paper" if mode == "symmetric" else mode
        if isinstance(slopes, str):
            if slopes not in RECIPES:
                raise ValueError(f"slopes: expected one of {list(RECIPES)} or an array of "
                                 f"{self.num_heads} slopes, got {_checks.quote(slopes)}")
            self.recipe = slopes
            values = F.alibi_slopes(self.num_heads, self.max_bias, dtype, recipe=slopes)
        else:
            self.recipe = None
            values = _slopes_array(slopes, self.num_heads, dtype)
        self.slopes = Parameter(values)
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
            As for :func:`numbapos.functional.add_alibi_`; ``H`` other than the
            number of slopes.
        """
        scores = _checks.check_float_array(scores, "scores", ndim=4)
        if scores.shape[1] != self.slopes.shape[0]:
            raise ValueError(f"scores: expected {self.slopes.shape[0]} heads (the module's "
                             f"slopes) along axis 1 of (B, H, Lq, Lk), got shape "
                             f"{tuple(scores.shape)}")
        out = _device.copy(scores)
        F.add_alibi_(out, self.slopes.data, mode=self.mode, attention_mask=attention_mask)
        if self._recording():
            mask = None if attention_mask is None else _device.copy(
                _checks.check_attention_mask(attention_mask))
            self._save_for_backward((tuple(scores.shape), mask))
        return out

    @fill_doc(MODULE)
    def backward(self, grad_output):
        """Accumulate the slopes' gradient (when trained); return ``grad_output``.

        Raises
        ------
        {no_forward}
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
        recipe = "given" if self.recipe is None else self.recipe
        return (f"{self.num_heads}, max_bias={self.max_bias}, mode={self.mode!r}, "
                f"slopes={recipe!r}")


def _slopes_array(slopes, num_heads, dtype):
    """Given slopes as a host copy in ``dtype``: finite floats of shape ``(num_heads,)``."""
    values = _device.to_host(_checks.check_float_array(slopes, "slopes", ndim=1))
    if values.shape != (num_heads,):
        raise ValueError(f"slopes: expected shape ({num_heads},) (one slope per head), got "
                         f"{values.shape}")
    if not np.all(np.isfinite(values)):
        raise ValueError("slopes: expected finite values, got a nan or an infinity")
    return np.array(values, dtype=dtype)
