"""``python -m numbapos demo --task recsys``: a click model needs feature interactions.

Synthetic impressions (user, item) with a click or not. Every user has a
hidden taste vector and every item a hidden profile, drawn around the
profile of its category; the click's log-odds are the dot product of taste
and profile plus a small popularity term per user and per item. Each user
comes with a history: a bag of items they liked before, drawn by taste, and
weighted by recency. A model that sees only how often each id was clicked
(the baseline: logistic regression on smoothed per-id click rates) captures
the popularity terms and nothing of the taste, which only the interaction of
the user's (or their history's) vector with the item's says.

The click model is DLRM-style and built on numbapos's collections: an
:class:`~numbapos.nn.EmbeddingBagCollection` pools the features ``user``,
``item``, ``category`` and the multi-id ``history`` (one bag of several ids
per impression, recency weights, sum pooling) from a
:class:`~numbapos.jagged.KeyedJaggedArray`; the pairwise dot products of the pooled
vectors and the vectors themselves feed a logistic output layer written in
NumPy. The tables are trained with :class:`~numbapos.optim.RowWiseAdagrad`
fused into the backward pass (``opt.fuse_with_backward()``), the output layer
with :class:`~numbapos.optim.Adagrad`. The demo prints held-out AUC and log
loss of both models.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import _device, nn, optim
from ._grad_mode import no_grad
from .demo import _progress
from .jagged import KeyedJaggedArray
from .nn.collection import EmbeddingBagCollection, EmbeddingBagConfig

CATEGORIES = 24
TASTE_DIM = 8
HISTORY = (4, 12)          # a history holds 4 to 11 items
RECENCY = 0.85             # the j-th most recent history item weighs RECENCY ** j (normalised)
HISTORY_FOCUS = 8.0        # how closely a history follows its user's taste
TASTE_SCALE = 2.2
BIAS_SCALE = 0.5
CLICK_OFFSET = -1.3
DIM = 16
EPOCHS = 3
TABLE_LR = 0.1
DENSE_LR = 0.05
SMOOTHING = 20.0           # pseudo-impressions at the global rate behind each per-id rate
FEATURES = ("user", "item", "category", "history")


@dataclass(frozen=True)
class Sizes:
    """How many users, items and impressions; the batch size."""

    users: int = 4000
    items: int = 800
    train: int = 300_000
    eval: int = 20_000
    batch: int = 512


SIZES = Sizes()   # the command line's


@dataclass
class World:
    """The hidden truth every impression is drawn from."""

    taste: np.ndarray          # (users, TASTE_DIM)
    profile: np.ndarray        # (items, TASTE_DIM), unit rows
    category: np.ndarray       # (items,) int64
    user_bias: np.ndarray      # (users,)
    item_bias: np.ndarray      # (items,)
    popularity: np.ndarray     # (items,) probabilities of being shown
    history: list              # per user: int64 array of item ids, most recent first


def make_world(seed: int, users: int = SIZES.users, items: int = SIZES.items) -> World:
    """Draw tastes, item profiles around their category's, popularity and histories."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((CATEGORIES, TASTE_DIM))
    category = rng.integers(0, CATEGORIES, items)
    profile = 0.8 * centres[category] + 0.6 * rng.standard_normal((items, TASTE_DIM))
    profile /= np.linalg.norm(profile, axis=1, keepdims=True)
    taste = rng.standard_normal((users, TASTE_DIM)) / np.sqrt(TASTE_DIM)
    popularity = 1.0 / np.arange(1, items + 1) ** 0.8
    popularity = rng.permutation(popularity / popularity.sum())
    history = []
    for u in range(users):
        liked = np.exp(HISTORY_FOCUS * profile @ taste[u])
        size = int(rng.integers(*HISTORY))
        history.append(rng.choice(items, size, replace=False, p=liked / liked.sum()))
    return World(taste, profile, category.astype(np.int64),
                 BIAS_SCALE * rng.standard_normal(users), BIAS_SCALE * rng.standard_normal(items),
                 popularity, history)


