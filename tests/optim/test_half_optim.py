"""Sparse optimiser steps on bfloat16 / float16 tables, fused in one pass per step.

Each step must give the bits of the composition it replaces: widen the table
to float32 (``widen_table``), run the float32 sparse update with float32 state,
store the listed rows back rounded (``store_rounded_``, keyed by ``(seed,
step, row * D + column)``): for every optimiser and option branch, summed and
unsummed (fused with the lookup's gradient) rows, stochastic and nearest
rounding, 1 and 2 threads, on the CPU and on CUDA (the simulator without a
GPU). And it must never allocate a float32 copy of the table.
"""

import tracemalloc

import numpy as np
import pytest
from conftest import host, on

import numbapos
from numbapos import functional as F
from numbapos import nn
from numbapos.sparse import SparseRows

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
HALVES = [BF16, F16]
V, D = 13, 7

# (functional op, its options, the state it takes: name -> shape "table" | "rows" | "flags")
SPARSE_CASES = [
    ("sparse_sgd_", dict(lr=0.1), {}),
    ("sparse_sgd_", dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01),
     {"momentum_buffer": "table", "row_started": "flags"}),
    ("sparse_sgd_", dict(lr=0.1, momentum=0.9, nesterov=True, maximize=True),
     {"momentum_buffer": "table", "row_started": "flags"}),
    ("sparse_sgd_", dict(lr=0.1, weight_decay=0.05, maximize=True), {}),
    ("sparse_adam_", dict(lr=0.01), {"exp_avg": "table", "exp_avg_sq": "table"}),
    ("sparse_adam_", dict(lr=0.01, weight_decay=0.1, maximize=True),
     {"exp_avg": "table", "exp_avg_sq": "table"}),
    ("sparse_adam_", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
     {"exp_avg": "table", "exp_avg_sq": "table"}),
    ("sparse_adagrad_", dict(lr=0.1, lr_decay=0.01), {"state_sum": "table"}),
    ("sparse_adagrad_", dict(lr=0.1, maximize=True), {"state_sum": "table"}),
    ("sparse_rowwise_adagrad_", dict(lr=0.1), {"state_sum": "rows"}),
    ("sparse_rowwise_adagrad_", dict(lr=0.1, weight_decay=0.1, weight_decay_mode="l2"),
     {"state_sum": "rows"}),
    ("sparse_rowwise_adagrad_", dict(lr=0.1, weight_decay=0.1, weight_decay_mode="decoupled"),
     {"state_sum": "rows"}),
]
STEPPED = {"sparse_adam_", "sparse_adagrad_"}  # ops that take the optimiser's step count


def _case_id(case):
    name, options, _ = case
    return name[7:-1] + "".join(f",{k}={v}" for k, v in options.items())


def _bits(x):
    return np.ascontiguousarray(host(x)).view(np.uint16)


def _state(kind, rng):
    if kind == "flags":
        return np.zeros(V, np.bool_)
    shape = (V, D) if kind == "table" else (V,)
    return np.abs(rng.normal(size=shape)).astype(np.float32) * 0.1


def _steps(rng, steps=3):
    """Per step: ids with repeats and a padding id (0), and the lookup's gradient."""
    out = []
    for _ in range(steps):
        ids = rng.integers(0, V, size=(4, 3))
        ids[0, 0] = 0
        out.append((ids, (rng.normal(size=(4, 3, D)) * 2).astype(np.float32)))
    return out


def _gradient(device, ids, grad_out, summed):
    """The SparseRows of a lookup's gradient (padding row 0): summed, or left for the
    update to sum (lazy)."""
    grad = F.embedding_backward(on(device, grad_out), on(device, ids), V, padding_idx=0,
                                sparse=True, lazy=not summed)
    return grad.materialize() if summed else grad


