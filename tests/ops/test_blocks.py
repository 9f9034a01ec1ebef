"""BertEmbeddings and GPT2Embeddings: fused forward/backward against the NumPy reference.

Tests of the blocks run on the CPU and on CUDA (the ``device`` fixture; Numba's CUDA
simulator without a GPU). The BERT kernels take one block of threads per token, about
0.25 s per token on the simulator, so CUDA gets fewer tokens and a subset of the
combinations; finite-difference checks evaluate the loss on a CPU twin of the block
and take the gradients from the device. Thread-count, parallel-kernel, read-only
and non-contiguous-table tests, and checkpoint loading, stay on the CPU.
"""

import itertools

import numba
import numpy as np
import pytest
import reference
from conftest import FLOAT_DTYPES, device_cases, host, on, tolerance, two_threads
from cuda_counts import deferred_raises

import numbapos
from numbapos import _device, nn
from numbapos import functional as F
from numbapos.functional import blocks as FB
from numbapos.sparse import SparseRows

V, D, P, TV = 12, 6, 10, 3  # vocab, hidden, positions, token types

# The simulator evaluates the uint64 dropout hash on NumPy scalars, which warn on wrap-around.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


def _bert(dtype=np.float64, p=0.0, seed=0, device="cpu", **kwargs):
    block = nn.BertEmbeddings(V, D, P, TV, pad_token_id=kwargs.pop("pad_token_id", 0),
                              layer_norm_eps=kwargs.pop("eps", 1e-3), hidden_dropout_prob=p,
                              seed=seed, dtype=dtype, **kwargs)
    rng = np.random.default_rng(seed + 100)
    # Non-trivial LayerNorm parameters so their gradients and effect are tested.
    block.LayerNorm.weight.data[:] = rng.standard_normal(D) + 1.0
    block.LayerNorm.bias.data[:] = rng.standard_normal(D)
    return block.to(device)


def _bert_reference(block, ids, counter=0, training=True, **kwargs):
    drop = block.dropout
    return reference.bert_embeddings(
        ids, host(block.word_embeddings.weight.data), host(block.position_embeddings.weight.data),
        host(block.token_type_embeddings.weight.data), host(block.LayerNorm.weight.data),
        host(block.LayerNorm.bias.data), block.LayerNorm.eps, p=drop.p if training else 0.0,
        seed=drop.seed, counter=counter, **kwargs)


def _tol(dtype):
    return (2e-5, 2e-5) if np.dtype(dtype) == np.float32 else (1e-10, 1e-10)


def _threads():
    return two_threads()


def _assert_on(device, *arrays):
    for a in arrays:
        assert _device.device_of(a) == device, f"result on {_device.device_of(a)}, not {device}"


# ================================================================== BERT forward


@pytest.mark.parametrize(("device", "dtype", "p"),
                         device_cases([(d, p) for p in (0.0, 0.4) for d in FLOAT_DTYPES],
                                      [(np.float32, 0.4), (np.float64, 0.0)]),
                         indirect=["device"])
def test_bert_forward_matches_reference(rng, device, dtype, p):
    block = _bert(dtype, p=p, device=device)
    shape = (3, 5) if device == "cpu" else (2, 3)
    ids = rng.integers(0, V, shape)
    types = rng.integers(0, TV, shape)
    y = block(on(device, ids), token_type_ids=on(device, types), past_length=2)
    _assert_on(device, y)
    assert y.shape == (*shape, D) and y.dtype == dtype
    ref = _bert_reference(block, ids, token_type_ids=types, past_length=2)
    np.testing.assert_allclose(host(y), ref, *_tol(dtype))
    assert block.dropout.counter == (1 if p else 0)


def test_bert_forward_position_and_type_variants(rng, device):
    block = _bert(device=device)
    length = 4 if device == "cpu" else 2
    ids = rng.integers(0, V, (2, length))
    positions = (rng.integers(0, P, (2, length)), np.array([3, 1, 4, 1])[:length],
                 np.array([[0, 9, 2, 2]])[:, :length])
    types = (None, np.array([0, 1, 2, 1])[:length], rng.integers(0, TV, (2, length)))
    # Every pairing on the CPU; on CUDA each variant once (host ids, moved by the block).
    if device == "cpu":
        pairs = itertools.product(positions, types)
    else:
        pairs = zip(positions, types, strict=True)
    for pos, tt in pairs:
        y = block(ids, token_type_ids=tt, position_ids=pos)
        ref = _bert_reference(block, ids, token_type_ids=tt, position_ids=pos)
        np.testing.assert_allclose(host(y), ref, rtol=1e-10, atol=1e-10)


def test_bert_forward_1d_ids_and_int32(rng, device):
    block = _bert(np.float32, device=device)
    length = 7 if device == "cpu" else 4
    ids = rng.integers(0, V, length).astype(np.int32)
    y = block(on(device, ids), past_length=3)
    assert y.shape == (length, D)
    np.testing.assert_allclose(host(y), _bert_reference(block, ids, past_length=3), rtol=2e-5,
                               atol=2e-5)


def test_bert_large_input_uses_parallel_kernel(rng):
    # 4 * 64 * 128 elements is above PARALLEL_MIN_ELEMENTS.
    block = nn.BertEmbeddings(50, 128, 64, 2, hidden_dropout_prob=0.1, seed=3)
    ids = rng.integers(0, 50, (4, 64))
    assert ids.size * 128 >= numbapos.config.get("parallel_min_elements")
    y = block(ids)
    np.testing.assert_allclose(y, _bert_reference(block, ids), rtol=2e-5, atol=2e-5)


def test_bert_fused_equals_unfused_chain(rng, device):
    # The fused kernel draws the Dropout child's mask and adds the rows in Hugging
    # Face's order: same bits as running the children one after the other on the CPU;
    # on CUDA the two LayerNorm kernels may contract multiply-adds differently, so the
    # values agree to a few ulp and the dropped elements exactly.
    block = _bert(np.float32, p=0.3, device=device)
    shape = (2, 5) if device == "cpu" else (1, 3)
    ids = rng.integers(0, V, shape)
    types = rng.integers(0, TV, shape)
    counter = block.dropout.counter
    fused = host(block(on(device, ids), token_type_ids=on(device, types)))
    rows = [host(F.embedding(on(device, i), table.weight.data)) for i, table in
            ((ids, block.word_embeddings), (types, block.token_type_embeddings),
             (np.arange(shape[1]), block.position_embeddings))]
    total = rows[0] + rows[1] + rows[2]
    normed = F.layer_norm(on(device, total), block.LayerNorm.weight.data,
                          block.LayerNorm.bias.data, eps=block.LayerNorm.eps)
    unfused = host(F.dropout(normed, block.dropout.p, block.dropout.seed, counter=counter))
    if device == "cpu":
        np.testing.assert_array_equal(fused, unfused)
    else:
        np.testing.assert_allclose(fused, unfused, *tolerance(np.float32))
        np.testing.assert_array_equal(fused == 0, unfused == 0)
    assert (fused == 0).any()


