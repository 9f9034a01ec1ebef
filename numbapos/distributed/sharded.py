"""ShardedEmbedding: an embedding table split row-wise over Ray actors."""

from __future__ import annotations

import importlib
import os
import time
import uuid
from pathlib import Path

import numpy as np

from .. import _checks
from .. import functional as F
from . import _ray
from . import checkpoint as ckpt
from ._shard import Shard, StaleShardError


def _optimizer_path(optimizer) -> str:
    return f"{optimizer.__module__}:{optimizer.__qualname__}"


def _optimizer_class(path: str):
    module, _, name = path.partition(":")
    target = importlib.import_module(module)
    for part in name.split("."):
        target = getattr(target, part)
    return target


def unique_id_grad(grad_output, unique, inverse, padding_idx=None, scale_grad_by_freq=False):
    """The table gradient of a lookup, summed per unique id: ``(rows, values)``.

    ``unique`` are the sorted distinct ids of the lookup and ``inverse`` maps
    each index to its place in them (``numpy.unique(..., return_inverse=True)``,
    in the indices' shape). The sums run over this compact space of U ids
    (O(ids), never O(V)) with the same deterministic kernel, in input order,
    so ``(rows, values)`` are bit for bit the ``indices`` and ``values`` of
    :func:`numbapos.functional.embedding_backward` with ``sparse=True`` on the
    whole table (padding left out, ``scale_grad_by_freq`` by the same counts).
    """
    padding = None
    if padding_idx is not None:
        at = int(np.searchsorted(unique, padding_idx))
        padding = at if at < unique.size and unique[at] == padding_idx else None
    grad = F.embedding_backward(grad_output, inverse, max(unique.size, 1), padding_idx=padding,
                                scale_grad_by_freq=scale_grad_by_freq, sparse=True)
    return unique[grad.indices], grad.values


