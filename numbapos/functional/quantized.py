"""Int8 / int4 row-wise quantised tables for inference: quantise, dequantise, look up.

The format is FBGEMM's fused row-wise one, byte for byte what PyTorch's
``torch.ops.quantized.embedding_bag_byte_prepack`` and
``embedding_bag_4bit_prepack`` produce, so packed tables move between
numbapos, PyTorch and FBGEMM unchanged:

- **8 bits**: each row is its D codes (uint8), then a float32 scale and a
  float32 bias (little-endian): ``D + 8`` bytes. ``scale = (max - min) / 255``,
  ``bias = min``, ``code = lrint((x - min) * 255 / (max - min + 1e-8))``.
- **4 bits**: each row is ``ceil(D / 2)`` bytes of codes, two per byte (column
  ``2j`` in the low nibble, ``2j + 1`` in the high one), then a float16 scale
  and a float16 bias: ``ceil(D / 2) + 4`` bytes. The bias is the row's
  minimum rounded to float16, ``scale = float16((max - bias) / 15)``,
  ``code = clamp(lrint((x - bias) / scale), 0, 15)``.

Element ``d`` of a row reads back as ``fma(scale, code, bias)`` in float32
(one rounding), which is what PyTorch's (FBGEMM's) quantised lookups and
unpack ops compute: lookups here are bit-identical to theirs.
"""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from ._common import backend_for, check_range, flatten, on_backend
from .bag import _bags
from .half import widen_table

#: The table formats numbapos has: (name, bytes per row of D columns, use, error bound).
#: ``python -m numbapos info`` prints them; the bounds are what tests/ops/test_quantized.py
#: checks, per row, on top of a float32 rounding allowance of ``2**-20 * max|x|``.
TABLE_FORMATS = (
    ("float32 / float64", "4 D / 8 D", "training and inference", "exact"),
    ("bfloat16 / float16 (Embedding(dtype='bfloat16'))", "2 D",
     "training (float32 gradients and updates, stochastic rounding) and inference",
     "stored values exact; float32 stored rounded to nearest even (2**-9 / 2**-12 relative)"),
    ("int8 row-wise (quantize_rowwise(t, 8))", "D + 8",
     "inference only (QuantizedEmbedding, QuantizedEmbeddingBag)",
     "|x - x'| <= (max - min) / 255 / 2: half a step"),
    ("int4 row-wise (quantize_rowwise(t, 4))", "ceil(D / 2) + 4",
     "inference only (QuantizedEmbedding, QuantizedEmbeddingBag)",
     "|x - x'| <= max(scale / 2, |bias - min|): half a step of the float16 "
     "scale = f16((max - bias) / 15), bias = f16(min)"),
)

_UINT8 = np.dtype(np.uint8)
_FLOAT32 = np.dtype(np.float32)


def rowwise_width(dim, bits=8):
    """Bytes per row of a packed table: ``dim + 8`` (8 bits) or ``ceil(dim / 2) + 4`` (4 bits).

    Parameters
    ----------
    dim : int
        Columns D of the float table (>= 0).
    bits : {8, 4}, default 8

    Returns
    -------
    int
    """
    dim = _checks.check_int(dim, "dim", minimum=0)
    return _checks.rowwise_width(dim, _checks.check_bits(bits))


def quantize_rowwise(table, bits=8):
    """Quantise a float table row by row into FBGEMM's fused row-wise format.

    The result is byte for byte ``torch.ops.quantized.embedding_bag_byte_prepack``
    (``bits=8``) or ``embedding_bag_4bit_prepack`` (``bits=4``) of the same
    float32 table (PyTorch's 4-bit prepack refuses an odd D; numbapos packs it,
    the last byte's high nibble zero).

    Parameters
    ----------
    table : ndarray, shape (V, D), float32, float64, bfloat16 or float16
        The table (NumPy, CUDA, a detached PyTorch tensor: a bfloat16 one read
        through its bits). A float64 table is rounded to float32 first; a
        16-bit one is widened to float32 (exactly), so its packed bytes are
        those of ``table.astype(float32)``.
    bits : {8, 4}, default 8
        Bits per code.

    Returns
    -------
    ndarray of uint8, shape ``(V, rowwise_width(D, bits))``
        On ``table``'s device.

    Raises
    ------
    TypeError
        ``table`` not a float array, ``bits`` not an integer.
    ValueError
        ``table`` not 2-D, ``bits`` not 8 or 4, or a value that cannot be
        quantised: NaN or infinite, or a row whose scale or bias would not be
        finite (8 bits: ``max - min`` overflows float32; 4 bits: the minimum or
        ``(max - min) / 15`` rounds beyond float16's 65504). The message names
        the row.

    Notes
    -----
    Error bounds (tested): with 8 bits every element reads back within half a
    step of its float32 value, ``|x - x'| <= (max - min) / 255 / 2`` per row
    (plus float32 rounding: the tests allow ``2**-20`` of the row's largest
    magnitude); with 4 bits within half a step of the float16 scale,
    ``|x - x'| <= scale / 2`` with ``scale = float16((max - float16(min)) / 15)``,
    plus the float16 rounding of the minimum.
    """
    bits = _checks.check_bits(bits)
    table = _checks.check_table(table, "table")
    K = backend_for((table,), ("table",))
    if _checks.is_half_dtype(table.dtype):
        table = widen_table(table)
    table = K.contiguous(table, np.float32)
    num_rows, dim = table.shape
    out = K.empty((num_rows, _checks.rowwise_width(dim, bits)), _UINT8)
    bad = K.quantize_rows(table, bits, out)
    if bad >= 0:
        row = _device.to_host(table[bad])
        if not np.isfinite(row).all():
            culprit = float(row[~np.isfinite(row)][0])
            raise ValueError(f"table: row {bad} holds {culprit!r}; expected finite values for "
                             f"a {bits}-bit table")
        low, high = float(row.min()), float(row.max())
        if bits == 8:
            raise ValueError(f"table: row {bad} spans {low!r} to {high!r}: max - min overflows "
                             "float32, so its 8-bit scale would be infinite")
        raise ValueError(f"table: row {bad} spans {low!r} to {high!r}: its 4-bit bias (the "
                         "minimum) or scale ((max - min) / 15) exceeds float16's range "
                         "(65504), where the format keeps them")
    return out


