"""Embedding tables larger than one machine: rows sharded over Ray actors.

:class:`ShardedEmbedding` splits a table row-wise (row ``r`` on shard
``r % S``), each shard a Ray actor running numbapos's kernels on its rows and
optimiser state; training is bit-identical to one process. Checkpoints are
per shard with a manifest, and reshard on load or offline
(:func:`~numbapos.distributed.checkpoint.reshard`, no Ray needed).

Ray is an optional dependency (``pip install "numbapos[distributed]"``):
importing this package does not import it; creating a table does.
"""

from ._shard import StaleShardError
from .checkpoint import reshard
from .sharded import ShardedEmbedding

__all__ = ["ShardedEmbedding", "StaleShardError", "reshard"]
