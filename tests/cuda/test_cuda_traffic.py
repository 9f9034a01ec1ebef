"""No host round trip inside a CUDA op, and index errors deferred (issue 19, items 1 and 2).

Counted on Numba's CUDA simulator (``tests/cuda_counts.py``) with device arrays
in and after one warm-up call (which makes the error word and compiles
nothing on the simulator, but may allocate): every op below, forward and
backward, makes no device-to-host copy and no synchronisation, and the
embedding lookup, the BERT forward and the GPT-2 forward are ONE launch each.

Then the error contract: a bad id in an op that reads ids raises the CPU's
``IndexError`` (same message start) at the next ``numbapos.synchronize()``,
not at the op; no table and no gradient was modified; and the next call works.
Kernels that write gradients or tables do nothing while an error is pending.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda_counts import count_cuda_traffic

import numbapos
import numbapos.functional as F
from numbapos import nn

pytestmark = [
    pytest.mark.skipif(not numbapos.cuda_available(), reason="needs CUDA or its simulator"),
    # The simulator evaluates the uint64 dropout hash on NumPy scalars, which warn on wrap.
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

V, P, TV, D = 11, 9, 3, 6
N, L = 2, 3


def _simulated() -> bool:
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def dev(a):
    from numba import cuda

    return cuda.to_device(np.ascontiguousarray(a))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(19)
    f32 = np.float32
    host = dict(
        ids=rng.integers(1, V, (N, L)),
        word=rng.standard_normal((V, D)).astype(f32),
        pos=rng.standard_normal((P, D)).astype(f32),
        types=rng.standard_normal((TV, D)).astype(f32),
        gamma=(1 + 0.5 * rng.standard_normal(D)).astype(f32),
        beta=rng.standard_normal(D).astype(f32),
        x=rng.standard_normal((N, L, D)).astype(f32),
        g=rng.standard_normal((N, L, D)).astype(f32),
        pids=np.array([4, 0, 2]),
        tids=np.array([[1, 0, 2], [2, 2, 0]]),
        frac=np.array([0.5, 3.0, 7.25]),
        past=np.array([1, 3]),
        freq=np.array([1.0, 0.1, 0.01]),  # R = 6 = D: every channel rotated
        slopes=np.array([0.5, 0.25], f32),
        rel_table=rng.standard_normal((8, 2)).astype(f32),
        scores=rng.standard_normal((N, 2, L, L)).astype(f32),
    )
    device = {name: dev(value) for name, value in host.items()}
    device["ids32"] = dev(host["ids"].astype(np.int32))
    device["pids32"] = dev(host["pids"].astype(np.int32))
    device["mean"], device["rstd"] = (dev(a) for a in F.bert_embeddings_forward(
        host["ids"], host["word"], host["pos"], host["types"], host["gamma"], host["beta"])[1:])
    device["ln_mean"], device["ln_rstd"] = (dev(a) for a in F.layer_norm_forward(
        host["x"], host["gamma"], host["beta"])[1:])
    device["packed"] = dev(F.quantize_rowwise(host["word"], 8))
    return device


def _bert_fwd(**kw):
    return lambda d: F.bert_embeddings_forward(d["ids"], d["word"], d["pos"], d["types"],
                                               d["gamma"], d["beta"], **kw)


def _bert_bwd(**kw):
    return lambda d: F.bert_embeddings_backward(d["g"], d["ids"], d["word"], d["pos"],
                                                d["types"], d["mean"], d["rstd"], d["gamma"],
                                                d["beta"], **kw)


# name -> (op on the device data, launches expected or None)
OPS = {
    "embedding": (lambda d: F.embedding(d["ids"], d["word"]), 1),
    "bert_forward": (_bert_fwd(), 1),
    "bert_forward_no_affine": (lambda d: F.bert_embeddings_forward(
        d["ids"], d["word"], d["pos"], d["types"]), 1),
    "bert_forward_types_positions": (lambda d: F.bert_embeddings_forward(
        d["ids"], d["word"], d["pos"], d["types"], d["gamma"], d["beta"],
        token_type_ids=d["tids"], position_ids=d["pids"]), 1),
    "bert_forward_past_dropout": (_bert_fwd(past_length=2, p=0.5, seed=3), 1),
    "bert_forward_int32_ids": (lambda d: F.bert_embeddings_forward(
        d["ids32"], d["word"], d["pos"], d["types"], position_ids=d["pids32"]), 1),
    "bert_backward": (_bert_bwd(), None),
    "bert_backward_dropout_sparse": (_bert_bwd(p=0.5, seed=3, sparse=True), None),
    "bert_backward_types_positions": (lambda d: F.bert_embeddings_backward(
        d["g"], d["ids"], d["word"], d["pos"], d["types"], d["mean"], d["rstd"], d["gamma"],
        d["beta"], token_type_ids=d["tids"], position_ids=d["pids"]), None),
    "gpt2_forward": (lambda d: F.gpt2_embeddings(d["ids"], d["word"], d["pos"]), 1),
    "gpt2_forward_past_dropout": (lambda d: F.gpt2_embeddings(
        d["ids"], d["word"], d["pos"], past_length=3, p=0.5, seed=1), 1),
    "gpt2_forward_positions": (lambda d: F.gpt2_embeddings(
        d["ids"], d["word"], d["pos"], position_ids=d["pids"]), 1),
    "gpt2_forward_int32_ids": (lambda d: F.gpt2_embeddings(
        d["ids32"], d["word"], d["pos"], position_ids=d["pids32"]), 1),
    "gpt2_backward": (lambda d: F.gpt2_embeddings_backward(d["g"], d["ids"], V, P), None),
    "gpt2_backward_dropout_positions": (lambda d: F.gpt2_embeddings_backward(
        d["g"], d["ids"], V, P, position_ids=d["pids"], p=0.5, seed=1, sparse=True), None),
    "add_positional": (lambda d: F.add_positional(d["x"], d["pos"], offset=2), 1),
    "add_positional_ids": (lambda d: F.add_positional(d["x"], d["pos"],
                                                      position_ids=d["pids"]), 1),
    "add_positional_fractional": (lambda d: F.add_positional(d["x"], d["pos"],
                                                             position_ids=d["frac"]), None),
    "add_positional_backward": (lambda d: F.add_positional_backward(d["g"], P, offset=2), 1),
    "add_positional_backward_ids": (lambda d: F.add_positional_backward(
        d["g"], P, position_ids=d["pids"]), None),
    "add_positional_backward_fractional": (lambda d: F.add_positional_backward(
        d["g"], P, position_ids=d["frac"]), None),
    "positional_mult_add": (lambda d: F.positional_mult_add(d["x"], d["pos"], d["pos"]), 1),
    "positional_mult_add_backward": (lambda d: F.positional_mult_add_backward(
        d["g"], d["x"], d["pos"]), 1),
    "positions_from_padding": (lambda d: F.positions_from_padding(d["ids"], 3,
                                                                  past_length=2), 1),
    "positions_from_padding_device_past": (lambda d: F.positions_from_padding(
        d["ids"], 3, past_length=d["past"]), 1),
    "sinusoidal_pos_embedding": (lambda d: F.sinusoidal_pos_embedding(L, D, device="cuda"), 1),
    "apply_rotary": (lambda d: F.apply_rotary(d["x"], 3, d["freq"]), None),
    "apply_rotary_ids": (lambda d: F.apply_rotary(d["x"], d["pids"], d["freq"]), None),
    "apply_rotary_backward": (lambda d: F.apply_rotary_backward(d["g"], d["pids"], d["freq"]),
                              None),
    "alibi_bias": (lambda d: F.alibi_bias(d["slopes"], L), 1),
    "add_alibi_": (lambda d: F.add_alibi_(d["scores"], d["slopes"]), 1),
    "alibi_slopes_grad": (lambda d: F.alibi_slopes_grad(d["scores"]), None),
    "alibi_bloom": (lambda d: F.add_alibi_(d["scores"], d["slopes"], mode="bloom"), None),
    "relative_position_bias": (lambda d: F.relative_position_bias(
        d["rel_table"], L, L, offset=1, max_distance=16), 2),
    "add_relative_position_bias_": (lambda d: F.add_relative_position_bias_(
        d["scores"], d["rel_table"], max_distance=16), 2),
    "relative_position_bias_grad": (lambda d: F.relative_position_bias_grad(
        d["scores"], 8, max_distance=16), 2),
    "quantized_embedding": (lambda d: F.quantized_embedding(d["ids"], d["packed"], 8), 1),
    "dropout": (lambda d: F.dropout(d["x"], 0.5, 7), 1),
    "dropout_backward": (lambda d: F.dropout_backward(d["g"], 0.5, 7), 1),
    "layer_norm_forward": (lambda d: F.layer_norm_forward(d["x"], d["gamma"], d["beta"]), 1),
    "layer_norm_backward": (lambda d: F.layer_norm_backward(
        d["g"], d["x"], d["ln_mean"], d["ln_rstd"], d["gamma"], d["beta"]), None),
    "embedding_backward": (lambda d: F.embedding_backward(d["g"], d["ids"], V), None),
    "embedding_backward_sparse": (lambda d: F.embedding_backward(d["g"], d["ids"], V,
                                                                 sparse=True), None),
    # gradient accumulation of two sparse backwards (concatenated, grouped, summed)
    "sparse_gradients_added": (lambda d: F.embedding_backward(d["g"], d["ids"], V, sparse=True)
                               + F.embedding_backward(d["g"], d["ids"], V, sparse=True), None),
}


# A device attention mask stays on the device: its values (0 / 1) and the positions it
# gives are checked by the kernel that numbers them (deferred ValueErrors).
MASK_OPS = {
    "alibi_bloom_device_mask": lambda d: F.add_alibi_(d["scores"], d["slopes"], mode="bloom",
                                                      attention_mask=d["mask"]),
    "gpt2_forward_device_mask": lambda d: F.gpt2_embeddings(d["ids"], d["word"], d["pos"],
                                                            attention_mask=d["mask"]),
}


@pytest.mark.skipif(not _simulated(), reason="counts are taken on the CUDA simulator")
def test_counter_sees_launches_copies_and_synchronisations(data):
    from numba import cuda

    x = data["ids"]
    F.embedding(x, data["word"])  # makes the error word: to_host then synchronises
    with count_cuda_traffic() as counts:
        numbapos.to_host(x)  # a synchronisation and a copy
        int(x[0, 1])
        np.asarray(x)
        x.sum()
        cuda.synchronize()
        F.embedding(x, data["word"])
        dev(np.zeros(3))
    assert counts.device_to_host == 4
    assert counts.synchronizations == 2
    assert counts.launches == 1 and counts.kernels == ["_gather_rows"]
    assert counts.host_to_device == 1


@pytest.mark.skipif(not _simulated(), reason="counts are taken on the CUDA simulator")
@pytest.mark.parametrize("name", list(MASK_OPS))
def test_device_attention_mask_stays_on_the_device(data, name):
    data = dict(data, mask=dev(np.array([[0, 1, 1], [1, 1, 1]])))
    MASK_OPS[name](data)
    numbapos.synchronize()
    with count_cuda_traffic() as counts:
        MASK_OPS[name](data)
    assert counts.device_to_host == 0, f"{name}: {counts}"


@pytest.mark.skipif(not _simulated(), reason="counts are taken on the CUDA simulator")
@pytest.mark.parametrize("name", list(OPS))
def test_op_makes_no_host_round_trip(data, name):
    op, launches = OPS[name]
    op(data)  # warm-up: the error word, the allocator's blocks
    numbapos.synchronize()
    with count_cuda_traffic() as counts:
        op(data)
    assert counts.device_to_host == 0, f"{name}: {counts}"
    assert counts.synchronizations == 0, f"{name}: {counts}"
    if launches is not None:
        assert counts.launches == launches, f"{name}: {counts}"
    numbapos.synchronize()


def _module_steps():
    """Forward + backward (+ optimiser step) of the modules: (name, make, step)."""

    def bert():
        block = nn.BertEmbeddings(V, D, P, TV, hidden_dropout_prob=0.5, seed=1,
                                  dtype=np.float32).to("cuda")
        return block, numbapos.optim.SGD(block.parameters(), lr=0.1)

    def gpt2():
        block = nn.GPT2Embeddings(V, P, D, embd_pdrop=0.5, seed=1, dtype=np.float32,
                                  device="cuda")
        return block, numbapos.optim.SGD(block.parameters(), lr=0.1)

    def sparse_embedding():
        emb = nn.Embedding(V, D, sparse=True, dtype=np.float32, device="cuda")
        return emb, numbapos.optim.SGD(emb.parameters(), lr=0.1, momentum=0.9)

    def dense_embedding_adam():
        emb = nn.Embedding(V, D, dtype=np.float32, device="cuda")
        return emb, numbapos.optim.Adam(emb.parameters(), lr=0.1)

    return {"BertEmbeddings": bert, "GPT2Embeddings": gpt2,
            "Embedding_sparse_SGD_momentum": sparse_embedding,
            "Embedding_dense_Adam": dense_embedding_adam}


MODULES = _module_steps()


@pytest.mark.skipif(not _simulated(), reason="counts are taken on the CUDA simulator")
@pytest.mark.parametrize("name", list(MODULES))
def test_training_step_makes_no_host_round_trip(data, name):
    module, opt = MODULES[name]()

    def step():
        y = module(data["ids"])
        assert tuple(y.shape) == (N, L, D)
        module.backward(data["g"])
        opt.step()
        module.zero_grad()

    step()
    numbapos.synchronize()
    with count_cuda_traffic() as counts:
        step()
    assert counts.device_to_host == 0, f"{name}: {counts}"
    assert counts.synchronizations == 0, f"{name}: {counts}"
    numbapos.synchronize()


# ---------------------------------------------------------------- deferred errors


def _message(name, value, position, size_name, size):
    return (rf"^{name}: index {value} \(at flat position {position}\) is out of range for "
            rf"{size_name}={size}")


def _bad(ids, position, value):
    bad = np.array(ids, copy=True)
    bad.reshape(-1)[position] = value
    return bad


# name -> (op taking (data, replaced arrays), which array to spoil, position, value, names)
ERRORS = {
    "embedding": (lambda d, ids: F.embedding(ids, d["word"]), "ids", 4, V,
                  ("indices", "num_embeddings", V)),
    "bert_word": (lambda d, ids: F.bert_embeddings_forward(ids, d["word"], d["pos"],
                                                           d["types"], d["gamma"], d["beta"]),
                  "ids", 4, V, ("input_ids", "vocab_size", V)),
    "bert_word_negative": (lambda d, ids: F.bert_embeddings(ids, d["word"], d["pos"],
                                                            d["types"]),
                           "ids", 1, -1, ("input_ids", "vocab_size", V)),
    "bert_token_type": (lambda d, tids: F.bert_embeddings_forward(
        d["ids"], d["word"], d["pos"], d["types"], token_type_ids=tids), "tids", 3, TV,
        ("token_type_ids", "type_vocab_size", TV)),
    "bert_position_broadcast": (lambda d, pids: F.bert_embeddings_forward(
        d["ids"], d["word"], d["pos"], d["types"], position_ids=pids), "pids", 2, P,
        ("position_ids", "max_position_embeddings", P)),
    "gpt2_word": (lambda d, ids: F.gpt2_embeddings(ids, d["word"], d["pos"], p=0.5, seed=1),
                  "ids", 5, -3, ("input_ids", "vocab_size", V)),
    "gpt2_position": (lambda d, pids: F.gpt2_embeddings(d["ids"], d["word"], d["pos"],
                                                        position_ids=pids),
                      "pids", 1, P + 4, ("position_ids", "n_positions", P)),
    "add_positional": (lambda d, pids: F.add_positional(d["x"], d["pos"], position_ids=pids),
                       "pids", 2, P, ("position_ids", "max_len", P)),
    "add_positional_backward": (lambda d, pids: F.add_positional_backward(
        d["g"], P, position_ids=pids), "pids", 1, -1, ("position_ids", "max_len", P)),
    "quantized_embedding": (lambda d, ids: F.quantized_embedding(ids, d["packed"], 8), "ids",
                            3, V + 1, ("indices", "num_embeddings", V)),
    "bert_backward": (lambda d, ids: F.bert_embeddings_backward(
        d["g"], ids, d["word"], d["pos"], d["types"], d["mean"], d["rstd"], d["gamma"],
        d["beta"]), "ids", 0, V, ("input_ids", "vocab_size", V)),
    "gpt2_backward": (lambda d, ids: F.gpt2_embeddings_backward(d["g"], ids, V, P), "ids", 2,
                      -5, ("input_ids", "vocab_size", V)),
}

_HOST_SOURCES = {"ids": lambda rng: rng.integers(1, V, (N, L)),
                 "tids": lambda rng: np.array([[1, 0, 2], [2, 2, 0]]),
                 "pids": lambda rng: np.array([4, 0, 2])}


def _tables(d):
    return {name: d[name].copy_to_host() for name in ("word", "pos", "types", "gamma", "beta",
                                                      "packed")}


@pytest.mark.parametrize("name", list(ERRORS))
def test_bad_id_raises_the_cpu_error_at_synchronize(data, name):
    op, which, position, value, (arg, size_name, size) = ERRORS[name]
    good = _HOST_SOURCES[which](np.random.default_rng(0))
    bad = _bad(good, position, value)
    before = _tables(data)
    message = _message(arg, value, position, size_name, size)
    # The CPU raises this message at the op itself.
    cpu_data = {k: v.copy_to_host() for k, v in data.items()}
    with pytest.raises(IndexError, match=message):
        op(cpu_data, bad)
    # The GPU queues the op and returns; the error comes at the next synchronising call.
    op(data, dev(bad))
    with pytest.raises(IndexError, match=message):
        numbapos.synchronize()
    numbapos.synchronize()  # cleared
    after = _tables(data)
    for key in before:
        np.testing.assert_array_equal(after[key], before[key], err_msg=key)
    # The device is usable, and the next call gives the CPU's result.
    result = op(data, dev(good))
    expected = op(cpu_data, good)
    for got, want in zip(_leaves(result), _leaves(expected), strict=True):
        got = numbapos.to_host(got)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _leaves(result):
    """The arrays of an op's result (an array, a tuple of arrays, SparseRows or None)."""
    if result is None:
        return []
    if isinstance(result, tuple):
        return [a for item in result for a in _leaves(item)]
    if hasattr(result, "to_dense"):
        return [result.to_dense()]
    return [result]


