"""Property-based checks (hypothesis): lookup and gradient agree with the oracles."""

import numpy as np
import reference as ref
from hypothesis import given, settings
from hypothesis import strategies as st

import numbapos.functional as F


@st.composite
def lookups(draw):
    num = draw(st.integers(1, 12))
    dim = draw(st.integers(1, 6))
    shape = tuple(draw(st.lists(st.integers(0, 5), min_size=0, max_size=3)))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    index_dtype = draw(st.sampled_from([np.int32, np.int64]))
    indices = rng.integers(0, num, size=shape).astype(index_dtype)
    weight = rng.normal(size=(num, dim)).astype(dtype)
    grad = rng.normal(size=shape + (dim,)).astype(dtype)
    padding_idx = draw(st.one_of(st.none(), st.integers(-num, num - 1)))
    return weight, indices, grad, padding_idx


@settings(max_examples=60, deadline=None)
@given(lookups(), st.booleans(), st.booleans())
def test_lookup_and_gradient_agree_with_reference(case, scale, sparse):
    weight, indices, grad, padding_idx = case
    num = weight.shape[0]
    np.testing.assert_array_equal(F.embedding(indices, weight, padding_idx), weight[indices])
    got = F.embedding_backward(grad, indices, num, padding_idx, scale, sparse)
    dense = got.to_dense() if sparse else got
    pad = None if padding_idx is None else padding_idx % num
    expected = ref.embedding_backward(grad, indices, num, pad, scale)
    tol = 1e-5 if weight.dtype == np.float32 else 1e-12
    np.testing.assert_allclose(dense, expected, rtol=tol, atol=tol)
    if sparse:
        assert np.all(np.diff(got.indices) > 0)
        assert pad not in set(got.indices.tolist())


@settings(max_examples=40, deadline=None)
@given(lookups(), st.floats(0.1, 5.0), st.sampled_from([1.0, 2.0, 0.5, 3.0, float("inf")]))
def test_renorm_agrees_with_reference(case, max_norm, norm_type):
    weight, indices, _, _ = case
    expected = ref.embedding_renorm_(weight.copy(), indices, max_norm, norm_type)
    F.embedding_renorm_(weight, indices, max_norm, norm_type)
    tol = 1e-6 if weight.dtype == np.float32 else 1e-13
    np.testing.assert_allclose(weight, expected, rtol=tol, atol=tol)
