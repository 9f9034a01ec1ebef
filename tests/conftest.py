"""Test configuration. The CUDA simulator must be chosen before Numba is imported."""

import os

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

FLOAT_DTYPES = [np.float32, np.float64]
INDEX_DTYPES = [np.int32, np.int64]


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def tolerance(dtype):
    """(rtol, atol) suited to comparisons in ``dtype``."""
    return (1e-5, 1e-6) if np.dtype(dtype) == np.float32 else (1e-12, 1e-12)
