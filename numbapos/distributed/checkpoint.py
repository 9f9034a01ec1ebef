"""Checkpoints of sharded tables: one file per shard, a manifest, and resharding.

A checkpoint directory holds::

    manifest.json                              written last, atomically
    step-<step>-<tag>/shard-00000-of-00002.npz  one file per shard, each atomic
    step-<step>-<tag>/shard-00001-of-00002.npz

Row ``r`` of the table lives on shard ``r % S`` at local row ``r // S``. A
shard file holds that shard's rows of the table, the per-row optimiser state
for the same rows, the global optimiser state (every shard holds the same)
and the last step each trainer applied. Every file is written to a temporary
name and renamed; the manifest names the files of one complete checkpoint and
is replaced only after all of them are on disk, so a crash while saving leaves
the previous checkpoint valid. Older ``step-*`` folders are removed after the
new manifest is in place.

:func:`reshard` rewrites a checkpoint for another number of shards without Ray
and without ever holding the whole table: each new shard is built from the
old shard files one at a time (memory: one old and one new shard). Run it as::

    python -m numbapos.distributed SOURCE DESTINATION --num-shards 3
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np

FORMAT = "numbapos.sharded-embedding/1"
MANIFEST = "manifest.json"


def shard_rows(index: int, num_shards: int, num_embeddings: int) -> int:
    """How many rows shard ``index`` of ``num_shards`` holds (rows ``index, index + S, ...``)."""
    return len(range(index, num_embeddings, num_shards))


def shard_file(index: int, num_shards: int) -> str:
    """The file name of shard ``index`` of ``num_shards``."""
    return f"shard-{index:05d}-of-{num_shards:05d}.npz"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, write) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it to ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    _fsync_dir(path.parent)


def write_shard(path, data: dict) -> None:
    """Write one shard's ``data`` (see :func:`read_shard`) to ``path`` atomically."""
    arrays = {"weight": data["weight"]}
    arrays.update({f"row.{k}": v for k, v in data["rows"].items()})
    arrays.update({f"array.{k}": v for k, v in data["arrays"].items()})
    meta = {"scalars": data["scalars"], "applied": data["applied"]}
    arrays["meta"] = np.array(json.dumps(meta))
    _atomic_write(Path(path), lambda handle: np.savez(handle, **arrays))


def read_shard(path) -> dict:
    """One shard file as ``{"weight", "rows", "arrays", "scalars", "applied"}``.

    ``rows`` and ``arrays`` map state names to per-row and global state arrays,
    ``scalars`` to global numbers, ``applied`` each trainer to its last step.
    """
    with np.load(path, allow_pickle=False) as stored:
        data = {"weight": stored["weight"], "rows": {}, "arrays": {}}
        for key in stored.files:
            kind, _, name = key.partition(".")
            if kind in ("row", "array"):
                data["rows" if kind == "row" else "arrays"][name] = stored[key]
        meta = json.loads(str(stored["meta"]))
    data["scalars"] = meta["scalars"]
    data["applied"] = {k: int(v) for k, v in meta["applied"].items()}
    return data


def write_manifest(directory, manifest: dict) -> None:
    """Write ``manifest.json`` atomically, then remove ``step-*`` folders it does not name."""
    directory = Path(directory)
    text = json.dumps(manifest, indent=2, sort_keys=True).encode()
    _atomic_write(directory / MANIFEST, lambda handle: handle.write(text))
    keep = {Path(name).parts[0] for name in manifest["shards"]}
    for old in directory.glob("step-*"):
        if old.is_dir() and old.name not in keep:
            shutil.rmtree(old, ignore_errors=True)


def read_manifest(directory) -> dict:
    """The manifest of the checkpoint in ``directory``.

    Raises
    ------
    FileNotFoundError
        No ``manifest.json`` there (no complete checkpoint was saved).
    ValueError
        A manifest of another format.
    """
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"directory: {str(directory)!r} holds no {MANIFEST} (no "
                                "complete sharded checkpoint)")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return manifest


