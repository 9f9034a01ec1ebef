"""CPU launchers and kernels for collections of pooled tables (TorchRec's
``EmbeddingBagCollection``): every bag of every table in one kernel per direction.

The tables live in one flat buffer ``weight`` (FBGEMM's table-batched layout):
table ``t`` is the ``(rows[t], dim[t])`` block starting at element
``table_start[t]``. The ids come as a keyed jagged array, key-major: bag
``(key f, sample b)`` is ``values[offsets[f * B + b]:offsets[f * B + b + 1]]``.
A *slot* is one (key, table) pair, the unit the output is made of: slot ``s``
reads key ``slot_key[s]`` through table ``slot_table[s]`` and writes output
columns ``slot_col[s] .. + dim``. ``layout`` is
:class:`numbapos.functional.collection.LayoutArrays` (arrays on the launcher's
device); ``stride`` is the batch size B.

Each bag is pooled as ``kernels/cpu/bag.py`` pools it (sums in index order, a
mean dividing the sum, weighted sums one fused multiply-add per entry, the
first maximum on ties): a collection's output is bit for bit the per-table
``embedding_bag`` results side by side. The backward groups the positions by
*global row* (``table_first_row[t] + id``, all tables in one id space) and
sums each row in input order, one thread per row, as ``bag_table_grad``
does: bit-identical for any thread count, no atomics.

The pooled lookup reads rows at random from a table much larger than the
caches: its time is the memory's (measured on the 2-core development VM:
2,048 x 20 float32 rows of 128 from each of 8 tables, 327,680 rows, took the
same 27 ms on one thread as PyTorch's FBGEMM kernel, prefetch distance and
lines per row changing nothing measurable). Its other work therefore rides
in the same pass: the ids of a new output are checked bag by bag as they
are read (a separate pass over them cost 0.8 ms), and a module's record of
them is copied there too.
"""

import numpy as np
from numba import prange

from ..._args import TableFormat
from ..search import first_at_least, last_at_most
from ..widen import widen
from .arrays import option, pick
from .bag import MAX, MEAN, fused_multiply_add, sum_in_lanes
from .jit import kernel

__all__ = ["check_collection_ids", "collection_error_tags", "collection_group_sizes",
           "collection_positions", "collection_table_grad", "collection_weights_grad",
           "jagged_lengths", "jagged_offsets", "pool_collection"]


# ---------------------------------------------------------------- launchers


def jagged_offsets(lengths, size, offsets):
    """``offsets = [0, cumsum(lengths)]`` (``len(lengths) + 1`` int64); returns the first
    problem ``(position, value)`` or None: a negative length (its position and value), or
    lengths whose sum differs from ``size`` (position ``len(lengths)``, the sum). The CUDA
    twin records the problem as a deferred error and returns None."""
    bad = _offsets_from_lengths(lengths, offsets)
    if bad >= 0:
        return int(bad), int(lengths[bad])
    total = int(offsets[offsets.size - 1])
    return None if total == size else (int(lengths.size), total)


def jagged_lengths(offsets, lengths):
    """``lengths[k] = offsets[k + 1] - offsets[k]`` (checked offsets)."""
    np.subtract(offsets[1:], offsets[:-1], out=lengths)


def collection_error_tags(names, size_names):
    """The CUDA twin's error tags for each slot (argument ``names[s]`` against
    ``size_names[s]``); here ids are checked before the kernels run: zeros."""
    return np.zeros(len(names), np.int64)


def check_collection_ids(values, offsets, stride, layout):
    """The first position whose id lies outside the table of a slot reading it, or -1
    (the CUDA twin checks inside its kernels and returns -1). The ids are counted in
    parallel; the first bad one is looked for only when there is one."""
    if values.size == 0 or layout.slot_key.size == 0 or stride == 0:
        return -1
    args = (values, offsets, np.int64(stride), layout.key_slots, layout.slot_table,
            layout.table_rows)
    marks = np.zeros(layout.key_slots.shape[0] * stride, np.uint8)
    pick(_mark_bad_bags, values.size)(*args, marks)
    return int(_first_bad_id(*args)) if marks.any() else -1


