"""Captured training steps (issue 19, item 6): ``numbapos.cuda.capture`` and replays.

On Numba's CUDA simulator there are no graphs: the captured call runs eagerly
under the capture's checks and each replay calls the step again, so these
tests check what does not depend on the graph itself: replays give the bits of
the eager steps (and of the CPU), the device-resident step counts and learning
rates advance and are obeyed, so do the dropout counters (nn.Dropout, the
BERT / GPT-2 blocks: fresh masks at each replay) and the rounding steps of
float16 tables, whose host counts stay exact; a replay makes no host round
trip, and a step that needs the host while captured raises a clear
RuntimeError. (A real GPU
additionally checks that the graph replays the same kernels: run this file
with ``NUMBA_ENABLE_CUDASIM=0`` there.)
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_counts import count_cuda_traffic

import numbapos
from numbapos import nn, optim

pytestmark = [
    pytest.mark.skipif(not numbapos.cuda_available(), reason="needs CUDA or its simulator"),
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

V, D, N = 9, 4, 5
BATCHES = np.array([[1, 4, 4, 0, 8], [2, 2, 7, 1, 3], [8, 0, 5, 5, 5], [6, 1, 2, 3, 4],
                    [0, 0, 1, 7, 7], [3, 8, 6, 2, 2]])
GRAD = np.linspace(-1.0, 1.0, N * D, dtype=np.float32).reshape(N, D)


def _setup(device, make_opt):
    """A sparse embedding and a dense bias, their optimiser, and static input / gradient."""
    rng = np.random.default_rng(7)
    emb = nn.Embedding(V, D, sparse=True, device=device)
    emb.weight.data = numbapos.to_device(rng.standard_normal((V, D)).astype(np.float32), device)
    bias = nn.Parameter(numbapos.to_device(rng.standard_normal(D).astype(np.float32), device))
    opt = make_opt([emb.weight, bias])
    ids = numbapos.to_device(BATCHES[0].copy(), device)
    grad = numbapos.to_device(GRAD, device)

    def step():
        y = emb(ids)
        emb.backward(grad)
        bias.grad = grad[0]  # a dense gradient, read on the device
        opt.step()
        emb.zero_grad()
        bias.grad = None
        return y

    return emb, bias, opt, ids, step


def _state(emb, bias, opt):
    state = opt.state_dict()["state"]
    return [numbapos.to_host(emb.weight.data), numbapos.to_host(bias.data)] + [
        np.asarray(v) for k in sorted(state) for _, v in sorted(state[k].items())]


def _set_batch(device, ids, batch):
    if device == "cuda":
        ids.copy_to_device(batch)
    else:
        ids[...] = batch


OPTIMISERS = {
    "adam": lambda p: optim.Adam(p, lr=0.05, betas=(0.8, 0.9)),
    "adamw": lambda p: optim.AdamW(p, lr=0.05, weight_decay=0.1),
    "sgd_momentum": lambda p: optim.SGD(p, lr=0.1, momentum=0.9),
    "adagrad": lambda p: optim.Adagrad(p, lr=0.1, lr_decay=0.01),
    "rowwise_adagrad": lambda p: optim.RowWiseAdagrad(p[:1], lr=0.1),
}


def _eager(device, make_opt, schedule=None):
    emb, bias, opt, ids, step = _setup(device, make_opt)
    outputs = []
    for i, batch in enumerate(BATCHES):
        if schedule is not None:
            opt.param_groups[0]["lr"] = schedule(i)
        _set_batch(device, ids, batch)
        outputs.append(numbapos.to_host(step()))
    return outputs, _state(emb, bias, opt)


# Each optimiser's CPU and simulated kernels cost seconds: by default Adam, SGD with
# momentum and row-wise Adagrad (AdamW is Adam's kernel with decoupled decay; Adagrad's
# captured step runs by default on a 16-bit table below); those two under the
# exhaustive marker.
@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.exhaustive if name in ("adamw", "adagrad") else ())
    for name in sorted(OPTIMISERS)])
def test_replays_give_the_bits_of_the_eager_steps_and_of_the_cpu(name):
    make_opt = OPTIMISERS[name]
    # The capture takes two steps on the batch in the inputs (the warm-up's and the
    # captured call's); replays then take one per batch copied in.
    sequence = np.concatenate([BATCHES[:1], BATCHES[:1], BATCHES[2:]])
    emb, bias, opt, ids, step = _setup("cuda", make_opt)
    captured = numbapos.cuda.capture(step, warmup=1)
    outputs = [numbapos.to_host(captured.outputs)]
    for batch in sequence[2:]:
        ids.copy_to_device(batch)
        captured.replay()
        outputs.append(numbapos.to_host(captured.outputs))
    emb2, bias2, opt2, ids2, step2 = _setup("cuda", make_opt)
    expected = []
    for batch in sequence:
        ids2.copy_to_device(batch)
        expected.append(numbapos.to_host(step2()))
    for got, want in zip(outputs, expected[1:], strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(_state(emb, bias, opt), _state(emb2, bias2, opt2), strict=True):
        np.testing.assert_array_equal(got, want)
    # The eager CUDA steps (device clocks included) match the CPU bit for bit (the
    # same sequence of batches on the CPU: no third run on the simulator).
    emb3, bias3, opt3, ids3, step3 = _setup("cpu", make_opt)
    on_cpu = []
    for batch in sequence:
        ids3[...] = batch
        on_cpu.append(np.array(step3()))
    for got, want in zip(_state(emb2, bias2, opt2) + expected,
                         _state(emb3, bias3, opt3) + on_cpu, strict=True):
        np.testing.assert_array_equal(got, want)


def test_device_step_counts_advance_over_replays():
    emb, bias, opt, ids, step = _setup("cuda", OPTIMISERS["adam"])
    captured = numbapos.cuda.capture(step, warmup=2)
    for _ in range(3):
        captured.replay()
    steps = {k: v["step"] for k, v in opt.state_dict()["state"].items()}
    assert steps == {0: 2 + 1 + 3, 1: 2 + 1 + 3}
    clock = opt._clocks[id(emb.weight)]
    assert clock.step() == 6


def test_a_learning_rate_set_between_replays_is_obeyed():
    def schedule(i):
        return 0.05 * 0.5 ** i

    make_opt = OPTIMISERS["adam"]
    # (the CPU's bits: the test above checks the CUDA steps give them)
    _, want = _eager("cpu", make_opt, schedule)
    emb, bias, opt, ids, step = _setup("cuda", make_opt)
    opt.param_groups[0]["lr"] = schedule(0)
    captured = numbapos.cuda.capture(step, warmup=1)  # steps 0 and 1, both at schedule(0)
    # Rebuild the expectation for that sequence: lr(0) twice, then lr(2), lr(3), ... (on
    # the CPU, whose bits the eager CUDA steps give: no second simulated run)
    emb2, bias2, opt2, ids2, step2 = _setup("cpu", make_opt)
    for i in range(len(BATCHES)):
        opt2.param_groups[0]["lr"] = schedule(0 if i < 2 else i)
        ids2[...] = BATCHES[0] if i < 2 else BATCHES[i]
        step2()
    for i in range(2, len(BATCHES)):
        opt.param_groups[0]["lr"] = schedule(i)
        ids.copy_to_device(BATCHES[i])
        captured.replay()
    for got, expected in zip(_state(emb, bias, opt), _state(emb2, bias2, opt2), strict=True):
        np.testing.assert_array_equal(got, expected)
    assert not all(np.array_equal(a, b) for a, b in
                   zip(_state(emb, bias, opt), want, strict=True))  # the schedule mattered


def _simulated() -> bool:
    from numba import config

    return bool(config.ENABLE_CUDASIM)


@pytest.mark.skipif(not _simulated(), reason="counts traffic on the simulator")
def test_a_replay_makes_no_host_round_trip():
    emb, bias, opt, ids, step = _setup("cuda", OPTIMISERS["sgd_momentum"])
    captured = numbapos.cuda.capture(step)
    with count_cuda_traffic() as c:
        captured.replay()
    assert (c.device_to_host, c.synchronizations, c.host_to_device) == (0, 0, 0), str(c)


@pytest.mark.parametrize("what, match", [
    ("to_host", "a synchronisation"),
    ("host_rows", "a copy from the host to the device"),
    ("dropout", "training-mode dropout with an integer counter"),
    ("dropout_module_first_use", "making a dropout counter on the device"),
    ("synchronize", "a synchronisation"),
])
def test_a_host_round_trip_inside_the_step_raises(what, match):
    from numbapos._gpuhost import streams

    emb, bias, opt, ids, step = _setup("cuda", OPTIMISERS["sgd_momentum"])
    drop = nn.Dropout(0.5, seed=1)
    warm = [True]

    def bad_step():
        y = step()
        if warm[0]:
            warm[0] = False
            return y
        if what == "to_host":
            numbapos.to_host(y)
        elif what == "host_rows":
            emb.weight.grad = numbapos.SparseRows(np.array([1, 2]), grad[:2], V)
            opt.step()
        elif what == "dropout":
            numbapos.functional.dropout(y, 0.5, seed=1, counter=3)
        elif what == "dropout_module_first_use":
            drop(y)  # its counter is made on the device here, not in the warm-up
        else:
            numbapos.synchronize()
        return y

    grad = numbapos.to_device(GRAD, "cuda")
    with pytest.raises(RuntimeError, match=f"numbapos.cuda.capture: {match}.*captured step"):
        numbapos.cuda.capture(bad_step)
    assert streams.capturing() is None and numbapos.cuda.current_stream() == 0
    numbapos.cuda.capture(step).replay()  # nothing left behind: a later capture works


def test_bad_arguments():
    with pytest.raises(TypeError, match="step: expected a callable"):
        numbapos.cuda.capture(3)
    for warmup in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="warmup: expected an int >= 1"):
            numbapos.cuda.capture(lambda: None, warmup=warmup)


def _failing_step(how):
    """The test's step, whose captured call (the second call) fails: raising its own
    error (``raise``), or making a CUDA call a capture refuses (``sync``, Numba's own
    synchronisation, past numbapos's checks)."""
    emb, bias, opt, ids, step = _setup("cuda", OPTIMISERS["sgd_momentum"])
    calls = [0]

    def failing():
        y = step()
        calls[0] += 1
        if calls[0] == 2:
            if how == "raise":
                raise KeyError("the step's own error")
            from numba import cuda

            cuda.synchronize()
        return y

    return failing, step


def _nothing_left_behind(step):
    """No capture in progress, eager work (a synchronisation and a copy back included)
    and a new capture work (while the caller still handles the failure)."""
    from numbapos._gpuhost import streams

    assert streams.capturing() is None and numbapos.cuda.current_stream() == 0
    y = step()
    numbapos.synchronize()
    numbapos.to_host(y)
    numbapos.cuda.capture(step).replay()
    numbapos.synchronize()


def test_a_step_failing_while_captured_raises_its_own_error_and_leaves_nothing_behind():
    failing, step = _failing_step("raise")
    with pytest.raises(KeyError, match="the step's own error"):
        try:
            numbapos.cuda.capture(failing)
        except KeyError:
            _nothing_left_behind(step)  # while the error (and its traceback) lives
            raise


@pytest.mark.skipif(_simulated(), reason="the simulator has no stream capture to refuse")
def test_a_cuda_call_the_capture_refuses_raises_and_ends_the_capture():
    # Numba's cuCtxSynchronize from the capturing thread: the capture refuses it and is
    # invalidated; numbapos ends it before raising (the stub driver checks the same under
    # every memory manager: tests/hostcost/test_capture_stub.py).
    failing, step = _failing_step("sync")
    with pytest.raises(RuntimeError, match=r"numbapos.cuda.capture: the step made a CUDA "
                                           r"call that a captured step cannot contain .*"
                                           r"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"):
        try:
            numbapos.cuda.capture(failing)
        except RuntimeError:
            _nothing_left_behind(step)
            raise


def test_captures_do_not_nest():
    inner = []

    def step():
        from numbapos._gpuhost import streams

        if streams.capturing() is not None:
            with pytest.raises(RuntimeError, match="captures do not nest"):
                numbapos.cuda.capture(lambda: None)
            inner.append(True)

    numbapos.cuda.capture(step)
    assert inner == [True]


def test_a_clock_is_for_cuda_parameters_only():
    from numbapos import functional as F

    param = np.zeros((2, 2), np.float32)
    with pytest.raises(TypeError, match="clock: an optimiser clock keeps the step on the GPU"):
        F.sgd_(param, np.ones((2, 2), np.float32), lr=0.1, clock=object())


def _bert_setup():
    block = nn.BertEmbeddings(V, D, max_position_embeddings=8, hidden_dropout_prob=0.0, seed=3,
                              device="cuda")
    opt = optim.AdamW(block.parameters(), lr=0.02)
    ids = numbapos.to_device(BATCHES[0].reshape(1, N).copy(), "cuda")
    grad = numbapos.to_device(GRAD.reshape(1, N, D), "cuda")

    def step():
        y = block(ids)
        block.backward(grad)
        opt.step()
        block.zero_grad()
        return y

    return block, opt, ids, step


# The BERT block's captured step runs by default with dropout (SGD) below; this AdamW
# variant under the exhaustive marker.
@pytest.mark.exhaustive
def test_a_bert_block_step_replays_with_the_eager_bits():
    # The fused block kernels (gather + sum + LayerNorm, its backward and partial sums)
    # and AdamW's dense steps on every table, captured and replayed.
    block, opt, ids, step = _bert_setup()
    captured = numbapos.cuda.capture(step, warmup=1)
    block2, opt2, ids2, step2 = _bert_setup()
    step2()
    step2()
    for batch in BATCHES[2:4]:
        ids.copy_to_device(batch.reshape(1, N))
        ids2.copy_to_device(batch.reshape(1, N))
        captured.replay()
        expected = step2()
        np.testing.assert_array_equal(numbapos.to_host(captured.outputs),
                                      numbapos.to_host(expected))
    for (name, p), (_, q) in zip(block.named_parameters(), block2.named_parameters(),
                                 strict=True):
        np.testing.assert_array_equal(numbapos.to_host(p.data), numbapos.to_host(q.data), name)


def test_a_bad_id_met_by_the_warm_up_raises_its_index_error():
    emb, bias, opt, ids, step = _setup("cuda", OPTIMISERS["sgd_momentum"])
    before = numbapos.to_host(emb.weight.data)
    ids.copy_to_device(np.array([1, 2, 99, 0, 1]))
    with pytest.raises(IndexError, match="index 99"):
        numbapos.cuda.capture(step)
    assert numbapos.cuda.current_stream() == 0
    np.testing.assert_array_equal(numbapos.to_host(emb.weight.data), before)


# ---------------------------------------------------------------- dropout in a captured step


def _dropout_setup(device):
    """An embedding followed by nn.Dropout, SGD, static ids and gradient."""
    rng = np.random.default_rng(11)
    emb = nn.Embedding(V, D, device=device)
    emb.weight.data = numbapos.to_device(rng.standard_normal((V, D)).astype(np.float32), device)
    drop = nn.Dropout(0.5, seed=5)
    opt = optim.SGD(emb.parameters(), lr=0.1)
    ids = numbapos.to_device(BATCHES[0].copy(), device)
    grad = numbapos.to_device(GRAD, device)

    def step():
        y = drop(emb(ids))
        emb.backward(drop.backward(grad))
        opt.step()
        emb.zero_grad()
        return y

    return emb, drop, ids, step


def test_dropout_replays_draw_the_masks_of_the_eager_steps_and_of_the_cpu():
    emb, drop, ids, step = _dropout_setup("cuda")
    captured = numbapos.cuda.capture(step, warmup=1)
    outputs = [numbapos.to_host(captured.outputs)]
    for batch in BATCHES[2:]:
        ids.copy_to_device(batch)
        captured.replay()
        outputs.append(numbapos.to_host(captured.outputs))
    assert drop.counter == len(BATCHES)  # the host counts replays, reading nothing back
    assert int(drop.state_dict()["counter"]) == len(BATCHES)
    # Against the same steps on the CPU, whose masks and bits the eager CUDA steps give
    # (tests/ops/test_dropout.py): no second simulated run.
    for device in ("cpu",):
        emb2, drop2, ids2, step2 = _dropout_setup(device)
        expected = []
        for batch in np.concatenate([BATCHES[:1], BATCHES[:1], BATCHES[2:]]):
            _set_batch(device, ids2, batch)
            expected.append(numbapos.to_host(step2()))
        for got, want in zip(outputs, expected[1:], strict=True):
            np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(numbapos.to_host(emb.weight.data),
                                      numbapos.to_host(emb2.weight.data))
        assert drop2.counter == drop.counter
    # Masks differ from step to step (a baked counter would repeat the captured one).
    assert not np.array_equal(outputs[1] != 0, outputs[2] != 0)
    # The device's counter agrees with the host's.
    counter = drop._device_counter()
    assert int(numbapos.to_host(counter.values)[0]) == drop.counter


def test_a_dropout_counter_set_between_replays_is_obeyed():
    emb, drop, ids, step = _dropout_setup("cuda")
    captured = numbapos.cuda.capture(step)
    drop.counter = 40
    captured.replay()
    assert drop.counter == 41
    emb2, drop2, ids2, step2 = _dropout_setup("cpu")
    step2()
    step2()
    drop2.counter = 40
    want = step2()
    np.testing.assert_array_equal(numbapos.to_host(captured.outputs), want)
    np.testing.assert_array_equal(numbapos.to_host(emb.weight.data), emb2.weight.data)


def test_each_backward_uses_the_counter_of_its_own_forward():
    # Two forwards, then their backwards in LIFO order: the mask of each forward.
    got = {}
    for device in ("cuda", "cpu"):
        drop = nn.Dropout(0.5, seed=9)
        x = numbapos.to_device(np.arange(1, 21, dtype=np.float32).reshape(4, 5), device)
        g = numbapos.to_device(np.ones((4, 5), np.float32), device)
        y1, y2 = drop(x), drop(x)
        got[device] = [numbapos.to_host(a) for a in (y1, y2, drop.backward(g), drop.backward(g))]
        assert drop.counter == 2
    for a, b in zip(got["cuda"], got["cpu"], strict=True):
        np.testing.assert_array_equal(a, b)
    y1, y2, g2, g1 = got["cuda"]
    np.testing.assert_array_equal(g2 != 0, y2 != 0)
    np.testing.assert_array_equal(g1 != 0, y1 != 0)
    assert not np.array_equal(y1 != 0, y2 != 0)


def test_a_failed_forward_does_not_advance_the_counter():
    drop = nn.Dropout(0.5, seed=2)
    x = numbapos.to_device(np.ones((3, 4), np.float32), "cuda")
    drop(x)
    with pytest.raises(ValueError):
        drop(x, out=numbapos.to_device(np.ones((2, 4), np.float32), "cuda"))
    assert drop.counter == 1
    y = drop(x)  # the device's counter (advanced by the failed draw) is set back first
    cpu = nn.Dropout(0.5, seed=2)
    cpu(np.ones((3, 4), np.float32))
    np.testing.assert_array_equal(numbapos.to_host(y), cpu(np.ones((3, 4), np.float32)))


def test_a_device_counter_array_selects_the_mask_of_its_value():
    from numbapos import functional as F

    x = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)
    counter = numbapos.to_device(np.array([7], np.uint64), "cuda")
    got = F.dropout(numbapos.to_device(x, "cuda"), 0.3, 4, counter=counter)
    np.testing.assert_array_equal(numbapos.to_host(got), F.dropout(x, 0.3, 4, counter=7))
    mask = F.dropout_mask((4, 6), 0.3, 4, counter=counter, device="cuda")
    np.testing.assert_array_equal(numbapos.to_host(mask),
                                  F.dropout_mask((4, 6), 0.3, 4, counter=7))
    with pytest.raises(TypeError, match="counter: a device counter"):
        F.dropout(x, 0.3, 4, counter=counter)
    with pytest.raises(ValueError, match="counter: a device counter must be"):
        F.dropout(numbapos.to_device(x, "cuda"), 0.3, 4,
                  counter=numbapos.to_device(np.array([7, 8], np.uint64), "cuda"))


