"""The module contract: every forward pairs with one backward, last in first out.

Each module is driven through the same checks: two forwards then two backwards
in reverse order give the same gradients as two separate forward/backward
pairs; a backward with nothing recorded raises RuntimeError; a gradient of the
wrong shape raises ValueError and keeps the record; no_grad() records nothing,
eval() records as train() does and its backward is the gradient with dropout
off; records beyond the limit are dropped and their backwards raise; inputs
changed after the forward do not change the gradient, and parameters the
backward reads raise when they changed.
"""

import copy
import threading
import warnings

import numpy as np
import pytest
import reference as ref
from conftest import host, on

import numbapos
from numbapos import nn


def _max_pending():  # noqa: N802 (reads like the constant it replaces)
    return numbapos.config.get("max_pending_records")

V, D, L = 11, 4, 3


def _ids(rng, shape=(2, L), high=V):
    return rng.integers(0, high, shape)


def _floats(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


# Each case: a module factory (device -> module) and an input maker (rng -> args).
CASES = {
    "Embedding": (lambda d: nn.Embedding(V, D, dtype=np.float64, seed=0, device=d),
                  lambda rng: (_ids(rng),)),
    "Embedding-sparse": (lambda d: nn.Embedding(V, D, sparse=True, padding_idx=1,
                                                dtype=np.float64, seed=0, device=d),
                         lambda rng: (_ids(rng),)),
    "LearnedPosEmbedding": (lambda d: nn.LearnedPosEmbedding(6, D, dropout=0.3, seed=1,
                                                             dtype=np.float64, device=d),
                            lambda rng: (_floats(rng, (2, L, D)),)),
    "SinusoidalPosEmbedding": (lambda d: nn.SinusoidalPosEmbedding(device=d),
                               lambda rng: (_floats(rng, (2, L, D)),)),
    "PositionalEmbedding-add": (lambda d: nn.PositionalEmbedding(5, D, seed=2,
                                                                 dtype=np.float64, device=d),
                                lambda rng: (_floats(rng, (2, L, D)),)),
    "PositionalEmbedding-mult": (lambda d: nn.PositionalEmbedding(
        5, D, type="learnable_mult_addition", seed=2, dtype=np.float64, device=d),
        lambda rng: (_floats(rng, (2, L, D)),)),
    "Dropout": (lambda d: nn.Dropout(0.4, seed=3, device=d),
                lambda rng: (_floats(rng, (2, L, D)),)),
    "RotaryEmbedding": (lambda d: nn.RotaryEmbedding(D, device=d),
                        lambda rng: (_floats(rng, (2, L, D)),)),
    "LayerNorm": (lambda d: nn.LayerNorm(D, dtype=np.float64, device=d),
                  lambda rng: (_floats(rng, (2, L, D)),)),
    "BertEmbeddings": (lambda d: nn.BertEmbeddings(V, D, 8, 2, hidden_dropout_prob=0.3, seed=4,
                                                   dtype=np.float64, device=d),
                       lambda rng: (_ids(rng),)),
    "GPT2Embeddings": (lambda d: nn.GPT2Embeddings(V, 8, D, embd_pdrop=0.3, seed=5,
                                                   dtype=np.float64, device=d),
                       lambda rng: (_ids(rng),)),
}


def _module_case(name, device):
    make, inputs = CASES[name]
    return make(device), inputs


def _grads(module):
    out = {}
    for name, param in module.named_parameters():
        grad = param.grad
        if isinstance(grad, numbapos.SparseRows):
            grad = grad.to_dense()
        out[name] = None if grad is None else host(grad)
    return out


def _on_all(device, args):
    return tuple(on(device, a) for a in args)


@pytest.fixture(params=sorted(CASES))
def case(request):
    return request.param


def test_lifo_accumulates_like_separate_pairs(case, device, rng):
    module, inputs = _module_case(case, device)
    twin, _ = _module_case(case, device)  # seeded: the same initial state
    a, b = _on_all(device, inputs(rng)), _on_all(device, inputs(rng))
    ya, yb = module(*a), module(*b)
    ga, gb = (on(device, _floats(rng, tuple(y.shape))) for y in (ya, yb))
    assert module.pending_backwards() == 2
    dx_b = module.backward(gb)
    dx_a = module.backward(ga)
    assert module.pending_backwards() == 0
    # The reference: each forward immediately followed by its own backward.
    np.testing.assert_array_equal(host(twin(*a)), host(ya))
    ref_a = twin.backward(ga)
    np.testing.assert_array_equal(host(twin(*b)), host(yb))
    ref_b = twin.backward(gb)
    for got, want in ((dx_a, ref_a), (dx_b, ref_b)):
        assert (got is None) == (want is None)
        if got is not None:
            np.testing.assert_allclose(host(got), host(want), rtol=1e-12, atol=1e-12)
    got, want = _grads(module), _grads(twin)
    assert got.keys() == want.keys()
    for name in got:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12,
                                   err_msg=name)


