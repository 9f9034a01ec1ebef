"""Parity with PyTorch's LayerNorm and with Hugging Face transformers' embedding blocks.

Every test skips cleanly when ``torch`` (or, for the blocks, ``transformers``)
is not installed. The tests follow whatever transformers version is installed
(any the ``parity`` extra admits): keyword names that changed between versions
are read from the installed signatures, and a case the installed version cannot
express is skipped alone, with the version in the reason.
"""

import numpy as np
import pytest

from numbapos import nn


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def transformers(torch):
    return pytest.importorskip("transformers")


def _tol(dtype):
    return dict(rtol=1e-5, atol=2e-5) if np.dtype(dtype) == np.float32 else \
        dict(rtol=1e-10, atol=1e-11)


def _torch_dtype(torch, dtype):
    return torch.float32 if np.dtype(dtype) == np.float32 else torch.float64


# ------------------------------------------------------------------ LayerNorm


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm_matches_torch(torch, rng, dtype, affine):
    shape = (3, 5, 24)
    ours = nn.LayerNorm(24, eps=1e-5, elementwise_affine=affine, dtype=dtype)
    theirs = torch.nn.LayerNorm(24, eps=1e-5, elementwise_affine=affine,
                                dtype=_torch_dtype(torch, dtype))
    if affine:
        weight = rng.standard_normal(24).astype(dtype)
        bias = rng.standard_normal(24).astype(dtype)
        ours.weight.data[:] = weight
        ours.bias.data[:] = bias
        with torch.no_grad():
            theirs.weight.copy_(torch.from_numpy(weight))
            theirs.bias.copy_(torch.from_numpy(bias))
    x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
    gy = rng.standard_normal(shape).astype(dtype)
    tx = torch.from_numpy(x.copy()).requires_grad_(True)
    ty = theirs(tx)
    ty.backward(torch.from_numpy(gy))
    np.testing.assert_allclose(ours(x), ty.detach().numpy(), **_tol(dtype))
    np.testing.assert_allclose(ours.backward(gy), tx.grad.numpy(), **_tol(dtype))
    if affine:
        np.testing.assert_allclose(ours.weight.grad, theirs.weight.grad.numpy(),
                                   **_tol(dtype) | dict(atol=1e-4 if dtype == np.float32
                                                        else 1e-10))
        np.testing.assert_allclose(ours.bias.grad, theirs.bias.grad.numpy(),
                                   **_tol(dtype) | dict(atol=1e-4 if dtype == np.float32
                                                        else 1e-10))


# ------------------------------------------------------------------ BERT


def _hf_bert_embeddings(torch, transformers, dtype, rng):
    from transformers.models.bert.modeling_bert import BertEmbeddings

    config = transformers.BertConfig(vocab_size=40, hidden_size=16, max_position_embeddings=24,
                                     type_vocab_size=3, pad_token_id=1, layer_norm_eps=1e-12,
                                     hidden_dropout_prob=0.1)
    module = BertEmbeddings(config).to(_torch_dtype(torch, dtype))
    with torch.no_grad():
        for name, param in module.named_parameters():
            values = rng.standard_normal(tuple(param.shape)) * (0.5 if "weight" in name else 0.1)
            if name == "LayerNorm.weight":
                values += 1.0
            param.copy_(torch.from_numpy(values.astype(dtype)))
    return module


# What BertEmbeddings.forward calls the number of cached tokens before input_ids,
# oldest name first: transformers 4.x says past_key_values_length, 5.24 and later
# cache_length. The name is read from the installed version's signature.
_BERT_PAST_LENGTH_NAMES = ("past_key_values_length", "cache_length")


def _bert_past_length_keyword(module):
    import inspect

    accepted = inspect.signature(module.forward).parameters
    for name in _BERT_PAST_LENGTH_NAMES:
        if name in accepted:
            return name
    return None


# The cases, as functions of (ids shape, rng): each gives numbapos's keyword arguments.
_BERT_CASES = {
    "defaults": lambda rng: dict(),
    "token_types": lambda rng: dict(token_type_ids=rng.integers(0, 3, (3, 7))),
    "token_types_past_length": lambda rng: dict(token_type_ids=rng.integers(0, 3, (3, 7)),
                                                past_length=5),
    "position_ids": lambda rng: dict(position_ids=rng.integers(0, 24, (3, 7))),
}


@pytest.mark.parametrize("case", list(_BERT_CASES))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bert_embeddings_match_transformers(torch, transformers, rng, dtype, case):
    hf = _hf_bert_embeddings(torch, transformers, dtype, rng)
    hf.eval()
    state = {name: value.detach().numpy() for name, value in hf.state_dict().items()}
    ours = nn.BertEmbeddings.from_hf_state_dict(state, prefix="", pad_token_id=1)
    ours.dropout.eval()  # dropout off; the block stays in training mode to record for backward
    ids = rng.integers(0, 40, (3, 7))
    ids[0, -2:] = 1  # padding tokens
    kwargs = _BERT_CASES[case](rng)
    torch_kwargs = {k: (torch.from_numpy(v) if isinstance(v, np.ndarray) else v)
                    for k, v in kwargs.items()}
    if "past_length" in kwargs:
        name = _bert_past_length_keyword(hf)
        if name is None:
            pytest.skip(f"transformers {transformers.__version__}: BertEmbeddings.forward "
                        f"takes none of {_BERT_PAST_LENGTH_NAMES} (no past length to compare)")
        torch_kwargs[name] = torch_kwargs.pop("past_length")
    expected = hf(torch.from_numpy(ids), **torch_kwargs)
    got = ours(ids, **kwargs)
    np.testing.assert_allclose(got, expected.detach().numpy(), **_tol(dtype),
                               err_msg=str(kwargs))
    probe = rng.standard_normal(got.shape).astype(dtype)
    expected.backward(torch.from_numpy(probe))
    ours.backward(probe)
    theirs = dict(hf.named_parameters())
    for name, param in ours.named_parameters():
        np.testing.assert_allclose(param.grad, theirs[name].grad.numpy(),
                                   **_tol(dtype) | dict(atol=1e-4 if dtype == np.float32
                                                        else 1e-10),
                                   err_msg=f"{name} {kwargs}")


