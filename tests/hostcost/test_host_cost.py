"""Host cost of the CUDA ops, gated without a GPU: numbapos's real CUDA host path against
the stub driver (stub.py, stubcuda.c).

Every case of :mod:`numbapos.bench.hostcost` runs in one subprocess (kernels compiled
once). Per op, launches and device allocations must equal the table exactly, and
Python calls stay within 10 % of it: a change that adds a launch, an allocation or
much host Python fails here. Fewer launches or allocations fail too, so that the
table follows an improvement. Host microseconds are shown in the test summary and
held to issue 36's targets, each case measured again before it fails, as this is a timing
on a shared machine.
"""

import pytest
import stub

pytestmark = pytest.mark.slow  # one subprocess compiling every case's kernels: about 15 s

# op: (launches, allocations, Python calls) today, then issue 36's targets
# (launches, allocations, host microseconds on the stub driver)
EXPECTED = {
    "lookup into out=": (1, 0, 6, 1, 0, 10),
    "lookup, allocating its output": (1, 1, 12, 1, 1, 15),
    "sparse backward": (2, 2, 22, 3, 2, 40),
    "dense backward": (3, 1, 12, 4, 2, 40),
    # 32,768 ids: "about five" launches (onesweep: a launch per radix pass, three more,
    # then the sum); the issue sets no host time for it: the smaller backward's target
    "sparse backward, 8 batches of ids": (6, 2, 22, 6, 2, 40),
    "BERT module forward (training, dropout 0.1)": (2, 1, 22, 2, 2, 30),
    "BERT module forward + backward": (9, 3, 69, 10, 6, 200),
    "fused sparse SGD step (momentum 0.9)": (5, 2, 62, 6, 3, 80),
}
PYTHON_MARGIN = 1.10
CALLS = 200
# A case over its target is measured again in a new process, at most so often: the machine
# may be busy (CI's other pytest worker), and a process can land in a slow memory layout
# (the same tree measured 28 or 38 us for the BERT forward, process to process).
REMEASURES = 4


@pytest.fixture(scope="module")
def folder(request, tmp_path_factory):
    pytest.importorskip("numba.cuda")
    pytest.importorskip("cuda.bindings")
    pytest.importorskip("cuda.core")
    return stub.built_for(request, tmp_path_factory)


def _measure(folder, only=None, calls=CALLS):
    result = stub.run(f"import json, stub; print(json.dumps(stub.measure_all({calls}, "
                      f"{only!r})))", folder)
    if "skip" in result:
        pytest.skip(result["skip"])
    return result


@pytest.fixture(scope="module")
def measured(request, folder):
    result = _measure(folder)
    request.config.stash[stub.SUMMARY] = _summary(result)
    return result


def _summary(result) -> str:
    """The bench's table, then this run's EXPECTED (to paste when a change is meant)."""
    rows = []
    for cost in result["costs"]:
        goals = EXPECTED.get(cost["name"], (None,) * 6)[3:]
        today = (cost["driver"]["launches"], cost["allocations"], cost["python_calls"])
        name = '"' + cost["name"] + '"'
        rows.append(f"    {name}: {tuple(int(v) for v in today) + goals},")
    return (f"{result['table']}\n(on the stub driver, '{result['device']}': no kernel runs)\n"
            "EXPECTED as measured (today's launches, allocations, Python calls; then issue "
            "36's targets: launches, allocations, host us):\n" + "\n".join(rows))


def _cost(measured, name):
    assert not measured["errors"], measured["errors"]
    costs = {cost["name"]: cost for cost in measured["costs"]}
    assert name in costs, f"{name!r} was not measured; measured: {sorted(costs)}"
    return costs[name]


def _described(cost, expected) -> str:
    launches, allocations, python_calls, goal_launches, goal_allocations, goal_us = expected
    return (f"{cost['name']}: {cost['driver']['launches']:g} launches ({cost['launches']:g} "
            f"counted by numbapos; table {launches}, target {goal_launches}), "
            f"{cost['allocations']:g} allocations (table {allocations}, target "
            f"{goal_allocations}), {cost['python_calls']} Python calls (table {python_calls}), "
            f"{cost['host_us']:.1f} us on the host (target {goal_us}); driver: {cost['driver']}")


def test_every_case_has_a_row():
    from numbapos.bench import hostcost

    assert [case.name for case in hostcost.cases()] == list(EXPECTED)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_launches_and_allocations_match_the_table(measured, name):
    cost, expected = _cost(measured, name), EXPECTED[name]
    message = _described(cost, expected)
    assert cost["driver"]["launches"] == expected[0], message
    assert cost["allocations"] == expected[1], message
    assert cost["python_calls"] <= expected[2] * PYTHON_MARGIN, message


@pytest.mark.parametrize("name", list(EXPECTED))
def test_host_time_meets_the_issue_target(measured, folder, name):
    """Issue 36's host microseconds on the stub driver (the minimum of many calls; a case
    over its target is measured again in a new process before it fails)."""
    cost, target = _cost(measured, name), EXPECTED[name][5]
    best = cost["host_us"]
    for _ in range(REMEASURES):
        if best <= target:
            break
        best = min(best, _cost(_measure(folder, name, 4 * CALLS), name)["host_us"])
    assert best <= target, _described(dict(cost, host_us=best), EXPECTED[name])


@pytest.mark.parametrize("name", list(EXPECTED))
def test_numbapos_counts_every_launch_the_driver_sees(measured, name):
    cost = _cost(measured, name)
    assert cost["launches"] == cost["driver"]["launches"], _described(cost, EXPECTED[name])


@pytest.mark.parametrize("name", list(EXPECTED))
def test_no_op_waits_for_the_device_or_calls_the_driver_allocator(measured, name):
    driver = _cost(measured, name)["driver"]
    assert driver["syncs"] == 0, f"{name}: {driver['syncs']:g} synchronisations per call"
    assert driver["copies_dtoh"] == 0, f"{name}: {driver['copies_dtoh']:g} device-to-host copies"
    assert driver["device_allocs"] == 0, \
        f"{name}: {driver['device_allocs']:g} cuMemAlloc per call after warm-up (pool misses)"


def test_the_bench_prints_the_same_table(measured):
    from numbapos.bench import report

    lines = measured["table"].splitlines()
    assert lines[0] == report.host_header()
    for cost in measured["costs"]:
        row = next(line for line in lines if line.startswith(cost["name"] + " "))
        cells = row[report.NAME_WIDTH:].split()
        assert cells == [f"{cost['host_us']:.1f}", f"{cost['launches']:g}",
                         f"{cost['allocations']:g}", str(cost["python_calls"])], row


def test_the_bench_does_not_measure_host_cost_on_the_simulator():
    from numbapos import _device, bench

    if not _device.simulator_enabled():
        pytest.skip("the simulator is off")
    said, errors = [], []
    bench._host_cost(bench.SIZES["tiny"], True, None, errors, said.append)
    assert len(said) == 1 and "not measured on Numba's CUDA simulator" in said[0], said
    assert errors == []
