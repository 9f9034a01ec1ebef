"""``kernel(...)``: the ``@njit`` every CPU kernel is compiled with.

``cache=True`` (compiled once per machine, then loaded), ``nogil=True`` (other
Python threads run meanwhile) and Numba's runtime (NRT) off. The kernels never
allocate: their arrays come from the launchers, so reference counting has
nothing to manage, and without NRT

- a call from Python does not wrap each array argument in a fresh
  reference-counted ``MemInfo`` (a ``malloc`` each): an 8-token lookup's
  kernel call went from 0.74 to 0.59 us on the 2-core development machine;
- a row view (``values[j]``) costs no atomic increment and decrement on the
  whole array's count, which two threads taking rows of one array would
  otherwise contend for.

``_nrt`` is Numba's own (underscored) target option; a kernel that allocated
would fail to compile with it, so the tests would say so.
"""

from numba import njit

__all__ = ["kernel"]


def kernel(**options):
    """``@njit(cache=True, nogil=True, _nrt=False, **options)``."""
    return njit(cache=True, nogil=True, _nrt=False, **options)