def test_bert_eval_mode_and_counter(rng, device):
    block = _bert(p=0.5, device=device)
    ids = rng.integers(0, V, (2, 3) if device == "cpu" else (1, 3))
    first = host(block(ids))
    second = host(block(ids))
    assert block.dropout.counter == 2
    assert not np.array_equal(first, second)
    np.testing.assert_allclose(second, _bert_reference(block, ids, counter=1), rtol=1e-10,
                               atol=1e-10)
    block.eval()
    clean = host(block(ids))
    assert block.dropout.counter == 2
    np.testing.assert_allclose(clean, _bert_reference(block, ids, training=False), rtol=1e-10,
                               atol=1e-10)


def test_bert_out_buffer(rng, device):
    block = _bert(np.float32, device=device)
    shape = (2, 3) if device == "cpu" else (1, 2)
    ids = rng.integers(0, V, shape)
    out = on(device, np.full((*shape, D), np.nan, np.float32))
    assert block(on(device, ids), out=out) is out
    np.testing.assert_allclose(host(out), _bert_reference(block, ids), rtol=2e-5, atol=2e-5)


def test_out_overlapping_inputs_is_refused(device):
    # LayerNorm parameters and the flat ids are read while out is written.
    block = _bert(device=device)
    buf_host = np.zeros(2 * D)
    buf_host[:D] = 1.0
    buf = on(device, buf_host)
    block.LayerNorm.weight.data = buf[:D]
    pair = on(device, np.array([[1, 2]]))
    with pytest.raises(ValueError, match="out: must not share memory"):
        block(pair, out=buf.reshape(1, 2, D))
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.bert_embeddings(pair, block.word_embeddings.weight.data,
                          block.position_embeddings.weight.data,
                          block.token_type_embeddings.weight.data, buf[:D],
                          out=buf.reshape(1, 2, D))
    np.testing.assert_array_equal(host(buf), buf_host)
    ids = on(device, np.zeros(2 * D, dtype=np.int64))
    with pytest.raises(ValueError, match="out: must not share memory"):
        F.gpt2_embeddings(ids, on(device, np.ones((V, 1))), on(device, np.ones((2 * D, 1))),
                          out=ids.view(np.float64).reshape(2 * D, 1))
    np.testing.assert_array_equal(host(ids), 0)


def test_bert_empty_tables_are_refused(rng, device):
    # The default token type 0 was gathered from a 0-row table (garbage forward,
    # segfault in backward); D = 0 raised ZeroDivisionError inside the kernel.
    word, pos = on(device, rng.standard_normal((V, D))), on(device, rng.standard_normal((P, D)))
    no_types = on(device, np.zeros((0, D)))
    ids = on(device, np.array([[1, 2]]))
    with pytest.raises(IndexError, match="token_type_ids: the default token type 0 .* "
                                         "type_vocab_size=0"):
        F.bert_embeddings(ids, word, pos, no_types)
    with pytest.raises(IndexError, match="type_vocab_size=0"):
        F.bert_embeddings_backward(on(device, np.ones((1, 2, D))), ids, word, pos, no_types,
                                   on(device, np.zeros((1, 2))), on(device, np.ones((1, 2))))
    empty = F.bert_embeddings(on(device, np.zeros((1, 0), np.int64)), word, pos, no_types)
    _assert_on(device, empty)
    assert empty.shape == (1, 0, D)
    block = _bert(device=device)
    block.token_type_embeddings.weight.data = no_types
    with pytest.raises(IndexError, match="type_vocab_size=0"):
        block(ids)
    flat = on(device, np.zeros((4, 0)))
    with pytest.raises(ValueError, match="word_embeddings: expected a hidden size >= 1"):
        F.bert_embeddings(ids, flat, flat, flat)


def test_read_only_table_with_max_norm_is_refused_before_any_clipping():
    block = _bert()
    word = np.full((V, D), 5.0)
    position = np.full((P, D), 5.0)
    position.flags.writeable = False
    block.word_embeddings = nn.Embedding(V, D, _weight=word, max_norm=1.0)
    block.position_embeddings = nn.Embedding(P, D, _weight=position, max_norm=1.0)
    with pytest.raises(ValueError, match="position_embeddings: the array is read-only"):
        block(np.array([[1, 2]]))
    np.testing.assert_array_equal(word, 5.0)  # the word table was not clipped either
    gpt2 = nn.GPT2Embeddings(V, P, D, seed=0, dtype=np.float64)
    gpt2.wpe = nn.Embedding(P, D, _weight=position, max_norm=1.0)
    with pytest.raises(ValueError, match="wpe: the array is read-only"):
        gpt2(np.array([[1, 2]]))


def test_max_norm_clips_non_contiguous_tables_before_the_gather(rng):
    # The fused kernel gathered from a contiguous copy taken before clipping, so a
    # Fortran-ordered table with max_norm gave unclipped rows.
    ids = np.array([[1, 2, 1]])
    start = rng.standard_normal((P, D)) * 10
    outputs = []
    for order in ("C", "F"):
        block = _bert()
        table = np.array(start, order=order)
        block.position_embeddings = nn.Embedding(P, D, _weight=table, max_norm=1.0)
        outputs.append(block(ids))
        assert np.linalg.norm(table[:3], axis=1).max() <= 1.0 + 1e-12
    np.testing.assert_array_equal(outputs[0], outputs[1])
    wte = np.asfortranarray(rng.standard_normal((V, D)) * 10)
    gpt2 = nn.GPT2Embeddings(V, P, D, embd_pdrop=0.0, seed=0, dtype=np.float64)
    gpt2.wte = nn.Embedding(V, D, _weight=wte, max_norm=1.0)
    y = gpt2(ids)
    np.testing.assert_array_equal(y, wte[ids] + gpt2.wpe.weight.data[:3])
    assert np.linalg.norm(wte[[1, 2]], axis=1).max() <= 1.0 + 1e-12


def test_bert_empty_input(device):
    block = _bert(device=device)
    y = block(on(device, np.zeros((2, 0), dtype=np.int64)))
    _assert_on(device, y)
    assert y.shape == (2, 0, D)
    block.backward(on(device, np.zeros((2, 0, D))))
    np.testing.assert_array_equal(host(block.word_embeddings.weight.grad), 0)
    np.testing.assert_array_equal(host(block.LayerNorm.weight.grad), 0)


def test_bert_init_and_names(device):
    block = nn.BertEmbeddings(30, 8, 16, 2, pad_token_id=1, seed=0, device=device)
    assert block.device == device
    names = [name for name, _ in block.named_parameters()]
    assert names == ["word_embeddings.weight", "position_embeddings.weight",
                     "token_type_embeddings.weight", "LayerNorm.weight", "LayerNorm.bias"]
    assert block.word_embeddings.padding_idx == 1
    word = host(block.word_embeddings.weight.data)
    np.testing.assert_array_equal(word[1], 0)
    np.testing.assert_array_equal(host(block.LayerNorm.weight.data), 1)
    np.testing.assert_array_equal(host(block.LayerNorm.bias.data), 0)
    assert block.LayerNorm.eps == 1e-12 and block.dropout.p == 0.1
    assert 0.01 < word.std() < 0.03
    assert (block.vocab_size, block.hidden_size, block.max_position_embeddings,
            block.type_vocab_size) == (30, 8, 16, 2)
    again = nn.BertEmbeddings(30, 8, 16, 2, pad_token_id=1, seed=0)
    np.testing.assert_array_equal(again.word_embeddings.weight.data, word)
    assert again.dropout.seed == block.dropout.seed
    assert "vocab_size=30" in repr(block)