@pytest.mark.skipif(not _simulated(), reason="counts traffic on the simulator")
def test_a_dropout_replay_and_an_eager_dropout_forward_make_no_host_round_trip():
    emb, drop, ids, step = _dropout_setup("cuda")
    x = numbapos.to_device(np.ones((N, D), np.float32), "cuda")
    drop.backward(drop(x))
    with count_cuda_traffic() as c:
        drop.backward(drop(x))
    assert (c.device_to_host, c.synchronizations, c.host_to_device) == (0, 0, 0), str(c)
    assert c.kernels == ["_draw", "_dropout_apply", "_dropout_apply"], str(c)
    captured = numbapos.cuda.capture(step)
    with count_cuda_traffic() as c:
        captured.replay()
    assert (c.device_to_host, c.synchronizations, c.host_to_device) == (0, 0, 0), str(c)


def _block_setup(kind, device):
    if kind == "bert":
        block = nn.BertEmbeddings(V, D, max_position_embeddings=8, hidden_dropout_prob=0.5,
                                  seed=3, device=device)
    else:
        block = nn.GPT2Embeddings(V, 8, D, embd_pdrop=0.5, seed=3, device=device)
    opt = optim.SGD(block.parameters(), lr=0.1)
    ids = numbapos.to_device(BATCHES[0].reshape(1, N).copy(), device)
    grad = numbapos.to_device(GRAD.reshape(1, N, D), device)

    def step():
        y = block(ids)
        block.backward(grad)
        opt.step()
        block.zero_grad()
        return y

    return block, ids, step


