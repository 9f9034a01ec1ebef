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
- :func:`f32_from_bits` / :func:`f32_bits`: a float32 from its IEEE bits and back, a bit
  cast (no arithmetic, NaN payloads kept), so a 16-bit table's element widened with
  :mod:`numbapos.kernels.halfbits` is a float32 value in a register.
"""

import numpy as np
from llvmlite import ir
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


def f32_from_bits(u):
    """The float32 whose IEEE bits are the integer ``u`` (taken modulo 2**32)."""
    return np.uint32(int(u) & 0xFFFFFFFF).view(np.float32)


def f32_bits(x):
    """The IEEE bits of the float32 ``x``, as a uint32."""
    return np.float32(x).view(np.uint32)


@intrinsic
def _bitcast_f32(typingctx, u):
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        bits = context.cast(builder, args[0], signature.args[0], types.uint32)
        return builder.bitcast(bits, ir.FloatType())

    return types.float32(u), codegen


@intrinsic
def _bitcast_u32(typingctx, x):
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))

    return types.uint32(x), codegen


@overload(choose, target="generic", inline="always")
def _choose(flag, if_true, if_false):
    return lambda flag, if_true, if_false: select(flag, if_true, if_false)


@overload(mul_rn, target="cpu", inline="always")
def _mul_rn_cpu(a, b):
    return lambda a, b: a * b


@overload(sqrt_rn, target="cpu", inline="always")
def _sqrt_rn_cpu(x):
    return lambda x: np.sqrt(x)


@overload(f32_from_bits, target="generic", inline="always")
def _f32_from_bits(u):
    return lambda u: _bitcast_f32(u)


@overload(f32_bits, target="generic", inline="always")
def _f32_bits(x):
    return lambda x: _bitcast_u32(x)
