"""CUDA launchers and kernels for relative positions: T5's bucketed bias and DeBERTa's log
buckets.

Twin of :mod:`numbapos.kernels.cpu.relative` (same ``__all__``, signatures and
bits; the bucket helpers are the CPU module's ``register_jitable`` scalars,
compiled here for the GPU). The elementwise kernels give one thread to each
element, threads along the last axis (coalesced). The bias first builds the
head's diagonals ``diag[h, k]`` (one thread per (h, k)), then each bias or
score element reads its diagonal. The table's gradient sums in the CPU's
order without atomics: one thread per (head, diagonal) adds its cells over
``b`` then ``i`` in float64 (neighbouring threads read neighbouring keys), then
one thread per (bucket, head) adds the diagonals of its bucket in order.
"""

import numpy as np
from numba import cuda, float64

from ..._gpuhost.launch import launch
from ..cpu.relative import deberta_bucket, t5_bucket
from .arrays import THREADS, grid

__all__ = ["deberta_log_bucket", "deberta_relative_positions", "relative_bias_add_",
           "relative_bias_fill", "relative_bias_grad", "relative_bucket"]


# ---------------------------------------------------------------- launchers


def relative_bucket(relative, bidirectional, num_buckets, max_distance, log_ratio, out):
    """``out[n] = t5_bucket(relative[n])`` for flat int32 / int64 ``relative``, int64 ``out``."""
    if out.size:
        launch(_buckets, grid(out.size), THREADS, relative, np.int64(bidirectional),
               np.int64(num_buckets), np.int64(max_distance), np.float32(log_ratio), out)


def relative_bias_fill(weight, offset, bidirectional, max_distance, log_ratio, diag, out):
    """``out[0, h, i, j] = weight[bucket(j - i - offset), h]``; ``out`` is ``(1, H, Lq, Lk)``.

    ``diag`` is scratch of shape ``(H, Lq + Lk - 1)`` in the weight's dtype.
    """
    if out.size:
        _launch_diagonals(weight, out.shape[2], offset, bidirectional, max_distance, log_ratio,
                          diag)
        launch(_fill, grid(out.size), THREADS, diag, out)


def relative_bias_add_(scores, weight, offset, bidirectional, max_distance, log_ratio, diag):
    """``scores[b, h, i, j] += weight[bucket(j - i - offset), h]`` (``scores`` ``(B, H, Lq, Lk)``).

    ``diag`` is scratch of shape ``(H, Lq + Lk - 1)`` in the scores' dtype.
    """
    if scores.size:
        _launch_diagonals(weight, scores.shape[2], offset, bidirectional, max_distance,
                          log_ratio, diag)
        launch(_add, grid(scores.size), THREADS, scores, diag)


def relative_bias_grad(grad, offset, bidirectional, max_distance, log_ratio, sums, out):
    """``out[c, h] = sum of grad[b, h, i, j] over the cells of bucket c`` (the CPU's order).

    ``grad`` is ``(B, H, Lq, Lk)``, ``out`` ``(num_buckets, H)``; ``sums`` is float64
    scratch of shape ``(H, Lq + Lk - 1 + num_buckets)``.
    """
    if out.size:
        heads = grad.shape[1]
        width = grad.shape[2] + grad.shape[3] - 1
        launch(_diagonal_sums, grid(heads * width), THREADS, grad, sums)
        launch(_bucket_sums, grid(out.size), THREADS, np.int64(offset), np.int64(bidirectional),
               np.int64(max_distance), np.float32(log_ratio), np.int64(grad.shape[2]), sums,
               out)


def deberta_log_bucket(relative, bucket_size, max_position, log_ratio, out):
    """``out[n] = deberta_bucket(relative[n])`` for flat integer ``relative``, int64 ``out``."""
    if out.size:
        launch(_log_buckets, grid(out.size), THREADS, relative, np.int64(bucket_size),
               np.int64(max_position), np.float32(log_ratio), out)


