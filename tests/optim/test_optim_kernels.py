"""CPU optimiser kernels: the branch-free loops give the bits of the update written with ``if``.

The kernels pick between options with ``choose`` (a select) so that the row
loops vectorise. Here each launcher, at a serial and at a parallel size, must
give bit for bit what a plain scalar loop gives that follows PyTorch's
algorithm with ``if`` statements, for every combination of options, in float32
and float64 (float64 at the parallel sizes under the exhaustive marker).
"""

import numpy as np
import pytest
from numba import njit

import numbapos
from numbapos._args import AdagradHyper, AdamHyper, RowWiseAdagradHyper, SGDHyper
from numbapos.kernels.cpu import optim as kernels

# The parallel sizes run the parallel kernels: these tests are the default run's check
# of the SGD, Adam and Adagrad dense / row pairs against the scalar loop (test_warmup's
# pair test leaves them to the exhaustive run).

DENSE_SIZES = [1000, numbapos.config.SETTINGS["parallel_min_elements"].default + 77]
ROW_SHAPES = [(40, 7, 16), (3000, 700, 96)]  # (rows in the table, rows updated, D)
DTYPES = [np.float32, np.float64]


def _dtype_and(sizes):
    """``(dtype, size)`` cases: both dtypes at the serial size and float32 at the parallel
    one by default; float64 at the parallel size (the same source as float32's parallel
    kernel at another width, compiled once more) under the exhaustive marker."""
    return [pytest.param(dtype, size, id=f"{np.dtype(dtype).name}-{i}",
                         marks=pytest.mark.exhaustive if (dtype is np.float64 and i) else ())
            for dtype in DTYPES for i, size in enumerate(sizes)]


DTYPE_DENSE = _dtype_and(DENSE_SIZES)
DTYPE_ROWS = _dtype_and(ROW_SHAPES)


def sgd_hyper(dtype, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
              maximize=False):
    cast = np.dtype(dtype).type
    return SGDHyper(cast(0.05), cast(momentum), cast(1 - dampening), cast(weight_decay),
                    nesterov, maximize)


def adam_hyper(dtype, beta1=0.9, weight_decay=0.0, decoupled=False, amsgrad=False,
               maximize=False):
    cast = np.dtype(dtype).type
    return AdamHyper(cast(1 - beta1), cast(0.999), cast(0.001), cast(1e-8), cast(weight_decay),
                     cast(1 - 0.01 * weight_decay), cast(-0.01), cast(0.3), decoupled, amsgrad,
                     maximize)


def adagrad_hyper(dtype, weight_decay=0.0, maximize=False):
    cast = np.dtype(dtype).type
    return AdagradHyper(cast(-0.1), cast(weight_decay), cast(1e-10), maximize)


def rowwise_hyper(dtype, weight_decay=0.0, mode=0):
    cast = np.dtype(dtype).type
    return RowWiseAdagradHyper(cast(0.1), cast(1e-8), cast(weight_decay), mode)


SGD_OPTIONS = [dict(), dict(momentum=0.9), dict(momentum=0.9, nesterov=True),
               dict(momentum=0.9, dampening=0.5), dict(weight_decay=0.01), dict(maximize=True),
               dict(momentum=0.5, weight_decay=0.1, maximize=True),
               dict(momentum=0.8, nesterov=True, weight_decay=0.1, maximize=True)]
ADAM_OPTIONS = [dict(), dict(beta1=0.3), dict(weight_decay=0.1, decoupled=True),
                dict(beta1=0.3, weight_decay=0.1, decoupled=True), dict(weight_decay=0.1),
                dict(amsgrad=True), dict(maximize=True),
                dict(beta1=0.3, weight_decay=0.1, amsgrad=True, maximize=True),
                dict(weight_decay=0.1, decoupled=True, amsgrad=True)]
ADAGRAD_OPTIONS = [dict(), dict(weight_decay=0.1), dict(maximize=True),
                   dict(weight_decay=0.1, maximize=True)]
ROWWISE_OPTIONS = [dict(), dict(weight_decay=0.2, mode=1), dict(weight_decay=0.2, mode=2)]


# ---------------------------------------------------------------- the updates written with if


