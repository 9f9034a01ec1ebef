"""PyTorch's own EmbeddingBag tests, ported to numbapos's explicit backward.

From ``test/nn/test_embedding.py`` (``TestEmbeddingNN`` / ``TestEmbeddingNNDeviceType``),
the EmbeddingBag entries of ``torch/testing/_internal/common_nn.py`` that
``test/test_nn.py`` runs as module tests, and the OpInfo samples of
``nn.functional.embedding_bag`` (``common_methods_invocations.py``).
``out.backward(grad)`` becomes ``module.backward(grad)`` (which returns the gradient of
``per_sample_weights``:
PyTorch's ``trainable_scale`` / ``requires_grad`` switches only decide whether that
gradient is checked, so here it always is) or ``embedding_bag_backward``; PyTorch's
``nn.Embedding`` + reduction references are built from numbapos's own Embedding.

Where PyTorch asserts what numbapos documents doing differently the port asserts
numbapos's behaviour and says so: ``include_last_offset`` needs ``offsets[-1] ==
len(input)``; max mode has sparse gradients; errors are ValueError / TypeError /
IndexError naming the argument (PyTorch: RuntimeError, AssertionError,
NotImplementedError); weights of a 16-bit table are float32, the pooled result's dtype.
"""

import itertools
import zlib

import numpy as np
import pytest
import reference as ref
from conftest import device_cases, host, on

import numbapos
from numbapos import functional as F
from numbapos.functional.bag import embedding_bag, embedding_bag_backward
from numbapos.functional.half import to_table_dtype
from numbapos.nn import Embedding
from numbapos.nn.bag import EmbeddingBag
from numbapos.sparse import SparseRows

torch = pytest.importorskip("torch")
TF = torch.nn.functional

WDTYPES = ["float32", "float64", "bfloat16", "float16"]
INDEX_PAIRS = list(itertools.product([np.int32, np.int64], repeat=2))  # (input, offsets)
# dtype2prec_DONTUSE of float and double; 16-bit tables pool in float32 here, hence the same.
PREC = 1e-5


def _dtype(name):
    return numbapos._device.bfloat16_dtype() if name == "bfloat16" else np.dtype(name)


def _result_dtype(name):
    """The dtype of pooled results, gradients and per_sample_weights for a table of ``name``."""
    return np.dtype(np.float32) if name in ("bfloat16", "float16") else np.dtype(name)


def _seed(*parts):
    """A seed of its own for each case, the same in every process (unlike ``hash``)."""
    return zlib.crc32(repr(parts).encode())


def _table(values, wdtype):
    return to_table_dtype(np.asarray(values, np.float64), _dtype(wdtype))


def _dense(grad):
    return host(grad.to_dense() if isinstance(grad, SparseRows) else grad)


def _arange_bag(device, wdtype, **kwargs):
    """``nn.EmbeddingBag(5, 2, ...)`` with ``weight.data.copy_(torch.arange(1, 11).view(5, 2))``."""
    table = _table(np.arange(1, 11).reshape(5, 2), wdtype)
    return EmbeddingBag(5, 2, _weight=on(device, table), device=device, **kwargs)


def _synchronized(call):
    """``call()``, then wait for the GPU: its index and offset errors are deferred."""
    result = call()
    numbapos.synchronize()
    return result


# ------------------------------------------------------------------ TestEmbeddingNN


def test_embedding_bag_from_pretrained(device):
    """test_embedding_bag_from_pretrained: the table used as given, one row per bag."""
    a = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    embedding = EmbeddingBag.from_pretrained(on(device, a))
    np.testing.assert_array_equal(host(embedding.weight.data), a)
    output = embedding(on(device, np.array([0, 1])), on(device, np.arange(2)))
    np.testing.assert_array_equal(host(output), a)


def test_embedding_bag_from_pretrained_padding_idx():
    """test_embedding_bag_from_pretrained_padding_idx: the padding row is not zeroed."""
    embeddings = np.random.default_rng(0).random((4, 3)).astype(np.float32)
    embedding_nn = EmbeddingBag.from_pretrained(embeddings, padding_idx=2)
    np.testing.assert_array_equal(embedding_nn.weight.data, embeddings)


def test_embedding_bag_functional():
    """test_embedding_bag_functional: the module and F.embedding_bag agree (mean, padding)."""
    a = np.array([[1, 3, 2], [0, 2, 1]])
    embeddings = np.random.default_rng(1).random((4, 3)).astype(np.float32)
    for padding_idx in (None, 2):
        module = EmbeddingBag.from_pretrained(embeddings, padding_idx=padding_idx)
        np.testing.assert_array_equal(module(a), F.embedding_bag(a, embeddings,
                                                                 padding_idx=padding_idx))


def test_embedding_bag_padding_idx_error():
    """test_embedding_bag_padding_idx_error: padding_idx outside [-V, V) is refused by the
    functional op and the module (ValueError naming padding_idx; PyTorch: RuntimeError and
    AssertionError)."""
    a = np.array([[1, 3, 2], [0, 2, 1]])
    num_embeddings, num_features = 4, 3
    embeddings = np.random.default_rng(2).random((num_embeddings, num_features))
    for padding_idx in range(-(num_embeddings + 2), num_embeddings + 2):
        if padding_idx < -num_embeddings or padding_idx >= num_embeddings:
            with pytest.raises(ValueError, match=f"padding_idx: {padding_idx} is outside"):
                F.embedding_bag(a, embeddings, padding_idx=padding_idx)
            with pytest.raises(ValueError, match=f"padding_idx: {padding_idx} is outside"):
                EmbeddingBag(num_embeddings, num_features, padding_idx=padding_idx)
        else:
            F.embedding_bag(a, embeddings, padding_idx=padding_idx)
            EmbeddingBag(num_embeddings, num_features, padding_idx=padding_idx)


def test_embeddingbag_from_pretrained():
    """test_embeddingbag_from_pretrained: a 2-D bag of both rows is their mean."""
    a = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    embeddingbag = EmbeddingBag.from_pretrained(a)
    np.testing.assert_array_equal(embeddingbag.weight.data, a)
    np.testing.assert_array_equal(embeddingbag(np.array([[0, 1]])), a.mean(0, keepdims=True))


