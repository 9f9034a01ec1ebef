"""The test harness's changes to Numba's CUDA simulator (tests/simulator_patches.py).

Barrier-free blocks run their threads in turn and the other blocks wait at barriers
without polling: both must give what the simulator's own block runner gives, name
the failing thread as it does, never hang, and refuse a barrier the scan missed.
"""

import importlib
import inspect
import os
import pkgutil
import threading

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(os.environ.get("NUMBA_ENABLE_CUDASIM") != "1",
                                reason="changes the CUDA simulator only")

cuda = pytest.importorskip("numba.cuda")
simulator_kernel = pytest.importorskip("numba.cuda.simulator.kernel")

from simulator_patches import uses_barriers  # noqa: E402


@cuda.jit
def _indices(out):
    # Every index the kernel API gives a thread, at the thread's flat position.
    x, y, z = cuda.grid(3)
    i = (z * cuda.gridDim.y * cuda.blockDim.y + y) * cuda.gridDim.x * cuda.blockDim.x + x
    out[i, 0] = cuda.threadIdx.x + 10 * cuda.threadIdx.y + 100 * cuda.threadIdx.z
    out[i, 1] = cuda.blockIdx.x + 10 * cuda.blockIdx.y + 100 * cuda.blockIdx.z
    out[i, 2] = cuda.laneid
    out[i, 3] = cuda.blockDim.x * cuda.blockDim.y * cuda.blockDim.z


@cuda.jit(device=True)
def _block_sum(shared, t):
    # A tree reduction over a block's shared array (its size a power of two).
    step = shared.size // 2
    while step > 0:
        if t < step:
            shared[t] += shared[t + step]
        cuda.syncthreads()
        step //= 2


@cuda.jit
def _sums(x, out):
    # Per-block sums of x through shared memory and barriers.
    shared = cuda.shared.array(64, np.float64)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    shared[t] = x[i] if i < x.size else 0.0
    cuda.syncthreads()
    _block_sum(shared, t)
    if t == 0:
        out[cuda.blockIdx.x] = shared[0]


@cuda.jit
def _early_exit_then_barrier(x, out):
    # Threads past x.size return before the barrier: the others still pass it.
    shared = cuda.shared.array(32, np.float64)
    t = cuda.threadIdx.x
    if t >= x.size:
        return
    shared[t] = x[t]
    cuda.syncthreads()
    out[t] = shared[x.size - 1 - t]


@cuda.jit
def _votes(flags, out):
    t = cuda.threadIdx.x
    out[0] = cuda.syncthreads_count(flags[t])
    out[1] = cuda.syncthreads_and(flags[t])
    out[2] = cuda.syncthreads_or(flags[t])


@cuda.jit
def _histogram(ids, counts):
    i = cuda.grid(1)
    if i < ids.size:
        cuda.atomic.add(counts, ids[i], 1)


def _make_closure_kernel():
    reduce_in_block = _block_sum

    @cuda.jit
    def closure_kernel(x):
        reduce_in_block(x, cuda.threadIdx.x)

    return closure_kernel


