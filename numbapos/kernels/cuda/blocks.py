"""CUDA launchers and kernels for the fused BERT and GPT-2 embedding blocks.

Twin of :mod:`numbapos.kernels.cpu.blocks` (same ``__all__``, signatures and
results). Flat views: ids are ``(T,)`` int64 device arrays, activations
``(T, D)`` C-contiguous; the dropout index of element ``(t, d)`` is
``t * D + d`` and its mask bit comes from the shared
:mod:`numbapos.kernels.hash` code, so the mask equals the CPU's bit for bit.

BERT forward: one block per token (blocks stride over the tokens), threads
along D. Each thread writes its elements of
``s = (word[w] + token_type[k]) + position[p]`` (the add order of the CPU and
of Hugging Face) into ``y[t]``, the block reduces the corrected two-pass
moments in shared memory (:mod:`.normalization`), and each thread then
normalises, applies gamma / beta and the dropout mask to its own elements in
place.

BERT backward: one block per token writes ``grad_sum[t]`` (``s`` recomputed from
the tables, ``grad_y`` masked by dropout, then the LayerNorm row backward).
The gamma / beta / token-type gradients are sums over tokens, taken as on the
CPU per fixed chunk of :func:`numbapos._args.chunk_rows` tokens: one thread per
``(chunk, d)`` walks its chunk's tokens in order (for the token-type table it
adds into the row of each token's type: the thread owns the whole column
``part_t[chunk, :, d]``, so there are no races), then the partials are added in
chunk order. No atomics anywhere. gamma / beta gradients are bit-identical to
the CPU's (same terms, same order, products rounded with ``mul.rn``); the
token-type gradient is an ordered sum of ``grad_sum``, which itself agrees with
the CPU to a few ulp.

GPT-2 forward: elementwise, ``y[t, d] = (wte[ids[t], d] + wpe[pos[t], d]) * mask``,
bit-identical to the CPU.
"""

import math
from functools import cache

import numpy as np
from numba import cuda

from ..._args import NO_DROPOUT, chunk_rows, num_chunks
from ..hash import dropout_key, keeps
from . import arrays
from .arrays import THREADS, full, grid
from .embedding import check_indices
from .fpmath import mul_for, numba_float
from .normalization import (
    add_partials,
    block_sum,
    block_sum2,
    fill_zero,
    moments,
    row_blocks,
)

__all__ = ["bert_backward", "bert_forward", "gpt2_forward", "gpt2_forward_checked"]


def _affine(tables, dim, dtype):
    """``(gamma, beta)`` with None replaced by ones / zeros."""
    gamma = full((dim,), 1, dtype) if tables.gamma is None else tables.gamma
    beta = full((dim,), 0, dtype) if tables.beta is None else tables.beta
    return gamma, beta


def _drop_scalars(drop, dtype):
    """The dropout arguments of a kernel: seed, counter, threshold, scale (cast), active."""
    return drop.seed, drop.counter, drop.threshold, dtype.type(drop.scale), bool(drop.active)


# ---------------------------------------------------------------- launchers


def bert_forward(ids, tables, eps, drop, y, mean, rstd):
    """Fused gather + sum + LayerNorm (+ dropout) of every token.

    ``ids`` / ``tables`` / ``drop`` are :class:`~numbapos._args.BertIds`,
    :class:`~numbapos._args.BertTables` and :class:`~numbapos._args.DropoutArgs`;
    ``y`` is ``(T, D)``, ``mean`` and ``rstd`` ``(T,)``.
    """
    num_tokens = ids.word.size
    if num_tokens == 0:
        return
    dtype = y.dtype
    gamma, beta = _affine(tables, y.shape[1], dtype)
    _bert_forward_kernel(dtype)[row_blocks(num_tokens), THREADS](
        ids.word, ids.position, ids.token_type, tables.word, tables.position,
        tables.token_type, gamma, beta, dtype.type(eps), *_drop_scalars(drop, dtype),
        y, mean, rstd)