def test_backward_without_forward_raises_and_wrong_shape_keeps_record(case, device, rng):
    module, inputs = _module_case(case, device)
    grad = on(device, np.ones((2, L, D)))
    with pytest.raises(RuntimeError, match="called before forward"):
        module.backward(grad)
    y = module(*_on_all(device, inputs(rng)))
    before = _grads(module)
    with pytest.raises(ValueError, match="grad_(output|q)"):
        module.backward(on(device, np.ones((2, L + 1, D))))
    assert module.pending_backwards() == 1 and _grads(module) == before
    module.backward(on(device, np.ones(tuple(y.shape))))
    with pytest.raises(RuntimeError, match="called before forward"):
        module.backward(grad)


def _without_dropout(module):
    """The module with every Dropout child's probability set to 0 (still in training mode)."""
    for child in module.modules():
        if isinstance(child, nn.Dropout):
            child.p = 0.0
    return module


def test_eval_backward_is_the_train_backward_without_dropout(case, device, rng):
    module, inputs = _module_case(case, device)
    twin = _without_dropout(_module_case(case, device)[0])
    args = _on_all(device, inputs(rng))
    module.eval()
    y = module(*args)
    assert module.pending_backwards() == 1  # eval records, as in PyTorch
    np.testing.assert_array_equal(host(y), host(twin(*args)))
    grad = on(device, _floats(rng, tuple(y.shape)))
    got, want = module.backward(grad), twin.backward(grad)
    assert (got is None) == (want is None)
    if got is not None:
        np.testing.assert_array_equal(host(got), host(want))
    got, want = _grads(module), _grads(twin)
    assert got.keys() == want.keys()
    for name in got:
        if want[name] is None:
            assert got[name] is None, name
        else:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_modules_whose_forward_ignores_the_mode_work_without_training(case, device, rng):
    """PyTorch's test_if_train_and_eval_modes_differ deletes ``training`` from such modules."""
    module, inputs = _module_case(case, device)
    if any(isinstance(m, nn.Dropout) for m in module.modules()):
        pytest.skip("has dropout: its forward depends on the mode")
    args = _on_all(device, inputs(rng))
    expected = host(module(*args))
    module.backward(on(device, np.ones(expected.shape)))
    del module.training
    y = module(*args)
    np.testing.assert_array_equal(host(y), expected)
    module.backward(on(device, np.ones(expected.shape)))
    assert not hasattr(module, "training")


def test_no_grad_records_nothing(case, device, rng):
    module, inputs = _module_case(case, device)
    args = _on_all(device, inputs(rng))
    with numbapos.no_grad():
        assert not numbapos.is_grad_enabled()
        module(*args)
    assert numbapos.is_grad_enabled()
    assert module.pending_backwards() == 0
    with pytest.raises(RuntimeError, match="no_grad"):
        module.backward(on(device, np.ones((2, L, D))))


def test_to_drops_records(case, rng):
    module, inputs = _module_case(case, "cpu")
    module(*inputs(rng))
    module.to("cpu")
    assert module.pending_backwards() == 0


# ------------------------------------------------------------------ the cases


def test_tied_embedding_two_lookups_then_two_backwards(rng):
    # e(a); e(b); e.backward(g_b); e.backward(g_a): both gradients, each with its own rows.
    e = nn.Embedding(V, D, dtype=np.float64, seed=0)
    a, b = _ids(rng), _ids(rng)
    e(a)
    e(b)
    ga, gb = _floats(rng, (2, L, D)), _floats(rng, (2, L, D))
    e.backward(gb)
    e.backward(ga)
    want = ref.embedding_backward(ga, a, V) + ref.embedding_backward(gb, b, V)
    np.testing.assert_allclose(e.weight.grad, want, rtol=1e-12)


