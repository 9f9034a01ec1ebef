"""Pooled lookups (PyTorch's ``F.embedding_bag``) and their gradient."""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from .._args import RowGroups, TableFormat
from ..sparse import SparseRows
from ._common import Planned, backend_for, check_range, flatten, on_backend
from .embedding import _check_clippable, _lazy_arrays, _sparse_rows
from .half import half_format

__all__ = ["embedding_bag", "embedding_bag_backward"]

# GPU calls replay their launches through a plan per call signature (_gpuhost/plans.py):
# every scalar the kernels get derives from the arrays' metadata and the options.
_FORWARDS = Planned("embedding_bag")
_BACKWARDS = Planned("embedding_bag_backward")
_LAZY_BACKWARDS = Planned("embedding_bag_backward, sparse and lazy")

# The kernels' pooling modes (kernels/cpu/bag.py: SUM, MEAN, MAX).
MODES = {"sum": 0, "mean": 1, "max": 2}
_MAX = MODES["max"]
_UINT16, _FLOAT32 = np.dtype(np.uint16), np.dtype(np.float32)


class _Bags:
    """A validated call: the backend, flat ids, bag layout and options."""

    __slots__ = ("K", "flat", "offsets", "width", "bags", "mode", "padding", "weights",
                 "shape")


def _bags(input, offsets, mode, per_sample_weights, include_last_offset, padding_idx,
          scale_grad_by_freq, num_rows, result_dtype, arrays, names):
    """Every check the forward and the backward share; ``arrays`` (named ``names``) are the
    data arrays that fix the device."""
    call = _Bags()
    K = call.K = backend_for(arrays, names)
    if mode not in MODES:
        raise ValueError(f"mode: expected 'sum', 'mean' or 'max', got {mode!r}")
    call.mode = MODES[mode]
    if scale_grad_by_freq and call.mode == _MAX:
        raise ValueError("scale_grad_by_freq: not supported with mode='max' (as in PyTorch)")
    input = on_backend(K, input, "input")
    if input.ndim not in (1, 2):
        raise ValueError(f"input: expected a 1-D array with offsets or a 2-D array (one bag "
                         f"per row), got shape {tuple(input.shape)}")
    if input.ndim == 2:
        if offsets is not None:
            raise ValueError("offsets: must be None for 2-D input (each row is a bag), got "
                             f"{_checks.type_name(offsets)}")
        bags, width = input.shape
        # Zero columns: every bag empty, as offsets of zeros (width 0 means 1-D to the kernels).
        # Else no offsets are read: on the GPU an empty view of the ids stands for them (an
        # empty array of its own would keep the call from being planned).
        offsets = (None if K.DEVICE != "cpu" else K.empty((0,), np.int64)) if width \
            else K.zeros((bags,), np.int64)
    else:
        if offsets is None:
            raise ValueError("offsets: required with 1-D input (where each bag starts), "
                             "got None")
        offsets = on_backend(K, offsets, "offsets")
        if offsets.ndim != 1:
            raise ValueError(f"offsets: expected a 1-D array, got shape {tuple(offsets.shape)}")
        bags, width = offsets.shape[0], 0
        if include_last_offset:
            if bags == 0:
                raise ValueError("offsets: include_last_offset=True needs at least one "
                                 "offset (the input's length), got none")
            bags -= 1
    call.flat = flatten(K, input)
    call.offsets = call.flat[:0] if offsets is None else offsets
    call.width, call.bags = width, bags
    call.shape = tuple(input.shape)
    padding = _checks.check_padding_idx(padding_idx, num_rows)
    call.padding = -1 if padding is None else padding
    call.weights = None
    if per_sample_weights is not None:
        if mode != "sum":
            raise ValueError(f"per_sample_weights: only supported with mode='sum', got "
                             f"mode={mode!r}")
        psw = _checks.check_float_array(per_sample_weights, "per_sample_weights")
        _checks.check_same_device((arrays[0], psw), (names[0], "per_sample_weights"))
        if tuple(psw.shape) != call.shape:
            raise ValueError(f"per_sample_weights: expected the input's shape {call.shape}, "
                             f"got {tuple(psw.shape)}")
        if psw.dtype != result_dtype:
            raise TypeError(f"per_sample_weights: expected dtype {result_dtype} (the pooled "
                            f"result's), got {psw.dtype}")
        call.weights = flatten(K, psw)
    if width == 0 and offsets.shape[0]:
        bad = K.check_bag_offsets(offsets, call.flat.size, bool(include_last_offset))
        if bad is not None:
            raise ValueError(_offsets_problem(offsets, *bad, call.flat.size,
                                              include_last_offset))
    check_range(K, call.flat, num_rows, name="input", checked_by_kernel=True)
    return call