def deberta_relative_positions(bucket_size, max_position, log_ratio, out):
    """``out[0, i, j] = i - j``, log-bucketed when ``bucket_size > 0``; ``out`` ``(1, Lq, Lk)``."""
    if out.size:
        launch(_deberta_fill, grid(out.size), THREADS, np.int64(bucket_size),
               np.int64(max_position), np.float32(log_ratio), out)


def _launch_diagonals(weight, queries, offset, bidirectional, max_distance, log_ratio, diag):
    launch(_diagonals, grid(diag.size), THREADS, weight, np.int64(queries), np.int64(offset),
           np.int64(bidirectional), np.int64(max_distance), np.float32(log_ratio), diag)


# ---------------------------------------------------------------- kernels


@cuda.jit
def _buckets(relative, bidirectional, num_buckets, max_distance, log_ratio, out):
    for n in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[n] = t5_bucket(np.int64(relative[n]), bidirectional, num_buckets, max_distance,
                           log_ratio)


@cuda.jit
def _diagonals(weight, queries, offset, bidirectional, max_distance, log_ratio, diag):
    """One thread per (h, k): ``diag[h, k] = weight[bucket(k - (queries - 1) - offset), h]``."""
    width = diag.shape[1]
    for t in range(cuda.grid(1), diag.size, cuda.gridsize(1)):
        h = t // width
        k = t - h * width
        c = t5_bucket(np.int64(k - (queries - 1) - offset), bidirectional, weight.shape[0],
                      max_distance, log_ratio)
        diag[h, k] = weight[c, h]


@cuda.jit
def _fill(diag, out):
    rows, cols = out.shape[2], out.shape[3]
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        j = t % cols
        r = t // cols
        i = r % rows
        out[0, r // rows, i, j] = diag[r // rows, rows - 1 - i + j]


@cuda.jit
def _add(scores, diag):
    heads, rows, cols = scores.shape[1], scores.shape[2], scores.shape[3]
    for t in range(cuda.grid(1), scores.size, cuda.gridsize(1)):
        j = t % cols
        r = t // cols
        i = r % rows
        r = r // rows
        h = r % heads
        b = r // heads
        scores[b, h, i, j] += diag[h, rows - 1 - i + j]


@cuda.jit
def _diagonal_sums(grad, sums):
    """One thread per (head, diagonal k): the cells ``(b, i, i + k - Lq + 1)``, b then i."""
    batch, heads, rows, cols = grad.shape
    width = rows + cols - 1
    for t in range(cuda.grid(1), heads * width, cuda.gridsize(1)):
        h = t // width
        k = t - h * width
        first = max(0, rows - 1 - k)  # the queries whose key i + k - (rows - 1) exists
        last = min(rows, rows - 1 - k + cols)
        acc = float64(0.0)
        for b in range(batch):
            for i in range(first, last):
                acc += float64(grad[b, h, i, i + k - (rows - 1)])
        sums[h, k] = acc


@cuda.jit
def _bucket_sums(offset, bidirectional, max_distance, log_ratio, rows, sums, out):
    """One thread per (bucket c, head h): the diagonals of bucket c, k increasing."""
    num_buckets, heads = out.shape
    width = sums.shape[1] - num_buckets
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        c = t // heads
        h = t - c * heads
        acc = float64(0.0)
        for k in range(width):
            if t5_bucket(np.int64(k - (rows - 1) - offset), bidirectional, num_buckets,
                         max_distance, log_ratio) == c:
                acc += sums[h, k]
        out[c, h] = acc


@cuda.jit
def _log_buckets(relative, bucket_size, max_position, log_ratio, out):
    for n in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[n] = deberta_bucket(np.int64(relative[n]), bucket_size, max_position, log_ratio)


@cuda.jit
def _deberta_fill(bucket_size, max_position, log_ratio, out):
    cols = out.shape[2]
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        i = t // cols
        j = t - i * cols
        relative = np.int64(i - j)
        if bucket_size > 0:
            relative = deberta_bucket(relative, bucket_size, max_position, log_ratio)
        out[0, i, j] = relative
