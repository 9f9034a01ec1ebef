"""Forward records tied to their outputs: a leftover forward never meets the wrong backward.

The training loops PyTorch accepts are run three ways, on both devices:
numbapos pairing last in first out, numbapos pairing each backward with its
output (``backward(grad, output=y)``), and a reference that pairs by output
(a NumPy oracle, and PyTorch where installed); the gradients and the weights
after the optimiser steps must agree. Then the misuses: the issue's
leftover evaluation call, leftovers of other shapes and channels, explicit
pairing with arrays that have no pending forward, and the bound on records.
"""

import contextlib
import inspect
import warnings

import numpy as np
import pytest
import reference as ref
from conftest import host, on

import numbapos
from numbapos import nn, optim

V, D, LR = 11, 4, 0.1


def _ids(rng, n=3):
    return rng.integers(0, V, (2, n))


# ------------------------------------------------------------------ three ways to run a loop
#
# A model is an embedding followed by a LayerNorm (the layer the backward reads its
# input for), with the embedding's table as a tied output head. forward(m, ids) returns
# norm(embed(ids)), head(m, h) the logits h @ table.T; backward(m, y, g) runs the
# backward of the call that returned y and returns the gradient wrt its float input.


class Numbapos:
    def __init__(self, device, paired):
        self.device, self.paired = device, paired
        self.heads = set()

    def make(self):
        m = nn.ModuleDict({"e": nn.Embedding(V, D, dtype=np.float64, seed=0, device=self.device),
                           "ln": nn.LayerNorm(D, dtype=np.float64, device=self.device)})
        m.opt = optim.SGD(m.parameters(), lr=LR)
        return m

    def forward(self, m, ids):
        return m["ln"](m["e"](on(self.device, ids)))

    def head(self, m, h):
        logits = m["e"].attend(h)
        self.heads.add(id(logits))
        return logits

    def backward(self, m, y, g):
        pair = {"output": y} if self.paired else {}
        g = on(self.device, g)
        if id(y) in self.heads:
            return m["e"].attend_backward(g, **pair)
        m["e"].backward(m["ln"].backward(g, **pair), **pair)  # the lookup is within y's call
        return None

    def train(self, m, mode=True):
        m.train(mode)

    def no_grad(self):
        return numbapos.no_grad()

    def zero_grad(self, m):
        m.zero_grad()

    def step(self, m):
        m.opt.step()

    def state(self, m):
        out = {}
        for name, p in m.named_parameters():
            out[name] = host(p.data).copy()
            out[name + ".grad"] = np.zeros(p.shape) if p.grad is None else host(p.grad).copy()
        return out


class Oracle:
    """Pairs each backward with the output it names; NumPy, nothing recorded in order."""

    def __init__(self):
        self.calls = {}   # id(output) -> (output, what its backward needs)
        self.recording = True

    def make(self):
        weight = host(nn.Embedding(V, D, dtype=np.float64, seed=0).weight.data).copy()
        return {"e.weight": weight, "ln.weight": np.ones(D), "ln.bias": np.zeros(D),
                "grads": {}}

    def _grad(self, m, name, g):
        m["grads"][name] = m["grads"].get(name, 0) + g

    def forward(self, m, ids):
        x = m["e.weight"][ids]
        y, _, _ = ref.layer_norm(x, m["ln.weight"], m["ln.bias"])
        if self.recording:
            self.calls[id(y)] = (y, ("forward", ids, x, m["ln.weight"].copy()))
        return y

    def head(self, m, h):
        logits = h @ m["e.weight"].T
        if self.recording:
            self.calls[id(logits)] = (logits, ("head", h.copy(), m["e.weight"].copy()))
        return logits

    def backward(self, m, y, g):
        _, (kind, *saved) = self.calls.pop(id(y))
        if kind == "head":
            h, weight = saved
            self._grad(m, "e.weight", g.reshape(-1, V).T @ h.reshape(-1, D))
            return g @ weight
        ids, x, gamma = saved
        gx, gw, gb = ref.layer_norm_backward(g, x, gamma)
        self._grad(m, "ln.weight", gw)
        self._grad(m, "ln.bias", gb)
        self._grad(m, "e.weight", ref.embedding_backward(gx, ids, V))
        return None

    def train(self, m, mode=True):
        pass  # neither layer depends on the mode

    @contextlib.contextmanager
    def no_grad(self):
        self.recording = False
        try:
            yield
        finally:
            self.recording = True

    def zero_grad(self, m):
        m["grads"] = {}

    def step(self, m):
        for name, g in m["grads"].items():
            m[name] = m[name] - LR * g

    def state(self, m):
        out = {}
        for name in ("e.weight", "ln.weight", "ln.bias"):
            out[name] = m[name].copy()
            out[name + ".grad"] = np.broadcast_to(m["grads"].get(name, 0.0),
                                                  m[name].shape).copy()
        return out


