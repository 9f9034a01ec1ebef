"""The CPU row kernels' parts: how a range is cut, and the helper threads after a fork."""

import multiprocessing

import numba
import numpy as np
import pytest

import numbapos.functional as F
from numbapos.kernels.cpu import arrays


def test_small_work_is_one_part_and_large_work_one_part_per_thread():
    assert arrays.split_range(1000, arrays.PARALLEL_MIN_ELEMENTS - 1) == [(0, 1000)]
    parts = arrays.split_range(1001, arrays.PARALLEL_MIN_ELEMENTS)
    assert len(parts) == min(numba.get_num_threads(), 1001)
    assert parts[0][0] == 0 and parts[-1][1] == 1001
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))
    assert arrays.split_range(1, 10**9) == [(0, 1)]


def test_every_part_finishes_before_an_error_is_raised():
    done = []

    def kernel(start, stop):
        if start == 0:
            raise RuntimeError("first part fails")
        done.append((start, stop))

    ranges = [(0, 5), (5, 10), (10, 15)]
    with pytest.raises(RuntimeError, match="first part fails"):
        arrays.run_split(kernel, ranges)
    assert sorted(done) == [(5, 10), (10, 15)]


def _lookup_in_child(_):
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(5000, 64)).astype(np.float32)
    ids = rng.integers(0, 5000, size=(64, 128))
    return F.embedding(ids, weight)


def test_a_forked_child_gets_its_own_helper_threads():
    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("no fork on this platform")
    expected = _lookup_in_child(None)  # the parent's helper threads exist now
    with multiprocessing.get_context("fork").Pool(1) as pool:
        got = pool.map_async(_lookup_in_child, [None]).get(timeout=120)[0]
    np.testing.assert_array_equal(got, expected)
