"""Keep Numba's on-disk cache of the CPU kernels true to everything compiled into them.

Numba keys a cached kernel by the content of the file that defines it, its
argument types and the CPU. A kernel also inlines helpers from other files
(:mod:`numbapos.kernels.hash`, ``halfbits``, ``updates``, ``widen``, the
kernels of other area modules, :mod:`numbapos._args`) and compile-time
settings (the prefetch lines, :mod:`.prefetch`). A change to those alone
leaves the cached machine code as it was: an editable install that pulls a
change to ``hash.py`` kept drawing the old rounding bits until the cache was
cleared by hand (a silent wrong answer), and a new ``NUMBAPOS_PREFETCH_LINES``
did nothing.

So when :mod:`numbapos.kernels.cpu` is imported (before any kernel is loaded:
kernels load at their first call), :func:`refresh` fingerprints those
sources and settings (:func:`fingerprint`) and compares it with the one kept
in the cache folder (:data:`STAMP_NAME`). When they differ, the folder's
numbapos cache files (``*.nbi`` indexes, ``*.nbc`` machine code) are removed
and the new fingerprint is written: the kernels compile again, once, as
after a fresh install. Another process loading from the folder meanwhile is
safe: Numba reads a missing index as empty and a missing data file as a miss,
and writes both through a temporary file and a rename.

A pip install or upgrade rewrites every file, so it never needed this; the
sources are read once per process (about 0.6 MB, a few milliseconds).
"""

from __future__ import annotations

import hashlib
import os
import sys
import uuid
from pathlib import Path

from ..._numba_internals import no_nrt_options

__all__ = ["STAMP_NAME", "compiled_sources", "fingerprint", "refresh"]

STAMP_NAME = "numbapos-kernels.stamp"
"""The file in the cache folder holding the fingerprint of the kernels cached there."""

_PACKAGE = Path(__file__).resolve().parents[2]  # the numbapos folder


def compiled_sources() -> list[Path]:
    """The source files whose code the CPU kernels can inline: every module of
    ``numbapos/kernels`` (this folder and the shared helpers above it) and
    ``numbapos/_args.py``. The CUDA kernels are not cached, so not listed."""
    kernels = _PACKAGE / "kernels"
    return sorted([*kernels.glob("*.py"), *(kernels / "cpu").glob("*.py"),
                   _PACKAGE / "_args.py"])


def fingerprint(sources=None, settings=None) -> str:
    """A hex digest of the ``sources`` (default :func:`compiled_sources`), by name
    relative to the package and content, and of the compile-time ``settings``
    (default: this process's prefetch lines, :mod:`.prefetch`)."""
    if sources is None:
        sources = compiled_sources()
    if settings is None:
        from . import prefetch

        settings = {"numba_internals": bool(no_nrt_options()),
                    "prefetch_lines": prefetch.PREFETCH_LINES,
                    "half_prefetch_lines": prefetch.HALF_PREFETCH_LINES,
                    "output_prefetch_lines": prefetch.OUTPUT_PREFETCH_LINES}
    digest = hashlib.sha256()
    for path in sources:
        path = Path(path)
        try:
            name = path.resolve().relative_to(_PACKAGE).as_posix()
        except ValueError:
            name = path.name
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(repr(sorted(settings.items())).encode())
    return digest.hexdigest()


def _cached_kernels() -> dict[str, set[str]]:
    """``{cache folder: names of the modules whose kernels are cached there}`` for the
    cached kernels of the imported ``numbapos.kernels.cpu`` modules."""
    from numba.core.registry import CPUDispatcher

    folders: dict[str, set[str]] = {}
    for name, module in list(sys.modules.items()):
        if not name.startswith(__package__ + ".") or module is None:
            continue
        for obj in vars(module).values():
            if isinstance(obj, CPUDispatcher) and obj.py_func.__module__ == name:
                folder = obj.stats.cache_path
                if folder:
                    folders.setdefault(folder, set()).add(name.rsplit(".", 1)[1])
    return folders


def refresh(folders=None, stamp=None) -> list[str]:
    """Remove the cache files of every folder whose kept fingerprint is not ``stamp``.

    ``folders`` maps each cache folder to the module names whose kernels it
    holds (default: found from the imported kernels); ``stamp`` defaults to
    :func:`fingerprint`. A folder with no fingerprint yet is treated as stale
    (it may hold kernels cached before this check existed). Files of other
    modules are left alone. Returns the folders refreshed. Never raises for a
    folder it cannot read or write (the cache then works as Numba's alone).
    """
    if folders is None:
        folders = _cached_kernels()
    if not folders:
        return []
    if stamp is None:
        stamp = fingerprint()
    refreshed = []
    for folder, modules in folders.items():
        stamp_path = os.path.join(folder, STAMP_NAME)
        try:
            with open(stamp_path, encoding="ascii") as file:
                kept = file.read().strip()
        except (OSError, UnicodeDecodeError):
            kept = None
        if kept == stamp:
            continue
        try:
            _remove_cache_files(folder, modules)
            _write_atomically(stamp_path, stamp)
        except OSError:
            continue
        refreshed.append(folder)
    return refreshed


def _remove_cache_files(folder, modules) -> None:
    prefixes = tuple(f"{module}." for module in modules)
    for entry in os.scandir(folder):
        if entry.name.startswith(prefixes) and entry.name.endswith((".nbi", ".nbc")):
            try:
                os.unlink(entry.path)
            except FileNotFoundError:  # another process removed it first
                pass


def _write_atomically(path, text) -> None:
    temporary = f"{path}.{uuid.uuid4().hex[:16]}.tmp"
    try:
        with open(temporary, "w", encoding="ascii") as file:
            file.write(text + "\n")
        os.replace(temporary, path)
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
