"""CUDA optimiser launchers: bit-identical to the CPU launchers and to NumPy oracles.

Runs on Numba's CUDA simulator where no GPU is present (conftest sets
NUMBA_ENABLE_CUDASIM=1). On a real GPU the kernels' products are compiled
unfused (``mul_rn``), so the same bits come out there too.
"""

import inspect

import numpy as np
import pytest
from conftest import FLOAT_DTYPES, SGD_CONFIGS, dev

from numbapos._args import SGDHyper
from numbapos.kernels.cpu import optim as cpu
from numbapos.kernels.cuda import optim as gpu

CONFIGS = SGD_CONFIGS


def _dtypes_in_turn(cases):
    """``(dtype, *values)`` params of ``(id, turn, values)`` cases: each with
    ``FLOAT_DTYPES[turn % 2]`` in the default run, the other dtype under the exhaustive
    marker."""
    return [pytest.param(dtype, *values, id=f"{case_id}-{np.dtype(dtype).name}",
                         marks=() if d == turn % 2 else pytest.mark.exhaustive)
            for case_id, turn, values in cases
            for d, dtype in enumerate(FLOAT_DTYPES)]


def hyper(dtype, lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
          maximize=False):
    cast = np.dtype(dtype).type
    return SGDHyper(cast(lr), cast(momentum), cast(1.0 - dampening), cast(weight_decay),
                    nesterov, maximize)


def oracle_step(p, g, buf, first, h):
    """torch.optim.SGD's rule in NumPy, in the arrays' dtype, operation for operation."""
    if h.maximize:
        g = -g
    if h.weight_decay != 0:
        g = g + h.weight_decay * p
    if h.momentum != 0:
        buf = g.copy() if first else buf * h.momentum + h.one_minus_dampening * g
        g = g + h.momentum * buf if h.nesterov else buf
    return p - h.lr * g, buf


def test_same_launchers_and_signatures():
    assert gpu.__all__ == cpu.__all__
    for name in cpu.__all__:
        assert inspect.signature(getattr(gpu, name)) == inspect.signature(getattr(cpu, name))


# ---------------------------------------------------------------- sgd_dense_


# Each option set with the two dtypes in turn by default, the other dtype of each under
# the exhaustive marker.
@pytest.mark.parametrize("dtype, config", _dtypes_in_turn(
    [(f"config{c}", c, (config,)) for c, config in enumerate(CONFIGS)]))
def test_sgd_dense_steps_bit_identical(rng, dtype, config):
    n = 150  # two blocks, the second partly idle
    h = hyper(dtype, **config)
    momentum = h.momentum != 0
    param = rng.normal(size=n).astype(dtype)
    buf = np.zeros(n if momentum else 0, dtype)
    param_d, buf_d = dev(param), dev(buf)
    oracle_p, oracle_b = param.copy(), None
    for step in range(3):
        grad = rng.normal(size=n).astype(dtype)
        first = step == 0
        gpu.sgd_dense_(param_d, dev(grad), buf_d, first, h)
        cpu.sgd_dense_(param, grad, buf, first, h)
        oracle_p, oracle_b = oracle_step(oracle_p, grad, oracle_b, first, h)
        got = param_d.copy_to_host()
        np.testing.assert_array_equal(got, param)
        np.testing.assert_array_equal(got, oracle_p)
        assert got.dtype == dtype
        if momentum:
            np.testing.assert_array_equal(buf_d.copy_to_host(), buf)
            np.testing.assert_array_equal(buf, oracle_b)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_sgd_dense_first_flag_restarts_the_buffer(rng, dtype):
    # first=True ignores whatever the buffer holds; first=False reads it.
    h = hyper(dtype, lr=0.5, momentum=0.9)
    param = rng.normal(size=5).astype(dtype)
    grad = rng.normal(size=5).astype(dtype)
    stale = rng.normal(size=5).astype(dtype)
    for first in (True, False):
        param_d, buf_d = dev(param), dev(stale)
        gpu.sgd_dense_(param_d, dev(grad), buf_d, first, h)
        expected_p, expected_b = oracle_step(param, grad, stale, first, h)
        np.testing.assert_array_equal(param_d.copy_to_host(), expected_p)
        np.testing.assert_array_equal(buf_d.copy_to_host(), expected_b)


def test_sgd_dense_empty_is_a_no_op():
    h = hyper(np.float32, momentum=0.9)
    param_d = dev(np.zeros(0, np.float32))
    gpu.sgd_dense_(param_d, dev(np.zeros(0, np.float32)), dev(np.zeros(0, np.float32)), True, h)
    assert param_d.copy_to_host().shape == (0,)


# ---------------------------------------------------------------- sgd_rows_


STEPS = ([1, 2], [2, 3], [0, 1, 3, 5], [2])


