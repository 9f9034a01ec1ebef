"""nn.EmbeddingBag: the module contract over functional.embedding_bag, against PyTorch."""

import numpy as np
import pytest
from conftest import host, on

import numbapos
from numbapos.nn.bag import EmbeddingBag
from numbapos.sparse import SparseRows

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("device", ["cpu", "cuda"], indirect=True)
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_forward_backward_match_torch(rng, device, mode):
    table = rng.standard_normal((12, 5)).astype(np.float32)
    ids, offsets = np.array([1, 4, 4, 0, 7, 11, 3]), np.array([0, 3, 3, 5])
    ours = EmbeddingBag.from_pretrained(on(device, table.copy()), freeze=False, mode=mode,
                                        padding_idx=0)
    theirs = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(table.copy()),
                                                   freeze=False, mode=mode, padding_idx=0)
    out = ours(on(device, ids), on(device, offsets))
    expected = theirs(torch.from_numpy(ids), torch.from_numpy(offsets))
    np.testing.assert_array_equal(host(out), expected.detach().numpy())
    grad = rng.standard_normal(expected.shape).astype(np.float32)
    assert ours.backward(on(device, grad)) is None
    expected.backward(torch.from_numpy(grad))
    np.testing.assert_allclose(host(ours.weight.grad), theirs.weight.grad.numpy(), rtol=1e-6,
                               atol=1e-7)


