"""Scalar helpers that the shared element updates call, with one meaning per device.

Written once and compiled for both targets, as :mod:`numbapos.kernels.hash`:
each is a plain Python function (what Numba's CUDA simulator runs) with an
implementation per target.

- :func:`choose`: ``a if flag else b`` as one ``select``, on the CPU and the
  GPU alike (see :mod:`numbapos.kernels.cpu.branchless`: a branch inside a
  loop stops LLVM from vectorising it).
- :func:`mul_rn`: ``a * b`` rounded once, never fused into an FMA. A plain
  multiply on the CPU (LLVM does not contract there); on the GPU NVVM
  contracts ``a * b + c`` by default, so :mod:`numbapos.kernels.cuda.fpmath`
  registers libdevice's ``mul.rn`` for it when the CUDA backend is imported.
- :func:`sqrt_rn`: the correctly rounded square root in the operand's dtype
  (``np.sqrt`` on the CPU; on the GPU :mod:`~numbapos.kernels.cuda.fpmath`
  registers the float64 root cast back, which rounds the same for float32).
"""

import numpy as np
from numba import types
from numba.extending import intrinsic, overload

__all__ = []  # device helpers, not launchers


@intrinsic
def select(typingctx, flag, if_true, if_false):
    """``if_true if flag else if_false`` as one LLVM ``select`` (both already computed).

    ``flag`` is a boolean; the two values have the same numeric type. Jitted
    code only (see :func:`choose` for the version that also runs in Python).
    """
    if not (isinstance(flag, types.Boolean) and isinstance(if_true, types.Number)
            and if_true == if_false):
        return None

    def codegen(context, builder, signature, args):
        return builder.select(args[0], args[1], args[2])

    return if_true(flag, if_true, if_false), codegen


def choose(flag, if_true, if_false):
    """``if_true if flag else if_false`` (both already computed), without a branch."""
    return if_true if flag else if_false


def mul_rn(a, b):
    """``a * b`` rounded once to the operands' dtype, never fused into an FMA."""
    return a * b


def sqrt_rn(x):
    """The square root of ``x`` in ``x``'s float dtype, correctly rounded."""
    return np.sqrt(x)


@overload(choose, target="generic", inline="always")
def _choose(flag, if_true, if_false):
    return lambda flag, if_true, if_false: select(flag, if_true, if_false)


@overload(mul_rn, target="cpu", inline="always")
def _mul_rn_cpu(a, b):
    return lambda a, b: a * b


@overload(sqrt_rn, target="cpu", inline="always")
def _sqrt_rn_cpu(x):
    return lambda x: np.sqrt(x)
