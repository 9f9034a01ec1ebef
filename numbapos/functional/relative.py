"""Relative positions: T5's bucketed attention bias and DeBERTa's log-bucketed positions.

T5 (and mT5, UMT5, LongT5, Pix2Struct, UDOP, the T5 text encoders of Flux, SD3
and Wan) adds to the attention scores a learned bias per head and *bucket* of
the relative position ``key - query``: :func:`relative_position_bucket` is
transformers' ``T5Attention._relative_position_bucket``, float32 steps
included, and :func:`relative_position_bias` its ``compute_bias``.
DeBERTa-v2 / v3 bucket ``query - key`` logarithmically:
:func:`log_bucket_position` and :func:`relative_positions` are transformers'
``make_log_bucket_position`` and ``build_relative_position``.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _checks, _device
from ._common import backend_for

_MAX = 1 << 62  # lengths, offsets and distances: k - (Lq - 1) - offset stays in int64


def _check_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected a bool, got {_checks.quote(value)}")
    return bool(value)


def _t5_options(bidirectional, num_buckets, max_distance):
    """``(bidirectional as 0 / 1, num_buckets, max_distance, float32 log(max_distance /
    max_exact))`` checked: each direction needs an exact bucket and max_distance past them."""
    bidirectional = _check_bool(bidirectional, "bidirectional")
    least = 4 if bidirectional else 2
    num_buckets = _checks.check_int(num_buckets, "num_buckets", minimum=1, maximum=_MAX)
    if num_buckets < least:
        raise ValueError(f"num_buckets: expected an integer >= {least} with bidirectional="
                         f"{bidirectional} (each direction needs exact and log buckets), got "
                         f"{num_buckets}")
    max_exact = (num_buckets // 2 if bidirectional else num_buckets) // 2
    max_distance = _checks.check_int(max_distance, "max_distance", minimum=1, maximum=_MAX)
    if max_distance <= max_exact:
        raise ValueError(f"max_distance: expected an integer > {max_exact} (the exact buckets "
                         f"per direction of {num_buckets} buckets), got {max_distance}")
    log_ratio = np.float32(math.log(max_distance / max_exact))  # as transformers' Python float
    return int(bidirectional), num_buckets, max_distance, log_ratio


def _check_length(value, name):
    return _checks.check_int(value, name, minimum=0, maximum=_MAX)


def _flat_indices(relative, name):
    """The integer array, its backend and a flat C-contiguous view for the kernels."""
    relative = _checks.check_index_array(relative, name)
    K = backend_for((relative,), (name,))
    flat = _device.reshaped(K.contiguous(relative), (relative.size,))
    return K, relative, flat


def relative_position_bucket(relative_position, bidirectional=True, num_buckets=32,
                             max_distance=128):
    """T5's bucket of each relative position ``key - query``.

    Equal to transformers' ``T5Attention._relative_position_bucket``: positions
    closer than ``max_exact = n // 2`` (``n`` the buckets per direction:
    ``num_buckets // 2`` when bidirectional, else ``num_buckets``) get a bucket
    each, farther ones ``max_exact + trunc(log(d / max_exact) / log(max_distance /
    max_exact) * (n - max_exact))`` in float32 steps (so a distance whose exact
    value falls on a bucket edge lands where transformers' float32 rounding
    puts it), at most ``n - 1``. Bidirectional: positive positions (keys after
    the query) take the buckets ``n ..``. Unidirectional: positive positions
    are bucket 0.

    Parameters
    ----------
    relative_position : array_like of int, any shape
        ``key - query`` positions (int32 or int64; other integer dtypes are
        converted); on the CPU or the GPU.
    bidirectional : bool, default True
        True for encoders, False for decoders' self-attention.
    num_buckets : int, default 32
        >= 4 (bidirectional) or >= 2.
    max_distance : int, default 128
        > the exact buckets per direction.

    Returns
    -------
    ndarray of int64, the shape of ``relative_position``, on its device

    Raises
    ------
    TypeError
        Non-integer positions or options, a non-bool ``bidirectional``.
    ValueError
        Too few buckets or ``max_distance`` not past the exact buckets.

    Examples
    --------
    >>> import numpy as np
    >>> import numbapos.functional as F
    >>> F.relative_position_bucket(np.array([-200, -9, -1, 0, 1, 15, 16, 300]))
    array([15,  8,  1,  0, 17, 25, 26, 31])
    """
    options = _t5_options(bidirectional, num_buckets, max_distance)
    K, relative, flat = _flat_indices(relative_position, "relative_position")
    out = K.empty(tuple(relative.shape), np.int64)
    K.relative_bucket(flat, *options, _device.reshaped(out, (relative.size,)))
    return out


def _bias_options(weight, query_length, key_length, offset, bidirectional, num_buckets,
                  max_distance):
    if num_buckets is None:
        num_buckets = weight.shape[0]
    bid, num_buckets, max_distance, log_ratio = _t5_options(bidirectional, num_buckets,
                                                            max_distance)
    if weight.shape[0] != num_buckets:
        raise ValueError(f"weight: expected shape ({num_buckets}, H) (num_buckets, heads), got "
                         f"{tuple(weight.shape)}")
    query_length = _check_length(query_length, "query_length")
    key_length = _check_length(key_length, "key_length")
    offset = _check_length(offset, "offset")
    return query_length, key_length, offset, bid, max_distance, log_ratio


def relative_position_bias(weight, query_length, key_length, *, offset=0, bidirectional=True,
                           num_buckets=None, max_distance=128, out=None):
    """T5's relative position bias, ``(1, H, Lq, Lk)``, as transformers' ``compute_bias``.

    ``bias[0, h, i, j] = weight[bucket(j - (i + offset)), h]`` with the bucket
    of :func:`relative_position_bucket`.

    Parameters
    ----------
    weight : ndarray, shape (num_buckets, H), float32 or float64
        The table (Hugging Face's ``relative_attention_bias.weight``).
    query_length, key_length : int
        Lq and Lk (>= 0).
    offset : int, default 0
        The first query's position (transformers' ``past_seen_tokens`` when
        decoding with a cache, e.g. ``Lk - 1`` for one new token).
    bidirectional : bool, default True
        False for a decoder (transformers' ``not is_decoder``).
    num_buckets : int, optional
        Default ``weight.shape[0]`` (which it must equal).
    max_distance : int, default 128
    out : ndarray, shape (1, H, Lq, Lk), optional
        C-contiguous, of the weight's dtype and device.

    Returns
    -------
    ndarray, shape (1, H, Lq, Lk), the weight's dtype, on its device

    Raises
    ------
    TypeError, ValueError
        As for :func:`relative_position_bucket`; a weight that is not 2-D
        float or whose rows are not ``num_buckets``; negative lengths or
        offset; a wrong ``out``.

    Examples
    --------
    >>> import numpy as np
    >>> import numbapos.functional as F
    >>> weight = np.arange(64, dtype=np.float32).reshape(32, 2)
    >>> F.relative_position_bias(weight, 2, 3)[0, 0]
    array([[ 0., 34., 36.],
           [ 2.,  0., 34.]], dtype=float32)
    """
    weight = _checks.check_float_array(weight, "weight", ndim=2)
    rows, keys, offset, bid, max_distance, log_ratio = _bias_options(
        weight, query_length, key_length, offset, bidirectional, num_buckets, max_distance)
    K = backend_for((weight, out), ("weight", "out"))
    heads = int(weight.shape[1])
    shape = (1, heads, rows, keys)
    if out is None:
        out = K.empty(shape, weight.dtype)
    else:
        out = _checks.check_out(out, shape, weight.dtype, avoid=(weight,))
    diag = K.empty((heads, max(rows + keys - 1, 0)), weight.dtype)
    K.relative_bias_fill(K.contiguous(weight), offset, bid, max_distance, log_ratio, diag, out)
    return out


def add_relative_position_bias_(scores, weight, *, offset=0, bidirectional=True,
                                num_buckets=None, max_distance=128):
    """Add T5's bias to attention scores in place, without making the bias tensor.

    ``scores[b, h, i, j] += weight[bucket(j - (i + offset)), h]``: the bits of
    ``scores + relative_position_bias(...)``.

    Parameters
    ----------
    scores : ndarray, shape (B, H, Lq, Lk), float32 or float64
        C-contiguous and writeable; modified in place.
    weight : ndarray, shape (num_buckets, H)
        Cast to the scores' dtype.
    offset, bidirectional, num_buckets, max_distance
        As for :func:`relative_position_bias`.

    Returns
    -------
    ndarray
        ``scores``.

    Raises
    ------
    TypeError, ValueError
        As for :func:`relative_position_bias`; ``scores`` not 4-D, strided or
        read-only, or ``weight`` with another number of heads.
    """
    scores = _checks.check_float_array(scores, "scores", ndim=4)
    scores = _checks.check_out(scores, tuple(scores.shape), scores.dtype, "scores")
    weight = _checks.check_float_array(weight, "weight", ndim=2)
    K = backend_for((scores, weight), ("scores", "weight"))
    _, heads, rows, keys = (int(n) for n in scores.shape)
    if weight.shape[1] != heads:
        raise ValueError(f"weight: {weight.shape[1]} heads (columns) for scores with {heads} "
                         f"heads (scores.shape={tuple(scores.shape)})")
    _, _, offset, bid, max_distance, log_ratio = _bias_options(
        weight, rows, keys, offset, bidirectional, num_buckets, max_distance)
    if _device.may_share_memory(scores, weight):
        raise ValueError("scores: must not share memory with weight")
    diag = K.empty((heads, max(rows + keys - 1, 0)), scores.dtype)
    K.relative_bias_add_(scores, K.contiguous(weight, scores.dtype), offset, bid, max_distance,
                         log_ratio, diag)
    return scores


def relative_position_bias_grad(grad, num_buckets, *, offset=0, bidirectional=True,
                                max_distance=128):
    """Gradient of the loss with respect to the table of :func:`relative_position_bias`.

    ``grad_weight[c, h]`` is the sum of ``grad[b, h, i, j]`` over the cells whose
    bucket is ``c``, over the batch as well: the gradient of the bias
    (``B = 1``) or of scores the bias was added to (:func:`add_relative_position_bias_`).

    Summed in float64 in one fixed order, then rounded once to ``grad``'s
    dtype: per head and diagonal ``d = j - i`` (the bucket depends on ``d``
    only) the cells ``b`` increasing, then ``i`` increasing; then per bucket
    its diagonals, ``d`` increasing. The same bits for any thread count and
    on either device.

    Parameters
    ----------
    grad : ndarray, shape (B, H, Lq, Lk), float32 or float64
    num_buckets : int
        Rows of the table.
    offset, bidirectional, max_distance
        As given to the forward call.

    Returns
    -------
    ndarray, shape (num_buckets, H), the dtype of ``grad``, on its device

    Raises
    ------
    TypeError, ValueError
        As for :func:`relative_position_bias`; ``grad`` not 4-D float.
    """
    grad = _checks.check_float_array(grad, "grad", ndim=4)
    bid, num_buckets, max_distance, log_ratio = _t5_options(bidirectional, num_buckets,
                                                            max_distance)
    offset = _check_length(offset, "offset")
    K = backend_for((grad,), ("grad",))
    _, heads, rows, keys = (int(n) for n in grad.shape)
    if grad.size == 0:
        return K.zeros((num_buckets, heads), grad.dtype)
    sums = K.empty((heads, rows + keys - 1 + num_buckets), np.float64)
    out = K.empty((num_buckets, heads), grad.dtype)
    K.relative_bias_grad(K.contiguous(grad), offset, bid, max_distance, log_ratio, sums, out)
    return out


# ---------------------------------------------------------------- DeBERTa


def _deberta_options(bucket_size, max_position):
    bucket_size = _checks.check_int(bucket_size, "bucket_size", minimum=2, maximum=_MAX)
    mid = bucket_size // 2
    max_position = _checks.check_int(max_position, "max_position", minimum=1, maximum=_MAX)
    if max_position <= mid + 1:
        raise ValueError(f"max_position: expected an integer > {mid + 1} (bucket_size // 2 + 1, "
                         f"so that log((max_position - 1) / (bucket_size // 2)) > 0), got "
                         f"{max_position}")
    # transformers: torch.log(torch.tensor((max_position - 1) / mid)), both in float32
    log_ratio = np.float32(math.log(float(np.float32((max_position - 1) / mid))))
    return bucket_size, max_position, log_ratio


def log_bucket_position(relative_pos, bucket_size, max_position):
    """DeBERTa-v2's log buckets of relative positions (``query - key``).

    Equal to transformers' ``make_log_bucket_position`` (as integers: transformers
    returns them as float32, exact): positions with ``|p| <= mid = bucket_size //
    2`` stay, farther ones become ``sign(p) * (mid + ceil(log(|p| / mid) /
    log((max_position - 1) / mid) * (mid - 1)))`` in float32 steps.

    Parameters
    ----------
    relative_pos : array_like of int, any shape
        On the CPU or the GPU.
    bucket_size : int
        ``config.position_buckets`` (256 for DeBERTa-v3); >= 2.
    max_position : int
        ``config.max_relative_positions`` (512 by default); > ``bucket_size // 2 + 1``.

    Returns
    -------
    ndarray of int64, the shape of ``relative_pos``, on its device

    Raises
    ------
    TypeError
        Non-integer positions or options.
    ValueError
        ``bucket_size < 2`` or ``max_position <= bucket_size // 2 + 1``.

    Examples
    --------
    >>> import numpy as np
    >>> import numbapos.functional as F
    >>> F.log_bucket_position(np.array([-1000, -129, -128, 0, 5, 300]), 256, 512)
    array([-317, -129, -128,    0,    5,  207])
    """
    options = _deberta_options(bucket_size, max_position)
    K, relative, flat = _flat_indices(relative_pos, "relative_pos")
    out = K.empty(tuple(relative.shape), np.int64)
    K.deberta_log_bucket(flat, *options, _device.reshaped(out, (relative.size,)))
    return out


def relative_positions(query_size, key_size, bucket_size=-1, max_position=-1, *, device="cpu"):
    """DeBERTa's relative positions ``query - key``, ``(1, query_size, key_size)`` int64.

    Equal to transformers' ``build_relative_position`` (DeBERTa-v2): log-bucketed
    as :func:`log_bucket_position` when ``bucket_size > 0`` and ``max_position > 0``,
    else the plain differences (DeBERTa v1, and v2 without ``position_buckets``).

    Parameters
    ----------
    query_size, key_size : int
        >= 0.
    bucket_size, max_position : int, default -1
        As for :func:`log_bucket_position`; either <= 0 turns the buckets off,
        as in transformers.
    device : {"cpu", "cuda"}, default "cpu"

    Returns
    -------
    ndarray of int64, shape (1, query_size, key_size)

    Raises
    ------
    TypeError, ValueError
        Non-integer or negative sizes; invalid buckets (see :func:`log_bucket_position`);
        an unknown ``device``.

    Examples
    --------
    >>> import numbapos.functional as F
    >>> F.relative_positions(2, 3)
    array([[[ 0, -1, -2],
            [ 1,  0, -1]]])
    """
    query_size = _check_length(query_size, "query_size")
    key_size = _check_length(key_size, "key_size")
    bucket_size = _checks.check_int(bucket_size, "bucket_size", maximum=_MAX)
    max_position = _checks.check_int(max_position, "max_position", maximum=_MAX)
    if bucket_size > 0 and max_position > 0:
        options = _deberta_options(bucket_size, max_position)
    else:
        options = (0, 0, np.float32(0.0))
    K = _device.kernels_for(_device.check_device(device))
    out = K.empty((1, query_size, key_size), np.int64)
    K.deberta_relative_positions(*options, out)
    return out
