"""QuantizedEmbedding: an int8 / int4 row-wise quantised table for inference."""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from .. import functional as F
from .module import Module

_SAME = object()  # from_float's padding_idx default: the source module's own


class QuantizedEmbedding(Module):
    """A lookup table stored in FBGEMM's fused row-wise int8 or int4 format, for inference.

    Each row keeps its codes with its own scale and bias (see
    :func:`numbapos.functional.quantize_rowwise`): 8 bits take ``D + 8``
    bytes a row (about 3.9x less than float32 at D = 256), 4 bits
    ``ceil(D / 2) + 4`` (about 7.8x less). Lookups return float32 and are
    bit-identical to PyTorch's quantised embedding ops. Build one with
    :meth:`from_float`.

    The table is a buffer (``packed``), not a :class:`Parameter`:
    :meth:`parameters` is empty, so optimisers see nothing, and
    :meth:`backward` raises. :meth:`state_dict` holds the packed bytes.

    Parameters
    ----------
    num_embeddings : int
        Rows V (>= 0).
    embedding_dim : int
        Columns D (>= 0).
    bits : {8, 4}, default 8
        Bits per code.
    padding_idx : int, optional
        Row looked up as zeros (may be negative, wrapped by V).
    _packed : array_like of uint8, optional
        The packed table, shape ``(V, rowwise_width(D, bits))``, used as given
        (no copy); default: the table of zeros.
    device : {"cpu", "cuda"}, optional
        Where the table lives; default: where ``_packed`` lives, else ``"cpu"``.

    Attributes
    ----------
    packed : ndarray of uint8
        The packed table (a buffer).
    """

    def __init__(self, num_embeddings, embedding_dim, bits=8, padding_idx=None, _packed=None,
                 device=None):
        super().__init__()
        self.num_embeddings = _checks.check_int(num_embeddings, "num_embeddings", minimum=0)
        self.embedding_dim = _checks.check_int(embedding_dim, "embedding_dim", minimum=0)
        self.bits = _checks.check_bits(bits)
        self.padding_idx = _checks.check_padding_idx(padding_idx, self.num_embeddings)
        shape = (self.num_embeddings, _checks.rowwise_width(self.embedding_dim, self.bits))
        if _packed is None:
            packed = F.quantize_rowwise(np.zeros((self.num_embeddings, self.embedding_dim),
                                                 np.float32), self.bits)
        else:
            packed, _ = _checks.check_packed(_packed, self.bits, self.embedding_dim, "_packed")
            if tuple(packed.shape) != shape:
                raise ValueError(f"_packed: expected shape {shape} (num_embeddings, bytes per "
                                 f"{self.bits}-bit row), got {tuple(packed.shape)}")
            object.__setattr__(self, "_device", _device.device_of(packed))
        self.register_buffer("packed", packed)
        self._place(device)

    @classmethod
    def from_float(cls, embedding_or_table, bits=8, padding_idx=_SAME):
        """Quantise a float table, or the table of an embedding module, for inference.

        Parameters
        ----------
        embedding_or_table : Embedding or array_like
            A :class:`~numbapos.nn.Embedding` (or any module with a ``weight``
            table, such as PyTorch's ``nn.Embedding``: its weight is read
            detached), or a 2-D float32 / float64 / bfloat16 / float16 array
            (NumPy, CUDA, a detached PyTorch tensor). A 16-bit table is
            widened to float32 (exactly) and quantised: the same bytes as
            quantising ``table.astype(float32)``.
        bits : {8, 4}, default 8
            Bits per code.
        padding_idx : int or None, optional
            Row looked up as zeros; default: the module's own ``padding_idx``
            (None for an array).

        Returns
        -------
        QuantizedEmbedding
            On the table's device.

        Raises
        ------
        TypeError, ValueError
            As :func:`~numbapos.functional.quantize_rowwise`, and for a
            ``padding_idx`` outside ``[-V, V)``.
        """
        source = embedding_or_table
        own_padding = None
        if hasattr(source, "weight") and not _checks.is_array(source):
            own_padding = getattr(source, "padding_idx", None)
            source = source.weight
            if getattr(source, "requires_grad", False) is True and hasattr(source, "detach"):
                source = source.detach()  # a module's weight: read, never trained here
        table = _checks.check_table(source, "embedding_or_table")
        packed = F.quantize_rowwise(table, bits)
        num, dim = table.shape
        padding_idx = own_padding if padding_idx is _SAME else padding_idx
        return cls(num, dim, bits=bits, padding_idx=padding_idx, _packed=packed)

    def forward(self, indices, out=None):
        """Look up ``indices`` (any shape): float32 of shape ``indices.shape + (D,)``.

        See :func:`numbapos.functional.quantized_embedding`. Nothing is
        recorded: the module has no backward.
        """
        return F.quantized_embedding(indices, self.packed, self.bits,
                                     padding_idx=self.padding_idx, out=out,
                                     dim=self.embedding_dim)

    def backward(self, grad_output):
        """Refused: a quantised table is for inference only.

        Raises
        ------
        RuntimeError
            Always. Train a float :class:`~numbapos.nn.Embedding` and convert it
            with :meth:`from_float` afterwards.
        """
        raise RuntimeError(
            f"QuantizedEmbedding: the {self.bits}-bit quantised table is for inference and "
            "cannot be trained (no backward, no parameters); train a float32 nn.Embedding "
            "and convert it with QuantizedEmbedding.from_float(embedding, bits=...) afterwards")

    def dequantize(self):
        """The float32 table the packed one stands for, shape (V, D) (see
        :func:`numbapos.functional.dequantize_rowwise`)."""
        return F.dequantize_rowwise(self.packed, self.bits, dim=self.embedding_dim)

    def extra_repr(self) -> str:
        parts = [f"{self.num_embeddings}, {self.embedding_dim}, bits={self.bits}"]
        if self.padding_idx is not None:
            parts.append(f"padding_idx={self.padding_idx}")
        return ", ".join(parts)
