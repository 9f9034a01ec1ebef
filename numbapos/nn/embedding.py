"""Embedding: a lookup table of learned vectors (PyTorch's ``nn.Embedding``)."""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from .. import functional as F
from . import init as initializers
from .module import Module
from .parameter import Parameter


class Embedding(Module):
    """A table of ``num_embeddings`` vectors of size ``embedding_dim``, looked up by index.

    Parameters
    ----------
    num_embeddings : int
        Vocabulary size V (> 0).
    embedding_dim : int
        Vector size D (> 0).
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
    _weight : ndarray, optional
        Initial table of shape (V, D), used as given (no copy).
    dtype : float32 or float64, default float32
    init : callable, optional
        ``init(shape, rng)`` initialiser; default N(0, 1) as PyTorch.
    seed : int or numpy.random.Generator, optional
        Seed for the initialiser.
    device : {"cpu", "cuda"}, optional
        Where the table lives and lookups run; default: where ``_weight``
        lives, else ``"cpu"``.

    Attributes
    ----------
    weight : Parameter
        The table, shape (V, D).
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
                 norm_type=2.0, scale_grad_by_freq=False, sparse=False, _weight=None,
                 dtype=np.float32, init=None, seed=None, device=None):
        super().__init__()
        self.num_embeddings = _checks.check_int(num_embeddings, "num_embeddings", minimum=1)
        self.embedding_dim = _checks.check_int(embedding_dim, "embedding_dim", minimum=1)
        self.padding_idx = _checks.check_padding_idx(padding_idx, self.num_embeddings)
        self.max_norm, self.norm_type = _checks.check_max_norm(max_norm, norm_type)
        self.scale_grad_by_freq = bool(scale_grad_by_freq)
        self.sparse = bool(sparse)
        shape = (self.num_embeddings, self.embedding_dim)
        if _weight is None:
            dtype = _checks.check_float_dtype(dtype)
            rng = _checks.as_rng(seed)
            table = initializers.make_array(init or initializers.normal(), shape, dtype, rng)
            if self.padding_idx is not None:
                table[self.padding_idx] = 0
        else:
            table = _checks.check_weight(_weight, "_weight")
            if table.shape != shape:
                raise ValueError(
                    f"_weight: expected shape {shape} (num_embeddings, embedding_dim), "
                    f"got {table.shape}"
                )
        self.weight = Parameter(table)
        self._indices = None
        self._attend_input = None
        self._place(device)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None,
                        norm_type=2.0, scale_grad_by_freq=False, sparse=False):
        """An Embedding over an existing 2-D table (used as given, padding row kept).

        Parameters
        ----------
        embeddings : array_like, shape (V, D)
            The table. A float32/float64 ndarray is used without a copy; other
            array-likes are converted to float32.
        freeze : bool, default True
            If True the table gets no gradient (``weight.requires_grad = False``).
        padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse
            As for :class:`Embedding`.
        """
        if not _checks.is_array(embeddings):
            embeddings = np.asarray(embeddings, dtype=np.float32)
        embeddings = _checks.check_float_array(embeddings, "embeddings", ndim=2)
        num, dim = embeddings.shape
        module = cls(num, dim, padding_idx=padding_idx, max_norm=max_norm, norm_type=norm_type,
                     scale_grad_by_freq=scale_grad_by_freq, sparse=sparse, _weight=embeddings)
        module.weight.requires_grad = not freeze
        return module

    def forward(self, indices, out=None):
        """Look up ``indices`` (any shape); returns ``indices.shape + (D,)``.

        Clips rows first when ``max_norm`` is set; see :func:`numbapos.functional.embedding`.
        """
        result = F.embedding(indices, self.weight.data, padding_idx=self.padding_idx,
                             max_norm=self.max_norm, norm_type=self.norm_type, out=out)
        # A copy: a backward must use what this forward saw, even if the caller
        # reuses its index buffer in between.
        self._indices = _device.copy(_checks.check_index_array(indices))
        return result

    def backward(self, grad_output):
        """Accumulate the table gradient of the last :meth:`forward`; returns None.

        Indices carry no gradient, hence the None. A frozen table accumulates nothing.
        """
        if self._indices is None:
            raise RuntimeError("Embedding.backward called before forward")
        if self.weight.requires_grad:
            grad = F.embedding_backward(grad_output, self._indices, self.num_embeddings,
                                        padding_idx=self.padding_idx,
                                        scale_grad_by_freq=self.scale_grad_by_freq,
                                        sparse=self.sparse,
                                        lazy=self.weight.has_post_accumulate_grad_hooks)
            self.weight.accumulate_grad(grad, fresh=True)
        return None

    def attend(self, h):
        """Logits ``h @ weight.T`` of shape ``h.shape[:-1] + (V,)``, for tied output heads.

        The product is a GEMM, which numbapos leaves to BLAS: on the GPU ``h``
        and the table go through the host and the logits come back to the GPU
        (for speed there, multiply with CuPy or PyTorch on the same arrays).
        """
        h = _checks.check_float_array(h, "h")
        _checks.check_same_device((h, self.weight.data), ("h", "weight"))
        if h.ndim == 0 or h.shape[h.ndim - 1] != self.embedding_dim:
            raise ValueError(
                f"h: expected last dimension embedding_dim={self.embedding_dim}, "
                f"got shape {tuple(h.shape)}"
            )
        self._attend_input = h
        logits = _device.to_host(h) @ _device.to_host(self.weight.data).T
        return _device.to_device(logits, _device.device_of(h))

    def attend_backward(self, grad_logits):
        """Gradient wrt ``h`` of the last :meth:`attend`; accumulates the (dense) table gradient."""
        if self._attend_input is None:
            raise RuntimeError("Embedding.attend_backward called before attend")
        h = self._attend_input
        grad_logits = _checks.check_float_array(grad_logits, "grad_logits")
        _checks.check_same_shape(grad_logits, tuple(h.shape[:-1]) + (self.num_embeddings,),
                                 "grad_logits", "h.shape[:-1] + (num_embeddings,)")
        device = _device.device_of(h)
        _checks.check_same_device((h, grad_logits), ("h", "grad_logits"))
        h_host, grad_host = _device.to_host(h), _device.to_host(grad_logits)
        weight = _device.to_host(self.weight.data)
        if self.weight.requires_grad:
            flat_grad = grad_host.reshape(-1, self.num_embeddings)
            table_grad = (flat_grad.T @ h_host.reshape(-1, self.embedding_dim)).astype(
                weight.dtype, copy=False)
            self.weight.accumulate_grad(_device.to_device(table_grad, device), fresh=True)
        return _device.to_device(grad_host @ weight, device)

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
        return ", ".join(parts)
