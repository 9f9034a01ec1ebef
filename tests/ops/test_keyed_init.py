"""The keyed initialiser: values keyed by (seed, row, column), any subset of rows on its own."""

import numpy as np
import pytest
from conftest import host, on

from numbapos import functional as F
from numbapos import nn


def _whole(num, dim, seed, dtype=np.float32):
    return F.keyed_normal_(np.empty((num, dim), dtype), seed)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_any_rows_equal_the_whole_table_fill(dtype):
    whole = _whole(50, 7, seed=11, dtype=dtype)
    rows = np.array([49, 0, 13, 13, 2], np.int32)
    part = F.keyed_normal_(np.empty((5, 7), dtype), 11, rows=rows)
    np.testing.assert_array_equal(part, whole[rows])
    # Row-strided shards (row r on shard r % 3) reassemble the table exactly.
    table = np.empty_like(whole)
    for shard in range(3):
        local = np.arange(shard, 50, 3)
        table[local] = F.keyed_normal_(np.empty((local.size, 7), dtype), 11, rows=local)
    np.testing.assert_array_equal(table, whole)


def test_float32_fill_is_the_float64_fill_rounded():
    np.testing.assert_array_equal(_whole(20, 9, 3), _whole(20, 9, 3, np.float64).astype(np.float32))


def test_values_are_standard_normal_and_seeds_differ():
    values = _whole(4000, 50, seed=0, dtype=np.float64).ravel()
    assert abs(values.mean()) < 0.01 and abs(values.std() - 1) < 0.01
    # Tail masses of N(0, 1): P(|z| > 1) = 0.3173, P(|z| > 2) = 0.0455, P(|z| > 3) = 0.0027.
    for bound, mass in ((1, 0.3173), (2, 0.0455), (3, 0.0027)):
        assert abs(np.mean(np.abs(values) > bound) - mass) < 0.1 * mass + 1e-3
    other = _whole(4000, 50, seed=1, dtype=np.float64).ravel()
    assert abs(np.corrcoef(values, other)[0, 1]) < 0.01
    assert not np.array_equal(_whole(3, 4, 7)[1], _whole(3, 4, 7)[2])


def test_mean_and_std_and_the_init_factory():
    base = _whole(30, 5, 4, np.float64)
    scaled = F.keyed_normal_(np.empty((30, 5)), 4, mean=2.0, std=0.5)
    np.testing.assert_allclose(scaled, 2.0 + 0.5 * base, rtol=1e-15)
    emb = nn.Embedding(30, 5, init=nn.init.keyed_normal(4))
    np.testing.assert_array_equal(emb.weight.data, base.astype(np.float32))
    again = nn.Embedding(30, 5)
    nn.init.keyed_normal_(again.weight.data, seed=4)
    np.testing.assert_array_equal(again.weight.data, emb.weight.data)


def test_devices_agree(device):
    rows = np.array([0, 5, 2**40], np.int64)
    got = F.keyed_normal_(on(device, np.zeros((3, 4), np.float32)), 9, rows=on(device, rows))
    want = F.keyed_normal_(np.zeros((3, 4), np.float32), 9, rows=rows)
    np.testing.assert_allclose(host(got), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("call, error, message", [
    (lambda w: F.keyed_normal_(w.astype(np.int32), 0), TypeError, "weight"),
    (lambda w: F.keyed_normal_(w[:, ::2], 0), ValueError, "weight"),
    (lambda w: F.keyed_normal_(w, -1), ValueError, "seed"),
    (lambda w: F.keyed_normal_(w, 1.5), TypeError, "seed"),
    (lambda w: F.keyed_normal_(w, 0, rows=[1, 2]), ValueError, "rows: expected 4"),
    (lambda w: F.keyed_normal_(w, 0, rows=[0, 1, -3, 2]), IndexError, "rows: index -3"),
    (lambda w: F.keyed_normal_(w, 0, std=-1.0), ValueError, "std"),
    (lambda w: F.keyed_normal_(w, 0, mean=np.inf), ValueError, "mean"),
])
def test_bad_arguments_raise_before_writing(call, error, message):
    weight = np.full((4, 6), 7.0, np.float32)
    with pytest.raises(error, match=message):
        call(weight)
    assert (weight == 7.0).all()


# ------------------------------------------------------------------ one seed, one table


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("num_shards, padding_idx", [(1, None), (3, 4), (2, -1)])
def test_embedding_and_sharded_embedding_start_from_one_table(num_shards, padding_idx, dtype):
    from numbapos.distributed import ShardedEmbedding

    emb = nn.Embedding(11, 5, padding_idx=padding_idx, dtype=dtype, seed=123)
    table = ShardedEmbedding(11, 5, num_shards, padding_idx=padding_idx, dtype=dtype, seed=123,
                             optimizer_kwargs={"lr": 0.1}, backend="local")
    np.testing.assert_array_equal(table.to_embedding().weight.data, emb.weight.data)
    want = _whole(11, 5, 123, dtype)
    if padding_idx is not None:
        want[padding_idx] = 0
    np.testing.assert_array_equal(emb.weight.data, want)


def test_an_int_seed_is_keyed_a_generator_draws_from_numpy():
    np.testing.assert_array_equal(nn.Embedding(6, 3, seed=5).weight.data, _whole(6, 3, 5))
    np.testing.assert_array_equal(
        nn.Embedding(6, 3, seed=np.random.default_rng(5)).weight.data,
        np.random.default_rng(5).normal(size=(6, 3)).astype(np.float32))
    # An explicit initialiser gets default_rng(seed), as before.
    np.testing.assert_array_equal(
        nn.Embedding(6, 3, init=nn.init.uniform(), seed=5).weight.data,
        np.random.default_rng(5).uniform(-0.1, 0.1, size=(6, 3)).astype(np.float32))
    with pytest.raises(ValueError, match="seed: expected an integer >= 0, got -1"):
        nn.Embedding(6, 3, seed=-1)