class Torch:
    """PyTorch: each backward runs through the graph of the tensor it is called on."""

    def __init__(self, torch):
        self.torch = torch
        self.leaves = {}  # id(logits) -> the detached h they were computed from

    def make(self):
        torch = self.torch
        weight = host(nn.Embedding(V, D, dtype=np.float64, seed=0).weight.data).copy()
        m = torch.nn.ModuleDict({"e": torch.nn.Embedding(V, D, dtype=torch.float64),
                                 "ln": torch.nn.LayerNorm(D, dtype=torch.float64)})
        with torch.no_grad():
            m["e"].weight.copy_(torch.from_numpy(weight))
        m.opt = torch.optim.SGD(m.parameters(), lr=LR)
        return m

    def forward(self, m, ids):
        return m["ln"](m["e"](self.torch.from_numpy(np.asarray(ids))))

    def head(self, m, h):
        leaf = h.detach().clone().requires_grad_(True)
        logits = leaf @ m["e"].weight.T
        self.leaves[id(logits)] = leaf
        return logits

    def backward(self, m, y, g):
        y.backward(self.torch.from_numpy(np.asarray(g)))
        leaf = self.leaves.pop(id(y), None)
        return None if leaf is None else leaf.grad.numpy()

    def train(self, m, mode=True):
        m.train(mode)

    def no_grad(self):
        return self.torch.no_grad()

    def zero_grad(self, m):
        m.zero_grad()

    def step(self, m):
        m.opt.step()

    def state(self, m):
        out = {}
        for name, p in m.named_parameters():
            out[name] = p.detach().numpy().copy()
            out[name + ".grad"] = np.zeros(p.shape) if p.grad is None else p.grad.numpy().copy()
        return out


# ------------------------------------------------------------------ the loops PyTorch accepts


def loop_forward_backward(lib, m, rng):
    y = lib.forward(m, _ids(rng))
    lib.backward(m, y, rng.standard_normal((2, 3, D)))


def loop_forwards_then_backwards_in_reverse(lib, m, rng):
    ys = [lib.forward(m, _ids(rng, n)) for n in (2, 3, 3)]
    for y in reversed(ys):
        lib.backward(m, y, rng.standard_normal(tuple(y.shape)))


def loop_shared_layer_twice_in_one_step(lib, m, rng):
    ya, yb = lib.forward(m, _ids(rng)), lib.forward(m, _ids(rng))
    g = rng.standard_normal((2, 3, D))  # the gradient of ya + yb reaches both
    lib.backward(m, yb, g)
    lib.backward(m, ya, g)


def loop_tied_head(lib, m, rng):
    h = lib.forward(m, _ids(rng))
    logits = lib.head(m, h)
    grad_h = lib.backward(m, logits, rng.standard_normal((2, 3, V)))
    lib.backward(m, h, host(grad_h) + 1.0)


def loop_accumulate_then_step(lib, m, rng):
    for _ in range(3):
        y = lib.forward(m, _ids(rng))
        lib.backward(m, y, rng.standard_normal((2, 3, D)))
    lib.step(m)
    lib.zero_grad(m)
    y = lib.forward(m, _ids(rng))
    lib.backward(m, y, rng.standard_normal((2, 3, D)))


def loop_zero_grad_before_and_after_forward(lib, m, rng):
    for before in (True, False, True):
        if before:
            lib.zero_grad(m)
        y = lib.forward(m, _ids(rng))
        if not before:
            lib.zero_grad(m)
        lib.backward(m, y, rng.standard_normal((2, 3, D)))
        lib.step(m)


def _loop_eval_between_steps(how):
    def loop(lib, m, rng):
        kept = []
        for _ in range(3):
            y = lib.forward(m, _ids(rng))
            lib.backward(m, y, rng.standard_normal((2, 3, D)))
            lib.step(m)
            lib.zero_grad(m)
            lib.train(m, False)
            with lib.no_grad() if how == "no_grad" else contextlib.nullcontext():
                out = lib.forward(m, _ids(rng, 5))
            if how == "held":
                kept.append(out)
            del out
            lib.train(m)
        y = lib.forward(m, _ids(rng))
        lib.backward(m, y, rng.standard_normal((2, 3, D)))
    return loop