def _same(kind, device, got, want, name=""):
    """Bits equal, but for BERT against the CPU: its LayerNorm moments agree to a few ulp
    (kernels/cuda/blocks.py), its dropout mask exactly."""
    if kind == "bert" and device == "cpu":
        np.testing.assert_array_equal(got == 0, want == 0, name)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
    else:
        np.testing.assert_array_equal(got, want, f"{device} {name}")


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_a_block_with_dropout_replays_with_the_eager_bits_and_the_cpus(kind):
    block, ids, step = _block_setup(kind, "cuda")
    captured = numbapos.cuda.capture(step, warmup=1)
    twins = {device: _block_setup(kind, device) for device in ("cuda", "cpu")}
    for _, _, step2 in twins.values():
        step2()
        step2()
    for batch in BATCHES[2:4]:
        ids.copy_to_device(batch.reshape(1, N))
        captured.replay()
        got = numbapos.to_host(captured.outputs)
        for device, (_, ids2, step2) in twins.items():
            _set_batch(device, ids2, batch.reshape(1, N))
            _same(kind, device, got, numbapos.to_host(step2()))
    for device, (block2, _, _) in twins.items():
        for (name, p), (_, q) in zip(block.named_parameters(), block2.named_parameters(),
                                     strict=True):
            _same(kind, device, numbapos.to_host(p.data), numbapos.to_host(q.data), name)
        assert block.state_dict()[next(k for k in block.state_dict()
                                       if k.endswith("counter"))] == 4