@pytest.mark.parametrize("which", ["Embedding", "LearnedPosEmbedding", "BertEmbeddings",
                                   "GPT2Embeddings"])
def test_index_buffer_reused_after_forward(which, rng):
    # ids[:] = ... between forward and backward must not change the gradient.
    ids = _ids(rng)
    if which == "LearnedPosEmbedding":
        module = nn.LearnedPosEmbedding(6, D, dtype=np.float64, seed=0)
        x = _floats(rng, (2, L, D))
        positions = np.array([2, 0, 5])

        def run(m):
            return m(x, position_ids=positions)
        buffer = positions
    else:
        module, _ = _module_case(which, "cpu")

        def run(m):
            return m(ids)
        buffer = ids
    twin = copy.deepcopy(module)
    y = run(module)
    g = _floats(rng, tuple(y.shape))
    run(twin)
    twin.backward(g)
    buffer[...] = 1  # the caller reuses its buffer
    module.backward(g)
    for name, grad in _grads(module).items():
        np.testing.assert_array_equal(grad, _grads(twin)[name], err_msg=name)


@pytest.mark.parametrize("change", ["load_state_dict", "new_data", "max_norm_forward"])
def test_block_tables_changed_between_forward_and_backward(change, rng):
    # The BERT block recomputes its LayerNorm input from the tables: a change raises.
    block = nn.BertEmbeddings(V, D, 8, 2, hidden_dropout_prob=0.0, seed=0, dtype=np.float64)
    ids = _ids(rng)
    if change == "max_norm_forward":
        block.word_embeddings.max_norm = 0.01
    y = block(ids)
    if change == "load_state_dict":
        state = {k: v + 1 if k.endswith("embeddings.weight") else v
                 for k, v in block.state_dict().items()}
        block.load_state_dict(state)
    elif change == "new_data":
        block.position_embeddings.weight.data = block.position_embeddings.weight.data * 2
    else:
        block(_ids(rng))  # clips rows in place, which the first forward's backward reads
        block.backward(np.ones(tuple(y.shape)))  # pairs with the second forward
    with pytest.raises(RuntimeError, match="was modified after the forward"):
        block.backward(np.ones(tuple(y.shape)))
    assert block.pending_backwards() == 1  # the record stays for a retry
    assert all(p.grad is None for p in block.parameters()) or change == "max_norm_forward"


def test_layer_norm_input_buffer_reused_after_forward(rng):
    ln, twin = nn.LayerNorm(D, dtype=np.float64), nn.LayerNorm(D, dtype=np.float64)
    x = _floats(rng, (2, L, D))
    g = _floats(rng, (2, L, D))
    ln(x)
    twin(x.copy())
    x[...] = 0.0
    np.testing.assert_array_equal(ln.backward(g), twin.backward(g))
    np.testing.assert_array_equal(ln.weight.grad, twin.weight.grad)


def test_layer_norm_weight_stepped_between_forward_and_backward_raises(rng):
    ln = nn.LayerNorm(D, dtype=np.float64)
    ln(_floats(rng, (2, D)))
    ln.weight.data[...] *= 2
    ln.weight.bump_version()  # what code writing .data in place must call
    with pytest.raises(RuntimeError, match="'weight' was modified"):
        ln.backward(np.ones((2, D)))


def test_attend_pairs_on_its_own_channel(rng):
    e = nn.Embedding(V, D, dtype=np.float64, seed=0)
    ids = _ids(rng)
    h1, h2 = _floats(rng, (2, D)), _floats(rng, (3, D))
    e(ids)
    e.attend(h1)
    e.attend(h2)
    g1, g2 = _floats(rng, (2, V)), _floats(rng, (3, V))
    h1_copy = h1.copy()
    h1[...] = 0  # the caller's buffer changes; attend kept its own copy
    gh2 = e.attend_backward(g2)
    gh1 = e.attend_backward(g1)
    weight = e.weight.data
    np.testing.assert_allclose(gh1, g1 @ weight, rtol=1e-12)
    np.testing.assert_allclose(gh2, g2 @ weight, rtol=1e-12)
    with pytest.raises(RuntimeError, match="attend_backward called before attend"):
        e.attend_backward(g1)
    e.backward(np.ones((2, L, D)))  # the lookup is still pending on its own channel
    want = g1.T @ h1_copy + g2.T @ h2 + ref.embedding_backward(np.ones((2, L, D)), ids, V)
    np.testing.assert_allclose(e.weight.grad, want, rtol=1e-12)
    e.attend(h2)
    e.weight.bump_version()
    with pytest.raises(RuntimeError, match="'weight' was modified"):
        e.attend_backward(g2)


