"""``python -m numbapos demo --task recsys``: the collection model must clearly beat the
per-id click rates, reproducibly."""

import numba
import numpy as np
import pytest
from conftest import two_threads

from numbapos import demo_recsys
from numbapos.__main__ import main

SMALL = demo_recsys.Sizes(users=500, items=200, train=20_000, eval=4_000, batch=256)
TINY = demo_recsys.Sizes(users=60, items=40, train=600, eval=300, batch=128)


def test_impressions_and_their_keyed_jagged_layout():
    world = demo_recsys.make_world(0, 50, 30)
    data = demo_recsys.make_impressions(world, 40, seed=1)
    lengths = np.diff(data.history_offsets)
    assert lengths.min() >= demo_recsys.HISTORY[0] and lengths.max() < demo_recsys.HISTORY[1]
    for i in range(len(data)):  # a history is its user's, weighted by recency
        bag = slice(data.history_offsets[i], data.history_offsets[i + 1])
        np.testing.assert_array_equal(data.history[bag], world.history[data.user[i]])
        np.testing.assert_allclose(data.history_weights[bag].sum(), 1.0, rtol=1e-6)
        assert (np.diff(data.history_weights[bag]) < 0).all()
    np.testing.assert_array_equal(data.category, world.category[data.item])
    rows = np.array([7, 2, 2, 30])
    part = data.take(rows)
    for k, i in enumerate(rows):
        np.testing.assert_array_equal(
            part.history[part.history_offsets[k]:part.history_offsets[k + 1]],
            data.history[data.history_offsets[i]:data.history_offsets[i + 1]])
    kjt = demo_recsys.to_kjt(part)
    assert kjt.keys() == list(demo_recsys.FEATURES)
    assert kjt.stride() == 4
    np.testing.assert_array_equal(kjt["user"].values(), data.user[rows])
    np.testing.assert_array_equal(kjt["category"].values(), data.category[rows])
    np.testing.assert_array_equal(kjt["history"].values(), part.history)
    np.testing.assert_array_equal(kjt["history"].weights(), part.history_weights.astype(np.float32))
    np.testing.assert_array_equal(kjt["item"].weights(), np.ones(4, np.float32))


def test_auc_is_the_fraction_of_ordered_pairs(rng):
    scores = rng.integers(0, 5, 60).astype(np.float64)  # many ties
    labels = (rng.random(60) < 0.4).astype(np.float64)
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = (pos[:, None] > neg[None]).mean() + 0.5 * (pos[:, None] == neg[None]).mean()
    assert demo_recsys.auc(scores, labels) == pytest.approx(pairs, rel=1e-12)
    assert demo_recsys.auc(-scores, labels) == pytest.approx(1 - pairs, rel=1e-12)


def test_log_loss():
    y = np.array([1.0, 0.0, 1.0])
    p = np.array([0.9, 0.2, 0.5])
    assert demo_recsys.log_loss(p, y) == pytest.approx(-np.mean(np.log([0.9, 0.8, 0.5])))


def test_model_gradient_matches_finite_differences():
    """The interaction layer's backward, through the collection, against the loss itself."""
    world = demo_recsys.make_world(0, 30, 20)
    data = demo_recsys.make_impressions(world, 6, seed=1)
    kjt = demo_recsys.to_kjt(data, np.float64)
    model = demo_recsys.ClickModel(0, 30, 20, dim=4, dtype=np.float64)
    params = [*model.collection.parameters(), *model.dense_parameters()]

    def loss():
        from numbapos import no_grad

        with no_grad():
            return float(np.sum(np.sin(model(kjt))))  # any smooth function of the logits

    logits = model(kjt)
    model.backward(np.cos(logits))
    for param in params:
        grad = param.grad if isinstance(param.grad, np.ndarray) else param.grad.to_dense()
        data_ = param.data
        flat = data_.reshape(-1)
        for index in np.flatnonzero(np.abs(grad.reshape(-1)) > 0)[:6]:
            keep = flat[index]
            flat[index] = keep + 1e-6
            up = loss()
            flat[index] = keep - 1e-6
            down = loss()
            flat[index] = keep
            assert grad.reshape(-1)[index] == pytest.approx((up - down) / 2e-6, rel=1e-5,
                                                             abs=1e-9)


