"""Optimisers: state per parameter, updates through :mod:`numbapos.functional` ops.

Every optimiser takes parameters (or parameter groups) like its PyTorch
namesake, updates dense gradients and, lazily, row-sparse
:class:`~numbapos.sparse.SparseRows` ones (only the rows listed are read and
written), and saves its state with ``state_dict()`` in PyTorch's layout (see
:class:`Optimizer`).
"""

from ._base import Optimizer
from .adagrad import Adagrad, RowWiseAdagrad
from .adam import Adam, AdamW
from .sgd import SGD

__all__ = ["SGD", "Adagrad", "Adam", "AdamW", "Optimizer", "RowWiseAdagrad"]
