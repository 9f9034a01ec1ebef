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

Tables may also be bfloat16 / float16 ``uint16`` bits (``fmt``, a
:class:`~numbapos._args.TableFormat`):
every element is read through :func:`numbapos.kernels.widen.widen`, exactly as
on the CPU (the per-dtype kernels are compiled per format too; the vector paths
stay float32-only, so 16-bit tables run by elements).

The kernels take the launchers' records (:mod:`numbapos._args`: BertIds,
BertTables, DropoutArgs, TiledIds), an absent array among them as an empty one
(see :func:`_kernel_ids`).

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

from ..._args import NO_DROPOUT, BertIds, TiledIds, chunk_rows, num_chunks
from ..hash import keeps
from ..widen import FLOAT_TABLES, widen
from . import errors, vector
from .arrays import THREADS, absent, grid
from .dropout import drop_key, kernel_drop
from .fpmath import mul_for, numba_float
from .launch import launch
from .normalization import add_partials, fill_zero, moments, partials, row_blocks
from .reduce import block_sum, block_sum2, tree_threads
from .vector import load16, store16

__all__ = ["bert_backward", "bert_forward", "gpt2_forward", "gpt2_forward_checked", "tile_ids"]

# The CPU's names of the BERT / GPT-2 ids (those of its IndexError).
_WORD_TAG = ("input_ids", "vocab_size")
_BERT_POSITION_TAG = ("position_ids", "max_position_embeddings")
_TYPE_TAG = ("token_type_ids", "type_vocab_size")
_GPT2_POSITION_TAG = ("position_ids", "n_positions")


# ---------------------------------------------------------------- kernel records
#
# The kernels take the launchers' records (numbapos._args) with what a kernel can
# read in place of what it cannot: ids as TiledIds, an absent array (computed ids,
# no LayerNorm weight or bias) as an empty one, which the kernels test with
# ``.size``, and the dropout scale cast to the data's dtype (.dropout.kernel_drop).


def _kernel_ids(ids, num_tokens):
    """A flat ``(T,)`` id array or a :class:`~numbapos._args.TiledIds` as the
    :class:`~numbapos._args.TiledIds` kernels read (:func:`_id_at`): ``values`` empty for
    computed ids, and a flat array the tiling of itself."""
    if isinstance(ids, TiledIds):
        if ids.values is None:
            return TiledIds(absent(np.int64), int64(ids.start), int64(max(ids.length, 1)))
        return TiledIds(ids.values, int64(0), int64(max(ids.values.size, 1)))
    return TiledIds(ids, int64(0), int64(max(num_tokens, 1)))


def _kernel_bert_ids(ids, num_tokens):
    """:class:`~numbapos._args.BertIds` as the kernels read them: word ids flat, position
    and token-type ids as :func:`_kernel_ids`."""
    return BertIds(ids.word, _kernel_ids(ids.position, num_tokens),
                   _kernel_ids(ids.token_type, num_tokens))


def _kernel_tables(tables, dtype):
    """:class:`~numbapos._args.BertTables` with an absent LayerNorm weight / bias empty (the
    kernels then use the ones / zeros the CPU substitutes; nothing is filled)."""
    if tables.gamma is not None and tables.beta is not None:
        return tables
    return tables._replace(gamma=absent(dtype) if tables.gamma is None else tables.gamma,
                           beta=absent(dtype) if tables.beta is None else tables.beta)


@cache
def _tags(*names):
    """The deferred-error tags of the ids named (the CPU's names), as the kernels take them."""
    return tuple(int64(errors.tag(*name)) for name in names)


# ---------------------------------------------------------------- launchers


