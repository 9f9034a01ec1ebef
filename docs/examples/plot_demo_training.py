"""
Training with and without positions
===================================

:func:`numbapos.demo.train` is what ``python -m numbapos demo`` runs: a
next-token model built only from numbapos parts (a tied
:class:`~numbapos.nn.Embedding` that is also the output head, positions, a
:class:`~numbapos.nn.LayerNorm`), trained with :class:`~numbapos.optim.SGD`
on a synthetic corpus in which the next token depends on the position (an
anchor token ``A`` at even positions, a position-specific token ``B_k`` at
odd position ``2k + 1``, 10 % noise). After an ``A``, only the position says
which ``B`` comes next, so the model without positions can only guess.

This page trains three models for a short run (the CLI defaults to 300 steps)
on the same batches: learned positions, sinusoidal positions, and none.
"""

import matplotlib.pyplot as plt
import numpy as np

from numbapos import demo

STEPS = 120
results = [demo.train(positions, STEPS, seed=0, eval_sequences=500)
           for positions in ("learned", "sinusoidal", "none")]

print(f"{'positions':<12}{'held-out loss':>15}{'accuracy':>10}")
for r in results:
    print(f"{r.positions:<12}{r.eval_loss:>15.4f}{r.eval_accuracy:>10.3f}")

# %%
# Loss curves (a running mean over 10 steps) and the cosine similarities of
# the position vectors the learned model ended with.

fig, (ax, ax_pos) = plt.subplots(1, 2, figsize=(11, 4))
for r in results:
    smooth = np.convolve(r.losses, np.ones(10) / 10, mode="valid")
    ax.plot(smooth, label=f"{r.positions} positions" if r.positions != "none" else "no positions")
ax.set_xlabel("step")
ax.set_ylabel("training loss")
ax.set_title("next-token loss")
ax.legend()

table = results[0].model.position_table().astype(np.float64)
unit = table / np.linalg.norm(table, axis=1, keepdims=True)
image = ax_pos.imshow(unit @ unit.T, vmin=-1, vmax=1, cmap="RdBu_r")
ax_pos.set_title("learned positions after training: cosine similarity")
ax_pos.set_xlabel("position")
ax_pos.set_ylabel("position")
fig.colorbar(image, ax=ax_pos, fraction=0.046)
fig.tight_layout()
plt.show()
