"""Pooled lookups of a collection of tables in one kernel per direction (TorchRec's
``EmbeddingBagCollection``), and the offsets of keyed jagged arrays.

A collection's tables live in one flat buffer (FBGEMM's table-batched layout,
table after table, each row-major): every (feature, sample) bag of every table
is pooled by one kernel that reads each table through a per-feature table id,
and one kernel writes every table's gradient. :class:`CollectionLayout` says
which table reads which feature and where the tables and their output columns
start.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import _checks, _device
from .._args import RowGroups, TableFormat
from ..sparse import SparseRows
from ._common import backend_for, on_backend
from .half import half_format

__all__ = ["CollectionLayout", "embedding_bag_collection", "embedding_bag_collection_backward",
           "jagged_lengths", "jagged_offsets", "pack_tables"]

# The kernels' pooling modes (kernels/cpu/bag.py's SUM, MEAN, MAX).
POOLINGS = {"sum": 0, "mean": 1, "max": 2}
_MAX = POOLINGS["max"]
_UINT16, _FLOAT32 = np.dtype(np.uint16), np.dtype(np.float32)


class LayoutArrays(NamedTuple):
    """A layout for one order of input keys, as the kernels read it (int64 arrays on the
    launcher's device). A *slot* is one (key, table) pair: the output is made of slots.

    ``slot_key[s]``, ``slot_table[s]``, ``slot_col[s]``: the input key slot ``s`` reads,
    its table and its first output column; ``key_slots[f]``: the slots reading key
    ``f`` (-1 after the last); ``table_start[t]``: the table's first element in the flat
    buffer; ``table_rows``, ``table_dim``, ``table_mode`` (POOLINGS); ``table_first_row``
    (T + 1): the tables' rows numbered one after another (the backward's global rows);
    ``slot_tag``: the CUDA error tag naming the slot's feature (zeros on the CPU).
    """

    slot_key: object
    slot_table: object
    slot_col: object
    key_slots: object
    table_start: object
    table_rows: object
    table_dim: object
    table_mode: object
    table_first_row: object
    slot_tag: object


def check_pooling(value, name):
    """A pooling name ("sum", "mean", "max", any case, or an enum whose value is one)."""
    text = getattr(value, "value", value)
    if isinstance(text, str) and text.lower() in POOLINGS:
        return text.lower()
    raise ValueError(f"{name}: expected 'sum', 'mean' or 'max' (any case, or TorchRec's "
                     f"PoolingType.SUM / MEAN), got {_checks.quote(value)}")


class CollectionLayout:
    """Where a collection's tables and output columns are, and which features they read.

    Parameters
    ----------
    tables : sequence of (name, num_embeddings, embedding_dim, pooling, feature_names)
        In output order. A feature read by several tables gets the output name
        ``"feature@table"`` in each (TorchRec's ``get_embedding_names_by_table``).
    is_weighted : bool, default False
        Scale each entry by the input's weights (sum tables only).

    Attributes
    ----------
    embedding_names : list of str
        The output's keys, one per (table, feature), in output order.
    dims : list of int
        Each output key's width.
    total_dim, num_elements : int
        The output's width; the flat buffer's length.
    """

    def __init__(self, tables, is_weighted=False):
        self.table_names, self.rows, self.dims_of_table, self.poolings = [], [], [], []
        self.features = []
        for k, table in enumerate(tables):
            name, rows, dim, pooling, features = table
            if name in self.table_names:
                raise ValueError(f"tables[{k}]: the name {name!r} is used twice; table names "
                                 "must be unique")
            if len(set(features)) != len(features):
                raise ValueError(f"tables[{k}]: table {name!r} lists a feature twice: "
                                 f"{list(features)}")
            self.table_names.append(name)
            self.rows.append(_checks.check_int(rows, f"tables[{k}].num_embeddings", minimum=1))
            self.dims_of_table.append(_checks.check_int(dim, f"tables[{k}].embedding_dim",
                                                        minimum=1))
            self.poolings.append(check_pooling(pooling, f"tables[{k}].pooling"))
            self.features.append(tuple(features))
        self.is_weighted = bool(is_weighted)
        if self.is_weighted:
            for name, pooling in zip(self.table_names, self.poolings, strict=True):
                if pooling != "sum":
                    raise ValueError(f"is_weighted: weighted bags need pooling 'sum' (as "
                                     f"PyTorch's per_sample_weights), but table {name!r} pools "
                                     f"with {pooling!r}")
        counts = {}
        for features in self.features:
            for feature in features:
                counts[feature] = counts.get(feature, 0) + 1
        self.embedding_names, self.dims, self.slots = [], [], []
        for t, features in enumerate(self.features):
            for feature in features:
                shared = counts[feature] > 1
                self.embedding_names.append(f"{feature}@{self.table_names[t]}" if shared
                                            else feature)
                self.dims.append(self.dims_of_table[t])
                self.slots.append((feature, t))
        self.feature_names = list(counts)
        self.total_dim = int(sum(self.dims))
        sizes = [r * d for r, d in zip(self.rows, self.dims_of_table, strict=True)]
        self.table_start = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
        self.num_elements = int(self.table_start[-1])
        self.first_row = np.concatenate([[0], np.cumsum(self.rows, dtype=np.int64)]).astype(
            np.int64)
        # Every table an unweighted sum of a feature no other table reads: the gradients
        # can be left unsummed (see _unsummed_grads).
        self.plain_sums = (not self.is_weighted
                           and all(p == "sum" for p in self.poolings)
                           and all(len(f) == 1 for f in self.features)
                           and all(c == 1 for c in counts.values()))
        self._arrays = {}

    def arrays(self, keys, K) -> LayoutArrays:
        """The kernels' arrays for an input with ``keys`` (in that order) on K's device.

        Raises
        ------
        ValueError
            A key that no table reads (TorchRec ignores it silently; here it is a
            likely typo), or a feature a table reads missing from ``keys``.
        """
        keys = tuple(keys)
        found = self._arrays.get((keys, K.DEVICE))
        if found is not None:
            return found
        index = {key: f for f, key in enumerate(keys)}
        for key in keys:
            if key not in self.feature_names:
                raise ValueError(f"features: key {key!r} is read by no table (the tables read "
                                 f"{self.feature_names}); TorchRec would ignore it, numbapos "
                                 "refuses it: drop it from the input first")
        for feature, t in self.slots:
            if feature not in index:
                raise ValueError(f"features: table {self.table_names[t]!r} reads feature "
                                 f"{feature!r}, missing from the input's keys {list(keys)}")
        per_key = max([sum(1 for f, _ in self.slots if f == key) for key in keys] or [1])
        key_slots = np.full((len(keys), max(per_key, 1)), -1, np.int64)
        filled = [0] * len(keys)
        for s, (feature, _) in enumerate(self.slots):
            f = index[feature]
            key_slots[f, filled[f]] = s
            filled[f] += 1
        host = dict(
            slot_key=np.array([index[f] for f, _ in self.slots], np.int64),
            slot_table=np.array([t for _, t in self.slots], np.int64),
            slot_col=np.concatenate([[0], np.cumsum(self.dims, dtype=np.int64)])[:-1]
            .astype(np.int64),
            key_slots=key_slots,
            table_start=self.table_start[:-1].astype(np.int64),
            table_rows=np.array(self.rows, np.int64),
            table_dim=np.array(self.dims_of_table, np.int64),
            table_mode=np.array([POOLINGS[p] for p in self.poolings], np.int64),
            table_first_row=self.first_row,
            slot_tag=np.asarray(K.collection_error_tags(
                [f"values (feature {f!r})" for f, _ in self.slots],
                [f"num_embeddings of table {self.table_names[t]!r}" for _, t in self.slots]),
                np.int64))
        found = LayoutArrays(**{name: K.asarray(np.ascontiguousarray(value))
                                for name, value in host.items()})
        self._arrays[(keys, K.DEVICE)] = found
        return found

    def tables(self, weight):
        """The ``(num_embeddings, embedding_dim)`` views of the flat buffer ``weight``."""
        return [_device.reshaped(weight[self.table_start[t]:self.table_start[t + 1]],
                                 (self.rows[t], self.dims_of_table[t]))
                for t in range(len(self.rows))]

    def __repr__(self):
        return (f"CollectionLayout(tables={self.table_names}, features={self.feature_names}, "
                f"total_dim={self.total_dim}, is_weighted={self.is_weighted})")


# ---------------------------------------------------------------- keyed jagged offsets


def jagged_offsets(lengths, size, name="lengths", size_name="len(values)"):
    """``[0, cumsum(lengths)]`` as int64, on ``lengths``' device, checked.

    Raises
    ------
    ValueError
        A negative length, or lengths that do not sum to ``size`` (on the GPU
        deferred to a later call, see the deferred errors of the CUDA backend).
    """
    K = backend_for((lengths,), (name,))
    lengths = on_backend(K, lengths, name)
    if lengths.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {tuple(lengths.shape)}")
    offsets = K.empty((lengths.shape[0] + 1,), np.int64)
    bad = K.jagged_offsets(K.contiguous(lengths), int(size), offsets)
    if bad is not None:
        position, value = bad
        if position < lengths.shape[0]:
            raise ValueError(f"{name}: {name}[{position}]={value}: lengths must not be "
                             "negative")
        raise ValueError(f"{name}: sum to {value}, but {size_name}={size}: they must sum to "
                         "the number of values")
    return offsets


def jagged_lengths(offsets):
    """``offsets[1:] - offsets[:-1]`` (checked offsets) on their device, int64."""
    K = backend_for((offsets,), ("offsets",))
    lengths = K.empty((max(offsets.shape[0] - 1, 0),), np.int64)
    K.jagged_lengths(offsets, lengths)
    return lengths


def check_jagged_offsets(offsets, size):
    """``offsets`` as the int array of a keyed jagged array of ``size`` values, checked:
    starts at 0, never decreases, ends at ``size`` (deferred on the GPU)."""
    K = backend_for((offsets,), ("offsets",))
    offsets = on_backend(K, offsets, "offsets")
    if offsets.ndim != 1 or offsets.shape[0] == 0:
        raise ValueError(f"offsets: expected a 1-D array of at least one entry (0), got shape "
                         f"{tuple(offsets.shape)}")
    offsets = K.contiguous(offsets)
    bad = K.check_bag_offsets(offsets, int(size), True)
    if bad is not None:
        position, value = bad
        if position == 0:
            expected = "the first offset must be 0"
        elif position == offsets.shape[0] - 1 and value >= int(offsets[position - 1]):
            expected = f"the last offset must equal len(values)={size}"
        else:
            expected = "offsets must not decrease"
        raise ValueError(f"offsets: offsets[{position}]={value}: {expected}")
    return offsets


# ---------------------------------------------------------------- the collection ops


class _Call:
    __slots__ = ("K", "values", "offsets", "stride", "weights", "lay", "table", "fmt",
                 "result_dtype", "layout", "keys")


def _call(kjt, weight, layout, arrays, names, check=True):
    # check False: the ids are checked by the kernel that reads them (the forward
    # into a fresh output) or were checked when they were recorded (a module's backward).
    call = _Call()
    if isinstance(weight, (list, tuple)):
        weight = pack_tables(weight, layout)
    weight = _checks.check_float_or_half_array(weight, "weight", ndim=1)
    if weight.shape[0] != layout.num_elements:
        raise ValueError(f"weight: expected the flat buffer of the tables "
                         f"({layout.num_elements} elements), got shape {tuple(weight.shape)}")
    half = _checks.is_half_dtype(weight.dtype)
    call.result_dtype = _FLOAT32 if half else weight.dtype
    call.K = K = backend_for((weight, *arrays), ("weight", *names))
    values = kjt.values()
    call.values = on_backend(K, values, "values")
    call.offsets = on_backend(K, kjt.offsets(), "offsets")
    call.stride = int(kjt.stride())
    call.keys = tuple(kjt.keys())
    call.layout = layout
    call.lay = layout.arrays(call.keys, K)
    call.weights = None
    if layout.is_weighted:
        weights = kjt.weights_or_none()
        if weights is None:
            raise ValueError("features: the collection is weighted (is_weighted=True) but the "
                             "input has no weights")
        weights = _checks.check_float_array(weights, "weights", ndim=1)
        if K.DEVICE != "cpu" and _device.device_of(weights) == "cpu":
            weights = K.asarray(weights)  # host input for GPU tables, as the ids
        _checks.check_same_device((weight, weights), ("weight", "weights"))
        if weights.dtype != call.result_dtype:
            raise TypeError(f"weights: expected dtype {call.result_dtype} (the pooled "
                            f"result's), got {weights.dtype}")
        call.weights = K.contiguous(weights)
    call.fmt = half_format(weight.dtype) if half else TableFormat.FLOAT
    call.table = K.contiguous(weight).view(_UINT16) if half else weight
    if check:
        bad = K.check_collection_ids(call.values, call.offsets, call.stride, call.lay)
        if bad >= 0:
            _raise_bad_id(call, bad)
    return call


def pack_tables(tables, layout):
    """The 2-D ``tables`` copied into one new flat buffer laid out by ``layout``, on their
    device (all of one dtype and device), checked against the layout's shapes."""
    if len(tables) != len(layout.rows):
        raise ValueError(f"weight: expected {len(layout.rows)} tables, got {len(tables)}")
    checked = []
    for t, table in enumerate(tables):
        table = _checks.check_table(table, f"weight[{t}]")
        shape = (layout.rows[t], layout.dims_of_table[t])
        if tuple(table.shape) != shape:
            raise ValueError(f"weight[{t}]: expected shape {shape} (table "
                             f"{layout.table_names[t]!r}), got {tuple(table.shape)}")
        if checked and table.dtype != checked[0].dtype:
            raise TypeError(f"weight[{t}]: expected dtype {checked[0].dtype} (the first "
                            f"table's), got {table.dtype}")
        checked.append(table)
    if not checked:
        return np.empty(0, np.float32)
    _checks.check_same_device(checked, [f"weight[{t}]" for t in range(len(checked))])
    dtype, device = checked[0].dtype, _device.device_of(checked[0])
    if device == "cpu":
        return np.concatenate([np.ascontiguousarray(t).reshape(-1) for t in checked])
    flat = _device.to_device(np.empty(layout.num_elements, dtype), device)
    bits = _device.device_view(flat, _UINT16) if _checks.is_half_dtype(dtype) else flat
    for t, table in enumerate(checked):
        start, end = layout.table_start[t], layout.table_start[t + 1]
        source = _device.reshaped(_device.copy(table), (end - start,))
        if bits is not flat:
            source = _device.device_view(source, _UINT16)
        bits[start:end].copy_to_device(source)
    return flat


def _raise_bad_id(call, position):
    values, offsets = _device.to_host(call.values), _device.to_host(call.offsets)
    bag = int(np.searchsorted(offsets, position, side="right")) - 1
    f, b = divmod(bag, call.stride)
    value = int(values[position])
    layout = call.layout
    key = call.keys[f]
    t = next(t for feature, t in layout.slots
             if feature == key and not 0 <= value < layout.rows[t])
    raise IndexError(f"values: id {value} of feature {key!r} (sample {b}, position "
                     f"{position}) is out of range for table {layout.table_names[t]!r}: "
                     f"expected 0 <= id < {layout.rows[t]}")


def embedding_bag_collection(features, weight, layout, *, out=None):
    """Every table's pooled bags for every feature, side by side (TorchRec's
    ``EmbeddingBagCollection`` forward, without the module): one kernel launch.

    Parameters
    ----------
    features : KeyedJaggedArray
        Ids by key (key-major, ``stride()`` samples each); its weights scale
        the entries when ``layout.is_weighted``. Host arrays for tables on the
        GPU are copied there (CUDA arrays for tables on the CPU raise).
    weight : ndarray (1-D) or sequence of 2-D arrays
        The flat buffer of the tables (``layout.num_elements`` elements, the
        tables one after another), float32 / float64 / bfloat16 / float16; or
        the tables themselves, copied into one buffer for this call. 16-bit
        tables pool in float32 (exact widening), as ``embedding_bag`` does.
    layout : CollectionLayout
        The tables' shapes, poolings and features.
    out : ndarray, optional
        C-contiguous ``(B, layout.total_dim)`` buffer of the result's dtype.

    Returns
    -------
    ndarray, shape (B, total_dim)
        Of the tables' dtype (float32 for 16-bit tables). Row ``b``: each
        (table, feature) bag of sample ``b`` pooled, in
        ``layout.embedding_names`` order; bit for bit what
        :func:`~numbapos.functional.embedding_bag` gives table by table.

    Raises
    ------
    ValueError
        A key no table reads, a feature missing, weights missing or of the
        wrong size, a bad buffer or ``out``.
    IndexError
        An id outside its table, naming the feature, the sample and the id
        (on the GPU at a later call: nothing is modified).
    """
    return _forward(features, weight, layout, out, False)[0]


def _forward(features, weight, layout, out, save):
    """:func:`embedding_bag_collection`'s ``out``, and with ``save`` a copy of the ids made
    by the pooling kernel as it reads them (a module's record for its backward), else None.
    Into a new output the kernel checks the ids itself (one pass over them instead of
    two); a caller's ``out`` is left unchanged by a bad id, so they are checked first."""
    fresh = out is None
    call = _call(features, weight, layout, (out,), ("out",), check=not fresh)
    K = call.K
    _check_weights_size(call)
    shape = (call.stride, layout.total_dim)
    if out is None:
        out = K.empty(shape, call.result_dtype)
    else:
        out = _checks.check_out(out, shape, call.result_dtype,
                                avoid=(call.table, call.values, call.offsets, call.weights))
    saved = K.empty(tuple(call.values.shape), call.values.dtype) if save else None
    bad = K.pool_collection(call.values, call.offsets, call.stride, call.table, call.lay,
                            call.weights, out, None, int(call.fmt), fresh, saved)
    if bad >= 0:
        _raise_bad_id(call, bad)
    return out, saved


def _check_weights_size(call):
    if call.weights is not None and call.weights.shape[0] != call.values.shape[0]:
        raise ValueError(f"weights: expected len(values)={call.values.shape[0]} weights, got "
                         f"{call.weights.shape[0]}")
    if call.offsets.shape[0] != len(call.keys) * call.stride + 1:
        raise ValueError(f"offsets: expected len(keys) * stride + 1 = "
                         f"{len(call.keys) * call.stride + 1} entries, got "
                         f"{call.offsets.shape[0]}")


def embedding_bag_collection_backward(grad_output, features, weight, layout, *, sparse=True):
    """Gradients of :func:`embedding_bag_collection`: each table's, and the input weights'.

    One kernel writes every table's gradient: the positions of all tables are
    grouped by row (one id space, the tables' rows one after another) and
    each row summed in input order, bit-identical for any thread count and to
    :func:`~numbapos.functional.embedding_bag_backward` table by table.

    Parameters
    ----------
    grad_output : ndarray, shape (B, total_dim)
        Gradient of the loss with respect to the pooled result.
    features, weight, layout
        As given to the forward. ``weight`` is read only by max tables (the
        maxima found again) and for the gradient of the weights.
    sparse : bool, default True
        Each table's gradient as :class:`~numbapos.sparse.SparseRows` (the
        rows used only), else dense ``(num_embeddings, embedding_dim)`` arrays
        (views of one zero-filled buffer).

    Returns
    -------
    grad_tables : list
        One gradient per table, in ``layout`` order.
    grad_weights : ndarray or None
        ``(len(values),)``: per entry, ``dot(grad_output[b, columns], row)``
        summed over the tables reading its key; None unless weighted.
    """
    return _backward(grad_output, features, weight, layout, sparse, True)


def _unsummed_grads(grad, groups, bag_of, stride, layout):
    """Each table's :class:`~numbapos.sparse.SparseRows` with its rows' sums left undone:
    its row groups (rows local to the table) over the bags' samples, summed from its
    columns of ``grad`` (every table a plain sum of its own feature: one slot per key, in
    table order) by whatever reads the values, a fused update included, with the summed
    path's bits."""
    samples = bag_of[groups.order] % stride  # bag = key * stride + sample
    bounds = np.searchsorted(groups.rows, layout.first_row)
    grads = []
    col = 0
    for t, dim in enumerate(layout.dims_of_table):
        j0, j1 = int(bounds[t]), int(bounds[t + 1])
        rows = groups.rows[j0:j1] - layout.first_row[t]
        table_groups = RowGroups(rows, groups.starts[j0:j1], groups.counts[j0:j1], samples,
                                 j1 - j0)
        # The table's columns as their own (B, dim) array (a MB or so): the updates'
        # loops over C-contiguous rows vectorise, over a strided view they did not.
        columns = np.ascontiguousarray(grad[:, col:col + dim])
        grads.append(SparseRows._unsummed(table_groups, columns, False, layout.rows[t]))
        col += dim
    return grads


def _backward(grad_output, features, weight, layout, sparse, check, take=None, lazy=False):
    """:func:`embedding_bag_collection_backward`; ``check`` False for ids already checked
    (a module's record of its forward's, which nobody else can change). ``take(shape,
    dtype)`` (a module's :class:`~numbapos.nn._outputs.OutputBuffer`'s, on the CPU) may
    give the memory of a sparse gradient's values (None: a new array). ``lazy`` (sparse,
    on the CPU, every table a plain sum of its own feature): each table's gradient is
    left unsummed (:func:`_unsummed_grads`), for fused optimisers."""
    grad_output = _checks.check_float_array(grad_output, "grad_output", ndim=2)
    call = _call(features, weight, layout, (grad_output,), ("grad_output",), check)
    K = call.K
    _check_weights_size(call)
    shape = (call.stride, layout.total_dim)
    if tuple(grad_output.shape) != shape or grad_output.dtype != call.result_dtype:
        raise ValueError(f"grad_output: expected shape {shape} and dtype {call.result_dtype} "
                         f"(the pooled result's), got shape {tuple(grad_output.shape)} and "
                         f"dtype {grad_output.dtype}")
    grad = K.contiguous(grad_output)
    lay = call.lay
    size = call.values.shape[0]
    per_key = int(lay.key_slots.shape[1])
    total_rows = int(sum(layout.rows))
    global_ids = K.empty((size * per_key,), np.int64)
    bag_of = K.empty((size,), np.int64)
    K.collection_positions(call.values, call.offsets, call.stride, lay, global_ids, bag_of)
    argmax = None
    if "max" in layout.poolings:
        argmax = K.empty(shape, np.int64)
        K.pool_collection(call.values, call.offsets, call.stride, call.table, lay, None,
                          K.empty(shape, call.result_dtype), argmax, int(call.fmt))
    groups = K.group_rows(global_ids, total_rows, total_rows + 1)
    if lazy and sparse and K.DEVICE == "cpu" and layout.plain_sums:
        return _unsummed_grads(grad, groups, bag_of, call.stride, layout), None
    dims = layout.dims_of_table
    if sparse:
        caps = K.collection_group_sizes(groups, layout.first_row, size * per_key)
        row_start = np.concatenate([[0], np.cumsum(caps, dtype=np.int64)]).astype(np.int64)
        sizes = [c * d for c, d in zip(caps, dims, strict=True)]
        value_start = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        rows_out = K.empty((int(row_start[-1]),), np.int64)
        values = None if take is None else take((int(value_start[-1]),), call.result_dtype)
        if values is None:
            values = K.empty((int(value_start[-1]),), call.result_dtype)
        used = K.zeros((len(dims), 2), np.int64)
        K.collection_table_grad(grad, groups, bag_of, call.offsets, call.stride, lay,
                                call.weights, argmax, True, values, rows_out,
                                K.asarray(row_start), K.asarray(value_start), used)
        exact = K.DEVICE == "cpu"
        grads = []
        for t, dim in enumerate(dims):
            rows = rows_out[row_start[t]:row_start[t + 1]]
            vals = _device.reshaped(values[value_start[t]:value_start[t + 1]], (caps[t], dim))
            count = caps[t] if exact else used[t]
            grads.append(SparseRows._grouped(RowGroups(rows, None, None, None, count), vals,
                                             layout.rows[t]))
    else:
        flat = K.zeros((layout.num_elements,), call.result_dtype)
        nothing = K.empty((0,), np.int64)
        K.collection_table_grad(grad, groups, bag_of, call.offsets, call.stride, lay,
                                call.weights, argmax, False, flat, nothing, nothing, nothing,
                                K.empty((0, 2), np.int64))
        grads = layout.tables(flat)
    grad_weights = None
    if call.weights is not None:
        grad_weights = K.empty((size,), call.result_dtype)
        K.collection_weights_grad(grad, call.values, bag_of, call.stride, call.table, lay,
                                  grad_weights, int(call.fmt))
    return grads, grad_weights
