"""BertEmbeddings / GPT2Embeddings with bfloat16 / float16 tables.

The fused kernels read 16-bit rows as their bits and widen them exactly, so a
16-bit block equals, bit for bit, the float32 block run on the widened tables:
forward, statistics and every gradient (CPU and CUDA, the simulator without a
GPU). Also: Module.to / .half() /
.bfloat16() on the blocks, the optimisers training their 16-bit tables, and
bfloat16 checkpoints loaded at half the memory.
"""

import numpy as np
import pytest
from conftest import device_cases, host, on

import numbapos
from numbapos import functional as F
from numbapos import io, nn
from numbapos.sparse import SparseRows

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)

V, D, P, TV = 12, 6, 10, 3  # vocab, hidden, positions, token types

# The simulator evaluates the uint64 dropout hash on NumPy scalars, which warn on wrap-around.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


def _bits(x):
    """The float32 bits of an array (or of a SparseRows gradient's dense form) on the host."""
    if isinstance(x, SparseRows):
        x = x.to_dense()
    return host(x).view(np.uint32)


def _copy_widened(half, wide):
    """``wide``'s parameters := ``half``'s, widened to float32 (exactly)."""
    params = dict(wide.named_parameters())
    for name, param in half.named_parameters():
        params[name].data[...] = host(param.data).astype(np.float32)


def _bert_pair(dtype, p=0.3, sparse=False, seed=0):
    """A 16-bit block and its float32 twin on the widened tables (same dropout stream)."""
    def make(table_dtype):
        block = nn.BertEmbeddings(V, D, P, TV, layer_norm_eps=1e-3, hidden_dropout_prob=p,
                                  seed=seed, dtype=table_dtype)
        block.word_embeddings.sparse = sparse
        return block

    half, wide = make(dtype), make(np.float32)
    rng = np.random.default_rng(seed + 100)
    half.LayerNorm.weight.data[:] = rng.standard_normal(D) + 1.0
    half.LayerNorm.bias.data[:] = rng.standard_normal(D)
    _copy_widened(half, wide)
    wide.dropout.seed = half.dropout.seed
    return half, wide


def _gpt2_pair(dtype, p=0.3, seed=0):
    half = nn.GPT2Embeddings(V, P, D, embd_pdrop=p, seed=seed, dtype=dtype)
    wide = nn.GPT2Embeddings(V, P, D, embd_pdrop=p, seed=seed)
    _copy_widened(half, wide)
    wide.drop.seed = half.drop.seed
    return half, wide


# ------------------------------------------------------------------ bit for bit


@pytest.mark.parametrize(("device", "dtype", "sparse"),
                         device_cases([(BF16, True), (F16, False)], [(F16, True), (BF16, True)]),
                         indirect=["device"])
def test_bert_16_bit_tables_equal_the_float32_block_on_the_widened_tables(rng, device, dtype,
                                                                          sparse):
    half, wide = _bert_pair(dtype, sparse=sparse)
    assert half.word_embeddings.weight.dtype == dtype
    assert half.word_embeddings.weight.data.nbytes * 2 == wide.word_embeddings.weight.data.nbytes
    assert half.LayerNorm.weight.dtype == np.float32
    half.to(device)
    wide.to(device)
    shape = (2, 5) if device == "cpu" else (2, 2)
    ids = rng.integers(0, V, shape)
    types = rng.integers(0, TV, shape)
    y = half(on(device, ids), token_type_ids=on(device, types), past_length=1)
    expected = wide(on(device, ids), token_type_ids=on(device, types), past_length=1)
    assert y.dtype == np.float32 and half.dropout.counter == 1
    np.testing.assert_array_equal(_bits(y), _bits(expected))
    probe = rng.standard_normal(y.shape).astype(np.float32)
    half.backward(on(device, probe))
    wide.backward(on(device, probe))
    for (name, param), (_, twin) in zip(half.named_parameters(), wide.named_parameters(),
                                        strict=True):
        assert param.grad.dtype == np.float32, name
        assert isinstance(param.grad, SparseRows) == (sparse and name.startswith("word")), name
        np.testing.assert_array_equal(_bits(param.grad), _bits(twin.grad), err_msg=name)


@pytest.mark.parametrize(("device", "dtype"), device_cases([(BF16,), (F16,)], [(F16,), (BF16,)]),
                         indirect=["device"])
