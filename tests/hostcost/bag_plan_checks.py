"""Checks of the bags' plans, run on the stub driver by test_bag_plans.py (beside
plan_checks.py, whose helpers they use). No kernel runs on the stub: the checks
compare launches and arrays, not values (the simulator's tests check those)."""

import sys

import numpy as np
from plan_checks import _same_but_pointers, _spy


def check_lazy_bag_backward() -> dict:
    """A planned lazy bag backward (a plain sum's row groups, its positions replaced by
    their bags): the ordinary path's launches, new groups each call, the gradient kept
    for the update; other modes and a strided gradient take the ordinary path."""
    from numba import cuda

    import numbapos.functional as F

    bag = sys.modules["numbapos.functional.bag"]
    seen = _spy()
    rng = np.random.default_rng(5)
    cases = 0
    for n, rows, dim, bags, padding_idx in [(4096, 30522, 64, 200, None), (37, 50, 8, 5, 3),
                                            (9000, 70000, 4, 900, 0)]:
        offsets = cuda.to_device(np.linspace(0, n, bags, endpoint=False).astype(np.int64))
        ids_d = cuda.to_device(rng.integers(0, rows, n))
        weight = cuda.to_device(rng.standard_normal((rows, dim)).astype(np.float32))
        grad = cuda.to_device(rng.standard_normal((bags, dim)).astype(np.float32))
        call = dict(mode="sum", sparse=True, padding_idx=padding_idx, lazy=True)
        for _ in range(3):
            F.embedding_bag_backward(grad, ids_d, weight, offsets, **call)
        seen.clear()
        result, none = F.embedding_bag_backward(grad, ids_d, weight, offsets, **call)
        planned = seen[:]
        seen.clear()
        again, _ = bag._backward(grad, ids_d, weight, offsets, False, "sum", True, None, False,
                                 padding_idx, True)
        assert none is None and _same_but_pointers(planned, seen), planned
        (groups, source, scaled), (other, _, _) = result._pending, again._pending
        assert source is grad and scaled is False
        for a, b in zip(groups, other, strict=True):
            assert (a.shape, a.dtype) == (b.shape, b.dtype)
        assert result._indices is groups.rows and result._used is groups.used
        cases += 1
    plans = len(bag._LAZY_BACKWARDS.cache.plans)
    F.embedding_bag_backward(grad, ids_d, weight, offsets, mode="mean", sparse=True, lazy=True)
    assert len(bag._LAZY_BACKWARDS.cache.plans) == plans  # mean: summed, the ordinary path
    return {"lazy_bag_backwards": cases, "plans": plans}
