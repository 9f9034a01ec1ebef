"""CPU kernels for the fused BERT and GPT-2 embedding blocks.

BERT forward, per token ``t`` (one thread owns a token; the D-vector stays in
cache between the steps)::

    s      = (word[word_ids[t]] + token_type[type_ids[t]]) + position[pos_ids[t]]
    mean, rstd of s                     (corrected two-pass, as LayerNorm)
    y[t]   = ((s - mean) * rstd * gamma + beta) * dropout_mask[t] / (1 - p)

(the order in which Hugging Face's ``BertEmbeddings`` adds them). ``s`` is
first written into ``y[t]`` and normalised there in place, so the block reads
each table row once and writes the output once.

BERT backward recomputes ``s`` from the tables (three row reads) instead of
storing it in the forward pass, regenerates the dropout mask from
``(seed, counter, index)``, and writes ``d(loss)/d(s)`` per token; the table
gradients are then scattered from it by the deterministic embedding backward.
The LayerNorm weight/bias gradients (and, for a small token-type vocabulary,
the token-type table gradient) are summed per fixed chunk of tokens into
partial rows that the caller adds in chunk order, so every gradient is
bit-identical for any thread count.

Launchers (``__all__``, twinned in ``kernels/cuda/blocks.py``) take the
argument tuples of :mod:`numbapos._args`. Flat views: ids are ``(T,)`` int64,
activations ``(T, D)`` C-contiguous, and
the dropout index of element ``(t, d)`` is ``t * D + d`` (the flat C-order
index of the ``(N, L, D)`` output, as in :func:`numbapos.functional.dropout`).

Tables are float32 / float64 (of the activations' dtype), or bfloat16 /
float16 given as their ``uint16`` bits with a format code ``fmt``: every table
element is read through :func:`numbapos.kernels.widen.widen` (exact, shared
with the CUDA twin), so the activations, statistics and gradients are then
float32 and equal the float32 kernels' on the widened tables bit for bit.
"""

import numpy as np
from numba import prange

from ..._args import chunk_rows, num_chunks
from ..halfbits import BF16
from ..hash import dropout_key, keeps
from ..widen import FLOAT_TABLES, widen
from .arrays import pick
from .jit import kernel
from .normalization import layer_norm_row_backward, normalize_row_, row_moments, row_sum, zero_rows
from .prefetch import AHEAD, prefetch_listed

__all__ = ["bert_backward", "bert_forward", "gpt2_forward", "gpt2_forward_checked",
           "position_grad", "tile_ids"]


def _with_affine(tables, dim, dtype):
    gamma = np.ones(dim, dtype) if tables.gamma is None else tables.gamma
    beta = np.zeros(dim, dtype) if tables.beta is None else tables.beta
    return tables._replace(gamma=gamma, beta=beta)


# ---------------------------------------------------------------- launchers


def bert_forward(ids, tables, eps, drop, y, mean, rstd, fmt=FLOAT_TABLES, snapshot=None):
    """Fused gather + sum + LayerNorm (+ dropout) of every token.

    ``ids`` / ``tables`` / ``drop`` are :class:`~numbapos.kernels.args.BertIds`,
    :class:`~numbapos.kernels.args.BertTables` and
    :class:`~numbapos.kernels.args.DropoutArgs`; ``y`` is ``(T, D)``, ``mean``
    and ``rstd`` ``(T,)``. ``fmt`` is the three tables' format: ``FLOAT_TABLES``
    (-1) for float tables of ``y``'s dtype, or ``halfbits.BF16`` / ``F16`` for
    16-bit tables given as their ``uint16`` bits (widened exactly; ``y``, the
    LayerNorm parameters and all arithmetic float32). ``snapshot``: a flat ``(T,)`` array
    that gets a copy of the word ids (as the CUDA twin's kernel writes it), or None.
    """
    if snapshot is not None:
        snapshot[...] = ids.word
    if ids.word.size == 0:
        return
    tables = _with_affine(tables, y.shape[1], y.dtype)
    pick(_bert_forward, y.size)(ids, tables, eps, drop, y, mean, rstd, np.int64(fmt))