def test_the_error_is_raised_by_the_next_op_once_visible(data):
    """A bad id found by the BERT forward is raised by the next numbapos call (the host
    sees the mapped word without synchronising) and the call after works."""
    bad = _bad(_HOST_SOURCES["ids"](np.random.default_rng(0)), 2, V)
    F.bert_embeddings(dev(bad), data["word"], data["pos"], data["types"])
    with pytest.raises(IndexError, match=_message("input_ids", V, 2, "vocab_size", V)):
        F.gpt2_embeddings(data["ids"], data["word"], data["pos"])
    numbapos.synchronize()
    F.gpt2_embeddings(data["ids"], data["word"], data["pos"])
    numbapos.synchronize()


def test_bad_row_is_never_read_and_zero_filled(data):
    """The fused forward kernels write zeros for a token with a bad id."""
    from numbapos._args import NO_DROPOUT, BertIds, BertTables, TiledIds
    from numbapos.kernels.cuda import blocks

    ids = np.array([1, V + 100, 2, -7], np.int64)
    y = dev(np.full((4, D), np.nan, np.float32))
    mean, rstd = dev(np.full(4, np.nan, np.float32)), dev(np.full(4, np.nan, np.float32))
    blocks.bert_forward(BertIds(dev(ids), TiledIds(None, 0, 4), TiledIds(None, 0, 1)),
                        BertTables(data["word"], data["pos"], data["types"], None, None),
                        1e-12, NO_DROPOUT, y, mean, rstd)
    blocks.gpt2_forward_checked(dev(ids), 0, 4, data["word"], data["pos"], y2 := dev(
        np.full((4, D), np.nan, np.float32)))
    with pytest.raises(IndexError, match=_message("input_ids", V + 100, 1, "vocab_size", V)):
        numbapos.synchronize()
    for out in (y, y2):
        got = out.copy_to_host()
        np.testing.assert_array_equal(got[[1, 3]], 0)
        assert np.isfinite(got[[0, 2]]).all()
    np.testing.assert_array_equal(mean.copy_to_host()[[1, 3]], 0)