def test_per_sample_weights_gradient_is_returned(rng):
    bag = EmbeddingBag(10, 4, mode="sum", seed=3)
    theirs = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(bag.weight.data.copy()),
                                                   freeze=False, mode="sum")
    ids, offsets = np.array([[1, 2, 3], [4, 4, 9]]), None
    psw = rng.standard_normal((2, 3)).astype(np.float32)
    out = bag(ids, offsets, psw)
    p = torch.tensor(psw, requires_grad=True)
    expected = theirs(torch.from_numpy(ids), per_sample_weights=p)
    np.testing.assert_array_equal(out, expected.detach().numpy())
    grad = np.ones((2, 4), np.float32)
    gp = bag.backward(grad)
    expected.backward(torch.from_numpy(grad))
    assert gp.shape == (2, 3)
    np.testing.assert_allclose(gp, p.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(bag.weight.grad, theirs.weight.grad.numpy(), rtol=1e-6)


def test_sparse_gradient_steps_with_sgd(rng):
    dense = EmbeddingBag(20, 3, mode="mean", seed=1)
    sparse = EmbeddingBag(20, 3, mode="mean", sparse=True, seed=1)
    np.testing.assert_array_equal(dense.weight.data, sparse.weight.data)
    ids, offsets = np.array([2, 5, 5, 19, 0]), np.array([0, 2])
    grad = rng.standard_normal((2, 3)).astype(np.float32)
    for module in (dense, sparse):
        opt = numbapos.optim.SGD(module.parameters(), lr=0.5)
        module(ids, offsets)
        module.backward(grad)
        opt.step()
    assert isinstance(sparse.weight.grad, SparseRows)
    np.testing.assert_array_equal(dense.weight.data, sparse.weight.data)


def test_adam_steps_a_bag():
    bag = EmbeddingBag(6, 2, mode="sum", seed=0)
    before = bag.weight.data.copy()
    opt = numbapos.optim.Adam(bag.parameters(), lr=0.1)
    bag([1, 2], [0, 1])
    bag.backward(np.ones((2, 2), np.float32))
    opt.step()
    changed = np.any(bag.weight.data != before, axis=1)
    assert changed.tolist() == [False, True, True, False, False, False]


def test_padding_row_starts_at_zero_and_gets_no_gradient():
    bag = EmbeddingBag(5, 3, mode="sum", padding_idx=-1, seed=2)
    np.testing.assert_array_equal(bag.weight.data[4], 0)
    bag([4, 1, 4], [0])
    bag.backward(np.ones((1, 3), np.float32))
    np.testing.assert_array_equal(bag.weight.grad[4], 0)
    np.testing.assert_array_equal(bag.weight.grad[1], 1)


def test_backward_needs_a_forward_and_checks_the_gradient():
    bag = EmbeddingBag(5, 3, mode="max")
    with pytest.raises(RuntimeError):
        bag.backward(np.ones((1, 3), np.float32))
    bag([1, 2], [0])
    with pytest.raises(ValueError, match="grad_output"):
        bag.backward(np.ones((2, 3), np.float32))
    bag.backward(np.ones((1, 3), np.float32))  # the record was kept


def test_bad_options_raise():
    with pytest.raises(ValueError, match="mode"):
        EmbeddingBag(3, 2, mode="median")
    with pytest.raises(ValueError, match="scale_grad_by_freq"):
        EmbeddingBag(3, 2, mode="max", scale_grad_by_freq=True)


def test_half_table_pools_in_float32():
    bag = EmbeddingBag(8, 4, mode="mean", dtype="bfloat16", seed=5)
    out = bag([1, 2, 3], [0, 1])
    assert out.dtype == np.float32
    bag.backward(np.ones((2, 4), np.float32))
    assert bag.weight.grad.dtype == np.float32


@pytest.mark.parametrize("make", [lambda p: numbapos.optim.SGD(p, lr=0.1, momentum=0.9),
                                  numbapos.optim.Adam, numbapos.optim.Adagrad,
                                  numbapos.optim.RowWiseAdagrad])
@pytest.mark.parametrize("mode", ["mean", "sum"])  # sum: fused, its rows summed in the update
def test_every_optimiser_steps_a_sparse_bag_with_the_dense_bits(make, mode):
    tables = []
    for sparse, fuse in ((False, False), (True, False), (True, True)):
        bag = EmbeddingBag(10, 4, mode=mode, sparse=sparse, seed=0)
        opt = make(bag.parameters())
        if fuse:
            opt.fuse_with_backward()
        for _ in range(2):
            bag([1, 2, 2, 5], [0, 2])
            bag.backward(np.ones((2, 4), np.float32))
            opt.step()
            opt.zero_grad()
        tables.append(bag.weight.data)
    untouched = [0, 3, 4, 6, 7, 8, 9]
    np.testing.assert_array_equal(tables[1].view(np.uint32), tables[2].view(np.uint32))
    np.testing.assert_array_equal(tables[1][[1, 2, 5]], tables[0][[1, 2, 5]])
    start = EmbeddingBag(10, 4, seed=0).weight.data
    for table in tables:  # rows no bag named never move (zero gradients step by zero)
        np.testing.assert_array_equal(table[untouched], start[untouched])
        assert np.all(table[[1, 2, 5]] != start[[1, 2, 5]])


@pytest.mark.parametrize("device", ["cpu", "cuda"], indirect=True)
def test_a_fused_sgd_step_of_a_sum_bag_is_the_unfused_step(rng, device):
    ids = rng.integers(0, 30, 40)
    ids[:6] = [3, 3, 7, 3, 0, 7]  # repeated ids (0 is padding)
    offsets = np.array([0, 5, 5, 12])
    grad = rng.standard_normal((4, 6)).astype(np.float32)
    grad[1] = -0.0  # -0.0 terms, -0.0 table entries: the sign of zero is kept too
    tables = []
    for fuse in (False, True):
        bag = EmbeddingBag(30, 6, mode="sum", sparse=True, padding_idx=0, seed=1,
                           device=device)
        bag.weight.data[2] = on(device, np.full(6, -0.0, np.float32))
        opt = numbapos.optim.SGD(bag.parameters(), lr=0.5, momentum=0.9)
        if fuse:
            opt.fuse_with_backward()
        for step in range(3):
            bag(on(device, np.roll(ids, step)), on(device, offsets))
            bag.backward(on(device, grad))
            opt.step()
            opt.zero_grad()
        tables.append(host(bag.weight.data))
    np.testing.assert_array_equal(tables[0].view(np.uint32), tables[1].view(np.uint32))