# Each option set and dtype compiles its own CPU kernels and the simulator runs every
# case: by default each option set with the two dtypes in turn (both widths), the other
# dtype of each under the exhaustive marker.
@pytest.mark.parametrize("dtype, config, dim", _dtypes_in_turn(
    [(f"{dim}-config{c}", c, (config, dim)) for c, config in enumerate(CONFIGS)
     for dim in (3, 130)]))
def test_sgd_rows_steps_bit_identical(rng, dtype, config, dim):
    num = 6
    h = hyper(dtype, lr=0.05, **config)
    momentum = h.momentum != 0
    param = rng.normal(size=(num, dim)).astype(dtype)
    buf = np.zeros((num, dim) if momentum else (0, 0), dtype)
    started = np.zeros(num if momentum else 0, np.bool_)
    if momentum:
        started[5] = True  # a row whose momentum started before (with a zero buffer)
    param_d, buf_d, started_d = dev(param), dev(buf), dev(started)
    history = {r: (param[r].copy(), buf[r].copy() if momentum and started[r] else None)
               for r in range(num)}
    for rows in STEPS:
        rows = np.array(rows, np.int64)
        values = rng.normal(size=(rows.size, dim)).astype(dtype)
        gpu.sgd_rows_(param_d, dev(rows), dev(values), rows.size, buf_d, started_d, h)
        cpu.sgd_rows_(param, rows, values, rows.size, buf, started, h)
        for r, v in zip(rows, values, strict=True):
            p, b = history[r]
            history[r] = oracle_step(p, v, b, b is None, h)
        got = param_d.copy_to_host()
        np.testing.assert_array_equal(got, param)
        if momentum:
            np.testing.assert_array_equal(buf_d.copy_to_host(), buf)
            np.testing.assert_array_equal(started_d.copy_to_host(), started)
    for r in range(num):
        np.testing.assert_array_equal(got[r], history[r][0])  # untouched row 4 included
    if momentum:
        np.testing.assert_array_equal(started, [True, True, True, True, False, True])


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_sgd_rows_empty_rows_is_a_no_op(rng, dtype):
    h = hyper(dtype, momentum=0.9)
    param = rng.normal(size=(3, 2)).astype(dtype)
    param_d, started_d = dev(param), dev(np.zeros(3, np.bool_))
    gpu.sgd_rows_(param_d, dev(np.zeros(0, np.int64)), dev(np.zeros((0, 2), dtype)), 0,
                  dev(np.zeros((3, 2), dtype)), started_d, h)
    np.testing.assert_array_equal(param_d.copy_to_host(), param)
    assert not started_d.copy_to_host().any()


# ---------------------------------------------------------------- sgd_row_groups_


# Each option set, scaling and dtype compiles its own CPU kernels: by default three
# cases that reach every option set, both scalings and both dtypes (unscaled float32
# without momentum, scaled float64 with Nesterov momentum, unscaled float32 with every
# option), every other combination under the exhaustive marker.
ROW_GROUP_DEFAULTS = {(False, 0, 0), (True, 1, 1), (False, 2, 0)}


@pytest.mark.parametrize("scale, config, dtype", [
    pytest.param(scale, config, dtype, id=f"{scale}-config{c}-{np.dtype(dtype).name}",
                 marks=() if (scale, c, d) in ROW_GROUP_DEFAULTS else pytest.mark.exhaustive)
    for scale in (False, True)
    for c, config in ((0, CONFIGS[0]), (1, CONFIGS[3]), (2, CONFIGS[6]))
    for d, dtype in enumerate(FLOAT_DTYPES)])
def test_sgd_row_groups_equals_sum_then_sgd_rows_on_both_devices(rng, dtype, config, scale):
    from numbapos.kernels.cpu import embedding as cpu_embedding
    from numbapos.kernels.cuda import embedding as gpu_embedding

    num, dim = 7, 130
    h = hyper(dtype, lr=0.05, **config)
    momentum = h.momentum != 0
    flat = np.array([5, 1, 5, 2, 6, 5, 1], np.int64)
    grad = rng.normal(size=(flat.size, dim)).astype(dtype)
    param = rng.normal(size=(num, dim)).astype(dtype)
    states = {}
    for name in ("fused_cpu", "fused_gpu", "two_pass"):
        states[name] = [param.copy(), np.zeros((num, dim) if momentum else (0, 0), dtype),
                        np.zeros(num if momentum else 0, np.bool_)]
    p_d, b_d, s_d = (dev(a) for a in states["fused_gpu"])
    for _ in range(2):  # the second step continues the momentum the first started
        groups = cpu_embedding.group_rows(flat, 6, num)
        cpu.sgd_row_groups_(*states["fused_cpu"][:1], grad, groups, scale,
                            *states["fused_cpu"][1:], h)
        gpu.sgd_row_groups_(p_d, dev(grad), gpu_embedding.group_rows(dev(flat), 6, num), scale,
                            b_d, s_d, h)
        values = np.empty((groups.rows.size, dim), dtype)
        cpu_embedding.sum_row_groups(grad, groups, scale, values)
        p, b, s = states["two_pass"]
        cpu.sgd_rows_(p, groups.rows, values, groups.used, b, s, h)
    np.testing.assert_array_equal(groups.rows, [1, 2, 5])  # padding row 6 left out
    for got in (states["fused_cpu"], [p_d.copy_to_host(), b_d.copy_to_host(),
                                      s_d.copy_to_host()]):
        for a, b in zip(got, states["two_pass"], strict=True):
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(states["two_pass"][0][[0, 3, 4, 6]], param[[0, 3, 4, 6]])
# ---------------------------------------------------------------- Adam, Adagrad, row-wise Adagrad

