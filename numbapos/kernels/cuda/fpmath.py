"""Scalar helpers that keep GPU float arithmetic rounding as the CPU's does.

NVVM contracts ``a * b + c`` into a fused multiply-add by default (its
``-fma=1``, which Numba leaves on even without fastmath): one rounding where
the CPU kernels round the product and the sum separately. Products that feed a
sum which must match the CPU bit for bit go through :func:`mul_rn` (or the
per-dtype :func:`mul_f32` / :func:`mul_f64`), libdevice's ``__nv_fmul_rn`` /
``__nv_dmul_rn`` (PTX ``mul.rn``, never contracted). On the CUDA simulator
they are plain multiplies (NumPy scalars never fuse).
"""

import math

import numpy as np
from numba import config, cuda, float32, float64

from .. import scalar

__all__ = []  # device helpers, not launchers


def mul_rn(a, b):
    """``a * b`` rounded once to the operands' dtype, never fused into an FMA."""
    return a * b


def cast_like(x, like):
    """``x`` converted to the (float32 or float64) type of ``like``."""
    return type(like)(x)


if config.ENABLE_CUDASIM:
    @cuda.jit(device=True)
    def mul_f32(a, b):
        return a * b

    mul_f64 = mul_f32
else:  # pragma: no cover - compiled for real GPUs only
    from numba.cuda import libdevice, types
    from numba.cuda.extending import overload

    mul_f32 = libdevice.fmul_rn
    mul_f64 = libdevice.dmul_rn

    @overload(mul_rn, target="cuda", inline="always")
    def _mul_rn_cuda(a, b):
        if a == types.float32 and b == types.float32:
            return lambda a, b: libdevice.fmul_rn(a, b)
        if a == types.float64 and b == types.float64:
            return lambda a, b: libdevice.dmul_rn(a, b)
        return None

    # The shared element updates' helpers (numbapos.kernels.scalar), on the GPU.
    @overload(scalar.mul_rn, target="cuda", inline="always")
    def _scalar_mul_rn_cuda(a, b):
        return _mul_rn_cuda(a, b)

    @overload(scalar.sqrt_rn, target="cuda", inline="always")
    def _scalar_sqrt_rn_cuda(x):
        # The float64 root of a float32 rounds as float32's own correctly rounded root.
        if x == types.float32:
            return lambda x: float32(math.sqrt(x))
        if x == types.float64:
            return lambda x: math.sqrt(x)
        return None

    @overload(cast_like, target="cuda", inline="always")
    def _cast_like_cuda(x, like):
        if like == types.float32:
            return lambda x, like: float32(x)
        if like == types.float64:
            return lambda x, like: float64(x)
        return None


def numba_float(dtype):
    """The Numba type of a float32/float64 NumPy dtype."""
    return float32 if np.dtype(dtype) == np.float32 else float64


def mul_for(dtype):
    """The uncontracted multiply of ``dtype``, for kernels built once per dtype."""
    return mul_f32 if np.dtype(dtype) == np.float32 else mul_f64
