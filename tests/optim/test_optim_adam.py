"""optim.Adam / AdamW: PyTorch's Adam on dense gradients, SparseAdam's lazy rule on SparseRows.

50 float32 steps against PyTorch 2.13 (within 1e-5), float64 against the
NumPy reference, mixed dense and sparse steps, what sparse steps refuse,
option checks. Tests that take ``device`` also run on CUDA (the simulator
without a GPU) with fewer steps.
"""

import numpy as np
import pytest
import reference as ref
from conftest import host, on

from numbapos import SparseRows, nn, optim

CONFIGS = [
    dict(),
    dict(lr=0.05, weight_decay=0.1),
    dict(lr=0.02, amsgrad=True),
    dict(lr=0.01, betas=(0.3, 0.8), eps=1e-6, maximize=True),  # lerp's other branch
    dict(lr=0.01, weight_decay=0.5, decoupled_weight_decay=True, amsgrad=True),
]
V, D = 7, 5


def _steps(device):
    return 50 if device == "cpu" else 4


def _torch_run(torch_cls, start, grads, **options):
    torch = pytest.importorskip("torch")
    t = torch.nn.Parameter(torch.from_numpy(start.copy()))
    opt = torch_cls([t], **options)
    for grad in grads:
        t.grad = grad(torch)
        opt.step()
    return t.detach().numpy()


def _dense_grads(rng, n, dtype=np.float32):
    arrays = [rng.normal(size=(V, D)).astype(dtype) for _ in range(n)]
    return arrays, [lambda torch, a=a: torch.from_numpy(a.copy()) for a in arrays]


def _sparse_grads(rng, n, dtype=np.float32):
    rows = [np.sort(rng.choice(V - 1, size=rng.integers(0, 4), replace=False)) for _ in range(n)]
    values = [rng.normal(size=(r.size, D)).astype(dtype) for r in rows]

    def torch_grad(torch, r, v):
        return torch.sparse_coo_tensor(torch.from_numpy(r[None]), torch.from_numpy(v.copy()),
                                       (V, D), check_invariants=True)

    return list(zip(rows, values, strict=True)), [
        lambda torch, r=r, v=v: torch_grad(torch, r, v) for r, v in zip(rows, values,
                                                                         strict=True)]


@pytest.mark.parametrize("config", CONFIGS)
def test_dense_float32_matches_pytorch(rng, device, config):
    torch = pytest.importorskip("torch")
    start = rng.normal(size=(V, D)).astype(np.float32)
    grads, torch_grads = _dense_grads(rng, _steps(device))
    param = nn.Parameter(on(device, start.copy()))
    opt = optim.Adam([param], **config)
    for grad in grads:
        param.grad = on(device, grad)
        opt.step()
    expected = _torch_run(torch.optim.Adam, start, torch_grads, foreach=False, **config)
    assert host(param.data).dtype == np.float32
    np.testing.assert_allclose(host(param.data), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config", [dict(), dict(lr=0.05, betas=(0.5, 0.9), eps=1e-4,
                                                maximize=True)])
def test_sparse_float32_matches_pytorch_sparse_adam(rng, device, config):
    torch = pytest.importorskip("torch")
    start = rng.normal(size=(V, D)).astype(np.float32)
    grads, torch_grads = _sparse_grads(rng, _steps(device))
    param = nn.Parameter(on(device, start.copy()))
    opt = optim.Adam([param], **config)
    for rows, values in grads:
        param.grad = SparseRows(rows, on(device, values), V)
        opt.step()
    expected = _torch_run(torch.optim.SparseAdam, start, torch_grads, **config)
    got = host(param.data)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[V - 1], start[V - 1])  # never listed: never moved
    state = opt.state[id(param)]
    assert state["step"] == len(grads)  # per parameter, empty gradients included
    assert not host(state["exp_avg"])[V - 1].any()


def test_adamw_matches_pytorch(rng):
    torch = pytest.importorskip("torch")
    start = rng.normal(size=(V, D)).astype(np.float32)
    grads, torch_grads = _dense_grads(rng, 50)
    param = nn.Parameter(start.copy())
    opt = optim.AdamW([param], lr=0.01)
    for grad in grads:
        param.grad = grad
        opt.step()
    expected = _torch_run(torch.optim.AdamW, start, torch_grads, lr=0.01, foreach=False)
    np.testing.assert_allclose(param.data, expected, rtol=1e-5, atol=1e-5)
    assert opt.param_groups[0]["weight_decay"] == 0.01
    assert opt.param_groups[0]["decoupled_weight_decay"] is True


@pytest.mark.parametrize("config", CONFIGS + [dict(lr=0.1, weight_decay=0.2),
                                              dict(lr=0.1, weight_decay=0.2,
                                                   decoupled_weight_decay=True)])
