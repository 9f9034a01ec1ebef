"""EmbeddingBagCollection and EmbeddingBagConfig (TorchRec's names): forward/backward against
per-table EmbeddingBag modules, state_dict and safetensors, every optimiser (fused too)."""

import numpy as np
import pytest
from conftest import host, on

import numbapos
from numbapos.jagged import KeyedArray, KeyedJaggedArray
from numbapos.nn.bag import EmbeddingBag
from numbapos.nn.collection import EmbeddingBagCollection, EmbeddingBagConfig
from numbapos.sparse import SparseRows

KEYS = ["user", "item", "tag"]
TABLES = [EmbeddingBagConfig(name="users", num_embeddings=10, embedding_dim=4,
                             feature_names=["user"]),
          EmbeddingBagConfig(name="products", num_embeddings=12, embedding_dim=3,
                             feature_names=["item"], pooling="MEAN"),
          EmbeddingBagConfig(name="tags", num_embeddings=6, embedding_dim=2,
                             feature_names=["tag"], pooling="max")]
LENGTHS = np.array([1, 2, 0, 3, 1, 2, 2, 0, 1])
VALUES = np.array([3, 1, 3, 7, 7, 0, 11, 2, 5, 0, 1, 4])


def _kjt(device="cpu", values=VALUES):
    return KeyedJaggedArray(KEYS, on(device, values), lengths=on(device, LENGTHS))


def _bags(ebc, sparse):
    """Per-table EmbeddingBag modules over copies of the collection's tables."""
    return [EmbeddingBag.from_pretrained(host(b.weight.data).copy(), freeze=False,
                                         mode=t.pooling, sparse=sparse, include_last_offset=True)
            for t, b in zip(TABLES, ebc.embedding_bags.values(), strict=True)]


def _key_bags(f, batch=3):
    offsets = np.concatenate([[0], np.cumsum(LENGTHS)])
    start = offsets[f * batch]
    return VALUES[start:offsets[(f + 1) * batch]], offsets[f * batch:(f + 1) * batch + 1] - start


def test_config_validates_and_normalises():
    config = EmbeddingBagConfig("t", 5, 2, ["a", "b"], pooling="Mean")
    assert config.pooling == "mean" and config.feature_names == ("a", "b")
    with pytest.raises(ValueError, match="pooling: expected 'sum', 'mean' or 'max'"):
        EmbeddingBagConfig("t", 5, 2, ["a"], pooling="avg")
    with pytest.raises(ValueError, match="num_embeddings"):
        EmbeddingBagConfig("t", 0, 2, ["a"])
    with pytest.raises(ValueError, match="reads no feature"):
        EmbeddingBagConfig("t", 5, 2, [])
    with pytest.raises(ValueError, match="lists a feature twice"):
        EmbeddingBagConfig("t", 5, 2, ["a", "a"])
    with pytest.raises(ValueError, match="name 't' is used twice"):
        EmbeddingBagCollection([config, config])
    with pytest.raises(ValueError, match="name 'items' is an attribute of ModuleDict"):
        EmbeddingBagCollection([EmbeddingBagConfig("items", 5, 2, ["a"])])
    with pytest.raises(ValueError, match="table 't' pools with 'mean'"):
        EmbeddingBagCollection([config], is_weighted=True)


def test_forward_backward_match_per_table_embedding_bags(device):
    ebc = EmbeddingBagCollection(TABLES, seed=3, device=device)
    bags = _bags(ebc, sparse=True)
    out = ebc(_kjt(device))
    assert isinstance(out, KeyedArray)
    assert out.keys() == KEYS and out.length_per_key() == [4, 3, 2]
    assert out.offset_per_key() == [0, 4, 7, 9]
    grad = np.random.default_rng(0).standard_normal((3, 9)).astype(np.float32)
    assert ebc.backward(on(device, grad)) is None
    for f, (bag, key) in enumerate(zip(bags, KEYS, strict=True)):
        ids, offsets = _key_bags(f)
        np.testing.assert_array_equal(host(out[key]), bag(ids, offsets))
        a, b = out.offset_per_key()[f:f + 2]
        bag.backward(grad[:, a:b])
        mine = ebc.embedding_bags[TABLES[f].name].weight.grad
        assert isinstance(mine, SparseRows)
        np.testing.assert_array_equal(host(mine.to_dense()), bag.weight.grad.to_dense())
    assert list(ebc.state_dict()) == [f"embedding_bags.{t.name}.weight" for t in TABLES]


