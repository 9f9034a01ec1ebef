"""optim.Adagrad (PyTorch's, dense and sparse) and optim.RowWiseAdagrad (FBGEMM's row-wise rule).

Adagrad: 50 float32 steps against PyTorch 2.13 within 1e-5, dense, sparse
and mixed, and its refusal of weight decay with sparse gradients.
RowWiseAdagrad: against the NumPy reference of FBGEMM's EXACT_ROWWISE_ADAGRAD
(tests/reference.py) in float32 and float64, dense and sparse, each weight
decay mode; its state is V values. Tests that take ``device`` also run on
CUDA (the simulator without a GPU) with fewer steps.
"""

import numpy as np
import pytest
import reference as ref
from conftest import FLOAT_DTYPES, host, on

from numbapos import SparseRows, nn, optim

# PyTorch's sparse Adagrad builds unchecked sparse tensors internally, and says so.
pytestmark = pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning")
V, D = 7, 5
ADAGRAD_CONFIGS = [
    dict(),
    dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.5),
    dict(lr=0.05, eps=1e-3, maximize=True),
]


def _steps(device):
    return 50 if device == "cpu" else 4


def _gradient(rng, step, dtype, sparse_every):
    """(numbapos gradient maker, torch gradient maker, rows or None) for one step."""
    if sparse_every == 1 or (sparse_every and step % sparse_every):
        rows = np.sort(rng.choice(V - 1, size=rng.integers(0, 4), replace=False))
        values = rng.normal(size=(rows.size, D)).astype(dtype)
        return rows, values
    return None, rng.normal(size=(V, D)).astype(dtype)


def _to_torch(torch, rows, values):
    if rows is None:
        return torch.from_numpy(values.copy())
    return torch.sparse_coo_tensor(torch.from_numpy(rows[None]), torch.from_numpy(values.copy()),
                                   (V, D), check_invariants=True)


def _to_ours(device, rows, values):
    return on(device, values) if rows is None else SparseRows(rows, on(device, values), V)


@pytest.mark.parametrize("config, sparse_every", [
    *[(config, every) for config in ADAGRAD_CONFIGS for every in (0, 1, 3)],
    (dict(lr=0.1, weight_decay=0.3), 0),  # weight decay: dense only, as in PyTorch
])
def test_adagrad_float32_matches_pytorch(rng, device, config, sparse_every):
    torch = pytest.importorskip("torch")
    start = rng.normal(size=(V, D)).astype(np.float32)
    param = nn.Parameter(on(device, start.copy()))
    theirs = torch.nn.Parameter(torch.from_numpy(start.copy()))
    opt = optim.Adagrad([param], **config)
    topt = torch.optim.Adagrad([theirs], foreach=False, **config)
    for step in range(_steps(device)):
        rows, values = _gradient(rng, step, np.float32, sparse_every)
        param.grad = _to_ours(device, rows, values)
        theirs.grad = _to_torch(torch, rows, values)
        opt.step()
        topt.step()
    got = host(param.data)
    np.testing.assert_allclose(got, theirs.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(host(opt.state[id(param)]["sum"]),
                               topt.state[theirs]["sum"].numpy(), rtol=1e-5, atol=1e-6)
    assert opt.state[id(param)]["step"] == _steps(device)
    if sparse_every == 1:
        np.testing.assert_array_equal(got[V - 1], start[V - 1])  # never listed


def test_adagrad_float64_matches_pytorch(rng):
    torch = pytest.importorskip("torch")
    start = rng.normal(size=(V, D))
    param = nn.Parameter(start.copy())
    theirs = torch.nn.Parameter(torch.from_numpy(start.copy()))
    config = dict(lr=0.2, lr_decay=0.05, initial_accumulator_value=0.1)
    opt, topt = optim.Adagrad([param], **config), torch.optim.Adagrad([theirs], **config)
    for step in range(50):
        rows, values = _gradient(rng, step, np.float64, 2)
        param.grad, theirs.grad = _to_ours("cpu", rows, values), _to_torch(torch, rows, values)
        opt.step()
        topt.step()
    np.testing.assert_allclose(param.data, theirs.detach().numpy(), rtol=1e-12, atol=1e-12)


def test_adagrad_refuses_weight_decay_with_sparse_gradients():
    param = nn.Parameter(np.ones((3, 2)))
    opt = optim.Adagrad([param], weight_decay=0.1)
    param.grad = SparseRows(np.array([0]), np.ones((1, 2)), 3)
    with pytest.raises(ValueError, match="weight_decay: not compatible with SparseRows"):
        opt.step()
    assert opt.state == {}
    np.testing.assert_array_equal(param.data, 1.0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=-1.0), "lr"), (dict(lr_decay=-1.0), "lr_decay"),
    (dict(weight_decay=-1.0), "weight_decay"),
    (dict(initial_accumulator_value=-1.0), "initial_accumulator_value"),
    (dict(eps=-1.0), "eps"),
])
def test_adagrad_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        optim.Adagrad([nn.Parameter(np.ones(2))], **kwargs)


