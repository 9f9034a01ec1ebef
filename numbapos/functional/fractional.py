"""Learned position tables read at fractional positions: position interpolation on the fly.

A float position ``p`` reads ``(1 - w) * P[floor(p)] + w * P[floor(p) + 1]`` with
``w = p - floor(p)``; its gradient goes to both rows, weighted the same way and
summed deterministically. :func:`numbapos.functional.add_positional` and
:func:`~numbapos.functional.add_positional_backward` take this path when
``position_ids`` has a float dtype; an integer-valued float position reads
exactly its row.

On the GPU the rows and weights are computed on the device and a position
out of range is a deferred error (an ``IndexError`` naming ``position_ids``
and ``max_len`` at the next synchronising call, its value rounded away from
the range to an integer); nothing is read back.
"""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from .embedding import _scatter


def is_fractional(position_ids) -> bool:
    """Whether ``position_ids`` are floats (an array or a list of float dtype)."""
    if position_ids is None or isinstance(position_ids, (bool, int, np.integer)):
        return False
    dtype = getattr(position_ids, "dtype", None)
    if dtype is None:
        try:
            dtype = np.asarray(position_ids).dtype
        except (TypeError, ValueError):
            return False
    return np.dtype(dtype).kind == "f"


def positions_copy(position_ids):
    """A copy of fractional ``position_ids`` (what a module records): a device copy of
    CUDA positions (nothing read back), a host float64 copy of anything else."""
    if _device.is_cuda_array(position_ids):
        return _device.copy(position_ids)
    return np.array(position_ids, dtype=np.float64)


def _plan(position_ids, x_shape, num_positions):
    """Validated host ``(rows, i0, i1, w0, w1)``: flat index and weight arrays of the (P, L)
    positions (P = 1, or the batch size N of a 3-D ``x``)."""
    ids = np.asarray(_device.to_host(position_ids), dtype=np.float64)  # CUDA ids: a sync
    seq_len = x_shape[len(x_shape) - 2]
    allowed = [(seq_len,)]
    if len(x_shape) == 3:
        allowed += [(1, seq_len), (x_shape[0], seq_len)]
    if ids.shape not in allowed:
        want = " or ".join(str(s) for s in dict.fromkeys(allowed))
        raise ValueError(f"position_ids: expected shape {want} for x of shape "
                         f"{tuple(x_shape)}, got {ids.shape}")
    flat = ids.reshape(-1)
    bad = ~((flat >= 0) & (flat <= num_positions - 1))  # NaN included
    if bad.any():
        where = int(np.argmax(bad))
        raise IndexError(f"position_ids: fractional position {flat[where]!r} (at flat position "
                         f"{where}) is out of range for max_len={num_positions}; valid "
                         f"positions are 0 <= p <= {num_positions - 1}")
    i0 = np.minimum(np.floor(flat).astype(np.int64), num_positions - 1)
    w1 = flat - i0
    i1 = np.minimum(i0 + 1, num_positions - 1)
    rows = ids.shape[0] if ids.ndim == 2 else 1
    return rows, i0, i1, 1.0 - w1, w1


def _device_plan(K, position_ids, x_shape, num_positions, batch=None):
    """``(rows, total, index, weight)`` on the GPU, nothing read back: ``index`` /
    ``weight`` hold ``total`` first-row entries then ``total`` second-row entries, the
    (rows, L) positions tiled over ``batch`` rows (``total = batch * L``; default
    ``rows``). Bad positions are deferred errors."""
    if _device.is_cuda_array(position_ids):
        ids = _checks.check_float_array(position_ids, "position_ids")
    else:
        ids = K.asarray(np.asarray(position_ids, dtype=np.float64))
    seq_len = x_shape[len(x_shape) - 2]
    allowed = [(seq_len,)]
    if len(x_shape) == 3:
        allowed += [(1, seq_len), (x_shape[0], seq_len)]
    if tuple(ids.shape) not in allowed:
        want = " or ".join(str(s) for s in dict.fromkeys(allowed))
        raise ValueError(f"position_ids: expected shape {want} for x of shape "
                         f"{tuple(x_shape)}, got {tuple(ids.shape)}")
    rows = ids.shape[0] if ids.ndim == 2 else 1
    total = (rows if batch is None else batch) * seq_len
    index = K.empty((2 * total,), np.int64)
    weight = K.empty((2 * total,), np.float64)
    if total:
        K.fractional_rows(K.contiguous(ids).reshape(ids.size), num_positions, index[:total],
                          index[total:], weight[:total], weight[total:])
    return rows, total, index, weight


def add_fractional(K, x3, table, position_ids, x_shape, out3):
    """``out = x + blended rows`` for validated ``x3`` / ``out3`` of shape (N, L, D)."""
    seq_len = x3.shape[1]
    if K.DEVICE != "cpu":
        rows, total, index, weight = _device_plan(K, position_ids, x_shape, table.shape[0])
        i0, i1, w0, w1 = index[:total], index[total:], weight[:total], weight[total:]
        flat = K.empty((total,), np.int64)
        K.tile_ids(None, 0, total, flat)  # 0 .. total - 1, made on the device
        flat = flat.reshape(rows, seq_len)
    else:
        rows, i0, i1, w0, w1 = _plan(position_ids, x_shape, table.shape[0])
        flat = np.arange(rows * seq_len, dtype=np.int64).reshape(rows, seq_len)
    blended = K.empty((rows * seq_len, table.shape[1]), table.dtype)
    K.blend_rows(table, i0, i1, w0, w1, blended)
    K.add_gathered_rows(x3, blended, flat, out3)


def add_fractional_backward(K, grad3, num_positions, position_ids, x_shape):
    """The table gradient: ``w0 * g`` into row ``i0``, ``w1 * g`` into row ``i1``, summed in
    input order (all first-row terms, then all second-row terms)."""
    batch, seq_len, dim = (int(n) for n in grad3.shape)
    total = batch * seq_len
    if K.DEVICE != "cpu":
        _, _, flat, weight = _device_plan(K, position_ids, x_shape, num_positions, batch)
        w0, w1 = weight[:total], weight[total:]
    else:
        rows, i0, i1, w0, w1 = _plan(position_ids, x_shape, num_positions)
        if rows != batch:  # one row of positions shared by the batch
            i0, i1, w0, w1 = (np.tile(a, batch) for a in (i0, i1, w0, w1))
        flat = np.concatenate([i0, i1])
    grad = K.contiguous(grad3).reshape(total, dim)
    weighted = K.empty((2 * total, dim), grad.dtype)
    K.scale_rows(grad, w0, weighted[:total])
    K.scale_rows(grad, w1, weighted[total:])
    return _scatter(K, weighted, flat, num_positions, None, False, False)