def loop_backward_of_an_eval_forward(lib, m, rng):
    lib.train(m, False)
    y = lib.forward(m, _ids(rng))
    lib.backward(m, y, rng.standard_normal((2, 3, D)))
    lib.train(m)


def loop_eval_call_inside_a_step(lib, m, rng):
    # Valid in PyTorch; numbapos pairs it only when told which output (output=).
    y = lib.forward(m, _ids(rng))
    lib.train(m, False)
    val = lib.forward(m, _ids(rng, 5))  # noqa: F841 (held, never backward)
    lib.train(m)
    lib.backward(m, y, rng.standard_normal((2, 3, D)))


LOOPS = {
    "forward_backward": loop_forward_backward,
    "reverse_order": loop_forwards_then_backwards_in_reverse,
    "shared_twice": loop_shared_layer_twice_in_one_step,
    "tied_head": loop_tied_head,
    "accumulate": loop_accumulate_then_step,
    "zero_grad": loop_zero_grad_before_and_after_forward,
    "eval_between_dropped": _loop_eval_between_steps("dropped"),
    "eval_between_held": _loop_eval_between_steps("held"),
    "eval_between_no_grad": _loop_eval_between_steps("no_grad"),
    "eval_backward": loop_backward_of_an_eval_forward,
    "eval_inside_step": loop_eval_call_inside_a_step,
}
PAIRED_ONLY = {"eval_inside_step"}


def _run(lib, loop):
    m = lib.make()
    LOOPS[loop](lib, m, np.random.default_rng(7))
    return lib.state(m)


def _assert_same(got, want):
    assert got.keys() == want.keys()
    for name in got:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.fixture(params=["lifo", "paired"])
def pairing(request):
    return request.param


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_loops_give_the_oracles_gradients(loop, pairing, device):
    if loop in PAIRED_ONLY and pairing == "lifo":
        pytest.skip("pairs only with output=")
    _assert_same(_run(Numbapos(device, pairing == "paired"), loop), _run(Oracle(), loop))


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_loops_give_pytorchs_gradients(loop, pairing, device):
    torch = pytest.importorskip("torch")
    if loop in PAIRED_ONLY and pairing == "lifo":
        pytest.skip("pairs only with output=")
    _assert_same(_run(Numbapos(device, pairing == "paired"), loop), _run(Torch(torch), loop))


def test_without_output_an_eval_call_inside_a_step_is_the_latest_record(device):
    """Why that loop needs output=: the evaluation output is held, so its record is the
    latest live one (here of another shape: the backward refuses the gradient)."""
    with pytest.raises(ValueError, match="grad_output"):
        _run(Numbapos(device, paired=False), "eval_inside_step")


# ------------------------------------------------------------------ the issue's misuse


def test_the_issues_leftover_evaluation_call_raises(device):
    e = nn.Embedding(10, 4, seed=0, device=device)
    g = on(device, np.ones((2, 4), np.float32))
    e.eval()
    e(on(device, np.array([7, 8])))       # an evaluation call; its output is dropped
    e.train()
    y = e(on(device, np.array([1, 2])))
    e.backward(g)
    with pytest.raises(RuntimeError, match=r"forward call #1 \(eval mode, input shape \(2,\)\), "
                                           r"is a leftover: its output was gone when forward "
                                           r"call #2 ran"):
        e.backward(g)
    want = np.zeros((10, 4), np.float32)
    want[[1, 2]] = 1.0
    np.testing.assert_array_equal(host(e.weight.grad), want)  # rows 7 and 8 got nothing
    assert e.pending_backwards() == 0
    with pytest.raises(RuntimeError, match="called before forward"):
        e.backward(g)
    assert y.shape == (2, 4)


def test_nothing_left_over_raises_as_before(device):
    e = nn.Embedding(10, 4, seed=0, device=device)
    g = on(device, np.ones((2, 4), np.float32))
    y = e(on(device, np.array([1, 2])))
    e.backward(g)
    with pytest.raises(RuntimeError, match="called before forward"):
        e.backward(g)
    assert y is not None


