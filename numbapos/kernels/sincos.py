"""``sincos(x)``: float64 sine and cosine written once, the same bits on the CPU and the GPU.

The rotary tables need ``cos`` and ``sin`` of float64 angles. The C library's
and CUDA's implementations agree to within an ulp but not bit for bit, so the
two devices would make different tables. This is fdlibm's algorithm (FreeBSD
``msun``: ``e_rem_pio2.c``'s medium-size reduction, ``k_sin.c``, ``k_cos.c``)
in plain IEEE operations whose order is fixed:

- reduction: ``n = rint(x * 2/pi)`` and ``x - n * pi/2`` with pi/2 in three
  33-bit pieces (each product exact), kept as a head and a tail: exact to
  about 2**-100 for ``|x| < 2**20 * pi/2`` (about 1.6e6: rotary angles up to
  position 2**20); larger angles lose accuracy gradually, the same on both
  devices;
- the kernels' minimax polynomials on ``[-pi/4, pi/4]``, within one ulp.

Every product that feeds a sum goes through :func:`mul`, a plain multiply on
the CPU (Numba does not contract without fast-math) and ``mul.rn`` on the GPU
(``kernels/cuda/rotary.py`` registers it; NVVM would otherwise fuse it into an
FMA, which rounds once instead of twice). The functions are
``register_jitable``: callable from ``@njit`` and ``@cuda.jit`` code (and from
Python on the CUDA simulator).
"""

from numba.extending import overload, register_jitable

_INV_PIO2 = 6.36619772367581382433e-01
_PIO2_1 = 1.57079632673412561417e+00
_PIO2_1T = 6.07710050650619224932e-11
_PIO2_2 = 6.07710050630396597660e-11
_PIO2_2T = 2.02226624879595063154e-21
_PIO2_3 = 2.02226624871116645580e-21
_PIO2_3T = 8.47842766036889956997e-32
_ROUNDER = 6755399441055744.0  # 1.5 * 2**52: x + it - it rounds x to an integer

_S1 = -1.66666666666666324348e-01
_S2 = 8.33333333332248946124e-03
_S3 = -1.98412698298579493134e-04
_S4 = 2.75573137070700676789e-06
_S5 = -2.50507602534068634195e-08
_S6 = 1.58969099521155010221e-10

_C1 = 4.16666666666666019037e-02
_C2 = -1.38888888888741095749e-03
_C3 = 2.48015872894767294178e-05
_C4 = -2.75573143513906633035e-07
_C5 = 2.08757232129817482790e-09
_C6 = -1.13596475577881948265e-11


def mul(a, b):
    """``a * b`` rounded once (never fused into an FMA): see the module docstring."""
    return a * b


@overload(mul, target="cpu")
def _mul_cpu(a, b):
    return lambda a, b: a * b


@register_jitable
def _reduce(x):
    """``(n, y0, y1)``: ``x = n * pi/2 + y0 + y1`` with ``|y0 + y1| <= pi/4`` (about)."""
    fn = (mul(x, _INV_PIO2) + _ROUNDER) - _ROUNDER
    n = int(fn)
    r = x - mul(fn, _PIO2_1)
    w = mul(fn, _PIO2_1T)
    # fdlibm's second and third steps, always taken: pi/2's next 66 bits.
    t = r
    w = mul(fn, _PIO2_2)
    r = t - w
    w = mul(fn, _PIO2_2T) - ((t - r) - w)
    t = r
    w = mul(fn, _PIO2_3)
    r = t - w
    w = mul(fn, _PIO2_3T) - ((t - r) - w)
    y0 = r - w
    y1 = (r - y0) - w
    return n, y0, y1


@register_jitable
def _kernel_sin(x, y):
    z = mul(x, x)
    v = mul(z, x)
    r = _S2 + mul(z, _S3 + mul(z, _S4 + mul(z, _S5 + mul(z, _S6))))
    return x - ((mul(z, mul(0.5, y) - mul(v, r)) - y) - mul(v, _S1))


@register_jitable
def _kernel_cos(x, y):
    z = mul(x, x)
    r = mul(z, _C1 + mul(z, _C2 + mul(z, _C3 + mul(z, _C4 + mul(z, _C5 + mul(z, _C6))))))
    hz = mul(0.5, z)
    w = 1.0 - hz
    return w + (((1.0 - w) - hz) + (mul(z, r) - mul(x, y)))


@register_jitable
def sincos(x):
    """``(sin(x), cos(x))`` of a float64 ``x``, within one ulp (``|x| < 1.6e6``)."""
    n, y0, y1 = _reduce(x)
    s = _kernel_sin(y0, y1)
    c = _kernel_cos(y0, y1)
    quadrant = n & 3
    if quadrant == 0:
        return s, c
    if quadrant == 1:
        return c, -s
    if quadrant == 2:
        return -s, -c
    return -c, s
