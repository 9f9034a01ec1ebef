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

import pytest
from conftest import (
    STEP_IMPLEMENTATIONS,
    skip_without_torch,
    sparse_training_step,
    torch,
)

from numbapos import optim

OURS = {
    "adam": lambda params: optim.Adam(params, lr=1e-3),
    "adagrad": lambda params: optim.Adagrad(params, lr=1e-2),
    "rowwise_adagrad": lambda params: optim.RowWiseAdagrad(params, lr=1e-2),
}


def _theirs(name):
    def make(params, sparse):
        if name == "adam":
            return (torch.optim.SparseAdam if sparse else torch.optim.Adam)(params, lr=1e-3)
        return torch.optim.Adagrad(params, lr=1e-2)
    return make


@pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning")
@pytest.mark.parametrize("name", list(OURS))
@pytest.mark.parametrize("impl", STEP_IMPLEMENTATIONS)
def test_sparse_training_step_per_optimiser(benchmark, step_data, name, impl):
    """Forward + backward + step (V=50,000, D=768, ids (32, 512)) with Adam, Adagrad and
    row-wise Adagrad."""
    skip_without_torch(impl)
    benchmark.group = f"sparse_step_50k_768_{name}"
    step = sparse_training_step(impl, step_data, OURS[name], _theirs(name))
    benchmark.pedantic(step, rounds=15, iterations=1, warmup_rounds=5)