def test_float64_mixed_dense_and_sparse_steps_match_reference(rng, device, config):
    sparse_ok = not config.get("amsgrad")
    start = rng.normal(size=(V, D))
    param = nn.Parameter(on(device, start.copy()))
    opt = optim.Adam([param], **config)
    expected = start.copy()
    state = {"m": np.zeros((V, D)), "v": np.zeros((V, D)), "vmax": np.zeros((V, D))}
    options = {("decoupled" if k == "decoupled_weight_decay" else k): v
               for k, v in config.items()}
    for step in range(1, 2 * _steps(device) // 3 + 1):
        if sparse_ok and step % 3:
            rows = np.sort(rng.choice(V, size=3, replace=False))
            values = rng.normal(size=(3, D))
            param.grad = SparseRows(rows, on(device, values), V)
            expected = ref.adam_step(expected, values, state, step, rows=rows, **options)
        else:
            grad = rng.normal(size=(V, D))
            param.grad = on(device, grad)
            expected = ref.adam_step(expected, grad, state, step, **options)
        opt.step()
    np.testing.assert_allclose(host(param.data), expected, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(host(opt.state[id(param)]["exp_avg_sq"]), state["v"],
                               rtol=1e-12, atol=1e-15)


def test_sparse_step_touches_only_listed_rows_in_o_rows(rng):
    param = nn.Parameter(rng.normal(size=(1000, 4)).astype(np.float32))
    opt = optim.AdamW([param], lr=0.1)
    before = param.data.copy()
    param.grad = SparseRows(np.array([3, 500]), np.ones((2, 4), np.float32), 1000)
    opt.step()
    changed = np.flatnonzero(np.any(param.data != before, axis=1))
    np.testing.assert_array_equal(changed, [3, 500])
    state = opt.state[id(param)]
    assert np.flatnonzero(state["exp_avg"].any(axis=1)).tolist() == [3, 500]


def test_sparse_refuses_amsgrad_before_any_update():
    a = nn.Parameter(np.ones((3, 2)))
    b = nn.Parameter(np.ones((3, 2)))
    opt = optim.Adam([a, b], amsgrad=True)
    a.grad = np.ones((3, 2))
    b.grad = SparseRows(np.array([1]), np.ones((1, 2)), 3)
    with pytest.raises(ValueError, match="amsgrad: not supported with SparseRows"):
        opt.step()
    np.testing.assert_array_equal(a.data, 1.0)
    assert opt.state == {}


def test_functional_ops_match_the_optimiser(rng):
    from numbapos import functional as F

    start = rng.normal(size=(V, D)).astype(np.float32)
    grad = rng.normal(size=(V, D)).astype(np.float32)
    p = start.copy()
    m, v = np.zeros_like(p), np.zeros_like(p)
    F.adam_(p, grad, m, v, step=1, lr=0.1)
    param = nn.Parameter(start.copy())
    param.grad = grad
    optim.Adam([param], lr=0.1).step()
    np.testing.assert_array_equal(p, param.data)
    with pytest.raises(ValueError, match="max_exp_avg_sq: required"):
        F.adam_(p, grad, m, v, step=1, amsgrad=True)
    with pytest.raises(ValueError, match="step: expected an integer >= 1"):
        F.adam_(p, grad, m, v, step=0)
    with pytest.raises(ValueError, match=r"exp_avg: expected shape \(7, 5\)"):
        F.adam_(p, grad, np.zeros((7, 4), np.float32), v, step=1)
    with pytest.raises(ValueError, match="must not share memory"):
        F.adam_(p, grad, p, v, step=1)
    with pytest.raises(TypeError, match="grad: expected a SparseRows"):
        F.sparse_adam_(p, grad, m, v, step=1)


def test_strided_parameter_is_updated_in_place(rng):
    base = rng.normal(size=(6, 4))
    param = nn.Parameter(base[:, ::2])
    param.grad = np.ones((6, 2))
    expected = base.copy()
    optim.Adam([param], lr=0.5).step()
    expected[:, ::2] -= 0.5  # Adam's first step moves each element by lr * sign(g)
    np.testing.assert_allclose(base, expected, rtol=1e-6)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(lr=-1.0), ValueError, "lr"),
    (dict(eps=-1e-8), ValueError, "eps"),
    (dict(weight_decay=-0.1), ValueError, "weight_decay"),
    (dict(betas=(1.0, 0.9)), ValueError, r"betas\[0\]"),
    (dict(betas=(0.9, -0.1)), ValueError, r"betas\[1\]"),
    (dict(betas=0.9), ValueError, "betas: expected a pair"),
    (dict(betas=("a", 0.9)), TypeError, r"betas\[0\]"),
    (dict(lr=float("nan")), ValueError, "lr"),
])
def test_bad_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        optim.Adam([nn.Parameter(np.ones(2))], **kwargs)


def test_adamw_refuses_coupled_decay_in_a_group():
    p = nn.Parameter(np.ones(2))
    with pytest.raises(ValueError, match="AdamW always decouples"):
        optim.AdamW([{"params": [p], "decoupled_weight_decay": False}])
