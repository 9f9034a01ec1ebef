"""Collections of pooled tables in one kernel per direction (functional.collection), against
tests/reference.py and table by table against functional.bag, bit for bit."""

import numpy as np
import pytest
import reference as ref
from conftest import device_cases, host, on

import numbapos
from numbapos.functional.bag import embedding_bag, embedding_bag_backward
from numbapos.functional.collection import (
    CollectionLayout,
    embedding_bag_collection,
    embedding_bag_collection_backward,
)
from numbapos.jagged import KeyedJaggedArray

KEYS = ["a", "b", "c"]
# (name, pooling, features): a table read by two features, a feature read by two tables.
TABLES = {
    "mixed": [("t0", "sum", ["a"]), ("t1", "mean", ["c", "b"]), ("t2", "max", ["b"])],
    "weighted": [("t0", "sum", ["a", "c"]), ("t1", "sum", ["b", "a"])],
}
SHAPES = {"t0": (9, 3), "t1": (6, 5), "t2": (4, 2)}


def _case(rng, dtype, tables, batch=4, index_dtype=np.int64):
    lengths = rng.integers(0, 4, len(KEYS) * batch)
    lengths[1] = 0  # an empty bag
    values = np.concatenate([
        rng.integers(0, min(SHAPES[t][0] for t, _, fs in tables if key in fs),
                     lengths[f * batch:(f + 1) * batch].sum())
        for f, key in enumerate(KEYS)]).astype(index_dtype)
    values[:3] = values[0]  # a repeated id
    weights = rng.standard_normal(values.size).astype(dtype)
    tabs = {name: rng.standard_normal(SHAPES[name]).astype(dtype) for name, _, _ in tables}
    return values, lengths, weights, tabs


def _layout(tables, weighted):
    return CollectionLayout([(n, *SHAPES[n], p, fs) for n, p, fs in tables], weighted)


def _flat(tabs, tables):
    return np.concatenate([tabs[n].reshape(-1) for n, _, _ in tables])


CASES = [(kind, dtype) for kind in TABLES for dtype in (np.float32, np.float64)]


@pytest.mark.parametrize("device, kind, dtype", device_cases(
    CASES, cuda=lambda kind, dtype: dtype == np.float32), indirect=["device"])
def test_forward_is_per_table_embedding_bag_side_by_side(rng, device, kind, dtype):
    tables = TABLES[kind]
    weighted = kind == "weighted"
    values, lengths, weights, tabs = _case(rng, dtype, tables)
    kjt = KeyedJaggedArray(KEYS, on(device, values), lengths=on(device, lengths),
                           weights=on(device, weights) if weighted else None)
    layout = _layout(tables, weighted)
    out = host(embedding_bag_collection(kjt, on(device, _flat(tabs, tables)), layout))
    psw = weights if weighted else None
    np.testing.assert_array_equal(out, ref.embedding_bag_collection(
        KEYS, values, lengths, psw, tables, tabs))
    col = 0
    for name, pooling, features in tables:  # table by table through embedding_bag
        for feature in features:
            ids, offsets, positions = ref.key_bags(KEYS, values, lengths, feature)
            want = embedding_bag(ids, tabs[name], offsets, mode=pooling,
                                 include_last_offset=True,
                                 per_sample_weights=None if psw is None else psw[positions])
            np.testing.assert_array_equal(out[:, col:col + want.shape[1]], want)
            col += want.shape[1]
    assert col == out.shape[1] == layout.total_dim
    # Host ids and weights for tables on the GPU are copied there, as embedding's ids.
    on_host = KeyedJaggedArray(KEYS, values, lengths=lengths,
                               weights=weights if weighted else None)
    np.testing.assert_array_equal(
        host(embedding_bag_collection(on_host, on(device, _flat(tabs, tables)), layout)), out)
    # A list of tables gives the same (copied into one buffer for the call).
    listed = embedding_bag_collection(kjt, [on(device, tabs[n]) for n, _, _ in tables], layout)
    np.testing.assert_array_equal(host(listed), out)


@pytest.mark.parametrize("device, kind, dtype, sparse", device_cases(
    [(k, d, s) for k, d in CASES for s in (False, True)],
    cuda=lambda kind, dtype, sparse: dtype == np.float32), indirect=["device"])
