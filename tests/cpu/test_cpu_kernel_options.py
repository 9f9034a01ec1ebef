"""How the CPU kernels are compiled: one set of @njit options, and option flags that pick code.

Every CPU kernel goes through ``kernels/cpu/jit.py``'s ``kernel()`` (cached,
nogil, no Numba runtime); on/off options that select compiled code reach the
kernels as True/None (``arrays.option``), so a first call compiles only the
variant it runs.
"""

import inspect
import re

import numpy as np
import pytest
from numba.core.registry import CPUDispatcher

from numbapos import _numba_internals
from numbapos._args import RowGroups, SGDHyper
from numbapos.kernels import cpu
from numbapos.kernels.cpu import arrays, jit, optim
from numbapos.kernels.cpu.embedding import sum_row_groups
from numbapos.kernels.cpu.optim import _sgd, _sgd_state, sgd_rows_


def _dispatchers():
    modules = [cpu.blocks, cpu.dropout, cpu.embedding, cpu.init, cpu.normalization, cpu.optim,
               cpu.positional]
    for module in modules:
        for name, value in vars(module).items():
            variants = ((name, value),)
            if isinstance(value, jit.SerialParallel):
                variants = ((name + ".serial", value.serial), (name + ".parallel", value.parallel))
            for label, one in variants:
                if isinstance(one, CPUDispatcher) and one.py_func.__module__ == module.__name__:
                    yield f"{module.__name__.rsplit('.', 1)[-1]}.{label}", one


# Ids by name: a dispatcher's repr holds its address, which differs between the
# pytest-xdist workers (they must collect the same ids).
@pytest.mark.parametrize("name, dispatcher", [pytest.param(*case, id=case[0])
                                              for case in _dispatchers()])
def test_every_cpu_kernel_is_cached_nogil_and_without_the_runtime(name, dispatcher):
    options = dispatcher.targetoptions
    assert type(dispatcher._cache).__name__ == "FunctionCache", name
    assert options["nogil"] is True, name
    # Numba's runtime off unless NUMBAPOS_NUMBA_INTERNALS=0 asked for the public path.
    assert options.get("_nrt") is (False if _numba_internals.enabled() else None), name
    assert options.get("parallel", False) is name.endswith(".parallel"), name


def test_option_is_true_or_none():
    assert arrays.option(True) is True
    assert arrays.option(1) is True
    assert arrays.option(False) is None
    assert arrays.option(0) is None


def _hyper(momentum=0.0, weight_decay=0.0, nesterov=False, maximize=False):
    f = np.float32
    return SGDHyper(f(0.1), f(momentum), f(1.0), f(weight_decay), nesterov, maximize)


@pytest.mark.parametrize("hyper, has_buffer, general", [
    (_hyper(), False, None),
    (_hyper(momentum=0.9), True, None),
    (_hyper(momentum=0.9, nesterov=True), True, True),
    (_hyper(weight_decay=0.01), False, True),
    (_hyper(maximize=True), False, True),
])
def test_sgd_variant_follows_the_options(hyper, has_buffer, general):
    buf = np.zeros((3, 2), np.float32)
    started = np.zeros(3, bool)
    got_buf, got_started, got_general, got_hyper = _sgd_state(buf, started, hyper)
    assert got_started is started and got_hyper is hyper
    assert (got_buf is buf) == has_buffer and (got_buf is None) != has_buffer
    assert got_general is general


def test_the_variant_is_part_of_the_compiled_signature():
    # Each option setting is a signature of its own: the kernel compiled for one
    # holds none of the other loops.
    f = np.float64
    usual = SGDHyper(f(0.1), f(0.9), f(1.0), f(0.0), False, False)
    plain = usual._replace(momentum=f(0.0))
    nesterov = usual._replace(nesterov=True)
    rows = np.array([1, 4], np.int32)
    for hyper, buf_kind, general_kind in ((usual, "array", "none"), (plain, "none", "none"),
                                          (nesterov, "array", "bool")):
        param = np.ones((6, 3))
        sgd_rows_(param, rows, np.ones((2, 3)), 2, np.zeros_like(param), np.zeros(6, bool),
                  hyper)
        np.testing.assert_allclose(param[[1, 4]], 0.9 if hyper is not nesterov else 1 - 0.1 * 1.9)
        # _sgd(table, rows, values, grad, groups, scale, scratch, seed, step, stochastic,
        #      f16, buf, started, general, hyper)
        assert any(str(sig[1]).startswith("array(int32") and str(sig[11]).startswith(buf_kind)
                   and str(sig[13]) == general_kind for sig in _sgd.serial.signatures)


def test_scale_flag_sums_match_numpy():
    grad = np.arange(12, dtype=np.float32).reshape(4, 3)
    groups = RowGroups(np.array([2, 5]), np.array([0, 2]), np.array([2, 2]),
                       np.array([0, 3, 1, 2]), 2)
    for scale, expected in ((False, [grad[0] + grad[3], grad[1] + grad[2]]),
                            (True, [grad[0] / 2 + grad[3] / 2, grad[1] / 2 + grad[2] / 2])):
        out = np.empty((2, 3), np.float32)
        sum_row_groups(grad, groups, scale, out)
        np.testing.assert_array_equal(out, np.array(expected, np.float32))


def test_zero_fills_come_from_np_zeros_and_keep_negative_zero():
    assert arrays.full((4,), 0.0, np.float32).flags.c_contiguous
    negative = arrays.full((2,), -0.0, np.float64)
    assert np.signbit(negative).all()
    np.testing.assert_array_equal(arrays.full((2, 2), True, np.bool_), True)
    np.testing.assert_array_equal(arrays.full((3,), 0, np.int64), 0)


def test_kernel_helper_is_the_only_njit_in_the_cpu_kernels():
    for module in (cpu.blocks, cpu.dropout, cpu.embedding, cpu.init, cpu.normalization,
                   optim, cpu.positional):
        assert not re.search(r"^\s*@njit", inspect.getsource(module), re.M), module.__name__


def test_a_parallel_kernel_is_one_body_compiled_twice_into_two_cache_entries():
    """``kernel(parallel=True)``: the serial compilation is a renamed copy of the body, so
    Numba's cache (keyed by qualified name, not by ``parallel``) keeps both."""
    pair = cpu.embedding._gather_rows
    assert isinstance(pair, jit.SerialParallel)
    assert pair.serial.py_func.__code__ is pair.parallel.py_func.__code__
    assert pair.serial.py_func.__qualname__ == "_gather_rows__serial"
    assert pair.parallel.py_func.__qualname__ == "_gather_rows"
    assert pair.serial.targetoptions.get("parallel", False) is False
    assert pair.parallel.targetoptions["parallel"] is True
    serial_cache = pair.serial._cache._cache_file._index_name
    parallel_cache = pair.parallel._cache._cache_file._index_name
    assert serial_cache != parallel_cache


def test_no_hand_written_parallel_twin_is_left():
    """Every ``prange`` loop is one body (``kernel(parallel=True)``), not a ``_parallel`` copy."""
    for area in cpu.AREAS:
        names = [name for name in vars(area) if name.endswith("_parallel")
                 and isinstance(vars(area)[name], CPUDispatcher | jit.SerialParallel)]
        assert not names, f"{area.__name__}: {names}"