def bert_backward(grad_y, ids, tables, mean, rstd, drop, grad_sum, grad_gamma, grad_beta,
                  grad_type, fmt=FLOAT_TABLES):
    """Dropout + LayerNorm backward per token: ``grad_sum[t]`` = d(loss)/d(row sum of t).

    ``grad_gamma`` / ``grad_beta`` (``(D,)``) and ``grad_type`` (the token-type
    table's gradient, ``(type_vocab, D)``) are outputs, or None when not
    wanted; each is summed per fixed chunk of tokens and the chunks added in
    order (bit-identical for any thread count). ``fmt`` as for
    :func:`bert_forward` (gradients are float32 for 16-bit tables).
    """
    num_tokens, dim = grad_y.shape
    dtype = grad_y.dtype
    chunks = num_chunks(num_tokens)
    # Partial sums per chunk: each chunk zeroes its own in the kernel (in its
    # thread's cache); without tokens no kernel runs and they start at zero.
    partials = np.empty if num_tokens else np.zeros
    part_w = partials((chunks, dim if grad_gamma is not None else 0), dtype=dtype)
    part_b = partials((chunks, dim if grad_beta is not None else 0), dtype=dtype)
    part_t = partials((chunks,) + (tables.token_type.shape if grad_type is not None else (0, 0)),
                      dtype=dtype)
    if num_tokens:
        scratch = np.empty((chunks, 2, dim), dtype=dtype)
        flags = (grad_gamma is not None, grad_beta is not None, grad_type is not None)
        pick(_bert_backward, grad_y.size)(
            grad_y, ids, _with_affine(tables, dim, dtype), mean, rstd, drop, flags,
            chunk_rows(num_tokens), grad_sum, part_w, part_b, part_t, scratch, np.int64(fmt))
    if grad_gamma is not None:
        _sum_partials(part_w.reshape(chunks, 1, -1), grad_gamma.reshape(1, -1))
    if grad_beta is not None:
        _sum_partials(part_b.reshape(chunks, 1, -1), grad_beta.reshape(1, -1))
    if grad_type is not None:
        _sum_partials(part_t, grad_type)


def gpt2_forward(ids, pos, wte, wpe, drop, y, fmt=FLOAT_TABLES):
    """``y[t] = (wte[ids[t]] + wpe[pos[t]]) * dropout mask`` for ``(T, D)`` ``y``.

    ``fmt`` as for :func:`bert_forward`: 16-bit tables come as ``uint16`` bits
    and ``y`` is float32.
    """
    if ids.size:
        pick(_gpt2_forward, y.size)(ids, pos, wte, wpe, drop, y, np.int64(fmt))


def gpt2_forward_checked(ids, past_length, length, wte, wpe, y, fmt=FLOAT_TABLES):
    """``y[t] = wte[ids[t]] + wpe[past_length + t % length]``, ids not range-checked yet.

    The no-dropout forward with default positions of a small call (one token
    at a time in generation), in one serial pass that checks each id as it
    goes: -1 when all are in ``[0, V)``, else the first bad position (``y``
    partly written). Positions must already be known to fit ``wpe``. ``fmt``
    as for :func:`gpt2_forward`.
    """
    return int(_gpt2_forward_checked(ids, past_length, length, wte, wpe, y, np.int64(fmt)))


def position_grad(grad, start, length, out):
    """The position table's gradient for default positions, every row of ``out`` written.

    Token ``t`` of the ``(T, D)`` ``grad`` has position ``start + t % length``
    (``T`` a multiple of ``length``: the batch's rows one after another), so row
    ``start + j`` of ``out`` (``(P, D)``) is ``grad[j] + grad[length + j] + ...``,
    added in batch order (the terms and order of :func:`~.embedding.scatter_rows`:
    the same bits), and every other row is zeros.
    """
    pick(_position_grad, out.size)(grad, np.int64(start), np.int64(max(length, 1)), out)


