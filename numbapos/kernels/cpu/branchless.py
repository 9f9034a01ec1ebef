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

from numba import types
from numba.extending import intrinsic

__all__ = ["choose"]


@intrinsic
def choose(typingctx, flag, if_true, if_false):
    """``if_true if flag else if_false`` as one ``select`` (both already computed).

    ``flag`` is a boolean; the two values have the same numeric type.
    """
    if not (isinstance(flag, types.Boolean) and isinstance(if_true, types.Number)
            and if_true == if_false):
        return None

    def codegen(context, builder, signature, args):
        return builder.select(args[0], args[1], args[2])

    return if_true(flag, if_true, if_false), codegen
