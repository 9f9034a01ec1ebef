"""The sparse training step with each optimiser, against PyTorch's dense and sparse steps.

As the ``sparse_step_50k_768`` group of ``test_bench_embedding.py`` (forward +
backward + step on V = 50,000, D = 768, ids (32, 512)), for the optimisers
other than SGD, one group each:

- ``numbapos_fused``: ``fuse_with_backward``, each used row's gradient summed
  inside its update; ``numbapos``: backward, then ``step``;
- ``torch_dense``: ``nn.Embedding(sparse=False)`` and the same optimiser
  (every row of the table and of its state moves each step);
- ``torch_sparse``: ``nn.Embedding(sparse=True)`` with PyTorch's sparse
  counterpart (``SparseAdam`` for Adam, ``Adagrad`` itself).

PyTorch has no row-wise Adagrad (FBGEMM's): its group compares with PyTorch's
element-wise Adagrad, the rule it approximates, whose state is D times larger.

Run with ``pytest benchmarks/test_bench_optimizers.py --benchmark-group-by=group``.
"""

import numpy as np
import pytest
from conftest import skip_without_torch, torch

from numbapos import nn, optim

VOCAB, DIM, BATCH = 50_000, 768, (32, 512)

OURS = {
    "adam": lambda params: optim.Adam(params, lr=1e-3),
    "adagrad": lambda params: optim.Adagrad(params, lr=1e-2),
    "rowwise_adagrad": lambda params: optim.RowWiseAdagrad(params, lr=1e-2),
}


def _theirs(name, params, sparse):
    if name == "adam":
        return (torch.optim.SparseAdam if sparse else torch.optim.Adam)(params, lr=1e-3)
    return torch.optim.Adagrad(params, lr=1e-2)


@pytest.fixture(scope="module")
def step_data():
    rng = np.random.default_rng(2)
    weight = rng.normal(size=(VOCAB, DIM)).astype(np.float32)
    grad = rng.normal(size=BATCH + (DIM,)).astype(np.float32)
    batches = [rng.integers(0, VOCAB, size=BATCH) for _ in range(8)]
    return weight, grad, batches


@pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning")
@pytest.mark.parametrize("name", list(OURS))
@pytest.mark.parametrize("impl", ["numbapos_fused", "numbapos", "torch_dense", "torch_sparse"])
def test_sparse_training_step_per_optimiser(benchmark, step_data, name, impl):
    """Forward + backward + step (V=50,000, D=768, ids (32, 512)) with Adam, Adagrad and
    row-wise Adagrad."""
    skip_without_torch(impl)
    benchmark.group = f"sparse_step_50k_768_{name}"
    weight, grad, batches = step_data
    turn = iter(range(10**9))
    if impl.startswith("numbapos"):
        emb = nn.Embedding(VOCAB, DIM, sparse=True, _weight=weight.copy())
        opt = OURS[name](emb.parameters())
        if impl == "numbapos_fused":
            opt.fuse_with_backward()

        def step():
            emb(batches[next(turn) % 8])
            emb.backward(grad)
            opt.step()
            opt.zero_grad()
    else:
        emb = torch.nn.Embedding(VOCAB, DIM, sparse=impl == "torch_sparse",
                                 _weight=torch.tensor(weight))
        opt = _theirs(name, emb.parameters(), impl == "torch_sparse")
        t_grad = torch.from_numpy(grad)

        def step():
            opt.zero_grad()
            emb(torch.from_numpy(batches[next(turn) % 8])).backward(t_grad)
            opt.step()
    benchmark.pedantic(step, rounds=15, iterations=1, warmup_rounds=5)
