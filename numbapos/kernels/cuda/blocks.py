"""CUDA launchers and kernels for the fused BERT and GPT-2 embedding blocks.

Twin of :mod:`numbapos.kernels.cpu.blocks` (same ``__all__``, signatures and
results). Flat views: ids are ``(T,)`` int64 (int32 in the forward kernels,
which widen them) device arrays, activations
``(T, D)`` C-contiguous; the dropout index of element ``(t, d)`` is
``t * D + d`` and its mask bit comes from the shared
:mod:`numbapos.kernels.hash` code, so the mask equals the CPU's bit for bit.

BERT forward: one block per token (blocks stride over the tokens), threads
along D. Each thread writes its elements of
``s = (word[w] + token_type[k]) + position[p]`` (the add order of the CPU and
of Hugging Face) into ``y[t]``, the block reduces the corrected two-pass
moments in shared memory (:mod:`.reduce`), and each thread then
normalises, applies gamma / beta and the dropout mask to its own elements in
place.

For float32 tables and output whose rows are whole, 16-byte aligned vectors
(:func:`.vector.aligned`, D % 4 == 0) the forward runs by 16-byte loads and
stores (``_bert_forward_vec``); otherwise by elements.

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

GPT-2 forward: one block per token, ``y[t, d] = (wte[ids[t], d] + wpe[pos[t], d]) *
mask``, bit-identical to the CPU. For float32 tables whose rows are whole,
16-byte aligned vectors (:func:`.vector.aligned`, D % 4 == 0) it runs by
16-byte loads and stores (``_gpt2_forward_vec``: each thread adds 4 adjacent
columns, the same operations per element, the same bits); otherwise by
elements.

Tables may also be bfloat16 / float16 ``uint16`` bits (format code ``fmt``):
every element is read through :func:`numbapos.kernels.widen.widen`, exactly as
on the CPU (the per-dtype kernels are compiled per format too; the vector paths
stay float32-only, so 16-bit tables run by elements).

Nothing here reads data back to the host, and each forward is ONE launch.
Ids are checked inside the kernels that read them: a bad word id, token type
or position is recorded in the deferred error word (:mod:`.errors`, with the
CPU's argument names) and its token's output row is zero-filled, no table row
being read. Positions and token types need no ``(T,)`` array: a
:class:`~numbapos._args.TiledIds` (default positions ``past_length + t % L``,
ids of shape ``(L,)`` broadcast over the batch, all-zero token types) is
expanded inside the kernel. The backward kernels write gradients, so they
return at once while an index error is pending (and skip any token whose ids
are out of range).
"""

import math
from functools import cache

import numpy as np
from numba import cuda, float32, int64

from ..._args import NO_DROPOUT, TiledIds, chunk_rows, num_chunks
from ..hash import keeps
from ..widen import FLOAT_TABLES, widen
from . import errors, vector
from .arrays import THREADS, grid
from .dropout import counter_args, counter_key
from .fpmath import mul_for, numba_float
from .launch import launch
from .normalization import add_partials, fill_zero, moments, row_blocks
from .reduce import block_sum, block_sum2, tree_threads
from .vector import load16, store16

__all__ = ["bert_backward", "bert_forward", "gpt2_forward", "gpt2_forward_checked", "tile_ids"]

# The CPU's names of the BERT / GPT-2 ids (those of its IndexError).
_WORD_TAG = ("input_ids", "vocab_size")
_BERT_POSITION_TAG = ("position_ids", "max_position_embeddings")
_TYPE_TAG = ("token_type_ids", "type_vocab_size")
_GPT2_POSITION_TAG = ("position_ids", "n_positions")


def _placeholder(dtype):
    """A one-element device array standing for an absent argument (never read or
    written), made once per context and dtype."""
    objects = errors.context_objects()
    key = ("placeholder", np.dtype(dtype))
    found = objects.get(key)
    if found is None:
        found = objects[key] = cuda.device_array(1, dtype=np.dtype(dtype))
    return found


