"""Ray, imported only when a sharded table needs it (``import numbapos`` never does)."""

from __future__ import annotations

INSTALL_HINT = 'pip install "numbapos[distributed]"'


def require_ray():
    """The ``ray`` module, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as err:  # pragma: no cover - exercised in a subprocess test
        raise ImportError(
            "numbapos.distributed.ShardedEmbedding runs its shards as Ray actors, and Ray is "
            f"not installed: {INSTALL_HINT} (Ray >= 2.60)"
        ) from err
    return ray


def actor_options(max_restarts: int, extra: dict | None) -> dict:
    """Options of a shard actor: see :class:`~numbapos.distributed.ShardedEmbedding`."""
    options = {
        # A shard uses its threads outside Ray's CPU accounting: an actor that
        # reserved a CPU each would leave a small cluster unable to schedule.
        "num_cpus": 0,
        # One call at a time: the updates of a shard are applied in order.
        "max_concurrency": 1,
        # A killed shard is restarted (and brought back by the driver) ...
        "max_restarts": max_restarts,
        # ... but no call is re-run by Ray on its own on the fresh actor.
        "max_task_retries": 0,
    }
    extra = dict(extra or {})
    options.update(extra)
    return options


class _LocalMethod:
    def __init__(self, method):
        self.remote = method


class LocalHandle:
    """A shard object in this process, called like an actor handle (``h.method.remote(...)``)."""

    def __init__(self, shard):
        self._shard = shard

    def __getattr__(self, name):
        return _LocalMethod(getattr(self._shard, name))


class _NoActorError(Exception):
    """Never raised: local shards cannot die on their own."""


class LocalRay:
    """The few ``ray`` calls a table makes, for shards that are objects in this process."""

    class exceptions:  # noqa: N801 - mirrors ray.exceptions
        RayActorError = ActorUnavailableError = _NoActorError

    @staticmethod
    def get(result, timeout=None):
        return result

    @staticmethod
    def kill(handle, no_restart=True):
        pass