def test_gpt2_16_bit_tables_equal_the_float32_block_on_the_widened_tables(rng, device, dtype):
    half, wide = _gpt2_pair(dtype)
    half.to(device)
    wide.to(device)
    shape = (2, 4) if device == "cpu" else (2, 2)
    ids = rng.integers(0, V, shape)
    positions = rng.integers(0, P, shape)
    for kwargs in (dict(past_length=3), dict(position_ids=on(device, positions))):
        y = half(on(device, ids), **kwargs)
        expected = wide(on(device, ids), **kwargs)
        assert y.dtype == np.float32
        np.testing.assert_array_equal(_bits(y), _bits(expected))
        probe = rng.standard_normal(y.shape).astype(np.float32)
        half.backward(on(device, probe))
        wide.backward(on(device, probe))
    for name in ("wte.weight", "wpe.weight"):
        grad = dict(half.named_parameters())[name].grad
        assert grad.dtype == np.float32
        np.testing.assert_array_equal(_bits(grad), _bits(dict(wide.named_parameters())[name].grad))


def test_gpt2_small_generation_path_reads_16_bit_tables(rng):
    # One token at a time (the no-dropout fast path), then an id out of range.
    half, wide = _gpt2_pair(BF16, p=0.0)
    for step in range(3):
        token = rng.integers(0, V, (1, 1))
        np.testing.assert_array_equal(_bits(half(token, past_length=step)),
                                      _bits(wide(token, past_length=step)))
    with numbapos.no_grad(), pytest.raises(IndexError, match="input_ids"):
        F.gpt2_embeddings(np.array([[V]]), half.wte.weight.data, half.wpe.weight.data)


def test_max_norm_clips_16_bit_rows_before_the_sum(rng):
    half, wide = _bert_pair(BF16, p=0.0)
    half.word_embeddings.max_norm = 0.03  # rows of N(0, 0.02^2) in 6 columns: ~0.05
    ids = rng.integers(1, V, (2, 4))
    y = half(ids)
    clipped = half.word_embeddings.weight.data.astype(np.float32)
    norms = np.linalg.norm(clipped[np.unique(ids)], axis=1)
    assert norms.max() <= 0.03 * (1 + 2 ** -7)  # rounded to nearest bfloat16
    assert not np.array_equal(clipped, wide.word_embeddings.weight.data)
    wide.word_embeddings.weight.data[...] = clipped
    np.testing.assert_array_equal(_bits(y), _bits(wide(ids)))


def test_functional_ops_take_16_bit_tables_with_float32_layer_norm(rng):
    half, _ = _bert_pair(F16, p=0.0)
    word, pos, types, gamma, beta = (p.data for p in half.parameters())
    ids = rng.integers(0, V, (2, 3))
    y, mean, rstd = F.bert_embeddings_forward(ids, word, pos, types, gamma, beta)
    assert y.dtype == mean.dtype == rstd.dtype == np.float32
    grads = F.bert_embeddings_backward(np.ones_like(y), ids, word, pos, types, mean, rstd, gamma,
                                       beta)
    assert all(g.dtype == np.float32 for g in grads)
    with pytest.raises(TypeError, match="ln_weight: expected dtype float32 or float64, got "
                                        "float16"):
        F.bert_embeddings(ids, word, pos, types, gamma.astype(F16))
    with pytest.raises(TypeError, match=r"ln_bias: expected dtype float32 \(float32, the "
                                        r"arithmetic of float16 tables\), got float64"):
        F.bert_embeddings(ids, word, pos, types, gamma, beta.astype(np.float64))
    with pytest.raises(TypeError, match="position_embeddings: expected dtype float16"):
        F.bert_embeddings(ids, word, pos.astype(np.float32), types)
    strided = np.repeat(word, 2, axis=1)[:, ::2]  # the same values, not contiguous
    np.testing.assert_array_equal(F.bert_embeddings(ids, strided, pos, types, gamma, beta), y)
    clip = (F.TableOptions(max_norm=1.0), F.TableOptions(), F.TableOptions())
    with pytest.raises(ValueError, match="word_embeddings: max_norm clips rows in place and "
                                         "needs a C-contiguous 16-bit table"):
        F.bert_embeddings(ids, strided, pos, types, table_options=clip)
    with pytest.raises(TypeError, match="grad_output: expected dtype float32"):
        F.bert_embeddings_backward(np.ones(y.shape, np.float64), ids, word, pos, types, mean,
                                   rstd)


# ------------------------------------------------------------------ Module.to


