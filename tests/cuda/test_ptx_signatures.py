"""The PTX check itself (tests/ptx_signatures.py): launches are recorded on the simulator,
factory kernels with their arguments, and a kernel NVVM refuses fails the check."""

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def _path(*folders) -> str:
    """A child's PYTHONPATH: ``folders`` first, then the caller's (packages installed there)."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([str(f) for f in folders] + inherited)

pytest.importorskip("numba.cuda")

# A kernel the simulator runs happily and NVVM refuses (a NumPy allocation on the device).
BROKEN = textwrap.dedent("""
    import numpy as np
    from numba import cuda

    @cuda.jit
    def allocates(out):
        scratch = np.zeros(4)
        out[0] = scratch[0]
""")

RECORD = textwrap.dedent("""
    import sys
    import numpy as np
    import ptx_signatures
    ptx_signatures.install_recorder()
    import numbapos, numbapos.functional as F
    from numba import cuda
    x = numbapos.to_device(np.ones((2, 3), np.float32), "cuda")
    F.dropout(x, 0.5, 1)
    F.layer_norm_forward(x, numbapos.to_device(np.ones(3, np.float32), "cuda"),
                         numbapos.to_device(np.zeros(3, np.float32), "cuda"))
    if sys.argv[2] == "broken":
        import broken_kernels
        broken_kernels.allocates[1, 1](np.ones(1))
    print(ptx_signatures.save(sys.argv[1]))
""")


def _record(tmp_path, which):
    (tmp_path / "broken_kernels.py").write_text(BROKEN)
    path = tmp_path / f"{which}.pkl"
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1",
               PYTHONPATH=_path(ROOT, TESTS, tmp_path))
    done = subprocess.run([sys.executable, "-c", RECORD, str(path), which], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return path, pickle.loads(path.read_bytes())


def _nvvm_available() -> bool:
    code = ("from numba import cuda, float32\n"
            "def k(x):\n    x[0] = 1\n"
            "cuda.compile_ptx(k, (float32[::1],), cc=(8, 0))\n")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          timeout=120).returncode == 0


def test_launches_are_recorded_with_types_and_factories(tmp_path):
    _, records = _record(tmp_path, "ok")
    names = {(module, qualname) for module, qualname, _, _ in records}
    assert ("numbapos.kernels.cuda.dropout", "_dropout_apply") in names or any(
        module == "numbapos.kernels.cuda.dropout" for module, _ in names)
    factories = [(qualname, factory) for _, qualname, factory, _ in records if factory]
    assert ("_forward_kernel.<locals>.layer_norm_forward",
            ("_forward_kernel", (("dtype", "float32"),))) in factories
    for _, _, _, argtypes in records:
        assert all(hasattr(t, "name") for t in argtypes)  # Numba types


def test_a_kernel_nvvm_refuses_fails_the_check_and_numbapos_kernels_compile(tmp_path):
    if not _nvvm_available():
        pytest.skip("NVVM is not installed (pip install 'numba-cuda[cu12]'; .ci/run does)")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0",
               PYTHONPATH=_path(ROOT, tmp_path))
    script = str(TESTS / "ptx_signatures.py")
    path, _ = _record(tmp_path, "ok")
    done = subprocess.run([sys.executable, script, str(path), "--cc", "9.0", "--only-recorded"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert " 0 failed" in done.stdout
    path, _ = _record(tmp_path, "broken")
    done = subprocess.run([sys.executable, script, str(path), "--cc", "8.0", "--only-recorded"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1
    assert "FAILED sm_80: broken_kernels.allocates" in done.stdout
    assert " 1 failed" in done.stdout


def test_processes_saving_to_one_file_keep_each_others_records(tmp_path, monkeypatch):
    """The pytest-xdist workers all save to one PTX_SIGNATURES file: a save waits while
    another process merges, then adds its records to that process's, losing none."""
    import threading

    sys.path.insert(0, str(TESTS))
    try:
        import ptx_signatures
    finally:
        sys.path.remove(str(TESTS))
    path = tmp_path / "signatures.pkl"
    ours, theirs = ("m", "ours", None, ()), ("m", "theirs", None, ())
    monkeypatch.setattr(ptx_signatures, "_records", {ours})
    with ptx_signatures._locked(path):  # another worker is between its read and its write
        saving = threading.Thread(target=ptx_signatures.save, args=(path,))
        saving.start()
        saving.join(0.5)
        assert saving.is_alive(), "save() did not wait for the other process's merge"
        path.write_bytes(pickle.dumps({theirs}))
    saving.join(30)
    assert not saving.is_alive()
    assert pickle.loads(path.read_bytes()) == {ours, theirs}
    assert ptx_signatures.save(path) == 2  # saving again adds nothing new
