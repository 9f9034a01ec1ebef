"""numbapos.config: every NUMBAPOS_* variable parsed once, overridden in blocks, shown by info."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import numbapos
from numbapos import config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def environment(monkeypatch):
    """``environment(**variables)``: set NUMBAPOS_* variables and have config read them again."""

    def set_variables(**variables):
        for name, value in variables.items():
            monkeypatch.setenv(name, value)
        config.reset()

    yield set_variables
    monkeypatch.undo()
    config.reset()


def test_every_setting_has_a_numbapos_variable_and_a_valid_default():
    for name, setting in config.SETTINGS.items():
        assert setting.name == name
        assert setting.variable == "NUMBAPOS_" + name.upper()
        assert setting.doc
        if setting.default is not None:
            assert setting.check(setting.default) == setting.default


def test_defaults(environment):
    environment()
    for name in config.SETTINGS:
        if config.SETTINGS[name].variable not in os.environ:
            assert config.get(name) == config.SETTINGS[name].default


@pytest.mark.parametrize("variable, text, name, value", [
    ("NUMBAPOS_ADAPTIVE_THREADS", "0", "adaptive_threads", False),
    ("NUMBAPOS_ADAPTIVE_THREADS", " 1 ", "adaptive_threads", True),
    ("NUMBAPOS_SPIN_COUNT", "0", "spin_count", 0),
    ("NUMBAPOS_PREFETCH_LINES", "64", "prefetch_lines", 64),
    ("NUMBAPOS_PARALLEL_MIN_ELEMENTS", "1000", "parallel_min_elements", 1000),
    ("NUMBAPOS_MAX_PENDING_RECORDS", "3", "max_pending_records", 3),
    ("NUMBAPOS_CUDA_MEMORY_POOL", "0", "cuda_memory_pool", False),
    ("NUMBAPOS_CUDA_SYNC_CHECKS", "1", "cuda_sync_checks", True),
])
def test_variables_are_parsed(environment, variable, text, name, value):
    environment(**{variable: text})
    assert config.get(name) == value


@pytest.mark.parametrize("variable, text, expected", [
    ("NUMBAPOS_ADAPTIVE_THREADS", "yes", "expected 0 or 1, got 'yes'"),
    ("NUMBAPOS_SPIN_COUNT", "-1", "expected an integer >= 0, got '-1'"),
    ("NUMBAPOS_SPIN_COUNT", "lots", "expected an integer >= 0, got 'lots'"),
    ("NUMBAPOS_PREFETCH_LINES", "65", r"expected an integer in \[0, 64\], got '65'"),
    ("NUMBAPOS_MAX_PENDING_RECORDS", "0", "expected an integer >= 1, got '0'"),
])
def test_a_bad_variable_raises_naming_it_at_the_first_read(environment, variable, text, expected):
    environment(**{variable: text})
    with pytest.raises(ValueError, match=f"{variable}: {expected}"):
        config.get("spin_count")  # any setting: the environment is parsed as a whole


def test_the_environment_is_read_once(environment, monkeypatch):
    environment(NUMBAPOS_PARALLEL_MIN_ELEMENTS="5")
    assert config.get("parallel_min_elements") == 5
    monkeypatch.setenv("NUMBAPOS_PARALLEL_MIN_ELEMENTS", "7")
    assert config.get("parallel_min_elements") == 5
    config.reset()
    assert config.get("parallel_min_elements") == 7


def test_override_nests_restores_and_checks():
    before = config.get("parallel_min_elements")
    with config.override(parallel_min_elements=0):
        assert config.get("parallel_min_elements") == 0
        with config.override(parallel_min_elements=9, max_pending_records=2):
            assert config.get("parallel_min_elements") == 9
            assert config.get("max_pending_records") == 2
        assert config.get("parallel_min_elements") == 0
    assert config.get("parallel_min_elements") == before
    with pytest.raises(RuntimeError), config.override(parallel_min_elements=1):
        raise RuntimeError
    assert config.get("parallel_min_elements") == before
    with pytest.raises(KeyError, match="no setting 'parallel'.*parallel_min_elements"):
        with config.override(parallel=1):
            pass
    with pytest.raises(ValueError, match="max_pending_records: expected an integer >= 1"):
        with config.override(max_pending_records=0):
            pass
    with pytest.raises(TypeError, match="adaptive_threads: expected a bool"):
        with config.override(adaptive_threads=1):
            pass
    with pytest.raises(KeyError, match="no setting 'nope'"):
        config.get("nope")


def test_overrides_apply_to_every_thread():
    seen = []
    with config.override(max_pending_records=5):
        thread = threading.Thread(target=lambda: seen.append(config.get("max_pending_records")))
        thread.start()
        thread.join()
    assert seen == [5]


def test_describe_says_where_each_value_comes_from(environment):
    environment(NUMBAPOS_SPIN_COUNT="123")
    with config.override(max_pending_records=4):
        rows = {name: (value, source) for name, _, value, source, _ in config.describe()}
    assert rows["spin_count"] == (123, "environment")
    assert rows["max_pending_records"] == (4, "override")
    assert rows["parallel_min_elements"][1] in ("default", "environment")


def test_info_lists_every_setting_and_unknown_variables():
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBAPOS_SPIN_COUNT="321", NUMBAPOS_SPINCOUNT="1")
    done = subprocess.run([sys.executable, "-m", "numbapos", "info"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for name, setting in config.SETTINGS.items():
        assert f"{name} = " in done.stdout and setting.variable in done.stdout
    assert "spin_count = 321  (NUMBAPOS_SPIN_COUNT, environment)" in done.stdout
    assert "NUMBAPOS_SPINCOUNT is set but numbapos has no such setting" in done.stdout


def test_info_reports_a_bad_variable_without_a_traceback():
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBAPOS_SPIN_COUNT="lots")
    done = subprocess.run([sys.executable, "-m", "numbapos", "info"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "settings error: NUMBAPOS_SPIN_COUNT: expected an integer >= 0, got 'lots'" in (
        done.stderr)
    assert "Traceback" not in done.stderr


def test_importing_numbapos_and_its_backends_starts_nothing():
    """No thread pool at import, and none for small (serial) work; the first parallel launch
    starts it."""
    code = (
        "import numpy as np, numbapos, numbapos.kernels.cpu\n"
        "from numba.np.ufunc import parallel\n"
        "from numbapos import _pool\n"
        "assert not parallel._is_initialized and not _pool.started\n"
        "numbapos.functional.dropout(np.ones(8), 0.5, 1)\n"
        "assert not parallel._is_initialized, 'small work started the pool'\n"
        "with numbapos.config.override(parallel_min_elements=0):\n"
        "    numbapos.functional.dropout(np.ones(8), 0.5, 1)\n"
        "assert parallel._is_initialized and _pool.started\n"
        "print('ok')\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_cuda_backend_installs_its_allocator_when_started_not_imported(monkeypatch):
    pytest.importorskip("numba.cuda")
    from numbapos._gpuhost import memory

    calls = []
    monkeypatch.setattr(memory, "install", lambda: calls.append(1) or False)
    import importlib

    import numbapos.kernels.cuda as cuda_backend

    importlib.reload(cuda_backend)  # importing (again) installs nothing
    assert calls == []
    cuda_backend.start()
    assert calls == [1]


def test_the_cuda_memory_pool_setting_is_read(monkeypatch):
    pytest.importorskip("numba.cuda")
    from numba import config as numba_config

    from numbapos._gpuhost import memory

    monkeypatch.setattr(numba_config, "ENABLE_CUDASIM", False)
    with config.override(cuda_memory_pool=False):
        assert memory.install() is False  # turned off: nothing touched


def test_numbapos_exports_config():
    assert numbapos.config is config
    assert "config" in numbapos.__all__