def _ids_args(ids, num_tokens):
    """``(values, has_values, start, length)``: the kernel arguments of a flat ``(T,)`` id
    array or a :class:`~numbapos._args.TiledIds` (see :func:`_id_at`)."""
    if isinstance(ids, TiledIds):
        if ids.values is None:
            return _placeholder(np.int64), False, int64(ids.start), int64(max(ids.length, 1))
        return ids.values, True, int64(0), int64(max(ids.values.size, 1))
    return ids, True, int64(0), int64(max(num_tokens, 1))


def _affine_args(tables, dtype):
    """``(gamma, beta, has_gamma, has_beta)``: absent ones as unread placeholders (no fill)."""
    gamma = _placeholder(dtype) if tables.gamma is None else tables.gamma
    beta = _placeholder(dtype) if tables.beta is None else tables.beta
    return gamma, beta, tables.gamma is not None, tables.beta is not None


def _drop_scalars(drop, dtype):
    """The dropout arguments of a kernel: seed, counter, live (the device counter, or
    empty: :func:`.dropout.counter_args`), threshold, scale (cast), active."""
    counter, live = counter_args(drop)
    return drop.seed, counter, live, drop.threshold, dtype.type(drop.scale), bool(drop.active)


# ---------------------------------------------------------------- launchers