def tile_ids(values, start, length, out):
    """``out[t] = values[t % length]``, or ``start + t % length`` when ``values`` is None.

    Expands a :class:`~numbapos._args.TiledIds` into a flat int64 ``out``.
    """
    if out.size:
        length = max(int(length), 1)
        repeats = -(-out.size // length)
        if values is None:
            one = np.arange(start, start + length, dtype=np.int64)
        else:
            one = np.asarray(values, dtype=np.int64).reshape(-1)[:length]
        out[:] = np.tile(one, repeats)[:out.size]


# ---------------------------------------------------------------- kernels


@kernel()
def _gpt2_forward_checked(ids, past_length, length, wte, wpe, y, fmt):
    vocab = wte.shape[0]
    for t in range(ids.size):
        token = ids[t]
        if token < 0 or token >= vocab:
            return t
        row = y[t]
        a = wte[token]
        b = wpe[past_length + t % length]
        for d in range(row.size):
            row[d] = widen(a[d], fmt) + widen(b[d], fmt)
    return -1


@kernel(parallel=True)
def _position_grad(grad, start, length, out):
    """The rows of ``out`` split across threads; each summed in batch order or zeroed."""
    batch = grad.shape[0] // length
    for r in prange(out.shape[0]):
        row = out[r]
        j = r - start
        if j < 0 or j >= length or batch == 0:
            for d in range(row.size):
                row[d] = 0
            continue
        first = grad[j]
        for d in range(row.size):
            row[d] = first[d]
        for b in range(1, batch):
            g = grad[b * length + j]
            for d in range(row.size):
                row[d] += g[d]


@kernel(inline="always")
def sum3_row(a, b, c, out, fmt):
    """``out = a + b + c`` (added left to right; 16-bit rows of format ``fmt`` widened)."""
    if fmt == BF16:  # the format settled outside the loop, so that the loop vectorises
        for d in range(out.size):
            out[d] = widen(a[d], BF16) + widen(b[d], BF16) + widen(c[d], BF16)
    else:
        for d in range(out.size):
            out[d] = widen(a[d], fmt) + widen(b[d], fmt) + widen(c[d], fmt)


@kernel(inline="always")
def normalize_dropout_row_(v, mean, rstd, weight, bias, key, threshold, scale, base):
    """``v = ((v - mean) * rstd * weight + bias) * m`` in place, ``m`` = ``scale`` or 0.

    Element ``d`` is kept iff ``keeps(key, base + d, threshold)``; dropped
    elements are multiplied by zero (NaN propagates, as in dropout).
    """
    s = v.dtype.type(scale)
    zero = v.dtype.type(0)
    for d in range(v.size):
        m = s if keeps(key, base + d, threshold) else zero
        v[d] = ((v[d] - mean) * rstd * weight[d] + bias[d]) * m


@kernel(parallel=True)
def _bert_forward(ids, tables, eps, drop, y, mean, rstd, fmt):
    """The tokens split across threads, each token's row summed, normalised and dropped out
    in ``y[t]``."""
    key = dropout_key(drop.seed, drop.counter)
    for t in prange(ids.word.size):
        prefetch_listed(tables.word, ids.word, t + AHEAD)
        row = y[t]
        dim = row.size
        sum3_row(tables.word[ids.word[t]], tables.token_type[ids.token_type[t]],
                 tables.position[ids.position[t]], row, fmt)
        first = row_sum(row) / row.dtype.type(dim)
        m, r = row_moments(row, first, eps)
        mean[t] = m
        rstd[t] = r
        if drop.active:
            normalize_dropout_row_(row, m, r, tables.gamma, tables.beta, key, drop.threshold,
                                   drop.scale, t * dim)
        else:
            normalize_row_(row, m, r, tables.gamma, tables.beta)


@kernel(parallel=True)
def _bert_backward(grad_y, ids, tables, mean, rstd, drop, flags, chunk, grad_sum, part_w,
                   part_b, part_t, scratch, fmt):
    """The chunks of ``chunk`` tokens split across threads; chunk ``c`` zeroes and fills its
    partial rows ``part_*[c]`` and works in ``scratch[c]``."""
    key = dropout_key(drop.seed, drop.counter)
    want_w, want_b, fuse_type = flags
    num_tokens, dim = grad_y.shape
    keep_scale = grad_y.dtype.type(drop.scale)
    zero = grad_y.dtype.type(0)
    for c in prange(scratch.shape[0]):
        start = c * chunk
        stop = min(start + chunk, num_tokens)
        s = scratch[c, 0]
        e = scratch[c, 1]
        zero_rows(part_w[c:c + 1])
        zero_rows(part_b[c:c + 1])
        zero_rows(part_t[c])
        for t in range(start, stop):
            prefetch_listed(tables.word, ids.word, t + AHEAD)
            sum3_row(tables.word[ids.word[t]], tables.token_type[ids.token_type[t]],
                     tables.position[ids.position[t]], s, fmt)
            gy = grad_y[t]
            if drop.active:
                base = t * dim
                for d in range(dim):
                    e[d] = gy[d] * (keep_scale if keeps(key, base + d, drop.threshold) else zero)
                gy = e
            gs = grad_sum[t]
            layer_norm_row_backward(gy, s, mean[t], rstd[t], tables.gamma, want_w, want_b, gs,
                                    part_w[c], part_b[c])
            if fuse_type:
                pt = part_t[c, ids.token_type[t]]
                for d in range(dim):
                    pt[d] += gs[d]


@kernel()
def _sum_partials(part, out):
    """``out = part[0] + part[1] + ...`` over the first axis, in order (deterministic)."""
    rows = part.shape[1]
    dim = part.shape[2]
    for r in range(rows):
        for d in range(dim):
            out[r, d] = part[0, r, d]
    for c in range(1, part.shape[0]):
        for r in range(rows):
            for d in range(dim):
                out[r, d] += part[c, r, d]


@kernel(parallel=True)
def _gpt2_forward(ids, pos, wte, wpe, drop, y, fmt):
    """The tokens split across threads."""
    key = dropout_key(drop.seed, drop.counter)
    for t in prange(ids.size):
        prefetch_listed(wte, ids, t + AHEAD)
        row = y[t]
        a = wte[ids[t]]
        b = wpe[pos[t]]
        if drop.active:
            s = row.dtype.type(drop.scale)
            zero = row.dtype.type(0)
            base = t * row.size
            for d in range(row.size):
                m = s if keeps(key, base + d, drop.threshold) else zero
                row[d] = (widen(a[d], fmt) + widen(b[d], fmt)) * m
        else:
            for d in range(row.size):
                row[d] = widen(a[d], fmt) + widen(b[d], fmt)
