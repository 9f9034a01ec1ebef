"""``python -m numbapos.distributed SOURCE DESTINATION --num-shards N``: reshard a checkpoint.

See :func:`numbapos.distributed.checkpoint.main`.
"""

from .checkpoint import main

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
