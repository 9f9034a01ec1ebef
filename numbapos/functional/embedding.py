"""Embedding lookup, its gradient, max-norm clipping and the padding mask."""

from __future__ import annotations

import functools

import numpy as np

from .. import _checks, _device
from .._args import RowGroups, TableFormat
from ..sparse import SparseRows
from ._common import (
    INDEX_DTYPES,
    SMALL_WORK,
    Planned,
    backend_for,
    check_range,
    cpu_kernels,
    flatten,
    on_backend,
)
from .half import half_format

_RENORM_WRITES = "max_norm clips the rows it looks up in place"

# The small-lookup fast path of embedding() compares dtypes by identity with
# NumPy's built-in descriptors (an equal but distinct descriptor just takes the
# full path) and is written out inside embedding() itself: an 8-token lookup
# costs about 1.15 us in all, of which a function call, or ``in`` tests against
# dtype tuples, would be 0.05-0.1 us each. Indices of any layout go to the kernel
# (which reads them in C order; a strided array compiles its own variant once).
_INT64, _INT32 = INDEX_DTYPES
_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)
_UINT16, _UINT32 = np.dtype(np.uint16), np.dtype(np.uint32)
_ndarray, _empty = np.ndarray, np.empty
_gather_checked = None  # kernels.cpu.gather_rows_checked, once loaded
_LOOKUPS = Planned("embedding")
_DENSE_BACKWARDS = Planned("embedding_backward")
_SPARSE_BACKWARDS = Planned("embedding_backward, sparse")
_LAZY_BACKWARDS = Planned("embedding_backward, sparse and lazy")


# A planned sparse backward's result is made of the arrays the grouping allocates (its
# rows and their count; all of its groups when lazy) and the summed values: these are
# what a replay makes anew (see PlanCache.call: unpack gives them and a layout).
def _sparse_arrays(result):
    return (result._indices, result._used, result._values), None


def _sparse_rows(made, num_rows):
    rows, used, values = made
    return SparseRows._grouped(RowGroups(rows, None, None, None, used), values, num_rows)


def _lazy_arrays(result):
    return tuple(result._pending[0]), None


# RowGroups(*arrays) without the Python call of a NamedTuple's __new__.
_row_groups = functools.partial(tuple.__new__, RowGroups)


def _sparse_arrays_into(result):
    return (result._indices, result._used), None


def _sparse_rows_into(made, values_out, num_rows):
    rows, used = made
    return SparseRows._grouped(RowGroups(rows, None, None, None, used),
                               values_out[:rows.shape[0]], num_rows)


def embedding_renorm_(weight, indices, max_norm, norm_type=2.0):
    """Clip, in place, the rows of ``weight`` referenced by ``indices`` to a maximum norm.

    Every distinct row whose ``norm_type``-norm exceeds ``max_norm`` is multiplied
    by ``max_norm / (norm + 1e-7)``, once however often it repeats in
    ``indices`` (PyTorch's ``torch.embedding_renorm_``).

    Parameters
    ----------
    weight : ndarray, shape (V, D), float32 or float64
        Embedding table, modified in place.
    indices : array_like of int
        Rows to clip, any shape; every value must lie in ``[0, V)``.
    max_norm : float
        Largest norm a row may keep (> 0).
    norm_type : float, default 2.0
        The p of the p-norm: any positive float, or ``inf``.

    Returns
    -------
    ndarray
        ``weight`` itself.

    Raises
    ------
    TypeError
        Non-float ``weight`` or non-integer ``indices``.
    ValueError
        ``weight`` not 2-D or read-only, or ``max_norm`` / ``norm_type`` not
        positive.
    IndexError
        An index outside ``[0, V)``; ``weight`` is then left untouched.
    """
    weight = _checks.check_weight(weight)
    K = backend_for((weight,), ("weight",))
    indices = on_backend(K, indices)
    if max_norm is None:
        raise TypeError("max_norm: expected a positive number, got None")
    max_norm, norm_type = _checks.check_max_norm(max_norm, norm_type)
    _checks.check_writeable(weight, "weight", _RENORM_WRITES)
    flat = flatten(K, indices)
    check_range(K, flat, weight.shape[0], checked_by_kernel=True)
    K.renorm_used_rows_(weight, flat, max_norm, norm_type)
    return weight