def test_bert_bfloat16_tables_match_transformers_on_the_widened_tables(torch, transformers, rng):
    # A bfloat16 state dict (PyTorch tensors, kept as bfloat16 tables) against
    # transformers' float32 block holding the same values widened.
    hf = _hf_bert_embeddings(torch, transformers, np.float32, rng)
    tables = {"word_embeddings.weight", "position_embeddings.weight",
              "token_type_embeddings.weight"}
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name in tables:
                param.copy_(param.to(torch.bfloat16).float())
    hf.eval()
    state = {name: (value.detach().to(torch.bfloat16) if name in tables else value.detach())
             for name, value in hf.state_dict().items()}
    ours = nn.BertEmbeddings.from_hf_state_dict(state, prefix="", pad_token_id=1,
                                                keep_dtype=True)
    assert str(ours.word_embeddings.weight.dtype) == "bfloat16"
    assert ours.LayerNorm.weight.dtype == np.float32
    ours.dropout.eval()
    ids = rng.integers(0, 40, (3, 7))
    types = rng.integers(0, 3, (3, 7))
    expected = hf(torch.from_numpy(ids), token_type_ids=torch.from_numpy(types))
    got = ours(ids, token_type_ids=types)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected.detach().numpy(), **_tol(np.float32))
    probe = rng.standard_normal(got.shape).astype(np.float32)
    expected.backward(torch.from_numpy(probe))
    ours.backward(probe)
    theirs = dict(hf.named_parameters())
    for name, param in ours.named_parameters():
        assert param.grad.dtype == np.float32
        np.testing.assert_allclose(param.grad, theirs[name].grad.numpy(),
                                   **_tol(np.float32) | dict(atol=1e-4), err_msg=name)


def test_bert_checkpoint_of_a_whole_transformers_model(torch, transformers, rng, tmp_path):
    pytest.importorskip("safetensors")
    from numbapos.io import load_state, save_state

    config = transformers.BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=24, type_vocab_size=2)
    model = transformers.BertModel(config).eval()
    path = tmp_path / "model.safetensors"
    save_state({k: v.detach().numpy() for k, v in model.state_dict().items()}, str(path))
    ours = nn.BertEmbeddings.from_hf_state_dict(load_state(str(path)),
                                                pad_token_id=config.pad_token_id)
    ours.eval()
    ids = rng.integers(0, 40, (2, 5))
    expected = model.embeddings(torch.from_numpy(ids)).detach().numpy()
    np.testing.assert_allclose(ours(ids), expected, rtol=1e-5, atol=2e-5)


# ------------------------------------------------------------------ GPT-2


def _hf_gpt2(torch, transformers, rng):
    config = transformers.GPT2Config(vocab_size=40, n_positions=24, n_embd=16, n_layer=1,
                                     n_head=2, embd_pdrop=0.1)
    model = transformers.GPT2Model(config).eval()
    with torch.no_grad():
        model.wte.weight.copy_(torch.from_numpy(rng.standard_normal((40, 16)).astype(np.float32)))
        model.wpe.weight.copy_(torch.from_numpy(rng.standard_normal((24, 16)).astype(np.float32)))
    captured = {}
    model.drop.register_forward_hook(lambda module, inputs, output: captured.update(h=output))
    return model, captured


def test_gpt2_embeddings_match_transformers(torch, transformers, rng):
    model, captured = _hf_gpt2(torch, transformers, rng)
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    ours = nn.GPT2Embeddings.from_hf_state_dict(state)
    ours.drop.eval()  # dropout off; the block stays in training mode to record for backward
    ids = rng.integers(0, 40, (2, 6))
    pos = rng.integers(0, 24, (2, 6))
    for kwargs in (dict(), dict(position_ids=pos)):
        model.zero_grad()
        ours.zero_grad()
        model(torch.from_numpy(ids),
              **{k: torch.from_numpy(v) for k, v in kwargs.items()})
        expected = captured["h"]
        got = ours(ids, **kwargs)
        np.testing.assert_allclose(got, expected.detach().numpy(), rtol=1e-6, atol=1e-6)
        probe = rng.standard_normal(got.shape).astype(np.float32)
        expected.backward(torch.from_numpy(probe))
        ours.backward(probe)
        np.testing.assert_allclose(ours.wte.weight.grad, model.wte.weight.grad.numpy(),
                                   rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(ours.wpe.weight.grad, model.wpe.weight.grad.numpy(),
                                   rtol=1e-5, atol=1e-5)


def test_gpt2_attention_mask_positions_match_transformers(torch, transformers, rng):
    # transformers builds generation positions from the mask; real tokens must agree.
    model, captured = _hf_gpt2(torch, transformers, rng)
    ours = nn.GPT2Embeddings.from_hf_state_dict(
        {k: v.detach().numpy() for k, v in model.state_dict().items()})
    ours.eval()
    ids = rng.integers(0, 40, (2, 5))
    mask = np.array([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    positions = torch.from_numpy(mask).long().cumsum(-1) - 1
    positions.masked_fill_(torch.from_numpy(mask) == 0, 1)
    model(torch.from_numpy(ids), position_ids=positions)
    expected = captured["h"].detach().numpy()
    np.testing.assert_allclose(ours(ids, attention_mask=mask), expected, rtol=1e-6, atol=1e-6)
