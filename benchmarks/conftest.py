"""Shared pieces of the benchmark suites (run with ``pytest benchmarks``).

Each group times numbapos next to NumPy and, when installed, PyTorch on the
same inputs, so ``--benchmark-group-by=group`` shows the ratios directly. JIT
compilation is excluded: every numbapos case runs once before it is timed.
"""

import os

import pytest

# Every numbapos case runs once before it is timed: that call compiles the parallel
# kernels themselves, not in the background (timed rounds must not run serial twins).
os.environ.setdefault("NUMBAPOS_BACKGROUND_COMPILE", "0")

import numbapos  # noqa: E402

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
