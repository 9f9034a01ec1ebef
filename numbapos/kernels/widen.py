"""A table element as a number, whatever the table's storage, for both devices.

Fused kernels that take float32 / float64 tables and bfloat16 / float16 ones
(the BERT / GPT-2 blocks) read every table element through :func:`widen`,
with the tables' format (:class:`numbapos._args.TableFormat`): a float element
is returned as it is, and the ``uint16`` bits of a 16-bit element (what kernels
see of a bfloat16 / float16 table) are widened exactly to float32 with
:mod:`numbapos.kernels.halfbits`. One kernel source then serves every table
format, and a 16-bit table gives bit for bit the results of the float32
kernel on the widened table.

Written once and compiled for both targets, as :mod:`numbapos.kernels.scalar`:
a plain Python function (what Numba's CUDA simulator runs) and an overload
that picks the conversion from the element's type when a kernel is compiled.
"""

import numpy as np
from numba import types
from numba.extending import overload

from .._args import TableFormat
from .halfbits import half_to_f32_bits
from .scalar import f32_from_bits

__all__ = []  # device helpers, not launchers

# The format of float32 / float64 tables (read as they are), TableFormat.FLOAT as an int
# (see halfbits.BF16); 16-bit tables have halfbits.BF16 / F16.
FLOAT_TABLES = int(TableFormat.FLOAT)


def widen(x, fmt):
    """``x`` as a number: a float as it is; ``uint16`` bits of format ``fmt`` as float32."""
    if isinstance(x, (np.integer, int)):
        return f32_from_bits(half_to_f32_bits(x, fmt))
    return x


@overload(widen, target="generic", inline="always")
def _widen(x, fmt):
    if isinstance(x, types.Integer):
        return lambda x, fmt: f32_from_bits(half_to_f32_bits(x, fmt))
    if isinstance(x, types.Float):
        return lambda x, fmt: x
    return None
