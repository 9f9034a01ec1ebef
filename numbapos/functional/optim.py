"""Optimiser updates as in-place ops: SGD on a dense gradient or on listed rows.

:class:`numbapos.optim.SGD` keeps the state (momentum buffers, which rows have
started) and calls these; they validate, then run the update kernels of the
device the parameter lives on.
"""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from .._args import SGDHyper
from ..sparse import SparseRows
from ._common import backend_for


def _hyper(dtype, lr, momentum, dampening, weight_decay, nesterov, maximize) -> SGDHyper:
    values = {}
    for name, value in (("lr", lr), ("momentum", momentum), ("dampening", dampening),
                        ("weight_decay", weight_decay)):
        value = _checks.check_real(value, name)
        if value < 0 or np.isinf(value):
            raise ValueError(f"{name}: expected a finite number >= 0, got {value}")
        values[name] = value
    if nesterov and (values["momentum"] <= 0 or values["dampening"] != 0):
        raise ValueError("nesterov: requires momentum > 0 and dampening == 0, got "
                         f"momentum={values['momentum']}, dampening={values['dampening']}")
    cast = np.dtype(dtype).type
    return SGDHyper(cast(values["lr"]), cast(values["momentum"]),
                    cast(1.0 - values["dampening"]), cast(values["weight_decay"]),
                    bool(nesterov), bool(maximize))


def _check_buffer(buf, param, momentum, name="momentum_buffer"):
    """The momentum buffer: required (param's shape and dtype, C-contiguous) iff momentum."""
    if momentum == 0:
        return None
    if buf is None:
        raise ValueError(f"{name}: required when momentum != 0 (an array of the parameter's "
                         "shape and dtype, zeros before the first step)")
    return _checks.check_out(buf, tuple(param.shape), param.dtype, name, avoid=(param,))


def sgd_(param, grad, momentum_buffer=None, *, lr, momentum=0.0, dampening=0.0,
         weight_decay=0.0, nesterov=False, maximize=False, first_step=True):
    """One SGD step on ``param`` in place, ``torch.optim.SGD``'s rule for a dense gradient.

    Parameters
    ----------
    param : ndarray, float32 or float64
        Updated in place (any layout on the CPU; CUDA arrays are C-contiguous).
    grad : ndarray
        Gradient of ``param``'s shape (cast to its dtype).
    momentum_buffer : ndarray, optional
        C-contiguous, of ``param``'s shape and dtype; needed when
        ``momentum != 0`` and updated in place.
    lr, momentum, dampening, weight_decay : float
        Finite and >= 0.
    nesterov, maximize : bool
    first_step : bool, default True
        The buffer starts as the gradient on the first step (PyTorch's
        ``momentum_buffer is None``).

    Returns
    -------
    ndarray
        ``param``.

    Raises
    ------
    TypeError, ValueError
        A non-float, read-only or mismatched array, a bad option.
    """
    param = _checks.check_update_target(param)
    grad = _checks.check_float_array(grad, "grad")
    _checks.check_same_shape(grad, param.shape, "grad", "the parameter's shape")
    K = backend_for((param, grad, momentum_buffer), ("param", "grad", "momentum_buffer"))
    hyper = _hyper(param.dtype, lr, momentum, dampening, weight_decay, nesterov, maximize)
    buf = _check_buffer(momentum_buffer, param, hyper.momentum)
    if param.size == 0:
        return param
    contiguous = _device.is_c_contiguous(param)
    flat = K.contiguous(param).reshape(param.size)  # a copy only for a strided NumPy param
    no_buffer = K.empty((0,), param.dtype)
    K.sgd_dense_(flat, K.contiguous(grad, param.dtype).reshape(param.size),
                 no_buffer if buf is None else buf.reshape(param.size), bool(first_step), hyper)
    if not contiguous:
        np.copyto(param, flat.reshape(param.shape))
    return param


def sparse_sgd_(param, grad, momentum_buffer=None, row_started=None, *, lr, momentum=0.0,
                dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False):
    """Lazy SGD on the rows a :class:`~numbapos.sparse.SparseRows` gradient lists.

    Only those rows are read and written. A row's momentum starts (as the
    gradient) the first time a step touches it, recorded in ``row_started``;
    rows not listed keep their values and momentum (no decay, no drift).

    Parameters
    ----------
    param : ndarray, shape (V, D), float32 or float64
        Updated in place.
    grad : SparseRows
        Rows unique, sorted, in ``[0, V)``; values cast to ``param``'s dtype.
        An unsummed one (``embedding_backward(..., lazy=True)``) of
        ``param``'s dtype is summed row by row inside the update: one pass
        over the rows used, same result.
    momentum_buffer : ndarray, shape (V, D), optional
        Needed when ``momentum != 0``; C-contiguous, ``param``'s dtype.
    row_started : ndarray of bool, shape (V,), optional
        Needed when ``momentum != 0``; updated in place.
    lr, momentum, dampening, weight_decay, nesterov, maximize
        As for :func:`sgd_`.

    Returns
    -------
    ndarray
        ``param``.
    """
    param = _checks.check_update_target(param)
    if not isinstance(grad, SparseRows):
        raise TypeError(f"grad: expected a SparseRows, got {type(grad).__name__}")
    unsummed = grad._take_unsummed()
    if unsummed is not None and unsummed[1].dtype != param.dtype:
        unsummed = None  # sum first, then cast, as a summed gradient would be
    rows, values = _checks.check_sparse_grad(grad, param, summed=unsummed is None)
    K = backend_for((param, values if unsummed is None else unsummed[1], momentum_buffer,
                     row_started),
                    ("param", "grad.values", "momentum_buffer", "row_started"))
    if not _device.is_c_contiguous(param) and K.DEVICE == "cuda":
        raise ValueError("param: expected a C-contiguous CUDA array")
    hyper = _hyper(param.dtype, lr, momentum, dampening, weight_decay, nesterov, maximize)
    buf = _check_buffer(momentum_buffer, param, hyper.momentum)
    if buf is None:
        started = K.empty((0,), np.bool_)
    else:
        if row_started is None:
            raise ValueError("row_started: required when momentum != 0 (a bool array with "
                             "one flag per row)")
        started = _checks.check_out(row_started, (param.shape[0],), np.dtype(np.bool_),
                                    "row_started", avoid=(param, buf))
    no_buffer = K.empty((0, 0), param.dtype)
    if unsummed is not None:
        groups, grad2d, scale = unsummed
        K.sgd_row_groups_(param, grad2d, groups, scale, no_buffer if buf is None else buf,
                          started, hyper)
        return param
    if _device.device_of(rows) != K.DEVICE:
        rows = K.asarray(rows) if K.DEVICE == "cuda" else _device.to_host(rows)
    K.sgd_rows_(param, K.contiguous(rows, np.int64), K.contiguous(values, param.dtype),
                no_buffer if buf is None else buf, started, hyper)
    return param
