"""QuantizedEmbedding and QuantizedEmbeddingBag: int8 / int4 row-wise quantised tables for
inference."""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from .. import functional as F
from ..functional.bag import MODES
from ..functional.quantized import quantized_embedding_bag
from .module import Module

_SAME = object()  # from_float's defaults: the source module's own setting


class _QuantizedTable(Module):
    """What the quantised modules share: the packed table as a buffer, no training."""

    _float_module = ("nn.Embedding", "embedding")  # what to train instead (backward's message)

    def _init_table(self, num_embeddings, embedding_dim, bits, padding_idx, _packed, device):
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

    @staticmethod
    def _source(module_or_table, name):
        """``(table, module)``: the float table to quantise and the module it came from
        (None for an array); a PyTorch weight is read detached."""
        source, module = module_or_table, None
        if hasattr(source, "weight") and not _checks.is_array(source):
            module, source = source, source.weight
            if getattr(source, "requires_grad", False) is True and hasattr(source, "detach"):
                source = source.detach()  # a module's weight: read, never trained here
        return _checks.check_table(source, name), module

    def backward(self, grad_output):
        """Refused: a quantised table is for inference only.

        Raises
        ------
        RuntimeError
            Always. Train a float module (:class:`~numbapos.nn.Embedding`,
            :class:`~numbapos.nn.EmbeddingBag`) and convert it with
            :meth:`from_float` afterwards.
        """
        name = type(self).__name__
        raise RuntimeError(
            f"{name}: the {self.bits}-bit quantised table is for inference and "
            f"cannot be trained (no backward, no parameters); train a float32 "
            f"{self._float_module[0]} and convert it with {name}.from_float"
            f"({self._float_module[1]}, bits=...) afterwards")

    def dequantize(self):
        """The float32 table the packed one stands for, shape (V, D) (see
        :func:`numbapos.functional.dequantize_rowwise`)."""
        return F.dequantize_rowwise(self.packed, self.bits, dim=self.embedding_dim)


class QuantizedEmbedding(_QuantizedTable):
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
        self._init_table(num_embeddings, embedding_dim, bits, padding_idx, _packed, device)

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
        table, module = cls._source(embedding_or_table, "embedding_or_table")
        packed = F.quantize_rowwise(table, bits)
        num, dim = table.shape
        if padding_idx is _SAME:
            padding_idx = getattr(module, "padding_idx", None)
        return cls(num, dim, bits=bits, padding_idx=padding_idx, _packed=packed)

    def forward(self, indices, out=None):
        """Look up ``indices`` (any shape): float32 of shape ``indices.shape + (D,)``.

        See :func:`numbapos.functional.quantized_embedding`. Nothing is
        recorded: the module has no backward.
        """
        return F.quantized_embedding(indices, self.packed, self.bits,
                                     padding_idx=self.padding_idx, out=out,
                                     dim=self.embedding_dim)

    def extra_repr(self) -> str:
        parts = [f"{self.num_embeddings}, {self.embedding_dim}, bits={self.bits}"]
        if self.padding_idx is not None:
            parts.append(f"padding_idx={self.padding_idx}")
        return ", ".join(parts)


