"""Pooled lookups (embedding_bag) against NumPy and PyTorch CPU, one group per mode.

The issue's case: V = 1e6, D = 128, 2,048 bags of 20 ids, float32. Targets: sum and
mean at least as fast as ``F.embedding_bag``, max at least 5x faster. The backward
group times the table gradient (sparse) with the sum pooling.
"""

import numpy as np
import pytest
from conftest import IMPLEMENTATIONS, skip_without_torch, torch

from numbapos.functional.bag import embedding_bag, embedding_bag_backward

VOCAB, DIM, BAGS, PER_BAG = 1_000_000, 128, 2048, 20


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((VOCAB, DIM), dtype=np.float32)
    ids = rng.integers(0, VOCAB, BAGS * PER_BAG)
    offsets = np.arange(0, BAGS * PER_BAG, PER_BAG)
    grad = rng.standard_normal((BAGS, DIM), dtype=np.float32)
    return weight, ids, offsets, grad


def _numpy_bag(weight, ids, offsets, mode):
    rows = weight[ids].reshape(BAGS, PER_BAG, DIM)  # equal bags: one reduction
    return {"sum": rows.sum, "mean": rows.mean, "max": rows.max}[mode](axis=1)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_bag_forward(benchmark, data, impl, mode):
    """2,048 bags of 20 ids; the group is the mode."""
    skip_without_torch(impl)
    benchmark.group = f"embedding_bag_{mode}"
    weight, ids, offsets, _ = data
    if impl == "numbapos":
        out = np.empty((BAGS, DIM), np.float32)
        embedding_bag(ids, weight, offsets, mode=mode, out=out)
        result = benchmark(embedding_bag, ids, weight, offsets, mode=mode, out=out)
    elif impl == "numpy":
        result = benchmark(_numpy_bag, weight, ids, offsets, mode)
    else:
        args = torch.from_numpy(ids), torch.from_numpy(weight), torch.from_numpy(offsets)
        with torch.no_grad():
            result = benchmark(torch.nn.functional.embedding_bag, *args, mode=mode).numpy()
    np.testing.assert_allclose(result, _numpy_bag(weight, ids, offsets, mode), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.benchmark(group="embedding_bag_sum_backward_sparse")
@pytest.mark.parametrize("impl", ["numbapos", "torch"])
def test_bag_backward_sparse(benchmark, data, impl):
    """The table gradient of a sum pooling as sparse rows."""
    skip_without_torch(impl)
    weight, ids, offsets, grad = data
    if impl == "numbapos":
        def run():
            return embedding_bag_backward(grad, ids, weight, offsets, mode="sum",
                                          sparse=True)[0]
        run()
        benchmark(run)
    else:
        w = torch.from_numpy(weight).requires_grad_()
        t_ids, t_off, t_grad = (torch.from_numpy(x) for x in (ids, offsets, grad))

        def run():
            w.grad = None
            torch.nn.functional.embedding_bag(t_ids, w, t_off, mode="sum",
                                              sparse=True).backward(t_grad)
        benchmark(run)


@pytest.mark.benchmark(group="embedding_bag_sum_train_step")
@pytest.mark.parametrize("impl", ["numbapos", "torch"])
def test_bag_train_step(benchmark, data, impl):
    """Forward + backward + sparse SGD step of a sum bag (target: >= 3x PyTorch's
    ``sparse=True`` + ``optim.SGD``)."""
    skip_without_torch(impl)
    weight, ids, offsets, grad = data
    if impl == "numbapos":
        from numbapos import optim
        from numbapos.nn.bag import EmbeddingBag

        bag = EmbeddingBag.from_pretrained(weight.copy(), freeze=False, mode="sum",
                                           sparse=True)
        opt = optim.SGD(bag.parameters(), lr=0.01)

        def step():
            bag(ids, offsets)
            bag.backward(grad)
            opt.step()
            opt.zero_grad()
    else:
        bag = torch.nn.EmbeddingBag.from_pretrained(torch.tensor(weight), freeze=False,
                                                    mode="sum", sparse=True)
        opt = torch.optim.SGD(bag.parameters(), lr=0.01)
        t_ids, t_off, t_grad = (torch.from_numpy(x) for x in (ids, offsets, grad))

        def step():
            opt.zero_grad()
            bag(t_ids, t_off).backward(t_grad)
            opt.step()
    step()
    benchmark(step)