def test_collection_model_clearly_beats_the_click_rates():
    result = demo_recsys.train(epochs=3, seed=0, sizes=SMALL)
    assert 0.55 < result.baseline_auc < 0.65  # popularity is some signal, not much
    assert result.eval_auc[-1] > result.baseline_auc + 0.12
    assert result.eval_loss[-1] < result.baseline_loss - 0.05
    assert len(result.losses) == 3 * -(-SMALL.train // SMALL.batch)


def test_same_seed_same_numbers_on_any_thread_count(parallel_threshold):
    threads = two_threads()
    before = numba.get_num_threads()
    runs = []
    try:
        parallel_threshold(1 << 40)  # the serial kernels
        runs.append(demo_recsys.train(epochs=2, seed=3, sizes=TINY))
        parallel_threshold(1)        # the parallel kernels, on 1 and on 2 threads
        for n in (1, threads):
            numba.set_num_threads(n)
            runs.append(demo_recsys.train(epochs=2, seed=3, sizes=TINY))
    finally:
        numba.set_num_threads(before)
    for run in runs[1:]:
        assert run.losses == runs[0].losses
        assert run.eval_auc == runs[0].eval_auc
        assert run.eval_loss == runs[0].eval_loss
        for a, b in zip(run.model.collection.parameters(), runs[0].model.collection.parameters(),
                        strict=True):
            np.testing.assert_array_equal(a.data, b.data)


def test_command_line_prints_the_comparison(capsys, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(demo_recsys, "SIZES", TINY)
    plot = tmp_path / "recsys.png"
    assert main(["demo", "--task", "recsys", "--epochs", "2", "--no-progress",
                 "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "per-id click rates" in out and "EmbeddingBagCollection" in out
    assert "held-out AUC" in out and "2 epochs" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_language_model_stays_the_default(monkeypatch):
    calls = []
    monkeypatch.setattr("numbapos.demo.run", lambda *args, **kwargs: calls.append("lm") or 0)
    monkeypatch.setattr(demo_recsys, "run", lambda *args, **kwargs: calls.append("rec") or 0)
    assert main(["demo", "--no-progress"]) == 0
    assert main(["demo", "--task", "lm", "--no-progress"]) == 0
    assert main(["demo", "--task", "recsys", "--no-progress"]) == 0
    assert calls == ["lm", "lm", "rec"]


@pytest.mark.parametrize("args, message", [
    (["--task", "ads"], "argument --task: invalid choice"),
    (["--task", "recsys", "--epochs", "0"],
     "argument --epochs: expected a positive integer, got 0"),
    (["--task", "recsys", "--steps", "10"], "--steps: only with --task lm"),
    (["--task", "recsys", "--positions", "none"], "--positions: only with --task lm"),
    (["--task", "recsys", "--no-layer-norm"], "--layer-norm: only with --task lm"),
    (["--epochs", "2"], "--epochs: only with --task recsys"),
])
def test_bad_arguments_are_argparse_errors(capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("device", ["cuda"], indirect=True)
def test_runs_on_cuda(device):
    sizes = demo_recsys.Sizes(users=20, items=12, train=64, eval=32, batch=32)
    result = demo_recsys.train(epochs=1, seed=0, sizes=sizes, device=device)
    cpu = demo_recsys.train(epochs=1, seed=0, sizes=sizes)
    np.testing.assert_allclose(result.losses, cpu.losses, rtol=1e-5)
    np.testing.assert_allclose(result.eval_loss, cpu.eval_loss, rtol=1e-5)