# ================================================================== BERT backward


def _check_finite_differences(block, twin, loss, skip_row=None):
    """``block``'s accumulated gradients against finite differences of ``loss``, which
    evaluates ``twin`` (``block`` itself on the CPU; a CPU copy of a CUDA ``block``,
    as a forward pass per probed element would take minutes on the simulator)."""
    for (name, param), (_, twin_param) in zip(block.named_parameters(), twin.named_parameters(),
                                             strict=True):
        np.testing.assert_array_equal(host(param.data), twin_param.data, err_msg=name)
        expected = reference.finite_difference(loss, twin_param.data)
        if skip_row is not None and name == skip_row[0]:
            expected[skip_row[1]] = 0
        np.testing.assert_allclose(host(param.grad), expected, rtol=1e-6, atol=1e-7,
                                   err_msg=name)


@pytest.mark.parametrize(("device", "p"), device_cases([(0.0,), (0.3,)], [(0.3,)]),
                         indirect=["device"])
def test_bert_gradients_match_finite_differences(rng, device, p):
    block = _bert(np.float64, p=p, seed=1, device=device)
    twin = block if device == "cpu" else _bert(np.float64, p=p, seed=1)
    ids = np.array([[1, 0, 5, 5], [7, 1, 1, 0]])  # repeats and the padding id 0
    types = np.array([[0, 2, 2, 1], [1, 1, 0, 0]])
    probe = rng.standard_normal((2, 4, D))

    def loss():
        with numbapos.no_grad():  # evaluations only, no backward
            twin.dropout.counter = 0
            return float((twin(ids, token_type_ids=types, past_length=1) * probe).sum())

    block.dropout.counter = 0
    block(on(device, ids), token_type_ids=on(device, types), past_length=1)
    block.backward(on(device, probe))
    # The padding row never receives a gradient (HF / PyTorch).
    _check_finite_differences(block, twin, loss,
                              ("word_embeddings.weight", block.word_embeddings.padding_idx))


def test_bert_gradients_with_explicit_positions_and_large_type_vocab(rng, device):
    # 20 token types is above FUSED_TYPE_GRAD_MAX_ROWS: the scatter path.
    def make():
        return nn.BertEmbeddings(V, D, P, 20, pad_token_id=None, layer_norm_eps=1e-3,
                                 hidden_dropout_prob=0.0, seed=2, dtype=np.float64)

    block = make().to(device)
    twin = block if device == "cpu" else make()
    assert 20 > FB.FUSED_TYPE_GRAD_MAX_ROWS
    ids = rng.integers(0, V, (2, 3))
    types = rng.integers(0, 20, (2, 3))
    pos = np.array([4, 4, 9])
    probe = rng.standard_normal((2, 3, D))

    def loss():
        with numbapos.no_grad():  # evaluations only, no backward
            return float((twin(ids, token_type_ids=types, position_ids=pos) * probe).sum())

    block(on(device, ids), token_type_ids=on(device, types), position_ids=on(device, pos))
    block.backward(on(device, probe))
    _check_finite_differences(block, twin, loss)


def test_bert_backward_accumulates_and_respects_frozen(rng, device):
    block = _bert(np.float64, device=device)
    shape = (2, 3) if device == "cpu" else (1, 2)
    ids = rng.integers(0, V, shape)
    probe = on(device, rng.standard_normal((*shape, D)))
    block(ids)
    block.backward(probe)
    first = {name: host(param.grad).copy() for name, param in block.named_parameters()}
    block(ids)
    block.backward(probe)
    for name, param in block.named_parameters():
        _assert_on(device, param.grad)
        np.testing.assert_allclose(host(param.grad), 2 * first[name], rtol=1e-12)
    block.zero_grad()
    block.word_embeddings.weight.requires_grad = False
    block.LayerNorm.bias.requires_grad = False
    block(ids)
    assert block.backward(probe) is None
    assert block.word_embeddings.weight.grad is None and block.LayerNorm.bias.grad is None
    np.testing.assert_allclose(host(block.position_embeddings.weight.grad),
                               first["position_embeddings.weight"], rtol=1e-12)
    np.testing.assert_allclose(host(block.LayerNorm.weight.grad), first["LayerNorm.weight"],
                               rtol=1e-12)


def test_bert_child_embedding_options(rng, device):
    dense = _bert(np.float64, device=device)
    sparse = _bert(np.float64, device=device)
    sparse.word_embeddings.sparse = True
    # On CUDA three tokens, one id repeated (its sparse row sums two terms).
    ids = rng.integers(0, V, (2, 4)) if device == "cpu" else np.array([[3, 7, 3]])
    probe = on(device, rng.standard_normal((*ids.shape, D)))
    for block in (dense, sparse):
        block(on(device, ids))
        block.backward(probe)
    grad = sparse.word_embeddings.weight.grad
    assert isinstance(grad, SparseRows)
    _assert_on(device, grad.indices, grad.values)
    np.testing.assert_allclose(host(grad.to_dense()), host(dense.word_embeddings.weight.grad),
                               rtol=1e-12)
    clipped = _bert(np.float64)
    clipped.word_embeddings.weight.data *= 100
    clipped.word_embeddings.max_norm = 1.0
    clipped.to(device)
    clipped(on(device, ids))
    norms = np.linalg.norm(host(clipped.word_embeddings.weight.data)[np.unique(ids)], axis=1)
    assert np.all(norms <= 1.0 + 1e-6)


def test_bert_functional_backward_matches_module(rng, device):
    block = _bert(np.float32, p=0.2, device=device)
    ids = on(device, rng.integers(0, V, (2, 4) if device == "cpu" else (1, 2)))
    probe = on(device, rng.standard_normal((*ids.shape, D)).astype(np.float32))
    tables = (block.word_embeddings.weight.data, block.position_embeddings.weight.data,
              block.token_type_embeddings.weight.data)
    ln = (block.LayerNorm.weight.data, block.LayerNorm.bias.data)
    kwargs = dict(p=0.2, seed=block.dropout.seed, counter=block.dropout.counter)
    y, mean, rstd = F.bert_embeddings_forward(ids, *tables, *ln, eps=block.LayerNorm.eps,
                                              **kwargs)
    _assert_on(device, y, mean, rstd)
    # Same device, same kernels: bit-identical.
    np.testing.assert_array_equal(host(block(ids)), host(y))
    np.testing.assert_array_equal(host(F.bert_embeddings(ids, *tables, *ln,
                                                         eps=block.LayerNorm.eps, **kwargs)),
                                  host(y))
    grads = F.bert_embeddings_backward(probe, ids, *tables, mean, rstd, *ln, padding_idx=0,
                                       **kwargs)
    block.backward(probe)
    for got, param in zip(grads, block.parameters(), strict=True):
        _assert_on(device, got)
        np.testing.assert_array_equal(host(got), host(param.grad))


