"""CUDA BERT / GPT-2 block launchers against the CPU launchers and NumPy references.

Runs on Numba's CUDA simulator when there is no GPU (conftest sets
NUMBA_ENABLE_CUDASIM). The simulator runs the THREADS threads of a block as
Python threads, about 0.3 s per token of a per-token kernel, so the inputs are
small; D = 150 is still larger than a block and not a multiple of 32.
"""


import numpy as np
import pytest
import reference
from conftest import FLOAT_DTYPES, INDEX_DTYPES, dev, nan_device, tolerance

from numbapos._args import NO_DROPOUT as NO_DROP
from numbapos._args import BertIds, BertTables, DropoutArgs, chunk_rows, num_chunks
from numbapos.kernels.cpu import blocks as cpu
from numbapos.kernels.cpu import dropout as cpu_dropout
from numbapos.kernels.cuda import blocks as gpu
from numbapos.kernels.cuda.arrays import THREADS

# The simulator evaluates the uint64 hash on NumPy scalars, which warn on wrap-around.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

DIM = 150  # > THREADS and not a multiple of 32
assert DIM > THREADS and DIM % 32
VOCAB, POSITIONS = 11, 9
EPS = 1e-12


def _host(a):
    return None if a is None else a.copy_to_host()


def _close(actual, desired, dtype):
    rtol, atol = tolerance(dtype)
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol)


def _drop(p, seed=7, counter=3):
    return DropoutArgs.make(p, seed, counter, active=p > 0)


def _keep_mask(drop, shape):
    """The CPU dropout launcher's mask (independent of the block kernels)."""
    mask = np.ones(int(np.prod(shape)), dtype=bool)
    if drop.active:
        cpu_dropout.dropout_keep_mask(drop, mask)
    return mask.reshape(shape)


def _bert_inputs(rng, tokens, dim, dtype, types=2, affine=True):
    ids = BertIds(rng.integers(0, VOCAB, tokens).astype(np.int64),
                  rng.integers(0, POSITIONS, tokens).astype(np.int64),
                  rng.integers(0, types, tokens).astype(np.int64))
    tables = BertTables(
        (rng.standard_normal((VOCAB, dim)) + 2).astype(dtype),
        rng.standard_normal((POSITIONS, dim)).astype(dtype),
        rng.standard_normal((types, dim)).astype(dtype),
        (1 + 0.5 * rng.standard_normal(dim)).astype(dtype) if affine else None,
        rng.standard_normal(dim).astype(dtype) if affine else None)
    return ids, tables


def _on_device(ids, tables):
    return BertIds(*map(dev, ids)), BertTables(*map(dev, tables))


def _row_sums(ids, tables):
    """``s`` of every token in the tables' dtype, added as the kernels add it."""
    return (tables.word[ids.word] + tables.token_type[ids.token_type]) \
        + tables.position[ids.position]


def _cpu_bert_forward(ids, tables, drop):
    tokens, dtype = ids.word.size, tables.word.dtype
    y = np.empty((tokens, tables.word.shape[1]), dtype)
    mean, rstd = np.empty(tokens, dtype), np.empty(tokens, dtype)
    cpu.bert_forward(ids, tables, EPS, drop, y, mean, rstd)
    return y, mean, rstd


def _gpu_bert_forward(ids, tables, drop):
    tokens, dtype = ids.word.size, tables.word.dtype
    y = nan_device((tokens, tables.word.shape[1]), dtype)
    mean, rstd = nan_device(tokens, dtype), nan_device(tokens, dtype)
    gpu.bert_forward(*_on_device(ids, tables), EPS, drop, y, mean, rstd)
    return y.copy_to_host(), mean.copy_to_host(), rstd.copy_to_host()


def _bert_backward(module, make, fetch, grad_y, ids, tables, mean, rstd, drop, wanted):
    tokens, dim = grad_y.shape
    dtype = grad_y.dtype
    want_w, want_b, want_t = wanted
    grad_sum = make((tokens, dim), dtype)
    grad_w = make((dim,), dtype) if want_w else None
    grad_b = make((dim,), dtype) if want_b else None
    grad_t = make(tables.token_type.shape, dtype) if want_t else None
    module.bert_backward(grad_y, ids, tables, mean, rstd, drop, grad_sum, grad_w, grad_b, grad_t)
    return tuple(None if a is None else fetch(a) for a in (grad_sum, grad_w, grad_b, grad_t))


def _cpu_bert_backward(grad_y, ids, tables, mean, rstd, drop, wanted):
    return _bert_backward(cpu, np.empty, lambda a: a, grad_y, ids, tables, mean, rstd, drop,
                          wanted)


def _gpu_bert_backward(grad_y, ids, tables, mean, rstd, drop, wanted):
    d_ids, d_tables = _on_device(ids, tables)
    return _bert_backward(gpu, nan_device, _host, dev(grad_y), d_ids, d_tables, dev(mean),
                          dev(rstd), drop, wanted)