ADAM_CONFIGS = [
    dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, maximize=False,
         decoupled_weight_decay=False),
    dict(lr=0.05, betas=(0.3, 0.8), eps=1e-6, weight_decay=0.1, maximize=True,
         decoupled_weight_decay=False),
    dict(lr=0.05, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.2, maximize=False,
         decoupled_weight_decay=True),
]


def _rows_steps(rng, num, dim, dtype):
    for rows in STEPS:
        rows = np.array(rows, np.int64)
        yield rows, rng.normal(size=(rows.size, dim)).astype(dtype)


# Adam's two tests: each option set with the two dtypes in turn by default (with and
# without amsgrad, both widths), the other dtype of each under the exhaustive marker.
@pytest.mark.parametrize("dtype, config, amsgrad", _dtypes_in_turn(
    [(f"{amsgrad}-config{c}", c, (config, amsgrad)) for c, config in enumerate(ADAM_CONFIGS)
     for amsgrad in (False, True)]))
def test_adam_dense_bit_identical(rng, dtype, config, amsgrad):
    from numbapos.functional.optim import _adam_hyper

    n = 150
    host_arrays = [rng.normal(size=n).astype(dtype), np.zeros(n, dtype), np.zeros(n, dtype),
                   np.zeros(n if amsgrad else 0, dtype)]
    device_arrays = [dev(a) for a in host_arrays]
    for step in range(1, 4):
        h = _adam_hyper(dtype, step, amsgrad=amsgrad, **config)
        grad = rng.normal(size=n).astype(dtype)
        cpu.adam_dense_(host_arrays[0], grad, *host_arrays[1:], h)
        gpu.adam_dense_(device_arrays[0], dev(grad), *device_arrays[1:], h)
        for a, d in zip(host_arrays, device_arrays, strict=True):
            np.testing.assert_array_equal(d.copy_to_host(), a)


@pytest.mark.parametrize("dtype, config, dim", _dtypes_in_turn(
    [(f"{dim}-config{c}", c, (config, dim)) for c, config in enumerate(ADAM_CONFIGS)
     for dim in (3, 130)]))
def test_adam_rows_bit_identical(rng, dtype, config, dim):
    from numbapos.functional.optim import _adam_hyper

    num = 6
    host_arrays = [rng.normal(size=(num, dim)).astype(dtype), np.zeros((num, dim), dtype),
                   np.zeros((num, dim), dtype)]
    start = host_arrays[0].copy()
    device_arrays = [dev(a) for a in host_arrays]
    for step, (rows, values) in enumerate(_rows_steps(rng, num, dim, dtype), start=1):
        h = _adam_hyper(dtype, step, sparse=True, **config)
        cpu.adam_rows_(host_arrays[0], rows, values, rows.size, *host_arrays[1:], h)
        gpu.adam_rows_(device_arrays[0], dev(rows), dev(values), rows.size, *device_arrays[1:],
                       h)
        for a, d in zip(host_arrays, device_arrays, strict=True):
            np.testing.assert_array_equal(d.copy_to_host(), a)
    np.testing.assert_array_equal(host_arrays[0][4], start[4])  # row 4 is never listed