def test_gradient_kernels_do_nothing_while_an_error_is_pending(data):
    """BERT / LayerNorm / dropout backward launchers write nothing while an error is
    pending (their outputs keep their NaN fill), and work again once it is raised."""
    from numbapos._args import BertIds, BertTables, DropoutArgs
    from numbapos.kernels import cuda as K

    tokens = N * L
    ids = BertIds(data["ids"].reshape(tokens), dev(np.tile([0, 1, 2], N)),
                  dev(np.zeros(tokens, np.int64)))
    tables = BertTables(data["word"], data["pos"], data["types"], data["gamma"], data["beta"])
    drop = DropoutArgs.make(0.5, 3, 0)

    def nans(*shape):
        return dev(np.full(shape, np.nan, np.float32))

    def launch_all():
        outs = dict(grad_sum=nans(tokens, D), gw=nans(D), gb=nans(D), gt=nans(TV, D),
                    gx=nans(tokens, D), lw=nans(D), lb=nans(D), drop=nans(tokens * D))
        K.bert_backward(data["g"].reshape(tokens, D), ids, tables,
                        data["mean"].reshape(tokens), data["rstd"].reshape(tokens), drop,
                        outs["grad_sum"], outs["gw"], outs["gb"], outs["gt"])
        K.layer_norm_backward_rows(data["g"].reshape(tokens, D), data["x"].reshape(tokens, D),
                                   data["ln_mean"].reshape(tokens),
                                   data["ln_rstd"].reshape(tokens), data["gamma"], outs["gx"],
                                   outs["lw"], outs["lb"])
        K.dropout_apply(data["g"].reshape(tokens * D), drop, outs["drop"])
        return outs

    K.check_indices(dev(np.array([0, 99])), 5, "input_ids", "vocab_size")  # pending now
    idle = launch_all()
    with pytest.raises(IndexError, match=_message("input_ids", 99, 1, "vocab_size", 5)):
        numbapos.synchronize()
    for name, out in idle.items():
        assert np.isnan(out.copy_to_host()).all(), name
    for name, out in launch_all().items():  # usable again
        assert np.isfinite(out.copy_to_host()).all(), name