# ---------------------------------------------------------------- 16-bit tables


def _half_setup(device, make_opt, sparse):
    """A float16 table (sparse or dense gradient), its optimiser, static ids and gradient."""
    rng = np.random.default_rng(13)
    emb = nn.Embedding(V, D, sparse=sparse, dtype=np.float16)
    emb.weight.data = (rng.standard_normal((V, D)) * 3).astype(np.float16)
    emb.to(device)
    opt = make_opt(emb.parameters())
    ids = numbapos.to_device(BATCHES[0].copy(), device)
    grad = numbapos.to_device(GRAD, device)

    def step():
        y = emb(ids)
        emb.backward(grad)
        opt.step()
        emb.zero_grad()
        return y

    return emb, opt, ids, step


HALF_CASES = {
    "sparse_adam": (lambda p: optim.Adam(p, lr=0.05, seed=3), True),
    "sparse_sgd_momentum": (lambda p: optim.SGD(p, lr=0.1, momentum=0.9, seed=3), True),
    "sparse_rowwise_adagrad": (lambda p: optim.RowWiseAdagrad(p, lr=0.1, seed=3), True),
    "dense_adam": (lambda p: optim.Adam(p, lr=0.05, seed=3), False),
    "dense_adagrad": (lambda p: optim.Adagrad(p, lr=0.1, lr_decay=0.01, seed=3), False),
}