def dequantize_rowwise(packed, bits, dim=None):
    """The float32 table a packed one stands for (``torch.ops.quantized.embedding_bag_*_unpack``).

    Element ``d`` of row ``r`` is ``fma(scale_r, code_rd, bias_r)`` in float32,
    bit for bit PyTorch's ``embedding_bag_byte_unpack`` / ``embedding_bag_4bit_unpack``.

    Parameters
    ----------
    packed : ndarray of uint8, shape (V, W)
        A table from :func:`quantize_rowwise` (or PyTorch's prepack ops).
    bits : {8, 4}
        Bits per code of ``packed``.
    dim : int, optional
        Columns D; only needed for an odd D with 4 bits (default:
        ``W - 8`` for 8 bits, ``2 * (W - 4)`` for 4 bits).

    Returns
    -------
    ndarray of float32, shape (V, D)

    Raises
    ------
    TypeError
        ``packed`` not a 2-D uint8 array, ``bits`` not an integer.
    ValueError
        ``bits`` not 8 or 4, rows too short, or a ``dim`` that does not fit ``W``.
    """
    bits = _checks.check_bits(bits)
    packed, dim = _checks.check_packed(packed, bits, dim)
    K = backend_for((packed,), ("packed",))
    packed = K.contiguous(packed)
    out = K.empty((packed.shape[0], dim), _FLOAT32)
    K.dequantize_rows(packed, bits, dim, out)
    return out


def quantized_embedding(indices, packed, bits, padding_idx=None, out=None, dim=None):
    """Look up rows of a packed quantised table as float32 (inference only).

    Bit-identical to ``torch.ops.quantized.embedding_bag_byte_rowwise_offsets``
    / ``embedding_bag_4bit_rowwise_offsets`` with one index per bag
    (``offsets = arange(N)``), the ops behind PyTorch's quantised
    ``Embedding`` / ``EmbeddingBag``.

    Parameters
    ----------
    indices : array_like of int
        Row numbers, any shape (0-d included), int32 or int64 (other integer
        dtypes are converted); each in ``[0, V)``.
    packed : ndarray of uint8, shape (V, W)
        A table from :func:`quantize_rowwise`. Not C-contiguous: copied first.
    bits : {8, 4}
        Bits per code of ``packed``.
    padding_idx : int, optional
        Row looked up as zeros (may be negative, wrapped by V): PyTorch's
        quantised bags skip it, so a one-index bag of it sums to zero.
    out : ndarray, optional
        C-contiguous float32 buffer of shape ``indices.shape + (D,)``.
    dim : int, optional
        Columns D, only for an odd D with 4 bits (see :func:`dequantize_rowwise`).

    Returns
    -------
    ndarray of float32, shape ``indices.shape + (D,)``

    Raises
    ------
    TypeError
        Non-integer indices, ``packed`` not a 2-D uint8 array, ``out`` not an array.
    ValueError
        ``bits`` not 8 or 4, ``padding_idx`` outside ``[-V, V)``, ``out`` of the
        wrong shape or dtype.
    IndexError
        An index outside ``[0, V)``, named in the message; nothing is written.
        On the GPU it is raised by the next synchronising call (deferred, as
        for every CUDA lookup).
    """
    bits = _checks.check_bits(bits)
    packed, dim = _checks.check_packed(packed, bits, dim)
    K = backend_for((packed, out), ("packed", "out"))
    indices = on_backend(K, indices)
    num_rows = packed.shape[0]
    padding_idx = _checks.check_padding_idx(padding_idx, num_rows)
    shape = tuple(indices.shape) + (dim,)
    if out is not None:
        out = _checks.check_out(out, shape, _FLOAT32, avoid=(packed, indices))
    flat = flatten(K, indices)
    check_range(K, flat, num_rows, checked_by_kernel=True)  # on the GPU: in the gather
    packed = K.contiguous(packed)
    if out is None:
        out = K.empty(shape, _FLOAT32)
    K.gather_quantized_rows(flat, packed, bits, dim, -1 if padding_idx is None else padding_idx,
                            out.reshape(flat.size, dim))
    return out


