"""Every Python block of README.md runs as written, in order, in one namespace."""

import os
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_blocks():
    assert len(python_blocks()) >= 4


def test_every_python_block_runs_in_order(tmp_path, capsys, monkeypatch):
    pytest.importorskip("safetensors")  # the checkpoint example (extra "io")
    pytest.importorskip("ray")  # the sharded table (extra "distributed")
    monkeypatch.setenv("RAY_AUTH_MODE", os.environ.get("RAY_AUTH_MODE", "disabled"))
    # Ray's workers import numbapos from the driver's directory (here tmp_path) or
    # the environment: make it this checkout, whatever else is installed.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(README.parent), os.environ.get("PYTHONPATH")) if p))
    namespace = {"__name__": "__readme__"}
    cwd = os.getcwd()
    os.chdir(tmp_path)  # blocks write their files here
    try:
        for number, block in enumerate(python_blocks(), start=1):
            exec(compile(block, f"README.md python block {number}", "exec"), namespace)
    finally:
        os.chdir(cwd)
    assert (tmp_path / "model.safetensors").exists()
