"""
Rotary positions, and a learned table extended four ways
========================================================

**Rotary embeddings** rotate each channel pair of a query and a key by an
angle proportional to its position. Rotate one query vector to every
position ``i`` and one key vector to every position ``j``: their dot product
depends only on ``i - j``, so the matrix of scores is constant along its
diagonals, whatever the absolute positions
(:func:`numbapos.functional.apply_rotary`).
"""

import matplotlib.pyplot as plt
import numpy as np

import numbapos.functional as F
from numbapos import nn

L, D = 96, 32
rng = np.random.default_rng(0)
inv_freq, _ = F.rope_frequencies(D, base=100.0)
q = np.broadcast_to(rng.standard_normal(D), (1, 1, L, D)).astype(np.float64)
k = np.broadcast_to(rng.standard_normal(D), (1, 1, L, D)).astype(np.float64)
q_rot = F.apply_rotary(q, 0, inv_freq)[0, 0]
k_rot = F.apply_rotary(k, 0, inv_freq)[0, 0]
far = F.apply_rotary(q, 10_000, inv_freq)[0, 0] @ F.apply_rotary(k, 10_000, inv_freq)[0, 0].T
scores = q_rot @ k_rot.T

fig, axes = plt.subplots(1, 2, figsize=(10, 4), layout="constrained")
image = axes[0].imshow(scores, cmap="RdBu_r")
axes[0].set_title("q at position i . k at position j")
axes[0].set_xlabel("key position j")
axes[0].set_ylabel("query position i")
fig.colorbar(image, ax=axes[0], fraction=0.046)
distance = np.arange(-L + 1, L)
axes[1].plot(distance, [np.mean(np.diagonal(scores, -d)) for d in distance], label="i, j < 96")
axes[1].plot(distance, [np.mean(np.diagonal(far, -d)) for d in distance], "--",
             label="i, j >= 10000")
axes[1].set_xlabel("i - j")
axes[1].set_ylabel("score")
axes[1].set_title("the score is a function of i - j")
axes[1].legend()
plt.show()

# %%
# The two curves coincide: shifting both positions by 10,000 changes no score
# (to rounding: the angles are reduced in float64).
print("largest difference along the diagonals:", float(np.abs(far - scores).max()))

# %%
# **A learned table past max_len.** A table trained on 16 positions, grown to
# 64 with :meth:`numbapos.nn.LearnedPosEmbedding.extend_` four ways: resampled
# (``"linear"``, position interpolation), repeated (``"copy"``, as Longformer
# grew RoBERTa's), its last row repeated (``"repeat_last"``), or new rows drawn
# as the module draws them (``"init"``). The plot follows one channel.

table = nn.LearnedPosEmbedding(16, 4, init="sinusoidal", seed=0)
fig, axes = plt.subplots(1, 4, figsize=(13, 3.2), sharey=True, layout="constrained")
for ax, mode in zip(axes, ["linear", "copy", "repeat_last", "init"], strict=True):
    grown = nn.LearnedPosEmbedding(16, 4, seed=0)
    grown.weight.data[...] = table.weight.data
    grown.extend_(64, mode=mode, seed=1)
    ax.plot(np.arange(64), grown.weight.data[:, 0], ".-", markersize=3)
    ax.axvline(15.5, color="gray", linewidth=0.8)
    ax.set_title(f'mode="{mode}"')
    ax.set_xlabel("position")
axes[0].set_ylabel("channel 0")
plt.show()
