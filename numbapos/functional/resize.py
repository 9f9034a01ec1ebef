"""Learned position tables past ``max_len``: a table resized to a new number of rows."""

from __future__ import annotations

import numpy as np

from .. import _checks
from ._common import backend_for

RESIZE_MODES = ("linear", "copy", "repeat_last", "init")


def resize_plan(old_len: int, new_len: int, mode: str, num_prefix_rows: int = 0):
    """``(index0, index1, weight0, weight1)``: new row ``n`` is ``w0 * old[i0] + w1 * old[i1]``.

    Host arrays (int64, float64) of length ``new_len``; rows ``n >= old_len``
    of mode ``"init"`` are marked with ``index0 = -1`` (filled by the caller).
    """
    n = np.arange(new_len, dtype=np.int64)
    index0 = n.copy()
    weight1 = np.zeros(new_len)
    prefix = num_prefix_rows
    if mode == "linear":
        # torch.nn.functional.interpolate(mode="linear", align_corners=False) of the rows
        # past the prefix: source coordinate (n + 1/2) * scale - 1/2, clamped at 0.
        src_len, dst_len = old_len - prefix, new_len - prefix
        m = np.arange(dst_len, dtype=np.float64)
        src = np.maximum((m + 0.5) * (src_len / dst_len) - 0.5, 0.0)
        i0 = np.minimum(np.floor(src).astype(np.int64), src_len - 1)
        lam = src - i0
        lam[i0 == src_len - 1] = 0.0
        index0[prefix:] = i0 + prefix
        weight1[prefix:] = lam
    elif mode == "copy":
        index0[prefix:] = prefix + (n[prefix:] - prefix) % (old_len - prefix)
    elif mode == "repeat_last":
        index0 = np.minimum(n, old_len - 1)
    else:  # init
        index0[old_len:] = -1
    index1 = np.minimum(index0 + 1, old_len - 1)
    return index0, np.maximum(index1, 0), 1.0 - weight1, weight1


def resize_pos_table(table, new_len, *, mode="linear", num_prefix_rows=0, fill=None):
    """A position table resized to ``new_len`` rows (a new array; ``table`` is unchanged).

    - ``"linear"``: the rows past the prefix resampled by linear interpolation,
      equal to ``torch.nn.functional.interpolate(t.T[None], size=new_len - P,
      mode="linear", align_corners=False)`` (position interpolation of absolute
      tables, as for ViT / DeiT position grids in 1-D).
    - ``"copy"``: the rows past the prefix repeated (Longformer's conversion of
      RoBERTa's 512 positions to 4096: row ``P + (n - P) % (M - P)``).
    - ``"repeat_last"``: new rows copy the last row.
    - ``"init"``: old rows kept, new rows taken from ``fill`` (a module passes
      rows made by its own initialiser).

    Shrinking (``new_len < M``) keeps the first rows in every mode but
    ``"linear"``, which resamples.

    Parameters
    ----------
    table : ndarray, shape (M, D), float32 or float64
    new_len : int
        Rows of the result (> ``num_prefix_rows``).
    mode : {"linear", "copy", "repeat_last", "init"}, default "linear"
    num_prefix_rows : int, default 0
        Leading rows ``P`` kept as they are and left out of the resampling
        (RoBERTa's two offset rows, a class token's row); ``P < M``.
    fill : ndarray, shape (new_len - M, D), optional
        The new rows of mode ``"init"`` (required there when it grows the table).

    Returns
    -------
    ndarray, shape (new_len, D), dtype and device of ``table``

    Raises
    ------
    TypeError
        Non-float ``table`` or ``fill``, a non-integer ``new_len`` /
        ``num_prefix_rows``.
    ValueError
        An unknown ``mode``, ``new_len <= P``, ``P >= M``, ``fill`` missing,
        given for another mode, or of the wrong shape.

    Examples
    --------
    >>> import numpy as np
    >>> import numbapos.functional as F
    >>> table = np.array([[0.0], [1.0], [2.0]])
    >>> F.resize_pos_table(table, 6)[:, 0]
    array([0.  , 0.25, 0.75, 1.25, 1.75, 2.  ])
    >>> F.resize_pos_table(table, 5, mode="copy", num_prefix_rows=1)[:, 0]
    array([0., 1., 2., 1., 2.])
    """
    table = _checks.check_float_array(table, "table", ndim=2)
    K = backend_for((table, fill), ("table", "fill"))
    old_len, dim = (int(n) for n in table.shape)
    if not isinstance(mode, str) or mode not in RESIZE_MODES:
        raise ValueError(f"mode: expected one of {list(RESIZE_MODES)}, got "
                         f"{_checks.quote(mode)}")
    prefix = _checks.check_int(num_prefix_rows, "num_prefix_rows", minimum=0)
    if prefix >= old_len:
        raise ValueError(f"num_prefix_rows: expected fewer than the table's {old_len} rows, "
                         f"got {prefix}")
    new_len = _checks.check_int(new_len, "new_len", minimum=prefix + 1)
    grown = max(new_len - old_len, 0)
    if mode == "init" and grown:
        if fill is None:
            raise ValueError(f"fill: mode 'init' needs the {grown} new rows, shape "
                             f"({grown}, {dim}); got None")
        fill = _checks.check_float_like(fill, "fill", (grown, dim), table.dtype,
                                        f"the {grown} new rows", "the table's dtype")
    elif fill is not None:
        raise ValueError("fill: only mode 'init' growing the table takes new rows")
    index0, index1, weight0, weight1 = resize_plan(old_len, new_len, mode, prefix)
    out = K.empty((new_len, dim), table.dtype)
    kept = new_len - grown if mode == "init" else new_len
    K.blend_rows(K.contiguous(table), K.asarray(index0[:kept]), K.asarray(index1[:kept]),
                 K.asarray(weight0[:kept]), K.asarray(weight1[:kept]), out[:kept])
    if kept < new_len:
        rows = np.arange(grown, dtype=np.int64)
        K.blend_rows(K.contiguous(fill), K.asarray(rows), K.asarray(rows),
                     K.asarray(np.ones(grown)), K.asarray(np.zeros(grown)), out[kept:])
    return out
