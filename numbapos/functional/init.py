"""The keyed initialiser: normal values that depend only on (seed, row, column)."""

from __future__ import annotations

import math

import numpy as np

from .. import _checks
from ._common import backend_for, check_range, flatten, on_backend

_UINT64_MAX = (1 << 64) - 1


def keyed_normal_(weight, seed, rows=None, mean=0.0, std=1.0):
    """Fill a 2-D ``weight`` in place with N(mean, std^2) values keyed by row.

    Element ``(j, d)`` becomes ``mean + std * z`` where ``z`` is a standard
    normal value computed from ``(seed, rows[j], d)`` alone (a SplitMix64
    counter hash and the Box-Muller transform, in float64, then cast to
    ``weight``'s dtype). Any subset of a table's rows can therefore be made on
    its own: filling ``weight`` with ``rows=[3, 7]`` gives exactly rows 3 and
    7 of a whole-table fill, which is how the shards of
    :class:`numbapos.distributed.ShardedEmbedding` make their rows.

    Parameters
    ----------
    weight : ndarray, shape (U, D), float32 or float64
        C-contiguous and writeable; overwritten.
    seed : int
        In ``[0, 2**64)``.
    rows : array_like of int, shape (U,), optional
        The table row of each row of ``weight`` (>= 0); default ``0 .. U-1``.
    mean : float, default 0
    std : float, default 1
        Finite, >= 0.

    Returns
    -------
    ndarray
        ``weight``.

    Raises
    ------
    TypeError, ValueError
        A non-float, non-2-D, strided or read-only ``weight``, a bad seed,
        ``rows`` of the wrong length, a bad ``mean`` or ``std``.
    IndexError
        A negative row.
    """
    weight = _checks.check_float_array(weight, "weight", ndim=2)
    weight = _checks.check_out(weight, tuple(weight.shape), weight.dtype, "weight")
    seed = _checks.check_int(seed, "seed", minimum=0, maximum=_UINT64_MAX)
    mean = _checks.check_real(mean, "mean")
    std = _checks.check_real(std, "std")
    if not math.isfinite(mean):
        raise ValueError(f"mean: expected a finite number, got {mean}")
    if std < 0 or not math.isfinite(std):
        raise ValueError(f"std: expected a finite number >= 0, got {std}")
    K = backend_for((weight,), ("weight",))
    count = weight.shape[0]
    if rows is None:
        flat = K.asarray(np.arange(count, dtype=np.int64))
    else:
        flat = flatten(K, on_backend(K, rows, "rows"))
        if flat.size != count:
            raise ValueError(f"rows: expected {count} rows (one per row of weight), got "
                             f"{flat.size}")
        check_range(K, flat, _checks.INT64_MAX, "rows", "the int64 limit")
    K.keyed_normal_rows_(K.contiguous(flat, np.int64), np.uint64(seed), mean, std, weight)
    return weight