def test_same_launchers_as_cpu():
    assert gpu.__all__ == cpu.__all__


# ------------------------------------------------------------------ BERT forward


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("p", [0.0, 0.3])
def test_bert_forward_matches_cpu_and_reference(rng, dtype, p):
    ids, tables = _bert_inputs(rng, 6, DIM, dtype)
    drop = _drop(p)
    y, mean, rstd = _gpu_bert_forward(ids, tables, drop)
    cpu_y, cpu_mean, cpu_rstd = _cpu_bert_forward(ids, tables, drop)
    _close(y, cpu_y, dtype)
    _close(mean, cpu_mean, dtype)
    _close(rstd, cpu_rstd, dtype)
    # The dropout mask is the CPU's, bit for bit (a dropped element is exactly 0).
    keep = _keep_mask(drop, y.shape)
    np.testing.assert_array_equal(y != 0, keep)
    assert keep.all() == (p == 0)
    # NumPy reference: LayerNorm in float64 of the row sums, then the mask and scale.
    ref_y, ref_mean, ref_rstd = reference.layer_norm(_row_sums(ids, tables), tables.gamma,
                                                     tables.beta, eps=EPS)
    ref_y = ref_y * keep * drop.scale
    ref_tol = 1e-4 if dtype == np.float32 else 1e-11
    np.testing.assert_allclose(y, ref_y, rtol=ref_tol, atol=ref_tol)
    np.testing.assert_allclose(mean, ref_mean, rtol=ref_tol)
    np.testing.assert_allclose(rstd, ref_rstd, rtol=ref_tol)


@pytest.mark.parametrize("types", [1, 2])
def test_bert_forward_no_affine_small_dim(rng, types):
    dtype = np.float32
    ids, tables = _bert_inputs(rng, 3, 37, dtype, types=types, affine=False)
    drop = _drop(0.5)
    got = _gpu_bert_forward(ids, tables, drop)
    for g, want in zip(got, _cpu_bert_forward(ids, tables, drop), strict=True):
        _close(g, want, dtype)
    np.testing.assert_array_equal(got[0] != 0, _keep_mask(drop, got[0].shape))


def test_bert_forward_empty(rng):
    ids, tables = _bert_inputs(rng, 0, DIM, np.float64)
    y, mean, rstd = _gpu_bert_forward(ids, tables, _drop(0.1))
    assert y.shape == (0, DIM) and mean.shape == (0,) and rstd.shape == (0,)


# ------------------------------------------------------------------ BERT backward


