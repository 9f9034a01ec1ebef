"""Captured steps (``numbapos.cuda.capture``) under every memory manager, on the stub driver.

The stub enforces CUDA's stream-capture rules (stubcuda.c): a ``cuMemAlloc``, a
synchronisation or a synchronous copy from the capturing thread fails with
``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`` and invalidates the capture, unless the
thread relaxed its capture mode. A step is captured and replayed in one stub process
per memory manager (capture_checks.py): numbapos's pool; Numba's own manager, chosen
with ``NUMBAPOS_CUDA_MEMORY_POOL=0`` or left in place because Numba made the CUDA
context before numbapos could install the pool; a ``NUMBA_CUDA_MEMORY_MANAGER``
plugin (capture_manager.py). In each a failed capture, by the step's own error or by
a CUDA call the capture refuses, is ended before its error propagates.
"""

import pytest
import stub

# manager: (environment, Numba makes the context first, the manager's class)
MANAGERS = {
    "pool": ({}, False, "CachingMemoryManager"),
    "pool_off": ({"NUMBAPOS_CUDA_MEMORY_POOL": "0"}, False, "NumbaCUDAMemoryManager"),
    "numba_first": ({}, True, "NumbaCUDAMemoryManager"),
    "plugin": ({"NUMBA_CUDA_MEMORY_MANAGER": "capture_manager"}, False, "PlainMemoryManager"),
}


@pytest.fixture(scope="module")
def folder(request, tmp_path_factory):
    pytest.importorskip("numba.cuda")
    pytest.importorskip("cuda.core")
    return stub.built_for(request, tmp_path_factory)


@pytest.fixture(scope="module")
def checks(folder):
    """``checks(manager)``: capture_checks.run_all's results under that manager, from one
    stub process per manager (run when first asked for)."""
    found = {}

    def get(manager):
        if manager not in found:
            env, numba_first, _ = MANAGERS[manager]
            found[manager] = stub.run(
                "import json, capture_checks\n"
                f"print(json.dumps(capture_checks.run_all(numba_first={numba_first})))",
                folder, env=env)
        if found[manager].get("skip"):
            pytest.skip(found[manager]["skip"])
        return found[manager]

    return get


def _no_error(result):
    assert "error" not in result, result.get("error")
    return result


def test_the_stub_enforces_the_capture_rules(folder):
    got = stub.run("import json, capture_checks\n"
                   "print(json.dumps(capture_checks.check_stub_rules()))", folder)
    assert got == {
        # thread_local: the capturing thread's allocation is refused and invalidates it
        "alloc": "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        "status": "CU_STREAM_CAPTURE_STATUS_INVALIDATED",
        "launch_invalidated": "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        "end_invalidated": "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        "status_after": "CU_STREAM_CAPTURE_STATUS_NONE",
        "alloc_after": "CUDA_SUCCESS",
        # relaxed by the thread: allowed; the stream's work is recorded, run by replays
        "mode_before": "CU_STREAM_CAPTURE_MODE_GLOBAL",
        "alloc_relaxed": "CUDA_SUCCESS",
        "end": "CUDA_SUCCESS",
        "byte_before_replay": 0,
        "byte_after_replay": 7,
        "counts": {"launches": 0, "memsets": 1, "captured_launches": 1, "graph_launches": 2,
                   "replayed_launches": 2, "memsets_while_capturing": 1},
        "graphs_alive": 0,
        # global captures bind other threads, thread_local ones do not
        "other_thread_global": "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        "end_other_thread": "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
        "end_global": "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        "other_thread_thread_local": "CUDA_SUCCESS",
        "end_thread_local": "CUDA_SUCCESS",
        # the capturing stream itself is never synchronised
        "sync_capturing_stream": "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        "end_relaxed": "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        "end_not_capturing": "CUDA_ERROR_ILLEGAL_STATE",
        "capturing": 0,
    }


