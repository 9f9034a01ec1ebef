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

Flat views: ids are ``(T,)`` int64, activations ``(T, D)`` C-contiguous, and
the dropout index of element ``(t, d)`` is ``t * D + d`` (the flat C-order
index of the ``(N, L, D)`` output, as in :func:`numbapos.functional.dropout`).
"""

import numpy as np
from numba import njit, prange

from .dropout import dropout_bits_keyed, dropout_key
from .normalization import layer_norm_row_backward, normalize_row_, row_moments, row_sum


@njit(cache=True, nogil=True)
def sum3_row(a, b, c, out):
    """``out = a + b + c`` (added left to right)."""
    for d in range(out.size):
        out[d] = a[d] + b[d] + c[d]


@njit(cache=True, nogil=True)
def normalize_dropout_row_(v, mean, rstd, weight, bias, key, threshold, scale, base):
    """``v = ((v - mean) * rstd * weight + bias) * m`` in place, ``m`` = ``scale`` or 0.

    Element ``d`` is kept iff ``dropout_bits_keyed(key, base + d) >= threshold``;
    dropped elements are multiplied by zero (NaN propagates, as in dropout).
    """
    s = v.dtype.type(scale)
    zero = v.dtype.type(0)
    for d in range(v.size):
        m = s if np.uint64(dropout_bits_keyed(key, base + d)) >= threshold else zero
        v[d] = ((v[d] - mean) * rstd * weight[d] + bias[d]) * m


@njit(cache=True, nogil=True)
def _bert_token(t, word_ids, pos_ids, type_ids, word, position, token_type, gamma, beta, eps,
                key, threshold, scale, use_dropout, y, mean, rstd):
    row = y[t]
    dim = row.size
    sum3_row(word[word_ids[t]], token_type[type_ids[t]], position[pos_ids[t]], row)
    first = row_sum(row) / row.dtype.type(dim)
    m, r = row_moments(row, first, eps)
    mean[t] = m
    rstd[t] = r
    if use_dropout:
        normalize_dropout_row_(row, m, r, gamma, beta, key, threshold, scale, t * dim)
    else:
        normalize_row_(row, m, r, gamma, beta)


@njit(cache=True, nogil=True)
def bert_forward(word_ids, pos_ids, type_ids, word, position, token_type, gamma, beta, eps,
                 seed, counter, threshold, scale, use_dropout, y, mean, rstd):
    """Fused gather + sum + LayerNorm (+ dropout) of every token (serial, for small inputs)."""
    key = dropout_key(seed, counter)
    for t in range(word_ids.size):
        _bert_token(t, word_ids, pos_ids, type_ids, word, position, token_type, gamma, beta,
                    eps, key, threshold, scale, use_dropout, y, mean, rstd)


@njit(cache=True, nogil=True, parallel=True)
def bert_forward_parallel(word_ids, pos_ids, type_ids, word, position, token_type, gamma, beta,
                          eps, seed, counter, threshold, scale, use_dropout, y, mean, rstd):
    """:func:`bert_forward` with the tokens split across threads (same result)."""
    key = dropout_key(seed, counter)
    for t in prange(word_ids.size):
        _bert_token(t, word_ids, pos_ids, type_ids, word, position, token_type, gamma, beta,
                    eps, key, threshold, scale, use_dropout, y, mean, rstd)


@njit(cache=True, nogil=True)
def _bert_backward_chunk(c, chunk, grad_y, word_ids, pos_ids, type_ids, word, position,
                         token_type, gamma, mean, rstd, key, threshold, scale, use_dropout,
                         want_w, want_b, fuse_type, grad_sum, part_w, part_b, part_t):
    num_tokens, dim = grad_y.shape
    start = c * chunk
    stop = min(start + chunk, num_tokens)
    s = np.empty(dim, dtype=grad_y.dtype)
    e = np.empty(dim, dtype=grad_y.dtype)
    keep_scale = grad_y.dtype.type(scale)
    zero = grad_y.dtype.type(0)
    for t in range(start, stop):
        sum3_row(word[word_ids[t]], token_type[type_ids[t]], position[pos_ids[t]], s)
        gy = grad_y[t]
        if use_dropout:
            base = t * dim
            for d in range(dim):
                keep = np.uint64(dropout_bits_keyed(key, base + d)) >= threshold
                e[d] = gy[d] * (keep_scale if keep else zero)
            gy = e
        gs = grad_sum[t]
        layer_norm_row_backward(gy, s, mean[t], rstd[t], gamma, want_w, want_b, gs,
                                part_w[c], part_b[c])
        if fuse_type:
            pt = part_t[c, type_ids[t]]
            for d in range(dim):
                pt[d] += gs[d]


@njit(cache=True, nogil=True)
def bert_backward(grad_y, word_ids, pos_ids, type_ids, word, position, token_type, gamma, mean,
                  rstd, seed, counter, threshold, scale, use_dropout, want_w, want_b, fuse_type,
                  chunk, grad_sum, part_w, part_b, part_t):
    """Dropout + LayerNorm backward per token into ``grad_sum`` (serial).

    ``part_w`` / ``part_b`` are ``(n_chunks, D)`` zeroed partial rows of the
    LayerNorm weight / bias gradients (``(n_chunks, 0)`` when not wanted);
    ``part_t`` is ``(n_chunks, type_vocab, D)`` zeroed partials of the
    token-type table gradient, used only when ``fuse_type``.
    """
    key = dropout_key(seed, counter)
    n_chunks = (word_ids.size + chunk - 1) // chunk
    for c in range(n_chunks):
        _bert_backward_chunk(c, chunk, grad_y, word_ids, pos_ids, type_ids, word, position,
                             token_type, gamma, mean, rstd, key, threshold, scale, use_dropout,
                             want_w, want_b, fuse_type, grad_sum, part_w, part_b, part_t)


@njit(cache=True, nogil=True, parallel=True)
def bert_backward_parallel(grad_y, word_ids, pos_ids, type_ids, word, position, token_type,
                           gamma, mean, rstd, seed, counter, threshold, scale, use_dropout,
                           want_w, want_b, fuse_type, chunk, grad_sum, part_w, part_b, part_t):
    """:func:`bert_backward` with the chunks split across threads (same result)."""
    key = dropout_key(seed, counter)
    n_chunks = (word_ids.size + chunk - 1) // chunk
    for c in prange(n_chunks):
        _bert_backward_chunk(c, chunk, grad_y, word_ids, pos_ids, type_ids, word, position,
                             token_type, gamma, mean, rstd, key, threshold, scale, use_dropout,
                             want_w, want_b, fuse_type, grad_sum, part_w, part_b, part_t)


@njit(cache=True, nogil=True)
def sum_partial_tables(part, out):
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


@njit(cache=True, nogil=True)
def _gpt2_token(t, ids, pos_ids, wte, wpe, key, threshold, scale, use_dropout, y):
    row = y[t]
    a = wte[ids[t]]
    b = wpe[pos_ids[t]]
    if use_dropout:
        s = row.dtype.type(scale)
        zero = row.dtype.type(0)
        base = t * row.size
        for d in range(row.size):
            m = s if np.uint64(dropout_bits_keyed(key, base + d)) >= threshold else zero
            row[d] = (a[d] + b[d]) * m
    else:
        for d in range(row.size):
            row[d] = a[d] + b[d]


@njit(cache=True, nogil=True)
def gpt2_forward(ids, pos_ids, wte, wpe, seed, counter, threshold, scale, use_dropout, y):
    """``y[t] = (wte[ids[t]] + wpe[pos_ids[t]]) * dropout mask`` (serial, for small inputs)."""
    key = dropout_key(seed, counter)
    for t in range(ids.size):
        _gpt2_token(t, ids, pos_ids, wte, wpe, key, threshold, scale, use_dropout, y)


@njit(cache=True, nogil=True, parallel=True)
def gpt2_forward_parallel(ids, pos_ids, wte, wpe, seed, counter, threshold, scale, use_dropout,
                          y):
    """:func:`gpt2_forward` with the tokens split across threads (same result)."""
    key = dropout_key(seed, counter)
    for t in prange(ids.size):
        _gpt2_token(t, ids, pos_ids, wte, wpe, key, threshold, scale, use_dropout, y)