def test_embeddingbag_from_pretrained_options():
    """test_embeddingbag_from_pretrained_options: max_norm clips the given table in place."""
    a = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    opts = {"max_norm": 2.0, "norm_type": 0.5, "scale_grad_by_freq": False, "mode": "max",
            "sparse": False}
    embeddingbag = EmbeddingBag.from_pretrained(a, **opts)
    output = embeddingbag(np.array([[0, 1]]))
    np.testing.assert_array_equal(output, a.max(0, keepdims=True))
    assert (a != np.arange(1, 7, dtype=a.dtype).reshape(2, 3)).all()
    norms = (np.abs(a) ** opts["norm_type"]).sum(axis=1) ** (1 / opts["norm_type"])
    assert (norms <= opts["max_norm"]).all()


def test_embeddingbag_include_last_offset():
    """test_embeddingbag_include_last_offset (PyTorch issue 89677).

    PyTorch gives offsets [0, 3, 3] and [0, 3, 4] the same result: with
    include_last_offset its forward ignores the last offset. numbapos documents that
    the last offset must equal len(input): [0, 3, 3] raises (and records nothing),
    [0, 3, 4] gives PyTorch's result.
    """
    embeddingbag = EmbeddingBag(100, 3, include_last_offset=True, padding_idx=61, seed=0)
    inp = np.array([0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"offsets\[2\]=3: with include_last_offset=True the "
                                         r"last offset must equal len\(input\)=4"):
        embeddingbag(inp, np.array([0, 3, 3]))
    out2 = embeddingbag(inp, np.array([0, 3, 4]))
    weight = embeddingbag.weight.data
    ref_out = np.stack([weight[0:3].sum(0) / np.float32(3), weight[3]])
    np.testing.assert_array_equal(out2, ref_out)
    embeddingbag.backward(np.ones((2, 3), np.float32))  # the one recorded forward
    with pytest.raises(RuntimeError):
        embeddingbag.backward(np.ones((2, 3), np.float32))


# ------------------------------------------------------- TestEmbeddingNNDeviceType


def _gen_1D_indices_offsets(rng, include_last_offset, allpad, num_bags=10,
                            max_indices_per_bag=10, num_words=100):
    """test_embedding_bag_1D_padding_idx's bags: one full, one empty, the rest 1 to 9 ids."""
    empty_bag, full_bag = rng.choice(num_bags, 2, replace=False)
    sizes = rng.integers(1, max_indices_per_bag, num_bags)
    sizes[full_bag], sizes[empty_bag] = max_indices_per_bag, 0
    size = int(sizes.sum())
    indices = np.ones(size, np.int64) if allpad else rng.integers(0, num_words, size)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return indices, offsets if include_last_offset else offsets[:-1]


def _gen_2D_indices_from_1D(indices_1D, offsets, include_last_offset, padding_idx,
                            num_bags=10, max_indices_per_bag=10):
    """Each bag as a row, filled up to max_indices_per_bag with padding_idx."""
    if include_last_offset:
        offsets = offsets[:-1]
    ends = np.append(offsets[1:], len(indices_1D))
    indices_2D = np.full((num_bags, max_indices_per_bag), padding_idx, np.int64)
    for bag, (start, end) in enumerate(zip(offsets, ends, strict=True)):
        indices_2D[bag, :end - start] = indices_1D[start:end]
    return indices_2D


PADDING_1D = [(mode, sparse, last, allpad, dtype)
              for mode in ("max", "mean", "sum") for sparse in (False, True)
              for last in (False, True) for allpad in (False, True)
              for dtype in (np.float32, np.float64)]


@pytest.mark.parametrize("device, mode, sparse, include_last_offset, allpad, dtype",
                         device_cases(PADDING_1D, cuda=lambda m, s, last, allpad, dt:
                                      dt == np.float32 and last == allpad == s),
                         indirect=["device"])
def test_embedding_bag_1D_padding_idx(device, mode, sparse, include_last_offset, allpad,
                                      dtype):
    """test_embedding_bag_1D_padding_idx: 1-D bags with padding_idx equal 2-D bags padded
    with it, forward and gradient of the sum, for every id used as padding_idx and for
    None (a dummy padding row added for the 2-D form). Also max mode with sparse
    gradients, which PyTorch refuses and numbapos gives. On CUDA six of the cases, each
    with two padding ids and None (the simulator runs threads as Python)."""
    num_words, num_features = 100, 3
    rng = np.random.default_rng(_seed((mode, sparse, include_last_offset, allpad)))
    indices_1D, offsets = _gen_1D_indices_offsets(rng, include_last_offset, allpad)
    paddings = sorted(set(indices_1D.tolist()))
    if device == "cuda":
        paddings = paddings[:2]
    for padding_idx_1D in paddings + [None]:
        msg = f"padding_idx_1D: {padding_idx_1D}"
        padding_idx_2D = num_words if padding_idx_1D is None else padding_idx_1D
        num_words_with_padding = num_words + (padding_idx_1D is None)
        indices_2D = _gen_2D_indices_from_1D(indices_1D, offsets, include_last_offset,
                                             padding_idx_2D)
        weights = on(device, rng.standard_normal((num_words_with_padding, num_features))
                     .astype(dtype))
        bag = embedding_bag(on(device, indices_1D), weights, on(device, offsets),
                            padding_idx=padding_idx_1D, mode=mode, sparse=sparse,
                            include_last_offset=include_last_offset)
        bag_check = embedding_bag(on(device, indices_2D), weights, padding_idx=padding_idx_2D,
                                  mode=mode, sparse=sparse)
        np.testing.assert_array_equal(host(bag), host(bag_check), err_msg=msg)
        ones = on(device, np.ones(bag.shape, dtype))
        grad, _ = embedding_bag_backward(ones, on(device, indices_1D), weights,
                                         on(device, offsets), mode=mode, sparse=sparse,
                                         include_last_offset=include_last_offset,
                                         padding_idx=padding_idx_1D)
        grad_check, _ = embedding_bag_backward(ones, on(device, indices_2D), weights,
                                               mode=mode, sparse=sparse,
                                               padding_idx=padding_idx_2D)
        assert isinstance(grad, SparseRows) == sparse
        np.testing.assert_array_equal(_dense(grad), _dense(grad_check), err_msg=msg)


def _embedding_bag_check(indices, weights, mode, padding_idx, grad_output):
    """test_embedding_bag_2D_padding_idx's reference: F.embedding then a masked reduction,
    and the table's gradient through F.embedding_backward of each position's gradient."""
    embedding = F.embedding(indices, weights, padding_idx=padding_idx)
    keep = (indices != padding_idx)[..., None]
    count = keep.sum(axis=1)
    if mode == "max":
        masked = np.where(keep, embedding, -np.inf)
        res = masked.max(axis=1)
        first = masked.argmax(axis=1)
        positions = np.arange(indices.shape[1])[None, :, None] == first[:, None, :]
        per_position = np.where(positions & keep, grad_output[:, None, :], 0)
    else:
        res = (embedding * keep).sum(axis=1)
        per_position = np.where(keep, grad_output[:, None, :], 0)
        if mode == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                res = res / count
            per_position = per_position / np.maximum(count, 1)[:, None, :]
    res[count[:, 0] == 0] = 0  # an all-padding bag gives zeros
    grad = F.embedding_backward(per_position.astype(weights.dtype), indices,
                                weights.shape[0], padding_idx=padding_idx)
    return res.astype(weights.dtype), grad


PADDING_2D = [(mode, sparse, allpad, dim0, dtype)
              for mode in ("max", "mean", "sum") for sparse in (False, True)
              for allpad in (False, True) for dim0 in (1, 10)
              for dtype in (np.float32, np.float64)]


@pytest.mark.parametrize("mode, sparse, allpad, indices_dim0, dtype", PADDING_2D)
def test_embedding_bag_2D_padding_idx(mode, sparse, allpad, indices_dim0, dtype):
    """test_embedding_bag_2D_padding_idx: 2-D bags with each id used as padding_idx against
    F.embedding followed by a masked reduction (max mode with sparse gradients included,
    which PyTorch refuses). A sum of ones is the gradient, as PyTorch's ``.sum()``."""
    num_features, num_words, indices_dim1 = 3, 10, 10
    rng = np.random.default_rng(_seed((mode, sparse, allpad, indices_dim0)))
    if allpad:
        indices = np.ones((indices_dim0, indices_dim1), np.int64)
    else:
        indices = rng.integers(0, num_words, (indices_dim0, indices_dim1))
        if indices_dim0 > 1:  # a row of one id repeated: a bag all padding
            duplicate_row = rng.integers(indices_dim0)
            indices[duplicate_row] = indices[duplicate_row][0]
    for padding_idx in sorted(set(indices.reshape(-1).tolist())):
        msg = f"padding_idx: {padding_idx}"
        weights = rng.standard_normal((num_words, num_features)).astype(dtype)
        ones = np.ones((indices_dim0, num_features), dtype)
        bag_check, grad_check = _embedding_bag_check(indices, weights, mode, padding_idx, ones)
        bag = embedding_bag(indices, weights, padding_idx=padding_idx, mode=mode,
                            sparse=sparse)
        np.testing.assert_allclose(bag, bag_check, rtol=1e-6 if dtype == np.float32 else 1e-12,
                                   err_msg=msg)
        grad, _ = embedding_bag_backward(ones, indices, weights, mode=mode, sparse=sparse,
                                         padding_idx=padding_idx)
        np.testing.assert_allclose(_dense(grad), grad_check, rtol=1e-6, atol=1e-7, err_msg=msg)


@pytest.mark.parametrize("index_dtype, offset_dtype", INDEX_PAIRS)
def test_embedding_bag_empty_input(device, index_dtype, offset_dtype):
    """test_embedding_bag_empty_input: no ids, one or two bags: zeros."""
    m, n = 4, 3
    x = on(device, np.array([], index_dtype))
    for sparse in (True, False):
        embed = EmbeddingBag(m, n, sparse=sparse, device=device)
        with numbapos.no_grad():
            for offsets in ([0], [0, 0]):
                output = embed(x, on(device, np.array(offsets, offset_dtype)))
                np.testing.assert_array_equal(host(output), np.zeros((len(offsets), n)))


@pytest.mark.parametrize("device, mode, padding_idx", device_cases(
    [(mode, pad) for mode in ("sum", "mean", "max") for pad in (None, 0)],
    cuda=lambda mode, pad: pad == 0), indirect=["device"])
@pytest.mark.parametrize("w_dtype, idx_dtype", list(itertools.product(
    [np.float32, np.float64], [np.int32, np.int64])))
def test_embedding_bag_out_of_bounds_idx(device, mode, padding_idx, w_dtype, idx_dtype):
    """test_embedding_bag_out_of_bounds_idx: ids -1 and 11 of a 10-row table raise
    IndexError naming input and the id (PyTorch: RuntimeError, CPU only; numbapos checks
    on CUDA too, when the GPU is synchronised). PyTorch's test sets padding_idx = 0 over
    its parameter; both values run here."""
    rng = np.random.default_rng(3)
    idx1 = np.array([[-1, 1]], idx_dtype)  # negative out-of-bound
    idx2 = np.array([[11, 8]], idx_dtype)  # positive out-of-bound
    weight = rng.standard_normal((10, 2)).astype(w_dtype)
    per_sample_weights = (None, rng.standard_normal(idx1.shape).astype(w_dtype)) \
        if mode == "sum" else (None,)
    for p_s_weights, idx in itertools.product(per_sample_weights, (idx1, idx2)):
        with pytest.raises(IndexError, match=f"input: index {idx[0, 0]} .*out of range for "
                                             "num_embeddings=10"):
            _synchronized(lambda idx=idx, psw=p_s_weights: embedding_bag(
                on(device, idx), on(device, weight), per_sample_weights=on(device, psw),
                padding_idx=padding_idx, mode=mode))


def test_embedding_bag_dimension_errors(device):
    """test_embedding_bag_dimension_errors, for F.embedding_bag (numbapos has no
    torch.embedding_bag / _embedding_bag / _embedding_bag_forward_only entry points):
    ValueError naming input, offsets or weight."""
    weight = on(device, np.zeros((2, 6)))
    indices = on(device, np.full((2, 0, 0, 6, 6), 2, np.int64))
    offsets = on(device, np.zeros((2, 0, 0, 6, 6), np.int64))
    with pytest.raises(ValueError, match="input: expected a 1-D array with offsets or a 2-D"):
        embedding_bag(indices, weight, offsets)
    with pytest.raises(ValueError, match="offsets: expected a 1-D array"):
        embedding_bag(on(device, np.full(2, 1, np.int64)), on(device, np.zeros((2, 2))),
                      offsets)
    with pytest.raises(ValueError, match="weight: expected a 2-D array"):
        embedding_bag(on(device, np.full(2, 2, np.int64)), on(device, np.zeros((2, 2, 2))),
                      on(device, np.zeros(2, np.int64)))


@pytest.mark.parametrize("index_dtype, offset_dtype", INDEX_PAIRS)
def test_EmbeddingBag_per_sample_weights_failures(device, index_dtype, offset_dtype):
    """test_EmbeddingBag_per_sample_weights_failures. Failure 1 (weights of another dtype
    than the table's) is a TypeError on every device (PyTorch: RuntimeError, CPU only);
    failure 3 (mode max or mean) a ValueError (PyTorch: NotImplementedError)."""
    rng = np.random.default_rng(4)
    es = EmbeddingBag(5, 2, mode="sum", device=device)
    inp = on(device, np.array([3, 1, 1, 1, 4, 0], index_dtype))
    offsets = on(device, np.array([0, 0, 3, 3, 6], offset_dtype))
    with pytest.raises(TypeError, match="per_sample_weights: expected dtype float32"):
        es(inp, offsets, on(device, rng.standard_normal(6)))  # float64
    with pytest.raises(ValueError, match=r"per_sample_weights: expected the input's shape "
                                         r"\(6,\), got \(5,\)"):
        es(inp, offsets, on(device, rng.standard_normal(5).astype(np.float32)))
    inp2d = on(device, rng.integers(5, size=(7, 3)).astype(index_dtype))
    with pytest.raises(ValueError, match=r"per_sample_weights: expected the input's shape "
                                         r"\(7, 3\), got \(21,\)"):
        es(inp2d, None, on(device, rng.standard_normal(21).astype(np.float32)))
    for unsupported_mode in ("max", "mean"):
        es = EmbeddingBag(5, 2, mode=unsupported_mode, device=device)
        with pytest.raises(ValueError, match="per_sample_weights: only supported with "
                                             "mode='sum'"):
            es(inp2d, None, on(device, rng.standard_normal((7, 3)).astype(np.float32)))
        with pytest.raises(RuntimeError):  # the failing calls recorded nothing
            es.backward(on(device, np.ones((7, 2), np.float32)))


def _embedding_bag_reference_impl(input, weight, offsets, mode="sum", per_sample_weights=None,
                                  include_last_offset=False):
    """PyTorch's ``_embedding_bag_reference_impl``, run by PyTorch (its autograd gives the
    reference gradients): index_select, scaled, each bag narrowed and reduced."""
    assert mode == "sum" or per_sample_weights is None
    if per_sample_weights is None:
        per_sample_weights = torch.ones(input.size(), dtype=weight.dtype)
    embeddings = weight.index_select(0, input.long()) * per_sample_weights.unsqueeze(1)
    starts = offsets[:-1] if include_last_offset else offsets
    ends = list(offsets[1:]) + ([] if include_last_offset else [len(input)])
    bags = []
    for offset, next_offset in zip(starts, ends, strict=True):
        length = int(next_offset - offset)
        if length == 0:
            bags.append(torch.zeros(weight.size(1), dtype=embeddings.dtype))
        elif mode == "sum":
            bags.append(embeddings.narrow(0, offset, length).sum(0))
        elif mode == "mean":
            bags.append(embeddings.narrow(0, offset, length).sum(0).div(length))
        else:
            bags.append(embeddings.narrow(0, offset, length).max(0)[0])
    return torch.stack(bags)


def _check_against_reference(device, es, inp, offsets, mode, psw, include_last_offset,
                             rng):
    """Forward, gradients of the table and of the weights against the reference impl."""
    table = host(es.weight.data).astype(np.float64).astype(_result_dtype(str(es.weight.dtype)))
    reference_weights = torch.tensor(table, requires_grad=True)
    ref_psw = None if psw is None else torch.tensor(psw, requires_grad=True)
    expected = _embedding_bag_reference_impl(torch.from_numpy(inp), reference_weights,
                                             torch.from_numpy(offsets.astype(np.int64)), mode,
                                             ref_psw, include_last_offset)
    result = es(on(device, inp), on(device, offsets), on(device, psw))
    np.testing.assert_allclose(host(result), expected.detach().numpy(), atol=PREC, rtol=0)
    grad = rng.standard_normal(tuple(expected.shape)).astype(table.dtype)
    grad_psw = es.backward(on(device, grad))
    expected.backward(torch.from_numpy(grad))
    np.testing.assert_allclose(_dense(es.weight.grad), reference_weights.grad.numpy(),
                               atol=PREC, rtol=0)
    assert (grad_psw is None) == (psw is None)
    if psw is not None:
        np.testing.assert_allclose(host(grad_psw), ref_psw.grad.numpy(), atol=PREC, rtol=0)


def _psw_cases():
    """(wdtype, index dtype, offsets dtype): CPU every one, CUDA float32 with int64 ids and
    float64 with int32 ones."""
    return device_cases([(w, i, o) for w in WDTYPES for i, o in INDEX_PAIRS],
                        cuda=[("float32", np.int64, np.int64), ("float64", np.int32, np.int32)])


@pytest.mark.parametrize("device, wdtype, index_dtype, offset_dtype", _psw_cases(),
                         indirect=["device"])
def test_EmbeddingBag_empty_per_sample_weights_and_offsets(device, wdtype, index_dtype,
                                                           offset_dtype):
    """test_EmbeddingBag_empty_per_sample_weights_and_offsets: no ids, five empty bags:
    zeros, a zero table gradient and an empty weights gradient (PyTorch's #46572)."""
    rng = np.random.default_rng(5)
    es = _arange_bag(device, wdtype, mode="sum")
    inp = np.array([], index_dtype)
    offsets = np.zeros(5, offset_dtype)
    psw = rng.standard_normal(0).astype(_result_dtype(wdtype))
    result = es(on(device, inp), on(device, offsets), on(device, psw))
    np.testing.assert_array_equal(host(result), np.zeros((5, 2)))
    grad_psw = es.backward(on(device, rng.standard_normal((5, 2)).astype(result.dtype)))
    np.testing.assert_array_equal(host(es.weight.grad), np.zeros((5, 2)))
    assert host(grad_psw).shape == (0,)


@pytest.mark.parametrize("device, wdtype, index_dtype, offset_dtype", _psw_cases(),
                         indirect=["device"])
def test_EmbeddingBag_per_sample_weights_and_offsets(device, wdtype, index_dtype,
                                                     offset_dtype):
    """test_EmbeddingBag_per_sample_weights_and_offsets: weighted sums of [3, 1, 1, 1, 4, 0]
    in bags [0, 0, 3, 3, 6] against PyTorch's reference implementation."""
    rng = np.random.default_rng(6)
    es = _arange_bag(device, wdtype, mode="sum")
    inp = np.array([3, 1, 1, 1, 4, 0], index_dtype)
    offsets = np.array([0, 0, 3, 3, 6], offset_dtype)
    psw = rng.standard_normal(6).astype(_result_dtype(wdtype))
    _check_against_reference(device, es, inp, offsets, "sum", psw, False, rng)


@pytest.mark.parametrize("device, wdtype, index_dtype, offset_dtype", _psw_cases(),
                         indirect=["device"])
def test_EmbeddingBag_per_sample_weights_and_new_offsets(device, wdtype, index_dtype,
                                                         offset_dtype):
    """test_EmbeddingBag_per_sample_weights_and_new_offsets: the same bags with and without
    the last offset (len(input)), sum with and without weights, max, mean."""
    rng = np.random.default_rng(7)
    for (mode, has_weight), include_last_offset in itertools.product(
            [("sum", False), ("sum", True), ("max", False), ("mean", False)], [True, False]):
        es = _arange_bag(device, wdtype, mode=mode, include_last_offset=include_last_offset)
        inp = np.array([3, 1, 1, 1, 4, 0], index_dtype)
        offsets = np.array([0, 0, 3, 3, 6] + [6] * include_last_offset, offset_dtype)
        psw = rng.standard_normal(6).astype(_result_dtype(wdtype)) if has_weight else None
        _check_against_reference(device, es, inp, offsets, mode, psw, include_last_offset,
                                 rng)


def _test_EmbeddingBag_vs_Embedding(rng, N, D, B, L, max_norm=None, mode="mean", wdtype=None,
                                    dtype=np.int64, test_per_sample_weights=False,
                                    sparse=False, backward_prec=None):
    """PyTorch's ``_test_EmbeddingBag_vs_Embedding``: B bags of L ids against numbapos's
    Embedding followed by the reduction (its backward given each position's gradient)."""
    table = _table(rng.standard_normal((N, D)), wdtype)
    es = EmbeddingBag(N, D, mode=mode, sparse=sparse, max_norm=max_norm, _weight=table)
    e = Embedding(N, D, max_norm=max_norm, _weight=table.copy(), out_dtype=np.float32
                  if wdtype in ("bfloat16", "float16") else None)
    inp = rng.integers(N, size=(B, L)).astype(dtype)
    offsets = np.arange(B, dtype=dtype) * L
    result_dtype = _result_dtype(wdtype)
    grad_output = rng.random((B, D)).astype(result_dtype)
    rows = e(inp)
    if test_per_sample_weights:  # summing to 1 per bag, against large gradients
        logits = rng.standard_normal((B, L))
        psw = (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(result_dtype)
        output = es(inp.reshape(-1), offsets, psw.reshape(-1))
        ref_output = (rows * psw[..., None]).sum(1)
        per_position = grad_output[:, None, :] * psw[..., None]
    else:
        psw = None
        output = es(inp.reshape(-1), offsets)
        per_position = np.broadcast_to(grad_output[:, None, :], rows.shape)
        if mode == "sum":
            ref_output = rows.sum(1)
        elif mode == "mean":
            ref_output = rows.mean(1)
            per_position = per_position / result_dtype.type(L)
        else:
            ref_output = rows.max(1)
            winner = np.arange(L)[None, :, None] == rows.argmax(1)[:, None, :]
            per_position = np.where(winner, per_position, 0)
    np.testing.assert_allclose(output, ref_output, atol=PREC, rtol=0)
    grad_psw = es.backward(grad_output)
    e.backward(np.ascontiguousarray(per_position, result_dtype))
    assert isinstance(es.weight.grad, SparseRows) == sparse
    needed_prec = PREC * 5 if backward_prec is None else backward_prec
    np.testing.assert_allclose(_dense(es.weight.grad), e.weight.grad, atol=needed_prec, rtol=0)
    if test_per_sample_weights:
        np.testing.assert_allclose(grad_psw.reshape(B, L), (rows * grad_output[:, None, :])
                                   .sum(-1), atol=PREC, rtol=0)


@pytest.mark.parametrize("dtype, wdtype", list(itertools.product(
    [np.int32, np.int64], ["float32", "float64"])))
@pytest.mark.parametrize("sparse", [True, False])
def test_EmbeddingBag_per_sample_weights_and_no_offsets(dtype, wdtype, sparse):
    """test_EmbeddingBag_per_sample_weights_and_no_offsets: weighted bags against
    Embedding times the weights summed; the simple, B * L > 1000, large num_embeddings
    and large embedding_dim cases."""
    rng = np.random.default_rng(8)
    kwargs = dict(test_per_sample_weights=True, mode="sum", wdtype=wdtype, dtype=dtype,
                  sparse=sparse)
    for N, D, B, L in ((2, 3, 5, 7), (2, 5, 53, 23), (101, 5, 3, 7), (2, 101, 3, 7)):
        _test_EmbeddingBag_vs_Embedding(rng, N, D, B, L, **kwargs)


# _test_EmbeddingBag's known example: rows [1, 2], [3, 4], ..., [9, 10].
KNOWN_INPUT = [3, 1, 1, 1, 4, 0]
KNOWN_OFFSETS = [0, 0, 3, 3, 6]
GRAD_OUTPUT = [[1, 2], [3, 4]]
GRAD_OUTPUT_WITH_EMPTY = [[99, 99], [1, 2], [99, 99], [3, 4], [99, 99]]
KNOWN = {  # mode: (expected output, expected weight gradient), before the mean's division
    "sum": ([[13, 16], [13, 16]], [[3, 4], [5, 8], [0, 0], [1, 2], [3, 4]]),
    "max": ([[7, 8], [9, 10]], [[0, 0], [0, 0], [0, 0], [1, 2], [3, 4]]),
}
KNOWN["mean"] = KNOWN["sum"]


def _known_cases():
    """mode x sparse x wdtype, each with one (input, offsets) dtype pair in turn on the CPU;
    float32 on CUDA."""
    cases = [(mode, sparse, wdtype, *INDEX_PAIRS[k % len(INDEX_PAIRS)])
             for k, (mode, sparse, wdtype) in enumerate(itertools.product(
                 ("sum", "mean", "max"), (False, True), WDTYPES))]
    return device_cases(cases, cuda=lambda m, s, w, i, o: w == "float32")


@pytest.mark.parametrize("device, mode, sparse, wdtype, dtype, odtype", _known_cases(),
                         indirect=["device"])
def test_embedding_bag_device(device, mode, sparse, wdtype, dtype, odtype):
    """test_embedding_bag_device (with test_embedding_bag_bfloat16 / _half), the known
    example of ``_test_EmbeddingBag``: five bags (three empty) of a 5 x 2 table, the same
    ids as two 2-D bags, then all bags empty. Every mode with sparse gradients (PyTorch
    refuses max with sparse); the backward checked for every dtype (PyTorch skips it for
    sparse float32 and float16 on the CPU)."""
    es = _arange_bag(device, wdtype, mode=mode, sparse=sparse)
    result_dtype = _result_dtype(wdtype)
    denominator = result_dtype.type(3 if mode == "mean" else 1)
    expected, expected_grad = (np.array(x, result_dtype) / denominator for x in KNOWN[mode])
    expected_with_empty = np.zeros((5, 2), result_dtype)
    expected_with_empty[[1, 3]] = expected
    inp = np.array(KNOWN_INPUT, dtype)
    output = es(on(device, inp), on(device, np.array(KNOWN_OFFSETS, odtype)))
    es.backward(on(device, np.array(GRAD_OUTPUT_WITH_EMPTY, result_dtype)))
    assert isinstance(es.weight.grad, SparseRows) == sparse
    np.testing.assert_array_equal(host(output), expected_with_empty)
    np.testing.assert_allclose(_dense(es.weight.grad), expected_grad, atol=PREC, rtol=0)

    es.zero_grad()  # the same example as 2-D (2 x 3)
    output = es(on(device, inp.reshape(2, -1)))
    es.backward(on(device, np.array(GRAD_OUTPUT, result_dtype)))
    np.testing.assert_array_equal(host(output), expected)
    np.testing.assert_allclose(_dense(es.weight.grad), expected_grad, atol=PREC, rtol=0)

    es.zero_grad()  # all bags empty
    es(on(device, np.array([], dtype)), on(device, np.zeros(4, odtype)))
    es.backward(on(device, np.ones((4, 2), result_dtype)))
    np.testing.assert_array_equal(_dense(es.weight.grad), np.zeros((5, 2)))


@pytest.mark.parametrize("wdtype, dtype", [(w, [np.int64, np.int32][k % 2])
                                           for k, w in enumerate(WDTYPES)])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_device_vs_embedding(mode, sparse, wdtype, dtype):
    """test_embedding_bag_device, ``_test_EmbeddingBag``'s comparison with Embedding and the
    reduction: a random N, D, B, L, then every one of 1 or 2 with max_norm None and 3."""
    rng = np.random.default_rng(_seed((mode, sparse, wdtype)))
    kwargs = dict(mode=mode, sparse=sparse, wdtype=wdtype, dtype=dtype)
    N, D, B, L = (int(rng.integers(1, 101)), int(rng.integers(1, 101)),
                  int(rng.integers(1, 51)), int(rng.integers(1, 51)))
    _test_EmbeddingBag_vs_Embedding(rng, N, D, B, L, **kwargs)
    for max_norm in (None, 3):
        for p in itertools.product([1, 2], repeat=4):
            _test_EmbeddingBag_vs_Embedding(rng, *p, max_norm=max_norm, **kwargs)


@pytest.mark.parametrize("mode, sparse", [("sum", False), ("mean", True), ("max", False)])
def test_embedding_bag_device_illegal_input(device, mode, sparse):
    """test_embedding_bag_device, ``_test_EmbeddingBag``'s illegal combinations: offsets with
    2-D input, 1-D input without offsets, a first offset of 1, an offset past the end
    (ValueError; PyTorch: RuntimeError, the offsets checked on the CPU only, numbapos's
    GPU checks them when synchronised)."""
    es = EmbeddingBag(10, 20, mode=mode, sparse=sparse, device=device)
    inp = on(device, np.ones((3, 4), np.int64))
    offset = np.arange(0, 3)
    with pytest.raises(ValueError, match="offsets: must be None for 2-D input"):
        es(inp, on(device, offset))
    flat = on(device, np.ones(12, np.int64))
    with pytest.raises(ValueError, match="offsets: required with 1-D input"):
        es(flat)
    offset[0] = 1
    with pytest.raises(ValueError, match="offsets"):
        _synchronized(lambda: es(flat, on(device, offset)))
    offset[0] = 0
    offset[-1] = 100
    with pytest.raises(ValueError, match="offsets"):
        _synchronized(lambda: es(flat, on(device, offset)))
    if device == "cpu":
        with pytest.raises(ValueError, match=r"offsets\[2\]=100: offsets must not pass "
                                             r"len\(input\)=12"):
            es(flat, offset)


@pytest.mark.parametrize("wdtype", WDTYPES)
@pytest.mark.parametrize("dtype, odtype", INDEX_PAIRS)
def test_embedding_bag_non_contiguous_weight(wdtype, dtype, odtype):
    """test_embedding_bag_non_contiguous_weight: a strided view of a table pools as its
    contiguous copy (every mode compared: PyTorch's test compares the last one only). On
    the CPU: numbapos's GPU arrays are contiguous copies."""
    weight_tensor = _table(np.random.default_rng(9).standard_normal((3, 4)), wdtype)
    weight_tensor_non_contig = weight_tensor[:, :3]
    assert not weight_tensor_non_contig.flags.c_contiguous
    weight_tensor_contig = np.ascontiguousarray(weight_tensor_non_contig)
    index = np.array([0, 1, 2], dtype)
    offsets = np.array([0, 2], odtype)
    for mode in ("sum", "mean", "max"):
        output_non_contig = F.embedding_bag(index, weight_tensor_non_contig, offsets,
                                            mode=mode)
        output_contig = F.embedding_bag(index, weight_tensor_contig, offsets, mode=mode)
        np.testing.assert_array_equal(output_non_contig, output_contig)


@pytest.mark.parametrize("bag_use_grad, per_sample_weights_use_grad",
                         [(True, True), (True, False), (False, True), (False, False)])
def test_embedding_bag_per_sample_weights_grad(bag_use_grad, per_sample_weights_use_grad):
    """test_embedding_bag_per_sample_weights_grad: a 256 x 256 sum bag over a broadcast
    (stride 0) input with softmax weights, with and without a table gradient. PyTorch runs
    the forward only; here the backward too, against PyTorch. The weights' gradient is
    always returned (numbapos has no requires_grad on inputs)."""
    rng = np.random.default_rng(10)
    bag = EmbeddingBag(256, 256, mode="sum", seed=0)
    bag.weight.requires_grad = bag_use_grad
    x = np.broadcast_to(np.arange(1, 5), (3, 4))
    w = rng.random((3, 4))
    psw = (np.exp(w) / np.exp(w).sum(-1, keepdims=True)).astype(np.float32)
    out = bag(x, per_sample_weights=psw)
    theirs = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(bag.weight.data.copy()),
                                                   freeze=not bag_use_grad, mode="sum")
    p = torch.tensor(psw, requires_grad=per_sample_weights_use_grad)
    expected = theirs(torch.from_numpy(np.ascontiguousarray(x)), per_sample_weights=p)
    np.testing.assert_allclose(out, expected.detach().numpy(), rtol=1e-6, atol=1e-6)
    grad = rng.standard_normal((3, 256)).astype(np.float32)
    grad_psw = bag.backward(grad)
    if bag_use_grad or per_sample_weights_use_grad:
        expected.backward(torch.from_numpy(grad))
    assert grad_psw.shape == (3, 4)
    if per_sample_weights_use_grad:
        np.testing.assert_allclose(grad_psw, p.grad.numpy(), rtol=1e-5, atol=1e-5)
    if bag_use_grad:
        np.testing.assert_allclose(bag.weight.grad, theirs.weight.grad.numpy(), rtol=1e-6,
                                   atol=1e-6)
    else:
        assert bag.weight.grad is None


def test_embedding_bag_with_no_grad_tensors():
    """The local half of dist_autograd_test's test_embedding_bag_with_no_grad_tensors (the
    RPC half does not apply): a sparse weighted sum bag, two backward passes accumulate,
    as PyTorch's local module does."""
    rng = np.random.default_rng(11)
    local_embedding = EmbeddingBag(16, 16, mode="sum", sparse=True, seed=0)
    theirs = torch.nn.EmbeddingBag.from_pretrained(
        torch.from_numpy(local_embedding.weight.data.copy()), freeze=False, mode="sum",
        sparse=True)
    inp = np.array([1, 2, 4, 5, 4, 3, 2, 9])
    per_sample_weights = rng.random(8).astype(np.float32)
    offsets = np.array([0, 4])
    p = torch.tensor(per_sample_weights, requires_grad=True)
    local_res = theirs(torch.from_numpy(inp), torch.from_numpy(offsets), p)
    torch.autograd.backward([local_res.sum()], retain_graph=True)
    torch.autograd.backward([local_res.sum()])
    grads = []
    for _ in range(2):  # numbapos's backward consumes its forward: one forward per pass
        local_embedding(inp, offsets, per_sample_weights)
        grads.append(local_embedding.backward(np.ones((2, 16), np.float32)))
    assert isinstance(local_embedding.weight.grad, SparseRows)
    np.testing.assert_allclose(local_embedding.weight.grad.to_dense(),
                               theirs.weight.grad.to_dense().numpy(), rtol=1e-6)
    # Dot products in another order (PyTorch's BLAS): to rounding.
    np.testing.assert_allclose(grads[0] + grads[1], p.grad.numpy(), rtol=1e-5, atol=1e-5)


# ------------------------------------------- common_nn module tests (test/test_nn.py)


def _randperm_rows(rng):
    return np.stack([rng.permutation(3), rng.permutation(3)])


MODULE_TESTS = {  # fullname: (constructor options, input maker); tables float64
    "EmbeddingBag_mean": (dict(), lambda rng: rng.integers(0, 4, (2, 3))),
    "EmbeddingBag_discontiguous": (
        dict(), lambda rng: np.broadcast_to(rng.integers(0, 4, (1, 512)), (7, 512))),
    "EmbeddingBag_sum": (dict(mode="sum"), lambda rng: rng.integers(0, 4, (2, 3))),
    "EmbeddingBag_max": (dict(mode="max"), lambda rng: rng.integers(0, 4, (2, 3))),
    "EmbeddingBag_mean_padding_idx": (dict(padding_idx=1), _randperm_rows),
    "EmbeddingBag_sum_padding_idx": (dict(mode="sum", padding_idx=1), _randperm_rows),
    "EmbeddingBag_max_padding_idx": (dict(mode="max", padding_idx=1), _randperm_rows),
    "EmbeddingBag_sparse": (dict(sparse=True),
                            lambda rng: np.tile(rng.permutation(2), (1, 2))),
}


@pytest.mark.parametrize("fullname", list(MODULE_TESTS))
def test_common_nn_module_test(fullname):
    """The EmbeddingBag entries of common_nn's module tests: the table's gradient (its
    Jacobian times a random output gradient) against central differences, in float64.
    The discontiguous input is a stride-0 broadcast view, as PyTorch's ``expand``."""
    options, make_input = MODULE_TESTS[fullname]
    rng = np.random.default_rng(_seed(fullname))
    module = EmbeddingBag(4, 3, dtype=np.float64, seed=rng, **options)
    inp = make_input(rng)
    grad_output = rng.standard_normal((inp.shape[0], 3))
    module(inp)
    module.backward(grad_output)
    assert isinstance(module.weight.grad, SparseRows) == options.get("sparse", False)

    def loss():
        with numbapos.no_grad():
            return float((module(inp) * grad_output).sum())

    numeric = ref.finite_difference(loss, module.weight.data)
    np.testing.assert_allclose(_dense(module.weight.grad), numeric, rtol=1e-6, atol=1e-8)
    theirs = torch.nn.EmbeddingBag.from_pretrained(torch.from_numpy(module.weight.data.copy()),
                                                   freeze=False, **options)
    expected = theirs(torch.from_numpy(np.ascontiguousarray(inp)))
    with numbapos.no_grad():
        np.testing.assert_allclose(module(inp), expected.detach().numpy(), rtol=1e-12)


# ----------------------------- OpInfo samples (common_methods_invocations.py)

S, M = 5, 10  # common_methods_invocations's sizes


def _sample_inputs_embedding_bag(rng, mode, weighted):
    """``sample_inputs_embedding_bag`` for one mode, with per_sample_weights or not, with
    requires_grad False (the max_norm and scale_grad_by_freq samples included): ``(name,
    weight, idx, kwargs)``. Values as ``make_tensor``'s, uniform in [-9, 9); its
    noncontiguous ids are strided views here."""

    def make_input(shape):
        return rng.uniform(-9, 9, shape)

    def make_long_input(shape, *, low, high, noncontiguous=False):
        if noncontiguous:
            return rng.integers(low, high, (*shape[:-1], 2 * shape[-1]))[..., ::2]
        return rng.integers(low, high, shape)

    def psw(idx):
        return make_input(idx.shape) if weighted else None

    offsets = np.array([0, 3])
    samples = []
    idx = make_long_input((S,), low=0, high=M)
    samples.append(("1-D", make_input((M, S)), idx, dict(offsets=offsets)))
    idx = make_long_input((S,), low=0, high=M, noncontiguous=True)
    samples.append(("1-D strided", make_input((M, S)), idx, dict(offsets=offsets)))
    idx = make_long_input((S,), low=0, high=M, noncontiguous=True)
    samples.append(("empty bag", make_input((M, S)), idx, dict(offsets=np.array([0, 0, 3]))))
    idx = make_long_input((S, S), low=0, high=M)
    samples.append(("2-D", make_input((M, S)), idx, {}))
    idx = make_long_input((S, S), low=0, high=M, noncontiguous=True)
    samples.append(("2-D strided", make_input((M, S)), idx, {}))
    idx = make_long_input((6,), low=0, high=S)
    idx[0] = idx[4] = 4
    samples.append(("padding -1", make_input((S, S)), idx,
                    dict(padding_idx=-1, offsets=offsets)))
    idx = make_long_input((3, 3), low=0, high=S)
    idx[0, 0] = idx[1, 1] = 2
    samples.append(("padding 2", make_input((S, S)), idx, dict(padding_idx=2)))
    idx = make_long_input((6,), low=0, high=S)  # PyTorch passes no weights with this one
    samples.append(("include_last_offset", make_input((S, S)), idx,
                    dict(offsets=np.array([0, 3, 6]), include_last_offset=True, psw=None)))
    idx = make_long_input((2, 2), low=0, high=S)
    samples.append(("max_norm", make_input((S, S)) * 2, idx, dict(max_norm=1.0)))
    idx = make_long_input((6,), low=0, high=S)
    samples.append(("max_norm norm_type 1", make_input((S, S)) * 2, idx,
                    dict(max_norm=1.0, norm_type=1.0, offsets=offsets)))
    if mode != "max":
        idx = make_long_input((2, 2), low=0, high=S)
        idx[0, 0] = idx[0, 1] = 1
        samples.append(("scale_grad_by_freq", make_input((S, S)), idx,
                        dict(scale_grad_by_freq=True)))
        idx = make_long_input((6,), low=0, high=S)
        samples.append(("sparse", make_input((S, S)), idx, dict(sparse=True, offsets=offsets)))
        idx = make_long_input((6,), low=0, high=S)
        idx[0] = idx[1] = 1  # freq more than 1
        idx[3] = 0  # padding_idx
        samples.append(("everything", make_input((S, S)) * 2, idx,
                        dict(sparse=True, scale_grad_by_freq=True, padding_idx=0, max_norm=1.0,
                             offsets=offsets)))
    for name, weight, idx, kwargs in samples:
        kwargs = dict(kwargs, mode=mode)
        weights = kwargs.pop("psw") if "psw" in kwargs else psw(idx)
        yield name, weight, idx, kwargs, weights


@pytest.mark.parametrize("mode, weighted", [("sum", False), ("mean", False), ("max", False),
                                            ("sum", True)])
def test_opinfo_sample_inputs(mode, weighted):
    """OpInfo ``nn.functional.embedding_bag``'s samples (float64): forward, and the
    gradients of the table and weights, against PyTorch. With scale_grad_by_freq numbapos
    counts each id over the whole input (documented; PyTorch 2.13's CPU kernel counts by
    a wrong position): the expected gradient is PyTorch's unscaled one divided by those
    counts."""
    rng = np.random.default_rng(_seed("opinfo", mode, weighted))
    for name, weight, idx, kwargs, psw in _sample_inputs_embedding_bag(rng, mode, weighted):
        table, w = weight.copy(), torch.tensor(weight)
        theirs = dict(kwargs, offsets=None if "offsets" not in kwargs
                      else torch.from_numpy(kwargs["offsets"]))
        theirs.pop("scale_grad_by_freq", None)
        p = None if psw is None else torch.tensor(psw, requires_grad=True)
        expected = TF.embedding_bag(torch.from_numpy(np.ascontiguousarray(idx)), w,
                                    per_sample_weights=p, **theirs)  # renorms w in place
        out = embedding_bag(idx, table, per_sample_weights=psw, **kwargs)
        # max_norm's clipping (float64 norms summed in another order: to rounding)
        np.testing.assert_allclose(table, w.numpy(), rtol=1e-14, atol=0, err_msg=name)
        np.testing.assert_allclose(out, expected.detach().numpy(), rtol=1e-12, atol=1e-12,
                                   err_msg=name)
        w.requires_grad_(True)  # the gradients of the clipped table, as PyTorch's
        expected = TF.embedding_bag(torch.from_numpy(np.ascontiguousarray(idx)), w,
                                    per_sample_weights=p, **dict(theirs, max_norm=None))
        grad = rng.standard_normal(tuple(expected.shape))
        expected.backward(torch.from_numpy(grad))
        backward_kwargs = {k: v for k, v in kwargs.items() if k not in ("max_norm",
                                                                        "norm_type")}
        grad_weight, grad_psw = embedding_bag_backward(grad, idx, table, per_sample_weights=psw,
                                                       **backward_kwargs)
        assert isinstance(grad_weight, SparseRows) == kwargs.get("sparse", False), name
        expected_grad = w.grad.to_dense().numpy()
        if kwargs.get("scale_grad_by_freq"):
            counts = np.bincount(np.asarray(idx).reshape(-1), minlength=S)
            expected_grad = expected_grad / np.maximum(counts, 1)[:, None]
        np.testing.assert_allclose(_dense(grad_weight), expected_grad, rtol=1e-12, atol=1e-12,
                                   err_msg=name)
        assert (grad_psw is None) == (psw is None)
        if psw is not None:
            np.testing.assert_allclose(grad_psw, p.grad.numpy(), rtol=1e-12, atol=1e-12,
                                       err_msg=name)