# ---------------------------------------------------------------- rotary scaling by length

_LONGROPE = {"rope_type": "longrope", "short_factor": [1.0, 1.5], "long_factor": [2.0, 4.0],
             "original_max_position_embeddings": 4}


def _rope_case(kind, positions):
    """(module, q on the device, its host copy, device positions, host positions, kwargs)."""
    scaling = _LONGROPE if kind == "longrope" else {"rope_type": "dynamic", "factor": 2.0}
    rope_cpu = nn.RotaryEmbedding(4, scaling=scaling, max_position_embeddings=4)
    rope_gpu = nn.RotaryEmbedding(4, scaling=scaling, max_position_embeddings=4, device="cuda")
    q = np.linspace(-1, 1, 2 * 2 * 3 * 4, dtype=np.float32).reshape(2, 2, 3, 4)
    kwargs = {} if kind == "longrope" else {"seq_len": int(np.max(positions)) + 1}
    return rope_cpu, rope_gpu, q, dev(q), positions, dev(positions), kwargs


@pytest.mark.skipif(not _simulated(), reason="counts are taken on the CUDA simulator")
@pytest.mark.parametrize("kind", ["longrope", "dynamic_seq_len"])
@pytest.mark.parametrize("positions", [np.array([0, 1, 2]), np.array([[0, 5, 2], [1, 2, 3]])],
                         ids=["short", "long"])
