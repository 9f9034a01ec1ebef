"""CPU kernels for relative positions: T5's bucketed bias and DeBERTa's log buckets.

Launchers (``__all__``, twinned in ``kernels/cuda/relative.py``) take validated
arrays. The T5 bucket of a relative position (``key - query``) and DeBERTa's
log bucket are computed by the scalar helpers below, written once and
compiled for both devices (``register_jitable``). Both reproduce PyTorch's
float32 steps: the float32 quotient, its logarithm rounded to float32 (from
the float64 one), each division and product rounded to float32, then the
truncation (T5) or ceiling (DeBERTa). The float32 ``log(max_distance /
max_exact)`` (T5) and ``log(float32((max_position - 1) / mid))`` (DeBERTa)
come from the host as ``log_ratio``, so both devices divide by the same bits.

The T5 bias of head ``h`` at query ``i`` and key ``j`` depends on ``k = j - i +
Lq - 1`` only: ``diag[h, k] = weight[bucket(k - (Lq - 1) - offset), h]`` is
built first (``Lq + Lk - 1`` buckets), then each row of the bias is a slice of
it. The table's gradient is summed in float64 in this order, on both
devices and for any thread count:

1. per head and diagonal ``k``: the cells ``(b, i, j = i + k - Lq + 1)``, ``b``
   increasing, then ``i`` increasing;
2. per head and bucket: the diagonals of that bucket, ``k`` increasing;

then rounded once to the table's dtype.
"""

import math

import numpy as np
from numba import prange
from numba.extending import register_jitable

from .arrays import pick
from .jit import kernel

__all__ = ["deberta_log_bucket", "deberta_relative_positions", "relative_bias_add_",
           "relative_bias_fill", "relative_bias_grad", "relative_bucket"]

# ---------------------------------------------------------------- shared scalars


@register_jitable
def t5_bucket(relative, bidirectional, num_buckets, max_distance, log_ratio):
    """``T5Attention._relative_position_bucket`` of one relative position (int64)."""
    base = 0
    buckets = num_buckets
    if bidirectional:
        buckets = num_buckets // 2
        if relative > 0:
            base = buckets
        n = -relative if relative < 0 else relative
    else:
        n = -relative if relative < 0 else 0
    if n >= max_distance or n < 0:  # at or past max_distance the last bucket (n < 0: -2**63)
        return base + buckets - 1
    max_exact = buckets // 2
    if n < max_exact:
        return base + n
    x = np.float32(np.float32(n) / np.float32(max_exact))
    scaled = np.float32(np.float32(np.float32(math.log(np.float64(x))) / log_ratio)
                        * np.float32(buckets - max_exact))
    large = max_exact + np.int64(scaled)  # truncation toward zero, as .to(torch.long)
    return base + min(large, buckets - 1)


@register_jitable
def deberta_bucket(relative, bucket_size, max_position, log_ratio):
    """DeBERTa-v2's ``make_log_bucket_position`` of one relative position (int64)."""
    mid = bucket_size // 2
    n = -relative if relative < 0 else relative
    if n <= mid:
        return relative
    x = np.float32(np.float32(n) / np.float32(mid))
    scaled = np.float32(np.float32(np.float32(math.log(np.float64(x))) / log_ratio)
                        * np.float32(mid - 1))
    value = np.int64(np.float32(np.float32(math.ceil(scaled)) + np.float32(mid)))
    return value if relative > 0 else -value


# ---------------------------------------------------------------- launchers


def relative_bucket(relative, bidirectional, num_buckets, max_distance, log_ratio, out):
    """``out[n] = t5_bucket(relative[n])`` for flat int32 / int64 ``relative``, int64 ``out``."""
    if out.size:
        pick(_t5_buckets, out.size)(relative, bidirectional, num_buckets, max_distance, log_ratio,
                                 out)


def relative_bias_fill(weight, offset, bidirectional, max_distance, log_ratio, diag, out):
    """``out[0, h, i, j] = weight[bucket(j - i - offset), h]``; ``out`` is ``(1, H, Lq, Lk)``.

    ``diag`` is scratch of shape ``(H, Lq + Lk - 1)`` in the weight's dtype.
    """
    if out.size:
        _diagonals(weight, out.shape[2], offset, bidirectional, max_distance, log_ratio, diag)
        pick(_bias_fill, out.size)(diag, out)


def relative_bias_add_(scores, weight, offset, bidirectional, max_distance, log_ratio, diag):
    """``scores[b, h, i, j] += weight[bucket(j - i - offset), h]`` (``scores`` ``(B, H, Lq, Lk)``).

    ``diag`` is scratch of shape ``(H, Lq + Lk - 1)`` in the scores' dtype.
    """
    if scores.size:
        _diagonals(weight, scores.shape[2], offset, bidirectional, max_distance, log_ratio,
                   diag)
        pick(_bias_add, scores.size)(scores, diag)