def test_a_leftover_of_another_shape_is_named_not_a_shape_error(device):
    e = nn.Embedding(10, 4, seed=0, device=device)
    e.eval()
    e(on(device, np.array([[7, 8, 9]])))
    e(on(device, np.array([5])))
    e.train()
    y = e(on(device, np.array([1, 2])))
    e.backward(on(device, np.ones((2, 4), np.float32)))
    assert e.pending_backwards() == 0  # both evaluation calls are leftovers
    with pytest.raises(RuntimeError, match=r"forward call #2 \(eval mode, input shape \(1,\)\)"):
        e.backward(on(device, np.ones((2, 4), np.float32)))
    with pytest.raises(RuntimeError, match=r"call #1 .*input shape \(1, 3\)\), is a leftover"):
        e.backward(on(device, np.ones((1, 3, 4), np.float32)))
    assert y is not None


def test_a_leftover_between_held_forwards_is_skipped(device, rng):
    e = nn.Embedding(V, D, dtype=np.float64, seed=0, device=device)
    a, b = _ids(rng), _ids(rng)
    ga, gb = rng.standard_normal((2, 3, D)), rng.standard_normal((2, 3, D))
    ya = e(on(device, a))
    e.eval()
    e(on(device, _ids(rng)))             # dropped
    e.train()
    yb = e(on(device, b))
    assert e.pending_backwards() == 2
    e.backward(on(device, gb))
    e.backward(on(device, ga))            # the leftover is skipped: this pairs with e(a)
    want = ref.embedding_backward(ga, a, V) + ref.embedding_backward(gb, b, V)
    np.testing.assert_allclose(host(e.weight.grad), want, rtol=1e-12)
    with pytest.raises(RuntimeError, match=r"forward call #2 \(eval mode.*is a leftover"):
        e.backward(on(device, ga))
    assert ya is not None and yb is not None


def test_attend_leftover_raises_on_its_channel(device, rng):
    e = nn.Embedding(V, D, dtype=np.float64, seed=0, device=device)
    e.attend(on(device, rng.standard_normal((2, D))))    # dropped
    logits = e.attend(on(device, rng.standard_normal((3, D))))
    e.attend_backward(on(device, np.ones((3, V))))
    with pytest.raises(RuntimeError, match=r"attend_backward: .*attend call #1 .*leftover"):
        e.attend_backward(on(device, np.ones((2, V))))
    assert logits is not None


def test_outputs_gone_without_a_held_later_call_stay_consumable(device, rng):
    """Intermediate results need not be kept: x = e(ids) * s, or several dropped calls."""
    e = nn.Embedding(V, D, dtype=np.float64, seed=0, device=device)
    a, b = _ids(rng), _ids(rng)
    ga, gb = rng.standard_normal((2, 3, D)), rng.standard_normal((2, 3, D))
    xa = host(e(on(device, a))) * 2.0
    xb = host(e(on(device, b))) * 2.0
    e.backward(on(device, 2.0 * gb))
    e.backward(on(device, 2.0 * ga))
    want = 2.0 * (ref.embedding_backward(ga, a, V) + ref.embedding_backward(gb, b, V))
    np.testing.assert_allclose(host(e.weight.grad), want, rtol=1e-12)
    assert xa.shape == xb.shape


def test_a_dropped_output_under_a_held_one_is_a_leftover_keep_it_or_pair(device, rng):
    """What the rule asks: calling one module twice, keep both outputs (or neither)."""
    e = nn.Embedding(V, D, dtype=np.float64, seed=0, device=device)
    a, b = _ids(rng), _ids(rng)
    e(on(device, a))
    yb = e(on(device, b))
    e.backward(on(device, np.ones((2, 3, D))))
    with pytest.raises(RuntimeError, match="leftover"):
        e.backward(on(device, np.ones((2, 3, D))))
    e.zero_grad()
    ya, yb = e(on(device, a)), e(on(device, b))
    e.backward(on(device, np.ones((2, 3, D))))
    e.backward(on(device, np.ones((2, 3, D))))
    ones = np.ones((2, 3, D))
    want = ref.embedding_backward(ones, a, V) + ref.embedding_backward(ones, b, V)
    np.testing.assert_allclose(host(e.weight.grad), want, rtol=1e-12)
    assert ya is not None and yb is not None