def _offsets_problem(offsets, position, value, size, include_last_offset):
    """The message for the first bad offset (found by ``K.check_bag_offsets``)."""
    if position == 0:
        expected = "the first offset must be 0"
    else:
        before = int(_device.to_host(offsets[position - 1:position])[0])
        if value < before:
            expected = f"offsets must not decrease (offsets[{position - 1}]={before})"
        elif include_last_offset and value <= size:
            expected = (f"with include_last_offset=True the last offset must equal "
                        f"len(input)={size}")
        else:
            expected = f"offsets must not pass len(input)={size}"
    return f"offsets: offsets[{position}]={value}: {expected}"


def embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2.0,
                  scale_grad_by_freq=False, mode="mean", sparse=False, per_sample_weights=None,
                  include_last_offset=False, padding_idx=None, *, out=None):
    """Sums, means or maxima of bags of rows of a table (PyTorch's ``F.embedding_bag``).

    Parameters
    ----------
    input : array_like of int, 1-D or 2-D
        Row ids (int32 / int64), each in ``[0, V)``. 1-D: the bags one after
        another, split by ``offsets``; 2-D: one bag per row (``offsets`` None,
        ``include_last_offset`` ignored, as PyTorch).
    weight : ndarray, shape (V, D), float32, float64, bfloat16 or float16
        The table. A 16-bit table is pooled in float32 (exact widening).
    offsets : array_like of int, 1-D, optional
        Where each bag starts in a 1-D ``input``: starts at 0, never
        decreases, never passes ``len(input)``. Equal offsets make empty bags.
    max_norm : float, optional
        Clip the rows ``input`` names (padding included) to this norm in place
        first, as :func:`~numbapos.functional.embedding` does.
    norm_type : float, default 2.0
        The p of the p-norm for ``max_norm``.
    scale_grad_by_freq : bool, default False
        Only for the backward (:func:`embedding_bag_backward`); refused with
        ``mode="max"``, as PyTorch refuses it.
    mode : {"sum", "mean", "max"}, default "mean"
        How a bag's rows pool. Bags with no entry (or padding only) give zeros.
    sparse : bool, default False
        Only for the backward; accepted for PyTorch's signature (with every
        mode: PyTorch refuses ``mode="max"`` with it, numbapos's backward
        gives max mode sparse gradients).
    per_sample_weights : ndarray, optional
        With ``mode="sum"`` only: a float array of ``input``'s shape and the
        result's dtype; each row is scaled by its weight before the sum.
    include_last_offset : bool, default False
        ``offsets`` ends with ``len(input)`` (CSR style): there are
        ``len(offsets) - 1`` bags. The last offset must then equal
        ``len(input)`` (PyTorch lets smaller ones through and its forward and
        backward then disagree on the trailing ids).
    padding_idx : int, optional
        Row left out of every bag (may be negative, wrapped by V); a mean
        divides by the bag's other entries.
    out : ndarray, optional
        C-contiguous ``(B, D)`` buffer of the result's dtype.

    Returns
    -------
    ndarray, shape (B, D)
        The pooled rows, of ``weight``'s dtype (float32 for a 16-bit table).
        The bits are PyTorch 2.13's CPU ones for float32: sums in index
        order, a mean dividing that sum by the count, weighted sums one fused
        multiply-add per entry (a rounded product added, with ``padding_idx``),
        the first maximum on ties.

    Raises
    ------
    TypeError
        Non-integer ids or offsets, a table of another dtype, weights of
        another dtype than the result's.
    ValueError
        Bad offsets (not starting at 0, decreasing, past the input's end),
        offsets with 2-D input, ``scale_grad_by_freq`` with ``mode="max"``,
        ``per_sample_weights`` of the wrong shape or with a mode other than
        ``"sum"``, a bad ``mode``, ``padding_idx``, ``max_norm`` or ``out``.
    IndexError
        An id outside ``[0, V)``. Nothing is modified when any error is raised,
        ``max_norm``'s clipping included.

    Examples
    --------
    >>> import numpy as np
    >>> from numbapos.functional.bag import embedding_bag
    >>> weight = np.arange(8, dtype=np.float32).reshape(4, 2)
    >>> embedding_bag(np.array([0, 1, 3]), weight, np.array([0, 2]), mode="sum")
    array([[2., 4.],
           [6., 7.]], dtype=float32)
    """
    if max_norm is None and type(weight) is not np.ndarray:  # a GPU table: its plan if any

        def full():
            return _forward(input, weight, offsets, None, norm_type, mode,
                            per_sample_weights, include_last_offset, padding_idx, out,
                            scale_grad_by_freq)

        return _FORWARDS.call(full, (input, weight, offsets, per_sample_weights, out),
                              (mode, include_last_offset, padding_idx, scale_grad_by_freq,
                               norm_type),
                              outputs=(4,), avoid=((4, 0), (4, 1), (4, 2), (4, 3)))
    return _forward(input, weight, offsets, max_norm, norm_type, mode, per_sample_weights,
                    include_last_offset, padding_idx, out, scale_grad_by_freq)