ADAGRAD_CONFIGS = [dict(lr=0.1, lr_decay=0.0, weight_decay=0.0, eps=1e-10, maximize=False),
                   dict(lr=0.1, lr_decay=0.1, weight_decay=0.3, eps=1e-3, maximize=True)]


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("config", ADAGRAD_CONFIGS)
def test_adagrad_dense_and_rows_bit_identical(rng, dtype, config):
    from numbapos.functional.optim import _adagrad_hyper

    num, dim = 6, 130
    param, state = rng.normal(size=(num, dim)).astype(dtype), np.full((num, dim), 0.1, dtype)
    param_d, state_d = dev(param), dev(state)
    for step, (rows, values) in enumerate(_rows_steps(rng, num, dim, dtype), start=1):
        h = _adagrad_hyper(dtype, step, **config)
        if step % 2:  # dense and sparse steps in turn
            grad = rng.normal(size=num * dim).astype(dtype)
            cpu.adagrad_dense_(param.reshape(-1), grad, state.reshape(-1), h)
            gpu.adagrad_dense_(param_d.reshape(num * dim), dev(grad), state_d.reshape(num * dim),
                               h)
        else:
            cpu.adagrad_rows_(param, rows, values, rows.size, state, h)
            gpu.adagrad_rows_(param_d, dev(rows), dev(values), rows.size, state_d, h)
        np.testing.assert_array_equal(param_d.copy_to_host(), param)
        np.testing.assert_array_equal(state_d.copy_to_host(), state)


# Each weight decay mode and dtype compiles its own kernels: by default the three modes
# with the two dtypes in turn (both widths each), the other dtype of each under the
# exhaustive marker.
@pytest.mark.parametrize("dtype, mode, dim", [
    pytest.param(dtype, mode, dim, id=f"{dim}-{mode}-{np.dtype(dtype).name}",
                 marks=() if m % 2 == d else pytest.mark.exhaustive)
    for dim in (1, 37)
    for m, mode in enumerate(["none", "l2", "decoupled"])
    for d, dtype in enumerate(FLOAT_DTYPES)])
def test_rowwise_adagrad_bit_identical_and_matches_reference(rng, dtype, mode, dim):
    import reference as ref

    from numbapos.functional.optim import _rowwise_hyper

    num = 6
    options = dict(lr=0.1, eps=1e-8, weight_decay=0.0 if mode == "none" else 0.2,
                   weight_decay_mode=mode)
    h = _rowwise_hyper(dtype, **options)
    param, state = rng.normal(size=(num, dim)).astype(dtype), np.zeros(num, dtype)
    param_d, state_d = dev(param), dev(state)
    expected, acc = param.copy(), state.copy()
    for step, (rows, values) in enumerate(_rows_steps(rng, num, dim, dtype)):
        if step % 2:
            grad = rng.normal(size=(num, dim)).astype(dtype)
            cpu.rowwise_adagrad_dense_(param, grad, state, h)
            gpu.rowwise_adagrad_dense_(param_d, dev(grad), state_d, h)
            expected, acc = ref.rowwise_adagrad_step(expected, grad, acc, **options)
        else:
            cpu.rowwise_adagrad_rows_(param, rows, values, rows.size, state, h)
            gpu.rowwise_adagrad_rows_(param_d, dev(rows), dev(values), rows.size, state_d, h)
            expected, acc = ref.rowwise_adagrad_step(expected, values, acc, rows=rows,
                                                     **options)
        np.testing.assert_array_equal(param_d.copy_to_host(), param)
        np.testing.assert_array_equal(state_d.copy_to_host(), state)
    np.testing.assert_array_equal(param, expected)
    np.testing.assert_array_equal(state, acc)


def test_new_launchers_with_nothing_to_do_are_no_ops():
    from numbapos.functional.optim import _adagrad_hyper, _adam_hyper, _rowwise_hyper

    f32 = np.float32
    param_d = dev(np.ones((3, 2), f32))
    no_rows, no_values = dev(np.zeros(0, np.int64)), dev(np.zeros((0, 2), f32))
    state = dev(np.zeros((3, 2), f32))
    gpu.adam_rows_(param_d, no_rows, no_values, 0, state, state, _adam_hyper(
        f32, 1, 0.1, (0.9, 0.99), 1e-8, 0.0, False, False, sparse=True))
    gpu.adagrad_rows_(param_d, no_rows, no_values, 0, state, _adagrad_hyper(
        f32, 1, 0.1, 0.0, 0.0, 1e-10, False))
    gpu.rowwise_adagrad_rows_(param_d, no_rows, no_values, 0, dev(np.zeros(3, f32)),
                              _rowwise_hyper(f32, 0.1, 1e-8, 0.0, "none"))
    empty = dev(np.zeros(0, f32))
    gpu.adam_dense_(empty, empty, empty, empty, empty, _adam_hyper(
        f32, 1, 0.1, (0.9, 0.99), 1e-8, 0.0, False, False))
    gpu.rowwise_adagrad_dense_(dev(np.zeros((0, 2), f32)), dev(np.zeros((0, 2), f32)),
                               dev(np.zeros(0, f32)), _rowwise_hyper(f32, 0.1, 1e-8, 0.0, "none"))
    np.testing.assert_array_equal(param_d.copy_to_host(), 1.0)