@pytest.mark.parametrize("manager", sorted(MANAGERS))
def test_each_manager_is_the_one_chosen(checks, manager):
    got = checks(manager)
    assert got["manager"] == MANAGERS[manager][2]
    if manager == "plugin":
        assert got["plugin_allocations"] > 0


@pytest.mark.parametrize("manager", sorted(MANAGERS))
def test_a_step_captures_and_replays(checks, manager):
    got = _no_error(checks(manager)["capture"])
    kernels = got["eager_launches"]
    assert kernels > 0
    capture = got["capture"]
    # the warm-up's kernels ran; the graph holds one eager step's; the captured call's
    # own step is the graph's first launch; nothing was refused, nothing synchronised
    # while capturing (the two synchronisations are before the capture begins)
    assert (capture["launches"], capture["captured_launches"], capture["graph_launches"],
            capture["replayed_launches"]) == (kernels, kernels, 1, kernels)
    assert (capture["captures"], capture["refused"], capture["copies_dtoh"]) == (1, 0, 0)
    # three replays: three graph launches of every kernel, and nothing else
    replays = got["replays"]
    assert replays["graph_launches"] == 3
    assert replays["replayed_launches"] == 3 * kernels
    others = {k: v for k, v in replays.items()
              if k not in ("graph_launches", "replayed_launches")}
    assert others == dict.fromkeys(others, 0)
    # no stream left capturing; the executable graph lives with the captured step
    assert (got["capturing"], got["graphs_while_captured"], got["graphs_after"]) == (0, 1, 0)


def test_memory_a_graph_uses_is_kept_while_the_captured_step_lives(checks):
    # Under a manager that frees a block as soon as its array goes (once cleanup is no
    # longer deferred): the blocks allocated while capturing, scratch included, would be
    # freed after the capture and reused while the graph still writes them.
    got = _no_error(checks("plugin")["capture"])
    blocks = got["graph_memory_while_captured"]["blocks"]
    assert blocks > 0
    assert got["graph_memory_while_captured"] == {"blocks": blocks, "freed": 0}
    assert got["graph_memory_after"] == {"blocks": blocks, "freed": blocks}


@pytest.mark.parametrize("manager", sorted(MANAGERS))
@pytest.mark.parametrize("how", ["raise", "sync", "swallow"])
def test_a_failed_capture_is_ended(checks, manager, how):
    got = _no_error(checks(manager)[f"failure_{how}"])
    kind, message = got["raised"]
    if how == "raise":  # the step's own error, as it raised it
        assert (kind, message) == ("KeyError", "\"the step's own error\"")
    elif how == "sync":  # Numba's cuCtxSynchronize, refused by the capture
        assert kind == "RuntimeError"
        assert message.startswith("numbapos.cuda.capture: the step made a CUDA call that a "
                                  "captured step cannot contain ([<CUresult.CUDA_ERROR_STREAM_"
                                  "CAPTURE_UNSUPPORTED: 900>] Call to cuCtxSynchronize")
        assert "the capture was ended and nothing was recorded" in message
    else:  # the same, whose error the step caught: found when the capture ends
        assert kind == "RuntimeError"
        assert message.startswith("numbapos.cuda.capture: a CUDA call of the step that a "
                                  "captured step cannot contain invalidated the capture, and "
                                  "the step did not raise its error (")
        assert "the capture was ended and nothing was recorded" in message
    # while the error is handled: nothing capturing, eager work, a new capture
    assert got["after"] == {"capturing": 0, "refused": 0 if how == "raise" else 2,
                            "numbapos_capturing": False, "current_stream": "0"}
    assert got["eager"]["launches"] > 0
    assert (got["eager"]["syncs"] > 0, got["eager"]["copies_dtoh"], got["eager"]["refused"]) \
        == (True, 1, 0)
    assert got["capture_again"] == {"captures": 1, "graph_launches": 2, "refused": 0}
    assert got["capture_again_kernels"]
    assert got["graphs_leaked"] == 0
