"""The main job, ``python -m numbapos demo``: why a language model needs positions.

A synthetic corpus in which the next token depends on the position: every
sequence follows one pattern, an anchor token ``A`` at even positions and a
position-specific token ``B_k`` at odd position ``2k + 1``, with 10% of the
tokens replaced by random ones. After an ``A`` the next token is ``B_k``, and
which ``k`` only the position says, so a model that sees the current token but
not where it is can do no better than guess among the ``B`` s there.

The model is built only from numbapos parts: an ``Embedding`` whose table is
also the output head (tied through :meth:`~numbapos.nn.Embedding.attend`),
learned or sinusoidal positions (or none), a ``LayerNorm``, trained with
numbapos's ``SGD`` on a softmax cross-entropy written in NumPy. The demo
trains the positional model and the same model without positions on the same
batches and compares their held-out loss and accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import _device, nn, optim
from . import functional as F
from ._grad_mode import no_grad

VOCAB = 48
LENGTH = 24
DIM = 32
BATCH = 32
NOISE = 0.1
ANCHOR = 0
LEARNING_RATE = 0.5
MOMENTUM = 0.9
EVAL_SEQUENCES = 2000
POSITIONS = ("learned", "sinusoidal", "none")


def pattern(length: int = LENGTH) -> np.ndarray:
    """The noiseless sequence of ``length + 1`` tokens: ``A, B_0, A, B_1, ...``."""
    tokens = np.empty(length + 1, dtype=np.int64)
    tokens[0::2] = ANCHOR
    tokens[1::2] = 1 + np.arange(tokens[1::2].size)
    return tokens


def make_batch(rng: np.random.Generator, sequences: int, length: int = LENGTH,
               vocab: int = VOCAB, noise: float = NOISE):
    """``(inputs, targets)`` of shape ``(sequences, length)``: targets are the next tokens."""
    tokens = np.broadcast_to(pattern(length), (sequences, length + 1)).copy()
    noisy = rng.random(tokens.shape) < noise
    tokens[noisy] = rng.integers(0, vocab, int(noisy.sum()))
    return tokens[:, :-1], tokens[:, 1:]


def cross_entropy(logits: np.ndarray, targets: np.ndarray):
    """Mean softmax cross-entropy and its gradient with respect to the logits."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(shifted)
    probs /= probs.sum(axis=-1, keepdims=True)
    picked = np.take_along_axis(probs, targets[..., None], axis=-1)
    loss = float(-np.log(picked).mean())
    grad = probs
    np.put_along_axis(grad, targets[..., None], picked - 1.0, axis=-1)
    grad /= targets.size
    return loss, grad.astype(logits.dtype, copy=False)


class TinyLM:
    """Tied embedding + positions + LayerNorm; logits through the embedding table."""

    def __init__(self, positions: str, seed: int, device: str = "cpu", layer_norm: bool = True,
                 vocab: int = VOCAB, length: int = LENGTH, dim: int = DIM):
        self.device = device
        self.embedding = nn.Embedding(vocab, dim, seed=seed, init=nn.init.normal(0.0, 0.3),
                                      device=device)
        self.positions = {
            "learned": lambda: nn.LearnedPosEmbedding(length, dim, seed=seed + 1, device=device),
            "sinusoidal": lambda: nn.SinusoidalPosEmbedding(device=device),
            "none": lambda: None,
        }[positions]()
        self.norm = nn.LayerNorm(dim, device=device) if layer_norm else None
        self.layers = [m for m in (self.embedding, self.positions, self.norm) if m is not None]

    def parameters(self):
        return [p for module in self.layers for p in module.parameters()]

    def __call__(self, ids):
        h = self.embedding(ids)
        if self.positions is not None:
            h = self.positions(h)
        if self.norm is not None:
            h = self.norm(h)
        return _device.to_host(self.embedding.attend(h))

    def backward(self, grad_logits):
        grad = self.embedding.attend_backward(_device.to_device(grad_logits, self.device))
        if self.norm is not None:
            grad = self.norm.backward(grad)
        if self.positions is not None:
            grad = self.positions.backward(grad)
        self.embedding.backward(grad)

    def position_table(self) -> np.ndarray | None:
        """The position vectors the model adds: learned rows, the sinusoid table, or None."""
        if isinstance(self.positions, nn.LearnedPosEmbedding):
            return _device.to_host(self.positions.weight.data)
        if isinstance(self.positions, nn.SinusoidalPosEmbedding):
            return _device.to_host(F.sinusoidal_pos_embedding(LENGTH, DIM))
        return None


@dataclass
class RunResult:
    """One trained model: its training losses and held-out loss and accuracy."""

    positions: str
    losses: list = field(default_factory=list)
    eval_loss: float = float("nan")
    eval_accuracy: float = float("nan")
    model: TinyLM | None = None