def test_to_16_bit_converts_the_tables_and_leaves_the_layer_norm():
    block = nn.BertEmbeddings(V, D, P, TV, seed=0)
    tables = {name: p.data.copy() for name, p in block.named_parameters()}
    assert block.to("bfloat16") is block
    for name, param in block.named_parameters():
        if name.startswith("LayerNorm"):
            assert param.dtype == np.float32
            np.testing.assert_array_equal(param.data, tables[name])
        else:
            assert param.dtype == BF16
            np.testing.assert_array_equal(param.data.view(np.uint16),
                                          tables[name].astype(BF16).view(np.uint16))
    block(np.array([[1, 2]]))  # runs
    block.float()
    assert block.word_embeddings.weight.dtype == np.float32
    assert nn.BertEmbeddings(V, D, P, TV).half().position_embeddings.weight.dtype == F16
    gpt2 = nn.GPT2Embeddings(V, P, D, dtype=np.float64).bfloat16()  # no LayerNorm: allowed
    assert gpt2.wte.weight.dtype == gpt2.wpe.weight.dtype == BF16
    assert gpt2(np.array([1, 2])).dtype == np.float32
    wide = nn.BertEmbeddings(V, D, P, TV, dtype=np.float64)
    with pytest.raises(TypeError, match=r"BertEmbeddings computes in float32 beside bfloat16 "
                                        r"tables, but its LayerNorm.weight is float64"):
        wide.to("bfloat16")
    assert wide.word_embeddings.weight.dtype == np.float64  # nothing changed


def test_bfloat16_blocks_move_to_cuda():
    if not numbapos.cuda_available():
        pytest.skip("CUDA is not available (no GPU and the simulator is off)")
    bert = nn.BertEmbeddings(V, D, P, TV, dtype="bfloat16", device="cuda")
    assert bert.word_embeddings.weight.dtype == BF16 and bert.device == "cuda"
    gpt2 = nn.GPT2Embeddings(V, P, D, device="cuda").bfloat16()
    assert gpt2.wte.weight.dtype == BF16 and gpt2.wte.weight.device == "cuda"


@pytest.mark.parametrize("mode", ["copy", "linear"])
def test_resize_position_embeddings_of_a_16_bit_table(mode):
    # Resized in float32 (widened exactly), rounded back to nearest even.
    half = nn.GPT2Embeddings(V, P, D, seed=0, dtype=BF16)
    wide = nn.GPT2Embeddings(V, P, D, seed=0)
    _copy_widened(half, wide)
    opt = numbapos.optim.SGD(half.parameters(), lr=0.1, momentum=0.9)
    half(np.array([[1, 2]]))
    half.backward(np.ones((1, 2, D), np.float32))
    opt.step()
    old = half.wpe.weight.data.copy()
    half.resize_position_embeddings(2 * P, mode, optimizer=opt)
    wide.wpe.weight.data[...] = old.astype(np.float32)
    wide.resize_position_embeddings(2 * P, mode)
    table = half.wpe.weight.data
    assert table.dtype == BF16 and table.shape == (2 * P, D) and half.n_positions == 2 * P
    np.testing.assert_array_equal(table.view(np.uint16),
                                  wide.wpe.weight.data.astype(BF16).view(np.uint16))
    if mode == "copy":
        np.testing.assert_array_equal(table[:P].view(np.uint16), old.view(np.uint16))
    assert half(np.array([[3, 4]]), past_length=P + 2).dtype == np.float32
    opt.step()  # the momentum was resized with the table


# ------------------------------------------------------------------ training


@pytest.mark.parametrize("make", [
    lambda params: numbapos.optim.SGD(params, lr=0.5, momentum=0.9, seed=3),
    lambda params: numbapos.optim.Adam(params, lr=0.05, seed=3),
], ids=["sgd", "adam"])
def test_optimisers_train_the_16_bit_tables(rng, make):
    def train():
        block, _ = _bert_pair(BF16, p=0.1, sparse=True)
        start = block.word_embeddings.weight.data.copy()
        opt = make(block.parameters())
        ids = np.array([[1, 4, 4, 7], [2, 4, 9, 0]])
        target = np.random.default_rng(5).standard_normal((2, 4, D)).astype(np.float32)
        losses = []
        for _ in range(4):
            diff = block(ids) - target
            losses.append(float((diff ** 2).mean()))
            block.backward(2 * diff / diff.size)
            opt.step()
            block.zero_grad()
        return block, start, losses, opt

    block, start, losses, opt = train()
    assert losses[-1] < losses[0]
    word = block.word_embeddings.weight.data
    assert word.dtype == BF16 and block.LayerNorm.weight.dtype == np.float32
    assert not np.array_equal(word.view(np.uint16), start.view(np.uint16))
    assert all(s.get("rounding_step") == 4 for s in opt.state_dict()["state"].values()
               if "rounding_step" in s) and any("rounding_step" in s
                                                for s in opt.state_dict()["state"].values())
    again = train()[0]  # deterministic, stochastic rounding included
    for (name, param), (_, other) in zip(block.named_parameters(), again.named_parameters(),
                                         strict=True):
        np.testing.assert_array_equal(param.data, other.data, err_msg=name)