def embedding(indices, weight, padding_idx=None, max_norm=None, norm_type=2.0, out=None,
              out_dtype=None):
    """Look up rows of an embedding table (PyTorch's ``F.embedding``).

    Parameters
    ----------
    indices : array_like of int
        Row numbers, any shape (0-d arrays and NumPy integer scalars included),
        int32 or int64 (other integer dtypes are converted). Each must lie in
        ``[0, V)``; negative indices are not wrapped.
    weight : ndarray, shape (V, D), float32, float64, bfloat16 or float16
        The table. May be non-contiguous. A bfloat16 (``ml_dtypes.bfloat16``)
        or float16 table is read as its bits and converted exactly (see
        :mod:`numbapos.functional.half`).
    padding_idx : int, optional
        Row that marks padding; may be negative (wrapped by ``V``). The forward
        pass returns the row as stored; it only matters for the gradient.
    max_norm : float, optional
        If given, rows referenced by ``indices`` whose norm exceeds it are first
        clipped in place (see :func:`embedding_renorm_`); the result holds the
        clipped rows.
    norm_type : float, default 2.0
        The p of the p-norm for ``max_norm``: any positive float, or ``inf``.
        For a 16-bit table the norm is computed in float32 / float64 and the
        clipped row is written back rounded to nearest even.
    out : ndarray, optional
        C-contiguous buffer of shape ``indices.shape + (D,)`` and the result's
        dtype to write the result into.
    out_dtype : dtype, optional
        The result's dtype: ``weight``'s dtype for float32 / float64 tables
        (the only one allowed); for a bfloat16 / float16 table float32 (the
        default, exact) or the table's own dtype (a plain row copy, half the
        bytes written).

    Returns
    -------
    ndarray, shape ``indices.shape + (D,)``
        ``weight[indices]``.

    Raises
    ------
    TypeError
        Bool or float indices, non-float weight, ``out`` not an array, an
        ``out_dtype`` the table cannot look up into.
    ValueError
        ``weight`` not 2-D (or read-only with ``max_norm``), ``padding_idx``
        outside ``[-V, V)``, ``max_norm`` or ``norm_type`` not positive, ``out``
        of the wrong shape or dtype.
    IndexError
        An index outside ``[0, V)``, named in the message. Nothing has been
        modified when any error is raised.
    """
    if (type(indices) is _ndarray and type(weight) is _ndarray and out is None
            and max_norm is None and padding_idx is None and out_dtype is None):
        index_dtype, dtype = indices.dtype, weight.dtype
        if ((index_dtype is _INT64 or index_dtype is _INT32)
                and (dtype is _FLOAT32 or dtype is _FLOAT64) and weight.ndim == 2):
            dim = weight.shape[1]
            if indices.size * dim <= SMALL_WORK:
                result = _empty(indices.shape + (dim,), dtype)
                if (_gather_checked or _load_gather_checked())(indices, weight, result) < 0:
                    return result
    if max_norm is None and type(weight) is not _ndarray:  # a GPU table: its plan if any

        def full():
            return _lookup(indices, weight, padding_idx, None, norm_type, out, out_dtype)

        return _LOOKUPS.call(full, (indices, weight, out), (padding_idx, norm_type, out_dtype),
                             outputs=(2,), avoid=((2, 0), (2, 1)))
    return _lookup(indices, weight, padding_idx, max_norm, norm_type, out, out_dtype)


_LOOKUPS_KEPT = Planned("embedding, keeping its indices")


def _embedding_kept(indices, weight, padding_idx, norm_type, out, out_dtype):
    """``(embedding(...), a copy of indices)`` for ``nn.Embedding``'s recorded forward on a
    CUDA table without ``max_norm`` (indices a CUDA int32 / int64 array): the lookup kernel
    writes the copy as it reads the indices, in the output's allocation (planned)."""

    def full():
        return _lookup(indices, weight, padding_idx, None, norm_type, out, out_dtype, True)

    return _LOOKUPS_KEPT.call(full, (indices, weight, out, None),
                              (padding_idx, norm_type, out_dtype), outputs=(2, 3),
                              avoid=((2, 0), (2, 1)))