# By default one sparse and one dense case (Adam's and Adagrad's kernels); the other
# optimisers' 16-bit captured steps under the exhaustive marker.
@pytest.mark.parametrize("name", [
    pytest.param(name, marks=() if name in ("sparse_adam", "dense_adagrad")
                 else pytest.mark.exhaustive)
    for name in sorted(HALF_CASES)])
def test_a_16_bit_table_step_replays_with_the_eager_bits_and_the_cpus(name):
    make_opt, sparse = HALF_CASES[name]
    emb, opt, ids, step = _half_setup("cuda", make_opt, sparse)
    captured = numbapos.cuda.capture(step, warmup=1)
    outputs = [numbapos.to_host(captured.outputs)]
    for batch in BATCHES[2:]:
        ids.copy_to_device(batch)
        captured.replay()
        outputs.append(numbapos.to_host(captured.outputs))
    state = opt.state_dict()["state"][0]
    assert state["rounding_step"] == len(BATCHES)  # counted on the host, replays included
    counter = opt._rounding_counter(emb.weight)
    assert int(numbapos.to_host(counter.values)[0]) == len(BATCHES)
    sequence = np.concatenate([BATCHES[:1], BATCHES[:1], BATCHES[2:]])
    for device in ("cuda", "cpu"):
        emb2, opt2, ids2, step2 = _half_setup(device, make_opt, sparse)
        expected = []
        for batch in sequence:
            _set_batch(device, ids2, batch)
            expected.append(numbapos.to_host(step2()))
        for got, want in zip(outputs, expected[1:], strict=True):
            np.testing.assert_array_equal(got, want, device)
        np.testing.assert_array_equal(numbapos.to_host(emb.weight.data).view(np.uint16),
                                      numbapos.to_host(emb2.weight.data).view(np.uint16), device)
        state2 = opt2.state_dict()["state"][0]
        for key in sorted(state2):
            np.testing.assert_array_equal(np.asarray(state[key]), np.asarray(state2[key]),
                                          f"{device} {key}")


