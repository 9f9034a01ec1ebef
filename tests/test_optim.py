"""optim.SGD: dense updates against the float64 reference, lazy sparse-row updates."""

import numpy as np
import pytest
import reference as ref

from numbapos import SparseRows, nn, optim

CONFIGS = [
    dict(),
    dict(momentum=0.9),
    dict(momentum=0.9, dampening=0.5),
    dict(momentum=0.8, nesterov=True),
    dict(weight_decay=0.01),
    dict(momentum=0.5, weight_decay=0.1, maximize=True),
    dict(momentum=0.9, nesterov=True, weight_decay=1e-3, maximize=True),
]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("shape", [(5, 3), (7,), ()])
def test_dense_steps_match_reference(rng, config, shape):
    param = nn.Parameter(rng.normal(size=shape))
    expected, buf = param.data.copy(), None
    opt = optim.SGD([param], lr=0.1, **config)
    for _ in range(4):
        grad = rng.normal(size=shape)
        param.grad = grad
        opt.step()
        expected, buf = ref.sgd_step(expected, grad, buf, 0.1, **config)
    np.testing.assert_allclose(param.data, expected, rtol=1e-13, atol=1e-15)


def test_float32_step_is_computed_in_float32(rng):
    param = nn.Parameter(rng.normal(size=100).astype(np.float32))
    start = param.data.copy()
    grad = rng.normal(size=100).astype(np.float32)
    param.grad = grad
    optim.SGD([param], lr=0.3).step()
    assert param.data.dtype == np.float32
    np.testing.assert_array_equal(param.data, start - np.float32(0.3) * grad)


def test_non_contiguous_parameter_is_updated(rng):
    base = rng.normal(size=(6, 4))
    expected = base.copy()
    expected[:, ::2] -= 1.0
    param = nn.Parameter(base[:, ::2])
    param.grad = np.ones((6, 2))
    optim.SGD([param], lr=1.0).step()
    np.testing.assert_array_equal(base, expected)  # the view, and only it, moved


def test_sparse_without_momentum_equals_dense(rng):
    dense_p = nn.Parameter(rng.normal(size=(8, 3)))
    sparse_p = nn.Parameter(dense_p.data.copy())
    rows = np.array([1, 5, 6])
    values = rng.normal(size=(3, 3))
    sparse_p.grad = SparseRows(rows, values, 8)
    dense_p.grad = sparse_p.grad.to_dense()
    optim.SGD([dense_p], lr=0.2).step()
    optim.SGD([sparse_p], lr=0.2).step()
    np.testing.assert_allclose(sparse_p.data, dense_p.data, rtol=1e-15)


@pytest.mark.parametrize("config", CONFIGS[1:])
def test_sparse_is_lazy_per_row(rng, config):
    """Each row follows the dense rule over the steps that touched it, and only those."""
    param = nn.Parameter(rng.normal(size=(6, 2)))
    untouched = param.data[[0, 4]].copy()
    history = {r: (param.data[r].copy(), None) for r in range(6)}
    opt = optim.SGD([param], lr=0.05, **config)
    for rows in ([1, 2], [2, 3], [1, 3, 5], [2]):
        rows = np.array(rows)
        values = rng.normal(size=(rows.size, 2))
        param.grad = SparseRows(rows, values, 6)
        opt.step()
        for r, v in zip(rows, values, strict=True):
            history[r] = ref.sgd_step(*history[r][:1], v, history[r][1], 0.05, **config)
    for r in (1, 2, 3, 5):
        np.testing.assert_allclose(param.data[r], history[r][0], rtol=1e-13)
    np.testing.assert_array_equal(param.data[[0, 4]], untouched)


def test_dense_step_after_sparse_steps_starts_untouched_rows_fresh(rng):
    param = nn.Parameter(np.zeros((3, 1)))
    opt = optim.SGD([param], lr=1.0, momentum=0.5)
    param.grad = SparseRows(np.array([0]), np.ones((1, 1)), 3)
    opt.step()  # row 0: buf = 1, p = -1
    param.grad = np.ones((3, 1))
    opt.step()  # row 0: buf = 1.5, p = -2.5; rows 1, 2: buf = 1 (fresh), p = -1
    np.testing.assert_allclose(param.data[:, 0], [-2.5, -1.0, -1.0])


