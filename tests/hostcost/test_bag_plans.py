"""The bags' plans on the stub driver (bag_plan_checks.py; see test_plans.py)."""

import pytest
import stub


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    pytest.importorskip("numba.cuda")
    pytest.importorskip("cuda.bindings")
    folder = stub.built_for(request, tmp_path_factory)
    return stub.run("import json, numbapos, bag_plan_checks\n"
                    "numbapos._device.kernels_for('cuda')\n"
                    "print(json.dumps(bag_plan_checks.check_lazy_bag_backward()))", folder)


def test_a_lazy_bag_backward_replays_into_new_row_groups(results):
    assert results == {"lazy_bag_backwards": 3, "plans": 3}