def bert_forward(ids, tables, eps, drop, y, mean, rstd, fmt=FLOAT_TABLES):
    """Fused gather + sum + LayerNorm (+ dropout) of every token: one launch.

    ``ids`` / ``tables`` / ``drop`` are :class:`~numbapos._args.BertIds` (its
    position and token-type entries may be :class:`~numbapos._args.TiledIds`),
    :class:`~numbapos._args.BertTables` and :class:`~numbapos._args.DropoutArgs`;
    ``y`` is ``(T, D)``, ``mean`` and ``rstd`` ``(T,)``. Ids are range-checked
    in the kernel (deferred errors; a bad token's ``y`` row, mean and rstd
    are zeros). ``fmt``: the tables' format, as on the CPU (16-bit tables as
    ``uint16`` bits, widened exactly in the kernel, which is compiled per format).
    """
    num_tokens = y.shape[0]
    if num_tokens == 0:
        return
    dtype = y.dtype
    word, host = errors.words()
    if _vector_rows(y, tables.word, tables.position, tables.token_type):
        launch(_bert_forward_vec, row_blocks(num_tokens), tree_threads(y.shape[1] // 4),
               ids.word, *_ids_args(ids.position, num_tokens),
               *_ids_args(ids.token_type, num_tokens), tables.word, tables.position,
               tables.token_type, *_affine_args(tables, dtype), dtype.type(eps),
               *_drop_scalars(drop, dtype), y, mean, rstd, word, host, errors.tag(*_WORD_TAG),
               errors.tag(*_BERT_POSITION_TAG), errors.tag(*_TYPE_TAG))
        errors.after_launch()
        return
    launch(_bert_forward_kernel(dtype, fmt), row_blocks(num_tokens), tree_threads(y.shape[1]),
           ids.word, *_ids_args(ids.position, num_tokens),
           *_ids_args(ids.token_type, num_tokens), tables.word, tables.position,
           tables.token_type, *_affine_args(tables, dtype), dtype.type(eps),
           *_drop_scalars(drop, dtype), y, mean, rstd, word, host, errors.tag(*_WORD_TAG),
           errors.tag(*_BERT_POSITION_TAG), errors.tag(*_TYPE_TAG))
    errors.after_launch()


def bert_backward(grad_y, ids, tables, mean, rstd, drop, grad_sum, grad_gamma, grad_beta,
                  grad_type, fmt=FLOAT_TABLES):
    """Dropout + LayerNorm backward per token: ``grad_sum[t]`` = d(loss)/d(row sum of t).

    ``grad_gamma`` / ``grad_beta`` (``(D,)``) and ``grad_type`` (the token-type
    table's gradient, ``(type_vocab, D)``) are outputs, or None when not
    wanted; each is summed per fixed chunk of tokens and the chunks added in
    order (no atomics; the same order as the CPU). Nothing is written while
    an index error is pending. ``fmt`` as for :func:`bert_forward`.
    """
    num_tokens, dim = grad_y.shape
    dtype = grad_y.dtype
    wanted = [out for out in (grad_gamma, grad_beta, grad_type) if out is not None]
    if num_tokens == 0:
        for out in wanted:
            fill_zero(out)
        return
    gamma, _, has_gamma, _ = _affine_args(tables, dtype)
    drop_args = _drop_scalars(drop, dtype)
    id_args = (ids.word, *_ids_args(ids.position, num_tokens),
               *_ids_args(ids.token_type, num_tokens))
    word = errors.device_word()
    launch(_bert_backward_kernel(dtype, fmt), row_blocks(num_tokens),
           tree_threads(grad_y.shape[1]),
           grad_y, *id_args, tables.word, tables.position, tables.token_type, gamma, has_gamma,
           mean, rstd, *drop_args, grad_sum, word)
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
    launch(_bert_partials_kernel(dtype, fmt), grid(chunks * dim), THREADS, grad_y, *id_args,
           tables.word, tables.position, tables.token_type, mean, rstd, *drop_args, grad_sum,
           chunks, chunk_rows(num_tokens), want_w, want_b, want_t, part_w, part_b, part_t, word)
    if want_w:
        add_partials(part_w, grad_gamma)
    if want_b:
        add_partials(part_b, grad_beta)
    if want_t:
        add_partials(part_t, grad_type)


def gpt2_forward_checked(ids, past_length, length, wte, wpe, y, fmt=FLOAT_TABLES):
    """``y[t] = wte[ids[t]] + wpe[past_length + t % length]``, ids not range-checked yet.

    The CPU twin returns -1 or the first bad position; here the ids are
    checked in the one launch (deferred error, the bad token's row zeroed)
    and -1 is returned without waiting. Positions are computed in the kernel.
    """
    gpt2_forward(ids, TiledIds(None, past_length, length), wte, wpe, NO_DROPOUT, y, fmt)
    return -1


def gpt2_forward(ids, pos, wte, wpe, drop, y, fmt=FLOAT_TABLES):
    """``y[t] = (wte[ids[t]] + wpe[pos[t]]) * dropout mask`` for ``(T, D)`` ``y``: one launch.

    ``pos`` is a flat ``(T,)`` array or a :class:`~numbapos._args.TiledIds`.
    Ids and positions are range-checked in the kernel (deferred errors; a
    bad token's row is zeros). ``fmt`` as for :func:`bert_forward` (16-bit
    tables as ``uint16`` bits, by elements).
    """
    num_tokens, dim = y.shape
    if num_tokens == 0 or dim == 0:
        return
    word, host = errors.words()
    if _vector_rows(y, wte, wpe):
        launch(_gpt2_forward_vec, row_blocks(num_tokens), _row_threads(dim // 4), ids,
               *_ids_args(pos, num_tokens), wte, wpe, *_drop_scalars(drop, y.dtype),
               y.dtype.type(0), y, word, host, errors.tag(*_WORD_TAG),
               errors.tag(*_GPT2_POSITION_TAG))
    else:
        launch(_gpt2_forward, row_blocks(num_tokens), _row_threads(dim), ids,
               *_ids_args(pos, num_tokens), wte, wpe, int64(fmt), *_drop_scalars(drop, y.dtype),
               y.dtype.type(0), y, word, host, errors.tag(*_WORD_TAG),
               errors.tag(*_GPT2_POSITION_TAG))
    errors.after_launch()


def tile_ids(values, start, length, out):
    """``out[t] = values[t % length]``, or ``start + t % length`` when ``values`` is None.

    Expands a :class:`~numbapos._args.TiledIds` into a flat int64 ``out`` on
    the device (for the gradient scatter, which needs one id per token).
    """
    if out.size:
        has = values is not None
        vals = values if has else _placeholder(np.int64)
        launch(_tile_ids, grid(out.size), THREADS, vals, has, int64(start), int64(max(length, 1)),
               out)


def _vector_rows(*arrays) -> bool:
    """Whether float32 rows can be moved by 16-byte vectors (:func:`.vector.aligned`)."""
    return all(a.dtype == np.float32 for a in arrays) and vector.aligned(*arrays)


def _row_threads(dim: int) -> int:
    """Whole warps covering ``dim``, at most THREADS."""
    return min(THREADS, -(-dim // 32) * 32)


# ---------------------------------------------------------------- kernels


@cuda.jit(device=True)
def _id_at(values, has, start, length, t):
    """Id of token ``t``: ``values[t % length]``, or ``start + t % length``."""
    j = t % length
    if has:
        return int64(values[j])
    return start + j


@cuda.jit(device=True)
def _outside(value, size):
    return value < 0 or value >= size


@cuda.jit(device=True)
def _bert_bad_token(t, w, k, p, word, position, token_type, y, mean, rstd, zero, err,
                    err_host, word_tag, pos_tag, type_tag):
    """Whether token ``t``'s ids ``w`` / ``k`` / ``p`` are out of range; if so, thread 0
    records them (word, token type, then position: the CPU's order) and zeroes its mean
    and rstd, and the block zero-fills ``y[t]``."""
    bad_w = _outside(w, word.shape[0])
    bad_k = _outside(k, token_type.shape[0])
    bad_p = _outside(p, position.shape[0])
    if not (bad_w or bad_k or bad_p):
        return False
    if cuda.threadIdx.x == 0:
        if bad_w:
            errors.record(err, err_host, int64(t), w, int64(word.shape[0]), word_tag)
        if bad_k:
            errors.record(err, err_host, int64(t), k, int64(token_type.shape[0]), type_tag)
        if bad_p:
            errors.record(err, err_host, int64(t), p, int64(position.shape[0]), pos_tag)
        mean[t] = zero
        rstd[t] = zero
    for d in range(cuda.threadIdx.x, y.shape[1], cuda.blockDim.x):
        y[t, d] = zero
    return True


@cuda.jit(device=True)
def _bert_output(s, m, r, gamma, beta, has_gamma, has_beta, d, key, index, threshold, scale,
                 active, one, zero):
    """Element ``d`` of a BERT output from its row sum ``s``: normalised, gamma / beta
    (or the ones / zeros the CPU uses), then the dropout mask of element ``index``."""
    v = (s - m) * r
    if has_gamma:
        v = v * gamma[d]
    else:
        v = v * one
    if has_beta:
        v = v + beta[d]
    else:
        v = v + zero
    if active:
        v = v * (scale if keeps(key, index, threshold) else zero)
    return v


@cache
def _bert_forward_kernel(dtype, fmt=FLOAT_TABLES):
    """The scalar BERT forward for ``dtype`` outputs and tables of format ``fmt``."""
    nbt = numba_float(dtype)

    @cuda.jit
    def bert_forward_tokens(word_ids, pos_vals, pos_has, pos_start, pos_len, type_vals,
                            type_has, type_start, type_len, word, position, token_type, gamma,
                            beta, has_gamma, has_beta, eps, seed, counter, live, threshold, scale,
                            active, y, mean, rstd, err, err_host, word_tag, pos_tag, type_tag):
        """One block per token: check its ids, ``s`` into ``y[t]``, moments, then normalise
        (+ dropout). A token with a bad id records it (thread 0: word, token type, then
        position, the CPU's order) and gets zeros."""
        sh = cuda.shared.array((2, THREADS), nbt)
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x  # a power of two, tree_threads(...)
        num_tokens, dim = y.shape
        zero = nbt(0)
        one = nbt(1)
        inf = nbt(math.inf)
        n = nbt(dim)
        key = counter_key(seed, counter, live)
        for t in range(cuda.blockIdx.x, num_tokens, cuda.gridDim.x):
            w = int64(word_ids[t])
            k = _id_at(type_vals, type_has, type_start, type_len, t)
            p = _id_at(pos_vals, pos_has, pos_start, pos_len, t)
            if _bert_bad_token(t, w, k, p, word, position, token_type, y, mean, rstd, zero, err,
                               err_host, word_tag, pos_tag, type_tag):
                continue  # the same for every thread of the block
            acc = zero
            for d in range(tid, dim, nt):
                s = (widen(word[w, d], fmt) + widen(token_type[k, d], fmt)) \
                    + widen(position[p, d], fmt)
                y[t, d] = s
                acc += s
            first = block_sum(sh, acc, tid, nt) / n
            c = zero
            q = zero
            for d in range(tid, dim, nt):  # each thread reads back its own writes
                dev = y[t, d] - first
                c += dev
                q += dev * dev
            c, q = block_sum2(sh, c, q, tid, nt)
            m, r = moments(first, c, q, n, eps, zero, one, inf)
            base = t * dim
            for d in range(tid, dim, nt):
                y[t, d] = _bert_output(y[t, d], m, r, gamma, beta, has_gamma, has_beta, d,
                                       key, base + d, threshold, scale, active, one, zero)
            if tid == 0:
                mean[t] = m
                rstd[t] = r

    return bert_forward_tokens


@cuda.jit
def _bert_forward_vec(word_ids, pos_vals, pos_has, pos_start, pos_len, type_vals, type_has,
                      type_start, type_len, word, position, token_type, gamma, beta, has_gamma,
                      has_beta, eps, seed, counter, live, threshold, scale, active, y, mean,
                      rstd, err, err_host, word_tag, pos_tag, type_tag):
    """The float32 BERT forward by 16-byte vectors (the launcher checked
    :func:`.vector.aligned` for the three tables and ``y``): each thread owns 4 adjacent
    columns at a time, with the three table loads of a vector in flight together. The
    per-element arithmetic is the scalar kernel's; only which thread adds which elements
    into the moments differs (the moments agree with the CPU to a few ulp, as there)."""
    sh = cuda.shared.array((2, THREADS), float32)
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x  # a power of two, tree_threads(...)
    num_tokens, dim = y.shape
    vectors = dim // 4
    zero = float32(0)
    one = float32(1)
    n = float32(dim)
    key = counter_key(seed, counter, live)
    for t in range(cuda.blockIdx.x, num_tokens, cuda.gridDim.x):
        w = int64(word_ids[t])
        k = _id_at(type_vals, type_has, type_start, type_len, t)
        p = _id_at(pos_vals, pos_has, pos_start, pos_len, t)
        if _bert_bad_token(t, w, k, p, word, position, token_type, y, mean, rstd, zero, err,
                           err_host, word_tag, pos_tag, type_tag):
            continue  # the same for every thread of the block
        acc = zero
        for v in range(tid, vectors, nt):
            wv = load16(word, w, 4 * v)
            kv = load16(token_type, k, 4 * v)
            pv = load16(position, p, 4 * v)
            s = ((wv[0] + kv[0]) + pv[0], (wv[1] + kv[1]) + pv[1], (wv[2] + kv[2]) + pv[2],
                 (wv[3] + kv[3]) + pv[3])
            store16(y, t, 4 * v, s)
            for x in s:
                acc += x
        first = block_sum(sh, acc, tid, nt) / n
        c = zero
        q = zero
        for v in range(tid, vectors, nt):  # each thread reads back its own writes
            for x in load16(y, t, 4 * v):
                dev = x - first
                c += dev
                q += dev * dev
        c, q = block_sum2(sh, c, q, tid, nt)
        m, r = moments(first, c, q, n, eps, zero, one, float32(math.inf))
        base = t * dim
        for v in range(tid, vectors, nt):
            d = 4 * v
            s = load16(y, t, d)
            store16(y, t, d, (
                _bert_output(s[0], m, r, gamma, beta, has_gamma, has_beta, d, key, base + d,
                             threshold, scale, active, one, zero),
                _bert_output(s[1], m, r, gamma, beta, has_gamma, has_beta, d + 1, key,
                             base + d + 1, threshold, scale, active, one, zero),
                _bert_output(s[2], m, r, gamma, beta, has_gamma, has_beta, d + 2, key,
                             base + d + 2, threshold, scale, active, one, zero),
                _bert_output(s[3], m, r, gamma, beta, has_gamma, has_beta, d + 3, key,
                             base + d + 3, threshold, scale, active, one, zero)))
        if tid == 0:
            mean[t] = m
            rstd[t] = r


@cache
def _bert_backward_kernel(dtype, fmt=FLOAT_TABLES):
    nbt = numba_float(dtype)

    @cuda.jit
    def bert_backward_tokens(grad_y, word_ids, pos_vals, pos_has, pos_start, pos_len,
                             type_vals, type_has, type_start, type_len, word, position,
                             token_type, gamma, has_gamma, mean, rstd, seed, counter, live,
                             threshold, scale, active, grad_sum, err):
        """One block per token: masked ``grad_y``, then the LayerNorm row backward.

        ``grad_sum[t]`` first holds ``g = (grad_y * mask) * gamma`` (each thread
        its own elements), then ``rstd * (g - mean(g) - xhat * mean(g * xhat))``.
        Returns at once while an index error is pending; a token with an id
        out of range (always also recorded by then) is skipped.
        """
        if errors.is_pending(err):
            return
        sh = cuda.shared.array((2, THREADS), nbt)
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x  # a power of two, tree_threads(...)
        num_tokens, dim = grad_y.shape
        zero = nbt(0)
        one = nbt(1)
        n = nbt(dim)
        key = counter_key(seed, counter, live)
        for t in range(cuda.blockIdx.x, num_tokens, cuda.gridDim.x):
            w = int64(word_ids[t])
            k = _id_at(type_vals, type_has, type_start, type_len, t)
            p = _id_at(pos_vals, pos_has, pos_start, pos_len, t)
            if (_outside(w, word.shape[0]) or _outside(k, token_type.shape[0])
                    or _outside(p, position.shape[0])):
                continue  # the same for every thread of the block
            m = mean[t]
            r = rstd[t]
            base = t * dim
            sg = zero
            sgx = zero
            for d in range(tid, dim, nt):
                s = (widen(word[w, d], fmt) + widen(token_type[k, d], fmt)) \
                    + widen(position[p, d], fmt)
                gy = grad_y[t, d]
                if active:
                    gy = gy * (scale if keeps(key, base + d, threshold) else zero)
                g = gy * (gamma[d] if has_gamma else one)
                grad_sum[t, d] = g
                sg += g
                sgx += g * ((s - m) * r)
            sg, sgx = block_sum2(sh, sg, sgx, tid, nt)
            a = sg / n
            b = sgx / n
            for d in range(tid, dim, nt):
                s = (widen(word[w, d], fmt) + widen(token_type[k, d], fmt)) \
                    + widen(position[p, d], fmt)
                xhat = (s - m) * r
                grad_sum[t, d] = r * (grad_sum[t, d] - a - xhat * b)

    return bert_backward_tokens


@cache
def _bert_partials_kernel(dtype, fmt=FLOAT_TABLES):
    nbt = numba_float(dtype)
    mul = mul_for(dtype)

    @cuda.jit
    def bert_partials(grad_y, word_ids, pos_vals, pos_has, pos_start, pos_len, type_vals,
                      type_has, type_start, type_len, word, position, token_type, mean, rstd,
                      seed, counter, live, threshold, scale, active, grad_sum, chunks, chunk,
                      want_w, want_b, want_t, part_w, part_b, part_t, err):
        """One thread per ``(chunk, d)``: its chunk's gamma / beta / token-type terms in order.

        Returns at once while an index error is pending (tokens with ids out of
        range, always recorded by then, are skipped).
        """
        if errors.is_pending(err):
            return
        num_tokens, dim = grad_y.shape
        types = token_type.shape[0]
        zero = nbt(0)
        key = counter_key(seed, counter, live)
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
                w = int64(word_ids[t])
                k = _id_at(type_vals, type_has, type_start, type_len, t)
                p = _id_at(pos_vals, pos_has, pos_start, pos_len, t)
                if (_outside(w, word.shape[0]) or _outside(k, types)
                        or _outside(p, position.shape[0])):
                    continue
                if want_w or want_b:
                    gy = grad_y[t, d]
                    if active:
                        gy = mul(gy, scale if keeps(key, t * dim + d, threshold) else zero)
                    if want_w:
                        s = (widen(word[w, d], fmt) + widen(token_type[k, d], fmt)) \
                            + widen(position[p, d], fmt)
                        pw += mul(gy, (s - mean[t]) * rstd[t])
                    if want_b:
                        pb += gy
                if want_t:
                    part_t[c, k, d] += grad_sum[t, d]
            if want_w:
                part_w[c, d] = pw
            if want_b:
                part_b[c, d] = pb

    return bert_partials


@cuda.jit
def _gpt2_forward(ids, pos_vals, pos_has, pos_start, pos_len, wte, wpe, fmt, seed, counter, live,
                  threshold, scale, active, zero, y, err, err_host, word_tag, pos_tag):
    """One block per token, threads along D: ``y[t, d] = wte[ids[t], d] + wpe[pos[t], d]``
    (times the mask). The id and position are read and checked once per token; a bad
    one is recorded (thread 0) and the row is zeros. ``scale`` / ``zero`` are of
    ``y``'s dtype; 16-bit tables (``uint16`` bits of format ``fmt``) are widened."""
    num_tokens, dim = y.shape
    key = counter_key(seed, counter, live)
    tid = cuda.threadIdx.x
    for t in range(cuda.blockIdx.x, num_tokens, cuda.gridDim.x):
        w = int64(ids[t])
        p = _id_at(pos_vals, pos_has, pos_start, pos_len, t)
        bad_w = _outside(w, wte.shape[0])
        bad_p = _outside(p, wpe.shape[0])
        if bad_w or bad_p:
            if tid == 0:
                if bad_w:
                    errors.record(err, err_host, int64(t), w, int64(wte.shape[0]), word_tag)
                if bad_p:
                    errors.record(err, err_host, int64(t), p, int64(wpe.shape[0]), pos_tag)
            for d in range(tid, dim, cuda.blockDim.x):
                y[t, d] = zero
            continue
        base = t * dim
        for d in range(tid, dim, cuda.blockDim.x):
            v = widen(wte[w, d], fmt) + widen(wpe[p, d], fmt)
            if active:
                v = v * (scale if keeps(key, base + d, threshold) else zero)
            y[t, d] = v


@cuda.jit(device=True)
def _dropped(v, key, index, threshold, scale, zero, active):
    """``v`` times element ``index``'s dropout factor (``scale`` or ``zero``) when ``active``."""
    if active:
        return v * (scale if keeps(key, index, threshold) else zero)
    return v


@cuda.jit
def _gpt2_forward_vec(ids, pos_vals, pos_has, pos_start, pos_len, wte, wpe, seed, counter, live,
                      threshold, scale, active, zero, y, err, err_host, word_tag, pos_tag):
    """:func:`_gpt2_forward` by float32 vectors (the launcher checked
    :func:`.vector.aligned`): each thread loads 4 adjacent columns of both rows (two
    16-byte loads in flight), adds and masks them element by element as there, and
    stores them at once."""
    num_tokens, dim = y.shape
    key = counter_key(seed, counter, live)
    tid = cuda.threadIdx.x
    for t in range(cuda.blockIdx.x, num_tokens, cuda.gridDim.x):
        w = int64(ids[t])
        p = _id_at(pos_vals, pos_has, pos_start, pos_len, t)
        bad_w = _outside(w, wte.shape[0])
        bad_p = _outside(p, wpe.shape[0])
        if bad_w or bad_p:
            if tid == 0:
                if bad_w:
                    errors.record(err, err_host, int64(t), w, int64(wte.shape[0]), word_tag)
                if bad_p:
                    errors.record(err, err_host, int64(t), p, int64(wpe.shape[0]), pos_tag)
            for d in range(tid, dim, cuda.blockDim.x):
                y[t, d] = zero
            continue
        base = t * dim
        for v in range(tid, dim // 4, cuda.blockDim.x):
            d = 4 * v
            a = load16(wte, w, d)
            b = load16(wpe, p, d)
            i = base + d
            store16(y, t, d, (_dropped(a[0] + b[0], key, i, threshold, scale, zero, active),
                              _dropped(a[1] + b[1], key, i + 1, threshold, scale, zero, active),
                              _dropped(a[2] + b[2], key, i + 2, threshold, scale, zero, active),
                              _dropped(a[3] + b[3], key, i + 3, threshold, scale, zero, active)))


@cuda.jit
def _tile_ids(values, has, start, length, out):
    """``out[t]`` = the id of token ``t`` (:func:`_id_at`), elementwise."""
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[t] = _id_at(values, has, start, length, t)