@njit
def sgd_element(p, g, b, h, first):
    if h.maximize:
        g = -g
    if h.weight_decay != 0:
        g = g + h.weight_decay * p
    if h.momentum != 0:
        if first:
            b = g
        else:
            b = b * h.momentum + h.one_minus_dampening * g
        if h.nesterov:
            g = g + h.momentum * b
        else:
            g = b
    return p - h.lr * g, b


@njit
def sgd_dense_generic(param, grad, buf, first, h):
    for i in range(param.size):
        b = buf[i] if h.momentum != 0 else param.dtype.type(0)
        param[i], b = sgd_element(param[i], grad[i], b, h, first)
        if h.momentum != 0:
            buf[i] = b


@njit
def sgd_rows_generic(param, rows, values, buf, row_started, h):
    for j in range(rows.size):
        r = rows[j]
        first = not row_started[r]
        for d in range(param.shape[1]):
            b = buf[r, d] if h.momentum != 0 else param.dtype.type(0)
            param[r, d], b = sgd_element(param[r, d], values[j, d], b, h, first)
            if h.momentum != 0:
                buf[r, d] = b
        if h.momentum != 0:
            row_started[r] = True


@njit
def adam_prologue(p, g, h):
    if h.maximize:
        g = -g
    if h.weight_decay != 0:
        if h.decoupled:
            p = p * h.decay
        else:
            g = g + h.weight_decay * p
    return p, g


@njit
def adam_dense_generic(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, h):
    one = param.dtype.type(1)
    for i in range(param.size):
        p, g = adam_prologue(param[i], grad[i], h)
        m = exp_avg[i]
        w = h.one_minus_beta1
        if w < 0.5:
            m = m + w * (g - m)
        else:
            m = g - (g - m) * (one - w)
        v = exp_avg_sq[i] * h.beta2 + h.one_minus_beta2 * g * g
        exp_avg[i] = m
        exp_avg_sq[i] = v
        if h.amsgrad:
            if max_exp_avg_sq[i] > v:
                v = max_exp_avg_sq[i]
            max_exp_avg_sq[i] = v
        param[i] = p + h.neg_step_size * (m / (np.sqrt(v) / h.bias_correction2_sqrt + h.eps))


@njit
def adam_rows_generic(param, rows, values, exp_avg, exp_avg_sq, h):
    for j in range(rows.size):
        r = rows[j]
        for d in range(param.shape[1]):
            p, g = adam_prologue(param[r, d], values[j, d], h)
            m = exp_avg[r, d]
            m = m + (g - m) * h.one_minus_beta1
            v = exp_avg_sq[r, d]
            v = v + (g * g - v) * h.one_minus_beta2
            exp_avg[r, d] = m
            exp_avg_sq[r, d] = v
            param[r, d] = p + h.neg_step_size * (m / (np.sqrt(v) + h.eps))


@njit
def adagrad_element(p, g, s, h):
    if h.maximize:
        g = -g
    if h.weight_decay != 0:
        g = g + h.weight_decay * p
    s = s + g * g
    return p + h.neg_clr * (g / (np.sqrt(s) + h.eps)), s


@njit
def adagrad_dense_generic(param, grad, state_sum, h):
    for i in range(param.size):
        param[i], state_sum[i] = adagrad_element(param[i], grad[i], state_sum[i], h)


@njit
def adagrad_rows_generic(param, rows, values, state_sum, h):
    for j in range(rows.size):
        r = rows[j]
        for d in range(param.shape[1]):
            param[r, d], state_sum[r, d] = adagrad_element(param[r, d], values[j, d],
                                                           state_sum[r, d], h)


@njit
def rowwise_rows_generic(param, rows, values, state_sum, h):
    one = param.dtype.type(1)
    dim = param.shape[1]
    for j in range(rows.size):
        r = rows[j]
        square_sum = param.dtype.type(0)
        for d in range(dim):
            g = values[j, d]
            if h.mode == 1:
                g = g + h.weight_decay * param[r, d]
            square_sum += g * g
        acc = state_sum[r] + square_sum / param.dtype.type(dim)
        state_sum[r] = acc
        multiplier = h.lr / (np.sqrt(acc) + h.eps)
        correction = one
        if h.mode == 1:
            correction = one - multiplier * h.weight_decay
        elif h.mode == 2:
            correction = one - h.lr * h.weight_decay
        for d in range(dim):
            param[r, d] = correction * param[r, d] - multiplier * values[j, d]