def bert_backward(grad_y, ids, tables, mean, rstd, drop, grad_sum, grad_gamma, grad_beta,
                  grad_type):
    """Dropout + LayerNorm backward per token: ``grad_sum[t]`` = d(loss)/d(row sum of t).

    ``grad_gamma`` / ``grad_beta`` (``(D,)``) and ``grad_type`` (the token-type
    table's gradient, ``(type_vocab, D)``) are outputs, or None when not
    wanted; each is summed per fixed chunk of tokens and the chunks added in
    order (no atomics; the same order as the CPU).
    """
    num_tokens, dim = grad_y.shape
    dtype = grad_y.dtype
    wanted = [out for out in (grad_gamma, grad_beta, grad_type) if out is not None]
    if num_tokens == 0:
        for out in wanted:
            fill_zero(out)
        return
    gamma, _ = _affine(tables, dim, dtype)
    drop_args = _drop_scalars(drop, dtype)
    _bert_backward_kernel(dtype)[row_blocks(num_tokens), THREADS](
        grad_y, ids.word, ids.position, ids.token_type, tables.word, tables.position,
        tables.token_type, gamma, mean, rstd, *drop_args, grad_sum)
    if not wanted:
        return
    want_w = grad_gamma is not None
    want_b = grad_beta is not None
    want_t = grad_type is not None
    chunks = num_chunks(num_tokens)
    types = tables.token_type.shape[0]
    # An unwanted partial is a small placeholder that the kernel never touches.
    part_w = cuda.device_array((chunks, dim) if want_w else (1, 1), dtype=dtype)
    part_b = cuda.device_array((chunks, dim) if want_b else (1, 1), dtype=dtype)
    part_t = cuda.device_array((chunks, types, dim) if want_t else (1, 1, 1), dtype=dtype)
    _bert_partials_kernel(dtype)[grid(chunks * dim), THREADS](
        grad_y, ids.word, ids.position, ids.token_type, tables.word, tables.position,
        tables.token_type, mean, rstd, *drop_args, grad_sum, chunks, chunk_rows(num_tokens),
        want_w, want_b, want_t, part_w, part_b, part_t)
    if want_w:
        add_partials(part_w, grad_gamma)
    if want_b:
        add_partials(part_b, grad_beta)
    if want_t:
        add_partials(part_t, grad_type)


def gpt2_forward_checked(ids, past_length, length, wte, wpe, y):
    """``y[t] = wte[ids[t]] + wpe[past_length + t % length]``, ids not range-checked yet.

    The CPU twin's contract: -1 when every id is in ``[0, V)``, else the first
    bad position. Here a bounds pass runs first and nothing is written on a
    bad id; positions are built on the host and copied up.
    """
    check_indices(ids, wte.shape[0], "input_ids", "vocab_size")  # deferred: -1
    if ids.size == 0:
        return -1
    positions = past_length + np.arange(ids.size, dtype=np.int64) % length
    gpt2_forward(ids, arrays.asarray(positions), wte, wpe, NO_DROPOUT, y)
    return -1


def gpt2_forward(ids, pos, wte, wpe, drop, y):
    """``y[t] = (wte[ids[t]] + wpe[pos[t]]) * dropout mask`` for ``(T, D)`` ``y``."""
    if ids.size:
        _gpt2_forward[grid(y.size), THREADS](ids, pos, wte, wpe, *_drop_scalars(drop, y.dtype),
                                             y.dtype.type(0), y)


# ---------------------------------------------------------------- kernels


@cache
def _bert_forward_kernel(dtype):
    nbt = numba_float(dtype)

    @cuda.jit
    def bert_forward_tokens(word_ids, pos_ids, type_ids, word, position, token_type, gamma,
                            beta, eps, seed, counter, threshold, scale, active, y, mean, rstd):
        """One block per token: ``s`` into ``y[t]``, moments, then normalise (+ dropout)."""
        sh_a = cuda.shared.array(THREADS, nbt)
        sh_b = cuda.shared.array(THREADS, nbt)
        tid = cuda.threadIdx.x
        num_tokens, dim = y.shape
        zero = nbt(0)
        one = nbt(1)
        inf = nbt(math.inf)
        n = nbt(dim)
        key = dropout_key(seed, counter)
        for t in range(cuda.blockIdx.x, num_tokens, cuda.gridDim.x):
            w = word_ids[t]
            p = pos_ids[t]
            k = type_ids[t]
            acc = zero
            for d in range(tid, dim, THREADS):
                s = (word[w, d] + token_type[k, d]) + position[p, d]
                y[t, d] = s
                acc += s
            first = block_sum(sh_a, acc) / n
            c = zero
            q = zero
            for d in range(tid, dim, THREADS):  # each thread reads back its own writes
                dev = y[t, d] - first
                c += dev
                q += dev * dev
            c, q = block_sum2(sh_a, sh_b, c, q)
            m, r = moments(first, c, q, n, eps, zero, one, inf)
            base = t * dim
            for d in range(tid, dim, THREADS):
                v = (y[t, d] - m) * r * gamma[d] + beta[d]
                if active:
                    v = v * (scale if keeps(key, base + d, threshold) else zero)
                y[t, d] = v
            if tid == 0:
                mean[t] = m
                rstd[t] = r

    return bert_forward_tokens