def pool_collection(values, offsets, stride, weight, layout, per_sample_weights, out, argmax,
                    fmt, check=False, saved=None):
    """``out[b, slot_col[s]:...]``: slot ``s``'s bag of sample ``b`` pooled by its table's
    mode (``table_mode``: sum, mean or max), for every slot and sample in one kernel.

    ``weight`` is the flat buffer (float, or a 16-bit table's ``uint16`` bits of format
    ``fmt``); ``per_sample_weights`` (flat, or None) scales the entries of sum tables.
    ``argmax`` (``out``'s shape, int64, or None) receives each max column's winning
    position in ``values`` (-1 for an empty bag).

    ``check``: the ids have not been checked (:func:`check_collection_ids`); the kernel
    checks each bag's before reading its rows and leaves a bag with a bad id unpooled,
    so ``out`` must then be the caller's to discard. ``saved`` (``values``' shape and
    dtype, or None) receives a copy of ``values`` as they are read (a record for the
    backward, made in the same pass). Returns the first position whose id is out of
    range (``check`` only), else -1.
    """
    slots = layout.slot_key.size
    if slots == 0 or stride == 0:
        if saved is not None:
            saved[:] = values
        return -1
    kernel = pick(_pool_collection, values.size * 2 + out.size)
    lanes = (fmt == TableFormat.FLOAT and weight.dtype == np.float32
             and out.dtype == np.float32 and out.flags.c_contiguous)
    marks = np.zeros(slots * stride if check else 0, np.uint8)
    kernel(values, offsets, np.int64(stride), weight, layout.slot_key, layout.slot_table,
           layout.slot_col, layout.key_slots, layout.table_start, layout.table_dim,
           layout.table_rows, layout.table_mode, per_sample_weights, out, argmax,
           np.int64(fmt), option(lanes), option(check), saved, marks)
    if not marks.any():
        return -1
    return int(_first_bad_id(values, offsets, np.int64(stride), layout.key_slots,
                             layout.slot_table, layout.table_rows))


def collection_positions(values, offsets, stride, layout, global_ids, bag_of):
    """``bag_of[i]``: the bag ``f * B + b`` of position ``i``; ``global_ids[i * M + m]``:
    the global row (``table_first_row[t] + values[i]``) that position ``i`` reads through
    its key's ``m``-th slot, ``layout.table_first_row[-1]`` (no row) where the key has
    fewer slots. ``M = key_slots.shape[1]``; grouped positions ``i * M + m`` sort each
    table's terms in input order."""
    if values.size:
        kernel = pick(_collection_positions, values.size)
        kernel(values, offsets, np.int64(stride), layout.key_slots, layout.slot_table,
               layout.table_first_row, global_ids, bag_of)


def collection_group_sizes(groups, first_row, spread):
    """Rows to reserve for each table's sparse gradient: here the exact number of distinct
    rows of each table (``first_row``: the host copy of the layout's ``table_first_row``;
    the CUDA twin, which reads nothing back, gives upper bounds)."""
    first = np.asarray(first_row)
    bounds = np.searchsorted(groups.rows[:groups.used], first)
    return [int(bounds[t + 1] - bounds[t]) for t in range(first.size - 1)]


def collection_table_grad(grad_output, groups, bag_of, offsets, stride, layout,
                          per_sample_weights, argmax, sparse, out, rows_out, row_start,
                          value_start, used):
    """Every table's gradient in one kernel, row by row in input order.

    ``groups`` (:class:`~numbapos._args.RowGroups`) group the global ids of
    :func:`collection_positions` (the no-row marker left out). Each position adds
    ``grad_output[b, slot_col[s] + d]``: as it is (sum), scaled by
    ``per_sample_weights[i]`` (weighted) or ``float(1 / len(bag))`` (mean) with a fused
    multiply-add, or where ``argmax`` names it (max), as ``bag_table_grad`` does.

    Dense (``sparse`` False): ``out`` is a zero-filled flat buffer laid out as the
    tables' ``weight`` and each row is written in place (``rows_out``, ``row_start``,
    ``value_start`` and ``used`` are not read). Sparse: table ``t``'s ``k``-th distinct
    row (ascending) writes its id to ``rows_out[row_start[t] + k]`` and its gradient to
    the flat ``out`` from ``value_start[t] + k * dim[t]``; ``used[t, 0]`` (zero-filled,
    ``(T, 2)``) receives table ``t``'s count of rows.
    """
    if groups.rows.size == 0:
        return
    kernel = pick(_collection_table_grad, groups.order.size * 8)
    kernel(grad_output, groups.rows, groups.starts, groups.counts, groups.order,
           np.int64(groups.used), bag_of, offsets, np.int64(stride),
           layout.key_slots, layout.slot_col, layout.table_first_row, layout.table_dim,
           layout.table_mode, layout.table_start, per_sample_weights, argmax, option(sparse),
           out, rows_out, row_start, value_start, used)


