"""CUDA launchers and kernels for collections of pooled tables (``EmbeddingBagCollection``).

The twin of ``kernels/cpu/collection.py`` (same ``__all__``, signatures, layout
and bits). One block per (slot, sample) bag, grid-stride over them, the threads
of a block along the table's columns, each adding its column's terms in index
order as the CPU does; the backward's rows are grouped on the device
(``group_rows`` of :mod:`.embedding`) and each row summed in input order by one
block: no float atomics. Ids are checked as they are read and a bad one is
recorded in the deferred error word, tagged with its slot's feature (the tags of
:func:`collection_error_tags`); bad lengths likewise. The gradient kernels, which
write caller-visible arrays, return while an error is pending. Nothing is read
back: the sparse gradients' row counts stay on the device.
"""

import numpy as np
from numba import cuda, int64

from ..._gpuhost.launch import launch
from ..search import first_at_least, last_at_most
from ..widen import widen
from . import errors
from .arrays import MAX_BLOCKS, THREADS, copy_into, empty, grid
from .bag import fma
from .fpmath import cast_like, mul_rn
from .vector import row_threads

__all__ = ["check_collection_ids", "collection_error_tags", "collection_group_sizes",
           "collection_positions", "collection_table_grad", "collection_weights_grad",
           "jagged_lengths", "jagged_offsets", "pool_collection"]

SUM, MEAN, MAX = 0, 1, 2  # as kernels/cpu/bag.py


# ---------------------------------------------------------------- launchers


def jagged_offsets(lengths, size, offsets):
    """See the CPU twin: a negative length (its position and value) or a wrong sum
    (position ``len(lengths)``, the sum) is recorded as the deferred error, a ValueError
    naming ``lengths``; returns None. One thread scans: the lengths are few (keys times
    the batch) next to the ids."""
    word, host = errors.words()
    launch(_offsets_from_lengths, 1, 1, lengths, offsets, int64(size), word, host,
           errors.tag("lengths", "len(values)", "count"))
    errors.after_launch()
    return None


def jagged_lengths(offsets, lengths):
    """See the CPU twin."""
    if lengths.size:
        launch(_lengths, grid(lengths.size), THREADS, offsets, lengths)


def collection_error_tags(names, size_names):
    """The deferred error tag of each slot: an id outside its table is reported as an
    index of argument ``names[s]`` out of range for ``size_names[s]``."""
    pairs = zip(names, size_names, strict=True)
    return np.array([errors.tag(name, size_name) for name, size_name in pairs], np.int64)


def check_collection_ids(values, offsets, stride, layout):
    """-1: the kernels check the ids as they read them (deferred errors)."""
    return -1


def pool_collection(values, offsets, stride, weight, layout, per_sample_weights, out, argmax,
                    fmt, check=False, saved=None):
    """See the CPU twin; a bad id is recorded (always checked, ``check`` or not) and left
    out of its bag; returns -1. ``saved`` gets a device copy of ``values``."""
    if saved is not None:
        copy_into(saved, values)
    slots = layout.slot_key.shape[0]
    if slots == 0 or stride == 0:
        return -1
    word, host = errors.words()
    psw = per_sample_weights if per_sample_weights is not None else out[:0, 0]
    winners = argmax if argmax is not None else empty((0, 1), np.int64)
    launch(_pool_collection, min(slots * stride, MAX_BLOCKS), row_threads(int(out.shape[1])),
           values, offsets, int64(stride), weight, layout.slot_key, layout.slot_table,
           layout.slot_col, layout.table_start, layout.table_rows, layout.table_dim,
           layout.table_mode, layout.slot_tag, psw,
           1 if per_sample_weights is not None else 0, out, winners,
           1 if argmax is not None else 0, int64(fmt), out.dtype.type(0), word, host)
    errors.after_launch()
    return -1


def collection_positions(values, offsets, stride, layout, global_ids, bag_of):
    """See the CPU twin; an id outside its table is recorded and gets the no-row marker."""
    keys = layout.key_slots.shape[0]
    if values.size and keys and stride:
        word, host = errors.words()
        launch(_collection_positions, grid(keys * stride), THREADS, values, offsets, int64(stride),
               layout.key_slots, layout.slot_table, layout.table_rows, layout.table_first_row,
               layout.slot_tag, global_ids, bag_of, word, host)
        errors.after_launch()