def _label(positions: str) -> str:
    return "no positions" if positions == "none" else f"{positions} positions"


def train(positions: str, steps: int, seed: int, device: str = "cpu", layer_norm: bool = True,
          progress=None, batch: int = BATCH, eval_sequences: int = EVAL_SEQUENCES) -> RunResult:
    """Train one model for ``steps`` SGD steps; the same seed gives the same batches."""
    model = TinyLM(positions, seed, device, layer_norm)
    opt = optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    rng = np.random.default_rng(seed)
    result = RunResult(positions, model=model)
    for _ in range(steps):
        inputs, targets = make_batch(rng, batch)
        loss, grad = cross_entropy(model(inputs), targets)
        opt.zero_grad()
        model.backward(grad)
        opt.step()
        result.losses.append(loss)
        if progress is not None:
            progress(loss)
    for module in model.layers:
        module.eval()
    inputs, targets = make_batch(np.random.default_rng(seed + 10_000), eval_sequences)
    with no_grad():
        logits = model(inputs)
    result.eval_loss = cross_entropy(logits, targets)[0]
    result.eval_accuracy = float((logits.argmax(axis=-1) == targets).mean())
    return result


def plot(path, positional: RunResult, baseline: RunResult) -> None:
    """Write a PNG: position cosine similarities (the model's and the sinusoid's), loss curves."""
    try:
        import matplotlib
    except ImportError as err:
        raise RuntimeError('--plot needs matplotlib: pip install "numbapos[plot]"') from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def cosine(table):
        unit = table / np.linalg.norm(table, axis=1, keepdims=True)
        return unit @ unit.T

    tables = [("sinusoidal table", F.sinusoidal_pos_embedding(LENGTH, DIM, dtype=np.float64))]
    learned = positional.model.position_table()
    if positional.positions == "learned":
        tables.insert(0, ("learned positions", learned))
    fig, axes = plt.subplots(1, len(tables) + 1, figsize=(5 * (len(tables) + 1), 4.2))
    for ax, (title, table) in zip(axes, tables, strict=False):
        image = ax.imshow(cosine(np.asarray(table, np.float64)), vmin=-1, vmax=1, cmap="RdBu_r")
        ax.set_title(f"cosine similarity: {title}")
        ax.set_xlabel("position")
        ax.set_ylabel("position")
        fig.colorbar(image, ax=ax, fraction=0.046)
    ax = axes[-1]
    for result in (positional, baseline):
        ax.plot(result.losses, label=_label(result.positions))
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title("next-token loss")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(steps: int = 300, seed: int = 0, device: str = "cpu", positions: str = "learned",
        layer_norm: bool = True, plot_path=None, show_progress: bool = True) -> int:
    """Train the positional model and the baseline without positions; print the comparison."""
    print(f"numbapos demo on {device}: next-token prediction where the next token depends on "
          f"the position\n  vocabulary {VOCAB}, {LENGTH} tokens per sequence, D = {DIM}, "
          f"batches of {BATCH}, SGD(lr={LEARNING_RATE}, momentum={MOMENTUM}), {steps} steps; "
          "the first steps include Numba's one-time compilation")
    results = []
    for mode in (positions, "none") if positions != "none" else ("none",):
        bar = _progress(steps, f"{_label(mode):>20}", show_progress)
        results.append(train(mode, steps, seed, device, layer_norm, progress=bar.update))
        bar.close()
    print(f"\n  {'model':<22}{'held-out loss':>15}{'accuracy':>11}")
    for result in results:
        print(f"  {_label(result.positions):<22}{result.eval_loss:>15.4f}"
              f"{result.eval_accuracy:>11.3f}")
    if len(results) == 2:
        gain = results[0].eval_accuracy - results[1].eval_accuracy
        verdict = "wins" if gain > 0.1 else "does not clearly win"
        print(f"\n  the model with {positions} positions {verdict}: "
              f"{gain:+.3f} accuracy over the same model without positions")
    if plot_path is not None:
        plot(plot_path, results[0], results[-1])
        print(f"  plot written to {plot_path}")
    return 0


class _progress:
    """A tqdm bar showing the running loss (plain, silent stand-in without tqdm)."""

    def __init__(self, total: int, label: str, show: bool):
        self._bar = None
        if show:
            try:
                from tqdm import tqdm
            except ImportError:
                print(f"  training {label}...")
            else:
                self._bar = tqdm(total=total, desc=f"  {label}", unit="step", leave=True)

    def update(self, loss: float) -> None:
        if self._bar is not None:
            self._bar.set_postfix(loss=f"{loss:.3f}", refresh=False)
            self._bar.update(1)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