class QuantizedEmbeddingBag(_QuantizedTable):
    """Pooled lookups (sum, mean, max) of a table in FBGEMM's row-wise int8 or int4 format.

    The inference twin of :class:`~numbapos.nn.EmbeddingBag`, over the packed
    table of :class:`QuantizedEmbedding` (``D + 8`` or ``ceil(D / 2) + 4``
    bytes a row). Sums are bit-identical to PyTorch's quantised bag ops
    (``torch.ops.quantized.embedding_bag_byte_rowwise_offsets`` /
    ``embedding_bag_4bit_rowwise_offsets``); means divide that sum by the
    bag's length and maxima take the largest decoded value per column, where
    PyTorch's quantised ops ignore ``mode`` and return the sum (a bug not
    copied). Build one with :meth:`from_float`. No parameters; :meth:`backward`
    raises.

    Parameters
    ----------
    num_embeddings : int
        Rows V (>= 0).
    embedding_dim : int
        Columns D (>= 0).
    bits : {8, 4}, default 8
        Bits per code.
    mode : {"sum", "mean", "max"}, default "mean"
        How a bag pools.
    include_last_offset : bool, default False
        ``offsets`` ends with ``len(input)`` (see
        :func:`~numbapos.functional.embedding_bag`).
    padding_idx : int, optional
        Row left out of every bag (may be negative, wrapped by V).
    _packed : array_like of uint8, optional
        The packed table, shape ``(V, rowwise_width(D, bits))``, used as given
        (no copy); default: the table of zeros.
    device : {"cpu", "cuda"}, optional
        Where the table lives; default: where ``_packed`` lives, else ``"cpu"``.

    Attributes
    ----------
    packed : ndarray of uint8
        The packed table (a buffer).

    Examples
    --------
    >>> import numpy as np
    >>> from numbapos.nn.bag import EmbeddingBag
    >>> from numbapos.nn.quantized import QuantizedEmbeddingBag
    >>> bag = EmbeddingBag(10, 4, mode="sum", seed=0)
    >>> q = QuantizedEmbeddingBag.from_float(bag, bits=4)
    >>> q(np.array([1, 2, 7]), np.array([0, 1])).shape
    (2, 4)
    """

    _float_module = ("nn.EmbeddingBag", "bag")

    def __init__(self, num_embeddings, embedding_dim, bits=8, mode="mean",
                 include_last_offset=False, padding_idx=None, _packed=None, device=None):
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode: expected 'sum', 'mean' or 'max', got {mode!r}")
        self.mode = mode
        self.include_last_offset = bool(include_last_offset)
        self._init_table(num_embeddings, embedding_dim, bits, padding_idx, _packed, device)

    @classmethod
    def from_float(cls, bag_or_table, bits=8, mode=_SAME, include_last_offset=_SAME,
                   padding_idx=_SAME):
        """Quantise the table of a bag module, or a float table, for pooled inference.

        Parameters
        ----------
        bag_or_table : EmbeddingBag or array_like
            A :class:`~numbapos.nn.EmbeddingBag` (or PyTorch's
            ``nn.EmbeddingBag``, read detached), or a 2-D float32 / float64 /
            bfloat16 / float16 table, quantised as by
            :func:`~numbapos.functional.quantize_rowwise`. The module's
            training options (``max_norm``, ``scale_grad_by_freq``,
            ``sparse``) are not carried: rows are quantised as stored.
        bits : {8, 4}, default 8
            Bits per code.
        mode, include_last_offset, padding_idx : optional
            Default: the module's own (``"mean"``, False and None for a table).

        Returns
        -------
        QuantizedEmbeddingBag
            On the table's device.

        Raises
        ------
        TypeError, ValueError
            As :func:`~numbapos.functional.quantize_rowwise`, and for a bad
            ``mode`` or a ``padding_idx`` outside ``[-V, V)``.
        """
        table, module = cls._source(bag_or_table, "bag_or_table")
        packed = F.quantize_rowwise(table, bits)
        num, dim = table.shape
        if mode is _SAME:
            mode = getattr(module, "mode", "mean")
        if include_last_offset is _SAME:
            include_last_offset = getattr(module, "include_last_offset", False)
        if padding_idx is _SAME:
            padding_idx = getattr(module, "padding_idx", None)
        return cls(num, dim, bits=bits, mode=mode, include_last_offset=include_last_offset,
                   padding_idx=padding_idx, _packed=packed)

    def forward(self, input, offsets=None, per_sample_weights=None, *, out=None):
        """Pool the bags of ``input`` (1-D with ``offsets``, or 2-D): float32 ``(B, D)``.

        See :func:`numbapos.functional.quantized_embedding_bag`
        (``per_sample_weights`` with ``mode="sum"`` only). Nothing is
        recorded: the module has no backward.
        """
        return quantized_embedding_bag(
            input, self.packed, self.bits, offsets, mode=self.mode,
            per_sample_weights=per_sample_weights, include_last_offset=self.include_last_offset,
            padding_idx=self.padding_idx, out=out, dim=self.embedding_dim)

    def extra_repr(self) -> str:
        parts = [f"{self.num_embeddings}, {self.embedding_dim}, bits={self.bits}",
                 f"mode={self.mode!r}"]
        if self.include_last_offset:
            parts.append("include_last_offset=True")
        if self.padding_idx is not None:
            parts.append(f"padding_idx={self.padding_idx}")
        return ", ".join(parts)
