"""Parity with PyTorch's embedding, its backward and torch.optim.SGD (skipped without torch)."""

import numpy as np
import pytest

import numbapos.functional as F
from numbapos import SparseRows, nn, optim

torch = pytest.importorskip("torch")

CASES = range(12)


def _random_config(seed):
    rng = np.random.default_rng(seed)
    num = int(rng.integers(2, 40))
    dim = int(rng.integers(1, 12))
    shape = tuple(int(s) for s in rng.integers(0, 6, size=rng.integers(1, 4)))
    dtype = [np.float32, np.float64][seed % 2]
    index_dtype = [np.int64, np.int32][(seed // 2) % 2]
    padding_idx = [None, int(rng.integers(-num, num))][seed % 3 != 0]
    max_norm = [None, float(rng.uniform(0.5, 3.0))][(seed // 3) % 2]
    norm_type = [2.0, 1.0, 0.7, 3.0, float("inf")][seed % 5]
    weight = (rng.normal(size=(num, dim)) * 2).astype(dtype)
    indices = rng.integers(0, num, size=shape).astype(index_dtype)
    grad = rng.normal(size=shape + (dim,)).astype(dtype)
    return weight, indices, grad, padding_idx, max_norm, norm_type


@pytest.mark.parametrize("seed", CASES)
@pytest.mark.parametrize("scale", [False, True])
def test_forward_and_backward_match_torch(seed, scale):
    weight, indices, grad, padding_idx, max_norm, norm_type = _random_config(seed)
    t_weight = torch.tensor(weight.copy(), requires_grad=True)
    t_out = torch.nn.functional.embedding(torch.from_numpy(indices), t_weight, padding_idx,
                                          max_norm, norm_type, scale)
    t_out.backward(torch.from_numpy(grad))

    ours = weight.copy()
    out = F.embedding(indices, ours, padding_idx=padding_idx, max_norm=max_norm,
                      norm_type=norm_type)
    rtol = 1e-6 if weight.dtype == np.float32 else 1e-13
    np.testing.assert_allclose(out, t_out.detach().numpy(), rtol=rtol, atol=rtol)
    np.testing.assert_allclose(ours, t_weight.detach().numpy(), rtol=rtol, atol=rtol)
    g = F.embedding_backward(grad, indices, weight.shape[0], padding_idx=padding_idx,
                             scale_grad_by_freq=scale)
    np.testing.assert_allclose(g, t_weight.grad.numpy(), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("seed", CASES)
def test_sparse_backward_matches_torch(seed):
    weight, indices, grad, padding_idx, _, _ = _random_config(seed)
    t_weight = torch.tensor(weight, requires_grad=True)
    t_out = torch.nn.functional.embedding(torch.from_numpy(indices), t_weight, padding_idx,
                                          sparse=True)
    t_out.backward(torch.from_numpy(grad))
    expected = t_weight.grad.coalesce().to_dense().numpy()
    got = F.embedding_backward(grad, indices, weight.shape[0], padding_idx=padding_idx,
                               sparse=True)
    assert isinstance(got, SparseRows)
    rtol = 1e-6 if weight.dtype == np.float32 else 1e-13
    np.testing.assert_allclose(got.to_dense(), expected, rtol=rtol, atol=rtol)


SGD_CONFIGS = [
    dict(lr=0.1),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.3),
    dict(lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-2),
    dict(lr=0.2, weight_decay=0.1, maximize=True),
    dict(lr=0.2, momentum=0.7, weight_decay=0.05, maximize=True, nesterov=True),
]


@pytest.mark.parametrize("config", SGD_CONFIGS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sgd_matches_torch_step_for_step(config, dtype):
    rng = np.random.default_rng(7)
    start = rng.normal(size=(20, 6)).astype(dtype)
    ours = nn.Parameter(start.copy())
    theirs = torch.nn.Parameter(torch.tensor(start.copy()))
    opt = optim.SGD([ours], **config)
    t_opt = torch.optim.SGD([theirs], **config)
    for _ in range(6):
        grad = rng.normal(size=start.shape).astype(dtype)
        ours.grad = grad
        theirs.grad = torch.tensor(grad)
        opt.step()
        t_opt.step()
        rtol = 2e-6 if dtype == np.float32 else 1e-14
        np.testing.assert_allclose(ours.data, theirs.detach().numpy(), rtol=rtol, atol=rtol)


def test_embedding_module_training_matches_torch():
    rng = np.random.default_rng(3)
    ours = nn.Embedding(30, 8, padding_idx=2, max_norm=1.5, scale_grad_by_freq=True, seed=0)
    theirs = torch.nn.Embedding(30, 8, padding_idx=2, max_norm=1.5, scale_grad_by_freq=True,
                                _weight=torch.tensor(ours.weight.data.copy()))
    opt = optim.SGD(ours.parameters(), lr=0.3, momentum=0.9)
    t_opt = torch.optim.SGD(theirs.parameters(), lr=0.3, momentum=0.9)
    for _ in range(5):
        ids = rng.integers(0, 30, size=(4, 7))
        grad = rng.normal(size=(4, 7, 8)).astype(np.float32)
        out = ours(ids)
        t_out = theirs(torch.from_numpy(ids))
        np.testing.assert_allclose(out, t_out.detach().numpy(), rtol=1e-5, atol=1e-6)
        ours.zero_grad()
        t_opt.zero_grad()
        ours.backward(grad)
        t_out.backward(torch.from_numpy(grad))
        opt.step()
        t_opt.step()
    np.testing.assert_allclose(ours.weight.data, theirs.weight.detach().numpy(),
                               rtol=1e-5, atol=1e-6)
