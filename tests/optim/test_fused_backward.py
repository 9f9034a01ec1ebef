"""Optimiser in backward: post-accumulate-grad hooks, unsummed sparse gradients, and
fuse_with_backward (every optimiser: each row summed inside its update) giving the
same bits as backward-then-step, on both devices."""

import numpy as np
import pytest
from conftest import SGD_CONFIGS, host, on

import numbapos
import numbapos.functional as F
from numbapos import SparseRows, nn, optim


def train(device, fused, config, steps=4, vocab=300, dim=24, batch=(8, 40), make=None,
          **embedding_kw):
    """Train a sparse Embedding with SGD (or ``make(params)``) for ``steps``; the table (host)."""
    rng = np.random.default_rng(7)
    weight = rng.normal(size=(vocab, dim)).astype(np.float32)
    emb = nn.Embedding(vocab, dim, sparse=True, _weight=weight, device=device, **embedding_kw)
    opt = make(emb.parameters()) if make else optim.SGD(emb.parameters(), lr=0.05, **config)
    if fused:
        opt.fuse_with_backward()
    for _ in range(steps):
        ids = rng.integers(0, vocab, size=batch)
        grad = rng.normal(size=batch + (dim,)).astype(np.float32)
        emb(on(device, ids))
        emb.backward(on(device, grad))
        if fused:
            assert emb.weight.grad is None  # applied and dropped inside backward
        opt.step()
        opt.zero_grad()
    return host(emb.weight.data)


@pytest.mark.parametrize("config", SGD_CONFIGS)
def test_fused_training_is_bit_identical_to_backward_then_step(config):
    # ~400 rows used x 96 columns: the parallel kernel on the CPU.
    size = dict(vocab=1000, dim=96, batch=(8, 64))
    for options in (dict(), dict(padding_idx=3, scale_grad_by_freq=True)):
        plain = train("cpu", False, config, **size, **options)
        fused = train("cpu", True, config, **size, **options)
        assert np.array_equal(plain.view(np.uint32), fused.view(np.uint32))


def test_fused_training_on_each_device(device):
    config = dict(momentum=0.9, nesterov=True, weight_decay=0.01)
    small = dict(steps=2, vocab=20, dim=5, batch=(2, 3), padding_idx=0)
    plain = train(device, False, config, **small)
    np.testing.assert_array_equal(train(device, True, config, **small), plain)
    np.testing.assert_array_equal(train("cpu", True, config, **small), plain)


OTHER_OPTIMISERS = {
    "Adam": lambda params: optim.Adam(params, lr=0.01),
    "AdamW": lambda params: optim.AdamW(params, lr=0.01, weight_decay=0.1),
    "Adam maximize": lambda params: optim.Adam(params, lr=0.01, maximize=True),
    "Adagrad": lambda params: optim.Adagrad(params, lr=0.1, lr_decay=0.01),
    "RowWiseAdagrad": lambda params: optim.RowWiseAdagrad(params, lr=0.1),
    "RowWiseAdagrad l2": lambda params: optim.RowWiseAdagrad(
        params, lr=0.1, weight_decay=0.01, weight_decay_mode="l2"),
    "RowWiseAdagrad decoupled": lambda params: optim.RowWiseAdagrad(
        params, lr=0.1, weight_decay=0.01, weight_decay_mode="decoupled"),
}


FUSED_OPTIONS = {"plain": dict(), "padding_freq": dict(padding_idx=3, scale_grad_by_freq=True)}
# RowWiseAdagrad's fused kernels compile per pair of option flags, L2 decay or not
# and scale_grad_by_freq or not (on a cold cache ~6 s serial, ~13 s parallel each):
# by default each flag's two values meet once in each kernel (no L2 with "plain",
# L2 with "padding_freq"); the other two pairs run under the exhaustive marker.
_FUSED_EXHAUSTIVE = {("RowWiseAdagrad", "padding_freq"), ("RowWiseAdagrad l2", "plain"),
                     ("RowWiseAdagrad decoupled", "padding_freq")}