def collection_weights_grad(grad_output, values, bag_of, stride, weight, layout, out, fmt):
    """``out[i]``: the sum over the slots of position ``i``'s key of
    ``dot(grad_output[b, slot columns], table[values[i]])`` (columns in order, from zero,
    as ``bag_weights_grad``; slots added in their order)."""
    if values.size:
        pick(_collection_weights_grad, values.size * 8)(
            grad_output, values, bag_of, np.int64(stride), weight, layout.key_slots,
            layout.slot_table, layout.slot_col, layout.table_start, layout.table_dim, out,
            np.int64(fmt))


# ---------------------------------------------------------------- kernels


@kernel()
def _offsets_from_lengths(lengths, offsets):
    offsets[0] = 0
    total = np.int64(0)
    for k in range(lengths.size):
        if lengths[k] < 0:
            return k
        total += lengths[k]
        offsets[k + 1] = total
    return -1


@kernel()
def _first_bad_id(values, offsets, stride, key_slots, slot_table, table_rows):
    keys, per_key = key_slots.shape
    for f in range(keys):
        for i in range(offsets[f * stride], offsets[(f + 1) * stride]):
            v = values[i]
            for m in range(per_key):
                s = key_slots[f, m]
                if s >= 0 and (v < 0 or v >= table_rows[slot_table[s]]):
                    return i
    return -1


@kernel(inline="always")
def _widen_at(weight, at, fmt):
    return widen(weight[at], fmt)


@kernel(parallel=True)
def _mark_bad_bags(values, offsets, stride, key_slots, slot_table, table_rows, marks):
    # marks[k]: bag k (of key k // stride) holds an id outside a table reading the key.
    per_key = key_slots.shape[1]
    for k in prange(marks.size):
        f = k // stride
        for m in range(per_key):
            s = key_slots[f, m]
            if s >= 0 and _bad_ids(values, offsets[k], offsets[k + 1],
                                   table_rows[slot_table[s]]):
                marks[k] = 1


@kernel(inline="always")
def _bad_ids(values, start, end, rows):
    bad = False
    for i in range(start, end):
        v = values[i]
        bad |= (v < 0) | (v >= rows)
    return bad


@kernel(parallel=True)
def _pool_collection(values, offsets, stride, weight, slot_key, slot_table, slot_col,
                     key_slots, table_start, table_dim, table_rows, table_mode, psw, out,
                     argmax, fmt, lanes, check, saved, marks):
    # lanes (True or None): float32 tables and a C-contiguous float32 out, whose sums'
    # leading columns go through the bags' Lanes loop (the same operations, in registers).
    # check: marks[bag] = 1 for a bag left unpooled for a bad id (the check reads the
    # bag's ids, which the pooling reads again from the first-level cache).
    for bag in prange(slot_key.size * stride):
        s = bag // stride
        b = bag - s * stride
        f = slot_key[s]
        k = f * stride + b
        start, end = np.int64(offsets[k]), np.int64(offsets[k + 1])
        t = slot_table[s]
        dim, col, base, mode = table_dim[t], slot_col[s], table_start[t], table_mode[t]
        rows = np.int64(table_rows[t])
        if saved is not None and key_slots[f, 0] == s:  # each key's bags copied once
            for i in range(start, end):
                saved[i] = values[i]
        acc = out[b, col:col + dim]
        if check is not None:
            if _bad_ids(values, start, end, rows):
                marks[bag] = 1
                continue
        done = 0
        if lanes is not None and mode != MAX:
            table = weight[base:base + rows * dim].reshape((rows, dim))
            done = sum_in_lanes(values, start, end, table, np.int64(-1), psw, out, b,
                                np.int64(col), np.int64(dim))
        for d in range(done, dim):
            acc[d] = 0
        if mode == MAX:
            first = True
            for i in range(start, end):
                row = base + np.int64(values[i]) * dim
                for d in range(dim):
                    value = _widen_at(weight, row + d, fmt)
                    if first or value > acc[d]:
                        acc[d] = value
                        if argmax is not None:
                            argmax[b, col + d] = i
                first = False
            if first and argmax is not None:
                for d in range(dim):
                    argmax[b, col + d] = -1
            continue
        for i in range(start, end):
            if done == dim:
                break
            row = base + np.int64(values[i]) * dim
            if psw is None:
                for d in range(done, dim):
                    acc[d] += _widen_at(weight, row + d, fmt)
            else:  # FBGEMM's kernel (embedding_bag's without padding): one rounding each
                s_i = acc.dtype.type(psw[i])
                for d in range(done, dim):
                    acc[d] = fused_multiply_add(s_i, acc.dtype.type(_widen_at(weight, row + d,
                                                                              fmt)),
                                                acc[d])
        used = end - start
        if mode == MEAN and used > 1:
            count = acc.dtype.type(used)
            for d in range(dim):
                acc[d] /= count