def test_bert_deterministic_for_any_thread_count(rng):
    ids = rng.integers(0, 40, (4, 64))
    types = rng.integers(0, 2, (4, 64))
    probe = rng.standard_normal((4, 64, 128)).astype(np.float32)
    results = []
    before = numba.get_num_threads()
    try:
        for threads in (1, _threads()):
            numba.set_num_threads(threads)
            block = nn.BertEmbeddings(40, 128, 64, 2, hidden_dropout_prob=0.1, seed=5)
            y = block(ids, token_type_ids=types)
            block.backward(probe)
            results.append([y] + [param.grad for param in block.parameters()])
    finally:
        numba.set_num_threads(before)
    for first, second in zip(*results, strict=True):
        np.testing.assert_array_equal(first, second)


# ================================================================== BERT errors


def test_bert_input_errors(rng, device):
    block = _bert(np.float32, p=0.5, device=device)
    ids_host = rng.integers(0, V, (2, 3))
    ids = on(device, ids_host)
    before = {name: host(param.data).copy() for name, param in block.named_parameters()}
    # On CUDA the fused kernel finds a bad id: the next synchronising call raises.
    with deferred_raises(device, IndexError, rf"input_ids: index {V} .*vocab_size={V}; valid"):
        block(on(device, np.array([[1, V, 2]])))
    with deferred_raises(device, IndexError, r"input_ids: index -1 .*vocab_size"):
        block(on(device, np.array([-1, 2])))
    with deferred_raises(device, IndexError,
                         rf"token_type_ids: index {TV} .*type_vocab_size={TV}"):
        block(ids, token_type_ids=on(device, np.full((2, 3), TV)))
    with deferred_raises(device, IndexError,
                         rf"position_ids: index {P} .*max_position_embeddings"):
        block(ids, position_ids=on(device, np.array([0, 1, P])))
    queued = 4 if device == "cuda" else 0  # deferred calls ran (their dropout draws count)
    with pytest.raises(ValueError, match=rf"past_length \+ L = 8 \+ 3 = 11 exceeds "
                                         rf"max_position_embeddings={P}"):
        block(ids, past_length=8)
    with pytest.raises(ValueError, match="past_length: expected an integer >= 0, got -1"):
        block(ids, past_length=-1)
    with pytest.raises(TypeError, match="past_length: expected an integer"):
        block(ids, past_length=1.0)
    with pytest.raises(ValueError, match=r"input_ids: expected shape \(N, L\) or \(L,\)"):
        # reshape, not ids_host[None]: numbapos.to_device keeps NumPy's stride 0 on the new
        # axis, and a real GPU's device array then counts as not C-contiguous.
        block(on(device, ids_host.reshape(1, 2, 3)))
    with pytest.raises(TypeError, match="input_ids: expected integer indices"):
        block(on(device, ids_host.astype(np.float32)))
    with pytest.raises(ValueError, match=r"token_type_ids: expected shape .*got \(2, 2\)"):
        block(ids, token_type_ids=on(device, np.zeros((2, 2), np.int64)))
    with pytest.raises(ValueError, match=r"position_ids: expected shape .*got \(4,\)"):
        block(ids, position_ids=on(device, np.arange(4)))
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 3, 6\) and dtype float32"):
        block(ids, out=on(device, np.empty((2, 3, D))))
    # Nothing else ran: the tables, the ids and the dropout counter are unchanged.
    assert block.dropout.counter == queued
    np.testing.assert_array_equal(host(ids), ids_host)
    for name, param in block.named_parameters():
        np.testing.assert_array_equal(host(param.data), before[name])


def test_bert_backward_errors(rng, device):
    block = _bert(np.float32, device=device)
    with pytest.raises(RuntimeError, match="before forward"):
        block.backward(on(device, np.zeros((1, 2, D), np.float32)))
    block(on(device, rng.integers(0, V, (2, 2))))
    with pytest.raises(ValueError, match=r"grad_output: expected shape \(2, 2, 6\)"):
        block.backward(on(device, np.zeros((2, 2, D + 1), np.float32)))
    with pytest.raises(TypeError, match="grad_output: expected dtype float32"):
        block.backward(on(device, np.zeros((2, 2, D))))
    assert block.word_embeddings.weight.grad is None


def test_bert_constructor_errors():
    with pytest.raises(ValueError, match="vocab_size: expected an integer >= 1, got 0"):
        nn.BertEmbeddings(0, 4)
    with pytest.raises(TypeError, match="hidden_size: expected an integer"):
        nn.BertEmbeddings(10, 4.0)
    with pytest.raises(ValueError, match=r"pad_token_id: 10 is outside \[-10, 10\)"):
        nn.BertEmbeddings(10, 4, pad_token_id=10)
    with pytest.raises(ValueError, match=r"hidden_dropout_prob: expected a probability in \[0, 1"):
        nn.BertEmbeddings(10, 4, hidden_dropout_prob=1.5)
    with pytest.raises(ValueError, match="layer_norm_eps: expected a finite number >= 0"):
        nn.BertEmbeddings(10, 4, layer_norm_eps=-1.0)
    with pytest.raises(TypeError, match="dtype: expected float32, float64, bfloat16 or float16"):
        nn.BertEmbeddings(10, 4, dtype=np.int64)


def test_bert_functional_errors(rng, device):
    word_host = rng.standard_normal((V, D)).astype(np.float32)
    word = on(device, word_host)
    pos_host = rng.standard_normal((P, D)).astype(np.float32)
    pos = on(device, pos_host)
    tt_host = rng.standard_normal((TV, D)).astype(np.float32)
    tt = on(device, tt_host)
    ids = on(device, rng.integers(0, V, (2, 1)))
    with pytest.raises(TypeError, match="position_embeddings: expected dtype float32"):
        F.bert_embeddings(ids, word, on(device, pos_host.astype(np.float64)), tt)
    with pytest.raises(ValueError, match="token_type_embeddings: expected 6 columns"):
        F.bert_embeddings(ids, word, pos, on(device, tt_host[:, :4]))
    with pytest.raises(ValueError, match=r"ln_weight: expected shape \(6,\)"):
        F.bert_embeddings(ids, word, pos, tt, on(device, np.ones(5, np.float32)))
    with pytest.raises(TypeError, match="ln_bias: expected dtype float32"):
        F.bert_embeddings(ids, word, pos, tt, None, on(device, np.ones(D)))
    with pytest.raises(ValueError, match=r"p: expected a probability in \[0, 1\]"):
        F.bert_embeddings(ids, word, pos, tt, p=2.0)
    with pytest.raises(ValueError, match="seed: expected an integer >= 0"):
        F.bert_embeddings(ids, word, pos, tt, p=0.1, seed=-1)
    y, mean, rstd = F.bert_embeddings_forward(ids, word, pos, tt)
    with pytest.raises(ValueError, match=r"mean: expected shape \(2, 1\)"):
        F.bert_embeddings_backward(y, ids, word, pos, tt, mean[:1], rstd)
    with pytest.raises(TypeError, match="rstd: expected dtype float32"):
        F.bert_embeddings_backward(y, ids, word, pos, tt, mean,
                                   on(device, host(rstd).astype(np.float64)))
    with pytest.raises(ValueError, match="padding_idx: 12 is outside"):
        F.bert_embeddings_backward(y, ids, word, pos, tt, mean, rstd, padding_idx=V)
    for table, want in ((word, word_host), (pos, pos_host), (tt, tt_host)):
        np.testing.assert_array_equal(host(table), want)