@pytest.mark.parametrize("name, options", [
    pytest.param(name, options, id=f"{name}-{options}",
                 marks=[pytest.mark.exhaustive] if (name, options) in _FUSED_EXHAUSTIVE else [])
    for name in OTHER_OPTIMISERS for options in FUSED_OPTIONS])
def test_every_optimiser_fused_is_bit_identical_to_backward_then_step(name, options):
    # The fused row-group kernels (serial and, at ~400 rows x 96, parallel on the CPU)
    # against summing first and then the row update.
    make = OTHER_OPTIMISERS[name]
    for size in (dict(vocab=40, dim=6, batch=(3, 5)), dict(vocab=1000, dim=96, batch=(8, 64))):
        plain = train("cpu", False, None, make=make, **size, **FUSED_OPTIONS[options])
        fused = train("cpu", True, None, make=make, **size, **FUSED_OPTIONS[options])
        assert np.array_equal(plain.view(np.uint32), fused.view(np.uint32))


@pytest.mark.parametrize("name", ["AdamW", "Adagrad", "RowWiseAdagrad l2"])
def test_every_optimiser_fused_on_each_device(device, name):
    make = OTHER_OPTIMISERS[name]
    small = dict(steps=2, vocab=20, dim=5, batch=(2, 3), padding_idx=0, scale_grad_by_freq=True)
    plain = train(device, False, None, make=make, **small)
    np.testing.assert_array_equal(train(device, True, None, make=make, **small), plain)
    np.testing.assert_allclose(train("cpu", True, None, make=make, **small), plain, rtol=1e-6,
                               atol=1e-7)


def test_removing_the_hooks_restores_backward_then_step():
    emb = nn.Embedding(10, 3, sparse=True, seed=0)
    opt = optim.SGD(emb.parameters(), lr=0.1)
    handles = opt.fuse_with_backward()
    handles.remove()
    handles.remove()  # idempotent
    before = emb.weight.data.copy()
    emb(np.array([1, 2]))
    emb.backward(np.ones((2, 3), np.float32))
    assert isinstance(emb.weight.grad, SparseRows) and emb.weight.grad.summed
    np.testing.assert_array_equal(emb.weight.data, before)
    opt.step()
    assert not np.array_equal(emb.weight.data, before)


@pytest.mark.parametrize("fused_step", [False, True])
def test_hook_sees_the_accumulated_gradient_and_unused_lazy_sums_are_summed(fused_step):
    emb = nn.Embedding(10, 2, sparse=True, seed=0)
    seen = []
    register = (emb.weight._register_fused_step if fused_step
                else emb.weight.register_post_accumulate_grad_hook)
    handle = register(lambda p: seen.append((p is emb.weight, p.grad.summed)))
    ids = np.array([4, 1, 4])
    grad = np.arange(6, dtype=np.float32).reshape(3, 2)
    emb(ids)
    emb.backward(grad)
    # unsummed only while an optimiser's fused step runs (it sums in its own pass)
    assert seen == [(True, not fused_step)]
    assert emb.weight.grad.summed  # summed before backward returned
    grad[:] = 100  # so changing the gradient afterwards changes nothing
    np.testing.assert_array_equal(emb.weight.grad.indices, [1, 4])
    np.testing.assert_array_equal(emb.weight.grad.values, [[2, 3], [0 + 4, 1 + 5]])
    handle.remove()
    emb.zero_grad()
    emb(ids)
    emb.backward(grad)
    assert len(seen) == 1


def test_hook_must_be_callable():
    with pytest.raises(TypeError, match="hook: expected a callable, got int"):
        nn.Parameter(np.zeros((2, 2), np.float32)).register_post_accumulate_grad_hook(3)


