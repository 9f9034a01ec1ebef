"""Helpers of the sharded-table tests: run training steps, compare bits."""

import numpy as np


def train_steps(model, opt, batches):
    """Steps of a sharded table (``opt`` None: it steps in backward) or of a module + ``opt``.

    ``batches`` are ``(ids, grad_output)`` pairs; returns the forward outputs.
    """
    outputs = []
    for ids, grad in batches:
        outputs.append(model(ids))
        model.backward(grad)
        if opt is not None:
            opt.step()
            model.zero_grad()
    return outputs


def assert_same_bits(got, want):
    """Equal arrays, bit for bit (-0.0 and NaN payloads too)."""
    np.testing.assert_array_equal(got, want)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