def test_frozen_module_still_consumes_records(rng):
    e = nn.Embedding(V, D, seed=0).requires_grad_(False)
    e(_ids(rng))
    e.backward(np.ones((2, L, D), np.float32))
    assert e.weight.grad is None and e.pending_backwards() == 0


# ------------------------------------------------------------------ no_grad and the warning


def test_no_grad_nests_restores_and_decorates(rng):
    e = nn.Embedding(V, D, seed=0)

    @numbapos.no_grad()
    def infer(ids):
        assert not numbapos.is_grad_enabled()
        return e(ids)

    with numbapos.no_grad():
        with numbapos.no_grad():
            pass
        assert not numbapos.is_grad_enabled()
    assert numbapos.is_grad_enabled()
    with pytest.raises(KeyError), numbapos.no_grad():
        raise KeyError("boom")
    assert numbapos.is_grad_enabled()
    infer(_ids(rng))
    assert numbapos.is_grad_enabled() and e.pending_backwards() == 0


def test_no_grad_is_per_thread(rng):
    seen = []
    entered, release = threading.Event(), threading.Event()

    def worker():
        with numbapos.no_grad():
            entered.set()
            release.wait(10)

    thread = threading.Thread(target=worker)
    thread.start()
    entered.wait(10)
    seen.append(numbapos.is_grad_enabled())
    release.set()
    thread.join()
    assert seen == [True]


def test_records_beyond_the_limit_are_dropped_training_mode_warns_once(rng):
    e = nn.Embedding(V, D, seed=0)
    ids = _ids(rng)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(_max_pending() + 5):
            e(ids)
    messages = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    assert len(messages) == 1
    assert "backward" in messages[0] and "no_grad" in messages[0]
    assert "max_pending_records" in messages[0]
    assert e.pending_backwards() == _max_pending()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(_max_pending() + 5):
            e.eval()(ids)  # an inference loop without no_grad: bounded, and no warning
    assert e.pending_backwards() == _max_pending()


def test_a_backward_whose_record_was_dropped_raises(rng):
    e = nn.Embedding(V, D, dtype=np.float64, seed=0)
    twin = nn.Embedding(V, D, dtype=np.float64, seed=0)
    batches = [_ids(rng) for _ in range(4)]
    grads = [_floats(rng, (2, L, D)) for _ in range(4)]
    with numbapos.config.override(max_pending_records=2), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for ids in batches:
            e(ids)
        assert e.pending_backwards() == 2
        e.backward(grads[3])
        e.backward(grads[2])  # the two kept records pair with the two latest forwards
        for _ in range(2):
            with pytest.raises(RuntimeError, match="was dropped.*max_pending_records"):
                e.backward(grads[1])
        with pytest.raises(RuntimeError, match="called before forward"):
            e.backward(grads[0])
    for ids, grad in zip(batches[2:], grads[2:], strict=True):
        twin(ids)
        twin.backward(grad)
    np.testing.assert_array_equal(e.weight.grad, twin.weight.grad)


def _growth_of_eval_loop(rng, forwards=1000, settle_at=150):
    """Bytes still allocated after ``forwards`` eval-mode BERT forwards (without no_grad),
    from the point where ``settle_at`` forwards had run, and the pending count."""
    import gc
    import tracemalloc

    block = nn.BertEmbeddings(V, D, 8, 2, seed=0).eval()
    ids = _ids(rng, (4, 6))
    tracemalloc.start()
    try:
        for i in range(forwards):
            block(ids)
            if i == settle_at:
                gc.collect()
                settled, _ = tracemalloc.get_traced_memory()
        gc.collect()
        final, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return final - settled, block.pending_backwards()


def test_eval_inference_loop_memory_is_bounded(rng):
    """1,000 eval forwards without no_grad keep at most max_pending_records records."""
    bounded, pending = _growth_of_eval_loop(rng)
    assert pending == _max_pending()
    with numbapos.config.override(max_pending_records=100_000):
        unbounded, pending = _growth_of_eval_loop(rng)
    assert pending == 1000
    assert bounded * 10 < unbounded  # what the bound saves: the records of 850 forwards
