"""The GPU host path's plans (numbapos/_gpuhost/plans.py) on the stub driver.

The checks run in one stub-driver subprocess (plan_checks.py, stub.py): a plan's
replay gives ``cuLaunchKernel`` what the ordinary path gives it for the same
arrays, its outputs are ordinary device arrays, and errors raise as before.
"""

import pytest
import stub

CHECKS = ("check_lookups", "check_outputs", "check_errors", "check_dense_backward",
          "check_sparse_backward", "check_lazy_backward", "check_bert", "check_gpt2",
          "check_threads", "check_streams", "check_budget", "check_native",
          "check_empty_shapes", "check_pool")


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    pytest.importorskip("numba.cuda")
    pytest.importorskip("cuda.bindings")
    folder = stub.built_for(request, tmp_path_factory)
    calls = ", ".join(f'"{name}": plan_checks.{name}()' for name in CHECKS)
    return stub.run("import json, numbapos, plan_checks\n"
                    "numbapos._device.kernels_for('cuda')\n"
                    f"print(json.dumps({{{calls}}}))", folder)


def test_lookups_replay_the_ordinary_launch(results):
    assert results["check_lookups"]["lookups"] == 5
    # out= and allocating, per case: one plan each
    assert results["check_lookups"]["plans"] == 10


def test_planned_outputs_are_ordinary_arrays(results):
    assert results["check_outputs"] == {"outputs": True}


def test_errors_raise_through_plans(results):
    overlap, pending = results["check_errors"]["messages"]
    assert overlap == "out: must not share memory with an input array"
    assert pending.startswith("indices: index 99 (at flat position 5) is out of range for "
                              "num_embeddings=50")


def test_dense_backward_replays_with_a_workspace(results):
    assert results["check_dense_backward"] == {"dense_backwards": 3, "plans": 3}


def test_sparse_backward_replays_into_new_sparse_rows(results):
    assert results["check_sparse_backward"] == {"sparse_backwards": 3, "plans": 3}


def test_lazy_backward_replays_into_new_row_groups(results):
    assert results["check_lazy_backward"] == {"lazy_backwards": 3, "plans": 3}


def test_bert_block_replays_the_ordinary_launches(results):
    assert results["check_bert"] == {"bert": 4, "forward_plans": 4, "backward_plans": 4}


def test_gpt2_block_replays_the_ordinary_launches(results):
    assert results["check_gpt2"] == {"gpt2": 2, "forward_plans": 2, "backward_plans": 2}


def test_two_threads_share_a_plan(results):
    assert results["check_threads"] == {"failures": [], "launches": 400, "each": [200, 200]}


def test_plans_belong_to_their_stream(results):
    assert results["check_streams"] == {"plans": 2, "default stream": 0, "side stream": True}


def test_workspaces_stay_within_the_budget(results):
    assert results["check_budget"] == {"within": True, "planned": True, "started over": True}


def test_one_native_call_launches_what_cuda_bindings_would(results):
    # the lookup's gather, then the dense backward's fill, grouping and sums
    assert results["check_native"] == {"kernels": 4, "same": True, "side stream": True}


def test_empty_batches_keep_their_shapes(results):
    assert results["check_empty_shapes"]["shapes"] == [[1, 0, 6], [2, 0, 6], [3, 0, 6]]



def test_the_pool_lends_blocks_without_a_finalizer_each(results):
    found = results["check_pool"]
    assert found == dict.fromkeys(found, True) and len(found) == 9


def test_signature_numbers_are_never_reused(monkeypatch):
    plans = pytest.importorskip("numbapos._gpuhost.plans")
    monkeypatch.setattr(plans, "MAX_SIGNATURES", 2)
    monkeypatch.setattr(plans, "_INTERNED", {})
    first = plans.interned(("float32", (3, 4)))
    assert plans.interned(("float32", (3, 4))) == first
    second = plans.interned(("float32", (5,)))
    third = plans.interned(("int64", (5,)))  # the table was full: it started over
    again = plans.interned(("float32", (3, 4)))
    assert len({first, second, third, again}) == 4
