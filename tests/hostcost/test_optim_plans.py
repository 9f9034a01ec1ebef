"""The planned sparse SGD step and the BERT block's own dropout draw on the stub driver
(optim_plan_checks.py, run in one stub-driver subprocess)."""

import pytest
import stub

CHECKS = ("check_sparse_sgd", "check_sparse_sgd_errors", "check_sparse_sgd_streams",
          "check_optimizer_checks", "check_fused_replays", "check_bert_draw")


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    pytest.importorskip("numba.cuda")
    pytest.importorskip("cuda.bindings")
    folder = stub.built_for(request, tmp_path_factory)
    calls = ", ".join(f'"{name}": optim_plan_checks.{name}()' for name in CHECKS)
    return stub.run("import json, numbapos, optim_plan_checks\n"
                    "numbapos._device.kernels_for('cuda')\n"
                    f"print(json.dumps({{{calls}}}))", folder)


def test_sparse_sgd_replays_the_ordinary_launches(results):
    # one plan, kept when the learning rate changes; momentum 0 gets its own
    assert results["check_sparse_sgd"] == {"same": [True, True], "plans": 1, "after": 2}


def test_sparse_sgd_errors_raise_through_plans(results):
    buffer, flags, momentum, pending = results["check_sparse_sgd_errors"]["messages"]
    assert buffer.startswith("ValueError: momentum_buffer:") and "share memory" in buffer
    assert flags.startswith("ValueError: row_started:")
    assert momentum.startswith("TypeError: momentum: expected a real number")
    assert pending.startswith("IndexError: indices: index 99 (at flat position 5) is out of "
                              "range for num_embeddings=40")


def test_sparse_sgd_plans_belong_to_their_stream(results):
    assert results["check_sparse_sgd_streams"] == {"plans": 2, "default stream": [0],
                                                  "side stream": True}


def test_optimizer_checks_still_refuse_changed_state(results):
    found = results["check_optimizer_checks"]
    assert found["memo"] == 1
    assert found["message"].startswith("param.data: shape (60, 8)") \
        and "momentum buffer was made for shape (61, 8)" in found["message"]


def test_fused_sgd_steps_replay_while_nothing_they_read_changed(results):
    assert results["check_fused_replays"] == {
        "first": [False, False, True], "same": True, "rate": [True, 0.05],
        "momentum": [False, True, True], "loaded": False, "old table kept": False,
        "new table": [False, True]}


def test_bert_block_draws_its_dropout_counter_in_its_plan(results):
    # the draw and the forward: one plan's two launches, the drawn counter in the block of
    # the outputs; four forwards: the module's counter and the device counter's host count
    assert results["check_bert_draw"] == {"launches": 2, "in the block": True,
                                          "counters": [4, 4], "plans": 1}
