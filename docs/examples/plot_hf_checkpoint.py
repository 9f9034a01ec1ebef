"""
Loading Hugging Face weights
============================

:meth:`numbapos.nn.BertEmbeddings.from_hf_state_dict` and
:meth:`numbapos.nn.GPT2Embeddings.from_hf_state_dict` build the embedding
blocks from a state dict with Hugging Face's parameter names, such as the one
:func:`numbapos.io.load_state` reads from a ``model.safetensors`` file.

So that this example runs anywhere (no download), it first writes a tiny
checkpoint of its own with :func:`numbapos.io.save_state`, using the names a
``BertForMaskedLM`` checkpoint has (prefix ``bert.embeddings.``), plus two
entries the loader must ignore. It then loads the block, checks its output
against the formula written in NumPy, and does the same for GPT-2. Needs the
``io`` extra (safetensors).
"""

import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from numbapos import io, nn

rng = np.random.default_rng(0)
V, P, T, D = 50, 16, 2, 8  # vocabulary, positions, token types, width

hf_state = {
    "bert.embeddings.word_embeddings.weight": rng.normal(0, 0.02, (V, D)).astype(np.float32),
    "bert.embeddings.position_embeddings.weight": rng.normal(0, 0.02, (P, D)).astype(np.float32),
    "bert.embeddings.token_type_embeddings.weight": rng.normal(0, 0.02, (T, D)).astype(np.float32),
    "bert.embeddings.LayerNorm.weight": rng.uniform(0.5, 1.5, D).astype(np.float32),
    "bert.embeddings.LayerNorm.bias": rng.normal(0, 0.1, D).astype(np.float32),
    # Entries the loader ignores: a buffer and an encoder weight.
    "bert.embeddings.position_ids": np.arange(P, dtype=np.int64)[None],
    "bert.encoder.layer.0.attention.self.query.weight": np.zeros((D, D), np.float32),
}

# %%
# Write the checkpoint, read it back, build the block
# ---------------------------------------------------
# ``save_state`` writes atomically (a temporary file renamed over the target).
# ``from_hf_state_dict`` infers every size from the arrays.

with tempfile.TemporaryDirectory() as tmp:
    path = Path(tmp) / "model.safetensors"
    io.save_state(hf_state, path, metadata={"format": "pt"})
    state = io.load_state(path)
    print(sorted(state)[:3], "...", io.load_metadata(path))

bert = nn.BertEmbeddings.from_hf_state_dict(state, prefix="bert.embeddings.")
bert.eval()  # no dropout: compare with the formula
print(bert)

# %%
# Check against the formula
# -------------------------
# ``LayerNorm(word[ids] + position[0..L-1] + token_type[types])``, with the
# biased variance and ``eps=1e-12`` of Hugging Face's BERT.

ids = np.array([[2, 7, 7, 31, 0, 0], [5, 9, 11, 13, 17, 19]])
types = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
h = bert(ids, token_type_ids=types)

pre = "bert.embeddings."
s = (state[pre + "word_embeddings.weight"][ids]
     + state[pre + "position_embeddings.weight"][: ids.shape[1]]
     + state[pre + "token_type_embeddings.weight"][types])
mean = s.mean(-1, keepdims=True)
var = s.var(-1, keepdims=True)
expected = ((s - mean) / np.sqrt(var + 1e-12) * state[pre + "LayerNorm.weight"]
            + state[pre + "LayerNorm.bias"])
print("BERT block, largest difference from the formula:", np.abs(h - expected).max())
assert np.allclose(h, expected, atol=1e-5)

# %%
# GPT-2
# -----
# A ``GPT2Model`` checkpoint has ``wte.weight`` and ``wpe.weight`` with no
# prefix (``"transformer."`` for a ``GPT2LMHeadModel`` saved from PyTorch).

gpt2_state = {"wte.weight": rng.normal(0, 0.02, (V, D)).astype(np.float32),
              "wpe.weight": rng.normal(0, 0.02, (P, D)).astype(np.float32)}
gpt2 = nn.GPT2Embeddings.from_hf_state_dict(gpt2_state).eval()
g = gpt2(ids)
assert np.allclose(g, gpt2_state["wte.weight"][ids] + gpt2_state["wpe.weight"][:6])
print("GPT-2 block matches wte[ids] + wpe[positions]")

fig, axes = plt.subplots(1, 2, figsize=(8, 2.6))
for ax, (title, out) in zip(axes, [("BERT block", h[0]), ("GPT-2 block", g[0])], strict=True):
    ax.imshow(out.T, aspect="auto", cmap="RdBu_r")
    ax.set_title(f"{title}: first sequence")
    ax.set_xlabel("token")
    ax.set_ylabel("channel")
fig.tight_layout()
plt.show()