# ================================================================== checkpoints


def _hf_bert_state(rng, dtype=np.float32, prefix="embeddings."):
    state = {
        prefix + "word_embeddings.weight": rng.standard_normal((V, D)).astype(dtype),
        prefix + "position_embeddings.weight": rng.standard_normal((P, D)).astype(dtype),
        prefix + "token_type_embeddings.weight": rng.standard_normal((TV, D)).astype(dtype),
        prefix + "LayerNorm.weight": rng.standard_normal(D).astype(dtype),
        prefix + "LayerNorm.bias": rng.standard_normal(D).astype(dtype),
        # Entries a whole-model checkpoint also holds, to be ignored:
        prefix + "position_ids": np.arange(P, dtype=np.int64)[None],
        "encoder.layer.0.attention.self.query.weight": rng.standard_normal((D, D)).astype(dtype),
        "pooler.dense.bias": np.zeros(D, dtype),
    }
    return state


def _save(state, path):
    try:
        from numbapos.io import save_state
    except ImportError:  # pragma: no cover - numbapos.io ships with this version
        from safetensors.numpy import save_file as save_state
    save_state(state, path)


def _load(path):
    try:
        from numbapos.io import load_state
    except ImportError:  # pragma: no cover
        from safetensors.numpy import load_file as load_state
    return load_state(path)


def test_bert_from_safetensors_checkpoint(rng, tmp_path):
    pytest.importorskip("safetensors")
    state = _hf_bert_state(rng)
    path = tmp_path / "model.safetensors"
    _save(state, str(path))
    block = nn.BertEmbeddings.from_hf_state_dict(_load(str(path)), pad_token_id=1)
    assert (block.vocab_size, block.hidden_size, block.max_position_embeddings,
            block.type_vocab_size) == (V, D, P, TV)
    assert block.LayerNorm.eps == 1e-12 and block.word_embeddings.padding_idx == 1
    for name, param in block.named_parameters():
        np.testing.assert_array_equal(param.data, state["embeddings." + name])
        assert param.data.flags.owndata and param.dtype == np.float32
    ids = rng.integers(0, V, (2, 4))
    block.eval()
    np.testing.assert_allclose(block(ids), _bert_reference(block, ids, training=False),
                               rtol=2e-5, atol=2e-5)
    # The block's own state dict carries the Hugging Face names, so it round-trips.
    again = tmp_path / "again.safetensors"
    _save(block.state_dict(), str(again))
    reloaded = nn.BertEmbeddings.from_hf_state_dict(_load(str(again)), prefix="")
    for (name, param), (_, other) in zip(block.named_parameters(), reloaded.named_parameters(),
                                         strict=True):
        np.testing.assert_array_equal(param.data, other.data, err_msg=name)


def test_bert_from_hf_state_dict_variants(rng):
    state = _hf_bert_state(rng, np.float16, prefix="bert.embeddings.")
    block = nn.BertEmbeddings.from_hf_state_dict(state, "bert.embeddings.",
                                                 hidden_dropout_prob=0.0, layer_norm_eps=1e-5)
    assert block.word_embeddings.weight.dtype == np.float32  # float16 is widened
    assert block.dropout.p == 0.0 and block.LayerNorm.eps == 1e-5
    np.testing.assert_array_equal(block.LayerNorm.bias.data,
                                  state["bert.embeddings.LayerNorm.bias"].astype(np.float32))
    # TensorFlow-era names for the LayerNorm parameters.
    old = _hf_bert_state(rng, np.float64)
    old["embeddings.LayerNorm.gamma"] = old.pop("embeddings.LayerNorm.weight")
    old["embeddings.LayerNorm.beta"] = old.pop("embeddings.LayerNorm.bias")
    block = nn.BertEmbeddings.from_hf_state_dict(old)
    assert block.LayerNorm.weight.dtype == np.float64
    np.testing.assert_array_equal(block.LayerNorm.weight.data, old["embeddings.LayerNorm.gamma"])


def test_bert_from_hf_state_dict_errors(rng):
    state = _hf_bert_state(rng)
    missing = dict(state)
    del missing["embeddings.token_type_embeddings.weight"]
    with pytest.raises(KeyError, match="missing 'embeddings.token_type_embeddings.weight'"):
        nn.BertEmbeddings.from_hf_state_dict(missing)
    with pytest.raises(KeyError, match="pass prefix='embeddings.'"):
        nn.BertEmbeddings.from_hf_state_dict(state, prefix="bert.embeddings.")
    bad = dict(state, **{"embeddings.position_embeddings.weight": np.zeros((P, D + 1),
                                                                           np.float32)})
    with pytest.raises(ValueError, match=r"position_embeddings.weight'\]: expected shape "
                                         r"\(\?, 6\), got \(10, 7\)"):
        nn.BertEmbeddings.from_hf_state_dict(bad)
    bad = dict(state, **{"embeddings.LayerNorm.bias": np.zeros((1, D), np.float32)})
    with pytest.raises(ValueError, match=r"LayerNorm.bias'\]: expected shape \(6,\)"):
        nn.BertEmbeddings.from_hf_state_dict(bad)
    bad = dict(state, **{"embeddings.LayerNorm.bias": np.zeros(D)})
    with pytest.raises(ValueError, match="mismatched dtypes"):
        nn.BertEmbeddings.from_hf_state_dict(bad)
    bad = dict(state, **{"embeddings.word_embeddings.weight": np.zeros((V, D), np.int32)})
    with pytest.raises(ValueError, match="expected a bfloat16, float16, float32 or float64 "
                                         "array, got dtype int32"):
        nn.BertEmbeddings.from_hf_state_dict(bad)
    bad = dict(state, **{"embeddings.LayerNorm.weight": [1.0] * D})
    with pytest.raises(TypeError,
                       match=r"LayerNorm.weight'\]: expected a NumPy or CUDA array.*got list"):
        nn.BertEmbeddings.from_hf_state_dict(bad)
    with pytest.raises(TypeError, match="state_dict: expected a mapping"):
        nn.BertEmbeddings.from_hf_state_dict([("a", 1)])
    with pytest.raises(ValueError, match="pad_token_id: 12 is outside"):
        nn.BertEmbeddings.from_hf_state_dict(state, pad_token_id=V)