def collection_group_sizes(groups, first_row, spread):
    """Upper bounds of each table's distinct rows, nothing read from the device:
    ``min(num_embeddings, spread)`` (``spread``: the grouped positions; ``first_row``:
    the host copy of ``table_first_row``)."""
    return [int(min(first_row[t + 1] - first_row[t], spread))
            for t in range(len(first_row) - 1)]


def collection_table_grad(grad_output, groups, bag_of, offsets, stride, layout,
                          per_sample_weights, argmax, sparse, out, rows_out, row_start,
                          value_start, used):
    """See the CPU twin; the groups' count is read on the device (``groups.used``)."""
    if groups.rows.shape[0] == 0:
        return
    psw = per_sample_weights if per_sample_weights is not None else out[:0]
    winners = argmax if argmax is not None else empty((0, 1), np.int64)
    dims = int(layout.table_dim.shape[0])
    threads = row_threads(int(grad_output.shape[1]) if dims else 1)
    launch(_collection_table_grad, min(groups.rows.shape[0], MAX_BLOCKS), threads, grad_output,
           groups.rows, groups.starts, groups.counts, groups.order, groups.used, bag_of,
           offsets, int64(stride), layout.key_slots, layout.slot_col,
           layout.table_first_row, layout.table_dim, layout.table_mode, layout.table_start,
           psw, 1 if per_sample_weights is not None else 0, winners,
           1 if argmax is not None else 0, 1 if sparse else 0, out, rows_out, row_start,
           value_start, used, out.dtype.type(0), errors.device_word())


def collection_weights_grad(grad_output, values, bag_of, stride, weight, layout, out, fmt):
    """See the CPU twin (one thread per entry, columns in order)."""
    if values.size:
        launch(_collection_weights_grad, grid(values.size), THREADS, grad_output, values, bag_of,
               int64(stride), weight, layout.key_slots, layout.slot_table, layout.slot_col,
               layout.table_start, layout.table_rows, layout.table_dim, out, int64(fmt),
               out.dtype.type(0), errors.device_word())


# ---------------------------------------------------------------- kernels


@cuda.jit
def _offsets_from_lengths(lengths, offsets, size, word, host, which):
    offsets[0] = 0
    total = int64(0)
    for k in range(lengths.size):
        length = int64(lengths[k])
        if length < 0:
            errors.record(word, host, int64(k), length, size, which)
            length = 0
        total += length
        offsets[k + 1] = total
    if total != size:
        errors.record(word, host, int64(lengths.size), total, size, which)


@cuda.jit
def _lengths(offsets, lengths):
    for k in range(cuda.grid(1), lengths.size, cuda.gridsize(1)):
        lengths[k] = offsets[k + 1] - offsets[k]


@cuda.jit(device=True)
def _bounds(offsets, k, size):
    """Bag ``k``'s positions, kept inside ``[0, size]`` (bad offsets are recorded by the
    kernel that made or checked them, never read past)."""
    start = min(max(int64(offsets[k]), 0), size)
    end = min(max(int64(offsets[k + 1]), start), size)
    return start, end


@cuda.jit
def _pool_collection(values, offsets, stride, weight, slot_key, slot_table, slot_col,
                     table_start, table_rows, table_dim, table_mode, slot_tag, psw, weighted,
                     out, argmax, winners, fmt, zero, word, host):
    size = int64(values.size)
    for bag in range(cuda.blockIdx.x, slot_key.size * stride, cuda.gridDim.x):
        s = bag // stride
        b = bag - s * stride
        start, end = _bounds(offsets, slot_key[s] * stride + b, size)
        t = slot_table[s]
        dim, col, base, mode = table_dim[t], slot_col[s], table_start[t], table_mode[t]
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            acc = zero
            used = 0
            best = -1
            for i in range(start, end):
                r = errors.checked(word, host, values[i], i, table_rows[t], slot_tag[s])
                if r < 0:
                    continue
                value = widen(weight[base + r * dim + d], fmt)
                if mode == MAX:
                    if best < 0 or value > acc:
                        acc = value
                        best = i
                elif weighted == 0:
                    acc += value
                else:
                    acc = fma(psw[i], value, acc)
                used += 1
            if mode == MEAN and used > 1:
                acc /= cast_like(used, zero)
            out[b, col + d] = acc
            if winners:
                argmax[b, col + d] = best


