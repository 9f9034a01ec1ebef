"""Checks of captured steps (``numbapos.cuda.capture``) on the stub driver, one memory
manager per process (``stub.run``; test_capture_stub.py chooses it).

The stub records the work given to a capturing stream instead of running it and
enforces CUDA's capture rules (stubcuda.c): an allocation, synchronous copy or
synchronisation from the capturing thread fails (``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED``)
and invalidates the capture unless the thread's capture mode was relaxed. So these
checks see, at the driver, what a GPU would do: whether a step captures, what the graph
holds (its kernels against an eager step's), what a replay does, and whether a
failed capture is ended (the stream no longer capturing, eager work and a new capture
possible).
"""

from __future__ import annotations

import gc

import numpy as np

V, D, N = 100, 16, 64


def _step():
    """A training step: sparse lookup, dropout, backward fused with SGD (momentum)."""
    import numbapos
    from numbapos import nn, optim

    rng = np.random.default_rng(3)
    emb = nn.Embedding(V, D, sparse=True, device="cuda")
    drop = nn.Dropout(0.1, seed=4)
    opt = optim.SGD(emb.parameters(), lr=0.01, momentum=0.9)
    opt.fuse_with_backward()
    ids = numbapos.to_device(rng.integers(0, V, N), "cuda")
    grad = numbapos.to_device(np.ones((N, D), np.float32), "cuda")

    def step():
        emb.zero_grad()
        y = drop(emb(ids))
        emb.backward(drop.backward(grad))
        opt.step()
        return y

    return step


def _delta(before: dict, after: dict) -> dict:
    return {name: after[name] - before[name] for name in after
            if name not in ("capturing", "graphs_alive")}


def manager() -> dict:
    """The current context's memory manager, and what the checks' plugin allocated."""
    import sys

    from numba import cuda

    plugin = sys.modules.get("capture_manager")
    return {"manager": type(cuda.current_context().memory_manager).__name__,
            "plugin_allocations": plugin.ALLOCATIONS[0] if plugin else None}


def _graph_memory() -> dict | None:
    """Under the checks' plugin (capture_manager.py): how many blocks it handed out while
    capturing, and how many of them it has freed since."""
    import sys

    plugin = sys.modules.get("capture_manager")
    if plugin is None:
        return None
    gc.collect()
    return {"blocks": len(plugin.CAPTURED), "freed": sum(plugin.CAPTURED.values())}


def check_capture() -> dict:
    """Capture a step and replay it: the graph holds one eager step's kernels, a replay
    launches them all and nothing else; the memory the graph uses stays allocated while
    the captured step lives, and goes with it, as do its graphs."""
    from stub import counters

    import numbapos

    step = _step()
    step()  # compile everything first, so the eager step below is a plain one
    numbapos.synchronize()
    before = counters()
    step()
    eager = _delta(before, counters())
    numbapos.synchronize()
    graphs_before = counters()["graphs_alive"]
    before = counters()
    captured = numbapos.cuda.capture(step)
    captured_now = counters()
    capture = _delta(before, captured_now)
    before = counters()
    for _ in range(3):
        captured.replay()
    replays = _delta(before, counters())
    numbapos.synchronize()
    alive = counters()["graphs_alive"] - graphs_before
    memory = _graph_memory()
    del captured
    gc.collect()
    return {"eager_launches": eager["launches"], "capture": capture, "replays": replays,
            "capturing": captured_now["capturing"], "graphs_while_captured": alive,
            "graphs_after": counters()["graphs_alive"] - graphs_before,
            "graph_memory_while_captured": memory, "graph_memory_after": _graph_memory()}


def _failing(how: str):
    """A step whose captured call fails: raising (``raise``) or making a CUDA call a
    capture refuses, which invalidates it (``sync``: Numba's own synchronisation), and
    raising that call's error or not (``swallow``)."""
    from numba import cuda

    step = _step()
    calls = [0]

    def failing():
        y = step()
        calls[0] += 1
        if calls[0] == 2:  # the captured call (after one warm-up)
            if how == "raise":
                raise KeyError("the step's own error")
            try:
                cuda.synchronize()
            except Exception:
                if how == "sync":
                    raise
        return y

    return failing, step


def check_failure(how: str) -> dict:
    """A failed capture: its error raised, and, while it is being handled (its traceback
    alive), no stream capturing, eager work running and a new capture of the same step
    working; afterwards no graph left."""
    from stub import counters

    import numbapos
    from numbapos._gpuhost import streams

    failing, step = _failing(how)
    graphs_before = counters()["graphs_alive"]
    before = counters()
    found = {"raised": None}
    try:
        numbapos.cuda.capture(failing)
    except Exception as err:  # noqa: BLE001 - the type is what is checked
        found["raised"] = [type(err).__name__, str(err)]
        failed = counters()
        found["after"] = {"capturing": failed["capturing"],
                          "refused": failed["refused"] - before["refused"],
                          "numbapos_capturing": streams.capturing() is not None,
                          "current_stream": repr(numbapos.cuda.current_stream())}
        # eager work on the default stream, a synchronisation, a copy back
        before = counters()
        step()
        numbapos.synchronize()
        numbapos.to_host(numbapos.to_device(np.arange(4.0), "cuda"))
        eager = _delta(before, counters())
        found["eager"] = {k: eager[k] for k in ("launches", "syncs", "copies_dtoh", "refused")}
        before = counters()
        numbapos.cuda.capture(step).replay()
        again = _delta(before, counters())
        found["capture_again"] = {k: again[k] for k in ("captures", "graph_launches",
                                                        "refused")}
        found["capture_again_kernels"] = again["captured_launches"] > 0
    gc.collect()
    found["graphs_leaked"] = counters()["graphs_alive"] - graphs_before
    return found