# ------------------------------------------------------------------ checkpoints


def _hf_bert_state(rng, prefix="embeddings."):
    def rounded(shape):  # values a bfloat16 checkpoint holds
        return (0.1 * rng.standard_normal(shape)).astype(BF16)

    return {prefix + "word_embeddings.weight": rounded((V, D)),
            prefix + "position_embeddings.weight": rounded((P, D)),
            prefix + "token_type_embeddings.weight": rounded((TV, D)),
            prefix + "LayerNorm.weight": (1 + rounded((D,)).astype(np.float32)).astype(BF16),
            prefix + "LayerNorm.bias": rounded((D,)),
            prefix + "position_ids": np.arange(P)[None]}


def test_bfloat16_checkpoint_loads_at_half_the_memory(rng, tmp_path):
    pytest.importorskip("safetensors")
    path = str(tmp_path / "model.safetensors")
    state = _hf_bert_state(rng)
    io.save_state(state, path)
    half = nn.BertEmbeddings.from_hf_state_dict(io.load_state(path, keep_dtype=True),
                                                keep_dtype=True)
    wide = nn.BertEmbeddings.from_hf_state_dict(io.load_state(path))
    widened = nn.BertEmbeddings.from_hf_state_dict(state)  # bfloat16 arrays, widened
    tables = ("word_embeddings.weight", "position_embeddings.weight",
              "token_type_embeddings.weight")
    for (name, param), (_, other), (_, third) in zip(
            half.named_parameters(), wide.named_parameters(), widened.named_parameters(),
            strict=True):
        assert other.dtype == third.dtype == np.float32, name
        np.testing.assert_array_equal(third.data, other.data)
        np.testing.assert_array_equal(param.data.astype(np.float32), other.data)
        if name in tables:
            assert param.dtype == BF16 and param.data.nbytes * 2 == other.data.nbytes
            assert param.data.flags.owndata
        else:
            assert param.dtype == np.float32
    ids = rng.integers(0, V, (2, 4))
    half.eval()
    wide.eval()
    np.testing.assert_array_equal(_bits(half(ids)), _bits(wide(ids)))
    # state_dict / save_state keep the dtype; loading it back gives the same bits.
    assert half.state_dict()["word_embeddings.weight"].dtype == BF16
    again = str(tmp_path / "again.safetensors")
    io.save_state(half.state_dict(), again)
    reloaded = nn.BertEmbeddings.from_hf_state_dict(io.load_state(again, keep_dtype=True),
                                                    prefix="", keep_dtype=True)
    for (name, param), (_, other) in zip(half.named_parameters(), reloaded.named_parameters(),
                                         strict=True):
        assert param.dtype == other.dtype, name
        np.testing.assert_array_equal(param.data.view(np.uint8), other.data.view(np.uint8))
    gpt2 = nn.GPT2Embeddings.from_hf_state_dict(
        {"wte.weight": state["embeddings.word_embeddings.weight"],
         "wpe.weight": state["embeddings.position_embeddings.weight"]}, keep_dtype=True)
    assert gpt2.wte.weight.dtype == gpt2.wpe.weight.dtype == BF16


def test_16_bit_state_dict_dtype_rules(rng):
    state = _hf_bert_state(rng)
    # A float32 LayerNorm beside bfloat16 tables (a mixed-precision checkpoint) is taken.
    mixed = dict(state, **{"embeddings.LayerNorm.bias": np.zeros(D, np.float32)})
    block = nn.BertEmbeddings.from_hf_state_dict(mixed, keep_dtype=True)
    assert block.word_embeddings.weight.dtype == BF16
    assert block.LayerNorm.bias.dtype == np.float32
    # float16 tables are kept too; a float64 LayerNorm is not rounded silently.
    f16 = {k: (v.astype(F16) if v.dtype == BF16 else v) for k, v in state.items()}
    assert nn.BertEmbeddings.from_hf_state_dict(
        f16, keep_dtype=True).token_type_embeddings.weight.dtype == F16
    bad = dict(state, **{"embeddings.LayerNorm.bias": np.zeros(D)})
    with pytest.raises(ValueError, match="mismatched dtypes"):
        nn.BertEmbeddings.from_hf_state_dict(bad, keep_dtype=True)
    bad = dict(state, **{"embeddings.token_type_embeddings.weight": np.zeros((TV, D), F16)})
    with pytest.raises(ValueError, match="mismatched dtypes"):
        nn.BertEmbeddings.from_hf_state_dict(bad, keep_dtype=True)