def new_step_folder(directory, step: int) -> str:
    """Create and return (relative to ``directory``) a fresh folder for one checkpoint."""
    name = f"step-{step:012d}-{uuid.uuid4().hex[:8]}"
    (Path(directory) / name).mkdir(parents=True)
    return name


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def gather_shard(directory, manifest: dict, num_shards: int, index: int) -> dict:
    """Shard ``index`` of ``num_shards`` of the checkpoint in ``directory``.

    With the checkpoint's own shard count this reads one file. Otherwise it
    reads the old shard files one at a time and keeps the rows (table rows
    and per-row optimiser state) that fall on the new shard; the global state
    and the applied steps must agree between old shards (they do for any
    checkpoint :class:`~numbapos.distributed.ShardedEmbedding` saved).
    """
    directory = Path(directory)
    old_shards = int(manifest["num_shards"])
    if num_shards == old_shards:
        return read_shard(directory / manifest["shards"][index])
    num_rows = int(manifest["num_embeddings"])
    rows = index + num_shards * np.arange(shard_rows(index, num_shards, num_rows),
                                          dtype=np.int64)
    owner = rows % old_shards
    result = None
    for old in range(old_shards):
        source = read_shard(directory / manifest["shards"][old])
        if result is None:
            result = {"weight": np.empty((rows.size,) + source["weight"].shape[1:],
                                         source["weight"].dtype),
                      "rows": {k: np.empty((rows.size,) + v.shape[1:], v.dtype)
                               for k, v in source["rows"].items()},
                      "arrays": source["arrays"], "scalars": source["scalars"],
                      "applied": source["applied"]}
        else:
            for key in ("scalars", "applied"):
                if source[key] != result[key]:
                    raise ValueError(f"{directory}: shard {old} has {key} {source[key]}, "
                                     f"shard 0 has {result[key]}")
            for name, value in source["arrays"].items():
                if name not in result["arrays"] or not _same(value, result["arrays"][name]):
                    raise ValueError(f"{directory}: global optimizer state {name!r} differs "
                                     f"between shard 0 and shard {old}")
            if set(source["rows"]) != set(result["rows"]):
                raise ValueError(f"{directory}: shards 0 and {old} hold different per-row "
                                 "optimizer state")
        take = owner == old
        local = rows[take] // old_shards
        result["weight"][take] = source["weight"][local]
        for name, value in source["rows"].items():
            result["rows"][name][take] = value[local]
    return result


def reshard(source, destination, num_shards: int) -> dict:
    """Rewrite the checkpoint in ``source`` for ``num_shards`` shards, into ``destination``.

    Needs neither Ray nor the whole table in memory. ``destination`` may be
    ``source`` itself (the new manifest then replaces the old one and the old
    files are removed). Returns the new manifest.
    """
    from .._checks import check_int

    manifest = read_manifest(source)
    num_shards = check_int(num_shards, "num_shards", minimum=1,
                           maximum=int(manifest["num_embeddings"]))
    destination = Path(destination)
    destination.mkdir(parents=True, exist_ok=True)
    folder = new_step_folder(destination, int(manifest["step"]))
    names = [f"{folder}/{shard_file(i, num_shards)}" for i in range(num_shards)]
    for index, name in enumerate(names):
        write_shard(destination / name, gather_shard(source, manifest, num_shards, index))
    new = {**manifest, "num_shards": num_shards, "shards": names}
    write_manifest(destination, new)
    return new


def main(argv=None) -> int:
    """``python -m numbapos.distributed SOURCE DESTINATION --num-shards N``."""
    parser = argparse.ArgumentParser(
        prog="python -m numbapos.distributed",
        description="Reshard a ShardedEmbedding checkpoint (no Ray needed; one old and one "
                    "new shard in memory at a time).")
    parser.add_argument("source", help="checkpoint directory (with manifest.json)")
    parser.add_argument("destination", help="directory for the resharded checkpoint")
    parser.add_argument("--num-shards", type=int, required=True, help="new number of shards")
    args = parser.parse_args(argv)
    manifest = reshard(args.source, args.destination, args.num_shards)
    print(f"{args.destination}: {manifest['num_embeddings']} rows in "
          f"{manifest['num_shards']} shards at step {manifest['step']}")
    return 0