# ---------------------------------------------------------------- helpers


def both_ways(launch, generic, arrays, *scalars):
    """Run ``launch`` and ``generic`` on copies of ``arrays``; assert equal bits throughout."""
    ours = [a.copy() for a in arrays]
    theirs = [a.copy() for a in arrays]
    launch(*ours, *scalars)
    generic(*theirs, *scalars)
    for mine, expected in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(mine, expected)
    assert not np.array_equal(ours[0], arrays[0])  # the step did change the parameter


def rows_both_ways(launcher, generic, param, rows, values, states, hyper):
    """:func:`both_ways` for a row update ``f(param, rows, values, *states, hyper)``."""
    both_ways(lambda param, *states: launcher(param, rows, values, rows.size, *states, hyper),
              lambda param, *states: generic(param, rows, values, *states, hyper),
              [param, *states])


def dense_arrays(rng, dtype, size, states):
    return [rng.normal(size=size).astype(dtype) for _ in range(2)] + [
        np.abs(rng.normal(size=size)).astype(dtype) for _ in range(states)]


def row_arrays(rng, dtype, shape, states, row_states=False):
    num_rows, used, dim = shape
    param = rng.normal(size=(num_rows, dim)).astype(dtype)
    rows = np.sort(rng.choice(num_rows, size=used, replace=False)).astype(np.int64)
    values = rng.normal(size=(used, dim)).astype(dtype)
    state_shape = (num_rows,) if row_states else (num_rows, dim)
    states = [np.abs(rng.normal(size=state_shape)).astype(dtype) for _ in range(states)]
    return param, rows, values, states


# ---------------------------------------------------------------- tests


@pytest.mark.parametrize("dtype, size", DTYPE_DENSE)
@pytest.mark.parametrize("options", SGD_OPTIONS, ids=str)
@pytest.mark.parametrize("first", [False, True])
def test_sgd_dense(rng, dtype, size, options, first):
    param, grad, buf = dense_arrays(rng, dtype, size, 1)
    both_ways(kernels.sgd_dense_, sgd_dense_generic, [param, grad, buf], first,
              sgd_hyper(dtype, **options))


@pytest.mark.parametrize("dtype, shape", DTYPE_ROWS)
@pytest.mark.parametrize("options", SGD_OPTIONS, ids=str)
def test_sgd_rows(rng, dtype, shape, options):
    param, rows, values, (buf,) = row_arrays(rng, dtype, shape, 1)
    started = rng.random(shape[0]) < 0.5  # rows seen before, and rows whose momentum starts
    rows_both_ways(kernels.sgd_rows_, sgd_rows_generic, param, rows, values, [buf, started],
                   sgd_hyper(dtype, **options))


@pytest.mark.parametrize("dtype, size", DTYPE_DENSE)
@pytest.mark.parametrize("options", ADAM_OPTIONS, ids=str)
def test_adam_dense(rng, dtype, size, options):
    arrays = dense_arrays(rng, dtype, size, 3)
    both_ways(kernels.adam_dense_, adam_dense_generic, arrays, adam_hyper(dtype, **options))


@pytest.mark.parametrize("dtype, shape", DTYPE_ROWS)
@pytest.mark.parametrize("options", [o for o in ADAM_OPTIONS if "amsgrad" not in o], ids=str)
def test_adam_rows(rng, dtype, shape, options):
    param, rows, values, states = row_arrays(rng, dtype, shape, 2)
    rows_both_ways(kernels.adam_rows_, adam_rows_generic, param, rows, values, states,
                   adam_hyper(dtype, **options))


@pytest.mark.parametrize("dtype, size", DTYPE_DENSE)
@pytest.mark.parametrize("options", ADAGRAD_OPTIONS, ids=str)
def test_adagrad_dense(rng, dtype, size, options):
    arrays = dense_arrays(rng, dtype, size, 1)
    both_ways(kernels.adagrad_dense_, adagrad_dense_generic, arrays,
              adagrad_hyper(dtype, **options))


@pytest.mark.parametrize("dtype, shape", DTYPE_ROWS)
@pytest.mark.parametrize("options", ADAGRAD_OPTIONS, ids=str)
def test_adagrad_rows(rng, dtype, shape, options):
    param, rows, values, states = row_arrays(rng, dtype, shape, 1)
    rows_both_ways(kernels.adagrad_rows_, adagrad_rows_generic, param, rows, values, states,
                   adagrad_hyper(dtype, **options))


