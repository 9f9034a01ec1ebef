"""Foreign CUDA arrays (CuPy, PyTorch: ``__cuda_array_interface__``) are wrapped into Numba
device arrays once per object (numbapos/_gpuhost/fastlaunch.adopt), checked on the stub
driver (foreign_checks.py) with a fake CuPy-like array."""

import pytest
import stub

CHECKS = ("check_wrapped_once", "check_not_cached")


@pytest.fixture(scope="module")
def results(request, tmp_path_factory):
    pytest.importorskip("numba.cuda")
    pytest.importorskip("cuda.bindings")
    folder = stub.built_for(request, tmp_path_factory)
    calls = ", ".join(f'"{name}": foreign_checks.{name}()' for name in CHECKS)
    return stub.run("import json, numbapos, foreign_checks\n"
                    "numbapos._device.kernels_for('cuda')\n"
                    f"print(json.dumps({{{calls}}}))", folder)


def test_the_same_object_reuses_its_wrapper(results):
    found = results["check_wrapped_once"]
    assert found["same_entry"] and found["reused"], found
    assert found["fields_match"] and found["values"], found


def test_an_object_whose_interface_changed_is_wrapped_anew(results):
    assert results["check_wrapped_once"]["follows"]


def test_a_freed_object_takes_its_wrapper_with_it(results):
    found = results["check_wrapped_once"]
    assert found["forgotten"] and found["fresh"], found


def test_ops_take_wrapped_foreign_arrays(results):
    assert results["check_wrapped_once"]["lookups"]


def test_objects_without_weak_references_or_with_a_stream_are_not_cached(results):
    assert results["check_not_cached"] == {"unreferenceable": True, "not_kept": True,
                                           "stream": "numba's"}
