"""The CUDA bag kernels' paths: 16-byte vector and scalar pooling give the CPU's bits, and a
planned GPU call replays the ordinary call's launches.

The pooling kernel (kernels/cuda/bag.py ``_pool_kernel``) runs one block per bag and
stages the bag's ids in shared memory ``blockDim`` at a time; each thread owns one
column or one 16-byte vector of columns (where the table and result rows allow it) and
adds four entries' rows at a time, in input order. The cases below cross every edge of
that: D not a multiple of 4, several column chunks per thread, bags longer than a
chunk of ids, empty bags, padding, bad ids, hot rows, weights.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

import numbapos
from numbapos._device import to_device, to_host
from numbapos.functional.bag import embedding_bag, embedding_bag_backward

pytestmark = pytest.mark.skipif(not numbapos.cuda_available(),
                                reason="CUDA is not available (no GPU, simulator off)")


@pytest.fixture
def lanes_used(monkeypatch):
    """The lane counts the pooling launches chose, in order."""
    from numbapos.kernels.cuda import bag

    seen = []
    original = bag._pool_kernel

    def spy(lanes, mode, winners):
        seen.append(lanes)
        return original(lanes, mode, winners)

    monkeypatch.setattr(bag, "_pool_kernel", spy)
    return seen


def _bags(rng, rows, bags, longest, hot=None):
    sizes = rng.integers(0, longest + 1, bags)
    sizes[0] = 0  # empty bags, first and last
    sizes[-1] = 0
    sizes[1] = longest + 37  # longer than one chunk of staged ids (32 or more threads)
    ids = rng.integers(0, rows, int(sizes.sum()))
    if hot is not None:
        ids[::3] = hot  # a row in every third place (the padding row, when there is one)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    return ids, offsets


def _unaligned(table):
    """The same values, C-contiguous, one element past a 16-byte boundary (the scalar
    path)."""
    memory = to_device(np.concatenate([table[:1, :1].ravel(), table.ravel()]), "cuda")
    return memory[1:].reshape(table.shape)


def _pool_both(weight, ids, offsets, lanes_used, **kwargs):
    """The pooled rows on the CPU, on CUDA with an aligned table, and with an unaligned one."""
    cpu = embedding_bag(ids, weight, offsets, **kwargs)
    gpu_ids, gpu_offsets = to_device(ids, "cuda"), to_device(offsets, "cuda")
    weights = kwargs.pop("per_sample_weights", None)
    if weights is not None:
        kwargs["per_sample_weights"] = to_device(weights, "cuda")
    aligned = to_host(embedding_bag(gpu_ids, to_device(weight, "cuda"), gpu_offsets, **kwargs))
    scalar = to_host(embedding_bag(gpu_ids, _unaligned(weight), gpu_offsets, **kwargs))
    numbapos.synchronize()
    return cpu, aligned, scalar


@pytest.mark.parametrize("dim, dtype, vector_lanes", [
    (8, np.float32, 4),  # two vectors per row, one column chunk
    (6, np.float32, 1),  # D % 4 != 0: scalar only
    (520, np.float32, 4),  # 130 vectors: more than one chunk of 128 threads
    (6, np.float64, 2),
])
@pytest.mark.parametrize("mode, pad, weighted", [
    ("sum", None, False), ("sum", 3, True), ("sum", None, True), ("mean", 3, False),
    ("max", None, False), ("max", 3, False)])
def test_vector_and_scalar_pooling_give_the_cpu_bits(rng, lanes_used, dim, dtype,
                                                     vector_lanes, mode, pad, weighted):
    rows = 40
    weight = rng.standard_normal((rows, dim)).astype(dtype)
    weight[5] = weight[7]  # tied maxima: the first entry wins
    bags = 3 if dim > 100 else 6
    ids, offsets = _bags(rng, rows, bags, 9, hot=3)
    ids[2] = 7
    ids[4] = 5
    psw = rng.standard_normal(ids.shape).astype(dtype) if weighted else None
    cpu, aligned, scalar = _pool_both(weight, ids, offsets, lanes_used, mode=mode,
                                      padding_idx=pad, per_sample_weights=psw)
    assert lanes_used == [vector_lanes, 1]
    assert aligned.tobytes() == cpu.tobytes()
    assert scalar.tobytes() == cpu.tobytes()


@pytest.mark.parametrize("mode", ["sum", "max"])
def test_half_table_pools_by_elements_in_float32(rng, lanes_used, mode):
    table = rng.standard_normal((20, 8)).astype(np.float16)
    ids, offsets = _bags(rng, 20, 4, 6)
    cpu = embedding_bag(ids, table, offsets, mode=mode)
    gpu = embedding_bag(to_device(ids, "cuda"), to_device(table, "cuda"),
                        to_device(offsets, "cuda"), mode=mode)
    assert lanes_used == [1]
    assert to_host(gpu).tobytes() == cpu.tobytes()


def test_max_backward_sends_each_column_to_the_cpu_winner_on_both_paths(rng, lanes_used):
    weight = np.round(rng.standard_normal((12, 8)), 1).astype(np.float32)  # many ties
    ids, offsets = _bags(rng, 12, 5, 7)
    grad = rng.standard_normal((5, 8)).astype(np.float32)
    cpu = embedding_bag_backward(grad, ids, weight, offsets, mode="max")[0]
    for table in (to_device(weight, "cuda"), _unaligned(weight)):
        got = embedding_bag_backward(to_device(grad, "cuda"), to_device(ids, "cuda"), table,
                                     to_device(offsets, "cuda"), mode="max")[0]
        assert to_host(got).tobytes() == cpu.tobytes()
    assert lanes_used == [4, 1]


def test_two_dimensional_input_pools_without_offsets(rng):
    weight = rng.standard_normal((30, 8)).astype(np.float32)
    ids = rng.integers(0, 30, (5, 40)).astype(np.int32)  # 40 ids a bag: two chunks
    expected = embedding_bag(ids, weight, mode="mean", padding_idx=2)
    got = embedding_bag(to_device(ids, "cuda"), to_device(weight, "cuda"), mode="mean",
                        padding_idx=2)
    assert to_host(got).tobytes() == expected.tobytes()


def test_a_bad_id_in_a_long_bag_is_reported_once_deferred(rng):
    weight = to_device(rng.standard_normal((10, 8)).astype(np.float32), "cuda")
    ids = np.arange(70) % 10
    ids[45] = 10  # in the second chunk of ids
    ids[60] = -1
    with pytest.raises(IndexError, match=r"input: index 10 \(at flat position 45\)"):
        embedding_bag(to_device(ids, "cuda"), weight, to_device(np.array([0, 30]), "cuda"),
                      mode="sum")
        numbapos.synchronize()


def test_the_first_bad_offset_is_reported_whatever_thread_finds_it():
    weight = to_device(np.ones((5, 4), np.float32), "cuda")
    offsets = np.array([0, 2, 1, 0, 9, 1] + [3] * 300)  # bad at 2, 3, 4, 5: 2 is reported
    with pytest.raises(ValueError, match=r"offsets: gives position 1 \(at flat position 2\)"):
        embedding_bag(to_device(np.array([1, 2, 3]), "cuda"), weight,
                      to_device(offsets, "cuda"), mode="sum")
        numbapos.synchronize()


# ---------------------------------------------- plans, on the stub driver (no GPU)

_PLAN_CHECKS = r'''
import json, sys
import numpy as np
import numbapos, plan_checks
import numbapos.functional as F
from numba import cuda

numbapos._device.kernels_for("cuda")
bag = sys.modules["numbapos.functional.bag"]
seen = plan_checks._spy()
rng = np.random.default_rng(4)
checked = []
for mode, dim, two_d, weighted, pad, into in [
        ("sum", 128, False, False, None, False), ("mean", 6, False, False, 3, True),
        ("max", 16, True, False, None, False), ("sum", 8, False, True, 2, False)]:
    ids = rng.integers(0, 50, (40, 3) if two_d else 120)
    offsets = None if two_d else np.sort(rng.integers(0, 120, 40))
    offsets = None if two_d else cuda.to_device(np.concatenate([[0], offsets[1:]]))
    ids = cuda.to_device(ids)
    table = cuda.to_device(rng.standard_normal((50, dim)).astype(np.float32))
    psw = cuda.to_device(rng.standard_normal(ids.shape).astype(np.float32)) if weighted \
        else None
    out = cuda.device_array((40, dim), np.float32) if into else None
    grad = cuda.to_device(rng.standard_normal((40, dim)).astype(np.float32))
    kwargs = dict(mode=mode, padding_idx=pad, per_sample_weights=psw)
    for _ in range(3):  # compile, record, replay
        F.embedding_bag(ids, table, offsets, out=out, **kwargs)
        for sparse in (False, True):
            F.embedding_bag_backward(grad, ids, table, offsets, sparse=sparse, **kwargs)
    seen.clear()
    result = F.embedding_bag(ids, table, offsets, out=out, **kwargs)
    planned = seen[:]
    seen.clear()
    again = bag._forward(ids, table, offsets, None, 2.0, mode, psw, False, pad, result, False)
    assert plan_checks._same_but_pointers(planned, seen) and len(planned) == 1 + (not two_d), \
        (planned, seen)
    if into:
        assert result is out
    for sparse in (False, True):
        seen.clear()
        grads = F.embedding_bag_backward(grad, ids, table, offsets, sparse=sparse, **kwargs)
        planned = seen[:]
        seen.clear()
        ordinary = bag._backward(grad, ids, table, offsets, False, mode, sparse, psw, False,
                                 pad)
        assert plan_checks._same_but_pointers(planned, seen), (planned, seen)
        assert (grads[1] is None) == (ordinary[1] is None) == (not weighted)
        if sparse:
            for name in ("_indices", "_values", "_used"):
                a, b = getattr(grads[0], name), getattr(ordinary[0], name)
                assert (a.shape, a.dtype) == (b.shape, b.dtype), name
        else:
            assert (grads[0].shape, grads[0].dtype) == (ordinary[0].shape, ordinary[0].dtype)
    checked.append(len(planned))
print(json.dumps({"checked": checked,
                  "plans": [len(bag._FORWARDS.cache.plans), len(bag._BACKWARDS.cache.plans)]}))
'''


def test_planned_calls_replay_the_ordinary_launches(request, tmp_path_factory):
    """On the stub driver (the real host path, no kernel runs): a planned forward and
    backward hand the driver exactly what the ordinary path does, but for pointers."""
    pytest.importorskip("cuda.bindings")
    hostcost = str(Path(__file__).resolve().parents[1] / "hostcost")
    if hostcost not in sys.path:
        sys.path.insert(0, hostcost)
    import stub

    folder = stub.built_for(request, tmp_path_factory)
    result = stub.run(_PLAN_CHECKS, folder)
    assert len(result["checked"]) == 4
    assert result["plans"] == [4, 8]  # one per forward signature, two per backward


@pytest.mark.parametrize("dim, dtype, vector_lanes", [(8, np.float32, 4), (6, np.float32, 1),
                                                      (4, np.float64, 2)])
@pytest.mark.parametrize("mode, pad, weighted, by_freq", [
    ("sum", None, False, False), ("sum", 3, True, False), ("mean", 3, False, True),
    ("max", None, False, False)])
@pytest.mark.parametrize("sparse", [False, True])
def test_vector_and_scalar_table_gradients_give_the_cpu_bits(rng, monkeypatch, dim, dtype,
                                                             vector_lanes, mode, pad, weighted,
                                                             by_freq, sparse):
    from numbapos.kernels.cuda import bag

    seen = []
    original = bag._table_grad_kernel
    monkeypatch.setattr(bag, "_table_grad_kernel",
                        lambda lanes, mode: seen.append(lanes) or original(lanes, mode))
    rows = 20
    weight = np.round(rng.standard_normal((rows, dim)), 1).astype(dtype)  # ties for max
    ids, offsets = _bags(rng, rows, 5, 8, hot=4)
    ids[:40:2] = ids[1:41:2] = 4  # row 4: a group longer than a block (32 threads)
    ids[5] = 3
    grad = rng.standard_normal((5, dim)).astype(dtype)
    psw = rng.standard_normal(ids.shape).astype(dtype) if weighted else None
    kwargs = dict(mode=mode, padding_idx=pad, scale_grad_by_freq=by_freq, sparse=sparse)
    cpu = embedding_bag_backward(grad, ids, weight, offsets, per_sample_weights=psw, **kwargs)
    aligned, unaligned = to_device(grad, "cuda"), _unaligned(grad)
    for g in (aligned, unaligned):
        got = embedding_bag_backward(
            g, to_device(ids, "cuda"), to_device(weight, "cuda"), to_device(offsets, "cuda"),
            per_sample_weights=None if psw is None else to_device(psw, "cuda"), **kwargs)
        if sparse:
            values = to_host(got[0].values)
            assert (to_host(got[0].indices) == cpu[0].indices).all()
            assert values.tobytes() == cpu[0].values.tobytes()
        else:
            assert to_host(got[0]).tobytes() == cpu[0].tobytes()
        if weighted:
            assert to_host(got[1]).tobytes() == cpu[1].tobytes()
    assert seen == [vector_lanes, 1]
