"""Run numbapos's real CUDA host path against the stub driver (stubcuda.c), without a GPU.

:func:`build` compiles stubcuda.c with the machine's gcc into
``<cache>/<hash of the source>/libcuda.so.1`` (once per version of the source);
:func:`run` runs Python code in a subprocess that loads it instead of the
driver (``LD_LIBRARY_PATH``), with the simulator off and Numba's cache in
``<cache>/<hash>/numba-cache``: the stub's kernels hold fake cubins, which must
never reach the Numba cache a real GPU reads. Inside that subprocess
:func:`counters` reads the stub's driver-level counters.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "stubcuda.c"
LIBRARY = "libcuda.so.1"
SUMMARY = pytest.StashKey[str]()  # the measured table, for the terminal summary (conftest.py)


class Unavailable(Exception):
    """The stub cannot be built here (no gcc, not Linux); the caller skips."""


def build(cache: Path) -> Path:
    """The folder holding the built stub ``libcuda.so.1``, compiled if not there yet."""
    if not sys.platform.startswith("linux"):
        raise Unavailable(f"the stub driver is a Linux shared library (platform {sys.platform})")
    gcc = shutil.which("gcc")
    if gcc is None:
        raise Unavailable("gcc is not installed: the stub CUDA driver cannot be built")
    source = SOURCE.read_bytes()
    folder = Path(cache) / hashlib.sha256(source).hexdigest()[:16]
    library = folder / LIBRARY
    if library.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f"{LIBRARY}.{os.getpid()}"  # renamed into place: no half-written stub
    done = subprocess.run([gcc, "-O2", "-shared", "-fPIC", "-o", str(partial), str(SOURCE),
                           "-ldl"], capture_output=True, text=True)
    if done.returncode != 0:
        raise Unavailable(f"gcc could not build the stub driver:\n{done.stderr}")
    partial.replace(library)
    return folder


def built_for(request, tmp_path_factory) -> Path:
    """The built stub's folder for a test: in pytest's cache (a temporary folder without
    it); the test is skipped where the stub cannot be built."""
    import pytest

    cache = getattr(request.config, "cache", None)  # None with -p no:cacheprovider
    root = cache.mkdir("stubcuda") if cache is not None else tmp_path_factory.mktemp("stub")
    try:
        return build(root)
    except Unavailable as why:
        pytest.skip(str(why))


def run(code: str, folder: Path, timeout: float = 600, env: dict | None = None):
    """Run ``code`` under the stub in ``folder``; the JSON it prints last, decoded.

    ``code`` runs with this folder on ``sys.path`` (``import stub`` works). ``env``
    sets environment variables in that process, after those chosen here (a memory
    manager, ``NUMBAPOS_CUDA_MEMORY_POOL``, ...).
    """
    extra, env = env or {}, dict(os.environ)
    env.update(
        LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(folder),
                                                       env.get("LD_LIBRARY_PATH")])),
        NUMBA_ENABLE_CUDASIM="0",
        NUMBA_CACHE_DIR=str(folder / "numba-cache"),
        PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])),
    )
    for name in ("NUMBA_CUDA_MEMORY_MANAGER", "NUMBAPOS_CUDA_MEMORY_POOL",
                 "NUMBAPOS_CUDA_FAST_LAUNCH", "NUMBAPOS_CUDA_SYNC_CHECKS"):
        env.pop(name, None)  # the default host path, whatever the caller's shell chose
    env.update(extra)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the stub-driver process failed ({done.returncode}):\n"
                           f"{done.stdout[-4000:]}\n{done.stderr[-8000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


_library = []


def counters() -> dict:
    """The stub driver's counters, by name (inside a :func:`run` process only)."""
    if not _library:
        lib = ctypes.CDLL(LIBRARY)
        names = ctypes.string_at(ctypes.addressof(ctypes.c_char.in_dll(lib, "stub_counter_names")))
        lib.stub_counters.argtypes = [ctypes.POINTER(ctypes.c_longlong), ctypes.c_int]
        names = names.decode().split(",")
        _library.extend([lib, names, (ctypes.c_longlong * len(names))()])
    lib, names, values = _library
    lib.stub_counters(values, len(names))
    return dict(zip(names, values, strict=True))


def measure_all(calls: int, only: str | None = None) -> dict:
    """Inside a :func:`run` process: every host-cost case measured (those whose names
    contain ``only``), and the bench's table.

    Returns ``{"skip": reason}`` where numba-cuda cannot compile kernels here
    (no NVVM), else ``{"device", "costs", "errors", "table"}``.
    """
    from numba import cuda
    from numba.cuda.cudadrv import nvvm

    if not nvvm.is_available():
        return {"skip": "NVVM (the CUDA compiler numba-cuda uses) is not installed"}
    from numbapos.bench import hostcost, report

    errors = []
    costs = hostcost.run(calls=calls, only=only, driver=counters, errors=errors)
    table = [report.host_header(), *map(report.format_host, costs), report.host_legend(calls)]
    name = cuda.get_current_device().name
    return {"device": name.decode() if isinstance(name, bytes) else name,
            "costs": [cost._asdict() for cost in costs], "errors": errors,
            "table": "\n".join(table)}