def _run(check, *args) -> dict:
    """``check(*args)``, or ``{"error": its traceback}`` (each check runs, whatever the
    others did)."""
    import traceback

    try:
        return check(*args)
    except Exception:  # noqa: BLE001 - reported to the test, which shows it
        return {"error": traceback.format_exc(limit=-8)}


def run_all(numba_first: bool = False) -> dict:
    """Every check in this process (whose memory manager the caller chose); with
    ``numba_first`` Numba makes the CUDA context before numbapos's backend loads.
    ``{"skip": reason}`` where numba-cuda cannot compile kernels here (no NVVM)."""
    from numba.cuda.cudadrv import nvvm

    if not nvvm.is_available():
        return {"skip": "NVVM (the CUDA compiler numba-cuda uses) is not installed"}
    if numba_first:
        from numba import cuda

        cuda.current_context()
    import numbapos

    numbapos._device.kernels_for("cuda")
    found = {"capture": _run(check_capture)}
    for how in ("raise", "sync", "swallow"):
        found[f"failure_{how}"] = _run(check_failure, how)
    found.update(manager())
    return found


def check_stub_rules() -> dict:
    """The stub driver's capture rules themselves, through cuda-bindings (what the checks
    above rely on): each call's result, by name."""
    import ctypes
    import threading

    from cuda.bindings import driver as cu
    from stub import counters

    mode = cu.CUstreamCaptureMode
    global_, thread_local, relaxed = (mode.CU_STREAM_CAPTURE_MODE_GLOBAL,
                                      mode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                      mode.CU_STREAM_CAPTURE_MODE_RELAXED)
    cu.cuInit(0)
    cu.cuCtxSetCurrent(cu.cuDevicePrimaryCtxRetain(cu.cuDeviceGet(0)[1])[1])
    stream = cu.cuStreamCreate(1)[1]  # non-blocking
    block = cu.cuMemAlloc(64)[1]
    function = cu.CUfunction(0x123456)
    found = {}

    def name(result):
        return (result[0] if isinstance(result, tuple) else result).name

    def status():
        return cu.cuStreamIsCapturing(stream)[1].name

    def launch():
        return cu.cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, stream, 0, 0)

    def in_thread(call):
        got = []
        worker = threading.Thread(target=lambda: got.append(name(call())))
        worker.start()
        worker.join()
        return got[0]

    # thread_local: an allocation refused, which invalidates the capture until its end
    cu.cuStreamBeginCapture(stream, thread_local)
    found["alloc"] = name(cu.cuMemAlloc(16))
    found["status"] = status()
    found["launch_invalidated"] = name(launch())
    found["end_invalidated"] = name(cu.cuStreamEndCapture(stream))
    found["status_after"] = status()
    found["alloc_after"] = name(cu.cuMemAlloc(16))
    # relaxed by this thread: the allocation runs; work on the stream is recorded
    before = counters()
    cu.cuMemsetD8(block, 0, 64)
    cu.cuStreamBeginCapture(stream, thread_local)
    exchanged = cu.cuThreadExchangeStreamCaptureMode(relaxed)
    found["mode_before"] = exchanged[1].name
    found["alloc_relaxed"] = name(cu.cuMemAlloc(16))
    cu.cuThreadExchangeStreamCaptureMode(exchanged[1])
    launch()
    cu.cuMemsetD8Async(block, 7, 64, stream)
    err, graph = cu.cuStreamEndCapture(stream)
    found["end"] = err.name
    recorded = counters()
    found["byte_before_replay"] = ctypes.c_ubyte.from_address(int(block)).value
    err, graph_exec = cu.cuGraphInstantiate(graph, 0)
    cu.cuGraphLaunch(graph_exec, stream)
    cu.cuGraphLaunch(graph_exec, stream)
    found["byte_after_replay"] = ctypes.c_ubyte.from_address(int(block)).value
    after = counters()
    found["counts"] = {key: after[key] - before[key] for key in (
        "launches", "memsets", "captured_launches", "graph_launches", "replayed_launches")}
    found["counts"]["memsets_while_capturing"] = recorded["memsets"] - before["memsets"]
    cu.cuGraphExecDestroy(graph_exec)
    cu.cuGraphDestroy(graph)
    found["graphs_alive"] = counters()["graphs_alive"]
    # global: other threads (in the default global mode) are refused too; thread_local:
    # they are not; the capture ends in its own thread only
    cu.cuStreamBeginCapture(stream, global_)
    found["other_thread_global"] = in_thread(lambda: cu.cuMemAlloc(16))
    found["end_other_thread"] = in_thread(lambda: cu.cuStreamEndCapture(stream))
    found["end_global"] = name(cu.cuStreamEndCapture(stream))
    cu.cuStreamBeginCapture(stream, thread_local)
    found["other_thread_thread_local"] = in_thread(lambda: cu.cuMemAlloc(16))
    found["end_thread_local"] = name(cu.cuStreamEndCapture(stream))
    # synchronising the capturing stream: refused even to a relaxed capture
    cu.cuStreamBeginCapture(stream, relaxed)
    found["sync_capturing_stream"] = name(cu.cuStreamSynchronize(stream))
    found["end_relaxed"] = name(cu.cuStreamEndCapture(stream))
    found["end_not_capturing"] = name(cu.cuStreamEndCapture(stream))
    found["capturing"] = counters()["capturing"]
    return found
