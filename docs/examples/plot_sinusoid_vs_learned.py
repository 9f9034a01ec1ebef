"""
Sinusoidal and learned positions
================================

The cosine similarity between the position vectors of every pair of
positions shows what a position table "knows" about distance. The sinusoid
table (:func:`numbapos.functional.sinusoidal_pos_embedding`) gives nearby
positions similar vectors, the same for every pair at the same distance. A
freshly initialised :class:`numbapos.nn.LearnedPosEmbedding` (N(0, 0.02²))
has no such structure: only training can give it one. ``init="sinusoidal"``
starts the learned table from the sinusoid instead.
"""

import matplotlib.pyplot as plt
import numpy as np

import numbapos.functional as F
from numbapos import nn

L, D = 64, 64


def cosine(table):
    unit = table / np.linalg.norm(table, axis=1, keepdims=True)
    return unit @ unit.T


tables = {
    "sinusoid table": F.sinusoidal_pos_embedding(L, D, dtype=np.float64),
    'learned, init="normal"': nn.LearnedPosEmbedding(L, D, seed=0).weight.data,
    'learned, init="sinusoidal"': nn.LearnedPosEmbedding(L, D, init="sinusoidal",
                                                         seed=0).weight.data,
}

fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
for ax, (title, table) in zip(axes, tables.items(), strict=True):
    image = ax.imshow(cosine(np.asarray(table, np.float64)), vmin=-1, vmax=1, cmap="RdBu_r")
    ax.set_title(title)
    ax.set_xlabel("position")
    ax.set_ylabel("position")
fig.colorbar(image, ax=axes, fraction=0.02)
plt.show()

# %%
# Along a row of the sinusoid's matrix the similarity depends only on the
# distance between the two positions, because ``PE[p + k]`` is a fixed
# rotation of ``PE[p]`` in each (sin, cos) channel pair:

sim = cosine(np.asarray(tables["sinusoid table"], np.float64))
for k in (1, 4, 16):
    print(f"distance {k:2d}: cosine {sim[0, k]:.4f} (from position 0), "
          f"{sim[20, 20 + k]:.4f} (from position 20)")