@cuda.jit
def _plain(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = 2 * x[i]


@cuda.jit(device=True)
def _wait_for_the_block():
    cuda.syncthreads()


_CALLS = (_wait_for_the_block,)  # the scan does not look into tuples


@cuda.jit
def _hidden_barrier(x):
    _CALLS[0]()  # a barrier the scan cannot see (NVVM compiles it: CI's PTX check)
    x[cuda.threadIdx.x] = 1


@cuda.jit
def _raises_at(x, bad_block, bad_thread):
    if cuda.blockIdx.x == bad_block and cuda.threadIdx.x == bad_thread:
        x[x.size + 5] = 1  # out of bounds: IndexError
    x[cuda.grid(1)] = 1


@cuda.jit
def _raises_while_others_wait(x):
    # The last thread starts last: the others already wait at the barrier when it raises.
    if cuda.threadIdx.x == cuda.blockDim.x - 1:
        x[x.size + 5] = 1
    cuda.syncthreads()
    x[cuda.threadIdx.x] = 1


def test_the_scan_finds_barriers_directly_through_device_functions_and_closures():
    assert uses_barriers(_sums.py_func)  # directly and through _block_sum
    assert uses_barriers(_block_sum.py_func)
    assert uses_barriers(_votes.py_func)  # syncthreads_count / _and / _or
    assert uses_barriers(_make_closure_kernel().py_func)
    assert not uses_barriers(_plain.py_func)
    assert not uses_barriers(_histogram.py_func)
    assert not uses_barriers(_indices.py_func)


def test_every_numbapos_kernel_that_calls_a_barrier_is_scanned_as_one():
    import numbapos.kernels.cuda as package

    checked = 0
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for obj in vars(module).values():
            function = getattr(obj, "py_func", None)
            if function is None or getattr(function, "__module__", None) != module.__name__:
                continue
            if "syncthreads" in inspect.getsource(function):
                assert uses_barriers(function), f"{module.__name__}.{function.__name__}"
                checked += 1
    assert checked >= 5  # reduce.py, grouping.py, half.py, rotary.py have them


def _in_helper_thread(function, seconds=60):
    """``function()`` run in a helper thread: its result, or its error raised here; a
    hang fails the test instead of stopping the suite."""
    outcome = {}

    def target():
        try:
            outcome["result"] = function()
        except Exception as error:  # noqa: BLE001 - raised again below
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the launch hangs"
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _launch_both_ways(launch, monkeypatch):
    """What ``launch()`` returns with the patched block runner and with the simulator's."""
    patched = _in_helper_thread(launch)
    with monkeypatch.context() as m:
        m.setattr(simulator_kernel.BlockManager, "run",
                  simulator_kernel.BlockManager.original_run)
        original = _in_helper_thread(launch)
    return patched, original


@pytest.mark.parametrize("grid, block", [((3,), (4,)), ((2, 3), (3, 2)), ((2, 1, 2), (2, 3, 2))])
def test_blocks_run_in_turn_see_the_indices_the_simulator_gives(monkeypatch, grid, block):
    threads = int(np.prod(grid)) * int(np.prod(block))

    def launch():
        out = np.full((threads, 4), -1, np.int64)
        _indices[grid, block](out)
        return out

    patched, original = _launch_both_ways(launch, monkeypatch)
    np.testing.assert_array_equal(patched, original)
    assert (patched >= 0).all()


def test_blocks_with_barriers_give_the_simulators_results(monkeypatch, rng):
    x = rng.standard_normal(200)
    flags = (np.arange(16) % 3 == 0).astype(np.int32)
    ids = rng.integers(0, 7, 300)

    def launch():
        sums = np.zeros(4)
        _sums[4, 64](x, sums)
        reversed_ = np.zeros(20)
        _early_exit_then_barrier[1, 32](x[:20], reversed_)
        votes = np.zeros(3, np.int32)
        _votes[1, 16](flags, votes)
        all_votes = np.zeros(3, np.int32)
        _votes[1, 16](np.ones(16, np.int32), all_votes)
        counts = np.zeros(7, np.int64)
        _histogram[5, 64](ids, counts)
        return sums, reversed_, votes, all_votes, counts

    patched, original = _launch_both_ways(launch, monkeypatch)
    for mine, theirs in zip(patched, original, strict=True):
        np.testing.assert_array_equal(mine, theirs)
    sums, reversed_, votes, all_votes, counts = patched
    np.testing.assert_allclose(sums, [x[i * 64:(i + 1) * 64].sum() for i in range(4)])
    np.testing.assert_array_equal(reversed_, x[:20][::-1])
    assert list(votes) == [6, 0, 1] and list(all_votes) == [16, 1, 1]
    np.testing.assert_array_equal(counts, np.bincount(ids, minlength=7))


def test_an_error_names_its_thread_and_block_and_the_next_launch_runs():
    x = np.zeros(4 * 8, np.int32)
    with pytest.raises(IndexError, match=r"tid=\[5, 0, 0\] ctaid=\[2, 0, 0\]"):
        _raises_at[4, 8](x, 2, 5)
    # With a barrier: the thread that raised never reaches it and the others,
    # waiting there, are released (no hang) and the first error is reported.
    with pytest.raises(IndexError, match=r"tid=\[7, 0, 0\] ctaid=\[0, 0, 0\]"):
        _in_helper_thread(lambda: _raises_while_others_wait[1, 8](np.zeros(8, np.int32)))
    x[:] = 3
    _plain[4, 8](x)
    assert (x == 6).all()


def test_a_barrier_the_scan_misses_raises_instead_of_running_unsynchronised():
    assert not uses_barriers(_hidden_barrier.py_func)
    with pytest.raises(RuntimeError, match="judged barrier-free"):
        _hidden_barrier[1, 4](np.zeros(4, np.int32))


def test_a_failed_barrier_block_leaves_later_barrier_blocks_working(rng):
    with pytest.raises(IndexError):
        _in_helper_thread(lambda: _raises_while_others_wait[1, 8](np.zeros(8, np.int32)))
    x = rng.standard_normal(64)
    sums = np.zeros(1)
    _sums[1, 64](x, sums)
    np.testing.assert_allclose(sums, [x.sum()])