def _run(device, dtype, case, summed, stochastic, seed=7):
    """``(fused, composed)``: the table and state after 3 steps, each way."""
    name, options, kinds = case
    op = getattr(F, name)
    rng = np.random.default_rng(5)
    table = (rng.normal(size=(V, D)) * 3).astype(dtype)
    states = {n: _state(kind, rng) for n, kind in kinds.items()}
    steps = _steps(rng)
    results = []
    for fused in (True, False):
        half = on(device, table.copy())
        state = {n: on(device, s.copy()) for n, s in states.items()}
        for k, (ids, grad_out) in enumerate(steps):
            grad = _gradient(device, ids, grad_out, summed)
            extra = {"step": k + 1} if name in STEPPED else {}
            if fused:
                op(half, grad, **state, **options, **extra, seed=seed, rounding_step=k,
                   stochastic_rounding=stochastic)
            else:
                wide = F.widen_table(half)
                op(wide, grad, **state, **options, **extra)
                rows = np.unique(ids[ids != 0])
                F.store_rounded_(half, wide, rows=on(device, rows), seed=seed, step=k,
                                 stochastic_rounding=stochastic)
        results.append((_bits(half), {n: host(s) for n, s in state.items()}))
    return results


def _same(fused, composed):
    np.testing.assert_array_equal(fused[0], composed[0])
    for name in composed[1]:
        np.testing.assert_array_equal(fused[1][name], composed[1][name], err_msg=name)


# Every option set compiles its own kernels (SGD's usual options are constants), serial
# and parallel: seconds each on a cold cache. The default run takes one representative
# case per optimiser, each format and each gradient kind among them; every combination
# runs under the exhaustive marker (pytest -m exhaustive, which CI runs too).
REPRESENTATIVE = {(1, BF16, True), (4, F16, False), (7, BF16, False), (10, F16, True)}


def _sweep(formats=HALVES):
    """``(dtype, summed, case)`` params: the representative ones by default, the rest
    marked exhaustive."""
    params = []
    for index, case in enumerate(SPARSE_CASES):
        for dtype in formats:
            for summed in (True, False):
                wanted = (index, dtype, summed) in REPRESENTATIVE or (
                    len(formats) == 1 and any(r[0] == index and r[2] == summed
                                              for r in REPRESENTATIVE))
                params.append(pytest.param(
                    dtype, summed, case, marks=() if wanted else pytest.mark.exhaustive,
                    id=f"{_case_id(case)}-{'summed' if summed else 'fused_with_lookup'}-"
                       f"{dtype}"))
    return params


# The parallel kernels (two threads) of the representative cases compile as long
# again: by default the four run their serial kernels only ("-serial"); the bfloat16
# momentum test below runs SGD's (summed) and AdamW's (fused) parallel kernels by
# default, against the serial ones; both kernels of every case under the exhaustive
# marker.
SERIAL_ONLY = (1, 4, 7, 10)


def _sweep_with_threads():
    params = []
    for param in _sweep():
        index = next(i for i, case in enumerate(SPARSE_CASES) if case is param.values[2])
        if not param.marks and index in SERIAL_ONLY:
            params.append(pytest.param(*param.values, True, id=param.id + "-serial"))
            params.append(pytest.param(*param.values, False, id=param.id,
                                       marks=pytest.mark.exhaustive))
        else:
            params.append(pytest.param(*param.values, False, id=param.id, marks=param.marks))
    return params


@pytest.mark.parametrize("dtype, summed, case, serial_only", _sweep_with_threads())
def test_sparse_steps_give_the_bits_of_widen_update_store(dtype, summed, case, serial_only,
                                                          parallel_threshold):
    from conftest import two_threads

    before = numbapos.get_num_threads()
    runs = []
    legs = ((1, 1 << 40),) if serial_only else ((1, 1 << 40), (two_threads(), 1))
    try:
        for threads, threshold in legs:
            parallel_threshold(threshold)
            numbapos.set_num_threads(threads)
            for stochastic in (True, False):
                fused, composed = _run("cpu", dtype, case, summed, stochastic)
                _same(fused, composed)
                runs.append(fused)
    finally:
        numbapos.set_num_threads(before)
    if not serial_only:
        _same(runs[0], runs[2])  # 1 and 2 threads, stochastic
    assert not np.array_equal(runs[0][0], runs[1][0])  # stochastic rounding did round