def _lookup(indices, weight, padding_idx, max_norm, norm_type, out, out_dtype, keep=False):
    """:func:`embedding`'s ordinary path: every check, then the kernels. With ``keep`` it
    returns ``(result, a copy of the flat indices of indices' shape)`` (see
    :func:`_embedding_kept`)."""
    weight = _checks.check_table(weight)
    K = backend_for((weight, out), ("weight", "out"))
    half = _checks.is_half_dtype(weight.dtype)
    out_dtype = _lookup_dtype(weight.dtype, out_dtype, half)
    indices = on_backend(K, indices)
    num_rows, dim = weight.shape
    _checks.check_padding_idx(padding_idx, num_rows)
    max_norm, norm_type = _checks.check_max_norm(max_norm, norm_type)
    if max_norm is not None:
        _check_clippable(weight, "weight")
    shape = tuple(indices.shape) + (dim,)
    if out is not None:
        out = _checks.check_out(out, shape, out_dtype, avoid=(weight, indices))
    flat = flatten(K, indices)
    check_range(K, flat, num_rows, checked_by_kernel=True)

    # A 16-bit table reaches the kernels as its uint16 bits with its format, a float32
    # result as its uint32 bits (see numbapos.functional.half).
    fmt = half_format(weight.dtype) if half else TableFormat.FLOAT
    table = K.contiguous(weight).view(_UINT16) if half else weight
    if max_norm is not None:
        K.renorm_used_rows_(table, flat, max_norm, norm_type, fmt)
    kept = None
    if keep:
        out, kept = _with_room(K, out, shape, out_dtype, flat.dtype)
    elif out is None:
        out = K.empty(shape, out_dtype)
    rows = _device.reshaped(out, (flat.size, dim))
    if half:
        rows = rows.view(_UINT32 if out_dtype == _FLOAT32 else _UINT16)
    K.gather_rows(flat, table, rows, fmt, snapshot=kept)
    return (out, _device.reshaped(kept, tuple(indices.shape))) if keep else out