def test_a_16_bit_rounding_step_set_between_replays_is_obeyed():
    make_opt, sparse = HALF_CASES["sparse_adam"]
    emb, opt, ids, step = _half_setup("cuda", make_opt, sparse)
    captured = numbapos.cuda.capture(step)
    opt.state[id(emb.weight)]["rounding_step"] = 50
    captured.replay()
    assert opt.state[id(emb.weight)]["rounding_step"] == 51
    emb2, opt2, ids2, step2 = _half_setup("cpu", make_opt, sparse)
    step2()
    step2()
    opt2.state[id(emb2.weight)]["rounding_step"] = 50
    step2()
    np.testing.assert_array_equal(numbapos.to_host(emb.weight.data).view(np.uint16),
                                  emb2.weight.data.view(np.uint16))


def test_an_integer_rounding_step_in_a_captured_step_raises():
    from numbapos import functional as F

    table = numbapos.to_device(np.ones((V, D), np.float16), "cuda")
    wide = numbapos.to_device(np.ones((V, D), np.float32), "cuda")
    F.store_rounded_(table, wide, seed=1, step=2)  # eager: fine

    def step():
        F.store_rounded_(table, wide, seed=1, step=2)

    with pytest.raises(RuntimeError, match="stochastic rounding with an integer rounding_step"):
        numbapos.cuda.capture(step)


@pytest.mark.skipif(not _simulated(), reason="counts traffic on the simulator")
def test_a_16_bit_table_replay_makes_no_host_round_trip():
    make_opt, sparse = HALF_CASES["sparse_adam"]
    emb, opt, ids, step = _half_setup("cuda", make_opt, sparse)
    captured = numbapos.cuda.capture(step)
    with count_cuda_traffic() as c:
        captured.replay()
    assert (c.device_to_host, c.synchronizations, c.host_to_device) == (0, 0, 0), str(c)