# ---------------------------------------------------------------- RowWiseAdagrad

ROWWISE_CONFIGS = [
    dict(),
    dict(lr=0.1, eps=1e-3),
    dict(lr=0.05, weight_decay=0.2, weight_decay_mode="l2"),
    dict(lr=0.05, weight_decay=0.2, weight_decay_mode="decoupled"),
]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("config", ROWWISE_CONFIGS)
@pytest.mark.parametrize("sparse_every", [0, 1, 3], ids=["dense", "sparse", "mixed"])
def test_rowwise_adagrad_matches_fbgemm_reference(rng, device, dtype, config, sparse_every):
    start = rng.normal(size=(V, D)).astype(dtype)
    param = nn.Parameter(on(device, start.copy()))
    opt = optim.RowWiseAdagrad([param], **config)
    expected, acc = start.copy(), np.zeros(V, dtype)
    for step in range(_steps(device)):
        rows, values = _gradient(rng, step, dtype, sparse_every)
        param.grad = _to_ours(device, rows, values)
        opt.step()
        expected, acc = ref.rowwise_adagrad_step(expected, values, acc, rows=rows, **config)
    state = opt.state[id(param)]
    assert set(state) == {"sum"} and state["sum"].shape == (V,)  # V values, not V * D
    if dtype == np.float32 and device == "cpu":
        np.testing.assert_array_equal(host(param.data), expected)  # same operations, same bits
        np.testing.assert_array_equal(host(state["sum"]), acc)
    else:
        rtol = 1e-5 if dtype == np.float32 else 1e-13
        np.testing.assert_allclose(host(param.data), expected, rtol=rtol, atol=rtol)
        np.testing.assert_allclose(host(state["sum"]), acc, rtol=rtol, atol=rtol)


def test_rowwise_adagrad_definition_by_hand():
    # One row, D = 2, g = (3, 4): s = (9 + 16) / 2 = 12.5, p -= lr * g / (sqrt(12.5) + eps).
    param = nn.Parameter(np.zeros((2, 2)))
    param.grad = SparseRows(np.array([1]), np.array([[3.0, 4.0]]), 2)
    opt = optim.RowWiseAdagrad([param], lr=0.5, eps=0.0)
    opt.step()
    np.testing.assert_allclose(opt.state[id(param)]["sum"], [0.0, 12.5])
    np.testing.assert_allclose(param.data, [[0, 0], [-1.5 / 12.5 ** 0.5, -2 / 12.5 ** 0.5]])


def test_rowwise_adagrad_on_1d_and_0d_parameters(rng):
    vec = nn.Parameter(np.zeros(3))
    scalar = nn.Parameter(np.zeros(()))
    vec.grad, scalar.grad = np.array([1.0, -2.0, 0.5]), np.array(2.0)
    opt = optim.RowWiseAdagrad([vec, scalar], lr=0.1, eps=0.0)
    opt.step()
    np.testing.assert_allclose(vec.data, [-0.1, 0.1, -0.1])  # a row per element: sign steps
    np.testing.assert_allclose(scalar.data, -0.1)
    assert opt.state[id(scalar)]["sum"].shape == (1,)


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=-1.0), "lr"), (dict(eps=-1.0), "eps"), (dict(weight_decay=-1.0), "weight_decay"),
    (dict(weight_decay_mode="cowclip"), "weight_decay_mode: expected one of"),
    (dict(weight_decay=0.1), "would be ignored with weight_decay_mode='none'"),
])
def test_rowwise_adagrad_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        optim.RowWiseAdagrad([nn.Parameter(np.ones(2))], **kwargs)