# ================================================================== GPT-2


def _gpt2(dtype=np.float64, p=0.0, seed=0, device="cpu"):
    return nn.GPT2Embeddings(V, P, D, embd_pdrop=p, seed=seed, dtype=dtype, device=device)


def _gpt2_reference(block, ids, counter=0, training=True, **kwargs):
    return reference.gpt2_embeddings(ids, host(block.wte.weight.data), host(block.wpe.weight.data),
                                     p=block.drop.p if training else 0.0, seed=block.drop.seed,
                                     counter=counter, **kwargs)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("p", [0.0, 0.5])
def test_gpt2_forward_matches_reference(rng, device, dtype, p):
    block = _gpt2(dtype, p, device=device)
    ids = rng.integers(0, V, (3, 4))
    y = block(on(device, ids), past_length=2)
    _assert_on(device, y)
    assert y.shape == (3, 4, D) and y.dtype == dtype
    np.testing.assert_allclose(host(y), _gpt2_reference(block, ids, past_length=2),
                               *_tol(dtype))
    pos = rng.integers(0, P, (3, 4))
    np.testing.assert_allclose(host(block(on(device, ids), position_ids=on(device, pos))),
                               _gpt2_reference(block, ids, counter=1 if p else 0,
                                               position_ids=pos), *_tol(dtype))
    ids1 = rng.integers(0, V, 5)
    block.eval()
    np.testing.assert_allclose(host(block(ids1)), _gpt2_reference(block, ids1, training=False),
                               *_tol(dtype))


def test_gpt2_default_positions_follow_each_call_shape(rng):
    # The full path (out= given) reuses the latest default positions while the
    # shape and past_length repeat, and builds new ones when either changes.
    block = _gpt2(np.float32, 0.0)
    wte, wpe = block.wte.weight.data, block.wpe.weight.data
    for shape, past in [((2, 5), 0), ((2, 5), 0), ((3, 5), 0), ((2, 5), 1), ((5,), 0),
                        ((2, 4), 0), ((2, 5), 0)]:
        ids = rng.integers(0, V, shape)
        out = np.empty(shape + (D,), np.float32)
        got = F.gpt2_embeddings(ids, wte, wpe, past_length=past, out=out, training=False)
        np.testing.assert_array_equal(got, wte[ids] + wpe[past + np.arange(shape[-1])])


def test_gpt2_fused_dropout_equals_functional_dropout(rng, device):
    # A gather, one add and the mask: bit-identical to the CPU's functional dropout.
    block = _gpt2(np.float32, 0.3, device=device)
    ids = rng.integers(0, V, (2, 5))
    fused = host(block(on(device, ids)))
    total = host(block.wte.weight.data)[ids] + host(block.wpe.weight.data)[np.arange(5)]
    np.testing.assert_array_equal(fused, F.dropout(total, 0.3, block.drop.seed, counter=0))
    assert block.drop.counter == 1


