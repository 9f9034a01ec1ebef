"""Embedding: a lookup table of learned vectors (PyTorch's ``nn.Embedding``)."""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from .. import functional as F
from .._grad_mode import _STATE
from ..functional.embedding import _embedding_kept, _lookup_dtype
from ..functional.half import to_table_dtype
from . import init as initializers
from ._outputs import OutputBuffer
from .module import Module
from .parameter import Parameter


def _snapshot(indices):
    """A copy of a forward's ``indices`` for its backward; a CUDA array of an index dtype,
    which the lookup took as it is, is copied without checking it again."""
    if getattr(indices, "dtype", None) in _INDEX_DTYPES and _device.is_cuda_array(indices):
        return _device.copy(indices)
    return _device.copy(_checks.check_index_array(indices))


_INDEX_DTYPES = (np.dtype(np.int64), np.dtype(np.int32))


class Embedding(Module):
    """A table of ``num_embeddings`` vectors of size ``embedding_dim``, looked up by index.

    Parameters
    ----------
    num_embeddings : int
        Vocabulary size V (>= 0; an empty table only serves empty lookups).
    embedding_dim : int
        Vector size D (>= 0).
    padding_idx : int, optional
        Row that marks padding: zeroed at initialisation, never receives a
        gradient. Negative values count from the end.
    max_norm : float, optional
        Rows looked up with a norm above this are clipped in place first.
    norm_type : float, default 2.0
        The p of the p-norm for ``max_norm`` (positive, or ``inf``).
    scale_grad_by_freq : bool, default False
        Scale gradients by the inverse frequency of each index in the batch.
    sparse : bool, default False
        Accumulate a :class:`~numbapos.sparse.SparseRows` gradient that holds
        only the rows used, so :class:`~numbapos.optim.SGD` touches only them.
    _weight : array_like, optional
        Initial float32 / float64 / bfloat16 / float16 table of shape (V, D),
        used as given (no copy; CPU arrays of other libraries are viewed).
    dtype : float32, float64, bfloat16 or float16, default float32
        The table's dtype. bfloat16 (``"bfloat16"``, ``ml_dtypes.bfloat16``,
        ``torch.bfloat16``) and float16 (``"float16"``, ``"half"``,
        ``numpy.float16``, ``torch.float16``) tables take half the memory:
        the initial values are drawn in float32 and rounded to nearest even,
        lookups return float32 (or ``out_dtype``) and gradients are float32
        (see :mod:`numbapos.functional.half`). Either works on both devices,
        with the same bits (a bfloat16 CUDA table is a Numba device array of
        dtype ``ml_dtypes.bfloat16``).
    init : callable, optional
        ``init(shape, rng)`` initialiser; default N(0, 1) as PyTorch (see ``seed``).
    seed : int or numpy.random.Generator, optional
        Seed for the initialiser. Without ``init``, an int seed fills the
        table with the keyed initialiser, :func:`numbapos.nn.init.keyed_normal`
        (``seed``): N(0, 1) values keyed by (seed, row, column), the table
        :class:`numbapos.distributed.ShardedEmbedding` with the same seed
        starts from (one seed, one table). A Generator (or None, fresh
        entropy) draws N(0, 1) from ``numpy.random``; with ``init`` the
        initialiser gets ``numpy.random.default_rng(seed)``.
    device : {"cpu", "cuda"}, optional
        Where the table lives and lookups run; default: where ``_weight``
        lives, else ``"cpu"``.
    out_dtype : dtype, optional
        The lookups' dtype for a 16-bit table: float32 (default) or the
        table's own dtype (a plain row copy). Gradients of the output are
        float32 whichever it is.

    Attributes
    ----------
    weight : Parameter
        The table, shape (V, D).
    """

    _half_table = "weight"  # Module.to("bfloat16") rounds this table

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
                 norm_type=2.0, scale_grad_by_freq=False, sparse=False, _weight=None,
                 dtype=np.float32, init=None, seed=None, device=None, out_dtype=None):
        super().__init__()
        self._grad_values = OutputBuffer()  # reused values of sparse gradients (CPU)
        self.num_embeddings = _checks.check_int(num_embeddings, "num_embeddings", minimum=0)
        self.embedding_dim = _checks.check_int(embedding_dim, "embedding_dim", minimum=0)
        self.padding_idx = _checks.check_padding_idx(padding_idx, self.num_embeddings)
        self.max_norm, self.norm_type = _checks.check_max_norm(max_norm, norm_type)
        self.scale_grad_by_freq = bool(scale_grad_by_freq)
        self.sparse = bool(sparse)
        shape = (self.num_embeddings, self.embedding_dim)
        if _weight is None:
            dtype = _checks.check_table_dtype(dtype)
            if init is None and seed is not None and not isinstance(seed, np.random.Generator):
                # One seed, one table: the keyed fill ShardedEmbedding's shards make.
                seed = _checks.check_uint64(seed, "seed")
                init = initializers.keyed_normal(seed)
            rng = _checks.as_rng(seed)
            if _checks.is_half_dtype(dtype):  # drawn in float32, rounded to nearest even
                table = to_table_dtype(initializers.make_array(
                    init or initializers.normal(), shape, np.float32, rng), dtype)
            else:
                table = initializers.make_array(init or initializers.normal(), shape, dtype,
                                                rng)
            if self.padding_idx is not None:
                table[self.padding_idx] = 0
        else:
            table = _checks.check_table(_weight, "_weight")
            if table.shape != shape:
                raise ValueError(
                    f"_weight: expected shape {shape} (num_embeddings, embedding_dim), "
                    f"got {table.shape}"
                )
        self.weight = Parameter(table)
        # The lookups' dtype; None is the default (float32 for 16-bit tables, else the table's).
        self.out_dtype = None if out_dtype is None else _lookup_dtype(
            self.weight.dtype, out_dtype, _checks.is_half_dtype(self.weight.dtype))
        self._place(device)

    def _lookup_dtype(self):
        if self.out_dtype is not None:
            return self.out_dtype
        return np.dtype(np.float32) if _checks.is_half_dtype(self.weight.dtype) else \
            self.weight.dtype

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None,
                        norm_type=2.0, scale_grad_by_freq=False, sparse=False, out_dtype=None):
        """An Embedding over an existing 2-D table (used as given, padding row kept).

        As PyTorch, the table keeps its dtype and memory: a float32, float64,
        bfloat16 (``ml_dtypes.bfloat16``) or float16 array (NumPy, a detached
        PyTorch CPU tensor or anything NumPy can view, a :class:`Parameter`, a
        CUDA array) is used without a copy, so the
        module trains it in place. Nested lists (which PyTorch refuses) are
        converted to float32, PyTorch's default dtype.

        Parameters
        ----------
        embeddings : array_like, shape (V, D)
            The table.
        freeze : bool, default True
            If True the table gets no gradient (``weight.requires_grad = False``).
        padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse, out_dtype
            As for :class:`Embedding`.

        Raises
        ------
        TypeError
            A table of another dtype than float32 / float64 / bfloat16 /
            float16 (integer tables, which PyTorch accepts, are refused), or
            a tensor that requires grad (pass ``.detach()``).
        ValueError
            A table that is not 2-D.
        """
        if isinstance(embeddings, (list, tuple)):
            embeddings = np.asarray(embeddings, dtype=np.float32)
        embeddings = _checks.check_table(embeddings, "embeddings")
        num, dim = embeddings.shape
        module = cls(num, dim, padding_idx=padding_idx, max_norm=max_norm, norm_type=norm_type,
                     scale_grad_by_freq=scale_grad_by_freq, sparse=sparse, _weight=embeddings,
                     out_dtype=out_dtype)
        module.weight.requires_grad = not freeze
        return module

    def forward(self, indices, out=None):
        """Look up ``indices`` (any shape); returns ``indices.shape + (D,)``.

        Clips rows first when ``max_norm`` is set; see :func:`numbapos.functional.embedding`.
        Outside :class:`numbapos.no_grad` (in either mode) a copy of
        ``indices`` is recorded for the matching :meth:`backward`.
        """
        data = self.weight.data
        recording = _STATE.enabled  # self._recording(), inline
        if (recording and self.max_norm is None and type(indices) is type(data)
                and type(data) is not np.ndarray and indices.dtype in _INDEX_DTYPES):
            # CUDA indices: the lookup kernel writes the backward's copy as it reads them.
            result, kept = _embedding_kept(
                indices, data, self.padding_idx, self.norm_type, out, self.out_dtype)
            self._save_for_backward((kept, self.padding_idx, self.scale_grad_by_freq,
                                     self.sparse))
            return result
        if out is None and type(data) is np.ndarray:
            out = self._output_buffer(indices, np.shape(indices) + (self.embedding_dim,),
                                      self._lookup_dtype())
        result = F.embedding(indices, data, padding_idx=self.padding_idx,
                             max_norm=self.max_norm, norm_type=self.norm_type, out=out,
                             out_dtype=self.out_dtype)
        if self.max_norm is not None:
            self.weight.bump_version()
        if recording:
            # A copy: the backward must use what this forward saw, even if the caller
            # reuses its index buffer in between; the options are fixed here too.
            self._save_for_backward((_snapshot(indices), self.padding_idx,
                                     self.scale_grad_by_freq, self.sparse))
        return result

    def _on_device_change(self) -> None:
        super()._on_device_change()
        self._grad_values.clear()

    def backward(self, grad_output):
        """Accumulate the table gradient of the latest unconsumed :meth:`forward`; returns None.

        Indices carry no gradient, hence the None. A frozen table accumulates
        nothing (the record is still consumed). A bfloat16 / float16 table
        takes a float32 ``grad_output`` (whatever ``out_dtype`` is) and gets
        a float32 gradient, summed in float32, dense or
        :class:`~numbapos.sparse.SparseRows` (PyTorch sums a bfloat16 table's
        gradient in bfloat16, where 4,096 gradients of 1.0 for one id give 256).

        Raises
        ------
        RuntimeError
            No recorded forward is left (see :class:`~numbapos.nn.Module`).
        TypeError, ValueError
            ``grad_output`` not of that forward's output shape
            (``indices.shape + (D,)``) and the table's gradient dtype (float32
            for a 16-bit table); the record is kept.
        """
        indices, padding_idx, scale_grad_by_freq, sparse = self._saved_context()
        weight = self.weight
        grad_output = _checks.check_float_like(
            grad_output, "grad_output", tuple(indices.shape) + (self.embedding_dim,),
            _checks.grad_dtype(weight.data.dtype), "the shape of the matching forward's output",
            "the table's gradient dtype")
        grad = None
        if weight.requires_grad:
            # Summed inside the optimiser's step (weight.fuses_step, read directly).
            lazy = sparse and bool(weight._fused_step_hooks)
            values_out = None
            if sparse and not lazy and type(weight.data) is np.ndarray:
                # The previous step's gradient values, once that gradient is dropped.
                values_out = self._grad_values.take((indices.size, self.embedding_dim),
                                                    grad_output.dtype)
            grad = F.embedding_backward(grad_output, indices, self.num_embeddings,
                                        padding_idx=padding_idx,
                                        scale_grad_by_freq=scale_grad_by_freq, sparse=sparse,
                                        lazy=lazy, values_out=values_out)
        self._release()
        if grad is not None:
            weight._accumulate_computed(grad)
        return None

    def attend(self, h):
        """Logits ``h @ weight.T`` of shape ``h.shape[:-1] + (V,)``, for tied output heads.

        The product is a GEMM, which numbapos leaves to BLAS: on the GPU ``h``
        and the table go through the host and the logits come back to the GPU
        (for speed there, multiply with CuPy or PyTorch on the same arrays).
        Outside :class:`numbapos.no_grad` a copy of ``h`` is recorded for the matching
        :meth:`attend_backward` (its own last-in-first-out channel, separate
        from :meth:`forward`'s).
        """
        h = _checks.check_float_array(h, "h")
        _checks.check_same_device((h, self.weight.data), ("h", "weight"))
        if h.ndim == 0 or h.shape[h.ndim - 1] != self.embedding_dim:
            raise ValueError(
                f"h: expected last dimension embedding_dim={self.embedding_dim}, "
                f"got shape {tuple(h.shape)}"
            )
        logits = _device.to_host(h) @ _device.to_host(self.weight.data).T
        if self._recording():
            self._save_for_backward((_device.copy(h), self._watch((("weight", self.weight),))),
                                    "attend")
        return _device.to_device(logits, _device.device_of(h))

    def attend_backward(self, grad_logits):
        """Gradient wrt ``h`` of the latest unconsumed :meth:`attend`; accumulates the table's.

        Raises
        ------
        RuntimeError
            No recorded attend is left, or the table changed since it.
        TypeError, ValueError
            ``grad_logits`` not a float array of shape ``h.shape[:-1] + (V,)``.
        """
        h, watched = self._saved_context("attend", "attend_backward")
        grad_logits = _checks.check_float_array(grad_logits, "grad_logits")
        _checks.check_same_shape(grad_logits, tuple(h.shape[:-1]) + (self.num_embeddings,),
                                 "grad_logits", "h.shape[:-1] + (num_embeddings,)")
        device = _device.device_of(h)
        _checks.check_same_device((h, grad_logits), ("h", "grad_logits"))
        self._check_unchanged(watched, "attend_backward")
        h_host, grad_host = _device.to_host(h), _device.to_host(grad_logits)
        weight = _device.to_host(self.weight.data)
        if _checks.is_half_dtype(weight.dtype):
            weight = weight.astype(np.float32)  # exact; the gradient is float32
        table_grad = None
        if self.weight.requires_grad:
            flat_grad = grad_host.reshape(-1, self.num_embeddings)
            table_grad = (flat_grad.T @ h_host.reshape(-1, self.embedding_dim)).astype(
                weight.dtype, copy=False)
        grad_h = _device.to_device(grad_host @ weight, device)
        self._release("attend")
        if table_grad is not None:
            self.weight.accumulate_grad(_device.to_device(table_grad, device), fresh=True)
        return grad_h

    def extra_repr(self) -> str:
        parts = [f"{self.num_embeddings}, {self.embedding_dim}"]
        if self.padding_idx is not None:
            parts.append(f"padding_idx={self.padding_idx}")
        if self.max_norm is not None:
            parts.append(f"max_norm={self.max_norm}, norm_type={self.norm_type}")
        if self.scale_grad_by_freq:
            parts.append("scale_grad_by_freq=True")
        if self.sparse:
            parts.append("sparse=True")
        if _checks.is_half_dtype(self.weight.dtype):
            parts.append(f"dtype={self.weight.dtype}")
        if self.out_dtype is not None:
            parts.append(f"out_dtype={self.out_dtype}")
        return ", ".join(parts)