@pytest.mark.parametrize("dtype, summed, case", _sweep([F16]))
def test_cuda_sparse_steps_of_float16_tables_give_the_cpu_bits(dtype, summed, case):
    if not numbapos.cuda_available():
        pytest.skip("CUDA is not available (no GPU and the simulator is off)")
    cpu = _run("cpu", dtype, case, summed, True)
    gpu = _run("cuda", dtype, case, summed, True)
    _same(gpu[0], cpu[0])
    _same(gpu[1], cpu[0])


@pytest.mark.parametrize("name, bf16_momentum", [
    ("sgd", False), ("adam", False), ("adagrad", False), ("rowwise_adagrad", False),
    ("sgd", True), ("adam", True)])
def test_cuda_launchers_round_bfloat16_bits_as_the_cpu(name, bf16_momentum, rng):
    """The CUDA launchers take any format's bits (and bfloat16 momentum, SGD's buffer or
    Adam's exp_avg, as its bits) and round them as the CPU does."""
    if not numbapos.cuda_available():
        pytest.skip("CUDA is not available (no GPU and the simulator is off)")
    from conftest import dev

    from numbapos._args import HalfRounding

    cpu_k, gpu_k = numbapos._device.kernels_for("cpu"), numbapos._device.kernels_for("cuda")
    bits = _bits((rng.normal(size=(V, D)) * 3).astype(BF16))
    rows = np.array([0, 3, 4, 12], np.int64)
    values = rng.normal(size=(4, D)).astype(np.float32)
    state = np.abs(rng.normal(size=(V, D))).astype(np.float32)
    hyper = {"sgd": F.optim._sgd_hyper(np.float32, 0.1, 0.9, 0.0, 0.0, True, False),
             "adam": F.optim._adam_hyper(np.float32, 2, 0.01, (0.9, 0.999), 1e-8, 0.0, False,
                                         False, sparse=True),
             "adagrad": F.optim._adagrad_hyper(np.float32, 2, 0.1, 0.0, 0.0, 1e-10, False),
             "rowwise_adagrad": F.optim._rowwise_hyper(np.float32, 0.1, 1e-8, 0.0, "none")}[name]
    states = {"sgd": [state, np.zeros(V, np.bool_)], "adam": [state, state * 2],
              "adagrad": [state], "rowwise_adagrad": [state[:, 0].copy()]}[name]
    if bf16_momentum:
        states[0] = _bits((rng.normal(size=(V, D)) * 0.3).astype(BF16))
    rounding = HalfRounding(0, np.uint64(3), np.uint64(9), True)
    launch = f"{name}_rows_"
    mine = [bits.copy(), *[s.copy() for s in states]]
    getattr(cpu_k, launch)(mine[0], rows, values, 4, *mine[1:], hyper, rounding)
    theirs = [dev(a) for a in (bits, *states)]
    getattr(gpu_k, launch)(theirs[0], dev(rows), dev(values), 4, *theirs[1:], hyper, rounding)
    for a, b in zip(mine, theirs, strict=True):
        np.testing.assert_array_equal(a, host(b))
    assert not np.array_equal(mine[0], bits)
    assert not np.array_equal(mine[1], states[0])


# ------------------------------------------------------------------ through the optimisers