def _forward(input, weight, offsets, max_norm, norm_type, mode, per_sample_weights,
             include_last_offset, padding_idx, out, scale_grad_by_freq):
    """:func:`embedding_bag`'s ordinary path: every check, then the kernels."""
    weight = _checks.check_table(weight)
    half = _checks.is_half_dtype(weight.dtype)
    result_dtype = _FLOAT32 if half else weight.dtype
    num_rows, dim = weight.shape
    call = _bags(input, offsets, mode, per_sample_weights, include_last_offset,
                 padding_idx, scale_grad_by_freq, num_rows, result_dtype, (weight, out),
                 ("weight", "out"))
    K = call.K
    max_norm, norm_type = _checks.check_max_norm(max_norm, norm_type)
    if max_norm is not None:
        _check_clippable(weight, "weight")
    shape = (call.bags, dim)
    if out is not None:
        out = _checks.check_out(out, shape, result_dtype,
                                avoid=(weight, call.flat, call.offsets, call.weights))
    fmt = half_format(weight.dtype) if half else TableFormat.FLOAT
    table = K.contiguous(weight).view(_UINT16) if half else weight
    if max_norm is not None:
        K.renorm_used_rows_(table, call.flat, max_norm, norm_type, fmt)
    if out is None:
        out = K.empty(shape, result_dtype)
    K.pool_bags(call.flat, call.offsets, call.width, table, call.mode, call.padding,
                call.weights, out, None, int(fmt))
    return out


