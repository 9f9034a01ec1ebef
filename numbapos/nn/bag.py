"""EmbeddingBag: pooled lookups of a learned table (PyTorch's ``nn.EmbeddingBag``)."""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from ..functional.bag import MODES, embedding_bag, embedding_bag_backward
from ..functional.half import to_table_dtype
from . import init as initializers
from ._outputs import OutputBuffer
from .module import Module
from .parameter import Parameter

__all__ = ["EmbeddingBag"]


class EmbeddingBag(Module):
    """A table of ``num_embeddings`` vectors of size ``embedding_dim`` read as pooled bags.

    Each bag of ids gives the sum, mean or max of its rows
    (:func:`numbapos.functional.embedding_bag`, with PyTorch's semantics).

    Parameters
    ----------
    num_embeddings : int
        Vocabulary size V (>= 0).
    embedding_dim : int
        Vector size D (>= 0).
    max_norm : float, optional
        Rows looked up with a norm above this are clipped in place first.
    norm_type : float, default 2.0
        The p of the p-norm for ``max_norm``.
    scale_grad_by_freq : bool, default False
        Divide each id's gradient by its count over the whole input (not with max).
    mode : {"sum", "mean", "max"}, default "mean"
        How a bag pools.
    sparse : bool, default False
        Accumulate a :class:`~numbapos.sparse.SparseRows` gradient (the rows used only).
    include_last_offset : bool, default False
        ``offsets`` ends with ``len(input)`` (see the functional op).
    padding_idx : int, optional
        Row left out of every bag: zeroed at initialisation, never gets a gradient.
    dtype : float32, float64, bfloat16 or float16, default float32
        The table's dtype; 16-bit tables pool (and get gradients) in float32.
    device : {"cpu", "cuda"}, optional
        Where the table lives (default: the CPU).
    seed : int or numpy.random.Generator, optional
        An int fills the table with :func:`numbapos.nn.init.keyed_normal` as
        :class:`~numbapos.nn.Embedding` does; a Generator (or None) draws N(0, 1).

    Attributes
    ----------
    weight : Parameter
        The table, shape (V, D).

    Examples
    --------
    >>> import numpy as np
    >>> from numbapos.nn.bag import EmbeddingBag
    >>> bag = EmbeddingBag(10, 3, mode="sum", seed=0)
    >>> out = bag(np.array([1, 2, 7]), np.array([0, 1]))
    >>> out.shape
    (2, 3)
    >>> bag.backward(np.ones((2, 3), np.float32)) is None  # no per_sample_weights
    True
    >>> bag.weight.grad[7]
    array([1., 1., 1.], dtype=float32)
    """

    _half_table = "weight"

    def __init__(self, num_embeddings, embedding_dim, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, mode="mean", sparse=False, include_last_offset=False,
                 padding_idx=None, *, _weight=None, dtype=np.float32, device=None, seed=None):
        super().__init__()
        self.num_embeddings = _checks.check_int(num_embeddings, "num_embeddings", minimum=0)
        self.embedding_dim = _checks.check_int(embedding_dim, "embedding_dim", minimum=0)
        self.max_norm, self.norm_type = _checks.check_max_norm(max_norm, norm_type)
        if mode not in MODES:
            raise ValueError(f"mode: expected 'sum', 'mean' or 'max', got {mode!r}")
        if scale_grad_by_freq and mode == "max":
            raise ValueError("scale_grad_by_freq: not supported with mode='max' (as in PyTorch)")
        self.mode = mode
        self.scale_grad_by_freq = bool(scale_grad_by_freq)
        self.sparse = bool(sparse)
        self.include_last_offset = bool(include_last_offset)
        self.padding_idx = _checks.check_padding_idx(padding_idx, self.num_embeddings)
        shape = (self.num_embeddings, self.embedding_dim)
        if _weight is None:
            dtype = _checks.check_table_dtype(dtype)
            init = None
            if seed is not None and not isinstance(seed, np.random.Generator):
                init = initializers.keyed_normal(_checks.check_uint64(seed, "seed"))
            rng = _checks.as_rng(seed)
            half = _checks.is_half_dtype(dtype)
            table = initializers.make_array(init or initializers.normal(), shape,
                                            np.float32 if half else dtype, rng)
            if half:
                table = to_table_dtype(table, dtype)
            if self.padding_idx is not None:
                table[self.padding_idx] = 0
        else:
            table = _checks.check_table(_weight, "_weight")
            if tuple(table.shape) != shape:
                raise ValueError(f"_weight: expected shape {shape} (num_embeddings, "
                                 f"embedding_dim), got {tuple(table.shape)}")
        self.weight = Parameter(table)
        self._grad_values = OutputBuffer()  # reused values of sparse gradients (CPU)
        self._place(device)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, max_norm=None, norm_type=2.0,
                        scale_grad_by_freq=False, mode="mean", sparse=False,
                        include_last_offset=False, padding_idx=None):
        """An EmbeddingBag over an existing 2-D table, used as given (no copy).

        Parameters
        ----------
        embeddings : array_like, shape (V, D)
            The table (float32 / float64 / bfloat16 / float16; lists become float32).
        freeze : bool, default True
            If True the table gets no gradient.
        max_norm, norm_type, scale_grad_by_freq, mode, sparse, include_last_offset, padding_idx
            As for :class:`EmbeddingBag`.
        """
        if isinstance(embeddings, (list, tuple)):
            embeddings = np.asarray(embeddings, dtype=np.float32)
        embeddings = _checks.check_table(embeddings, "embeddings")
        num, dim = embeddings.shape
        module = cls(num, dim, max_norm=max_norm, norm_type=norm_type,
                     scale_grad_by_freq=scale_grad_by_freq, mode=mode, sparse=sparse,
                     include_last_offset=include_last_offset, padding_idx=padding_idx,
                     _weight=embeddings)
        module.weight.requires_grad = not freeze
        return module

    def forward(self, input, offsets=None, per_sample_weights=None):
        """Pool the bags of ``input`` (1-D with ``offsets``, or 2-D); returns ``(B, D)``.

        Outside :class:`numbapos.no_grad` copies of the arguments are recorded
        for the matching :meth:`backward`.
        """
        result = embedding_bag(input, self.weight.data, offsets, max_norm=self.max_norm,
                               norm_type=self.norm_type, mode=self.mode,
                               per_sample_weights=per_sample_weights,
                               include_last_offset=self.include_last_offset,
                               padding_idx=self.padding_idx)
        if self.max_norm is not None:
            self.weight.bump_version()
        if self._recording():
            copy = _device.copy
            self._save_for_backward((
                copy(_checks.check_index_array(input, "input")),
                None if offsets is None else copy(_checks.check_index_array(offsets, "offsets")),
                None if per_sample_weights is None else copy(per_sample_weights),
                tuple(result.shape),
                self._watch((("weight", self.weight),))))
        return result

    def _on_device_change(self) -> None:
        super()._on_device_change()
        self._grad_values.clear()

    def backward(self, grad_output):
        """Accumulate the table gradient of the latest unconsumed :meth:`forward`.

        Returns the gradient of that forward's ``per_sample_weights`` (None
        when none were given). Max mode and weighted bags read the table as
        the forward saw it: a table changed in between raises RuntimeError.

        Raises
        ------
        RuntimeError
            No recorded forward is left, or (max mode, weighted bags) the
            table changed since it.
        TypeError, ValueError
            ``grad_output`` not of the forward's output shape and dtype; the
            record is kept.
        """
        input, offsets, weights, shape, watched = self._saved_context()
        grad_output = _checks.check_float_like(
            grad_output, "grad_output", shape, _checks.grad_dtype(self.weight.dtype),
            "the shape of the matching forward's output", "the table's gradient dtype")
        if self.mode == "max" or weights is not None:
            self._check_unchanged(watched)
        lazy = self.sparse and self.weight.fuses_step  # plain sums summed inside the update
        values_out = None
        if self.sparse and not lazy and type(self.weight.data) is np.ndarray:
            # The previous step's gradient values, once that gradient is dropped.
            values_out = self._grad_values.take((input.size, self.embedding_dim),
                                                grad_output.dtype)
        grad_weight, grad_weights = embedding_bag_backward(
            grad_output, input, self.weight.data, offsets,
            scale_grad_by_freq=self.scale_grad_by_freq, mode=self.mode, sparse=self.sparse,
            per_sample_weights=weights, include_last_offset=self.include_last_offset,
            padding_idx=self.padding_idx, lazy=lazy, values_out=values_out)
        self._release()
        if self.weight.requires_grad:
            self.weight.accumulate_grad(grad_weight, fresh=True)
        return grad_weights

    def extra_repr(self) -> str:
        text = f"{self.num_embeddings}, {self.embedding_dim}, mode={self.mode!r}"
        if self.padding_idx is not None:
            text += f", padding_idx={self.padding_idx}"
        if self.sparse:
            text += ", sparse=True"
        return text
