"""``choose(flag, a, b)``: a select without a branch, so option flags do not stop vectorisation.

An optimiser's element update depends on options (``maximize``, weight decay,
Nesterov, the first momentum step, ...) that are the same for every element.
Written as ``if`` statements they become branches inside the loop, and LLVM,
which does not unswitch such loops at Numba's settings, leaves the loop scalar.
``choose`` computes both values and picks one with an LLVM ``select``, which
vectorises as a blend. Both arguments are always evaluated, so they must be
plain arithmetic (no loads that could be out of bounds, no side effects); the
picked value is exactly the one the ``if`` would give, so results keep their bits.
"""

from ..scalar import select as choose

__all__ = ["choose"]