class ShardedEmbedding:
    """An embedding table whose rows live on ``num_shards`` Ray actors, trained in place.

    Row ``r`` lives on shard ``r % S`` at local row ``r // S``; each shard is a
    Ray actor that holds its rows and their optimiser state and runs
    numbapos's kernels on them. A step costs one call per shard each way:

    * ``table(ids)`` takes the unique ids, asks each shard for its rows in one
      batched call and assembles the output in input order (NumPy, like
      :class:`numbapos.nn.Embedding`);
    * ``table.backward(grad_output)`` sums the gradient per unique id on the
      driver (in the compact space of the batch's unique ids: O(ids), never
      O(V)) and sends each shard its rows' sums; the optimiser step runs on
      the owning shards (fused into the backward, as TorchRec does).

    After any number of steps the table is bit-identical to one process
    running ``nn.Embedding`` (same options) and the same optimiser: the
    per-id sums are those of :func:`numbapos.functional.embedding_backward`,
    and lazy sparse updates, row clipping and per-row optimiser state are
    row-local. Every shard gets every step (with no rows where it has none),
    so global optimiser state such as a step count advances everywhere.

    Faults: every call carries ``(trainer, step)``. A shard ignores a step it
    has applied and refuses one that skips ahead; when a shard actor dies,
    Ray restarts it (``max_restarts``) and the driver restores it from the
    last checkpoint this table saved (or its initial rows) and replays the
    updates logged since. Ray's own task retries stay off.

    Parameters
    ----------
    num_embeddings : int
        Rows V (>= ``num_shards``).
    embedding_dim : int
        Vector size D.
    num_shards : int
        Number of shard actors S (>= 1).
    padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse
        As for :class:`numbapos.nn.Embedding`. With ``sparse=False`` the
        optimiser sees a dense gradient of each shard's rows (it then moves
        every row, as a dense step does on one machine: O(V / S) per shard).
    dtype : float32 or float64, default float32
    seed : int, default 0
        Seed of the keyed initialiser (:func:`numbapos.nn.init.keyed_normal_`):
        each shard makes its own rows, equal to the same rows of
        ``nn.init.keyed_normal_(nn.Embedding(V, D).weight.data, seed)``; the
        padding row is zeroed.
    optimizer : class, default :class:`numbapos.optim.SGD`
        An optimiser class of :mod:`numbapos.optim` (or one with its interface:
        ``optimizer([param], **optimizer_kwargs)``, ``step()``, and
        ``state_dict()`` / ``load_state_dict()`` for checkpoints).
    optimizer_kwargs : dict
        Its options, e.g. ``{"lr": 0.1, "momentum": 0.9}``; checked on the
        driver before any actor starts. JSON-serialisable (saved in the
        checkpoint manifest).
    threads : int, default 1
        Numba threads per shard (set in the actor: Numba ignores Ray's
        ``OMP_NUM_THREADS``; idle OpenMP threads sleep instead of spinning).
        The driver's ``NUMBA_CACHE_DIR``, if set, is used by every shard.
    max_restarts : int, default 3
        How often Ray may restart a dead shard actor.
    checkpoint_dir : path, optional
        Where :meth:`backward` saves a checkpoint every ``checkpoint_every``
        updates. Each save (this one or :meth:`save`) truncates the replay
        log, which otherwise keeps every update since the table was made
        (each step's unique rows and their gradient sums, on the driver).
    checkpoint_every : int, optional
    actor_options : dict, optional
        Extra ``ActorClass.options(...)`` (``resources``, ``scheduling_strategy``,
        ``runtime_env``...). Shards request ``num_cpus=0`` by default, so that
        S actors fit on a cluster of fewer CPUs; give ``num_cpus`` here to
        reserve cores for them.
    backend : {"ray", "local"}, default "ray"
        ``"local"`` keeps the shards as plain objects in this process, called
        one after the other with the driver's threads (no Ray needed): for
        debugging, and to measure what Ray adds to a step.

    Attributes
    ----------
    step : int
        The last step sent to the shards (updates, and lookups that clip rows
        with ``max_norm``, each count one).
    trainer : str
        This driver's id in the steps it sends.
    recoveries : int
        How many times a shard was restored and replayed.

    Notes
    -----
    Needs Ray (``pip install "numbapos[distributed]"``) and a running Ray
    cluster, or starts a local one through ``ray.init()``. Checkpoint paths
    must be visible to every shard's machine (a shared file system).
    """

    def __init__(self, num_embeddings, embedding_dim, num_shards, padding_idx=None,
                 max_norm=None, norm_type=2.0, scale_grad_by_freq=False, sparse=True,
                 dtype=np.float32, seed=0, optimizer=None, optimizer_kwargs=None, threads=1,
                 max_restarts=3, checkpoint_dir=None, checkpoint_every=None,
                 actor_options=None, backend="ray", _source=None):
        if backend not in ("ray", "local"):
            raise ValueError(f"backend: expected 'ray' or 'local', got {_checks.quote(backend)}")
        self.backend = backend
        self._ray = _ray.require_ray() if backend == "ray" else _ray.LocalRay
        self.num_embeddings = _checks.check_int(num_embeddings, "num_embeddings", minimum=1)
        self.embedding_dim = _checks.check_int(embedding_dim, "embedding_dim", minimum=1)
        self.num_shards = _checks.check_int(num_shards, "num_shards", minimum=1,
                                            maximum=self.num_embeddings)
        self.padding_idx = _checks.check_padding_idx(padding_idx, self.num_embeddings)
        self.max_norm, self.norm_type = _checks.check_max_norm(max_norm, norm_type)
        self.scale_grad_by_freq = bool(scale_grad_by_freq)
        self.sparse = bool(sparse)
        self.dtype = _checks.check_float_dtype(dtype)
        seed = _checks.check_int(seed, "seed", minimum=0, maximum=(1 << 64) - 1)
        self._optimizer, self.optimizer_kwargs = self._check_optimizer(optimizer,
                                                                       optimizer_kwargs)
        threads = _checks.check_int(threads, "threads", minimum=1)
        max_restarts = _checks.check_int(max_restarts, "max_restarts", minimum=-1)
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.checkpoint_every = (None if checkpoint_every is None else
                                 _checks.check_int(checkpoint_every, "checkpoint_every",
                                                   minimum=1))
        if (self.checkpoint_dir is None) != (self.checkpoint_every is None):
            raise ValueError("checkpoint_dir, checkpoint_every: give both or neither")
        self.trainer = uuid.uuid4().hex
        self.step = 0
        self.updates = 0
        self.recoveries = 0
        self._log = []       # (method, per-shard args) of every changing call since _base
        self._base = None    # (directory, manifest) of the last checkpoint saved or loaded
        self._saved = None   # what backward needs from the last forward
        if backend == "ray":
            if not self._ray.is_initialized():
                self._ray.init()
            remote = self._ray.remote(Shard).options(**_ray.actor_options(
                max_restarts, actor_options)).remote
        else:
            def remote(spec, source):
                return _ray.LocalHandle(Shard(spec, source))
        self._shards = []
        for index in range(self.num_shards):
            spec = {"index": index, "num_shards": self.num_shards,
                    "num_embeddings": self.num_embeddings, "embedding_dim": self.embedding_dim,
                    "dtype": self.dtype.name, "padding_idx": self.padding_idx,
                    "max_norm": self.max_norm, "norm_type": self.norm_type,
                    "sparse": self.sparse, "optimizer": self._optimizer,
                    "optimizer_kwargs": self.optimizer_kwargs,
                    "threads": threads if backend == "ray" else None,
                    "cache_dir": os.environ.get("NUMBA_CACHE_DIR")}
            source = ("keyed", seed) if _source is None else _source(index)
            self._shards.append(remote(spec, source))
        # A shard that cannot start fails here (no recovery: there is nothing to restore).
        self._ray.get([shard.status.remote() for shard in self._shards])

    def _check_optimizer(self, optimizer, kwargs):
        from .. import optim
        from ..nn.parameter import Parameter

        optimizer = optim.SGD if optimizer is None else optimizer
        if not callable(optimizer):
            raise TypeError(f"optimizer: expected an optimiser class, got "
                            f"{_checks.quote(optimizer)}")
        kwargs = dict(kwargs or {})
        # The options are checked here, on a one-row stand-in, before any actor starts.
        optimizer([Parameter(np.zeros((1, self.embedding_dim), self.dtype))], **kwargs)
        return optimizer, kwargs

    # ------------------------------------------------------------ constructors

    @classmethod
    def from_embedding(cls, embedding, num_shards, optimizer=None, optimizer_kwargs=None,
                       **options):
        """A sharded copy of ``embedding`` (an :class:`numbapos.nn.Embedding`): rows and options.

        Each shard receives only its own rows. ``options`` are further
        keyword arguments of :class:`ShardedEmbedding` (``threads``,
        ``checkpoint_dir``...).
        """
        from .. import to_host

        table = np.ascontiguousarray(to_host(embedding.weight.data))
        num_shards = _checks.check_int(num_shards, "num_shards", minimum=1,
                                       maximum=table.shape[0])
        return cls(embedding.num_embeddings, embedding.embedding_dim, num_shards,
                   padding_idx=embedding.padding_idx, max_norm=embedding.max_norm,
                   norm_type=embedding.norm_type,
                   scale_grad_by_freq=embedding.scale_grad_by_freq, sparse=embedding.sparse,
                   dtype=table.dtype, optimizer=optimizer, optimizer_kwargs=optimizer_kwargs,
                   _source=lambda index: ("rows", np.ascontiguousarray(table[index::num_shards])),
                   **options)

    @classmethod
    def load(cls, directory, num_shards=None, **options):
        """The table saved in ``directory``, on ``num_shards`` shards (default: as saved).

        With another number of shards each new shard reads its rows (and
        their optimiser state) from the saved shard files itself, one file at
        a time; training continues bit-identically. The trainer id and step
        are the saved ones. ``options``: ``threads``, ``max_restarts``,
        ``checkpoint_dir``, ``checkpoint_every``, ``actor_options``.
        """
        directory = Path(directory)
        manifest = ckpt.read_manifest(directory)
        num_shards = manifest["num_shards"] if num_shards is None else num_shards
        table = cls(manifest["num_embeddings"], manifest["embedding_dim"], num_shards,
                    padding_idx=manifest["padding_idx"], max_norm=manifest["max_norm"],
                    norm_type=manifest["norm_type"],
                    scale_grad_by_freq=manifest["scale_grad_by_freq"],
                    sparse=manifest["sparse"], dtype=manifest["dtype"],
                    optimizer=_optimizer_class(manifest["optimizer"]),
                    optimizer_kwargs=manifest["optimizer_kwargs"],
                    _source=lambda index: ("checkpoint", str(directory), manifest), **options)
        table.trainer, table.step = manifest["trainer"], int(manifest["step"])
        table.updates = int(manifest["updates"])
        table._base = (directory, manifest)  # what a restarted shard is restored from
        return table

    # ------------------------------------------------------------ calls to the shards

    def _run(self, method: str, args: list, log: bool = False) -> list:
        """Call ``method`` on every shard (shard s with ``args[s]``), all at once; results.

        A shard that died, or that answers with :class:`StaleShardError`, is
        restored and replayed, then called again.
        """
        ray = self._ray
        refs = [getattr(shard, method).remote(*a) for shard, a in zip(self._shards, args,
                                                                       strict=True)]
        results = []
        for index, ref in enumerate(refs):
            try:
                results.append(ray.get(ref))
            except (ray.exceptions.RayActorError, StaleShardError):
                self._recover(index)
                results.append(ray.get(getattr(self._shards[index], method).remote(
                    *args[index])))
        if log:
            self._log.append((method, args))
        return results

    def _recover(self, index: int, timeout: float = 120.0) -> None:
        """Bring shard ``index`` back: wait for its actor, restore it, replay the log."""
        ray = self._ray
        shard = self._shards[index]
        # Calls to an actor that Ray is restarting wait for it; a shard that is
        # unreachable for a moment is asked again, a dead one (no restarts left) raises.
        deadline = time.monotonic() + timeout
        while True:
            try:
                status = ray.get(shard.status.remote(), timeout=timeout)
                break
            except ray.exceptions.ActorUnavailableError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        if self._base is not None:
            ray.get(shard.restore.remote(str(self._base[0]), self._base[1]))
        elif status["applied"].get(self.trainer, 0) != 0:
            raise RuntimeError(f"shard {index}: lost updates but there is no checkpoint to "
                               "restore it from")
        for method, args in self._log:
            ray.get(getattr(shard, method).remote(*args[index]))
        self.recoveries += 1

    # ------------------------------------------------------------ forward / backward

    def _split(self, rows):
        """``(order, local)`` of sorted table ``rows``: ``rows[order]`` grouped by shard, and
        each shard's part as its local rows (int64, still sorted)."""
        owner = rows % self.num_shards
        order = np.argsort(owner, kind="stable")
        cuts = np.searchsorted(owner[order], np.arange(self.num_shards + 1))
        local = (rows[order] // self.num_shards).astype(np.int64, copy=False)
        return order, [local[cuts[s]:cuts[s + 1]] for s in range(self.num_shards)]

    def __call__(self, indices):
        return self.forward(indices)

    def forward(self, indices):
        """Look up ``indices`` (any shape); returns ``indices.shape + (D,)`` as a NumPy array.

        Raises
        ------
        TypeError
            Non-integer indices.
        IndexError
            An index outside ``[0, num_embeddings)``, before any shard is called.
        """
        indices = _checks.check_index_array(indices)
        if not isinstance(indices, np.ndarray):
            raise TypeError("indices: expected host (NumPy) indices for a sharded table")
        flat = indices.reshape(-1)
        bounds = (int(flat.min()), int(flat.max())) if flat.size else None
        _checks.check_index_range(flat, self.num_embeddings, bounds)
        unique, inverse = np.unique(flat, return_inverse=True)
        order, local = self._split(unique)
        renorm = self.max_norm is not None
        step = self.step + 1 if renorm else self.step
        args = [(self.trainer, step, rows, renorm) for rows in local]
        parts = self._run("lookup", args, log=renorm)
        self.step = step
        rows = np.empty((unique.size, self.embedding_dim), self.dtype)
        if unique.size:
            rows[order] = np.concatenate(parts)
        inverse = inverse.reshape(indices.shape).astype(np.int64, copy=False)
        self._saved = (unique, inverse)
        return F.embedding(inverse, rows)

    def backward(self, grad_output) -> None:
        """Apply the optimiser step for the gradient of the last forward, on the shards.

        The per-id sums are computed on the driver over the batch's unique ids
        (bit for bit those of :func:`numbapos.functional.embedding_backward`),
        then every shard gets one update call with its rows. Returns None
        (indices carry no gradient).

        Raises
        ------
        RuntimeError
            No forward before.
        TypeError, ValueError
            ``grad_output`` not a float array of shape ``indices.shape + (D,)``;
            nothing is sent to the shards.
        """
        if self._saved is None:
            raise RuntimeError("ShardedEmbedding.backward called before forward")
        rows, values = unique_id_grad(grad_output, *self._saved, self.padding_idx,
                                      self.scale_grad_by_freq)
        order, local = self._split(rows)
        values = values[order]
        cuts = np.cumsum([0] + [part.size for part in local])
        step = self.step + 1
        args = [(self.trainer, step, part, values[cuts[s]:cuts[s + 1]])
                for s, part in enumerate(local)]
        self._run("update", args, log=True)
        self.step = step
        self.updates += 1
        self._saved = None
        if self.checkpoint_every and self.updates % self.checkpoint_every == 0:
            self.save(self.checkpoint_dir)

    # ------------------------------------------------------------ whole table

    def to_embedding(self):
        """An :class:`numbapos.nn.Embedding` holding the whole table (for small tables)."""
        from ..nn import Embedding

        table = np.empty((self.num_embeddings, self.embedding_dim), self.dtype)
        for index, rows in enumerate(self._run("weights", [()] * self.num_shards)):
            table[index::self.num_shards] = rows
        return Embedding(self.num_embeddings, self.embedding_dim, padding_idx=self.padding_idx,
                         max_norm=self.max_norm, norm_type=self.norm_type,
                         scale_grad_by_freq=self.scale_grad_by_freq, sparse=self.sparse,
                         _weight=table)

    def save(self, directory) -> dict:
        """Checkpoint rows and optimiser state into ``directory``; returns the manifest.

        Each shard writes its own file (atomically); the manifest is written
        only after all have. The checkpoint becomes the one a restarted shard
        is restored from, and the replay log starts again from it.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        folder = ckpt.new_step_folder(directory, self.step)
        names = [f"{folder}/{ckpt.shard_file(i, self.num_shards)}"
                 for i in range(self.num_shards)]
        self._run("save", [(str(directory / name),) for name in names])
        manifest = {"format": ckpt.FORMAT, "num_embeddings": self.num_embeddings,
                    "embedding_dim": self.embedding_dim, "num_shards": self.num_shards,
                    "dtype": self.dtype.name, "padding_idx": self.padding_idx,
                    "max_norm": self.max_norm, "norm_type": self.norm_type,
                    "scale_grad_by_freq": self.scale_grad_by_freq, "sparse": self.sparse,
                    "optimizer": _optimizer_path(self._optimizer),
                    "optimizer_kwargs": self.optimizer_kwargs, "trainer": self.trainer,
                    "step": self.step, "updates": self.updates, "shards": names}
        ckpt.write_manifest(directory, manifest)
        self._base = (directory, manifest)
        self._log = []
        return manifest

    def close(self) -> None:
        """Stop the shard actors (the table is unusable afterwards)."""
        for shard in self._shards:
            self._ray.kill(shard, no_restart=True)
        self._shards = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"ShardedEmbedding({self.num_embeddings}, {self.embedding_dim}, "
                f"num_shards={self.num_shards}, step={self.step})")