def relative_bias_grad(grad, offset, bidirectional, max_distance, log_ratio, sums, out):
    """``out[c, h] = sum of grad[b, h, i, j] over the cells of bucket c`` (the module's order).

    ``grad`` is ``(B, H, Lq, Lk)``, ``out`` ``(num_buckets, H)``; ``sums`` is float64
    scratch of shape ``(H, Lq + Lk - 1 + num_buckets)``.
    """
    if out.size:
        pick(_bias_grad, grad.size)(grad, offset, bidirectional, max_distance, log_ratio, sums,
                               out)


def deberta_log_bucket(relative, bucket_size, max_position, log_ratio, out):
    """``out[n] = deberta_bucket(relative[n])`` for flat integer ``relative``, int64 ``out``."""
    if out.size:
        pick(_deberta_buckets, out.size)(relative, bucket_size, max_position, log_ratio, out)


def deberta_relative_positions(bucket_size, max_position, log_ratio, out):
    """``out[0, i, j] = i - j``, log-bucketed when ``bucket_size > 0``; ``out`` ``(1, Lq, Lk)``."""
    if out.size:
        pick(_deberta_fill, out.size)(bucket_size, max_position, log_ratio, out)


# ---------------------------------------------------------------- kernels


@kernel(parallel=True)
def _t5_buckets(relative, bidirectional, num_buckets, max_distance, log_ratio, out):
    for n in prange(out.size):
        out[n] = t5_bucket(np.int64(relative[n]), bidirectional, num_buckets, max_distance,
                           log_ratio)


@kernel()
def _diagonals(weight, queries, offset, bidirectional, max_distance, log_ratio, diag):
    """``diag[h, k] = weight[bucket(k - (queries - 1) - offset), h]`` for every diagonal k."""
    num_buckets = weight.shape[0]
    for k in range(diag.shape[1]):
        c = t5_bucket(np.int64(k - (queries - 1) - offset), bidirectional, num_buckets,
                      max_distance, log_ratio)
        for h in range(diag.shape[0]):
            diag[h, k] = weight[c, h]


@kernel(parallel=True)
def _bias_fill(diag, out):
    """One ``(h, i)`` row per iteration: a slice of the head's diagonals.

    (The slice is taken first: with both loops indexed from 0, LLVM vectorises the copy
    without the offset arithmetic, 1.5x faster than ``src[start + j]``.)
    """
    rows, cols = out.shape[2], out.shape[3]
    for r in prange(out.shape[1] * rows):
        h = r // rows
        i = r - h * rows
        row = out[0, h, i]
        src = diag[h, rows - 1 - i:rows - 1 - i + cols]
        for j in range(cols):
            row[j] = src[j]


@kernel(parallel=True)
def _bias_add(scores, diag):
    """One ``(b, h, i)`` row per iteration: the head's diagonals added to it (sliced first,
    as in :func:`_bias_fill`)."""
    heads, rows, cols = scores.shape[1], scores.shape[2], scores.shape[3]
    for r in prange(scores.shape[0] * heads * rows):
        b = r // (heads * rows)
        t = r - b * heads * rows
        h = t // rows
        i = t - h * rows
        row = scores[b, h, i]
        src = diag[h, rows - 1 - i:rows - 1 - i + cols]
        for j in range(cols):
            row[j] += src[j]


@kernel(parallel=True)
def _bias_grad(grad, offset, bidirectional, max_distance, log_ratio, sums, out):
    """One head per iteration: its diagonal sums, then its bucket sums (see the module)."""
    batch, heads, rows, cols = grad.shape
    num_buckets = out.shape[0]
    width = rows + cols - 1
    for h in prange(heads):
        acc = sums[h]
        for k in range(acc.size):
            acc[k] = 0.0
        for b in range(batch):
            for i in range(rows):
                row = grad[b, h, i]
                cells = acc[rows - 1 - i:rows - 1 - i + cols]
                for j in range(cols):
                    cells[j] += np.float64(row[j])
        for k in range(width):
            c = t5_bucket(np.int64(k - (rows - 1) - offset), bidirectional, num_buckets,
                          max_distance, log_ratio)
            acc[width + c] += acc[k]
        for c in range(num_buckets):
            out[c, h] = acc[width + c]


@kernel(parallel=True)
def _deberta_buckets(relative, bucket_size, max_position, log_ratio, out):
    for n in prange(out.size):
        out[n] = deberta_bucket(np.int64(relative[n]), bucket_size, max_position, log_ratio)


@kernel(parallel=True)
def _deberta_fill(bucket_size, max_position, log_ratio, out):
    cols = out.shape[2]
    for i in prange(out.shape[1]):
        row = out[0, i]
        for j in range(cols):
            relative = np.int64(i - j)
            if bucket_size > 0:
                relative = deberta_bucket(relative, bucket_size, max_position, log_ratio)
            row[j] = relative