def _with_room(K, out, shape, dtype, index_dtype):
    """``(out, a flat array of index_dtype for the indices)``: one allocation for both when
    ``out`` is None (the indices 16-byte aligned after the rows)."""
    count = int(np.prod(shape[:-1]))
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if out is not None or nbytes == 0:  # (views of an empty device array: see blocks.py)
        return (K.empty(shape, dtype) if out is None else out), K.empty((count,), index_dtype)
    start = -(-nbytes // 16) * 16
    block = K.empty((start + count * np.dtype(index_dtype).itemsize,), np.uint8)
    return (block[:nbytes].view(dtype).reshape(shape),
            block[start:].view(index_dtype))


def _check_clippable(table, name, why=_RENORM_WRITES):
    """A table that ``max_norm`` may clip in place: writeable, and C-contiguous in 16 bits."""
    _checks.check_writeable(table, name, why)
    if _checks.is_half_dtype(table.dtype) and not _device.is_c_contiguous(table):
        raise ValueError(f"{name}: max_norm clips rows in place and needs a C-contiguous "
                         f"16-bit table")


def _lookup_dtype(table, out_dtype, half):
    """The result's dtype: ``out_dtype`` checked (default: float32 for a 16-bit table, else
    the table's dtype); a 16-bit table also looks up into its own dtype."""
    if out_dtype is None:
        return _FLOAT32 if half else table
    out_dtype = _checks.check_table_dtype(out_dtype, "out_dtype")
    if out_dtype != table and not (half and out_dtype == _FLOAT32):
        raise TypeError(f"out_dtype: a {table} table looks up into "
                        f"{'float32 or ' if half else ''}{table}, got {out_dtype}")
    return out_dtype


def _load_gather_checked():
    global _gather_checked
    _gather_checked = cpu_kernels().gather_rows_checked
    return _gather_checked


def embedding_backward(grad_output, indices, num_embeddings, padding_idx=None,
                       scale_grad_by_freq=False, sparse=False, *, lazy=False, values_out=None):
    """Gradient of :func:`embedding` with respect to the table.

    The scatter-add is deterministic: positions are grouped by row with a stable
    radix sort, each row is summed by one thread in input order, so results
    are bit-identical for any thread count and on every run.

    Parameters
    ----------
    grad_output : ndarray, shape ``indices.shape + (D,)``, float32 or float64
        Gradient of the loss with respect to the lookup's output.
    indices : array_like of int
        The indices of the forward pass; each in ``[0, num_embeddings)``.
    num_embeddings : int
        Number of rows V of the table.
    padding_idx : int, optional
        Row that receives no gradient; may be negative (wrapped by V).
    scale_grad_by_freq : bool, default False
        Divide each contribution by the number of times its index occurs in
        ``indices`` (padding occurrences are counted, as in PyTorch). Unlike
        PyTorch this also works with ``sparse=True``.
    sparse : bool, default False
        Return a :class:`~numbapos.sparse.SparseRows` instead of a dense array.
        Costs O(indices + rows used), whatever ``num_embeddings`` is.
    lazy : bool, default False
        With ``sparse=True``, group the positions by row but leave the row
        sums undone (``SparseRows.summed`` is False): they are made from
        ``grad_output`` when ``values`` is first read, or, by
        :func:`sparse_sgd_`, inside the update itself, in one pass that never
        stores the ``(rows, D)`` gradient. ``grad_output`` must not change
        until then. :meth:`numbapos.optim.SGD.fuse_with_backward` uses this.
    values_out : ndarray, optional
        With ``sparse=True`` (not ``lazy``): a C-contiguous ``(M, D)`` buffer
        of ``grad_output``'s dtype and device with ``M >= indices.size`` (an
        upper bound on the rows used). The values are written into its first
        rows and the SparseRows holds a view of them, so a training loop can
        reuse one buffer instead of allocating (and page-faulting) a new
        gradient at every step; ``nn.Embedding`` does.

    Returns
    -------
    ndarray of shape (V, D) or SparseRows
        Dense gradient, or the rows that occur (padding left out, duplicates
        summed), unique and sorted.

    Raises
    ------
    TypeError, ValueError, IndexError
        As for :func:`embedding`; ValueError when ``grad_output``'s shape is not
        ``indices.shape + (D,)``.
    """
    if type(grad_output) is not _ndarray and sparse and lazy and values_out is None:

        def full_lazy():
            return _backward(grad_output, indices, num_embeddings, padding_idx,
                             scale_grad_by_freq, True, True, None)

        def lazy_rows(made, _):
            grad = _device.reshaped(grad_output, (indices.size, grad_output.shape[-1]))
            return SparseRows._unsummed(_row_groups(made), grad, scale_grad_by_freq,
                                        num_embeddings)

        return _LAZY_BACKWARDS.call(
            full_lazy, (grad_output, indices), (num_embeddings, padding_idx, scale_grad_by_freq),
            unpack=_lazy_arrays, pack=lazy_rows)
    if type(grad_output) is not _ndarray and not lazy:  # a GPU gradient: its plan if any

        def full():
            return _backward(grad_output, indices, num_embeddings, padding_idx,
                             scale_grad_by_freq, sparse, False, values_out)

        options = (num_embeddings, padding_idx, scale_grad_by_freq, sparse)
        if not sparse:
            if values_out is None:
                return _DENSE_BACKWARDS.call(full, (grad_output, indices, None), options,
                                             outputs=(2,))
        elif values_out is None:
            return _SPARSE_BACKWARDS.call(full, (grad_output, indices), options,
                                          unpack=_sparse_arrays,
                                          pack=lambda made, _: _sparse_rows(made,
                                                                            num_embeddings))
        else:
            return _SPARSE_BACKWARDS.call(
                full, (grad_output, indices, values_out), options, avoid=((2, 0), (2, 1)),
                unpack=_sparse_arrays_into,
                pack=lambda made, _: _sparse_rows_into(made, values_out, num_embeddings))
    return _backward(grad_output, indices, num_embeddings, padding_idx, scale_grad_by_freq,
                     sparse, lazy, values_out)


def _backward(grad_output, indices, num_embeddings, padding_idx, scale_grad_by_freq, sparse,
              lazy, values_out):
    """:func:`embedding_backward`'s ordinary path."""
    num_rows = _checks.check_int(num_embeddings, "num_embeddings", minimum=0)
    grad_output = _checks.check_float_array(grad_output, "grad_output")
    K = backend_for((grad_output,), ("grad_output",))
    indices = on_backend(K, indices)
    if (grad_output.ndim != indices.ndim + 1
            or tuple(grad_output.shape[:-1]) != tuple(indices.shape)):
        raise ValueError(
            f"grad_output: expected shape indices.shape + (D,) = "
            f"{tuple(indices.shape) + ('D',)}, got {tuple(grad_output.shape)}"
        )
    padding_idx = _checks.check_padding_idx(padding_idx, num_rows)
    if values_out is not None:
        if not sparse or lazy:
            raise ValueError("values_out: only for sparse=True without lazy (the values of "
                             "a SparseRows)")
        values_out = _checks.check_values_buffer(values_out, indices.size,
                                                 grad_output.shape[-1], grad_output.dtype,
                                                 avoid=(grad_output, indices))
    flat = flatten(K, indices)
    check_range(K, flat, num_rows, checked_by_kernel=True)
    return _scatter(K, grad_output, flat, num_rows, padding_idx, bool(scale_grad_by_freq),
                    bool(sparse), lazy=bool(lazy), values_out=values_out)


def _scatter(K, grad_output, flat, num_rows, padding_idx, scale_grad_by_freq, sparse,
             lazy=False, values_out=None):
    """The table gradient of a lookup, on validated inputs (also used by the blocks)."""
    dim = grad_output.shape[grad_output.ndim - 1]
    grad = _device.reshaped(K.contiguous(grad_output), (flat.size, dim))
    if sparse:
        groups = K.group_rows(flat, padding_idx, num_rows)
        if lazy:
            return SparseRows._unsummed(groups, grad, scale_grad_by_freq, num_rows)
        capacity = groups.rows.shape[0]  # the rows used (CPU) or their upper bound (GPU)
        values = (K.empty((capacity, dim), grad.dtype) if values_out is None
                  else values_out[:capacity])
        K.sum_row_groups(grad, groups, scale_grad_by_freq, values)
        return SparseRows._grouped(groups, values, num_rows)
    out = K.zeros((num_rows, dim), grad.dtype)
    K.scatter_rows(grad, flat, padding_idx, scale_grad_by_freq, out)
    return out


def padding_mask(indices, padding_idx, num_embeddings=None):
    """Boolean mask that is True at real tokens and False at padding.

    Keras' ``mask_zero`` generalised to any padding id.

    Parameters
    ----------
    indices : array_like of int
        Token ids, any shape.
    padding_idx : int
        The padding id. A negative id is wrapped by ``num_embeddings``, which
        must then be given.
    num_embeddings : int, optional
        Vocabulary size, only needed to wrap a negative ``padding_idx``.

    Returns
    -------
    ndarray of bool, shape ``indices.shape``
    """
    indices = _checks.check_index_array(indices)
    K = backend_for((indices,), ("indices",))
    if num_embeddings is None:
        padding_idx = _checks.check_int64(padding_idx, "padding_idx")
        if padding_idx < 0:
            raise ValueError(
                f"padding_idx: {padding_idx} is negative; pass num_embeddings to wrap it"
            )
    else:
        num_rows = _checks.check_int(num_embeddings, "num_embeddings", minimum=1)
        padding_idx = _checks.check_padding_idx(padding_idx, num_rows)
    mask = K.empty(tuple(indices.shape), np.bool_)
    if indices.size:
        K.not_equal_mask(flatten(K, indices), padding_idx, mask.reshape(indices.size))
    return mask