def _chunked_type_sums(grad_sum, type_ids, types):
    """The token-type gradient as the kernels add it: per chunk in token order, then chunks."""
    tokens, dim = grad_sum.shape
    chunk = chunk_rows(tokens)
    parts = np.zeros((num_chunks(tokens), types, dim), grad_sum.dtype)
    for t in range(tokens):
        parts[t // chunk, type_ids[t]] += grad_sum[t]
    out = parts[0].copy()
    for part in parts[1:]:
        out += part
    return out


@pytest.mark.parametrize(("dtype", "p"), [(np.float32, 0.25), (np.float64, 0.0)])
def test_bert_backward_matches_cpu_and_reference(rng, dtype, p):
    tokens = 20  # two chunks of 16 and 4 tokens
    assert chunk_rows(tokens) == 16 and num_chunks(tokens) == 2
    ids, tables = _bert_inputs(rng, tokens, DIM, dtype)
    drop = _drop(p)
    _, mean, rstd = _cpu_bert_forward(ids, tables, drop)
    grad_y = rng.standard_normal((tokens, DIM)).astype(dtype)
    wanted = (True, True, True)
    gs, gw, gb, gt = _gpu_bert_backward(grad_y, ids, tables, mean, rstd, drop, wanted)
    cpu_gs, cpu_gw, cpu_gb, cpu_gt = _cpu_bert_backward(grad_y, ids, tables, mean, rstd, drop,
                                                        wanted)
    _close(gs, cpu_gs, dtype)
    _close(gt, cpu_gt, dtype)
    # gamma / beta: the CPU's terms in the CPU's order, so the CPU's bits.
    np.testing.assert_array_equal(gw, cpu_gw)
    np.testing.assert_array_equal(gb, cpu_gb)
    # token type: the chunked ordered sum of the GPU's own grad_sum, bit for bit.
    np.testing.assert_array_equal(gt, _chunked_type_sums(gs, ids.token_type, 2))
    # NumPy reference in float64: the LayerNorm backward of the row sums, masked grad_y.
    masked = grad_y * _keep_mask(drop, grad_y.shape) * drop.scale
    ref_gs, ref_gw, ref_gb = reference.layer_norm_backward(masked, _row_sums(ids, tables),
                                                           tables.gamma, eps=EPS)
    ref_gt = np.stack([ref_gs[ids.token_type == k].sum(0) for k in range(2)])
    ref_tol = 2e-4 if dtype == np.float32 else 1e-9
    for got, ref in ((gs, ref_gs), (gw, ref_gw), (gb, ref_gb), (gt, ref_gt)):
        np.testing.assert_allclose(got, ref, rtol=ref_tol, atol=ref_tol)


@pytest.mark.parametrize(("wanted", "affine", "types"), [
    ((True, False, False), True, 2),
    ((False, True, True), False, 1),
    ((False, False, False), True, 2),
])
def test_bert_backward_optional_outputs(rng, wanted, affine, types):
    dtype = np.float64
    ids, tables = _bert_inputs(rng, 3, 40, dtype, types=types, affine=affine)
    drop = _drop(0.2)
    _, mean, rstd = _cpu_bert_forward(ids, tables, drop)
    grad_y = rng.standard_normal((3, 40)).astype(dtype)
    got = _gpu_bert_backward(grad_y, ids, tables, mean, rstd, drop, wanted)
    want = _cpu_bert_backward(grad_y, ids, tables, mean, rstd, drop, wanted)
    _close(got[0], want[0], dtype)
    for g, c in zip(got[1:], want[1:], strict=True):
        assert (g is None) == (c is None)
        if g is not None:
            _close(g, c, dtype)


def test_bert_add_order(rng):
    """``s = (word + token_type) + position``: word and token type cancel exactly first.

    With word = 2**24 and token type = -2**24 in float32, ``s`` is exactly the
    position row; adding the position earlier would round it away.
    """
    dtype, tokens, dim = np.float32, 2, 40
    ids, tables = _bert_inputs(rng, tokens, dim, dtype)
    big = dtype(2.0 ** 24)
    tables = tables._replace(word=np.full_like(tables.word, big),
                             token_type=np.full_like(tables.token_type, -big))
    s = tables.position[ids.position]
    assert np.array_equal(_row_sums(ids, tables), s)
    y, mean, rstd = _gpu_bert_forward(ids, tables, NO_DROP)
    ref_y, ref_mean, ref_rstd = reference.layer_norm(s, tables.gamma, tables.beta, eps=EPS)
    np.testing.assert_allclose(y, ref_y, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(mean, ref_mean, rtol=1e-4, atol=1e-6)
    grad_y = rng.standard_normal((tokens, dim)).astype(dtype)
    gs, gw, _, _ = _gpu_bert_backward(grad_y, ids, tables, ref_mean.astype(dtype),
                                      ref_rstd.astype(dtype), NO_DROP, (True, False, False))
    ref_gs, ref_gw, _ = reference.layer_norm_backward(grad_y, s, tables.gamma, eps=EPS)
    np.testing.assert_allclose(gs, ref_gs, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gw, ref_gw, rtol=1e-4, atol=1e-4)


def test_bert_backward_empty_zero_fills(rng):
    ids, tables = _bert_inputs(rng, 0, DIM, np.float32)
    grad_y = np.empty((0, DIM), np.float32)
    mean = np.empty(0, np.float32)
    gs, gw, gb, gt = _gpu_bert_backward(grad_y, ids, tables, mean, mean, _drop(0.1),
                                        (True, True, True))
    assert gs.shape == (0, DIM)
    for g in (gw, gb, gt):
        np.testing.assert_array_equal(g, np.zeros_like(g))


# ------------------------------------------------------------------ GPT-2 forward


def _gpt2(module, make, fetch, ids, pos, wte, wpe, drop):
    y = make((ids.size, wte.shape[1]), wte.dtype)
    module.gpt2_forward(ids, pos, wte, wpe, drop, y)
    return fetch(y)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
@pytest.mark.parametrize("p", [0.0, 0.4])
def test_gpt2_forward_bitwise(rng, dtype, index_dtype, p):
    tokens = 13
    ids = rng.integers(0, VOCAB, tokens).astype(index_dtype)
    ids[:3] = 4  # repeated ids
    pos = rng.integers(0, POSITIONS, tokens).astype(index_dtype)
    wte = rng.standard_normal((VOCAB, DIM)).astype(dtype)
    wpe = rng.standard_normal((POSITIONS, DIM)).astype(dtype)
    drop = _drop(p)
    y = _gpt2(gpu, nan_device, _host, dev(ids), dev(pos), dev(wte), dev(wpe), drop)
    np.testing.assert_array_equal(y, _gpt2(cpu, np.empty, lambda a: a, ids, pos, wte, wpe, drop))
    keep = _keep_mask(drop, y.shape)
    ref = (wte[ids] + wpe[pos]) * np.where(keep, dtype(drop.scale), dtype(0))
    np.testing.assert_array_equal(y, ref)


def test_gpt2_forward_empty():
    ids = np.empty(0, np.int64)
    wte = np.ones((VOCAB, DIM), np.float32)
    y = _gpt2(gpu, nan_device, _host, dev(ids), dev(ids), dev(wte), dev(wte[:POSITIONS]),
              _drop(0.1))
    assert y.shape == (0, DIM)