def test_a_model_module_keeps_its_childrens_records(device, rng):
    """Records made inside a module call live as long as that call's output."""

    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.e = nn.Embedding(V, D, dtype=np.float64, seed=0, device=device)

        def forward(self, a, b):
            # Both lookups' outputs are dropped once this returns.
            return on(device, host(self.e(a)) * 2.0 + host(self.e(b)))

        def backward(self, grad):
            self.e.backward(grad)
            self.e.backward(on(device, host(grad) * 2.0))

    model = Pair()
    a, b, c, d = (_ids(rng) for _ in range(4))
    g1, g2 = rng.standard_normal((2, 3, D)), rng.standard_normal((2, 3, D))
    y1 = model(on(device, a), on(device, b))
    y2 = model(on(device, c), on(device, d))
    model.backward(on(device, g2))
    model.backward(on(device, g1))
    want = (2 * ref.embedding_backward(g1, a, V) + ref.embedding_backward(g1, b, V)
            + 2 * ref.embedding_backward(g2, c, V) + ref.embedding_backward(g2, d, V))
    np.testing.assert_allclose(host(model.e.weight.grad), want, rtol=1e-12)
    model.zero_grad()
    y1 = model(on(device, a), on(device, b))
    y2 = model(on(device, c), on(device, d))
    model.backward(on(device, g1), output=y1)  # out of order, by output
    model.backward(on(device, g2), output=y2)
    np.testing.assert_allclose(host(model.e.weight.grad), want, rtol=1e-12)


# ------------------------------------------------------------------ explicit pairing


def test_output_pairs_out_of_order_and_only_once(device, rng):
    e = nn.Embedding(V, D, dtype=np.float64, seed=0, device=device)
    a, b = _ids(rng), _ids(rng, 2)
    ga, gb = rng.standard_normal((2, 3, D)), rng.standard_normal((2, 2, D))
    ya, yb = e(on(device, a)), e(on(device, b))
    e.backward(on(device, ga), output=ya)
    np.testing.assert_allclose(host(e.weight.grad), ref.embedding_backward(ga, a, V),
                               rtol=1e-12)
    with pytest.raises(RuntimeError, match="output: no pending forward of this Embedding.*"
                                           "consumed by an earlier backward"):
        e.backward(on(device, ga), output=ya)
    with pytest.raises(ValueError, match="grad_output"):  # wrong shape: the record stays
        e.backward(on(device, ga), output=yb)
    assert e.pending_backwards() == 1
    e.backward(on(device, gb))
    want = ref.embedding_backward(ga, a, V) + ref.embedding_backward(gb, b, V)
    np.testing.assert_allclose(host(e.weight.grad), want, rtol=1e-12)


def test_output_must_be_a_recorded_forwards_array(device, rng):
    e = nn.Embedding(V, D, dtype=np.float64, seed=0, device=device)
    other = nn.Embedding(V, D, dtype=np.float64, seed=1, device=device)
    g = on(device, np.ones((2, 3, D)))
    y = e(on(device, _ids(rng)))
    with pytest.raises(TypeError, match=r"Embedding.backward: output: expected the array a "
                                        r"forward returned, got int"):
        e.backward(g, output=3)
    with pytest.raises(RuntimeError, match="output: this array is not the output of a "
                                           "recorded forward"):
        e.backward(g, output=on(device, np.ones((2, 3, D))))
    with numbapos.no_grad():
        z = e(on(device, _ids(rng)))
    with pytest.raises(RuntimeError, match="not the output of a recorded forward.*no_grad"):
        e.backward(g, output=z)
    w = other(on(device, _ids(rng)))
    with pytest.raises(RuntimeError, match="comes from another module's forward"):
        e.backward(g, output=w)
    assert e.pending_backwards() == 1 and e.weight.grad is None
    e.backward(g, output=y)
    assert e.pending_backwards() == 0 and other.pending_backwards() == 1


def test_output_may_be_a_numpy_view(rng):
    e = nn.Embedding(V, D, dtype=np.float64, seed=0)
    a, b = _ids(rng), _ids(rng)
    ga = rng.standard_normal((2, 3, D))
    view = e(a)[:, 1:]
    yb = e(b)
    e.backward(ga, output=view)  # the view keeps e(a)'s output, and names it
    np.testing.assert_allclose(e.weight.grad, ref.embedding_backward(ga, a, V), rtol=1e-12)
    assert yb is not None