@dataclass
class Impressions:
    """Impressions as flat arrays: ids, the history bags (CSR) and the clicks."""

    user: np.ndarray
    item: np.ndarray
    category: np.ndarray
    history: np.ndarray        # every impression's history ids, one after another
    history_weights: np.ndarray
    history_offsets: np.ndarray  # (n + 1,): impression i's bag is history[o[i]:o[i + 1]]
    click: np.ndarray          # (n,) float64, 0 or 1

    def __len__(self) -> int:
        return self.user.size

    def take(self, rows: np.ndarray) -> Impressions:
        """The impressions at ``rows`` (sorted or not), history bags kept whole."""
        starts, ends = self.history_offsets[rows], self.history_offsets[rows + 1]
        lengths = ends - starts
        offsets = np.zeros(rows.size + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        picked = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
        return Impressions(self.user[rows], self.item[rows], self.category[rows],
                           self.history[picked], self.history_weights[picked], offsets,
                           self.click[rows])


def make_impressions(world: World, count: int, seed: int) -> Impressions:
    """``count`` impressions: uniform users, items by popularity, clicks by the hidden model."""
    rng = np.random.default_rng(seed)
    users = world.taste.shape[0]
    user = rng.integers(0, users, count)
    item = rng.choice(world.item_bias.size, count, p=world.popularity)
    logit = (TASTE_SCALE * np.sqrt(TASTE_DIM) * np.einsum("nk,nk->n", world.taste[user],
                                                          world.profile[item])
             + world.user_bias[user] + world.item_bias[item] + CLICK_OFFSET)
    click = (rng.random(count) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float64)
    bags = [world.history[u] for u in user]
    lengths = np.array([bag.size for bag in bags], np.int64)
    offsets = np.zeros(count + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    history = np.concatenate(bags).astype(np.int64)
    weights = np.concatenate([_recency(bag.size) for bag in bags])
    return Impressions(user.astype(np.int64), item.astype(np.int64), world.category[item],
                       history, weights, offsets, click)


def _recency(size: int) -> np.ndarray:
    """Weights of a history of ``size`` items, most recent first, summing to 1."""
    weights = RECENCY ** np.arange(size)
    return weights / weights.sum()


def to_kjt(batch: Impressions, dtype=np.float32):
    """The batch as a KeyedJaggedArray: keys user, item, category, history (key-major).

    The single-id features get weight 1, the history its recency weights
    (of ``dtype``, the tables').
    """
    n = len(batch)
    ones = np.ones(n, np.int64)
    values = np.concatenate([batch.user, batch.item, batch.category, batch.history])
    lengths = np.concatenate([ones, ones, ones, np.diff(batch.history_offsets)])
    weights = np.concatenate([np.ones(3 * n, dtype), batch.history_weights.astype(dtype)])
    return KeyedJaggedArray(list(FEATURES), values, lengths=lengths, weights=weights)


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    """Mean binary cross-entropy of probabilities ``p`` for labels ``y``."""
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (the Mann-Whitney statistic, ties counted half)."""
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(scores.size)
    sorted_scores = scores[order]
    # Average ranks over ties.
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_scores)) + 1]
    ends = np.r_[starts[1:], scores.size]
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    positives = labels > 0.5
    n_pos = int(positives.sum())
    n_neg = labels.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))


class ClickModel:
    """Pooled embeddings of the features, their pairwise dots and a logistic output.

    ``logit = w_e . concat(pooled) + w_d . dots + b`` where ``dots`` holds
    ``<pooled_f, pooled_g>`` for every pair of features f < g (DLRM's
    interaction layer, without its MLPs). The collection lives on ``device``;
    the output layer is NumPy on the host.
    """

    def __init__(self, seed: int, users: int = SIZES.users, items: int = SIZES.items,
                 dim: int = DIM, dtype=np.float32, device: str = "cpu"):
        tables = [
            EmbeddingBagConfig("t_user", users, dim, ["user"]),
            EmbeddingBagConfig("t_item", items, dim, ["item"]),
            EmbeddingBagConfig("t_category", CATEGORIES, dim, ["category"]),
            EmbeddingBagConfig("t_history", items, dim, ["history"]),
        ]
        self.device = device
        self.collection = EmbeddingBagCollection(tables, is_weighted=True, dtype=dtype,
                                                 device=device, seed=seed)
        features = len(FEATURES)
        self.pairs = np.triu_indices(features, k=1)
        self.dim = dim
        rng = np.random.default_rng(seed)
        width = features * dim + self.pairs[0].size
        self.weight = nn.Parameter((0.1 * rng.standard_normal(width)).astype(dtype))
        self.bias = nn.Parameter(np.zeros(1, dtype))
        self._saved = None

    def dense_parameters(self):
        """The output layer's weight and bias (the tables are ``collection.parameters()``)."""
        return [self.weight, self.bias]

    def __call__(self, kjt) -> np.ndarray:
        """The click logits of a batch (a KeyedJaggedArray on the host), shape ``(n,)``."""
        if self.device != "cpu":
            kjt = kjt.to(self.device)
        flat = _device.to_host(self.collection(kjt).values())
        pooled = flat.reshape(flat.shape[0], -1, self.dim)
        dots = np.einsum("nfd,ngd->nfg", pooled, pooled)[:, self.pairs[0], self.pairs[1]]
        inputs = np.concatenate([flat, dots], axis=1)
        self._saved = (pooled, inputs)
        return inputs @ self.weight.data + self.bias.data[0]

    def backward(self, grad_logit: np.ndarray) -> None:
        """Gradients of the output layer, then the collection's (tables updated there)."""
        pooled, inputs = self._saved
        self._saved = None
        dtype = self.weight.dtype
        grad_logit = grad_logit.astype(dtype)
        self.weight.accumulate_grad(grad_logit @ inputs, fresh=True)
        self.bias.accumulate_grad(np.array([grad_logit.sum()], dtype), fresh=True)
        features = pooled.shape[1]
        w_dots = np.zeros((features, features), dtype)
        w_dots[self.pairs] = self.weight.data[features * self.dim:]
        w_dots = w_dots + w_dots.T
        grad_pooled = (self.weight.data[:features * self.dim].reshape(features, self.dim)[None]
                       * grad_logit[:, None, None])
        grad_pooled += np.einsum("fg,ngd->nfd", w_dots, pooled) * grad_logit[:, None, None]
        grad_pooled = grad_pooled.reshape(grad_logit.size, -1)
        self.collection.backward(_device.to_device(grad_pooled, self.device))


@dataclass
class RecsysResult:
    """The trained click model and the baseline, on held-out impressions."""

    losses: list = field(default_factory=list)       # training log loss per step
    eval_auc: list = field(default_factory=list)     # held-out AUC after each epoch
    eval_loss: list = field(default_factory=list)    # held-out log loss after each epoch
    baseline_auc: float = float("nan")
    baseline_loss: float = float("nan")
    model: ClickModel | None = None


def _predict(model: ClickModel, data: Impressions, batch: int) -> np.ndarray:
    out = np.empty(len(data))
    with no_grad():
        for start in range(0, len(data), batch):
            rows = np.arange(start, min(start + batch, len(data)))
            out[rows] = _sigmoid(model(to_kjt(data.take(rows))).astype(np.float64))
    return out


class RateBaseline:
    """Logistic regression on the smoothed click rates of the user, item and category ids.

    Each id's rate is ``(clicks + SMOOTHING * p) / (impressions + SMOOTHING)``
    with ``p`` the global rate; on the training impressions the impression's
    own click is left out of its rates (leave-one-out), so the regression is
    not fitted to rates that contain its labels. Fitted by Newton's method.
    """

    def __init__(self, train: Impressions):
        self.prior = float(train.click.mean())
        self.counts = {}
        for name in ("user", "item", "category"):
            ids = getattr(train, name)
            size = int(ids.max()) + 1
            self.counts[name] = (np.bincount(ids, train.click, size),
                                 np.bincount(ids, minlength=size).astype(np.float64))
        x = self._features(train, leave_out=train.click)
        self.coef = np.zeros(x.shape[1])
        for _ in range(25):
            p = _sigmoid(x @ self.coef)
            hessian = (x * (p * (1 - p))[:, None]).T @ x + 1e-6 * np.eye(x.shape[1])
            self.coef -= np.linalg.solve(hessian, x.T @ (p - train.click))

    def _features(self, data: Impressions, leave_out=None) -> np.ndarray:
        columns = [np.ones(len(data))]
        for name, (clicks, shown) in self.counts.items():
            ids = getattr(data, name)
            inside = ids < clicks.size
            c, n = np.zeros(len(data)), np.zeros(len(data))
            c[inside], n[inside] = clicks[ids[inside]], shown[ids[inside]]
            if leave_out is not None:
                c, n = c - leave_out, n - 1
            rate = (c + SMOOTHING * self.prior) / (n + SMOOTHING)
            columns.append(np.log(rate / (1 - rate)))
        return np.stack(columns, axis=1)

    def predict(self, data: Impressions) -> np.ndarray:
        """Click probabilities of ``data``'s impressions."""
        return _sigmoid(self._features(data) @ self.coef)


def train(epochs: int = EPOCHS, seed: int = 0, sizes: Sizes | None = None,
          device: str = "cpu", progress=None) -> RecsysResult:
    """Fit the baseline and train the click model on the same impressions.

    ``sizes`` defaults to :data:`SIZES`. The same seed gives the same
    numbers, on any thread count.
    """
    sizes = SIZES if sizes is None else sizes
    world = make_world(seed, sizes.users, sizes.items)
    train_set = make_impressions(world, sizes.train, seed + 1)
    eval_set = make_impressions(world, sizes.eval, seed + 2)
    baseline = RateBaseline(train_set)
    p = baseline.predict(eval_set)
    result = RecsysResult(baseline_auc=auc(p, eval_set.click),
                          baseline_loss=log_loss(p, eval_set.click))
    model = result.model = ClickModel(seed, sizes.users, sizes.items, device=device)
    tables = optim.RowWiseAdagrad(model.collection.parameters(), lr=TABLE_LR)
    tables.fuse_with_backward()   # each table updated inside the collection's backward
    dense = optim.Adagrad(model.dense_parameters(), lr=DENSE_LR)
    rng = np.random.default_rng(seed + 3)
    for _ in range(epochs):
        order = rng.permutation(sizes.train)
        for start in range(0, sizes.train, sizes.batch):
            data = train_set.take(order[start:start + sizes.batch])
            prob = _sigmoid(model(to_kjt(data)).astype(np.float64))
            dense.zero_grad()
            model.backward((prob - data.click) / len(data))
            dense.step()
            result.losses.append(log_loss(prob, data.click))
            if progress is not None:
                progress(result.losses[-1])
        p = _predict(model, eval_set, 4096)
        result.eval_auc.append(auc(p, eval_set.click))
        result.eval_loss.append(log_loss(p, eval_set.click))
    return result


def plot(path, result: RecsysResult) -> None:
    """Write a PNG: training loss per step, held-out AUC per epoch against the baseline."""
    try:
        import matplotlib
    except ImportError as err:
        raise RuntimeError('--plot needs matplotlib: pip install "numbapos[plot]"') from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_auc) = plt.subplots(1, 2, figsize=(10, 4))
    epochs = np.arange(1, len(result.eval_auc) + 1)
    ax_loss.plot(result.losses, label="click model, training batches", lw=0.6, alpha=0.7)
    ax_loss.plot(epochs * len(result.losses) // len(epochs), result.eval_loss, "o-",
                 label="click model, held out (after each epoch)")
    ax_loss.axhline(result.baseline_loss, color="gray", ls="--", label="rate baseline, held out")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("log loss")
    ax_loss.set_title("log loss")
    ax_loss.legend()
    ax_auc.plot(epochs, result.eval_auc, "o-", label="click model")
    ax_auc.axhline(result.baseline_auc, color="gray", ls="--", label="rate baseline")
    ax_auc.set_xticks(epochs)
    ax_auc.set_xlabel("epoch")
    ax_auc.set_ylabel("held-out AUC")
    ax_auc.set_title("held-out AUC")
    ax_auc.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(epochs: int = EPOCHS, seed: int = 0, device: str = "cpu", plot_path=None,
        show_progress: bool = True) -> int:
    """Fit the baseline, train the click model on :data:`SIZES`, print the comparison."""
    sizes = SIZES
    print(f"numbapos recommender demo on {device}: clicks that depend on user x item "
          f"interactions\n  {sizes.users} users, {sizes.items} items, {CATEGORIES} categories, "
          f"histories of {HISTORY[0]}-{HISTORY[1] - 1} items; {sizes.train} training and "
          f"{sizes.eval} held-out impressions\n  EmbeddingBagCollection of {', '.join(FEATURES)} "
          f"(D = {DIM}), pairwise dots, logistic output\n  RowWiseAdagrad(lr={TABLE_LR}) fused "
          f"into the backward, batches of {sizes.batch}, {epochs} epochs; the first steps "
          "include Numba's one-time compilation")
    steps = epochs * -(-sizes.train // sizes.batch)
    bar = _progress(steps, f"{'click model':>12}", show_progress)
    result = train(epochs, seed, sizes, device, progress=bar.update)
    bar.close()
    print(f"\n  {'model':<36}{'held-out AUC':>13}{'log loss':>10}")
    print(f"  {'per-id click rates (baseline)':<36}{result.baseline_auc:>13.4f}"
          f"{result.baseline_loss:>10.4f}")
    print(f"  {'EmbeddingBagCollection + dots':<36}{result.eval_auc[-1]:>13.4f}"
          f"{result.eval_loss[-1]:>10.4f}")
    gain = result.eval_auc[-1] - result.baseline_auc
    verdict = "wins" if gain > 0.05 else "does not clearly win"
    print(f"\n  the click model {verdict}: {gain:+.4f} AUC over the per-id click rates")
    if plot_path is not None:
        plot(plot_path, result)
        print(f"  plot written to {plot_path}")
    return 0