@cache
def _bert_backward_kernel(dtype):
    nbt = numba_float(dtype)

    @cuda.jit
    def bert_backward_tokens(grad_y, word_ids, pos_ids, type_ids, word, position, token_type,
                             gamma, mean, rstd, seed, counter, threshold, scale, active,
                             grad_sum):
        """One block per token: masked ``grad_y``, then the LayerNorm row backward.

        ``grad_sum[t]`` first holds ``g = (grad_y * mask) * gamma`` (each thread
        its own elements), then ``rstd * (g - mean(g) - xhat * mean(g * xhat))``.
        """
        sh_a = cuda.shared.array(THREADS, nbt)
        sh_b = cuda.shared.array(THREADS, nbt)
        tid = cuda.threadIdx.x
        num_tokens, dim = grad_y.shape
        zero = nbt(0)
        n = nbt(dim)
        key = dropout_key(seed, counter)
        for t in range(cuda.blockIdx.x, num_tokens, cuda.gridDim.x):
            w = word_ids[t]
            p = pos_ids[t]
            k = type_ids[t]
            m = mean[t]
            r = rstd[t]
            base = t * dim
            sg = zero
            sgx = zero
            for d in range(tid, dim, THREADS):
                s = (word[w, d] + token_type[k, d]) + position[p, d]
                gy = grad_y[t, d]
                if active:
                    gy = gy * (scale if keeps(key, base + d, threshold) else zero)
                g = gy * gamma[d]
                grad_sum[t, d] = g
                sg += g
                sgx += g * ((s - m) * r)
            sg, sgx = block_sum2(sh_a, sh_b, sg, sgx)
            a = sg / n
            b = sgx / n
            for d in range(tid, dim, THREADS):
                s = (word[w, d] + token_type[k, d]) + position[p, d]
                xhat = (s - m) * r
                grad_sum[t, d] = r * (grad_sum[t, d] - a - xhat * b)

    return bert_backward_tokens


@cache
def _bert_partials_kernel(dtype):
    nbt = numba_float(dtype)
    mul = mul_for(dtype)

    @cuda.jit
    def bert_partials(grad_y, word_ids, pos_ids, type_ids, word, position, token_type, mean,
                      rstd, seed, counter, threshold, scale, active, grad_sum, chunks, chunk,
                      want_w, want_b, want_t, part_w, part_b, part_t):
        """One thread per ``(chunk, d)``: its chunk's gamma / beta / token-type terms in order."""
        num_tokens, dim = grad_y.shape
        types = token_type.shape[0]
        zero = nbt(0)
        key = dropout_key(seed, counter)
        for j in range(cuda.grid(1), chunks * dim, cuda.gridsize(1)):
            c = j // dim
            d = j - c * dim
            start = c * chunk
            stop = min(start + chunk, num_tokens)
            if want_t:
                for k in range(types):
                    part_t[c, k, d] = zero
            pw = zero
            pb = zero
            for t in range(start, stop):
                if want_w or want_b:
                    gy = grad_y[t, d]
                    if active:
                        gy = mul(gy, scale if keeps(key, t * dim + d, threshold) else zero)
                    if want_w:
                        s = (word[word_ids[t], d] + token_type[type_ids[t], d]) \
                            + position[pos_ids[t], d]
                        pw += mul(gy, (s - mean[t]) * rstd[t])
                    if want_b:
                        pb += gy
                if want_t:
                    part_t[c, type_ids[t], d] += grad_sum[t, d]
            if want_w:
                part_w[c, d] = pw
            if want_b:
                part_b[c, d] = pb

    return bert_partials


@cuda.jit
def _gpt2_forward(ids, pos, wte, wpe, seed, counter, threshold, scale, active, zero, y):
    """Elementwise ``y[t, d] = (wte[ids[t], d] + wpe[pos[t], d])`` (times the mask).

    ``scale`` / ``zero`` are of ``y``'s dtype.
    """
    num_tokens, dim = y.shape
    key = dropout_key(seed, counter)
    for i in range(cuda.grid(1), num_tokens * dim, cuda.gridsize(1)):
        t = i // dim
        d = i - t * dim
        v = wte[ids[t], d] + wpe[pos[t], d]
        if active:
            v = v * (scale if keeps(key, i, threshold) else zero)
        y[t, d] = v
