"""Test configuration. The CUDA simulator must be chosen before Numba is imported."""

import os
import sys

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# The tests run with the settings users get (numbapos.config's defaults: adaptive
# threads on). A test that compares parallel kernels with their serial twins or
# across thread counts asks for the `parallel_threshold` fixture, which also
# switches adaptive threads off, so that on a busy machine the launchers do not
# fall back to the serial kernels.

import numpy as np  # noqa: E402
import pytest  # noqa: E402

FLOAT_DTYPES = [np.float32, np.float64]

# SGD option sets every optimiser test runs through (PyTorch's update rule, each branch).
SGD_CONFIGS = [
    dict(),
    dict(momentum=0.9),
    dict(momentum=0.9, dampening=0.5),
    dict(momentum=0.8, nesterov=True),
    dict(weight_decay=0.01),
    dict(momentum=0.5, weight_decay=0.1, maximize=True),
    dict(momentum=0.9, nesterov=True, weight_decay=1e-3, maximize=True),
]
INDEX_DTYPES = [np.int32, np.int64]


def dtype_pairs_in_turn(cases):
    """``(dtype, index_dtype, *case)`` params: case ``k`` with the ``k % 4``-th pair of
    (FLOAT_DTYPES x INDEX_DTYPES) in the default run (every pair and every case reached),
    every other pair of each case under the exhaustive marker."""
    pairs = [(d, i) for d in FLOAT_DTYPES for i in INDEX_DTYPES]
    params = []
    for k, case in enumerate(cases):
        for j, (dtype, index_dtype) in enumerate(pairs):
            params.append(pytest.param(
                dtype, index_dtype, *case,
                id="-".join([np.dtype(dtype).name, np.dtype(index_dtype).name,
                             *map(str, case)]),
                marks=() if j == k % len(pairs) else pytest.mark.exhaustive))
    return params


if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
    # Barrier-free blocks run their threads in turn, others wait at barriers
    # without polling; and cuda.shared.array's race fixed (simulator_patches.py).
    import simulator_patches

    simulator_patches.install()
    if os.environ.get("PTX_SIGNATURES"):
        # Note each kernel launch's argument types: tests/ptx_signatures.py then
        # compiles them all to PTX (.ci/run), which the simulator never does.
        import ptx_signatures

        ptx_signatures.install_recorder()


def pytest_sessionfinish(session, exitstatus):
    # Every process records the launches of the tests it ran (with pytest-xdist each
    # worker its own) and merges them into the one file, under a lock.
    path = os.environ.get("PTX_SIGNATURES")
    if path and os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" and "ptx_signatures" in sys.modules:
        sys.modules["ptx_signatures"].save(path)


def _numba_cuda_importable() -> bool:
    try:
        from numba import cuda  # noqa: F401
    except ImportError:
        return False
    return True


def pytest_ignore_collect(collection_path, config):
    """The CUDA kernel tests need numba-cuda (its simulator runs them without a GPU)."""
    if collection_path.name.startswith("test_cuda_") and not _numba_cuda_importable():
        return True
    return None


def pytest_report_header(config):
    if not _numba_cuda_importable():
        return "numba-cuda is not installed: tests/cuda/test_cuda_*.py are not collected"
    return None


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def two_threads() -> int:
    """2, for tests that compare results across thread counts; they skip, not pass,
    where Numba has fewer than 2 threads (the comparison would be vacuous)."""
    import numba

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs at least 2 Numba threads (NUMBA_NUM_THREADS)")
    return 2


def tolerance(dtype):
    """(rtol, atol) suited to comparisons in ``dtype``."""
    return (1e-5, 1e-6) if np.dtype(dtype) == np.float32 else (1e-12, 1e-12)


DEVICES = ["cpu", "cuda"]


def dev(a):
    """A host array as a Numba device array (None passes through), for kernel tests.
    bfloat16 goes through numbapos.to_device (as its bits: on a real GPU numba-cuda
    cannot copy an ml_dtypes array)."""
    from numba import cuda

    import numbapos

    if a is None:
        return None
    if numbapos._device.is_bfloat16(a):
        return numbapos.to_device(np.ascontiguousarray(a), "cuda")
    return cuda.to_device(np.ascontiguousarray(a))


def nan_device(shape, dtype):
    """A device output pre-filled with NaN (-7 for integers), so an element a launcher
    leaves unwritten shows."""
    fill = np.nan if np.dtype(dtype).kind == "f" else -7
    return dev(np.full(shape, fill, dtype=dtype))


@pytest.fixture(params=DEVICES)
def device(request):
    """Each test that takes it runs on the CPU and on CUDA (the simulator without a GPU)."""
    import numbapos

    if request.param == "cuda" and not numbapos.cuda_available():
        pytest.skip("CUDA is not available (no GPU and the simulator is off)")
    return request.param


def _param_id(value):
    if isinstance(value, np.ndarray):
        strided = "" if value.flags.c_contiguous else "-strided"
        return f"{value.dtype}-" + "x".join(map(str, value.shape)) + strided
    if isinstance(value, list):
        return "list"
    if isinstance(value, tuple):
        return "x".join(map(str, value)) or "0d"
    if isinstance(value, dict):  # arrays by dtype and shape: ids the same in every process
        return str({k: _param_id(v) if isinstance(v, np.ndarray) else v
                    for k, v in value.items()})
    return getattr(value, "__name__", None) or str(value)


def device_cases(cases, cuda=None):
    """``(device, *case)`` parameters for ``parametrize(..., indirect=["device"])``.

    Every case runs on the CPU; on CUDA, ``cuda`` says which: None for all of
    them, a predicate called with a case's values, or the CUDA cases themselves
    (a subset, or smaller versions, that the simulator can afford). Through the
    ``device`` fixture a CUDA case still skips where CUDA is unavailable.
    """
    cases = [tuple(case) for case in cases]
    if cuda is None:
        on_cuda = cases
    elif callable(cuda):
        on_cuda = [case for case in cases if cuda(*case)]
    else:
        on_cuda = [tuple(case) for case in cuda]
    rows = [("cpu", *case) for case in cases] + [("cuda", *case) for case in on_cuda]
    return [pytest.param(*row, id="-".join(map(_param_id, row))) for row in rows]


def on(device, x):
    """A host array on ``device`` (None passes through)."""
    import numbapos

    return None if x is None else numbapos.to_device(np.asarray(x), device)


def host(x):
    """Any array as a NumPy array (None passes through)."""
    import numbapos

    return None if x is None else numbapos.to_host(x)


@pytest.fixture
def parallel_threshold():
    """``parallel_threshold(n)`` sets config's ``parallel_min_elements`` for the rest of the test.

    ``1 << 40`` makes every CPU launcher run its serial kernel, ``1`` (or 0) its
    parallel one (compiled in the foreground); the setting comes back when the
    test ends.
    """
    import contextlib

    import numbapos

    with contextlib.ExitStack() as stack:
        def set_threshold(n):
            stack.enter_context(numbapos.config.override(parallel_min_elements=n,
                                                         adaptive_threads=False))

        yield set_threshold


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The host-cost table of tests/hostcost when it ran in this process (its microseconds
    are shown, never asserted). Here, not in a conftest of tests/hostcost: a second module
    named ``conftest`` would shadow this one for the tests that import from it."""
    stub = sys.modules.get("stub")
    table = config.stash.get(stub.SUMMARY, None) if stub is not None else None
    if table is not None:
        terminalreporter.write_sep("-", "host cost per op call, numbapos on the stub CUDA driver")
        terminalreporter.write_line(table)