def test_dense_gradients_and_weighted_bags():
    tables = [EmbeddingBagConfig("a", 8, 3, ["user", "item"]),
              EmbeddingBagConfig("b", 6, 2, ["tag", "user"])]
    ebc = EmbeddingBagCollection(tables, is_weighted=True, sparse=False, seed=1,
                                 dtype=np.float64)
    weights = np.linspace(-1, 1, VALUES.size)
    kjt = KeyedJaggedArray(KEYS, VALUES % 6, lengths=LENGTHS, weights=weights)
    out = ebc(kjt)
    assert out.keys() == ["user@a", "item", "tag", "user@b"]
    grad_w = ebc.backward(np.ones((3, 10)))
    assert grad_w.shape == VALUES.shape
    for b in ebc.embedding_bags.values():
        assert isinstance(b.weight.grad, np.ndarray) and b.weight.grad.dtype == np.float64
    # d(sum of outputs)/d(weight of an entry) = sum of the rows it names, over its tables.
    rows = {n: b.weight.data for n, b in ebc.embedding_bags.items()}
    first_user = int(VALUES[0] % 6)
    np.testing.assert_allclose(grad_w[0], rows["a"][first_user].sum() + rows["b"][first_user]
                               .sum(), rtol=1e-12)


def test_unknown_key_and_bad_ids_raise_and_change_nothing():
    ebc = EmbeddingBagCollection(TABLES, seed=0)
    before = {k: v.copy() for k, v in ebc.state_dict().items()}
    extra = KeyedJaggedArray(KEYS + ["age"], np.concatenate([VALUES, [1]]),
                             lengths=np.concatenate([LENGTHS, [1, 0, 0]]))
    with pytest.raises(ValueError, match="key 'age' is read by no table"):
        ebc(extra)
    bad = VALUES.copy()
    bad[-1] = 6  # "tag" has 6 rows; the last sample's last id
    with pytest.raises(IndexError, match=r"id 6 of feature 'tag' \(sample 2, position 11\)"):
        ebc(_kjt(values=bad))
    with pytest.raises(RuntimeError):
        ebc.backward(np.ones((3, 9), np.float32))  # nothing was recorded
    for k, v in ebc.state_dict().items():
        np.testing.assert_array_equal(v, before[k])


def test_state_dict_round_trips_through_safetensors(tmp_path):
    pytest.importorskip("safetensors")
    ebc = EmbeddingBagCollection(TABLES, seed=0)
    path = tmp_path / "ebc.safetensors"
    numbapos.io.save_state(ebc, path)
    other = EmbeddingBagCollection(TABLES, seed=1)
    other.load_state_dict(numbapos.io.load_state(path))
    np.testing.assert_array_equal(other(_kjt()).values(), ebc(_kjt()).values())
    for (k, v), (k2, v2) in zip(ebc.state_dict().items(), other.state_dict().items(), strict=True):
        assert k == k2
        np.testing.assert_array_equal(v, v2)


OPTIMISERS = [lambda p: numbapos.optim.SGD(p, lr=0.1, momentum=0.9),
              lambda p: numbapos.optim.Adam(p, lr=0.01),
              lambda p: numbapos.optim.AdamW(p, lr=0.01),
              lambda p: numbapos.optim.Adagrad(p, lr=0.1),
              lambda p: numbapos.optim.RowWiseAdagrad(p, lr=0.1)]


@pytest.mark.parametrize("make", OPTIMISERS, ids=["sgd", "adam", "adamw", "adagrad",
                                                  "rowwise_adagrad"])
@pytest.mark.parametrize("fuse", [False, True])
def test_every_optimiser_steps_it_as_per_table_bags(make, fuse):
    ebc = EmbeddingBagCollection(TABLES, seed=2)
    bags = _bags(ebc, sparse=True)
    opts = [make(ebc.parameters()), *(make(b.parameters()) for b in bags)]
    if fuse:
        for opt in opts:
            opt.fuse_with_backward()
    grad = np.random.default_rng(1).standard_normal((3, 9)).astype(np.float32)
    for _ in range(2):
        ebc(_kjt())
        ebc.backward(grad)
        for f, bag in enumerate(bags):
            bag(*_key_bags(f))
            a, b = [0, 4, 7, 9][f:f + 2]
            bag.backward(grad[:, a:b])
        for opt in opts:
            opt.step()
            opt.zero_grad()
    for bag, mine in zip(bags, ebc.embedding_bags.values(), strict=True):
        np.testing.assert_array_equal(mine.weight.data, bag.weight.data)
    # The tables are still views of the one buffer the kernels read.
    assert all(p.data.base is ebc._flat for p in ebc.parameters())


