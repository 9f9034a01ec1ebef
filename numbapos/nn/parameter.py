"""Parameter: a trainable array with its gradient."""

from __future__ import annotations

import numpy as np

from .._checks import check_float_array
from ..sparse import SparseRows


class Parameter:
    """A float array a module trains, with its accumulated gradient.

    Parameters
    ----------
    data : ndarray, float32 or float64
        The values; kept as given (no copy), updated in place by optimisers.
    requires_grad : bool, default True
        False freezes the parameter: backward passes accumulate nothing into it
        and optimisers skip it.

    Attributes
    ----------
    grad : ndarray, SparseRows or None
        Accumulated gradient, None until the first backward pass (and after
        ``zero_grad``).
    """

    def __init__(self, data, requires_grad: bool = True):
        self.data = check_float_array(data, "data")
        self.requires_grad = bool(requires_grad)
        self.grad = None

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    def accumulate_grad(self, grad, *, fresh: bool = False) -> None:
        """Add ``grad`` (dense array or SparseRows) into ``self.grad``.

        Sparse plus sparse stays sparse (rows merged); any dense term makes the
        sum dense. Does nothing when ``requires_grad`` is False. ``fresh=True``
        promises that nobody else holds ``grad``, so it can be kept without a copy.

        Raises
        ------
        TypeError
            ``grad`` not a float array or SparseRows, or of another dtype than
            the parameter (as PyTorch, gradients keep their parameter's dtype).
        ValueError
            ``grad`` of another shape than the parameter.
        """
        if not self.requires_grad:
            return
        if not isinstance(grad, SparseRows):
            grad = check_float_array(grad, "grad")
        if grad.shape != self.data.shape:
            raise ValueError(f"grad: expected shape {self.data.shape}, got {grad.shape}")
        if grad.dtype != self.data.dtype:
            raise TypeError(f"grad: expected dtype {self.data.dtype} (the parameter's), "
                            f"got {grad.dtype}")
        if self.grad is None:
            self.grad = grad if fresh or isinstance(grad, SparseRows) else grad.copy()
        elif isinstance(self.grad, SparseRows) and isinstance(grad, SparseRows):
            self.grad = self.grad + grad
        elif isinstance(self.grad, SparseRows):
            self.grad = grad + self.grad.to_dense()
        elif isinstance(grad, SparseRows):
            grad.add_to(self.grad)
        else:
            self.grad += grad

    def __repr__(self) -> str:
        frozen = "" if self.requires_grad else ", requires_grad=False"
        return f"Parameter(shape={self.data.shape}, dtype={self.data.dtype}{frozen})"
