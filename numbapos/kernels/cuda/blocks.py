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
(:func:`.vector.aligned`, D % 4 == 0) each thread moves 4 adjacent columns at a
time by 16-byte loads and stores; otherwise one. Both kernels are compiled from
one body (:func:`_bert_forward_kernel`, the lane count a compile-time
argument, :mod:`.vector`).

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
mask``, bit-identical to the CPU; by 16-byte vectors under the same condition
(:func:`_gpt2_forward_kernel`: each thread adds 4 adjacent columns, the same
operations per element, the same bits).

Tables may also be bfloat16 / float16 ``uint16`` bits (``fmt``, a
:class:`~numbapos._args.TableFormat`, a compile-time argument of every kernel
factory): every element is read through :func:`numbapos.kernels.widen.widen`,
exactly as on the CPU (the vector kernels stay float32-only, so 16-bit tables
run by elements).

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
from numba import cuda, int64

from ..._args import NO_DROPOUT, BertIds, TiledIds, chunk_rows, num_chunks
from ..._gpuhost.launch import launch
from ..hash import keeps
from ..widen import FLOAT_TABLES, widen
from . import errors, vector
from .arrays import THREADS, absent, grid
from .dropout import drop_key, kernel_drop
from .fpmath import mul_for, numba_float
from .normalization import add_partials_together, fill_zero, moments, partials, row_blocks
from .reduce import block_sum, block_sum2, tree_threads
from .vector import fold_lanes, load_lanes, per_lane, row_threads, store_lanes

__all__ = ["bert_backward", "bert_forward", "gpt2_forward", "gpt2_forward_checked",
           "position_grad", "tile_ids"]

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