def test_output_through_a_container(device, rng):
    seq = nn.Sequential(nn.LearnedPosEmbedding(6, D, seed=1, dtype=np.float64, device=device),
                        nn.LayerNorm(D, dtype=np.float64, device=device))
    twin = nn.Sequential(nn.LearnedPosEmbedding(6, D, seed=1, dtype=np.float64, device=device),
                         nn.LayerNorm(D, dtype=np.float64, device=device))
    x1, x2 = rng.standard_normal((2, 3, D)), rng.standard_normal((1, 5, D))
    g1, g2 = rng.standard_normal((2, 3, D)), rng.standard_normal((1, 5, D))
    y1, y2 = seq(on(device, x1)), seq(on(device, x2))
    gx1 = seq.backward(on(device, g1), output=y1)   # the older call first
    gx2 = seq.backward(on(device, g2))
    twin(on(device, x1))
    want1 = twin.backward(on(device, g1))
    twin(on(device, x2))
    want2 = twin.backward(on(device, g2))
    np.testing.assert_allclose(host(gx1), host(want1), rtol=1e-12)
    np.testing.assert_allclose(host(gx2), host(want2), rtol=1e-12)
    for (name, p), q in zip(seq.named_parameters(), twin.parameters(), strict=True):
        np.testing.assert_allclose(host(p.grad), host(q.grad), rtol=1e-12, err_msg=name)
    assert y2 is not None


def test_output_of_a_rotation_pair(device, rng):
    rope = nn.RotaryEmbedding(D, device=device)
    q1, k1 = (on(device, rng.standard_normal((1, 2, 3, D))) for _ in range(2))
    q2 = on(device, rng.standard_normal((1, 2, 5, D)))
    pair = rope(q1, k1)
    q2_rot = rope(q2)
    gq, gk = rng.standard_normal((1, 2, 3, D)), rng.standard_normal((1, 2, 3, D))
    got_q, got_k = rope.backward(on(device, gq), on(device, gk), output=pair)
    assert rope.pending_backwards() == 1
    twin = nn.RotaryEmbedding(D, device=device)
    twin(q1, k1)
    want_q, want_k = twin.backward(on(device, gq), on(device, gk))
    np.testing.assert_array_equal(host(got_q), host(want_q))
    np.testing.assert_array_equal(host(got_k), host(want_k))
    assert q2_rot is not None


def test_backwards_take_output_in_their_signatures():
    for method in (nn.Embedding.backward, nn.Embedding.attend_backward, nn.LayerNorm.backward,
                   nn.RotaryEmbedding.backward, nn.Dropout.backward, nn.Sequential.backward,
                   nn.BertEmbeddings.backward, nn.Module.backward):
        param = inspect.signature(method).parameters["output"]
        assert param.kind is param.KEYWORD_ONLY and param.default is None, method
    assert "output" not in inspect.signature(nn.Embedding.forward).parameters


# ------------------------------------------------------------------ what stays


def test_the_bound_still_drops_the_oldest_held_records(device, rng):
    e = nn.Embedding(V, D, dtype=np.float64, seed=0, device=device)
    with numbapos.config.override(max_pending_records=2), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ys = [e(on(device, _ids(rng))) for _ in range(4)]
        assert e.pending_backwards() == 2
        e.backward(on(device, np.ones((2, 3, D))))
        e.backward(on(device, np.ones((2, 3, D))))
        with pytest.raises(RuntimeError, match=r"forward call #2 .*was dropped"):
            e.backward(on(device, np.ones((2, 3, D))))
    with pytest.raises(RuntimeError, match="output: no pending forward"):
        e.backward(on(device, np.ones((2, 3, D))), output=ys[0])
    assert len(ys) == 4


def test_a_forward_that_returns_no_array_keeps_its_records(rng):
    """Nothing to follow: such records are consumed last in first out, as before."""

    class Loss(nn.Module):
        def __init__(self):
            super().__init__()
            self.e = nn.Embedding(V, D, dtype=np.float64, seed=0)

        def forward(self, ids):
            return float(self.e(ids).sum())

        def backward(self, grad=1.0):
            return self.e.backward(np.full((2, 3, D), grad))

    model = Loss()
    a, b = _ids(rng), _ids(rng)
    model(a)
    model(b)
    model.backward()
    model.backward()
    ones = np.ones((2, 3, D))
    want = ref.embedding_backward(ones, a, V) + ref.embedding_backward(ones, b, V)
    np.testing.assert_allclose(model.e.weight.grad, want, rtol=1e-12)
