"""Grouping positions by row on the GPU (numbapos/kernels/cuda/grouping.py): the one-block
path (up to SMALL_MAX ids) and the onesweep radix sort give the same RowGroups, the CPU's
groups, and gradients with the CPU's bits.

On Numba's simulator SMALL_MAX is 256 (4,096 on a GPU) and a tile 64 ids (256), so both
paths run at small sizes and the sort's inputs make many tiles. The simulator runs blocks
one after another: the look-back never waits there (its summing is tested directly).
"""

import numpy as np
import pytest
from conftest import dev

pytest.importorskip("numba.cuda")

from numba import cuda  # noqa: E402

from numbapos._gpuhost import launch  # noqa: E402
from numbapos.kernels import cpu as cpu_arrays  # noqa: E402
from numbapos.kernels import cuda as gpu_arrays  # noqa: E402
from numbapos.kernels.cpu import embedding as cpu  # noqa: E402
from numbapos.kernels.cuda import errors, grouping  # noqa: E402

SMALL = grouping.SMALL_MAX
TILE = grouping.TILE
# The largest table the one-block path packs: row numbers of SMALL_ROW_BITS bits.
WIDEST = (1 << grouping.SMALL_ROW_BITS) - 1


def _ids(rng, n, num, padding_idx=None):
    """``n`` ids into ``num`` rows: a hot row, the first and last rows, padding."""
    flat = rng.integers(0, num, size=n).astype(np.int64)
    flat[: n // 4] = flat[0]  # a hot row, then scattered repeats
    flat[n // 2:: 7] = num - 1
    flat[n // 3:: 11] = 0
    if padding_idx is not None:
        flat[1:: 5] = padding_idx
    return flat


def _host(groups):
    """``(used, rows, starts, counts, order)`` on the host, rows past ``used`` cut."""
    used = groups.used.copy_to_host()
    m = int(used[0])
    return (tuple(used), groups.rows.copy_to_host()[:m], groups.starts.copy_to_host()[:m],
            groups.counts.copy_to_host()[:m], groups.order.copy_to_host())


def _group(path, flat, padding_idx, num):
    pad = -1 if padding_idx is None else padding_idx
    before = launch.launches()
    groups = path(dev(flat), pad, num, errors.tag())
    return groups, launch.launches() - before


def _onesweep_launches(num):
    """Keys and zeros, histograms, a scatter per 8-bit digit, segments."""
    return 2 + -(-num.bit_length() // 8) + 1


def _assert_cpus_groups(got, flat, padding_idx, num):
    (distinct, grouped), rows, starts, counts, order = got
    expected = cpu.group_rows(flat, padding_idx, num)
    assert distinct == expected.used
    assert grouped == expected.counts.sum()
    np.testing.assert_array_equal(rows, expected.rows)
    np.testing.assert_array_equal(counts, expected.counts)
    # Each row's positions in increasing order (the CPU's order also holds the padding
    # positions, so only the segments compare, not where they start).
    for j, row in enumerate(rows):
        np.testing.assert_array_equal(order[starts[j]:starts[j] + counts[j]],
                                      np.flatnonzero(flat == row))
    # Then the positions grouped nowhere (padding), in input order.
    np.testing.assert_array_equal(order[grouped:], np.flatnonzero(flat == padding_idx))


@pytest.mark.parametrize("n, num, padding_idx", [
    (1, 1, None),
    (1, 5, 0),  # nothing grouped
    (2, 3, None),
    (37, 5, 2),  # repeats: 5 rows at most
    (100, 300, 7),
    (SMALL, 70_000, None),  # three radix passes, one block
    (SMALL, 2**40, 3),  # six radix passes
    (SMALL, WIDEST, None),  # the widest rows the one block packs
    (SMALL + 1, 300, 4),  # past the bound: the onesweep sort
    (SMALL + 1, 5, None),  # one pass
    (11 * TILE - 3, 70_000, 9),  # three passes, hot rows across tiles
    (16 * TILE, 60_000, None),  # two passes, whole tiles
])
def test_both_paths_give_the_same_groups_as_the_cpu(rng, n, num, padding_idx):
    flat = _ids(rng, n, num, padding_idx)
    radix, _ = _group(grouping._group_by_onesweep, flat, padding_idx, num)
    automatic, launches = _group(grouping.group_rows, flat, padding_idx, num)
    got = _host(radix)
    _assert_cpus_groups(got, flat, padding_idx, num)
    if n > SMALL:
        assert launches == _onesweep_launches(num)
    else:
        assert launches == 1
        small, small_launches = _group(grouping._group_in_one_block, flat, padding_idx, num)
        assert small_launches == 1
        for a, b in zip(got, _host(small), strict=True):
            np.testing.assert_array_equal(a, b)
    for a, b in zip(got, _host(automatic), strict=True):
        np.testing.assert_array_equal(a, b)


def test_rows_too_wide_to_pack_take_the_radix_passes(rng):
    num = WIDEST + 1
    flat = np.array([num - 1, 5, num - 1, 0, 5, num - 2], np.int64)
    groups, launches = _group(grouping.group_rows, flat, None, num)
    assert launches == _onesweep_launches(num)
    _assert_cpus_groups(_host(groups), flat, None, num)


@pytest.mark.parametrize("n", [6, SMALL, SMALL + 1, 5 * TILE])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
def test_bad_ids_are_recorded_and_grouped_nowhere(rng, n, index_dtype):
    import numbapos

    num = 50
    flat = _ids(rng, n, num)
    flat[[2, n - 1]] = [num, -3]  # the first bad position is 2
    flat = flat.astype(index_dtype)
    groups = gpu_arrays.group_rows(dev(flat), None, num)
    with pytest.raises(IndexError, match=rf"index {num} \(at flat position 2\) is out of "
                                         rf"range for num_embeddings={num}"):
        numbapos.synchronize()
    good = flat.astype(np.int64)
    good[[2, n - 1]] = num  # grouped nowhere, as padding of row `num` would be
    _assert_cpus_groups(_host(groups), good, num, num + 1)


@pytest.mark.parametrize("n", [9, SMALL + 1, 5 * TILE])
def test_all_padding_groups_nothing(n):
    used, rows, _, _, order = _host(grouping.group_rows(dev(np.full(n, 3)), 3, 4, errors.tag()))
    assert used == (0, 0) and rows.size == 0
    np.testing.assert_array_equal(order, np.arange(n))


def test_onesweep_needs_no_zeroed_memory_and_allocates_twice(rng, monkeypatch):
    # Its first launch zeroes the histograms, tickets and look-back words: scratch full of
    # words that read as published prefixes changes nothing.
    num, n = 70_000, 7 * TILE + 5
    flat = _ids(rng, n, num, 3)
    made = []

    def dirty(shape, dtype):
        made.append(shape)
        return dev(np.full(shape, (6 << grouping.STATUS_SHIFT) | 12345, dtype))

    monkeypatch.setattr(grouping.arrays, "empty", dirty)
    got = _host(grouping.group_rows(dev(flat), 3, num, errors.tag()))
    assert len(made) == 2  # the groups, the scratch
    _assert_cpus_groups(got, flat, 3, num)


@cuda.jit
def _looked_back(words, args, out):
    base, stride, tile, aggregate, prefix, use_max = args
    out[0] = grouping._look_back(words, base, stride, tile, aggregate, prefix, use_max == 1)


@pytest.mark.parametrize("use_max", [0, 1])
def test_look_back_adds_aggregates_up_to_the_first_prefix(use_max):
    # Pass 1's words (aggregate 3, prefix 4) of digit 2 of tiles 0..5, BINS words a tile:
    # tile 5 adds tiles 4, 3 (aggregates) and 2 (a prefix), and stops there.
    bins, shift = grouping.BINS, grouping.STATUS_SHIFT
    words = np.zeros(6 * bins, np.int64)
    for tile, status, value in [(0, 4, 1000), (1, 3, 50), (2, 4, 70), (3, 3, 9), (4, 3, 20)]:
        words[tile * bins + 2] = (status << shift) | value
    out = dev(np.zeros(1, np.int64))
    _looked_back[1, 1](dev(words), dev(np.array([2, bins, 5, 3, 4, use_max])), out)
    assert out.copy_to_host()[0] == (70 if use_max else 70 + 9 + 20)


@pytest.mark.parametrize("threads", [32, 64, 1024])
def test_warp_barriers_separate_only_steps_within_a_warp(threads):
    # Between two bitonic steps joined by a warp barrier, each value is touched by the
    # same warp in both (so a warp's sync orders them); the last step ends block-wide.
    for size in [2**p for p in range(1, 13)]:
        steps = []
        k = 2
        while k <= size:
            j = k // 2
            while j > 0:
                steps.append((k, j))
                j //= 2
            k *= 2
        owner = []
        for _, j in steps:
            warp_of = np.empty(size, np.int64)
            for t in range(size // 2):
                low = ((t & ~(j - 1)) << 1) | (t & (j - 1))
                warp_of[[low, low + j]] = (t % threads) // 32
            owner.append(warp_of)
        for s, (k, j) in enumerate(steps):
            if not grouping._block_barrier_after(k, j, size):
                assert s + 1 < len(steps), (size, k, j)
                np.testing.assert_array_equal(owner[s], owner[s + 1], err_msg=f"{size, k, j}")


# ---------------------------------------------------------------- gradients


BACKWARD_CASES = [  # (n, num, padding_idx, scale)
    (1, 4, None, False),
    (40, 9, 0, True),
    (SMALL, 30, 3, False),
    (SMALL, 100_000, None, True),
    (SMALL + 1, 30, None, True),
    (SMALL + 1, 100_000, 5, False),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n, num, padding_idx, scale", BACKWARD_CASES)
def test_backwards_have_the_cpus_bits(rng, dtype, n, num, padding_idx, scale):
    flat = _ids(rng, n, num, padding_idx)
    grad = rng.normal(size=(n, 4)).astype(dtype)
    grad[:: 3] *= 1e6  # sums whose bits depend on the order of the additions
    # dense
    want = np.zeros((num, 4), dtype)
    cpu.scatter_rows(grad, flat, padding_idx, scale, want)
    out = dev(np.zeros((num, 4), dtype))
    gpu_arrays.scatter_rows(dev(grad), dev(flat), padding_idx, scale, out)
    np.testing.assert_array_equal(out.copy_to_host().view(np.uint8), want.view(np.uint8))
    # sparse
    expected = cpu_arrays.group_rows(flat, padding_idx, num)
    values = np.empty((expected.rows.size, 4), dtype)
    cpu_arrays.sum_row_groups(grad, expected, scale, values)
    groups = gpu_arrays.group_rows(dev(flat), padding_idx, num)
    got = dev(np.full((n, 4), np.nan, dtype))
    gpu_arrays.sum_row_groups(dev(grad), groups, scale, got)
    used = int(groups.used.copy_to_host()[0])
    np.testing.assert_array_equal(groups.rows.copy_to_host()[:used], expected.rows)
    np.testing.assert_array_equal(got.copy_to_host()[:used].view(np.uint8),
                                  values.view(np.uint8))


def test_sparse_lookup_backward_in_two_launches(rng):
    import numbapos
    import numbapos.functional as F

    num, n = 1000, SMALL
    flat = _ids(rng, n, num, 0).reshape(8, n // 8)
    grad = rng.normal(size=flat.shape + (16,)).astype(np.float32)
    want = F.embedding_backward(grad, flat, num, 0, sparse=True)
    g, ids = dev(grad), dev(flat)
    F.embedding_backward(g, ids, num, 0, sparse=True)  # warm-up
    before = launch.launches()
    got = F.embedding_backward(g, ids, num, 0, sparse=True)
    assert launch.launches() - before == 2  # group, sum
    np.testing.assert_array_equal(numbapos.to_host(got.indices), want.indices)
    np.testing.assert_array_equal(numbapos.to_host(got.values).view(np.uint32),
                                  want.values.view(np.uint32))
