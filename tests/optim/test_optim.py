"""optim.SGD: dense updates against the float64 reference, lazy sparse-row updates.

Tests that take a step take the ``device`` fixture (conftest): they run on the
CPU and on CUDA (Numba's simulator without a GPU). Strided and read-only NumPy
parameters, and option checks, stay on the CPU.
"""

import numpy as np
import pytest
import reference as ref
from conftest import SGD_CONFIGS, host, on

from numbapos import SparseRows, nn, optim

CONFIGS = SGD_CONFIGS


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("shape", [(5, 3), (7,), ()])
def test_dense_steps_match_reference(rng, device, config, shape):
    start = rng.normal(size=shape)
    param = nn.Parameter(on(device, start.copy()))
    expected, buf = start.copy(), None
    opt = optim.SGD([param], lr=0.1, **config)
    for _ in range(4):
        grad = rng.normal(size=shape)
        param.grad = on(device, grad)
        opt.step()
        expected, buf = ref.sgd_step(expected, grad, buf, 0.1, **config)
    np.testing.assert_allclose(host(param.data), expected, rtol=1e-13, atol=1e-15)


def test_float32_step_is_computed_in_float32(rng, device):
    start = rng.normal(size=100).astype(np.float32)
    param = nn.Parameter(on(device, start.copy()))
    grad = rng.normal(size=100).astype(np.float32)
    param.grad = on(device, grad)
    optim.SGD([param], lr=0.3).step()
    assert param.data.dtype == np.float32
    np.testing.assert_array_equal(host(param.data), start - np.float32(0.3) * grad)


def test_non_contiguous_parameter_is_updated(rng):
    base = rng.normal(size=(6, 4))
    expected = base.copy()
    expected[:, ::2] -= 1.0
    param = nn.Parameter(base[:, ::2])
    param.grad = np.ones((6, 2))
    optim.SGD([param], lr=1.0).step()
    np.testing.assert_array_equal(base, expected)  # the view, and only it, moved


def test_sparse_without_momentum_equals_dense(rng, device):
    start = rng.normal(size=(8, 3))
    dense_p = nn.Parameter(on(device, start))
    sparse_p = nn.Parameter(on(device, start.copy()))
    rows = np.array([1, 5, 6])
    values = rng.normal(size=(3, 3))
    sparse_p.grad = SparseRows(rows, on(device, values), 8)
    dense_p.grad = sparse_p.grad.to_dense()
    optim.SGD([dense_p], lr=0.2).step()
    optim.SGD([sparse_p], lr=0.2).step()
    np.testing.assert_allclose(host(sparse_p.data), host(dense_p.data), rtol=1e-15)


@pytest.mark.parametrize("config", CONFIGS[1:])
def test_sparse_is_lazy_per_row(rng, device, config):
    """Each row follows the dense rule over the steps that touched it, and only those."""
    start = rng.normal(size=(6, 2))
    param = nn.Parameter(on(device, start.copy()))
    history = {r: (start[r].copy(), None) for r in range(6)}
    opt = optim.SGD([param], lr=0.05, **config)
    for rows in ([1, 2], [2, 3], [1, 3, 5], [2]):
        rows = np.array(rows)
        values = rng.normal(size=(rows.size, 2))
        param.grad = SparseRows(rows, on(device, values), 6)
        opt.step()
        for r, v in zip(rows, values, strict=True):
            history[r] = ref.sgd_step(*history[r][:1], v, history[r][1], 0.05, **config)
    data = host(param.data)
    for r in (1, 2, 3, 5):
        np.testing.assert_allclose(data[r], history[r][0], rtol=1e-13)
    np.testing.assert_array_equal(data[[0, 4]], start[[0, 4]])


def test_dense_step_after_sparse_steps_starts_untouched_rows_fresh(device):
    param = nn.Parameter(on(device, np.zeros((3, 1))))
    opt = optim.SGD([param], lr=1.0, momentum=0.5)
    param.grad = SparseRows(np.array([0]), on(device, np.ones((1, 1))), 3)
    opt.step()  # row 0: buf = 1, p = -1
    param.grad = on(device, np.ones((3, 1)))
    opt.step()  # row 0: buf = 1.5, p = -2.5; rows 1, 2: buf = 1 (fresh), p = -1
    np.testing.assert_allclose(host(param.data)[:, 0], [-2.5, -1.0, -1.0])