def test_embedding_sparse_training_touches_only_used_rows(rng):
    emb = nn.Embedding(50, 4, sparse=True, seed=0)
    before = emb.weight.data.copy()
    opt = optim.SGD(emb.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    ids = np.array([[3, 7, 7], [9, 3, 3]])
    emb(ids)
    emb.backward(np.ones((2, 3, 4), np.float32))
    opt.step()
    changed = np.flatnonzero(np.any(emb.weight.data != before, axis=1))
    np.testing.assert_array_equal(changed, [3, 7, 9])


def test_param_groups_and_zero_grad(rng):
    a = nn.Parameter(np.ones(2))
    b = nn.Parameter(np.ones(2))
    opt = optim.SGD([{"params": [a]}, {"params": b, "lr": 1.0}], lr=0.1)
    a.grad = np.ones(2)
    b.grad = np.ones(2)
    opt.step()
    np.testing.assert_allclose(a.data, 0.9)
    np.testing.assert_allclose(b.data, 0.0)
    opt.zero_grad()
    assert a.grad is None and b.grad is None
    opt.step()  # no gradients: nothing happens
    np.testing.assert_allclose(a.data, 0.9)


def test_frozen_parameter_is_skipped():
    p = nn.Parameter(np.ones(2), requires_grad=False)
    p.grad = np.ones(2)
    optim.SGD([p], lr=1.0).step()
    np.testing.assert_array_equal(p.data, 1.0)


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


def _sparse_param():
    param = nn.Parameter(np.zeros((4, 3)))
    opt = optim.SGD([param], lr=0.1, momentum=0.9)
    return param, opt


def test_step_checks_gradients_before_any_update():
    # The update kernels do not bounds-check: a gradient of the wrong shape read or
    # wrote past the arrays (a SparseRows row changed after construction: a segfault).
    good = nn.Parameter(np.ones((4, 3)))
    param, _ = _sparse_param()
    opt = optim.SGD([good, param], lr=0.1, momentum=0.9)
    good.grad = np.ones((4, 3))
    cases = [
        (np.ones(3), ValueError, r"param.grad: expected shape \(4, 3\)"),
        (np.ones((4, 3), np.int64), TypeError, "param.grad: expected dtype float32 or float64"),
        ([[1.0] * 3] * 4, TypeError, "param.grad: expected a NumPy or CUDA array"),
        (SparseRows(np.array([1]), np.ones((1, 1)), 4), ValueError, "SparseRows of shape"),
        (SparseRows(np.array([1]), np.ones((1, 3)), 5), ValueError, "SparseRows of shape"),
    ]
    mutated = SparseRows(np.array([1]), np.ones((1, 3)), 4)
    mutated.indices[0] = 10**9
    cases.append((mutated, IndexError, "param.grad.indices: index 1000000000"))
    for grad, error, match in cases:
        param.grad = grad
        with pytest.raises(error, match=match):
            opt.step()
        np.testing.assert_array_equal(good.data, 1.0)
        np.testing.assert_array_equal(param.data, 0.0)
        assert opt.state == {}


def test_step_refuses_read_only_or_reshaped_parameters():
    param, opt = _sparse_param()
    param.data.flags.writeable = False
    param.grad = np.ones((4, 3))
    with pytest.raises(ValueError, match="param.data: .* is read-only"):
        opt.step()
    param.data = np.zeros((4, 3))
    opt.step()
    for data in (np.zeros((40, 30)), np.zeros((4, 3), np.float32)):
        param.data = data
        param.grad = np.ones(data.shape, data.dtype)
        with pytest.raises(ValueError, match="momentum buffer was made for shape"):
            opt.step()
        np.testing.assert_array_equal(data, 0.0)