def test_gpt2_attention_mask_positions(rng, device):
    block = _gpt2(device=device)
    block.eval()
    real = rng.integers(1, V, 3)
    # The same three tokens, left-padded in row 0 and right-padded in row 1.
    ids = np.array([[0, 0, *real], [*real, 0, 0]])
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    y = host(block(on(device, ids), attention_mask=on(device, mask)))
    np.testing.assert_allclose(y[0, 2:], y[1, :3], rtol=1e-12)
    np.testing.assert_allclose(y, _gpt2_reference(block, ids, attention_mask=mask), rtol=1e-12)
    # With a cache: the mask covers past + current tokens, positions continue from it.
    mask = np.array([[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    step = block(ids[:, :2], past_length=3, attention_mask=mask)
    np.testing.assert_allclose(host(step),
                               _gpt2_reference(block, ids[:, :2], attention_mask=mask),
                               rtol=1e-12)
    expected = np.array([[2, 3], [3, 1]])
    np.testing.assert_array_equal(host(F.positions_from_attention_mask(on(device, mask), 2)),
                                  expected)
    np.testing.assert_array_equal(host(F.positions_from_attention_mask(
        on(device, mask.astype(bool)), 2)), reference.hf_positions_from_attention_mask(mask, 2))
    np.testing.assert_array_equal(F.positions_from_attention_mask([1, 1, 0]), [0, 1, 1])
    # transformers 5.x fills padding with 0 instead of 1; real tokens are unchanged.
    np.testing.assert_array_equal(
        host(F.positions_from_attention_mask(on(device, mask), 2, pad_position=0)),
        [[2, 3], [3, 0]])
    # Explicit position_ids take precedence over the mask.
    pos = np.array([[5, 6], [7, 8]])
    np.testing.assert_allclose(host(block(on(device, ids[:, :2]), past_length=3,
                                          attention_mask=on(device, mask),
                                          position_ids=on(device, pos))),
                               _gpt2_reference(block, ids[:, :2], position_ids=pos), rtol=1e-12)


def test_positions_from_attention_mask_stay_on_the_device(device):
    # Every public op returns its result on its input's device.
    mask = on(device, np.array([[0, 1, 1], [1, 1, 0]]))
    got = F.positions_from_attention_mask(mask, 2)
    np.testing.assert_array_equal(host(got), [[0, 1], [1, 1]])
    _assert_on(device, got)


@pytest.mark.parametrize("use_mask", [False, True])
def test_gpt2_gradients_match_finite_differences(rng, device, use_mask):
    block = _gpt2(np.float64, p=0.4, seed=3, device=device)
    twin = block if device == "cpu" else _gpt2(np.float64, p=0.4, seed=3)
    ids = np.array([[1, 1, 4], [2, 9, 1]])
    mask = np.array([[1, 1, 1, 1], [0, 1, 1, 1]]) if use_mask else None
    probe = rng.standard_normal((2, 3, D))

    def loss():
        with numbapos.no_grad():  # evaluations only, no backward
            twin.drop.counter = 0
            return float((twin(ids, past_length=1, attention_mask=mask) * probe).sum())

    block.drop.counter = 0
    block(on(device, ids), past_length=1, attention_mask=on(device, mask))
    block.backward(on(device, probe))
    _check_finite_differences(block, twin, loss)


def test_gpt2_functional_backward_and_frozen(rng, device):
    block = _gpt2(np.float32, 0.25, device=device)
    ids = on(device, rng.integers(0, V, (2, 4)))
    probe = on(device, rng.standard_normal((2, 4, D)).astype(np.float32))
    y = F.gpt2_embeddings(ids, block.wte.weight.data, block.wpe.weight.data, p=0.25,
                          seed=block.drop.seed)
    _assert_on(device, y)
    np.testing.assert_array_equal(host(block(ids)), host(y))
    grads = F.gpt2_embeddings_backward(probe, ids, V, P, p=0.25, seed=block.drop.seed)
    block.backward(probe)
    _assert_on(device, *grads)
    np.testing.assert_array_equal(host(grads.wte), host(block.wte.weight.grad))
    np.testing.assert_array_equal(host(grads.wpe), host(block.wpe.weight.grad))
    sparse = F.gpt2_embeddings_backward(probe, ids, V, P, p=0.25, seed=block.drop.seed,
                                        sparse=True)
    _assert_on(device, sparse.wte.indices, sparse.wte.values)
    np.testing.assert_array_equal(host(sparse.wte.to_dense()), host(grads.wte))
    block.zero_grad()
    block.wte.weight.requires_grad = False
    block(ids)
    block.backward(probe)
    assert block.wte.weight.grad is None and block.wpe.weight.grad is not None


def test_gpt2_deterministic_for_any_thread_count(rng):
    ids = rng.integers(0, 40, (4, 64))
    probe = rng.standard_normal((4, 64, 128)).astype(np.float32)
    results = []
    before = numba.get_num_threads()
    try:
        for threads in (1, _threads()):
            numba.set_num_threads(threads)
            block = nn.GPT2Embeddings(40, 64, 128, embd_pdrop=0.1, seed=5)
            y = block(ids)
            block.backward(probe)
            results.append([y, block.wte.weight.grad, block.wpe.weight.grad])
    finally:
        numba.set_num_threads(before)
    for first, second in zip(*results, strict=True):
        np.testing.assert_array_equal(first, second)


def test_gpt2_names_and_init(device):
    block = nn.GPT2Embeddings(30, 16, 8, seed=0, device=device)
    assert block.device == device
    assert [name for name, _ in block.named_parameters()] == ["wte.weight", "wpe.weight"]
    assert block.drop.p == 0.1 and isinstance(block.drop, nn.Dropout)
    assert 0.01 < host(block.wte.weight.data).std() < 0.03
    assert (block.vocab_size, block.n_positions, block.n_embd) == (30, 16, 8)


def test_gpt2_errors(rng, device):
    block = _gpt2(np.float32, p=0.5, device=device)
    ids = on(device, rng.integers(0, V, (2, 3)))
    with deferred_raises(device, IndexError, rf"input_ids: index {V} .*vocab_size={V}"):
        block(on(device, np.array([V])))
    with deferred_raises(device, IndexError, rf"position_ids: index {P} .*n_positions={P}"):
        block(ids, position_ids=on(device, np.array([0, 1, P])))
    with pytest.raises(ValueError, match=rf"past_length \+ L = 8 \+ 3 = 11 exceeds "
                                         rf"n_positions={P}"):
        block(ids, past_length=8)
    with pytest.raises(ValueError, match=r"attention_mask: expected shape \(2, 5\) .*past_length "
                                         r"\+ L = 2 \+ 3 columns\), got \(2, 3\)"):
        block(ids, past_length=2, attention_mask=on(device, np.ones((2, 3), np.int64)))
    with deferred_raises(device, ValueError, "attention_mask: expected only 0 and 1, got 2",
                         deferred=True):
        block(ids, attention_mask=on(device, np.array([[1, 1, 2], [1, 1, 1]])))
    with pytest.raises(TypeError, match="attention_mask: expected a bool or integer mask"):
        block(ids, attention_mask=on(device, np.ones((2, 3))))
    with deferred_raises(device, ValueError, rf"attention_mask: gives position 10( .*)?, but "
                         rf"n_positions={P}", deferred=True):
        block(ids, past_length=8, attention_mask=on(device, np.ones((2, 11), np.int64)))
    # Deferred calls ran on CUDA (their dropout draws count): two bad ids, two bad masks.
    queued = 4 if device == "cuda" else 0
    with pytest.raises(ValueError, match="attention_mask: expected a 1-D or 2-D mask"):
        F.positions_from_attention_mask(on(device, np.ones((1, 2, 3), np.int64)))
    with pytest.raises(ValueError, match="attention_mask: has 3 columns, fewer than the 4"):
        F.positions_from_attention_mask(on(device, np.ones(3, np.int64)), 4)
    with pytest.raises(ValueError, match="pad_position: expected an integer >= 0, got -1"):
        F.positions_from_attention_mask(on(device, np.ones(3, np.int64)), pad_position=-1)
    with pytest.raises(ValueError, match="pad_position: expected an integer <="):
        F.positions_from_attention_mask(on(device, np.ones(3, np.int64)), pad_position=2**63)
    assert block.drop.counter == queued
    assert block.pending_backwards() == queued
    if device == "cuda":  # the queued calls were recorded: their backward finds the ids again
        # (last in, first out: the two masks' positions are computed again, and fail again)
        with deferred_raises(device, ValueError, r"attention_mask: gives position 10",
                             within=True, deferred=True):
            block.backward(on(device, np.zeros((2, 3, D), np.float32)))
        with deferred_raises(device, ValueError, r"attention_mask: expected only 0 and 1",
                             within=True, deferred=True):
            block.backward(on(device, np.zeros((2, 3, D), np.float32)))
        with deferred_raises(device, IndexError, rf"position_ids: index {P} .*n_positions",
                             within=True):
            block.backward(on(device, np.zeros((2, 3, D), np.float32)))
        with deferred_raises(device, IndexError, rf"input_ids: index {V} .*vocab_size",
                             within=True):
            block.backward(on(device, np.zeros((1, D), np.float32)))
        block.zero_grad()
    with pytest.raises(RuntimeError, match="before forward"):
        block.backward(on(device, np.zeros((2, 3, D), np.float32)))
    block(ids)
    with pytest.raises(ValueError, match=r"grad_output: expected shape \(2, 3, 6\)"):
        block.backward(on(device, np.zeros((3, 3, D), np.float32)))
    with pytest.raises(TypeError, match="grad_output: expected dtype float32"):
        block.backward(on(device, np.zeros((2, 3, D))))
    with pytest.raises(ValueError, match=r"embd_pdrop: expected a probability"):
        nn.GPT2Embeddings(10, 4, 4, embd_pdrop=-0.1, device=device)
    with pytest.raises(ValueError, match=r"grad_output: expected shape input_ids.shape"):
        F.gpt2_embeddings_backward(on(device, np.zeros((2, 4, D))), ids, V, P)
    with pytest.raises(TypeError, match="wpe: expected dtype float32"):
        F.gpt2_embeddings(ids, on(device, np.zeros((V, D), np.float32)),
                          on(device, np.zeros((P, D))))
    assert block.wte.weight.grad is None


def test_gpt2_from_hf_state_dict(rng, tmp_path):
    pytest.importorskip("safetensors")
    wte = rng.standard_normal((V, D)).astype(np.float32)
    wpe = rng.standard_normal((P, D)).astype(np.float32)
    path = tmp_path / "gpt2.safetensors"
    _save({"wte.weight": wte, "wpe.weight": wpe, "h.0.ln_1.weight": np.ones(D, np.float32)},
          str(path))
    block = nn.GPT2Embeddings.from_hf_state_dict(_load(str(path)), embd_pdrop=0.0)
    assert (block.vocab_size, block.n_positions, block.n_embd) == (V, P, D)
    np.testing.assert_array_equal(block.wte.weight.data, wte)
    ids = rng.integers(0, V, (2, 3))
    np.testing.assert_allclose(block(ids), wte[ids] + wpe[np.arange(3)], rtol=1e-6)
    lm = {"transformer.wte.weight": wte.astype(np.float16), "transformer.wpe.weight": wpe,
          "lm_head.weight": wte}
    with pytest.raises(KeyError, match="missing 'wte.weight'.*pass prefix='transformer.'"):
        nn.GPT2Embeddings.from_hf_state_dict(lm)
    block = nn.GPT2Embeddings.from_hf_state_dict(lm, prefix="transformer.")
    assert block.wte.weight.dtype == np.float32
    with pytest.raises(ValueError, match=r"wpe.weight'\]: expected shape \(\?, 6\), got \(10, 5\)"):
        nn.GPT2Embeddings.from_hf_state_dict({"wte.weight": wte, "wpe.weight": wpe[:, :5]})
    with pytest.raises(ValueError, match=r"wte.weight'\]: expected shape \(\?, \?\), got \(12,\)"):
        nn.GPT2Embeddings.from_hf_state_dict({"wte.weight": wte[:, 0], "wpe.weight": wpe})


# ================================================================== one-launch position gradients


def _signed_zeros(rng, shape):
    """A float32 gradient with -0.0 and +0.0 terms: a sum that starts from zeros, not from
    its first term, turns -0.0 into +0.0 (the scatter starts from the first term)."""
    grad = rng.standard_normal(shape).astype(np.float32)
    grad.reshape(-1)[::3] = -0.0
    grad.reshape(-1)[1::7] = 0.0
    return grad


@pytest.mark.parametrize("shape", [(3, 4), (4,), (1, 5), (0, 3)])
def test_default_position_gradients_equal_the_scatter(rng, device, shape):
    """The one-launch position gradient (default positions) has the bits of the scatter of
    the same positions given explicitly, for both blocks, past_length shifting them."""
    word, pos, tt = (on(device, rng.standard_normal((rows, D)).astype(np.float32))
                     for rows in (V, P, TV))
    ids = on(device, rng.integers(0, V, shape))
    grad = on(device, _signed_zeros(rng, shape + (D,)))
    past = 2
    explicit = on(device, np.broadcast_to(past + np.arange(shape[-1]), shape).copy())
    _, mean, rstd = F.bert_embeddings_forward(ids, word, pos, tt, past_length=past)
    fused = F.bert_embeddings_backward(grad, ids, word, pos, tt, mean, rstd, past_length=past,
                                       p=0.3, seed=4)
    scattered = F.bert_embeddings_backward(grad, ids, word, pos, tt, mean, rstd,
                                           position_ids=explicit, p=0.3, seed=4)
    assert fused.ln_weight is None and scattered.ln_weight is None
    for a, b in zip(fused[:3], scattered[:3], strict=True):
        np.testing.assert_array_equal(host(a).view(np.uint32), host(b).view(np.uint32))
    fused = F.gpt2_embeddings_backward(grad, ids, V, P, past_length=past, p=0.3, seed=4)
    scattered = F.gpt2_embeddings_backward(grad, ids, V, P, position_ids=explicit, p=0.3,
                                           seed=4)
    np.testing.assert_array_equal(host(fused.wpe).view(np.uint32),
                                  host(scattered.wpe).view(np.uint32))
    want = np.zeros((P, D), np.float32)
    masked = reference.dropout(host(grad), 0.3, 4).reshape(-1, shape[-1], D)
    want[past:past + shape[-1]] = masked.sum(axis=0)
    np.testing.assert_allclose(host(fused.wpe), want, rtol=1e-6, atol=1e-6)
    assert np.signbit(host(fused.wpe)[past + shape[-1]:]).sum() == 0  # unused rows: +0.0


@pytest.mark.parametrize("kernels", ["cpu", "cuda"])
def test_position_grad_launcher(rng, kernels):
    """Both backends' position_grad: every row written (the output starts as garbage), the
    used rows the batch sums in order, the others +0.0."""
    if kernels == "cuda" and not numbapos.cuda_available():
        pytest.skip("CUDA is not available (no GPU and the simulator is off)")
    K = _device.kernels_for(kernels)
    grad = _signed_zeros(rng, (3 * 4, D))
    out = K.asarray(np.full((P, D), np.nan, np.float32)) if kernels == "cuda" \
        else np.full((P, D), np.nan, np.float32)
    K.position_grad(K.asarray(grad) if kernels == "cuda" else grad, 5, 4, out)
    got = host(out)
    want = np.zeros((P, D), np.float32)
    rows = grad.reshape(3, 4, D)
    want[5:9] = (rows[0] + rows[1]) + rows[2]
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_bert_small_gradients_share_one_allocation(rng, device):
    """LayerNorm weight / bias, token-type and (default positions) position gradients are
    views of one block; mean and rstd too. Writing one never changes another."""
    word, pos, tt = (on(device, rng.standard_normal((rows, D)).astype(np.float32))
                     for rows in (V, P, TV))
    gamma = on(device, np.ones(D, np.float32))
    ids = on(device, rng.integers(0, V, (2, 3)))
    y, mean, rstd = F.bert_embeddings_forward(ids, word, pos, tt, gamma, None)
    before = host(mean).copy()
    rstd[:] = 0 if device == "cpu" else on(device, np.zeros((2, 3), np.float32))
    np.testing.assert_array_equal(host(mean), before)
    grads = F.bert_embeddings_backward(y, ids, word, pos, tt, mean, rstd, gamma, None)
    assert [g.shape for g in grads[1:]] == [(P, D), (TV, D), (D,), (D,)]
    if device == "cpu":
        assert all(g.base is not None and g.base is grads[1].base for g in grads[1:])


def test_bert_backward_checks_word_ids_without_a_check_launch(rng, device):
    """Default token types and positions: the backward kernel checks the word ids. The
    error is the CPU's (raised at the call there, deferred on the GPU): the first bad
    position of input_ids, nothing written to the tables."""
    word, pos, tt = (on(device, rng.standard_normal((rows, D)).astype(np.float32))
                     for rows in (V, P, TV))
    ids_host = rng.integers(0, V, (2, 3))
    y, mean, rstd = F.bert_embeddings_forward(on(device, ids_host), word, pos, tt)
    numbapos.synchronize()
    ids_host[1, 2] = V + 5
    ids_host[0, 2] = -1
    match = r"input_ids: index -1 \(at flat position 2\) is out of range for vocab_size=12"
    with deferred_raises(device, IndexError, match):
        F.bert_embeddings_backward(y, on(device, ids_host), word, pos, tt, mean, rstd)
    ids_host[0, 2] = 0
    ids_host[1, 2] = 1
    types = on(device, np.full((2, 3), TV, np.int64))
    with deferred_raises(device, IndexError, r"token_type_ids: index 3 \(at flat position 0\)"):
        F.bert_embeddings_backward(y, on(device, ids_host), word, pos, tt, mean, rstd,
                                   token_type_ids=types)
