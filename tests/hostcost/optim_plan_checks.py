"""Checks of the planned sparse SGD step and the BERT block's own dropout draw, run inside a
stub-driver process (``stub.run``), as plan_checks.py does for the lookups."""

from __future__ import annotations

import sys

import numpy as np
from plan_checks import _same_but_pointers, _spy


def _step_arrays(rng, n=64, rows=50, dim=8):
    from numba import cuda

    import numbapos.functional as F
    from numbapos.functional.capture import device_clock

    param = cuda.to_device(rng.standard_normal((rows, dim)).astype(np.float32))
    buf = cuda.to_device(np.zeros((rows, dim), np.float32))
    started = cuda.to_device(np.zeros(rows, np.bool_))
    ids = cuda.to_device(rng.integers(0, rows, n))
    grad_output = cuda.to_device(rng.standard_normal((n, dim)).astype(np.float32))

    def grad():
        return F.embedding_backward(grad_output, ids, rows, sparse=True, lazy=True)

    return param, buf, started, grad, device_clock(0.1, 0)


def check_sparse_sgd() -> dict:
    """A replayed sparse SGD step (clock tick, update, row flags) packs what the ordinary path
    packs for the same arrays; a new learning rate (a scheduler) keeps the plan; momentum 0
    is planned too."""
    import numbapos.functional as F

    optim = sys.modules["numbapos.functional.optim"]
    seen = _spy()
    param, buf, started, grad, clock = _step_arrays(np.random.default_rng(0))
    options = dict(lr=0.1, momentum=0.9, clock=clock)
    for _ in range(3):
        F.sparse_sgd_(param, grad(), buf, started, **options)
    plans = len(optim._SPARSE_SGD.cache.plans)
    same = []
    for lr in (0.1, 0.05):  # with a clock the rate is read on the device: one plan
        clock.set_lr(lr)
        g = grad()
        seen.clear()
        assert F.sparse_sgd_(param, g, buf, started, **{**options, "lr": lr}) is param
        planned = seen[:]
        seen.clear()
        optim._sparse_sgd(param, g, buf, started, lr, 0.9, 0.0, 0.0, False, False, clock, True,
                          0, 0)
        same.append(len(planned) == 3 and _same_but_pointers(planned, seen))
    for _ in range(3):
        F.sparse_sgd_(param, grad(), lr=0.1, clock=clock)  # momentum 0: no state
    return {"same": same, "plans": plans,
            "after": len(optim._SPARSE_SGD.cache.plans)}


def check_sparse_sgd_errors() -> dict:
    """Through a plan: an overlapping state raises the ordinary path's error, as does a pending
    index error and an option the checks refuse (an equal key of another type)."""
    import numbapos.functional as F
    from numbapos.kernels.cuda import errors

    param, buf, started, grad, clock = _step_arrays(np.random.default_rng(1), rows=40)
    for _ in range(3):
        F.sparse_sgd_(param, grad(), buf, started, lr=1.0, momentum=1.0, clock=clock)
    messages = []
    overlapping = buf.reshape(buf.size).view(np.bool_)[:40]  # flags inside the buffer
    for bad in (dict(momentum_buffer=param), dict(row_started=overlapping), dict(momentum=True)):
        try:
            F.sparse_sgd_(param, grad(), **{"momentum_buffer": buf, "row_started": started,
                                            "lr": 1.0, "momentum": 1.0, "clock": clock, **bad})
        except (TypeError, ValueError) as err:
            messages.append(f"{type(err).__name__}: {err}")
    host = errors.host_word_view()
    host[:4] = (5, 99, 40, errors.tag())
    try:
        F.sparse_sgd_(param, grad(), buf, started, lr=1.0, momentum=1.0, clock=clock)
    except IndexError as err:
        messages.append(f"IndexError: {err}")
    F.sparse_sgd_(param, grad(), buf, started, lr=1.0, momentum=1.0, clock=clock)  # cleared
    return {"messages": messages}


def check_sparse_sgd_streams() -> dict:
    """A sparse SGD plan is never replayed on another stream: there the step records anew."""
    from numba import cuda

    import numbapos
    import numbapos.functional as F
    from numbapos._gpuhost import plans as plans_module

    optim = sys.modules["numbapos.functional.optim"]
    seen = _spy()
    param, buf, started, grad, clock = _step_arrays(np.random.default_rng(2), rows=33)
    side = cuda.stream()
    handles = []
    for stream in (None, side):
        with numbapos.cuda.stream(stream) if stream is not None else _Nothing():
            for _ in range(3):
                F.sparse_sgd_(param, grad(), buf, started, lr=0.1, momentum=0.5, clock=clock)
            seen.clear()
            F.sparse_sgd_(param, grad(), buf, started, lr=0.1, momentum=0.5, clock=clock)
            handles.append({launch[-1] for launch in seen})
    table = plans_module.signature(param)  # the number of the table's signature
    plans = [key for key in optim._SPARSE_SGD.cache.plans if key[1][0] == table]
    return {"plans": len(plans), "default stream": sorted(handles[0]),
            "side stream": handles[1] == {int(side.handle)}}


