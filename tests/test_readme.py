"""Every Python block of README.md runs as written, in order, in one namespace."""

import os
import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_python_blocks():
    assert len(python_blocks()) >= 4


def test_every_python_block_runs_in_order(tmp_path, capsys):
    pytest.importorskip("safetensors")  # the checkpoint example (extra "io")
    namespace = {"__name__": "__readme__"}
    cwd = os.getcwd()
    os.chdir(tmp_path)  # blocks write their files here
    try:
        for number, block in enumerate(python_blocks(), start=1):
            exec(compile(block, f"README.md python block {number}", "exec"), namespace)
    finally:
        os.chdir(cwd)
    assert (tmp_path / "model.safetensors").exists()