def test_moving_and_casting_rebuild_the_shared_buffer(device):
    ebc = EmbeddingBagCollection(TABLES, seed=0)
    want = ebc(_kjt()).values()
    ebc.to(device)
    np.testing.assert_array_equal(host(ebc(_kjt(device)).values()), want)
    ebc.to("cpu").double()
    out = ebc(_kjt()).values()
    assert out.dtype == np.float64
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-7)
    ebc.backward(np.ones(out.shape))
    assert all(p.grad.dtype == np.float64 for p in ebc.parameters())


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_tables_pool_in_float32_as_widened_tables(device, dtype):
    ebc = EmbeddingBagCollection(TABLES, dtype=dtype, seed=4, device=device)
    wide = EmbeddingBagCollection(TABLES, seed=0)
    wide.load_state_dict(ebc.state_dict())  # the 16-bit values, exactly, in float32
    out = ebc(_kjt(device)).values()
    assert out.dtype == np.float32
    np.testing.assert_array_equal(host(out), wide(_kjt()).values())
    grad = np.random.default_rng(2).standard_normal((3, 9)).astype(np.float32)
    ebc.backward(on(device, grad))
    wide.backward(grad)
    for p, q in zip(ebc.parameters(), wide.parameters(), strict=True):
        assert p.grad.dtype == np.float32
        np.testing.assert_array_equal(host(p.grad.to_dense()), q.grad.to_dense())
    ebc.to(dtype="float32")  # the buffer is rebuilt from the cast tables
    np.testing.assert_array_equal(host(ebc(_kjt(device)).values()), host(out))


@pytest.mark.parametrize("dtype", ["int64", "int32"])
def test_backward_uses_the_ids_its_forward_read(device, dtype):
    """The forward's kernel copies the ids it reads into the record: ids changed after the
    forward (in place, on either device) leave the backward's gradients those of the ids
    the forward saw; outside a recording nothing is kept."""
    ebc = EmbeddingBagCollection(TABLES, seed=5, device=device)
    twin = EmbeddingBagCollection(TABLES, seed=5)
    ids = on(device, VALUES.astype(dtype))
    kjt = KeyedJaggedArray(KEYS, ids, lengths=on(device, LENGTHS))
    out = ebc(kjt)
    np.testing.assert_array_equal(host(out.values()), twin(_kjt(values=VALUES)).values())
    changed = (VALUES[::-1] % 6).astype(dtype)
    if device == "cpu":
        ids[:] = changed
    else:
        ids.copy_to_device(changed)
    grad = np.random.default_rng(3).standard_normal((3, 9)).astype(np.float32)
    ebc.backward(on(device, grad))
    twin.backward(grad)
    for p, q in zip(ebc.parameters(), twin.parameters(), strict=True):
        np.testing.assert_array_equal(host(p.grad.to_dense()), q.grad.to_dense())
    with numbapos.no_grad():
        ebc(kjt)
    with pytest.raises(RuntimeError):
        ebc.backward(on(device, grad))


@pytest.mark.parametrize("make", OPTIMISERS, ids=["sgd", "adam", "adamw", "adagrad",
                                                  "rowwise_adagrad"])
def test_fused_plain_sums_are_summed_inside_the_update_with_the_unfused_bits(make,
                                                                              monkeypatch):
    from numbapos.functional import collection

    unsummed = []
    monkeypatch.setattr(collection, "_unsummed_grads",
                        lambda *a, f=collection._unsummed_grads: unsummed.append(1) or f(*a))
    tables = [EmbeddingBagConfig("a", 30, 5, ["x"]), EmbeddingBagConfig("b", 20, 3, ["y"])]
    rng = np.random.default_rng(4)
    grad = rng.standard_normal((4, 8)).astype(np.float32)
    grad[1] = -0.0  # -0.0 terms, and a table row of -0.0 below
    results = []
    for fuse in (False, True):
        ebc = EmbeddingBagCollection(tables, seed=3)
        ebc.embedding_bags["a"].weight.data[7] = -0.0
        opt = make(ebc.parameters())
        if fuse:
            opt.fuse_with_backward()
        for step in range(3):
            ids = np.random.default_rng(step).integers(0, 20, 24)
            ids[:5] = [7, 7, 3, 7, 0]  # repeated ids
            lengths = np.array([3, 0, 5, 4, 2, 6, 1, 3])
            ebc(KeyedJaggedArray(["x", "y"], ids, lengths=lengths))
            ebc.backward(grad)
            opt.step()
            opt.zero_grad()
        results.append([p.data.copy() for p in ebc.parameters()])
    assert len(unsummed) == 3  # the fused run only
    for unfused, fused in zip(*results, strict=True):
        np.testing.assert_array_equal(fused.view(np.uint32), unfused.view(np.uint32))