def embedding_bag_backward(grad_output, input, weight, offsets=None, scale_grad_by_freq=False,
                           mode="mean", sparse=False, per_sample_weights=None,
                           include_last_offset=False, padding_idx=None, *, lazy=False,
                           values_out=None):
    """Gradients of :func:`embedding_bag`: of the table and of ``per_sample_weights``.

    Deterministic: positions are grouped by row with the stable grouping of
    :func:`~numbapos.functional.embedding_backward` and each row is summed by
    one thread in input order, bit-identical for any thread count.

    Parameters
    ----------
    grad_output : ndarray, shape (B, D), float32 or float64
        Gradient of the loss with respect to the pooled result.
    input, offsets, mode, per_sample_weights, include_last_offset, padding_idx
        As given to the forward pass.
    weight : ndarray, shape (V, D)
        The table as the forward pass read it (after any ``max_norm``
        clipping): its size, the maxima of ``mode="max"`` (found again) and
        the gradient of ``per_sample_weights`` come from it.
    scale_grad_by_freq : bool, default False
        Divide each id's gradient by the number of times it occurs in the
        whole ``input``, as :func:`~numbapos.functional.embedding_backward`
        does (PyTorch 2.13's CPU bag kernel looks the count up by the wrong
        position; its documentation says this). Not with ``mode="max"``
        (PyTorch refuses it too).
    sparse : bool, default False
        Return the table's gradient as :class:`~numbapos.sparse.SparseRows`
        (every mode, unlike PyTorch's max; with ``scale_grad_by_freq`` too).
    lazy : bool, default False
        With ``sparse=True`` and plain sums (``mode="sum"``, no
        ``per_sample_weights``, no ``scale_grad_by_freq``): group the ids by
        row but leave the row sums undone (``SparseRows.summed`` is False), as
        :func:`~numbapos.functional.embedding_backward` does with ``lazy``:
        each row's gradient is then summed from ``grad_output``'s bags when
        ``values`` is first read or inside a fused optimiser update, which
        never stores it (the same bits). ``grad_output`` must not change until
        then. Ignored in the other cases (the rows come summed).
    values_out : ndarray, optional
        With ``sparse=True`` (not ``lazy``): a C-contiguous ``(M, D)`` buffer
        of the gradient's dtype and device with ``M >= input.size`` (an upper
        bound on the rows used), into whose first rows the values are written
        (the SparseRows holds a view), as for
        :func:`~numbapos.functional.embedding_backward`: a training loop reuses
        one buffer instead of page-faulting a new gradient at every step
        (``nn.EmbeddingBag`` does on the CPU).

    Returns
    -------
    grad_weight : ndarray (V, D) or SparseRows
        Padding rows get none; in max mode each column's gradient goes to the
        entry that won it (the first one on ties).
    grad_per_sample_weights : ndarray or None
        ``dot(grad_output[bag], weight[id])`` per entry (0 at padding), of
        ``input``'s shape; None when no ``per_sample_weights`` were given.

    Raises
    ------
    TypeError, ValueError, IndexError
        As :func:`embedding_bag`; ValueError for a ``grad_output`` not
        ``(B, D)`` of the result's dtype, ``scale_grad_by_freq`` with max.
    """
    if type(weight) is not np.ndarray and values_out is None:  # GPU data: its plan if any
        if lazy:
            return _lazy_backward(grad_output, input, weight, offsets, scale_grad_by_freq,
                                  mode, sparse, per_sample_weights, include_last_offset,
                                  padding_idx)

        def full():
            return _backward(grad_output, input, weight, offsets, scale_grad_by_freq, mode,
                             sparse, per_sample_weights, include_last_offset, padding_idx)

        weighted = per_sample_weights is not None
        return _BACKWARDS.call(
            full, (grad_output, input, weight, offsets, per_sample_weights),
            (mode, bool(sparse), include_last_offset, padding_idx, scale_grad_by_freq),
            unpack=_grad_arrays,
            pack=lambda made, _: _grads(made, sparse, weighted, weight.shape[0]))
    return _backward(grad_output, input, weight, offsets, scale_grad_by_freq, mode, sparse,
                     per_sample_weights, include_last_offset, padding_idx, lazy, values_out)


# A planned backward's result is made of the arrays its call allocates: the SparseRows's
# (as a planned sparse embedding_backward's) or the dense gradient, then the weights'.
def _grad_arrays(result):
    grad_weight, grad_weights = result
    made = ((grad_weight._indices, grad_weight._used, grad_weight._values)
            if isinstance(grad_weight, SparseRows) else (grad_weight,))
    return made + (() if grad_weights is None else (grad_weights,)), None


def _lazy_backward(grad_output, input, weight, offsets, scale_grad_by_freq, mode, sparse,
                   per_sample_weights, include_last_offset, padding_idx):
    """A GPU backward with ``lazy``: a plain sum's row groups through their plan (its
    result is made of the groups' arrays, as a lazy ``embedding_backward``'s), else the
    ordinary path."""

    def full():
        return _backward(grad_output, input, weight, offsets, scale_grad_by_freq, mode,
                         sparse, per_sample_weights, include_last_offset, padding_idx, True)

    if not (sparse and mode == "sum" and per_sample_weights is None and not scale_grad_by_freq
            and _device.is_c_contiguous(grad_output)):
        return full()
    num_rows = weight.shape[0]
    return _LAZY_BACKWARDS.call(
        full, (grad_output, input, weight, offsets), (include_last_offset, padding_idx),
        unpack=lambda result: _lazy_arrays(result[0]),
        pack=lambda made, _: (SparseRows._unsummed(RowGroups(*made), grad_output, False,
                                                   num_rows), None))


