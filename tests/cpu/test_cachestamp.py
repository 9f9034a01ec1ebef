"""The cache guard: cached CPU kernels go when a source they inline or a compile-time
setting changes (numbapos/kernels/cpu/cachestamp.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from numbapos.kernels.cpu import cachestamp

REPO = Path(__file__).resolve().parents[2]


def test_the_fingerprint_covers_every_inlined_source_and_the_settings(tmp_path):
    names = {path.relative_to(cachestamp._PACKAGE).as_posix()
             for path in cachestamp.compiled_sources()}
    assert {"kernels/hash.py", "kernels/halfbits.py", "kernels/updates.py",
            "kernels/widen.py", "kernels/cpu/optim.py", "kernels/cpu/prefetch.py",
            "_args.py"} <= names
    assert not any(name.startswith("kernels/cuda/") for name in names)

    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    settings = {"prefetch_lines": 0}
    first = cachestamp.fingerprint([a, b], settings)
    assert cachestamp.fingerprint([a, b], dict(settings)) == first  # deterministic
    a.write_text("x = 2\n")
    assert cachestamp.fingerprint([a, b], settings) != first  # a helper's content
    a.write_text("x = 1\n")
    assert cachestamp.fingerprint([a, b], settings) == first
    assert cachestamp.fingerprint([a, b], {"prefetch_lines": 8}) != first  # a setting
    assert cachestamp.fingerprint([a], settings) != first  # a file gone
    assert len(cachestamp.fingerprint()) == 64


def _files(folder, names):
    for name in names:
        (folder / name).write_bytes(b"cached")


def test_refresh_removes_the_kernels_of_a_stale_folder_only(tmp_path):
    ours = ["halfoptim._sgd-260.py311.nbi", "halfoptim._sgd-260.py311.1.nbc",
            "half._store_rows-230.py312.nbi"]
    theirs = ["halfoptimizer.f-1.py311.nbi", "other.f-1.py311.nbc", "half.cpython-311.pyc"]
    _files(tmp_path, ours + theirs)
    folders = {str(tmp_path): {"halfoptim", "half"}}

    # No fingerprint kept yet (kernels cached before the guard): stale.
    assert cachestamp.refresh(folders, "one") == [str(tmp_path)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(theirs + [cachestamp.STAMP_NAME])
    assert (tmp_path / cachestamp.STAMP_NAME).read_text().strip() == "one"

    _files(tmp_path, ours)  # compiled and cached again under "one"
    assert cachestamp.refresh(folders, "one") == []  # fresh: nothing removed
    assert all((tmp_path / name).exists() for name in ours)

    assert cachestamp.refresh(folders, "two") == [str(tmp_path)]  # a source changed
    assert not any((tmp_path / name).exists() for name in ours)
    assert all((tmp_path / name).exists() for name in theirs)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_refresh_never_raises_for_a_folder_it_cannot_use(tmp_path):
    missing = tmp_path / "gone"
    assert cachestamp.refresh({str(missing): {"half"}}, "one") == []
    assert cachestamp.refresh({}, "one") == []


_RUN = """
import json, os, sys
import numpy as np
import numbapos.kernels.cpu as K
from numbapos.kernels.cpu import cachestamp
if sys.argv[1] == "call":
    out = np.empty(3, bool)
    K.not_equal_mask(np.array([1, 2, 1]), 1, out)
    assert out.tolist() == [False, True, False]
folder = K.embedding._not_equal_mask.stats.cache_path
print(json.dumps({"folder": folder, "stamp": cachestamp.fingerprint(),
                  "hits": sum(K.embedding._not_equal_mask.stats.cache_hits.values())}))
"""


def _run(cache_dir, what):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", _RUN, what], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX paths in the cache folder")
def test_a_changed_fingerprint_makes_the_next_process_compile_again(tmp_path):
    first = _run(tmp_path, "call")  # compiles, caches, keeps the fingerprint
    folder = Path(first["folder"])
    index = [p for p in folder.iterdir() if p.name.startswith("embedding._not_equal_mask")
             and p.suffix == ".nbi"]
    assert index and (folder / cachestamp.STAMP_NAME).read_text().strip() == first["stamp"]
    assert _run(tmp_path, "call")["hits"] == 1  # loaded from the cache

    # As if hash.py had changed since: the next import removes the cached kernels.
    (folder / cachestamp.STAMP_NAME).write_text("an older fingerprint\n")
    assert _run(tmp_path, "import")["stamp"] == first["stamp"]
    assert not [p for p in folder.iterdir() if p.suffix in (".nbi", ".nbc")]
    assert (folder / cachestamp.STAMP_NAME).read_text().strip() == first["stamp"]
    assert _run(tmp_path, "call")["hits"] == 0  # compiled again
    assert _run(tmp_path, "call")["hits"] == 1