@kernel(parallel=True)
def _collection_positions(values, offsets, stride, key_slots, slot_table, table_first_row,
                          global_ids, bag_of):
    keys, per_key = key_slots.shape
    none = table_first_row[table_first_row.size - 1]
    for k in prange(keys * stride):
        f = k // stride
        for i in range(offsets[k], offsets[k + 1]):
            bag_of[i] = k
            for m in range(per_key):
                s = key_slots[f, m]
                global_ids[i * per_key + m] = (none if s < 0 else
                                            table_first_row[slot_table[s]] + values[i])


@kernel(parallel=True)
def _collection_table_grad(grad, rows, starts, counts, order, used_groups, bag_of, offsets,
                           stride, key_slots, slot_col, first_row, table_dim, table_mode,
                           table_start, psw, argmax, sparse, out, rows_out, row_start,
                           value_start, used):
    per_key = key_slots.shape[1]
    for j in prange(used_groups):
        g = rows[j]
        t = last_at_most(first_row, g)
        r = g - first_row[t]
        dim, mode = table_dim[t], table_mode[t]
        if sparse is None:
            at = table_start[t] + r * dim
        else:
            k = j - first_at_least(rows, used_groups, first_row[t])
            rows_out[row_start[t] + k] = r
            at = value_start[t] + k * dim
            if j + 1 == used_groups or rows[j + 1] >= first_row[t + 1]:
                used[t, 0] = k + 1
        acc = out[at:at + dim]
        start = -0.0 if psw is None and mode != MEAN and mode != MAX else 0.0
        for d in range(dim):
            acc[d] = start  # a plain sum from its first term (-0.0 + g is g), as bags'
        for q in range(starts[j], starts[j] + counts[j]):
            p = order[q]
            i = p // per_key
            m = p - i * per_key
            bag = bag_of[i]
            f = bag // stride
            b = bag - f * stride
            col = slot_col[key_slots[f, m]]
            if argmax is not None:
                if mode == MAX:
                    for d in range(dim):
                        if argmax[b, col + d] == i:
                            acc[d] += grad[b, col + d]
                    continue
            if psw is None and mode != MEAN:
                for d in range(dim):
                    acc[d] += grad[b, col + d]
                continue
            scale = 1.0  # in double, then rounded: PyTorch's scale (bag_table_grad's)
            if mode == MEAN:
                scale /= offsets[bag + 1] - offsets[bag]
            if psw is not None:
                scale *= np.float64(psw[i])
            s_f = acc.dtype.type(scale)
            for d in range(dim):
                acc[d] = fused_multiply_add(s_f, grad[b, col + d], acc[d])


@kernel(parallel=True)
def _collection_weights_grad(grad, values, bag_of, stride, weight, key_slots, slot_table,
                             slot_col, table_start, table_dim, out, fmt):
    per_key = key_slots.shape[1]
    for i in prange(values.size):
        bag = bag_of[i]
        f = bag // stride
        b = bag - f * stride
        total = out.dtype.type(0)
        for m in range(per_key):
            s = key_slots[f, m]
            if s < 0:
                continue
            t = slot_table[s]
            dim, col = table_dim[t], slot_col[s]
            row = table_start[t] + np.int64(values[i]) * dim
            acc = out.dtype.type(0)
            for d in range(dim):
                acc += grad[b, col + d] * _widen_at(weight, row + d, fmt)
            total = acc if m == 0 else total + acc
        out[i] = total
