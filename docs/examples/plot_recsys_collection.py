"""
A click model on an EmbeddingBagCollection
==========================================

:func:`numbapos.demo_recsys.train` is what ``python -m numbapos demo --task
recsys`` runs: a DLRM-style click model on synthetic impressions whose clicks
depend on the interaction of a user's taste with an item's profile. An
:class:`~numbapos.nn.EmbeddingBagCollection` pools four features (``user``,
``item``, ``category`` and a ``history`` bag of several recently liked items,
weighted by recency) from one :class:`~numbapos.jagged.KeyedJaggedArray`; the
pairwise dot products of the pooled vectors and the vectors themselves feed a
logistic output. The tables are trained with
:class:`~numbapos.optim.RowWiseAdagrad` fused into the backward pass.

The baseline sees each id's click frequency only: a logistic regression on
the smoothed click rates of the user, the item and the category. It captures
popular users and items, not tastes, so the collection model beats it by a
wide margin. This page trains on fewer impressions than the command line
(which uses 4000 users and 300,000 impressions).
"""

import matplotlib.pyplot as plt
import numpy as np

from numbapos import demo_recsys

sizes = demo_recsys.Sizes(users=1500, items=400, train=90_000, eval=10_000)
result = demo_recsys.train(epochs=3, sizes=sizes)
print(f"{'model':<32}{'held-out AUC':>13}{'log loss':>10}")
print(f"{'per-id click rates':<32}{result.baseline_auc:>13.4f}{result.baseline_loss:>10.4f}")
for epoch, (auc, loss) in enumerate(zip(result.eval_auc, result.eval_loss, strict=True), start=1):
    print(f"{f'collection model, epoch {epoch}':<32}{auc:>13.4f}{loss:>10.4f}")

# %%
# Held-out AUC after each epoch against the baseline's; the training loss (a
# running mean over 20 batches) and the held-out loss after each epoch. The
# held-out loss stops falling after the second epoch while the training loss
# keeps falling: with 60 training impressions per user on average, the model
# starts to memorise them.

fig, (ax_auc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4))
epochs = np.arange(1, len(result.eval_auc) + 1)
ax_auc.plot(epochs, result.eval_auc, "o-", label="EmbeddingBagCollection + dots")
ax_auc.axhline(result.baseline_auc, color="gray", ls="--", label="per-id click rates")
ax_auc.set_xticks(epochs)
ax_auc.set_xlabel("epoch")
ax_auc.set_ylabel("held-out AUC")
ax_auc.set_title("held-out AUC")
ax_auc.legend()

smooth = np.convolve(result.losses, np.ones(20) / 20, mode="valid")
ax_loss.plot(smooth, label="collection model, training batches")
ax_loss.plot(epochs * len(result.losses) // len(epochs), result.eval_loss, "o-",
             label="collection model, held out")
ax_loss.axhline(result.baseline_loss, color="gray", ls="--", label="per-id click rates, held out")
ax_loss.set_xlabel("step")
ax_loss.set_ylabel("log loss")
ax_loss.set_title("log loss")
ax_loss.legend()
fig.tight_layout()
plt.show()