def _fused_sgd_module(seed):
    """``(emb, opt, ids, grad, rng)``: a sparse CUDA ``nn.Embedding(60, 8)`` whose SGD
    (momentum 0.9) is fused with its backward, a batch of (4, 5) ids with its gradient, and
    the generator that drew them."""
    from numba import cuda

    from numbapos import nn, optim

    rng = np.random.default_rng(seed)
    emb = nn.Embedding(60, 8, sparse=True, device="cuda")
    opt = optim.SGD(emb.parameters(), lr=0.1, momentum=0.9)
    opt.fuse_with_backward()
    ids = cuda.to_device(rng.integers(0, 60, (4, 5)))
    grad = cuda.to_device(rng.standard_normal((4, 5, 8)).astype(np.float32))
    return emb, opt, ids, grad, rng


def check_optimizer_checks() -> dict:
    """The fused SGD step of a module: its checks skipped only while they read the same; a
    state array of another shape still raises the ordinary message."""
    from numba import cuda


    emb, opt, ids, grad, _ = _fused_sgd_module(4)
    for _ in range(4):
        emb(ids)
        emb.backward(grad)
    state = opt.state[id(emb.weight)]
    state["momentum_buffer"] = cuda.to_device(np.zeros((61, 8), np.float32))
    emb(ids)
    try:
        emb.backward(grad)
    except ValueError as err:
        return {"message": str(err), "memo": len(opt._checked)}
    return {"message": None}


def check_fused_replays() -> dict:
    """The fused SGD step of a module replays (straight to the update) while everything the
    checks and the update read is unchanged, launching what the full step launches; a new
    rate (set on the clock), a new momentum, a loaded state_dict and a replaced table each
    take effect, and the replays hold no array alive."""
    import gc
    import weakref

    from numba import cuda


    emb, opt, ids, grad, rng = _fused_sgd_module(6)
    group, weight = opt.param_groups[0], emb.weight
    replays = []
    original = opt._replay

    def replay(param, group):
        replays.append(original(param, group))
        return replays[-1]

    opt._replay = replay
    seen = _spy()

    def step():
        seen.clear()
        emb(ids)
        emb.backward(grad)
        assert weight.grad is None
        return seen[:]

    def replayed_as_full():  # a replay, then the full step on the same state: one launch list
        replayed = step()
        opt._replays.clear()
        full = step()
        return replays[-2:] == [True, False] and _same_but_pointers(replayed, full)

    found = {}
    for _ in range(3):
        step()
    found["first"] = replays[:]  # the state made, then checked with it, then replayed
    found["same"] = replayed_as_full()
    step()
    group["lr"] = 0.05  # a scheduler: still replayed, the clock's rate set
    step()
    found["rate"] = [replays[-1], opt._clocks[id(weight)].lr]
    group["momentum"] = 0.5
    step()
    found["momentum"] = [replays[-1], any(0.5 in values for values, *_ in seen),
                         replayed_as_full()]
    opt.load_state_dict(opt.state_dict())
    step()
    found["loaded"] = replays[-1]
    step()
    old = weakref.ref(weight.data)
    weight.data = cuda.to_device(rng.standard_normal((60, 8)).astype(np.float32))
    gc.collect()
    found["old table kept"] = old() is not None
    step()
    found["new table"] = [replays[-1], replayed_as_full()]
    return found


def check_bert_draw() -> dict:
    """nn.BertEmbeddings on CUDA: the dropout draw is one of the planned forward's launches,
    its counter in the forward's block, and the host's counts advance once per forward."""
    from numba import cuda

    from numbapos import nn

    blocks = sys.modules["numbapos.functional.blocks"]
    seen = _spy()
    block = nn.BertEmbeddings(100, 16, 32, hidden_dropout_prob=0.1, seed=0,
                              device="cuda").train()
    ids = cuda.to_device(np.random.default_rng(5).integers(0, 100, (2, 7)))
    for _ in range(3):
        block(ids)
        block._saved_context()
        block._release()
    seen.clear()
    y = block(ids)
    launches = len(seen)
    drop = block._saved_context()[4]
    start, counter = y.device_ctypes_pointer.value, drop["counter"].device_ctypes_pointer.value
    return {"launches": launches, "in the block": start < counter < start + 2 * y.nbytes,
            "counters": [int(block.dropout._buffers["counter"]),
                         block.dropout._device_counter().host],
            "plans": len(blocks._BERT_FORWARDS.cache.plans)}


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