def test_rotary_scaled_by_length_makes_no_host_round_trip(kind, positions):
    # LongRoPE picks its factors on the device; dynamic NTK takes an explicit seq_len.
    rope_cpu, rope_gpu, q, q_dev, pos, pos_dev, kwargs = _rope_case(kind, positions)
    rope_gpu.backward(rope_gpu(q_dev, position_ids=pos_dev, **kwargs))  # warm-up
    numbapos.synchronize()
    with count_cuda_traffic() as counts:
        y = rope_gpu(q_dev, position_ids=pos_dev, **kwargs)
        g = rope_gpu.backward(y)
    assert (counts.device_to_host, counts.synchronizations, counts.host_to_device) == (0, 0, 0), \
        str(counts)
    want = rope_cpu(q, position_ids=pos, **kwargs)
    np.testing.assert_array_equal(numbapos.to_host(y), want)  # the CPU's bits
    np.testing.assert_array_equal(numbapos.to_host(g), rope_cpu.backward(want))


def test_longrope_factors_follow_the_device_positions():
    rope_cpu, rope_gpu, q, q_dev, _, _, _ = _rope_case("longrope", np.array([0]))
    for positions in (np.array([0, 1, 3]), np.array([0, 1, 4]), np.array([[7, 0, 0]] * 2),
                      np.array([-3, -2, -1])):
        got = numbapos.to_host(rope_gpu(q_dev, position_ids=dev(positions)))
        np.testing.assert_array_equal(got, rope_cpu(q, position_ids=positions), str(positions))


def test_dynamic_rotary_without_seq_len_is_refused_in_a_captured_step():
    _, rope_gpu, _, q_dev, _, pos_dev, _ = _rope_case("dynamic", np.array([0, 1, 2]))

    def step():
        return rope_gpu(q_dev, position_ids=pos_dev)

    with pytest.raises(RuntimeError, match="dynamic NTK scaling with CUDA position_ids and no "
                                           "seq_len.*captured step"):
        numbapos.cuda.capture(step)
    rope_gpu(q_dev, position_ids=pos_dev)  # eagerly it still works (reading the length)
