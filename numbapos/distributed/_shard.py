"""One shard of a :class:`~numbapos.distributed.ShardedEmbedding`: a Ray actor's class.

A shard owns rows ``index, index + S, index + 2 S, ...`` of the table as its
local rows ``0, 1, 2, ...``, the optimiser state of those rows, and, per
trainer, the last step it applied. It runs numbapos's own ops on them: a
lookup is :func:`~numbapos.functional.embedding` on the local rows asked for
(with ``max_norm`` clipping those rows first), an update is the optimiser's
step on a :class:`~numbapos.sparse.SparseRows` gradient of its rows. The class
is plain Python; :mod:`numbapos.distributed.sharded` makes it an actor.
"""

from __future__ import annotations

import os

import numpy as np


class StaleShardError(RuntimeError):
    """A call whose (trainer, step) does not follow what the shard has applied.

    Raised when an update skips ahead of the shard's last applied step (the
    shard lost updates: it was restarted) or when a lookup expects another
    step than the shard's. The driver answers it by restoring the shard from
    its last checkpoint and replaying the updates logged since.
    """


def configure_process(threads: int, cache_dir: str | None) -> None:
    """Set up this shard's process for Numba, before it runs a kernel.

    Ray sets ``OMP_NUM_THREADS=1`` for its workers, which Numba ignores (its
    pool has one thread per core): the pool is capped here. OpenMP threads
    that spin-wait between parallel regions would burn the cores the other
    shards of the machine need, so they sleep (``OMP_WAIT_POLICY=PASSIVE``,
    read when Numba loads its threading layer, which this call does). With the
    driver's ``cache_dir`` (``NUMBA_CACHE_DIR``) every shard loads the kernels
    the driver compiled instead of compiling them again; numbapos imports its
    kernels on first use, after this.
    """
    import numba

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if cache_dir:
        os.environ["NUMBA_CACHE_DIR"] = cache_dir
        numba.config.CACHE_DIR = cache_dir
    numba.set_num_threads(max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS)))