def test_backward_is_per_table_embedding_bag_backward(rng, device, kind, dtype, sparse):
    tables = TABLES[kind]
    weighted = kind == "weighted"
    values, lengths, weights, tabs = _case(rng, dtype, tables)
    kjt = KeyedJaggedArray(KEYS, on(device, values), lengths=on(device, lengths),
                           weights=on(device, weights) if weighted else None)
    layout = _layout(tables, weighted)
    grad = rng.standard_normal((4, layout.total_dim)).astype(dtype)
    grad[:, 0] = -0.0  # sums of -0.0 terms: -0.0 for plain sums, as per-table bags give
    grads, grad_w = embedding_bag_collection_backward(on(device, grad), kjt,
                                                      on(device, _flat(tabs, tables)), layout,
                                                      sparse=sparse)
    psw = weights if weighted else None
    want, want_w = ref.embedding_bag_collection_backward(grad, KEYS, values, lengths, psw,
                                                          tables, tabs)
    for (name, pooling, features), g in zip(tables, grads, strict=True):
        if sparse:
            assert isinstance(g, numbapos.sparse.SparseRows)
            g = g.to_dense()
        np.testing.assert_array_equal(host(g), want[name])
        # One table's features as the bags of one embedding_bag_backward (in key order).
        ordered = sorted(features, key=KEYS.index)
        parts = [ref.key_bags(KEYS, values, lengths, f) for f in ordered]
        ids = np.concatenate([p[0] for p in parts])
        offsets = np.concatenate([[0], np.cumsum([np.diff(p[1]) for p in parts])])
        cols = [layout.embedding_names.index(f if f in layout.embedding_names else
                                             f"{f}@{name}") for f in ordered]
        starts = np.concatenate([[0], np.cumsum(layout.dims)])
        g_out = np.concatenate([grad[:, starts[c]:starts[c + 1]] for c in cols])
        positions = np.concatenate([p[2] for p in parts])
        per_table, _ = embedding_bag_backward(
            g_out, ids, tabs[name], offsets, mode=pooling, include_last_offset=True,
            per_sample_weights=None if psw is None else psw[positions])
        np.testing.assert_array_equal(host(g), per_table)
        if not sparse:  # the sign of each zero too
            assert host(g).tobytes() == per_table.tobytes()
    assert (grad_w is None) == (not weighted)
    if weighted:
        np.testing.assert_array_equal(host(grad_w), want_w)


@pytest.mark.parametrize("kind", list(TABLES))
def test_gradients_match_finite_differences(rng, kind):
    tables = TABLES[kind]
    weighted = kind == "weighted"
    values, lengths, weights, tabs = _case(rng, np.float64, tables, batch=2)
    kjt = KeyedJaggedArray(KEYS, values, lengths=lengths, weights=weights if weighted else None)
    layout = _layout(tables, weighted)
    flat = _flat(tabs, tables)
    probe = rng.standard_normal((2, layout.total_dim))

    def loss(flat, w=weights):
        k = KeyedJaggedArray(KEYS, values, lengths=lengths, weights=w if weighted else None)
        return float(np.sum(embedding_bag_collection(k, flat, layout) * probe))

    grads, grad_w = embedding_bag_collection_backward(probe, kjt, flat, layout, sparse=False)
    analytic = np.concatenate([g.reshape(-1) for g in grads])
    eps = 1e-6
    for e in rng.choice(flat.size, 25, replace=False):
        step = np.zeros_like(flat)
        step[e] = eps
        numeric = (loss(flat + step) - loss(flat - step)) / (2 * eps)
        assert abs(numeric - analytic[e]) < 1e-6, e
    if weighted:
        for i in range(values.size):
            step = np.zeros_like(weights)
            step[i] = eps
            numeric = (loss(flat, weights + step) - loss(flat, weights - step)) / (2 * eps)
            assert abs(numeric - grad_w[i]) < 1e-6, i


def test_serial_and_parallel_kernels_give_the_same_bits(rng, parallel_threshold):
    tables = TABLES["mixed"]
    values, lengths, _, tabs = _case(rng, np.float32, tables, batch=64)
    kjt = KeyedJaggedArray(KEYS, values, lengths=lengths)
    layout = _layout(tables, False)
    grad = rng.standard_normal((64, layout.total_dim)).astype(np.float32)
    results = []
    for threshold in (1 << 40, 1):
        parallel_threshold(threshold)
        out = embedding_bag_collection(kjt, _flat(tabs, tables), layout)
        grads, _ = embedding_bag_collection_backward(grad, kjt, _flat(tabs, tables), layout)
        results.append((out, [g.to_dense() for g in grads]))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1], strict=True):
        np.testing.assert_array_equal(a, b)