def bert_forward(ids, tables, eps, drop, y, mean, rstd, fmt=FLOAT_TABLES, snapshot=None):
    """Fused gather + sum + LayerNorm (+ dropout) of every token: one launch.

    ``ids`` / ``tables`` / ``drop`` are :class:`~numbapos._args.BertIds` (its
    position and token-type entries may be :class:`~numbapos._args.TiledIds`),
    :class:`~numbapos._args.BertTables` and :class:`~numbapos._args.DropoutArgs`;
    ``y`` is ``(T, D)``, ``mean`` and ``rstd`` ``(T,)``. Ids are range-checked
    in the kernel (deferred errors; a bad token's ``y`` row, mean and rstd
    are zeros). ``fmt``: the tables' :class:`~numbapos._args.TableFormat`, as on
    the CPU (16-bit tables as ``uint16`` bits, widened exactly in the kernel,
    which is compiled per format). ``snapshot``: a flat ``(T,)`` array of the word ids'
    dtype that the kernel fills with the word ids as it reads them (the backward's copy of
    them, no launch of its own), or None.
    """
    num_tokens = y.shape[0]
    if num_tokens == 0:
        return
    dtype = y.dtype
    word, host = errors.words()
    lanes = _lanes(y, tables.word, tables.position, tables.token_type)
    launch(_bert_forward_kernel(dtype, int(fmt), lanes), row_blocks(num_tokens),
           tree_threads(y.shape[1] // lanes), _kernel_bert_ids(ids, num_tokens),
           _kernel_tables(tables, dtype), dtype.type(eps), kernel_drop(drop, dtype), y, mean,
           rstd, absent(ids.word.dtype) if snapshot is None else snapshot, word, host,
           _tags(_WORD_TAG, _TYPE_TAG, _BERT_POSITION_TAG))
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
    word, host = errors.words()
    launch(_bert_backward_kernel(dtype, fmt), row_blocks(num_tokens),
           tree_threads(grad_y.shape[1]), grad_y, ids, tables, mean, rstd, drop, grad_sum, word,
           host, _tags(_WORD_TAG, _TYPE_TAG, _BERT_POSITION_TAG))
    errors.after_launch()
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
    add_partials_together([(part, out) for part, out in
                           ((part_w, grad_gamma), (part_b, grad_beta), (part_t, grad_type))
                           if out is not None])


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
    lanes = _lanes(y, wte, wpe)
    launch(_gpt2_forward_kernel(int(fmt), lanes), row_blocks(num_tokens),
           row_threads(dim, lanes), ids, pos, wte, wpe, drop, y, word, host,
           _tags(_WORD_TAG, _GPT2_POSITION_TAG))
    errors.after_launch()


def position_grad(grad, start, length, out):
    """The position table's gradient for default positions, every row of ``out`` written:
    one launch.

    Token ``t`` of the ``(T, D)`` ``grad`` has position ``start + t % length``;
    row ``start + j`` of ``out`` (``(P, D)``) is the sum of ``grad[b * length + j]``
    over the batch in batch order (the CPU's terms and order, the same bits),
    every other row zeros. Nothing is written while an index error is pending.
    """
    if out.size:
        launch(_position_grad, grid(out.size), THREADS, grad, int64(start),
               int64(max(length, 1)), out, errors.device_word())


def tile_ids(values, start, length, out):
    """``out[t] = values[t % length]``, or ``start + t % length`` when ``values`` is None.

    Expands a :class:`~numbapos._args.TiledIds` into a flat int64 ``out`` on
    the device (for the gradient scatter, which needs one id per token).
    """
    if out.size:
        ids = TiledIds(absent(np.int64) if values is None else values, int64(start),
                       int64(max(length, 1)))
        launch(_tile_ids, grid(out.size), THREADS, ids, out)


def _lanes(*arrays) -> int:
    """Columns a thread moves at once: 4 (a 16-byte vector) where every array is float32
    and :func:`.vector.aligned`, else 1."""
    return 4 if all(a.dtype == np.float32 for a in arrays) and vector.aligned(*arrays) else 1


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
def _bert_token_ids(ids, tables, t):
    """``(w, k, p, ok)``: token ``t``'s word, token-type and position ids, and whether all
    three are in range."""
    w = int64(ids.word[t])
    k = _id_at(ids.token_type, t)
    p = _id_at(ids.position, t)
    ok = not (_outside(w, tables.word.shape[0]) or _outside(k, tables.token_type.shape[0])
              or _outside(p, tables.position.shape[0]))
    return w, k, p, ok


@cuda.jit(device=True)
def _record_bad(j, t, ids, bad, sizes, tags, err, err_host):
    if bad[j]:
        errors.record(err, err_host, int64(t), ids[j], int64(sizes[j]), tags[j])
    return j


@cuda.jit(device=True)
def _reject(t, ids, bad, sizes, tags, y, zero, err, err_host):
    """Token ``t`` has a bad id: thread 0 records each id of the tuple ``ids`` that ``bad``
    flags (``sizes`` and ``tags``: its table's rows, its error tag), in the order given
    (the CPU's), and the block zero-fills ``y[t]``."""
    if cuda.threadIdx.x == 0:
        per_lane(_record_bad, ids, t, ids, bad, sizes, tags, err, err_host)
    for d in range(cuda.threadIdx.x, y.shape[1], cuda.blockDim.x):
        y[t, d] = zero


@cuda.jit(device=True)
def _dropped(v, key, index, drop, zero):
    """``v`` times element ``index``'s dropout factor (``scale`` or ``zero``) when active."""
    if drop.active:
        return v * (drop.scale if keeps(key, index, drop.threshold) else zero)
    return v


@cuda.jit(device=True)
def _row_sum(lane, word, token_type, position, fmt):
    """Lane ``lane`` of ``(word + token_type) + position`` (loaded lanes, each widened: the
    CPU's order)."""
    return (widen(word[lane], fmt) + widen(token_type[lane], fmt)) + widen(position[lane], fmt)


@cuda.jit(device=True)
def _bert_output(lane, s, m, r, tables, d, key, index, drop, one, zero):
    """Column ``d + lane`` of a BERT output from its row sum ``s[lane]``: normalised,
    gamma / beta (or the ones / zeros the CPU uses when they are empty), then the dropout
    mask of element ``index + lane``."""
    d += lane
    v = (s[lane] - m) * r
    v = v * (tables.gamma[d] if tables.gamma.size else one)
    v = v + (tables.beta[d] if tables.beta.size else zero)
    return _dropped(v, key, index + lane, drop, zero)


@cuda.jit(device=True)
def _plus(acc, x):
    return acc + x


@cuda.jit(device=True)
def _plus_deviation(acc, x, first):
    return acc + (x - first)


@cuda.jit(device=True)
def _plus_square(acc, x, first):
    dev = x - first
    return acc + dev * dev


@cache
def _bert_forward_kernel(dtype, fmt, lanes):
    """The BERT forward for ``dtype`` outputs and tables of format ``fmt`` (an int), each
    thread moving ``lanes`` adjacent columns at a time (1, or 4 by 16-byte vectors:
    float32 rows the launcher found :func:`.vector.aligned`)."""
    nbt = numba_float(dtype)

    @cuda.jit
    def bert_forward_tokens(ids, tables, eps, drop, y, mean, rstd, snapshot, err, err_host,
                            tags):
        """One block per token: check its ids, ``s`` into ``y[t]``, moments, then normalise
        (+ dropout). A token with a bad id records it (thread 0) and gets zeros. A
        non-empty ``snapshot`` gets each word id as read (thread 0), bad ones too.

        The per-element arithmetic does not depend on ``lanes``; only which thread adds
        which elements into the moments does (they agree with the CPU to a few ulp)."""
        sh = cuda.shared.array((2, THREADS), nbt)
        tid = cuda.threadIdx.x
        nt = cuda.blockDim.x  # a power of two, tree_threads(...)
        num_tokens, dim = y.shape
        zero = nbt(0)
        one = nbt(1)
        n = nbt(dim)
        key = drop_key(drop)
        for t in range(cuda.blockIdx.x, num_tokens, cuda.gridDim.x):
            w = int64(ids.word[t])
            if tid == 0 and snapshot.size:
                snapshot[t] = ids.word[t]
            k = _id_at(ids.token_type, t)
            p = _id_at(ids.position, t)
            sizes = (tables.word.shape[0], tables.token_type.shape[0], tables.position.shape[0])
            bad = (_outside(w, sizes[0]), _outside(k, sizes[1]), _outside(p, sizes[2]))
            if bad[0] or bad[1] or bad[2]:  # the same for every thread of the block
                if tid == 0:
                    mean[t] = zero
                    rstd[t] = zero
                _reject(t, (w, k, p), bad, sizes, tags, y, zero, err, err_host)
                continue
            acc = zero
            for v in range(tid, dim // lanes, nt):
                d = lanes * v
                s = per_lane(_row_sum, lanes, load_lanes(tables.word, w, d, lanes),
                             load_lanes(tables.token_type, k, d, lanes),
                             load_lanes(tables.position, p, d, lanes), fmt)
                store_lanes(y, t, d, s)
                acc = fold_lanes(_plus, acc, s)
            first = block_sum(sh, acc, tid, nt) / n
            c = zero
            q = zero
            for v in range(tid, dim // lanes, nt):  # each thread reads back its own writes
                s = load_lanes(y, t, lanes * v, lanes)
                c = fold_lanes(_plus_deviation, c, s, first)
                q = fold_lanes(_plus_square, q, s, first)
            c, q = block_sum2(sh, c, q, tid, nt)
            m, r = moments(first, c, q, n, eps, zero, one, nbt(math.inf))
            for v in range(tid, dim // lanes, nt):
                d = lanes * v
                store_lanes(y, t, d, per_lane(_bert_output, lanes, load_lanes(y, t, d, lanes),
                                              m, r, tables, d, key, t * dim + d, drop, one,
                                              zero))
            if tid == 0:
                mean[t] = m
                rstd[t] = r

    return bert_forward_tokens


@cuda.jit(device=True)
def _table_sum(tables, w, k, p, d, fmt):
    """:func:`_row_sum` of column ``d`` read from the tables (each element read as it is
    added, the order NVVM schedules the loads in)."""
    return (widen(tables.word[w, d], fmt) + widen(tables.token_type[k, d], fmt)) \
        + widen(tables.position[p, d], fmt)


@cache
def _bert_backward_kernel(dtype, fmt):
    nbt = numba_float(dtype)

    @cuda.jit
    def bert_backward_tokens(grad_y, ids, tables, mean, rstd, drop, grad_sum, err, err_host,
                             tags):
        """One block per token: masked ``grad_y``, then the LayerNorm row backward.

        ``grad_sum[t]`` first holds ``g = (grad_y * mask) * gamma`` (each thread
        its own elements), then ``rstd * (g - mean(g) - xhat * mean(g * xhat))``.
        A token with an id out of range is recorded (thread 0, as in the
        forward: the caller needs no separate check launch) and skipped; while
        an index error is pending the ids are only checked (``grad_sum`` is the
        launcher's scratch, and every later kernel returns at once).
        """
        sh = cuda.shared.array((2, THREADS), nbt)
        tid = cuda.threadIdx.x
        flag = cuda.shared.array(1, int64)  # one answer for the whole block (it syncs)
        if tid == 0:
            flag[0] = 1 if errors.is_pending(err) else 0
        cuda.syncthreads()
        pending = flag[0] != 0
        nt = cuda.blockDim.x  # a power of two, tree_threads(...)
        num_tokens, dim = grad_y.shape
        zero = nbt(0)
        one = nbt(1)
        n = nbt(dim)
        key = drop_key(drop)
        has_gamma = tables.gamma.size != 0
        for t in range(cuda.blockIdx.x, num_tokens, cuda.gridDim.x):
            w, k, p, ok = _bert_token_ids(ids, tables, t)
            if not ok:  # the same for every thread of the block
                if tid == 0:
                    sizes = (tables.word.shape[0], tables.token_type.shape[0],
                             tables.position.shape[0])
                    bad = (_outside(w, sizes[0]), _outside(k, sizes[1]), _outside(p, sizes[2]))
                    per_lane(_record_bad, (w, k, p), t, (w, k, p), bad, sizes, tags, err,
                             err_host)
                continue
            if pending:
                continue
            m = mean[t]
            r = rstd[t]
            base = t * dim
            sg = zero
            sgx = zero
            for d in range(tid, dim, nt):
                s = _table_sum(tables, w, k, p, d, fmt)
                g = _dropped(grad_y[t, d], key, base + d, drop, zero) \
                    * (tables.gamma[d] if has_gamma else one)
                grad_sum[t, d] = g
                sg += g
                sgx += g * ((s - m) * r)
            sg, sgx = block_sum2(sh, sg, sgx, tid, nt)
            a = sg / n
            b = sgx / n
            for d in range(tid, dim, nt):
                xhat = (_table_sum(tables, w, k, p, d, fmt) - m) * r
                grad_sum[t, d] = r * (grad_sum[t, d] - a - xhat * b)

    return bert_backward_tokens


@cache
def _bert_partials_kernel(dtype, fmt):
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
                        s = _table_sum(tables, w, k, p, d, fmt)
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
def _gpt2_sum(lane, wte, wpe, fmt, key, index, drop, zero):
    """Lane ``lane`` of ``(wte + wpe) * mask`` (loaded lanes, widened), element
    ``index + lane`` of the output."""
    return _dropped(widen(wte[lane], fmt) + widen(wpe[lane], fmt), key, index + lane, drop,
                    zero)


@cache
def _gpt2_forward_kernel(fmt, lanes):
    """The GPT-2 forward for tables of format ``fmt`` (an int), each thread moving
    ``lanes`` adjacent columns at a time (1, or 4 by 16-byte vectors: float32 rows the
    launcher found :func:`.vector.aligned`; the same operations per element, the same
    bits)."""

    @cuda.jit
    def gpt2_forward_tokens(ids, pos, wte, wpe, drop, y, err, err_host, tags):
        """One block per token, threads along D: ``y[t, d] = wte[ids[t], d] + wpe[pos[t], d]``
        (times the mask; ``pos`` a :class:`~numbapos._args.TiledIds`). The id and
        position are read and checked once per token; a bad one is recorded (thread 0)
        and the row is zeros. ``drop.scale`` is of ``y``'s dtype."""
        num_tokens, dim = y.shape
        zero = y.dtype.type(0)
        key = drop_key(drop)
        tid = cuda.threadIdx.x
        for t in range(cuda.blockIdx.x, num_tokens, cuda.gridDim.x):
            w = int64(ids[t])
            p = _id_at(pos, t)
            bad = (_outside(w, wte.shape[0]), _outside(p, wpe.shape[0]))
            if bad[0] or bad[1]:  # the same for every thread of the block
                _reject(t, (w, p), bad, (wte.shape[0], wpe.shape[0]), tags, y, zero, err,
                        err_host)
                continue
            base = t * dim
            for v in range(tid, dim // lanes, cuda.blockDim.x):
                d = lanes * v
                store_lanes(y, t, d, per_lane(_gpt2_sum, lanes, load_lanes(wte, w, d, lanes),
                                              load_lanes(wpe, p, d, lanes), fmt, key, base + d,
                                              drop, zero))

    return gpt2_forward_tokens


@cuda.jit
def _position_grad(grad, start, length, out, err):
    """One thread per element of ``out``: its column summed over the batch in batch order
    for the positions used, zero elsewhere (see :func:`position_grad`)."""
    if errors.is_pending(err):
        return
    rows, dim = out.shape
    batch = grad.shape[0] // length
    zero = out.dtype.type(0)
    for i in range(cuda.grid(1), rows * dim, cuda.gridsize(1)):
        r = i // dim
        d = i - r * dim
        j = r - start
        if j < 0 or j >= length or batch == 0:
            out[r, d] = zero
            continue
        acc = grad[j, d]
        for b in range(1, batch):
            acc += grad[b * length + j, d]
        out[r, d] = acc


@cuda.jit
def _tile_ids(ids, out):
    """``out[t]`` = the id of token ``t`` of the :class:`~numbapos._args.TiledIds` ``ids``
    (:func:`_id_at`), elementwise."""
    for t in range(cuda.grid(1), out.size, cuda.gridsize(1)):
        out[t] = _id_at(ids, t)