class Shard:
    """One shard: its rows, their optimiser state and the steps applied.

    Parameters
    ----------
    spec : dict
        ``index``, ``num_shards``, ``num_embeddings``, ``embedding_dim``,
        ``dtype``, ``padding_idx``, ``max_norm``, ``norm_type``, ``sparse``,
        ``optimizer`` (a class), ``optimizer_kwargs``, ``threads``, ``cache_dir``.
    source : tuple
        Where the rows come from: ``("keyed", seed)`` (the keyed initialiser
        of their table rows), ``("rows", array)`` (this shard's rows, copied)
        or ``("checkpoint", directory, manifest)`` (resharded when the
        checkpoint has another number of shards).
    """

    def __init__(self, spec: dict, source: tuple):
        if spec["threads"] is not None:  # None: a local shard, in the driver's process
            configure_process(spec["threads"], spec["cache_dir"])
        self.spec = spec
        self.num_rows = len(range(spec["index"], spec["num_embeddings"], spec["num_shards"]))
        self._install(self._initial(source))

    # ------------------------------------------------------------ state

    def _initial(self, source) -> dict:
        from ..functional import keyed_normal_
        from .checkpoint import gather_shard

        spec = self.spec
        kind = source[0]
        if kind == "checkpoint":
            return gather_shard(source[1], source[2], spec["num_shards"], spec["index"])
        shape = (self.num_rows, spec["embedding_dim"])
        if kind == "keyed":
            weight = np.empty(shape, spec["dtype"])
            rows = spec["index"] + spec["num_shards"] * np.arange(self.num_rows, dtype=np.int64)
            keyed_normal_(weight, source[1], rows=rows)
            padding = spec["padding_idx"]
            if padding is not None and padding % spec["num_shards"] == spec["index"]:
                weight[padding // spec["num_shards"]] = 0
        else:  # "rows": arrays from Ray's object store are read-only: copy
            weight = np.array(source[1], dtype=spec["dtype"], order="C", copy=True)
        return {"weight": weight, "rows": {}, "arrays": {}, "scalars": {}, "applied": {}}

    def _install(self, data: dict) -> None:
        from ..nn.parameter import Parameter
        from ._state import import_state

        spec = self.spec
        weight = np.array(data["weight"], dtype=spec["dtype"], order="C", copy=True)
        if weight.shape != (self.num_rows, spec["embedding_dim"]):
            raise ValueError(f"shard {spec['index']}: rows of shape {weight.shape}, expected "
                             f"{(self.num_rows, spec['embedding_dim'])}")
        self.param = Parameter(weight)
        self.optimizer = spec["optimizer"]([self.param], **spec["optimizer_kwargs"])
        import_state(self.optimizer, {**data["rows"], **data["arrays"], **data["scalars"]})
        self.applied = {str(k): int(v) for k, v in data["applied"].items()}

    def _export(self) -> dict:
        from ._state import export_state, split_state

        rows, arrays, scalars = split_state(export_state(self.optimizer), self.num_rows)
        return {"weight": self.param.data, "rows": rows, "arrays": arrays, "scalars": scalars,
                "applied": dict(self.applied)}

    def _accept(self, trainer: str, step: int, changes: bool) -> bool:
        """Whether to apply a call of ``trainer`` at ``step`` (False: already applied)."""
        last = self.applied.get(trainer, 0)
        if changes:
            if step <= last:
                return False
            if step == last + 1:
                return True
        elif step == last:
            return False
        raise StaleShardError(
            f"shard {self.spec['index']}: trainer {trainer!r} sent step {step}, but the shard "
            f"has applied step {last} (it was restarted or lost updates)")

    # ------------------------------------------------------------ calls

    def lookup(self, trainer: str, step: int, rows, renorm: bool):
        """Local ``rows`` (sorted, unique), clipped first when ``renorm`` (a step of its own)."""
        from .. import functional as F

        weight = self.param.data
        if self._accept(trainer, step, renorm):
            if rows.size:
                F.embedding_renorm_(weight, rows, self.spec["max_norm"], self.spec["norm_type"])
            self.applied[trainer] = step
        return F.embedding(rows, weight)

    def update(self, trainer: str, step: int, rows, values) -> bool:
        """One optimiser step with gradient ``values`` on local ``rows``; False if a replay.

        Every shard gets every step, with no rows where the batch had none of
        its rows, so global optimiser state (step counts) advances on all.
        """
        from ..sparse import SparseRows

        if not self._accept(trainer, step, True):
            return False
        grad = SparseRows(rows, values, self.num_rows)
        if not self.spec["sparse"]:
            dense = np.zeros(self.param.data.shape, values.dtype)
            dense[rows] = values  # assigned, not added: a -0.0 stays -0.0, as in a dense scatter
            grad = dense
        self.param.grad = grad
        try:
            self.optimizer.step()
        finally:
            self.param.grad = None
        self.applied[trainer] = step
        return True

    def weights(self) -> np.ndarray:
        """This shard's rows of the table."""
        return self.param.data

    def save(self, path: str) -> str:
        """Write this shard's checkpoint file (atomically) and return its path."""
        from .checkpoint import write_shard

        write_shard(path, self._export())
        return path

    def restore(self, directory: str, manifest: dict) -> dict:
        """Replace this shard's state by its part of the checkpoint in ``directory``."""
        from .checkpoint import gather_shard

        self._install(gather_shard(directory, manifest, self.spec["num_shards"],
                                   self.spec["index"]))
        return self.status()

    def status(self) -> dict:
        """``{"pid", "threads", "applied"}``: its process, Numba threads and applied steps."""
        import numba

        return {"pid": os.getpid(), "threads": numba.get_num_threads(),
                "applied": dict(self.applied)}