def test_id_out_of_range_names_feature_sample_and_id(rng, device):
    tables = TABLES["mixed"]
    values, lengths, _, tabs = _case(rng, np.float32, tables)
    values = values.copy()
    bad = int(lengths[:len(lengths) // 3 * 2].sum()) if values.size else 0  # first id of "c"
    values[bad] = 6  # t1 ("c") has 6 rows
    kjt = KeyedJaggedArray(KEYS, on(device, values), lengths=on(device, lengths))
    flat = on(device, _flat(tabs, tables))
    out = on(device, np.full((4, _layout(tables, False).total_dim), 7, np.float32))
    batch = 4
    sample = int(np.searchsorted(np.cumsum(lengths), bad, side="right")) - 2 * batch
    if device == "cpu":
        with pytest.raises(IndexError, match=rf"id 6 of feature 'c' \(sample {sample}, "
                                             rf"position {bad}\).*table 't1'"):
            embedding_bag_collection(kjt, flat, _layout(tables, False), out=out)
        np.testing.assert_array_equal(out, 7)  # nothing written
    else:
        embedding_bag_collection(kjt, flat, _layout(tables, False), out=out)
        with pytest.raises(IndexError, match=rf"values \(feature 'c'\): index 6 \(at flat "
                                             rf"position {bad}\).*table 't1'"):
            numbapos.synchronize()
        # The gradient kernels return while the error is pending: no table gradient is made.
        grads, _ = embedding_bag_collection_backward(out, kjt, flat, _layout(tables, False),
                                                     sparse=False)
        with pytest.raises(IndexError, match="feature 'c'"):
            numbapos.synchronize()
        for g in grads:
            np.testing.assert_array_equal(host(g), 0)
    np.testing.assert_array_equal(host(flat), _flat(tabs, tables))


def test_bad_keys_and_weights_raise_clearly(rng):
    tables = TABLES["mixed"]
    values, lengths, _, tabs = _case(rng, np.float32, tables)
    flat = _flat(tabs, tables)
    layout = _layout(tables, False)
    extra = KeyedJaggedArray(KEYS + ["typo"], np.concatenate([values, [0]]),
                             lengths=np.concatenate([lengths, [1, 0, 0, 0]]))
    with pytest.raises(ValueError, match="key 'typo' is read by no table"):
        embedding_bag_collection(extra, flat, layout)
    missing = KeyedJaggedArray(["a", "b"], values[:lengths[:8].sum()], lengths=lengths[:8])
    with pytest.raises(ValueError, match="reads feature 'c', missing"):
        embedding_bag_collection(missing, flat, layout)
    with pytest.raises(ValueError, match="is_weighted.*table 't1' pools with 'mean'"):
        _layout(tables, True)
    kjt = KeyedJaggedArray(KEYS, values, lengths=lengths)
    with pytest.raises(ValueError, match="is_weighted=True.*no weights"):
        embedding_bag_collection(kjt, _flat(tabs, TABLES["weighted"]),
                                 _layout(TABLES["weighted"], True))
    with pytest.raises(ValueError, match="weight: expected the flat buffer"):
        embedding_bag_collection(kjt, flat[:-1], layout)
    with pytest.raises(ValueError, match="pooling: expected 'sum', 'mean' or 'max'"):
        CollectionLayout([("t", 3, 2, "avg", ["a"])])
    with pytest.raises(ValueError, match="lists a feature twice"):
        CollectionLayout([("t", 3, 2, "sum", ["a", "a"])])
    with pytest.raises(ValueError, match="name 't' is used twice"):
        CollectionLayout([("t", 3, 2, "sum", ["a"]), ("t", 3, 2, "sum", ["b"])])


def test_lengths_and_offsets_are_checked(device):
    values = on(device, np.array([1, 2, 3]))
    if device == "cpu":
        with pytest.raises(ValueError, match=r"lengths: sum to 2, but len\(values\)=3"):
            KeyedJaggedArray(["a"], values, lengths=np.array([1, 1]))
        with pytest.raises(ValueError, match=r"lengths: lengths\[0\]=-1"):
            KeyedJaggedArray(["a"], values, lengths=np.array([-1, 4]))
        with pytest.raises(ValueError, match=r"offsets: offsets\[2\]=2: the last offset must "
                                             r"equal len\(values\)=3"):
            KeyedJaggedArray(["a"], values, offsets=np.array([0, 1, 2]))
    else:
        KeyedJaggedArray(["a"], values, lengths=np.array([1, 1]))
        with pytest.raises(ValueError, match=r"lengths: item 2 .* len\(values\)"):
            numbapos.synchronize()
    with pytest.raises(ValueError, match=r"lengths: expected len\(keys\) \* batch entries"):
        KeyedJaggedArray(["a", "b"], values, lengths=np.array([1, 1, 1]))
    with pytest.raises(ValueError, match="keys: 'a' appears twice"):
        KeyedJaggedArray(["a", "a"], values, lengths=np.array([1, 2]))
    with pytest.raises(ValueError, match="lengths: give lengths or offsets"):
        KeyedJaggedArray(["a"], values)


def test_keyed_jagged_array_accessors(device):
    kjt = KeyedJaggedArray.from_offsets_sync(
        ["user", "item"], on(device, np.array([4, 1, 2, 7, 3])),
        on(device, np.array([0, 2, 2, 3, 5])), weights=on(device, np.arange(5.0)))
    assert kjt.keys() == ["user", "item"] and kjt.stride() == 2 and len(kjt) == 5
    np.testing.assert_array_equal(host(kjt.lengths()), [2, 0, 1, 2])
    assert kjt.length_per_key() == [2, 3] and kjt.offset_per_key() == [0, 2, 5]
    items = kjt.to_dict()["item"]
    np.testing.assert_array_equal(host(items.values()), [2, 7, 3])
    np.testing.assert_array_equal(host(items.lengths()), [1, 2])
    np.testing.assert_array_equal(host(items.offsets()), [0, 1, 3])
    np.testing.assert_array_equal(host(items.weights()), [2.0, 3.0, 4.0])
    np.testing.assert_array_equal(host(kjt["user"].values()), [4, 1])
    same = KeyedJaggedArray.from_lengths_sync(["user", "item"], host(kjt.values()),
                                              np.array([2, 0, 1, 2]))
    np.testing.assert_array_equal(host(same.offsets()), host(kjt.offsets()))
    assert same.weights_or_none() is None
    with pytest.raises(ValueError, match="no weights"):
        same.weights()


@pytest.mark.parametrize("weighted", [False, True])
def test_wide_float32_tables_sum_in_lanes_with_the_column_loops_bits(rng, weighted):
    """Float32 tables of D >= 16 sum their leading columns in vector registers (the bags'
    Lanes loop, 128 / 64 / 32 / 16 at a time) and the rest column by column: the bits of
    per-table embedding_bag and of the float64 path's float32 operations."""
    shapes = {"w0": (30, 128), "w1": (20, 40), "w2": (25, 19)}
    tables = ([("w0", "sum", ["a", "b"]), ("w1", "sum", ["c"]), ("w2", "sum", ["b"])]
              if weighted else
              [("w0", "sum", ["a", "b"]), ("w1", "mean", ["c"]), ("w2", "max", ["b"])])
    batch = 6
    lengths = rng.integers(0, 7, len(KEYS) * batch)
    values = rng.integers(0, 19, lengths.sum())
    weights = rng.standard_normal(values.size).astype(np.float32)
    tabs = {n: rng.standard_normal(shapes[n]).astype(np.float32) for n in shapes}
    layout = CollectionLayout([(n, *shapes[n], p, fs) for n, p, fs in tables], weighted)
    kjt = KeyedJaggedArray(KEYS, values, lengths=lengths, weights=weights if weighted else None)
    out = embedding_bag_collection(kjt, _flat(tabs, tables), layout)
    col = 0
    for name, pooling, features in tables:
        for feature in features:
            ids, offsets, positions = ref.key_bags(KEYS, values, lengths, feature)
            want = embedding_bag(ids, tabs[name], offsets, mode=pooling,
                                 include_last_offset=True,
                                 per_sample_weights=weights[positions] if weighted else None)
            dim = shapes[name][1]
            np.testing.assert_array_equal(out[:, col:col + dim], want)
            col += dim


@pytest.mark.parametrize("threshold", [1 << 40, 1])
def test_ids_checked_in_the_pooling_kernel_name_the_first_bad_one(rng, parallel_threshold,
                                                                   threshold):
    """Into a new output the pooling kernel checks each bag's ids itself (a caller's
    ``out`` is checked before anything is written): the same first bad position, serial
    or parallel, whether it lies in a sum, mean or max table's bag or in a key read by
    two tables of which only one is too small."""
    parallel_threshold(threshold)
    tables = TABLES["mixed"]
    values, lengths, _, tabs = _case(rng, np.float32, tables, batch=40)
    layout = _layout(tables, False)
    flat = _flat(tabs, tables)
    ends = np.cumsum(lengths)
    # "b" is read by t1 (6 rows) and t2 (4 rows): id 5 is bad for t2 only.
    b_start, c_start = int(ends[39]), int(ends[79])
    for position, value, feature, table in [(c_start + 3, 6, "c", "t1"),
                                            (b_start + 2, 5, "b", "t2"),
                                            (1, -1, "a", "t0")]:
        bad = values.copy()
        bad[position] = value
        bad[-1] = 99  # a later bad id is not the one named
        kjt = KeyedJaggedArray(KEYS, bad, lengths=lengths)
        sample = int(np.searchsorted(ends, position, side="right")) % 40
        for out in (None, np.full((40, layout.total_dim), 7, np.float32)):
            with pytest.raises(IndexError, match=rf"id {value} of feature '{feature}' "
                                                 rf"\(sample {sample}, position {position}\)"
                                                 rf".*table '{table}'"):
                embedding_bag_collection(kjt, flat, layout, out=out)
            if out is not None:
                np.testing.assert_array_equal(out, 7)
        with pytest.raises(IndexError, match=rf"position {position}\)"):
            embedding_bag_collection_backward(np.zeros((40, layout.total_dim), np.float32),
                                              kjt, flat, layout)


@pytest.mark.parametrize("threshold", [1 << 40, 1])
def test_collection_of_unequal_tables_writes_only_its_columns(rng, parallel_threshold,
                                                              threshold):
    """Tables of dims that are and are not multiples of the vector width (1, 15, 16, 17,
    33, 128, 130), every pooling, empty bags and weights: each slot's columns are its
    bags' per-table embedding_bag, and the output has no column left unwritten (it is
    poisoned with NaN first through out=)."""
    parallel_threshold(threshold)
    dims = {"d1": 1, "d15": 15, "d16": 16, "d17": 17, "d33": 33, "d128": 128, "d130": 130}
    keys = ["p", "q", "r"]
    poolings = ["sum", "mean", "max", "sum", "mean", "max", "sum"]
    tables = [(name, pooling, [keys[k % 3]] if k % 2 else [keys[k % 3], keys[(k + 1) % 3]])
              for k, (name, pooling) in enumerate(zip(dims, poolings, strict=True))]
    batch = 9
    lengths = rng.integers(0, 6, len(keys) * batch)
    lengths[::4] = 0  # empty bags, in every key
    values = rng.integers(0, 11, lengths.sum())
    tabs = {n: rng.standard_normal((11, d)).astype(np.float32) for n, d in dims.items()}
    layout = CollectionLayout([(n, 11, dims[n], p, fs) for n, p, fs in tables])
    kjt = KeyedJaggedArray(keys, values, lengths=lengths)
    flat = _flat(tabs, tables)
    out = np.full((batch, layout.total_dim), np.nan, np.float32)
    embedding_bag_collection(kjt, flat, layout, out=out)
    np.testing.assert_array_equal(embedding_bag_collection(kjt, flat, layout), out)
    col = 0
    for name, pooling, features in tables:
        for feature in features:
            ids, offsets, _ = ref.key_bags(keys, values, lengths, feature)
            want = embedding_bag(ids, tabs[name], offsets, mode=pooling,
                                 include_last_offset=True)
            np.testing.assert_array_equal(out[:, col:col + dims[name]], want)
            col += dims[name]
    assert col == layout.total_dim
    weighted_tables = [(n, "sum", fs) for n, _, fs in tables]
    weights = rng.standard_normal(values.size).astype(np.float32)
    layout = CollectionLayout([(n, 11, dims[n], p, fs) for n, p, fs in weighted_tables], True)
    got = embedding_bag_collection(KeyedJaggedArray(keys, values, lengths=lengths,
                                                    weights=weights), flat, layout)
    np.testing.assert_array_equal(got, ref.embedding_bag_collection(
        keys, values, lengths, weights, weighted_tables, tabs))