@pytest.mark.parametrize("scale", [False, True])
def test_lazy_sparse_gradient_equals_eager(rng, scale):
    ids = rng.integers(0, 50, size=(6, 9))
    grad = rng.normal(size=(6, 9, 4))
    eager = F.embedding_backward(grad, ids, 50, 7, scale, sparse=True)
    lazy = F.embedding_backward(grad, ids, 50, 7, scale, sparse=True, lazy=True)
    assert not lazy.summed and lazy.shape == eager.shape and lazy.dtype == eager.dtype
    assert "summed=False" in repr(lazy)
    np.testing.assert_array_equal(lazy.indices, eager.indices)
    with pytest.raises(RuntimeError, match=r"not summed yet.*materialize\(\)"):
        lazy.values  # noqa: B018 - reading them is what raises
    assert lazy.materialize() is lazy and lazy.summed
    np.testing.assert_array_equal(lazy.values, eager.values)
    assert lazy.materialize() is lazy  # idempotent


def test_user_hooks_see_summed_gradients_and_fused_steps_unsummed(rng):
    """Laziness is the optimiser's explicit flag (Parameter.fuses_step), not "some hook exists"."""
    ids = rng.integers(0, 20, size=(3, 4))
    grad = rng.normal(size=(3, 4, 5)).astype(np.float32)
    emb = nn.Embedding(20, 5, sparse=True, seed=0)
    seen = []
    emb.weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.summed))
    assert not emb.weight.fuses_step
    emb(ids)
    emb.backward(grad)
    assert seen == [True]
    handles = numbapos.optim.SGD(emb.parameters(), lr=0.1).fuse_with_backward()
    assert emb.weight.fuses_step
    emb.zero_grad()
    emb(ids)
    emb.backward(grad)
    assert seen == [True, False]  # our hook runs before the step, which sums in its pass
    handles.remove()
    assert not emb.weight.fuses_step


@pytest.mark.parametrize("grad_dtype", [np.float32, np.float64])
def test_sparse_sgd_of_a_lazy_gradient_equals_summed(rng, grad_dtype):
    ids = rng.integers(0, 30, size=(5, 7))
    grad = rng.normal(size=(5, 7, 3)).astype(grad_dtype)
    param = rng.normal(size=(30, 3)).astype(np.float32)
    results = []
    for lazy in (False, True):
        p, buf, started = param.copy(), np.zeros_like(param), np.zeros(30, np.bool_)
        for _ in range(2):
            g = F.embedding_backward(grad, ids, 30, sparse=True, lazy=lazy)
            F.sparse_sgd_(p, g, buf, started, lr=0.1, momentum=0.9)
        results.append((p, buf, started))
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)


def test_lazy_gradient_rows_are_checked_before_the_update(rng):
    ids = np.array([[1, 8]])
    lazy = F.embedding_backward(np.ones((1, 2, 3)), ids, 9, sparse=True, lazy=True)
    param = np.zeros((5, 3))
    with pytest.raises(ValueError, match="SparseRows of shape"):
        F.sparse_sgd_(param, lazy, lr=0.1)
    assert not param.any()


@pytest.mark.parametrize("update", ["adam", "adagrad", "rowwise"])
def test_sparse_updates_of_a_lazy_gradient_equal_summed(rng, update):
    ids = rng.integers(0, 30, size=(5, 7))
    grad = rng.normal(size=(5, 7, 3)).astype(np.float32)
    param = rng.normal(size=(30, 3)).astype(np.float32)
    results = []
    for lazy in (False, True):
        p = param.copy()
        states = ([np.zeros_like(p), np.zeros_like(p)] if update == "adam"
                  else [np.zeros_like(p)] if update == "adagrad" else [np.zeros(30, np.float32)])
        for step in (1, 2):
            g = F.embedding_backward(grad, ids, 30, 4, True, sparse=True, lazy=lazy)
            if update == "adam":
                F.sparse_adam_(p, g, *states, step=step, lr=0.01)
            elif update == "adagrad":
                F.sparse_adagrad_(p, g, *states, step=step, lr=0.1)
            else:
                F.sparse_rowwise_adagrad_(p, g, *states, lr=0.1)
            assert g.summed is not lazy  # the fused update never summed it into values
        results.append([p, *states])
    for a, b in zip(*results, strict=True):
        np.testing.assert_array_equal(a, b)
