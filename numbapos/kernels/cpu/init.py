"""CPU launcher and kernel of the keyed initialiser: N(mean, std^2) values keyed by row.

Element ``(j, d)`` of the output is a function of ``(seed, rows[j], d)`` only
(:func:`numbapos.kernels.hash.keyed_normal`), so any subset of a table's rows
can be filled on its own and equals the same rows of a whole-table fill.
Twinned in ``kernels/cuda/init.py``.
"""

from numba import prange

from ..hash import keyed_normal
from .arrays import pick
from .jit import kernel

__all__ = ["keyed_normal_rows_"]


def keyed_normal_rows_(rows, seed, mean, std, out):
    """``out[j, d] = mean + std * z(seed, rows[j], d)`` for int64 ``rows`` and a 2-D ``out``."""
    if out.size:
        pick(_keyed_normal_rows, out.size)(rows, seed, mean, std, out)


@kernel(parallel=True)
def _keyed_normal_rows(rows, seed, mean, std, out):
    """The rows split across threads."""
    for j in prange(rows.size):
        for d in range(out.shape[1]):
            out[j, d] = mean + std * keyed_normal(seed, rows[j], d)