def test_embedding_sparse_training_touches_only_used_rows(device):
    emb = nn.Embedding(50, 4, sparse=True, seed=0, device=device)
    before = host(emb.weight.data).copy()
    opt = optim.SGD(emb.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    ids = np.array([[3, 7, 7], [9, 3, 3]])
    emb(ids)
    emb.backward(on(device, np.ones((2, 3, 4), np.float32)))
    opt.step()
    changed = np.flatnonzero(np.any(host(emb.weight.data) != before, axis=1))
    np.testing.assert_array_equal(changed, [3, 7, 9])


def test_param_groups_and_zero_grad(device):
    a = nn.Parameter(on(device, np.ones(2)))
    b = nn.Parameter(on(device, np.ones(2)))
    opt = optim.SGD([{"params": [a]}, {"params": b, "lr": 1.0}], lr=0.1)
    a.grad = on(device, np.ones(2))
    b.grad = on(device, np.ones(2))
    opt.step()
    np.testing.assert_allclose(host(a.data), 0.9)
    np.testing.assert_allclose(host(b.data), 0.0)
    opt.zero_grad()
    assert a.grad is None and b.grad is None
    opt.step()  # no gradients: nothing happens
    np.testing.assert_allclose(host(a.data), 0.9)


def test_frozen_parameter_is_skipped(device):
    p = nn.Parameter(on(device, np.ones(2)), requires_grad=False)
    p.grad = on(device, np.ones(2))
    optim.SGD([p], lr=1.0).step()
    np.testing.assert_array_equal(host(p.data), 1.0)


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=-1.0), "lr"),
    (dict(lr=0.1, momentum=-0.5), "momentum"),
    (dict(lr=0.1, weight_decay=-1), "weight_decay"),
    (dict(lr=0.1, nesterov=True), "nesterov"),
    (dict(lr=0.1, momentum=0.9, dampening=0.1, nesterov=True), "nesterov"),
    (dict(lr=float("nan")), "lr"),
])
def test_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        optim.SGD([nn.Parameter(np.ones(2))], **kwargs)


def test_bad_params():
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="Parameter"):
        optim.SGD([np.ones(2)], lr=0.1)
    p = nn.Parameter(np.ones(2))
    with pytest.raises(ValueError, match="more than one group"):
        optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)
    with pytest.raises(ValueError, match="unknown option"):
        optim.SGD([{"params": [p], "betas": 1}], lr=0.1)


def _sparse_param(device="cpu"):
    param = nn.Parameter(on(device, np.zeros((4, 3))))
    opt = optim.SGD([param], lr=0.1, momentum=0.9)
    return param, opt


def test_step_checks_gradients_before_any_update(device):
    # The update kernels do not bounds-check: a gradient of the wrong shape read or
    # wrote past the arrays (a SparseRows row changed after construction: a segfault).
    good = nn.Parameter(on(device, np.ones((4, 3))))
    param, _ = _sparse_param(device)
    opt = optim.SGD([good, param], lr=0.1, momentum=0.9)
    good.grad = on(device, np.ones((4, 3)))

    def rows(values, num_rows):
        return SparseRows(np.array([1]), on(device, values), num_rows)

    cases = [
        (on(device, np.ones(3)), ValueError, r"param.grad: expected shape \(4, 3\)"),
        (on(device, np.ones((4, 3), np.int64)), TypeError,
         "param.grad: expected dtype float32 or float64"),
        ([[1.0] * 3] * 4, TypeError, "param.grad: expected a NumPy or CUDA array"),
        (rows(np.ones((1, 1)), 4), ValueError, "SparseRows of shape"),
        (rows(np.ones((1, 3)), 5), ValueError, "SparseRows of shape"),
    ]
    mutated = rows(np.ones((1, 3)), 4)
    mutated.indices[0] = 10**9
    cases.append((mutated, IndexError, "param.grad.indices: index 1000000000"))
    for grad, error, match in cases:
        param.grad = grad
        with pytest.raises(error, match=match):
            opt.step()
        np.testing.assert_array_equal(host(good.data), 1.0)
        np.testing.assert_array_equal(host(param.data), 0.0)
        assert opt.state == {}


def test_step_refuses_read_only_parameters():
    param, opt = _sparse_param()
    param.data.flags.writeable = False
    param.grad = np.ones((4, 3))
    with pytest.raises(ValueError, match="param.data: .* is read-only"):
        opt.step()
    param.data = np.zeros((4, 3))
    opt.step()
    np.testing.assert_array_equal(param.data, -0.1)


def test_step_refuses_reshaped_parameters(device):
    param, opt = _sparse_param(device)
    param.grad = on(device, np.ones((4, 3)))
    opt.step()
    cases = [(device, np.zeros((40, 30))), (device, np.zeros((4, 3), np.float32))]
    if device != "cpu":
        cases.append(("cpu", np.zeros((4, 3))))  # moved to the host, its buffer left behind
    for where, data in cases:
        param.data = on(where, data)
        param.grad = on(where, np.ones(data.shape, data.dtype))
        with pytest.raises(ValueError, match="momentum buffer was made for shape"):
            opt.step()
        np.testing.assert_array_equal(host(param.data), 0.0)