def bert_forward(ids, tables, eps, drop, y, mean, rstd, fmt=FLOAT_TABLES):
    """Fused gather + sum + LayerNorm (+ dropout) of every token: one launch.

    ``ids`` / ``tables`` / ``drop`` are :class:`~numbapos._args.BertIds` (its
    position and token-type entries may be :class:`~numbapos._args.TiledIds`),
    :class:`~numbapos._args.BertTables` and :class:`~numbapos._args.DropoutArgs`;
    ``y`` is ``(T, D)``, ``mean`` and ``rstd`` ``(T,)``. Ids are range-checked
    in the kernel (deferred errors; a bad token's ``y`` row, mean and rstd
    are zeros). ``fmt``: the tables' :class:`~numbapos._args.TableFormat`, as on
    the CPU (16-bit tables as ``uint16`` bits, widened exactly in the kernel,
    which is compiled per format).
    """
    num_tokens = y.shape[0]
    if num_tokens == 0:
        return
    dtype = y.dtype
    word, host = errors.words()
    if _vector_rows(y, tables.word, tables.position, tables.token_type):
        kernel, threads = _bert_forward_vec, tree_threads(y.shape[1] // 4)
    else:
        kernel, threads = _bert_forward_kernel(dtype, int(fmt)), tree_threads(y.shape[1])
    launch(kernel, row_blocks(num_tokens), threads, _kernel_bert_ids(ids, num_tokens),
           _kernel_tables(tables, dtype), dtype.type(eps), kernel_drop(drop, dtype), y, mean,
           rstd, word, host, _tags(_WORD_TAG, _BERT_POSITION_TAG, _TYPE_TAG))
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
    fmt = int(fmt)
    ids = _kernel_bert_ids(ids, num_tokens)
    tables = _kernel_tables(tables, dtype)
    drop = kernel_drop(drop, dtype)
    word = errors.device_word()
    launch(_bert_backward_kernel(dtype, fmt), row_blocks(num_tokens),
           tree_threads(grad_y.shape[1]), grad_y, ids, tables, mean, rstd, drop, grad_sum, word)
    if not wanted:
        return
    chunks = num_chunks(num_tokens)
    types = tables.token_type.shape[0]
    # The partials of an unwanted gradient are empty: the kernel sums into the others.
    part_w = partials(grad_gamma is not None, (chunks, dim), dtype)
    part_b = partials(grad_beta is not None, (chunks, dim), dtype)
    part_t = partials(grad_type is not None, (chunks, types, dim), dtype)
    launch(_bert_partials_kernel(dtype, fmt), grid(chunks * dim), THREADS, grad_y, ids, tables,
           mean, rstd, drop, grad_sum, chunks, chunk_rows(num_tokens), part_w, part_b, part_t,
           word)
    for part, out in ((part_w, grad_gamma), (part_b, grad_beta), (part_t, grad_type)):
        if out is not None:
            add_partials(part, out)


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
    pos, drop = _kernel_ids(pos, num_tokens), kernel_drop(drop, y.dtype)
    tags = _tags(_WORD_TAG, _GPT2_POSITION_TAG)
    if _vector_rows(y, wte, wpe):
        launch(_gpt2_forward_vec, row_blocks(num_tokens), _row_threads(dim // 4), ids, pos, wte,
               wpe, drop, y, word, host, tags)
    else:
        launch(_gpt2_forward, row_blocks(num_tokens), _row_threads(dim), ids, pos, wte, wpe,
               drop, y, int64(fmt), word, host, tags)
    errors.after_launch()


def tile_ids(values, start, length, out):
    """``out[t] = values[t % length]``, or ``start + t % length`` when ``values`` is None.

    Expands a :class:`~numbapos._args.TiledIds` into a flat int64 ``out`` on
    the device (for the gradient scatter, which needs one id per token).
    """
    if out.size:
        ids = TiledIds(absent(np.int64) if values is None else values, int64(start),
                       int64(max(length, 1)))
        launch(_tile_ids, grid(out.size), THREADS, ids, out)


def _vector_rows(*arrays) -> bool:
    """Whether float32 rows can be moved by 16-byte vectors (:func:`.vector.aligned`)."""
    return all(a.dtype == np.float32 for a in arrays) and vector.aligned(*arrays)


def _row_threads(dim: int) -> int:
    """Whole warps covering ``dim``, at most THREADS."""
    return min(THREADS, -(-dim // 32) * 32)


# ---------------------------------------------------------------- kernels


@cuda.jit(device=True)
def _id_at(ids, t):
    """Id of token ``t`` of the :class:`~numbapos._args.TiledIds` ``ids``:
    ``values[t % length]``, or ``start + t % length`` when ``values`` is empty."""
    j = t % ids.length
    if ids.values.size:
        return int64(ids.values[j])
    return ids.start + j


@cuda.jit(device=True)
def _outside(value, size):
    return value < 0 or value >= size


@cuda.jit(device=True)
def _bert_bad_token(t, w, k, p, tables, y, mean, rstd, zero, err, err_host, tags):
    """Whether token ``t``'s ids ``w`` / ``k`` / ``p`` are out of range; if so, thread 0
    records them (word, token type, then position: the CPU's order; ``tags`` those of
    the word, position and token-type ids) and zeroes its mean and rstd, and the block
    zero-fills ``y[t]``."""
    bad_w = _outside(w, tables.word.shape[0])
    bad_k = _outside(k, tables.token_type.shape[0])
    bad_p = _outside(p, tables.position.shape[0])
    if not (bad_w or bad_k or bad_p):
        return False
    if cuda.threadIdx.x == 0:
        if bad_w:
            errors.record(err, err_host, int64(t), w, int64(tables.word.shape[0]), tags[0])
        if bad_k:
            errors.record(err, err_host, int64(t), k, int64(tables.token_type.shape[0]),
                          tags[2])
        if bad_p:
            errors.record(err, err_host, int64(t), p, int64(tables.position.shape[0]), tags[1])
        mean[t] = zero
        rstd[t] = zero
    for d in range(cuda.threadIdx.x, y.shape[1], cuda.blockDim.x):
        y[t, d] = zero
    return True


@cuda.jit(device=True)
def _bert_output(s, m, r, tables, d, key, index, drop, one, zero):
    """Element ``d`` of a BERT output from its row sum ``s``: normalised, gamma / beta
    (or the ones / zeros the CPU uses when they are empty), then the dropout mask of
    element ``index``."""
    v = (s - m) * r
    if tables.gamma.size:
        v = v * tables.gamma[d]
    else:
        v = v * one
    if tables.beta.size:
        v = v + tables.beta[d]
    else:
        v = v + zero
    if drop.active:
        v = v * (drop.scale if keeps(key, index, drop.threshold) else zero)
    return v


@cuda.jit(device=True)
def _row_sum(tables, w, k, p, d, fmt):
    """``(word[w, d] + token_type[k, d]) + position[p, d]``, each widened (the CPU's order)."""
    return (widen(tables.word[w, d], fmt) + widen(tables.token_type[k, d], fmt)) \
        + widen(tables.position[p, d], fmt)


@cache
def _bert_forward_kernel(dtype, fmt=FLOAT_TABLES):
    """The scalar BERT forward for ``dtype`` outputs and tables of format ``fmt`` (an int)."""
    nbt = numba_float(dtype)

    @cuda.jit
    def bert_forward_tokens(ids, tables, eps, drop, y, mean, rstd, err, err_host, tags):
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
        key = drop_key(drop)
        for t in range(cuda.blockIdx.x, num_tokens, cuda.gridDim.x):
            w = int64(ids.word[t])
            k = _id_at(ids.token_type, t)
            p = _id_at(ids.position, t)
            if _bert_bad_token(t, w, k, p, tables, y, mean, rstd, zero, err, err_host, tags):
                continue  # the same for every thread of the block
            acc = zero
            for d in range(tid, dim, nt):
                s = _row_sum(tables, w, k, p, d, fmt)
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
                y[t, d] = _bert_output(y[t, d], m, r, tables, d, key, base + d, drop, one, zero)
            if tid == 0:
                mean[t] = m
                rstd[t] = r

    return bert_forward_tokens


@cuda.jit
def _bert_forward_vec(ids, tables, eps, drop, y, mean, rstd, err, err_host, tags):
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
    key = drop_key(drop)
    for t in range(cuda.blockIdx.x, num_tokens, cuda.gridDim.x):
        w = int64(ids.word[t])
        k = _id_at(ids.token_type, t)
        p = _id_at(ids.position, t)
        if _bert_bad_token(t, w, k, p, tables, y, mean, rstd, zero, err, err_host, tags):
            continue  # the same for every thread of the block
        acc = zero
        for v in range(tid, vectors, nt):
            wv = load16(tables.word, w, 4 * v)
            kv = load16(tables.token_type, k, 4 * v)
            pv = load16(tables.position, p, 4 * v)
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
                _bert_output(s[0], m, r, tables, d, key, base + d, drop, one, zero),
                _bert_output(s[1], m, r, tables, d + 1, key, base + d + 1, drop, one, zero),
                _bert_output(s[2], m, r, tables, d + 2, key, base + d + 2, drop, one, zero),
                _bert_output(s[3], m, r, tables, d + 3, key, base + d + 3, drop, one, zero)))
        if tid == 0:
            mean[t] = m
            rstd[t] = r


@cuda.jit(device=True)
def _bert_token_ids(ids, tables, t):
    """``(w, k, p, ok)``: token ``t``'s word, token-type and position ids, and whether all
    three are in range (a token with a bad one, recorded by the forward, is skipped)."""
    w = int64(ids.word[t])
    k = _id_at(ids.token_type, t)
    p = _id_at(ids.position, t)
    ok = not (_outside(w, tables.word.shape[0]) or _outside(k, tables.token_type.shape[0])
              or _outside(p, tables.position.shape[0]))
    return w, k, p, ok


@cache
def _bert_backward_kernel(dtype, fmt=FLOAT_TABLES):
    nbt = numba_float(dtype)

    @cuda.jit
    def bert_backward_tokens(grad_y, ids, tables, mean, rstd, drop, grad_sum, err):
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
        key = drop_key(drop)
        has_gamma = tables.gamma.size != 0
        for t in range(cuda.blockIdx.x, num_tokens, cuda.gridDim.x):
            w, k, p, ok = _bert_token_ids(ids, tables, t)
            if not ok:
                continue  # the same for every thread of the block
            m = mean[t]
            r = rstd[t]
            base = t * dim
            sg = zero
            sgx = zero
            for d in range(tid, dim, nt):
                s = _row_sum(tables, w, k, p, d, fmt)
                gy = grad_y[t, d]
                if drop.active:
                    gy = gy * (drop.scale if keeps(key, base + d, drop.threshold) else zero)
                g = gy * (tables.gamma[d] if has_gamma else one)
                grad_sum[t, d] = g
                sg += g
                sgx += g * ((s - m) * r)
            sg, sgx = block_sum2(sh, sg, sgx, tid, nt)
            a = sg / n
            b = sgx / n
            for d in range(tid, dim, nt):
                xhat = (_row_sum(tables, w, k, p, d, fmt) - m) * r
                grad_sum[t, d] = r * (grad_sum[t, d] - a - xhat * b)

    return bert_backward_tokens


@cache
def _bert_partials_kernel(dtype, fmt=FLOAT_TABLES):
    nbt = numba_float(dtype)
    mul = mul_for(dtype)

    @cuda.jit
    def bert_partials(grad_y, ids, tables, mean, rstd, drop, grad_sum, chunks, chunk, part_w,
                      part_b, part_t, err):
        """One thread per ``(chunk, d)``: its chunk's gamma / beta / token-type terms in order,
        into the partials that are not empty (those of the gradients wanted).

        Returns at once while an index error is pending (tokens with ids out of
        range, always recorded by then, are skipped).
        """
        if errors.is_pending(err):
            return
        num_tokens, dim = grad_y.shape
        types = tables.token_type.shape[0]
        want_w = part_w.size != 0
        want_b = part_b.size != 0
        want_t = part_t.size != 0
        zero = nbt(0)
        key = drop_key(drop)
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
                w, k, p, ok = _bert_token_ids(ids, tables, t)
                if not ok:
                    continue
                if want_w or want_b:
                    gy = grad_y[t, d]
                    if drop.active:
                        gy = mul(gy, drop.scale if keeps(key, t * dim + d, drop.threshold)
                                 else zero)
                    if want_w:
                        s = _row_sum(tables, w, k, p, d, fmt)
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


@cuda.jit(device=True)
def _gpt2_bad_token(t, w, p, wte, wpe, y, zero, err, err_host, tags):
    """Whether token ``t``'s id ``w`` or position ``p`` is out of range; if so, thread 0
    records them (``tags``: those of the ids and of the positions) and the block
    zero-fills ``y[t]``."""
    bad_w = _outside(w, wte.shape[0])
    bad_p = _outside(p, wpe.shape[0])
    if not (bad_w or bad_p):
        return False
    if cuda.threadIdx.x == 0:
        if bad_w:
            errors.record(err, err_host, int64(t), w, int64(wte.shape[0]), tags[0])
        if bad_p:
            errors.record(err, err_host, int64(t), p, int64(wpe.shape[0]), tags[1])
    for d in range(cuda.threadIdx.x, y.shape[1], cuda.blockDim.x):
        y[t, d] = zero
    return True


@cuda.jit(device=True)
def _dropped(v, key, index, drop, zero):
    """``v`` times element ``index``'s dropout factor (``scale`` or ``zero``) when active."""
    if drop.active:
        return v * (drop.scale if keeps(key, index, drop.threshold) else zero)
    return v


@cuda.jit
def _gpt2_forward(ids, pos, wte, wpe, drop, y, fmt, err, err_host, tags):
    """One block per token, threads along D: ``y[t, d] = wte[ids[t], d] + wpe[pos[t], d]``
    (times the mask; ``pos`` a :class:`~numbapos._args.TiledIds`). The id and position
    are read and checked once per token; a bad one is recorded (thread 0) and the row is
    zeros. ``drop.scale`` is of ``y``'s dtype; 16-bit tables (``uint16`` bits of format
    ``fmt``) are widened."""
    num_tokens, dim = y.shape
    zero = y.dtype.type(0)
    key = drop_key(drop)
    tid = cuda.threadIdx.x
    for t in range(cuda.blockIdx.x, num_tokens, cuda.gridDim.x):
        w = int64(ids[t])
        p = _id_at(pos, t)
        if _gpt2_bad_token(t, w, p, wte, wpe, y, zero, err, err_host, tags):
            continue  # the same for every thread of the block
        base = t * dim
        for d in range(tid, dim, cuda.blockDim.x):
            y[t, d] = _dropped(widen(wte[w, d], fmt) + widen(wpe[p, d], fmt), key, base + d,
                               drop, zero)


@cuda.jit
def _gpt2_forward_vec(ids, pos, wte, wpe, drop, y, err, err_host, tags):
    """:func:`_gpt2_forward` by float32 vectors (the launcher checked
    :func:`.vector.aligned`): each thread loads 4 adjacent columns of both rows (two
    16-byte loads in flight), adds and masks them element by element as there, and
    stores them at once."""
    num_tokens, dim = y.shape
    zero = y.dtype.type(0)
    key = drop_key(drop)
    tid = cuda.threadIdx.x
    for t in range(cuda.blockIdx.x, num_tokens, cuda.gridDim.x):
        w = int64(ids[t])
        p = _id_at(pos, t)
        if _gpt2_bad_token(t, w, p, wte, wpe, y, zero, err, err_host, tags):
            continue  # the same for every thread of the block
        base = t * dim
        for v in range(tid, dim // 4, cuda.blockDim.x):
            d = 4 * v
            a = load16(wte, w, d)
            b = load16(wpe, p, d)
            i = base + d
            store16(y, t, d, (_dropped(a[0] + b[0], key, i, drop, zero),
                              _dropped(a[1] + b[1], key, i + 1, drop, zero),
                              _dropped(a[2] + b[2], key, i + 2, drop, zero),
                              _dropped(a[3] + b[3], key, i + 3, drop, zero)))


@cuda.jit
def _tile_ids(ids, out):
    """``out[t]`` = the id of token ``t`` of the :class:`~numbapos._args.TiledIds` ``ids``
    (:func:`_id_at`), elementwise."""
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[t] = _id_at(ids, t)