@pytest.mark.parametrize("dtype, shape", DTYPE_ROWS)
@pytest.mark.parametrize("options", ROWWISE_OPTIONS, ids=str)
def test_rowwise_adagrad_rows(rng, dtype, shape, options):
    param, rows, values, states = row_arrays(rng, dtype, shape, 1, row_states=True)
    rows_both_ways(kernels.rowwise_adagrad_rows_, rowwise_rows_generic, param, rows, values,
                   states, rowwise_hyper(dtype, **options))


# ------------------------------------------ row-wise Adagrad, four rows at a time

# The row-wise kernels sum four rows' squares in one interleaved loop, each row
# still in order. Every count of rows left over after the blocks of four (0-3),
# serial and parallel, each entry point and each weight decay mode.
ROWWISE_COUNTS = [1, 2, 3, 4, 5, 6, 7, 9, 701, 702, 703, 704]


@pytest.mark.parametrize("dtype, used", [
    pytest.param(dtype, used, id=f"{np.dtype(dtype).name}-{used}",
                 marks=pytest.mark.exhaustive if (dtype is np.float64 and used > 700) else ())
    for dtype in DTYPES for used in ROWWISE_COUNTS])
@pytest.mark.parametrize("options", ROWWISE_OPTIONS, ids=str)
def test_rowwise_adagrad_rows_in_blocks_of_four(rng, dtype, used, options):
    param, rows, values, states = row_arrays(rng, dtype, (used + 300, used, 96), 1,
                                             row_states=True)
    rows_both_ways(kernels.rowwise_adagrad_rows_, rowwise_rows_generic, param, rows, values,
                   states, rowwise_hyper(dtype, **options))


@pytest.mark.parametrize("num_rows", [1, 3, 4, 6, 701, 703])
@pytest.mark.parametrize("options", ROWWISE_OPTIONS, ids=str)
def test_rowwise_adagrad_dense_in_blocks_of_four(rng, num_rows, options):
    param = rng.normal(size=(num_rows, 96)).astype(np.float32)
    grad = rng.normal(size=param.shape).astype(np.float32)
    state = np.abs(rng.normal(size=num_rows)).astype(np.float32)
    h = rowwise_hyper(np.float32, **options)
    every_row = np.arange(num_rows)
    both_ways(lambda p, s: kernels.rowwise_adagrad_dense_(p, grad, s, h),
              lambda p, s: rowwise_rows_generic(p, every_row, grad, s, h),
              [param, state])


# Each weight decay mode and scaling compiles its own kernels (seconds each on a cold
# cache): by default each mode with one scaling in turn (both scalings reached), every
# other combination under the exhaustive marker; every count of tokens for each.
@pytest.mark.parametrize("tokens", [5, 11, 2500])
@pytest.mark.parametrize("options, scale", [
    pytest.param(options, scale, id=f"{options}-{scale}",
                 marks=() if scale == bool(k % 2) else pytest.mark.exhaustive)
    for k, options in enumerate(ROWWISE_OPTIONS) for scale in (False, True)])
def test_rowwise_adagrad_row_groups_in_blocks_of_four(rng, tokens, scale, options):
    # Fused: four groups' gradients summed into four accumulators at a time. Ids
    # repeat (most groups sum several rows); the last row is padding.
    from numbapos.kernels.cpu import embedding as cpu_embedding

    num_rows, dim = max(tokens // 3, 4), 96
    flat = rng.integers(0, num_rows, size=tokens).astype(np.int64)
    grad = rng.normal(size=(tokens, dim)).astype(np.float32)
    param = rng.normal(size=(num_rows, dim)).astype(np.float32)
    state = np.abs(rng.normal(size=num_rows)).astype(np.float32)
    h = rowwise_hyper(np.float32, **options)
    groups = cpu_embedding.group_rows(flat, num_rows - 1, num_rows)
    summed = np.empty((groups.rows.size, dim), np.float32)
    cpu_embedding.sum_row_groups(grad, groups, scale, summed)
    both_ways(lambda p, s: kernels.rowwise_adagrad_row_groups_(p, grad, groups, scale, s, h),
              lambda p, s: rowwise_rows_generic(p, groups.rows, summed, s, h),
              [param, state])