OPTIMISERS = [
    ("SGD", dict(lr=0.1)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    ("Adam", dict(lr=0.01)),
    ("AdamW", dict(lr=0.01)),
    ("Adagrad", dict(lr=0.1, lr_decay=0.01)),
    ("RowWiseAdagrad", dict(lr=0.1, weight_decay=0.01, weight_decay_mode="l2")),
]


@pytest.mark.parametrize("dtype, name, options", [
    pytest.param(dtype, name, options, id=f"{name}-{i}-{dtype}",
                 marks=() if (i + (dtype == F16)) % 2 == 0 else pytest.mark.exhaustive)
    for i, (name, options) in enumerate(OPTIMISERS) for dtype in HALVES])
def test_optimisers_step_as_a_float32_run_stored_with_stochastic_rounding(dtype, name, options):
    """An optimiser's sparse steps on a 16-bit table: each the float32 optimiser's step on
    the widened table (float32 state), stored rounded with the key (seed, step number)."""
    cls = getattr(numbapos.optim, name)
    table = (np.random.default_rng(2).normal(size=(V, D)) * 2).astype(dtype)
    half = nn.Embedding.from_pretrained(table.copy(), freeze=False, sparse=True)
    opt = cls(half.parameters(), seed=21, **options)
    full = nn.Embedding.from_pretrained(table.astype(np.float32), freeze=False, sparse=True)
    reference = cls(full.parameters(), **options)
    expected = table.copy()
    rng = np.random.default_rng(3)
    for k in range(4):
        ids = rng.integers(0, V, size=(3, 5))
        grad = rng.normal(size=(3, 5, D)).astype(np.float32)
        half(ids)
        half.backward(grad)
        opt.step()
        half.zero_grad()
        full.weight.data[...] = expected.astype(np.float32)
        full(ids)
        full.backward(grad)
        reference.step()
        full.zero_grad()
        F.store_rounded_(expected, full.weight.data, rows=np.unique(ids), seed=21, step=k)
    np.testing.assert_array_equal(_bits(half.weight.data), _bits(expected))
    mine, theirs = opt.state_dict()["state"][0], reference.state_dict()["state"].get(0, {})
    assert mine.pop("rounding_step") == 4
    assert mine.keys() == theirs.keys()
    for key in mine:
        np.testing.assert_array_equal(mine[key], theirs[key], err_msg=key)


@pytest.mark.parametrize("name, options", OPTIMISERS[1:3], ids=["SGD", "Adam"])
def test_sparse_steps_allocate_no_float32_copy_of_the_table(name, options):
    """Each sparse step (plain and fused into the backward) allocates O(rows used), never
    the (V, D) float32 copy the widen-update-store composition needs."""
    vocab, dim = 100_000, 16  # 6.4 MB as float32
    module = nn.Embedding(vocab, dim, dtype="bfloat16", sparse=True, seed=1)
    opt = getattr(numbapos.optim, name)(module.parameters(), **options)
    ids = np.arange(0, vocab, vocab // 50)
    for fused in (False, True):
        handles = opt.fuse_with_backward() if fused else None
        # The first step makes the optimiser's state (float32, (V, D)) and compiles its
        # kernels (slow under tracemalloc): only the second step's peak is measured.
        for second in (False, True):
            y = module(ids)
            if second:
                tracemalloc.start()
            module.backward(np.ones_like(y))
            if not fused:
                opt.step()
            if second:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            module.zero_grad()
        if handles is not None:
            handles.remove()
        assert peak < vocab * dim * 4 // 10, f"peak {peak} bytes (fused={fused})"
        assert opt.state_dict()["state"][0]["rounding_step"] == 2 * (1 + fused)


def test_sparse_steps_of_16_bit_tables_are_checked():
    table = np.zeros((V, 2 * D), BF16)[:, ::2]  # not C-contiguous
    grad = SparseRows(np.array([1]), np.ones((1, D), np.float32), V)
    with pytest.raises(ValueError, match="C-contiguous"):
        F.sparse_sgd_(table, grad, lr=0.1)
    module = nn.Embedding.from_pretrained(table, freeze=False, sparse=True)
    module(np.array([1]))
    module.backward(np.ones((1, D), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        numbapos.optim.SGD(module.parameters(), lr=0.1).step()
    contiguous = np.zeros((V, D), BF16)
    with pytest.raises(ValueError, match="momentum_buffer.*float32"):
        F.sparse_sgd_(contiguous, grad, np.zeros((V, D), F16), np.zeros(V, bool), lr=0.1,
                      momentum=0.9)
    with pytest.raises(ValueError, match="momentum_buffer.*float32"):  # bfloat16 tables only
        F.sparse_sgd_(np.zeros((V, D), np.float32), grad, np.zeros((V, D), BF16),
                      np.zeros(V, bool), lr=0.1, momentum=0.9)
    with pytest.raises(ValueError, match="rounding_step"):
        F.sparse_sgd_(contiguous, grad, lr=0.1, rounding_step=-1)
    with pytest.raises(TypeError, match="updated by the numbapos.optim optimisers"):
        F.sgd_(contiguous, np.ones((V, D), np.float32), lr=0.1)
    # Float tables ignore the rounding keywords.
    plain = np.zeros((V, D), np.float32)
    F.sparse_sgd_(plain, grad, lr=1.0, seed=3, rounding_step=4, stochastic_rounding=False)
    np.testing.assert_array_equal(plain[1], -1.0)


# ------------------------------------------------------------------ bfloat16 momentum

MOMENTUM_CASES = [  # (op, options, its state: name -> kind), the momentum first
    ("sparse_sgd_", dict(lr=0.1, momentum=0.9, dampening=0.1),
     {"momentum_buffer": "table", "row_started": "flags"}),
    ("sparse_adam_", dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
     {"exp_avg": "table", "exp_avg_sq": "table"}),
]


# Each op and gradient kind compiles its own kernels (serial and parallel): by default
# SGD's summed and AdamW's fused-with-lookup steps, the other two under the exhaustive
# marker.
@pytest.mark.parametrize("case, summed", [
    pytest.param(case, summed, id=f"{name}-{'summed' if summed else 'fused_with_lookup'}",
                 marks=() if summed == (name == "SGD") else pytest.mark.exhaustive)
    for name, case in zip(["SGD", "AdamW"], MOMENTUM_CASES, strict=True)
    for summed in (True, False)])
def test_bfloat16_momentum_is_widened_updated_in_float32_and_stored_to_nearest(case, summed,
                                                                              parallel_threshold):
    """A sparse step with bfloat16 momentum: the bits of widening table and momentum, the
    float32 step, the table stored stochastically and the momentum to nearest even (as
    ``ml_dtypes``' cast), for 1 and 2 threads."""
    from conftest import two_threads

    name, options, kinds = case
    op = getattr(F, name)
    rng = np.random.default_rng(11)
    table = (rng.normal(size=(V, D)) * 3).astype(BF16)
    states = {n: _state(kind, rng) for n, kind in kinds.items()}
    momentum = next(iter(kinds))
    states[momentum] = (rng.normal(size=(V, D)) * 0.3).astype(BF16)
    steps = _steps(rng)
    extra = {"step": 1} if name in STEPPED else {}
    # The composition, once.
    wide_state = {n: s.astype(np.float32) if n == momentum else s.copy()
                  for n, s in states.items()}
    expected = table.copy()
    for k, (ids, grad_out) in enumerate(steps):
        wide = F.widen_table(expected)
        op(wide, _gradient("cpu", ids, grad_out, True), **wide_state, **options, **extra)
        F.store_rounded_(expected, wide, rows=np.unique(ids[ids != 0]), seed=4, step=k)
        wide_state[momentum] = wide_state[momentum].astype(BF16).astype(np.float32)
    before = numbapos.get_num_threads()
    try:
        for threads, threshold in ((1, 1 << 40), (two_threads(), 1)):
            parallel_threshold(threshold)
            numbapos.set_num_threads(threads)
            half = table.copy()
            state = {n: s.copy() for n, s in states.items()}
            for k, (ids, grad_out) in enumerate(steps):
                op(half, _gradient("cpu", ids, grad_out, summed), **state, **options, **extra,
                   seed=4, rounding_step=k)
            np.testing.assert_array_equal(_bits(half), _bits(expected))
            assert state[momentum].dtype == BF16
            np.testing.assert_array_equal(_bits(state[momentum]),
                                          _bits(wide_state[momentum].astype(BF16)))
            for n in kinds:
                if n != momentum:
                    np.testing.assert_array_equal(state[n], wide_state[n], err_msg=n)
    finally:
        numbapos.set_num_threads(before)


@pytest.mark.parametrize("name, options", [("SGD", dict(lr=0.1, momentum=0.9)),
                                           ("AdamW", dict(lr=0.01))])
@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
def test_optimisers_keep_bfloat16_momentum_of_16_bit_tables(name, options, sparse):
    """``momentum_dtype="bfloat16"``: the momentum of a bfloat16 table is bfloat16 (half the
    bytes), its steps those of the float32 step with the momentum rounded to nearest after
    each; a float32 parameter of the same optimiser keeps float32 state; checkpoints resume."""
    cls = getattr(numbapos.optim, name)
    table = (np.random.default_rng(2).normal(size=(V, D)) * 2).astype(BF16)
    moment = "momentum_buffer" if name == "SGD" else "exp_avg"

    def run(momentum_dtype, steps, module=None, opt=None, rng_seed=3, after_step=None):
        if module is None:
            module = nn.Embedding.from_pretrained(table.copy(), freeze=False, sparse=sparse)
            bias = nn.Parameter(np.zeros(D, np.float32))
            opt = cls([module.weight, bias], seed=21, momentum_dtype=momentum_dtype, **options)
        rng = np.random.default_rng(rng_seed)
        for _ in range(steps):
            ids = rng.integers(0, V, size=(3, 5))
            module(ids)
            module.backward(rng.normal(size=(3, 5, D)).astype(np.float32))
            opt.param_groups[0]["params"][1].grad = np.ones(D, np.float32)
            opt.step()
            module.zero_grad()
            if after_step is not None:
                after_step(opt.state[id(module.weight)])
        return module, opt

    module, opt = run("bfloat16", 3)
    state = opt.state[id(module.weight)]
    assert state[moment].dtype == BF16 and state[moment].nbytes == V * D * 2
    assert opt.state[id(opt.param_groups[0]["params"][1])][moment].dtype == np.float32
    # The same steps with float32 momentum, rounded to bfloat16 after each step.
    def round_momentum(ref_state):
        ref_state[moment][...] = ref_state[moment].astype(BF16).astype(np.float32)

    ref_module, ref_opt = run(None, 3, after_step=round_momentum)
    ref_state = ref_opt.state[id(ref_module.weight)]
    np.testing.assert_array_equal(_bits(module.weight.data), _bits(ref_module.weight.data))
    np.testing.assert_array_equal(_bits(state[moment]),
                                  _bits(ref_state[moment].astype(BF16)))
    # A checkpoint keeps the dtype and resumes bit for bit.
    saved = opt.state_dict()
    assert saved["state"][0][moment].dtype == BF16
    resumed_module = nn.Embedding.from_pretrained(module.weight.data.copy(), freeze=False,
                                                  sparse=sparse)
    bias = nn.Parameter(opt.param_groups[0]["params"][1].data.copy())
    resumed = cls([resumed_module.weight, bias], seed=21, momentum_dtype="bfloat16", **options)
    resumed.load_state_dict(saved)
    run(None, 2, module, opt, rng_seed=9)
    run(None, 2, resumed_module, resumed, rng_seed=9)
    np.testing.assert_array_equal(_bits(resumed_module.weight.data), _bits(module.weight.data))


def test_momentum_dtype_is_checked():
    p = nn.Parameter(np.zeros((V, D), BF16))
    for bad in ("float16", "int8", np.float64, 3):
        with pytest.raises(ValueError, match="momentum_dtype: expected None, 'float32' or "
                                             "'bfloat16'"):
            numbapos.optim.SGD([p], lr=0.1, momentum=0.9, momentum_dtype=bad)
    for good in (None, "float32", np.float32, "bfloat16", BF16):
        numbapos.optim.Adam([p], momentum_dtype=good)
