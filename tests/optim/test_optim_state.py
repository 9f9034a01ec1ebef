"""Optimiser checkpoints, parameter groups and the errors every optimiser shares.

state_dict / load_state_dict in PyTorch's layout: a run checkpointed mid-way
and resumed equals an uninterrupted run bit for bit, on the CPU and on CUDA
(the simulator without a GPU), dense, sparse and mixed steps; every malformed
checkpoint is refused before anything changes.
"""

import pickle
import warnings

import numpy as np
import pytest
from conftest import host, on

from numbapos import SparseRows, nn, optim

# (optimiser class, options): each branch that keeps state.
MAKERS = [
    (optim.SGD, dict(lr=0.1, momentum=0.9)),
    (optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (optim.Adam, dict(lr=0.01, weight_decay=0.1)),
    (optim.Adam, dict(lr=0.01, amsgrad=True)),  # dense steps only
    (optim.AdamW, dict(lr=0.01)),
    (optim.Adagrad, dict(lr=0.1, lr_decay=0.01, initial_accumulator_value=0.1)),
    (optim.RowWiseAdagrad, dict(lr=0.1, weight_decay=0.01, weight_decay_mode="l2")),
]
V, D = 6, 3


def _grads(device, seed, options, steps=6):
    """A fixed sequence of gradients for (table, bias): sparse and dense steps mixed."""
    rng = np.random.default_rng(seed)
    out = []
    for step in range(steps):
        if step % 3 == 2 or options.get("amsgrad"):
            table = on(device, rng.normal(size=(V, D)).astype(np.float32))
        else:
            rows = np.sort(rng.choice(V, size=2 + step % 2, replace=False))
            table = SparseRows(rows, on(device, rng.normal(size=(rows.size, D))
                                        .astype(np.float32)), V)
        out.append((table, on(device, rng.normal(size=D).astype(np.float32))))
    return out


def _model(device):
    rng = np.random.default_rng(0)
    return [nn.Parameter(on(device, rng.normal(size=(V, D)).astype(np.float32))),
            nn.Parameter(on(device, rng.normal(size=D).astype(np.float32)))]


def _run(opt, params, grads):
    for table, bias in grads:
        params[0].grad, params[1].grad = table, bias
        opt.step()


def _make(cls, options, params):
    return cls([{"params": params[:1]}, {"params": params[1:], "lr": options["lr"] / 2}],
               **options)


@pytest.mark.parametrize("cls, options", MAKERS)
def test_resume_from_checkpoint_is_bit_identical(device, cls, options):
    grads = _grads(device, 1, options)
    straight = _model(device)
    _run(_make(cls, options, straight), straight, grads)

    first = _model(device)
    opt = _make(cls, options, first)
    _run(opt, first, grads[:3])
    saved = pickle.loads(pickle.dumps(opt.state_dict()))  # a file written and read back
    saved_params = [host(p.data).copy() for p in first]
    _run(opt, first, grads[3:4])  # moves on past the checkpoint: the load must undo it
    del opt, first

    resumed = [nn.Parameter(on(device, a)) for a in saved_params]
    opt = _make(cls, {**options, "lr": 123.0}, resumed)  # options come from the checkpoint
    opt.load_state_dict(saved)
    _run(opt, resumed, grads[3:])
    for a, b in zip(resumed, straight, strict=True):
        np.testing.assert_array_equal(host(a.data), host(b.data))


@pytest.mark.parametrize("cls, options", MAKERS)
@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_state_dict_round_trip_across_devices(device, target, cls, options):
    if target == "cuda":
        import numbapos

        if not numbapos.cuda_available():
            pytest.skip("CUDA is not available")
    params = _model(device)
    opt = _make(cls, options, params)
    _run(opt, params, _grads(device, 2, options, steps=3))
    saved = opt.state_dict()
    for values in saved["state"].values():
        for value in values.values():
            assert isinstance(value, (np.ndarray, bool, int, float))
    moved = [nn.Parameter(on(target, host(p.data))) for p in params]
    other = _make(cls, options, moved)
    other.load_state_dict(saved)
    again = other.state_dict()
    assert again["param_groups"] == saved["param_groups"]
    assert again["state"].keys() == saved["state"].keys()
    for index, values in saved["state"].items():
        assert again["state"][index].keys() == values.keys()
        for name, value in values.items():
            np.testing.assert_array_equal(again["state"][index][name], value)
            if isinstance(value, np.ndarray):
                assert again["state"][index][name] is not value  # copies, never views
                live = other.state[id(moved[index])][name]
                assert numbapos_device(live) == target


def numbapos_device(x):
    from numbapos import _device

    return _device.device_of(x)


def test_sgd_state_dict_layout():
    a = nn.Parameter(np.zeros((3, 2), np.float32))
    b = nn.Parameter(np.zeros(2, np.float32))
    c = nn.Parameter(np.zeros(2, np.float32))
    opt = optim.SGD([{"params": [a, b]}, {"params": [c], "momentum": 0.0}], lr=0.5,
                    momentum=0.9)
    a.grad = SparseRows(np.array([1]), np.ones((1, 2), np.float32), 3)
    c.grad = np.ones(2, np.float32)
    opt.step()
    saved = opt.state_dict()
    assert saved["param_groups"] == [
        dict(lr=0.5, momentum=0.9, dampening=0.0, weight_decay=0.0, nesterov=False,
             maximize=False, params=[0, 1]),
        dict(lr=0.5, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
             maximize=False, params=[2]),
    ]
    assert list(saved["state"]) == [0]  # b had no gradient, c keeps no state without momentum
    state = saved["state"][0]
    np.testing.assert_array_equal(state["momentum_buffer"], [[0, 0], [1, 1], [0, 0]])
    np.testing.assert_array_equal(state["row_started"], [False, True, False])
    assert state["dense_started"] is False
    assert state["momentum_buffer"].dtype == np.float32


def test_load_accepts_pytorch_sgd_state_dict():
    torch = pytest.importorskip("torch")
    t = torch.nn.Parameter(torch.zeros(3, 2))
    topt = torch.optim.SGD([t], lr=0.1, momentum=0.9)
    t.grad = torch.ones(3, 2)
    topt.step()
    saved = topt.state_dict()
    p = nn.Parameter(np.zeros((3, 2), np.float32))
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    saved["state"][0].update(row_started=np.ones(3, bool), dense_started=True)
    opt.load_state_dict(saved)
    np.testing.assert_array_equal(opt.state[id(p)]["momentum_buffer"], np.ones((3, 2)))


def test_load_accepts_pytorch_adam_state_dict_and_continues_like_it(rng):
    torch = pytest.importorskip("torch")
    start = rng.normal(size=(3, 2)).astype(np.float32)
    grads = rng.normal(size=(4, 3, 2)).astype(np.float32)
    t = torch.nn.Parameter(torch.from_numpy(start.copy()))
    topt = torch.optim.Adam([t], lr=0.1, amsgrad=True, foreach=False)
    for g in grads[:2]:
        t.grad = torch.from_numpy(g.copy())
        topt.step()
    p = nn.Parameter(t.detach().numpy().copy())
    opt = optim.Adam([p])
    opt.load_state_dict(topt.state_dict())  # step is a tensor there, lr and amsgrad come along
    assert opt.param_groups[0]["lr"] == 0.1 and opt.state[id(p)]["step"] == 2
    for g in grads[2:]:
        t.grad = torch.from_numpy(g.copy())
        p.grad = g
        topt.step()
        opt.step()
    np.testing.assert_allclose(p.data, t.detach().numpy(), rtol=1e-6, atol=1e-6)


def test_adam_and_rowwise_state_dict_layout():
    a = nn.Parameter(np.zeros((4, 2), np.float32))
    a.grad = SparseRows(np.array([2]), np.ones((1, 2), np.float32), 4)
    adam = optim.Adam([a], lr=0.1)
    adam.step()
    state = adam.state_dict()["state"][0]
    assert sorted(state) == ["exp_avg", "exp_avg_sq", "step"] and state["step"] == 1
    assert state["exp_avg"].shape == (4, 2)
    rowwise = optim.RowWiseAdagrad([a])
    rowwise.step()
    saved = rowwise.state_dict()
    assert sorted(saved["state"][0]) == ["sum"] and saved["state"][0]["sum"].shape == (4,)
    assert saved["param_groups"][0]["weight_decay_mode"] == "none"


def _loaded_sgd():
    p = nn.Parameter(np.zeros((3, 2), np.float32))
    opt = optim.SGD([p], lr=0.1, momentum=0.9)
    p.grad = np.ones((3, 2), np.float32)
    opt.step()
    return p, opt


def _bad_checkpoints():
    def edit(fn):
        _, opt = _loaded_sgd()
        saved = opt.state_dict()
        fn(saved)
        return saved

    def state(saved):
        return saved["state"][0]

    return [
        ([], TypeError, "exactly the entries"),
        ({"state": {}}, TypeError, "exactly the entries"),
        (edit(lambda s: s["param_groups"].append(dict(s["param_groups"][0]))), ValueError,
         "2 parameter group"),
        (edit(lambda s: s["param_groups"][0].update(params=[0, 1])), ValueError,
         "lists 2 parameter"),
        (edit(lambda s: s["param_groups"][0].update(lr=-1.0)), ValueError, "lr"),
        (edit(lambda s: s["param_groups"][0].update(betas=(0.9, 0.9))), ValueError,
         "unknown option"),
        (edit(lambda s: s["state"].update({5: {}})), ValueError, "state for parameter 5"),
        (edit(lambda s: state(s).update(momentum_buffer=np.zeros((2, 2)))), ValueError,
         r"expected shape \(3, 2\)"),
        (edit(lambda s: state(s).update(row_started=np.zeros(3, np.float32))), TypeError,
         "expected dtype bool"),
        (edit(lambda s: state(s).pop("row_started")), ValueError, "missing state"),
        (edit(lambda s: state(s).update(exp_avg=np.zeros((3, 2)))), ValueError,
         "unknown state"),
        (edit(lambda s: state(s).update(dense_started="yes")), TypeError, "expected a bool"),
        (edit(lambda s: s["state"].update({0: [1, 2]})), TypeError, "expected a dict"),
    ]


@pytest.mark.parametrize("case", range(len(_bad_checkpoints())))
def test_load_refuses_bad_checkpoints_before_changing_anything(case):
    bad, error, match = _bad_checkpoints()[case]
    _, opt = _loaded_sgd()
    before = opt.state_dict()
    with pytest.raises(error, match=match):
        opt.load_state_dict(bad)
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"]
    np.testing.assert_array_equal(after["state"][0]["momentum_buffer"],
                                  before["state"][0]["momentum_buffer"])


def test_load_casts_float_state_to_the_parameter_dtype():
    p, opt = _loaded_sgd()
    saved = opt.state_dict()
    saved["state"][0]["momentum_buffer"] = saved["state"][0]["momentum_buffer"] * 2.0
    saved["state"][0]["momentum_buffer"] = saved["state"][0]["momentum_buffer"].astype(np.float64)
    opt.load_state_dict(saved)
    buf = opt.state[id(p)]["momentum_buffer"]
    assert buf.dtype == np.float32
    np.testing.assert_array_equal(buf, 2.0)


def test_duplicate_parameter_in_a_group_warns_like_pytorch():
    p = nn.Parameter(np.zeros(2))
    with pytest.warns(UserWarning, match="duplicate parameters") as record:
        optim.SGD([p, p], lr=0.1)
    torch = pytest.importorskip("torch")
    t = torch.nn.Parameter(torch.zeros(2))
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        torch.optim.SGD([t, t], lr=0.1)
    assert str(record[0].message) == str(theirs[0].message)
    assert record[0].filename == __file__  # points at the caller, as PyTorch's does


def test_parameter_in_two_groups_raises():
    p = nn.Parameter(np.zeros(2))
    with pytest.raises(ValueError, match="appear in more than one group"):
        optim.SGD([{"params": [p]}, {"params": [p]}], lr=0.1)


def test_foreign_parameters_are_named_in_full():
    torch = pytest.importorskip("torch")
    module = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match=r"expected numbapos\.nn\.Parameter objects, got "
                                        r"torch\.nn\.parameter\.Parameter \(convert with "
                                        r"numbapos\.nn\.Parameter\(t\.detach\(\)\.numpy\(\)\)\)"):
        optim.SGD(module.parameters(), lr=0.1)
    with pytest.raises(TypeError, match=r"got numpy\.ndarray \(wrap the array"):
        optim.SGD([np.zeros(2)], lr=0.1)
    with pytest.raises(TypeError, match="got int"):
        optim.SGD([1], lr=0.1)
    with pytest.raises(TypeError, match="ordered collection"):
        optim.SGD({nn.Parameter(np.zeros(2))}, lr=0.1)
    with pytest.raises(TypeError, match="iterable of numbapos.nn.Parameter"):
        optim.SGD(nn.Parameter(np.zeros(2)), lr=0.1)


