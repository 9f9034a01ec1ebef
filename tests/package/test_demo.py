"""The main job, ``python -m numbapos demo``: positions must clearly win, reproducibly."""

import numba
import numpy as np
import pytest
from conftest import two_threads

from numbapos import demo
from numbapos.__main__ import main

STEPS = 120


def test_corpus_needs_positions():
    rng = np.random.default_rng(0)
    inputs, targets = demo.make_batch(rng, 500)
    assert inputs.shape == targets.shape == (500, demo.LENGTH)
    np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])
    clean = demo.pattern()
    # After the anchor the next token depends on where the anchor stands.
    after_anchor = {int(clean[t + 1]) for t in range(demo.LENGTH) if clean[t] == demo.ANCHOR}
    assert len(after_anchor) == demo.LENGTH // 2
    assert 0.85 < (inputs == clean[:-1]).mean() < 0.95  # 10% noise


def test_cross_entropy_gradient_matches_finite_differences(rng):
    logits = rng.standard_normal((2, 3, 5))
    targets = rng.integers(0, 5, (2, 3))
    _, grad = demo.cross_entropy(logits.copy(), targets)
    eps = 1e-6
    numeric = np.zeros_like(logits)
    for index in np.ndindex(logits.shape):
        up, down = logits.copy(), logits.copy()
        up[index] += eps
        down[index] -= eps
        numeric[index] = (demo.cross_entropy(up, targets)[0]
                          - demo.cross_entropy(down, targets)[0]) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_positional_model_clearly_wins(positions):
    with_positions = demo.train(positions, STEPS, seed=0, eval_sequences=300)
    without = demo.train("none", STEPS, seed=0, eval_sequences=300)
    assert with_positions.eval_accuracy > 0.8
    assert without.eval_accuracy < 0.6
    assert with_positions.eval_loss < without.eval_loss - 0.5


def test_same_seed_same_numbers_on_any_thread_count():
    threads = two_threads()
    before = numba.get_num_threads()
    runs = []
    try:
        for n in (1, threads):
            numba.set_num_threads(n)
            runs.append(demo.train("learned", 40, seed=3, eval_sequences=100))
    finally:
        numba.set_num_threads(before)
    assert runs[0].losses == runs[1].losses
    assert runs[0].eval_accuracy == runs[1].eval_accuracy


@pytest.mark.parametrize("device", ["cuda"], indirect=True)
def test_runs_on_cuda(device):
    result = demo.train("learned", 2, seed=0, device=device, layer_norm=False, batch=2,
                        eval_sequences=2)
    cpu = demo.train("learned", 2, seed=0, layer_norm=False, batch=2, eval_sequences=2)
    np.testing.assert_allclose(result.losses, cpu.losses, rtol=1e-5)


def test_command_line_prints_the_comparison(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    plot = tmp_path / "demo.png"
    assert main(["demo", "--steps", "30", "--no-progress", "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "learned" in out and "no positions" in out and "held-out loss" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("args, message", [
    (["--steps", "0"], "argument --steps: expected a positive integer, got 0"),
    (["--steps", "x"], "argument --steps: expected a positive integer, got 'x'"),
    (["--seed", "-1"], "argument --seed: expected an integer >= 0, got -1"),
    (["--device", "tpu"], "argument --device: invalid choice"),
    (["--positions", "rotary"], "argument --positions: invalid choice"),
])
def test_bad_arguments_are_argparse_errors(capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("numbapos ")
