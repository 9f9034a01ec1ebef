"""Shared pieces of the benchmark suites (run with ``pytest benchmarks``).

Each group times numbapos next to NumPy and, when installed, PyTorch on the
same inputs, so ``--benchmark-group-by=group`` shows the ratios directly. JIT
compilation is excluded: every numbapos case runs once before it is timed.
"""

import pytest

import numbapos

try:
    import torch
except ImportError:  # PyTorch is an optional peer
    torch = None
else:
    torch.set_num_threads(numbapos.get_num_threads())

IMPLEMENTATIONS = ["numbapos", "numpy", "torch"]


def skip_without_torch(impl):
    if impl == "torch" and torch is None:
        pytest.skip("PyTorch is not installed (pip install torch==2.13.0)")


# ---------------------------------------------------------------- the sparse training step

STEP_VOCAB, STEP_DIM, STEP_BATCH = 50_000, 768, (32, 512)
STEP_IMPLEMENTATIONS = ["numbapos_fused", "numbapos", "torch_dense", "torch_sparse"]


@pytest.fixture(scope="module")
def step_data():
    """Table, output gradient and eight id batches of the issue's sparse training step."""
    import numpy as np

    rng = np.random.default_rng(2)
    weight = rng.normal(size=(STEP_VOCAB, STEP_DIM)).astype(np.float32)
    grad = rng.normal(size=STEP_BATCH + (STEP_DIM,)).astype(np.float32)
    batches = [rng.integers(0, STEP_VOCAB, size=STEP_BATCH) for _ in range(8)]
    return weight, grad, batches


def sparse_training_step(impl, step_data, ours, theirs):
    """One forward + backward + step of ``impl`` (one of STEP_IMPLEMENTATIONS), as a closure.

    ``ours(params)`` makes the numbapos optimiser (``numbapos_fused`` also calls
    its ``fuse_with_backward``); ``theirs(params, sparse)`` the PyTorch one, for
    ``nn.Embedding(sparse=sparse)``. Each call takes the next of the eight batches.
    """
    from numbapos import nn

    weight, grad, batches = step_data
    turn = iter(range(10**9))
    if impl.startswith("numbapos"):
        emb = nn.Embedding(STEP_VOCAB, STEP_DIM, sparse=True, _weight=weight.copy())
        opt = ours(emb.parameters())
        if impl == "numbapos_fused":
            opt.fuse_with_backward()

        def step():
            emb(batches[next(turn) % 8])
            emb.backward(grad)
            opt.step()
            opt.zero_grad()
        return step
    sparse = impl == "torch_sparse"
    emb = torch.nn.Embedding(STEP_VOCAB, STEP_DIM, sparse=sparse, _weight=torch.tensor(weight))
    opt = theirs(emb.parameters(), sparse)
    t_grad = torch.from_numpy(grad)

    def step():
        opt.zero_grad()
        emb(torch.from_numpy(batches[next(turn) % 8])).backward(t_grad)
        opt.step()
    return step
