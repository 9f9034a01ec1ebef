"""
Positions from padding
======================

A batch of sequences of different lengths is padded, on the right or on the
left. Adding ``P[0 : L]`` to every sequence gives a token a position that
depends on how much padding came before it.
:func:`numbapos.functional.positions_from_padding` numbers the real tokens
from each sequence's first real token instead, so a left-padded and a
right-padded batch give every token the same position.
"""

import matplotlib.pyplot as plt
import numpy as np

import numbapos.functional as F

PAD = 0
sentences = [[11, 12, 13, 14, 15, 16], [21, 22, 23], [31, 32, 33, 34, 35]]
L = max(map(len, sentences))

right = np.full((len(sentences), L), PAD)
left = np.full((len(sentences), L), PAD)
for row, tokens in enumerate(sentences):
    right[row, : len(tokens)] = tokens
    left[row, L - len(tokens):] = tokens

naive = np.broadcast_to(np.arange(L), left.shape)     # what P[0 : L] would use
pos_right = F.positions_from_padding(right, padding_idx=PAD)
pos_left = F.positions_from_padding(left, padding_idx=PAD)
print("left-padded ids:\n", left)
print("positions_from_padding:\n", pos_left)

# Every real token gets the same position under both paddings.
assert all((pos_right[r][right[r] != PAD] == pos_left[r][left[r] != PAD]).all()
           for r in range(len(sentences)))

# %%
# The same positions from an attention mask, Hugging Face's convention
# (padding gets position 1 there by default):

mask = (left != PAD).astype(np.int64)
print(F.positions_from_attention_mask(mask))

# %%
# Drawn: each cell is one token, its colour the position it is given; grey
# cells are padding.

panels = [("left-padded, P[0 : L]", left, naive),
          ("left-padded, positions_from_padding", left, pos_left),
          ("right-padded, positions_from_padding", right, pos_right)]
fig, axes = plt.subplots(1, 3, figsize=(12, 2.6))
for ax, (title, ids, pos) in zip(axes, panels, strict=True):
    shown = np.ma.masked_where(ids == PAD, pos)
    cmap = plt.get_cmap("viridis").with_extremes(bad="lightgrey")
    ax.imshow(shown, cmap=cmap, vmin=0, vmax=L - 1)
    for (r, c), p in np.ndenumerate(pos):
        if ids[r, c] != PAD:
            ax.text(c, r, str(p), ha="center", va="center", color="white", fontsize=9)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel("column")
    ax.set_yticks(range(len(sentences)))
fig.tight_layout()
plt.show()