def quantized_embedding_bag(input, packed, bits, offsets=None, mode="mean",
                            per_sample_weights=None, include_last_offset=False, padding_idx=None,
                            *, out=None, dim=None):
    """Sums, means or maxima of bags of rows of a packed quantised table (inference only).

    The bags are laid out as for :func:`~numbapos.functional.embedding_bag`
    (the same checks and messages) and pooled in float32. Sums, with or
    without ``per_sample_weights``, are bit-identical to
    ``torch.ops.quantized.embedding_bag_byte_rowwise_offsets`` /
    ``embedding_bag_4bit_rowwise_offsets`` (FBGEMM's kernels): for each entry
    in index order ``acc = fma(scale * w, code, acc + bias * w)``, the two
    products rounded to float32 (without weights, ``scale`` and ``bias`` as
    stored).

    Parameters
    ----------
    input : array_like of int, 1-D or 2-D
        Row ids (int32 / int64), each in ``[0, V)``: 1-D with ``offsets``, or
        2-D, one bag per row (``offsets`` None, ``include_last_offset`` ignored).
    packed : ndarray of uint8, shape (V, W)
        A table from :func:`quantize_rowwise` (or PyTorch's prepack ops).
        Not C-contiguous: copied first.
    bits : {8, 4}
        Bits per code of ``packed``.
    offsets : array_like of int, 1-D, optional
        Where each bag of a 1-D ``input`` starts: from 0, never decreasing,
        never past ``len(input)``; equal offsets make empty bags.
    mode : {"sum", "mean", "max"}, default "mean"
        How a bag pools. A mean is the sum above divided by the number of
        entries (padding left out); a max is the largest decoded value
        ``fma(scale, code, bias)`` per column. PyTorch's quantised ops ignore
        their ``mode`` and return the sum for mean and max; numbapos does not
        copy that bug.
    per_sample_weights : ndarray of float32, optional
        With ``mode="sum"`` only (the other modes raise, as for float bags):
        one weight per id, of ``input``'s shape.
    include_last_offset : bool, default False
        ``offsets`` ends with ``len(input)``, which it must then equal (as
        :func:`~numbapos.functional.embedding_bag`).
    padding_idx : int, optional
        Row left out of every bag (may be negative, wrapped by V), as float
        bags do (PyTorch's quantised ops take no ``padding_idx``; their sum
        over the other entries is the same bits).
    out : ndarray, optional
        C-contiguous float32 buffer of shape (B, D).
    dim : int, optional
        Columns D, only for an odd D with 4 bits (see :func:`dequantize_rowwise`).

    Returns
    -------
    ndarray of float32, shape (B, D)
        B bags (``len(offsets)``, one fewer with ``include_last_offset``, or
        ``input.shape[0]`` for 2-D input); a bag with no entry (or padding
        only) gives zeros.

    Raises
    ------
    TypeError
        Non-integer ids or offsets, ``packed`` not a 2-D uint8 array, weights
        not float32.
    ValueError
        ``bits`` not 8 or 4, a bad ``mode``, bad offsets (not starting at 0,
        decreasing, past the input's end), offsets with 2-D input,
        ``per_sample_weights`` of the wrong shape or with a mode other than
        ``"sum"``, a bad ``padding_idx``, ``dim`` or ``out``.
    IndexError
        An id outside ``[0, V)``. Nothing is written when any error is raised.
        On the GPU bad ids and offsets are raised by the next synchronising
        call (deferred, as for every CUDA lookup).

    Examples
    --------
    >>> import numpy as np
    >>> from numbapos.functional.quantized import quantize_rowwise, quantized_embedding_bag
    >>> packed = quantize_rowwise(np.array([[0, 1], [2, 4], [8, 8]], np.float32), 8)
    >>> quantized_embedding_bag(np.array([0, 1, 2]), packed, 8, np.array([0, 2]), mode="sum")
    array([[2., 5.],
           [8., 8.]], dtype=float32)
    """
    bits = _checks.check_bits(bits)
    packed, dim = _checks.check_packed(packed, bits, dim)
    call = _bags(input, offsets, mode, per_sample_weights, include_last_offset, padding_idx,
                 False, packed.shape[0], _FLOAT32, (packed, out), ("packed", "out"))
    K = call.K
    shape = (call.bags, dim)
    if out is not None:
        out = _checks.check_out(out, shape, _FLOAT32,
                                avoid=(packed, call.flat, call.offsets, call.weights))
    packed = K.contiguous(packed)
    if out is None:
        out = K.empty(shape, _FLOAT32)
    K.pool_quantized_bags(call.flat, call.offsets, call.width, packed, bits, call.mode,
                          call.padding, call.weights, out)
    return out