def _grads(made, sparse, weighted, num_rows):
    parts = 3 if sparse else 1
    grad_weight = _sparse_rows(made[:parts], num_rows) if sparse else made[0]
    return grad_weight, (made[parts] if weighted else None)


def _backward(grad_output, input, weight, offsets, scale_grad_by_freq, mode, sparse,
              per_sample_weights, include_last_offset, padding_idx, lazy=False,
              values_out=None):
    """:func:`embedding_bag_backward`'s ordinary path."""
    weight = _checks.check_table(weight)
    half = _checks.is_half_dtype(weight.dtype)
    num_rows, dim = weight.shape
    grad_output = _checks.check_float_array(grad_output, "grad_output", ndim=2)
    result_dtype = _FLOAT32 if half else weight.dtype
    call = _bags(input, offsets, mode, per_sample_weights, include_last_offset,
                 padding_idx, scale_grad_by_freq, num_rows, result_dtype,
                 (grad_output, weight), ("grad_output", "weight"))
    K = call.K
    if tuple(grad_output.shape) != (call.bags, dim) or grad_output.dtype != result_dtype:
        raise ValueError(f"grad_output: expected shape {(call.bags, dim)} and dtype "
                         f"{result_dtype} (the pooled result's), got shape "
                         f"{tuple(grad_output.shape)} and dtype {grad_output.dtype}")
    if values_out is not None:
        if not sparse or lazy:
            raise ValueError("values_out: only for sparse=True without lazy (the values of "
                             "a SparseRows)")
        values_out = _checks.check_values_buffer(
            values_out, call.flat.size, dim, result_dtype,
            avoid=(grad_output, weight, call.flat, call.offsets, call.weights))
    fmt = half_format(weight.dtype) if half else TableFormat.FLOAT
    table = K.contiguous(weight).view(_UINT16) if half else weight
    grad = K.contiguous(grad_output)
    size = call.flat.size
    bag_of = K.empty((size,), np.int64)
    sizes = K.empty((call.bags,), np.int64)
    K.bag_positions(call.flat, call.offsets, call.width, call.padding, bag_of, sizes)
    argmax = None
    if call.mode == _MAX:
        argmax = K.empty((call.bags, dim), np.int64)
        K.pool_bags(call.flat, call.offsets, call.width, table, call.mode, call.padding, None,
                    K.empty((call.bags, dim), result_dtype), argmax, int(fmt))
    groups = K.group_rows(call.flat, None if call.padding < 0 else call.padding, num_rows)
    if (lazy and sparse and call.mode == MODES["sum"] and call.weights is None
            and not scale_grad_by_freq):
        return SparseRows._unsummed(K.bags_of_groups(groups, bag_of), grad, False,
                                    num_rows), None
    if sparse:
        capacity = groups.rows.shape[0]  # the rows used (CPU) or their upper bound (GPU)
        values = (K.empty((capacity, dim), result_dtype) if values_out is None
                  else values_out[:capacity])
        K.bag_table_grad(grad, groups, bag_of, sizes, call.mode, call.weights, argmax,
                         bool(scale_grad_by_freq), values, False)
        grad_weight = SparseRows._grouped(groups, values, num_rows)
    else:
        grad_weight = K.zeros((num_rows, dim), result_dtype)
        K.bag_table_grad(grad, groups, bag_of, sizes, call.mode, call.weights, argmax,
                         bool(scale_grad_by_freq), grad_weight, True)
    grad_weights = None
    if call.weights is not None:
        grad_weights = K.empty((size,), result_dtype)
        K.bag_weights_grad(grad, call.flat, bag_of, table, call.padding, grad_weights,
                           int(fmt))
        grad_weights = _device.reshaped(grad_weights, call.shape)
    return grad_weight, grad_weights