@cuda.jit
def _collection_positions(values, offsets, stride, key_slots, slot_table, table_rows,
                          first_row, slot_tag, global_ids, bag_of, word, host):
    keys, per_key = key_slots.shape
    size = int64(values.size)
    none = first_row[first_row.size - 1]
    for k in range(cuda.grid(1), keys * stride, cuda.gridsize(1)):
        f = k // stride
        start, end = _bounds(offsets, k, size)
        for i in range(start, end):
            bag_of[i] = k
            for m in range(per_key):
                s = key_slots[f, m]
                row = none
                if s >= 0:
                    t = slot_table[s]
                    r = errors.checked(word, host, values[i], i, table_rows[t], slot_tag[s])
                    if r >= 0:
                        row = first_row[t] + r
                global_ids[i * per_key + m] = row


@cuda.jit
def _collection_table_grad(grad, rows, starts, counts, order, used_groups, bag_of, offsets,
                           stride, key_slots, slot_col, first_row, table_dim, table_mode,
                           table_start, psw, weighted, argmax, winners, sparse, out, rows_out,
                           row_start, value_start, used, zero, word):
    if errors.is_pending(word):
        return
    distinct = used_groups[0]
    per_key = key_slots.shape[1]
    for j in range(cuda.blockIdx.x, distinct, cuda.gridDim.x):
        g = rows[j]
        t = last_at_most(first_row, g)
        r = g - first_row[t]
        dim, mode = table_dim[t], table_mode[t]
        if sparse:
            k = j - first_at_least(rows, distinct, first_row[t])
            at = value_start[t] + k * dim
            if cuda.threadIdx.x == 0:
                rows_out[row_start[t] + k] = r
                if j + 1 == distinct or rows[j + 1] >= first_row[t + 1]:
                    used[t, 0] = k + 1
        else:
            at = table_start[t] + r * dim
        plain = mode != MAX and mode != MEAN and weighted == 0
        for d in range(cuda.threadIdx.x, dim, cuda.blockDim.x):
            acc = -zero if plain else zero  # a plain sum from its first term, as bags'
            for q in range(starts[j], starts[j] + counts[j]):
                p = order[q]
                i = p // per_key
                m = p - i * per_key
                bag = bag_of[i]
                f = bag // stride
                b = bag - f * stride
                col = slot_col[key_slots[f, m]]
                if mode == MAX:
                    if winners and argmax[b, col + d] == i:
                        acc += grad[b, col + d]
                elif weighted == 0 and mode != MEAN:
                    acc += grad[b, col + d]
                else:
                    scale = 1.0
                    if mode == MEAN:
                        scale /= offsets[bag + 1] - offsets[bag]
                    if weighted:
                        scale *= float(psw[i])
                    acc = fma(cast_like(scale, zero), grad[b, col + d], acc)
            out[at + d] = acc


@cuda.jit
def _collection_weights_grad(grad, values, bag_of, stride, weight, key_slots, slot_table,
                             slot_col, table_start, table_rows, table_dim, out, fmt, zero,
                             word):
    if errors.is_pending(word):
        return
    per_key = key_slots.shape[1]
    for i in range(cuda.grid(1), values.size, cuda.gridsize(1)):
        bag = bag_of[i]
        f = bag // stride
        b = bag - f * stride
        total = zero
        for m in range(per_key):
            s = key_slots[f, m]
            if s < 0:
                continue
            t = slot_table[s]
            v = int64(values[i])
            if v < 0 or v >= table_rows[t]:
                continue
            dim, col = table_dim[t], slot_col[s]
            row = table_start[t] + v * dim
            acc = zero
            for d in range(dim):
                acc += mul_rn(grad[b, col + d], widen(weight[row + d], fmt))
            total = acc if m == 0 else total + acc
        out[i] = total
