"""The steps of :class:`numbapos.SparseRows`: sum a lookup's rows, add rows in, merge two.

A row-sparse gradient holds the rows a lookup used and their values. Its
methods (``materialize``, ``add_to``, ``+``) run these on the gradient's
device, on arrays the gradient holds (validated when it was made, or by the
grouping that made them): nothing here checks them again, and on the GPU
nothing is read back (row counts may stay on the device: ``used`` is an int,
or a device array whose first entry is the count, rows past it padding).
"""

from __future__ import annotations

import numpy as np

from .. import _device

__all__ = ["add_rows_", "merge_rows", "sum_row_groups"]


def sum_row_groups(groups, grad, scale_grad_by_freq: bool):
    """Each row's gradient: the sum of the positions that looked it up, in input order.

    Parameters
    ----------
    groups : numbapos._args.RowGroups
        The positions of a lookup grouped by row (``rows``, ``starts``,
        ``counts``, ``order``, ``used``), on ``grad``'s device.
    grad : ndarray or CUDA array, shape (N, D)
        The lookup's gradient, one row per position.
    scale_grad_by_freq : bool
        Divide each term by the number of positions of its row.

    Returns
    -------
    ndarray or CUDA array, shape (len(groups.rows), D)
        Row ``j`` is the sum for row ``groups.rows[j]`` (on the GPU rows past
        the used count are padding), in ``grad``'s dtype: the bits of a
        dense backward's rows.
    """
    K = _device.backend(grad)
    values = K.empty((groups.rows.shape[0], grad.shape[1]), grad.dtype)
    K.sum_row_groups(grad, groups, scale_grad_by_freq, values)
    return values


def add_rows_(dense, rows, values, used):
    """``dense[rows[j]] += values[j]`` for the ``used`` first (unique) rows, in place.

    Parameters
    ----------
    dense : ndarray or CUDA array, shape (V, D)
        C-contiguous; modified in place.
    rows : array of int, shape (U,)
        Unique rows of ``dense`` (made int64 and C-contiguous when they are not).
    values : ndarray or CUDA array, shape (U, D)
        On ``dense``'s device (made C-contiguous when it is not).
    used : int or CUDA array
        How many of ``rows`` are real.

    Returns
    -------
    ndarray or CUDA array
        ``dense``.

    Raises
    ------
    TypeError
        ``dense`` and ``values`` on different devices.
    """
    K = _device.backend(dense, values)
    K.add_rows_(dense, K.contiguous(rows, np.int64), K.contiguous(values), used)
    return dense


def merge_rows(rows_a, values_a, used_a, rows_b, values_b, used_b, num_rows: int):
    """The sum of two row-sparse gradients of one ``(num_rows, D)`` table, grouped by row.

    The real rows of both are put one after the other and grouped by row on
    their device, as a backward groups positions; each row's value is the
    first's plus the second's, and a row in one only keeps its bits (-0.0
    included, as PyTorch's ``coalesce`` of the concatenation does).

    Parameters
    ----------
    rows_a, rows_b : array of int
        Each unique and sorted (on ``values_a``'s device).
    values_a, values_b : ndarray or CUDA array, shape (len(rows), D)
        The sum has the dtype of their result type.
    used_a, used_b : int or CUDA array
        How many of each one's rows are real.
    num_rows : int
        Rows of the table.

    Returns
    -------
    groups : numbapos._args.RowGroups
        The grouping of the concatenated rows (``groups.rows``: the sum's rows).
    summed : ndarray or CUDA array, shape (len(groups.rows), D)
        The rows' sums.
    """
    K = _device.backend(values_a)
    dtype = np.result_type(values_a.dtype, values_b.dtype)
    size, dim = rows_a.shape[0] + rows_b.shape[0], values_a.shape[1]
    rows = K.empty((size,), np.int64)
    values = K.empty((size, dim), dtype)
    # Empty slots get row num_rows: padding of a one-row-larger table, grouped nowhere.
    K.concat_rows(K.contiguous(rows_a, np.int64), K.contiguous(values_a, dtype), used_a,
                  K.contiguous(rows_b, np.int64), K.contiguous(values_b, dtype), used_b,
                  num_rows, rows, values)
    groups = K.group_rows(rows, num_rows, num_rows + 1)
    summed = K.empty((groups.rows.shape[0], dim), dtype)
    K.sum_row_groups(values, groups, False, summed)
    return groups, summed