def test_repr_is_pytorch_like():
    torch = pytest.importorskip("torch")
    p = nn.Parameter(np.zeros(2))
    ours = repr(optim.SGD([{"params": [p]}, {"params": [], "lr": 1.0}], lr=0.1,
                          momentum=0.9))
    assert ours.startswith("SGD (\nParameter Group 0\n    dampening: 0.0\n    lr: 0.1\n")
    assert "Parameter Group 1\n    dampening: 0.0\n    lr: 1.0\n" in ours
    t = torch.nn.Parameter(torch.zeros(2))
    theirs = repr(torch.optim.SGD([t], lr=0.1, momentum=0.9, dampening=0.0,
                                    weight_decay=0.0))
    mine = repr(optim.SGD([p], lr=0.1, momentum=0.9))
    shared = [line for line in theirs.splitlines()
              if line.split(":")[0].strip() in optim.SGD._OPTIONS or ":" not in line]
    assert mine.splitlines() == shared


def test_frozen_and_gradless_parameters_keep_no_state():
    a = nn.Parameter(np.zeros(2), requires_grad=False)
    b = nn.Parameter(np.zeros(2))
    a.grad = np.ones(2)
    opt = optim.SGD([a, b], lr=0.1, momentum=0.9)
    opt.step()
    assert opt.state_dict()["state"] == {}


@pytest.mark.parametrize("fuse_first", [False, True])
def test_a_fused_optimiser_steps_with_the_options_it_loads(fuse_first, rng):
    """Loading a checkpoint after fuse_with_backward replaces the options the hooks use."""
    weight = rng.normal(size=(6, 3))
    ids, grad = np.array([1, 4, 1]), np.ones((3, 3))
    saved = optim.SGD(nn.Embedding(6, 3, _weight=weight.copy()).parameters(), lr=1.0)
    emb = nn.Embedding(6, 3, sparse=True, _weight=weight.copy())
    opt = optim.SGD(emb.parameters(), lr=0.01)
    if fuse_first:
        opt.fuse_with_backward()
    opt.load_state_dict(saved.state_dict())
    if not fuse_first:
        opt.fuse_with_backward()
    emb(ids)
    emb.backward(grad)
    want = weight.copy()
    want[1] -= 2.0
    want[4] -= 1.0
    np.testing.assert_array_equal(emb.weight.data, want)
    assert opt.param_groups[0]["lr"] == 1.0
