"""Positional embedding layers: sinusoidal, learned, and NeoML's positional layer."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .. import _checks, _device
from .. import functional as F
from .._docs import MODULE, fill_doc
from ..functional import fractional
from . import _resize
from . import init as initializers
from .dropout import Dropout
from .module import Module
from .parameter import Parameter

# Docstring text of the layers, written once (see numbapos/_docs.py).
_doc = fill_doc(MODULE, {
    "bad_grad_output": """\
TypeError, ValueError
    ``grad_output`` not a float array of the forward input's shape
    (the record is kept).""",
})


def _check_optional_size(value, name):
    return None if value is None else _checks.check_int(value, name, minimum=1)


def _frozen(table):
    if isinstance(table, np.ndarray):
        table.flags.writeable = False  # shared by every call that hits the cache
    return table


def _check_grad(grad_output, shape):
    """``grad_output``: a float array of the matching forward input's ``shape``."""
    grad_output = _checks.check_float_array(grad_output, "grad_output")
    _checks.check_same_shape(grad_output, shape, "grad_output",
                             "the shape of the matching forward's input")
    return grad_output


class SinusoidalPosEmbedding(Module):
    """Adds the fixed sinusoidal position table to its input.

    ``y = x + PE[offset : offset + L]`` broadcast over the batch, with ``PE`` as in
    :func:`numbapos.functional.sinusoidal_pos_embedding` (sin and cos alternating
    along the channels). The layer has no parameters.

    Parameters
    ----------
    seq_len : int, optional
        If given, every input must have exactly this sequence length L. None
        (default) accepts any length.
    embed_dim : int, optional
        If given, every input must have exactly this last dimension D. None
        (default) accepts any width.
    base : float, default 10000.0
        Base of the wavelengths (> 0).
    device : {"cpu", "cuda"}, default "cpu"
        Recorded for :attr:`device`; the table is made on the device of each
        input (and cached per device).

    Attributes
    ----------
    cache_size : int
        How many tables are kept (least recently used dropped first). Tables are
        cached per ``(L, D, dtype, offset)``, so the usual training loop computes
        its table once.

    Examples
    --------
    >>> import numpy as np
    >>> from numbapos.nn import SinusoidalPosEmbedding
    >>> pe = SinusoidalPosEmbedding()
    >>> pe(np.zeros((2, 5, 8), dtype=np.float32)).shape
    (2, 5, 8)
    """

    cache_size = 16

    def __init__(self, seq_len=None, embed_dim=None, base=10000.0, device="cpu"):
        super().__init__()
        self.seq_len = _check_optional_size(seq_len, "seq_len")
        self.embed_dim = _check_optional_size(embed_dim, "embed_dim")
        self.base = _checks.check_positive(base, "base")
        self._tables: OrderedDict = OrderedDict()
        self._place(device)

    def table(self, seq_len, embed_dim, dtype=np.float32, offset=0, device="cpu"):
        """The table of positions ``offset .. offset + seq_len - 1`` on ``device``, cached.

        The same key ``(seq_len, embed_dim, dtype, offset, device)`` returns the
        same array object until it is evicted from the cache (read-only on the
        CPU; do not write a GPU table either).
        """
        seq_len = _checks.check_int(seq_len, "seq_len", minimum=1)
        embed_dim = _checks.check_int(embed_dim, "embed_dim", minimum=1)
        dtype = _checks.check_float_dtype(dtype)
        offset = _checks.check_int(offset, "offset", minimum=0)
        device = _device.check_device(device)
        key = (seq_len, embed_dim, dtype, offset, device)
        table = self._tables.get(key)
        if table is not None:
            self._tables.move_to_end(key)
            return table
        table = _frozen(F.sinusoidal_pos_embedding(seq_len, embed_dim, dtype=dtype,
                                                   base=self.base, offset=offset,
                                                   device=device))
        self._tables[key] = table
        while len(self._tables) > max(1, int(self.cache_size)):
            self._tables.popitem(last=False)
        return table

    def forward(self, x, offset=0, out=None):
        """Return ``x + PE[offset : offset + L]``.

        Parameters
        ----------
        x : ndarray, shape (L, D) or (N, L, D), float32 or float64
        offset : int, default 0
            Position of the first token (>= 0), e.g. the tokens already decoded.
        out : ndarray, optional
            C-contiguous buffer of ``x``'s shape and dtype (may be ``x``).

        Raises
        ------
        TypeError
            Non-float ``x`` or non-integer ``offset``.
        ValueError
            ``x`` not 2-D or 3-D or empty, L or D different from a fixed
            ``seq_len`` / ``embed_dim``, or a negative ``offset``.
        """
        x = _checks.check_float_array(x, "x", ndim=(2, 3))
        seq_len, dim = x.shape[-2:]
        if seq_len == 0 or dim == 0:
            raise ValueError(f"x: expected L > 0 and D > 0, got shape {x.shape}")
        if self.seq_len is not None and seq_len != self.seq_len:
            raise ValueError(
                f"x: sequence length L={seq_len} differs from seq_len={self.seq_len} fixed "
                "at construction; pass seq_len=None for inputs of any length"
            )
        if self.embed_dim is not None and dim != self.embed_dim:
            raise ValueError(
                f"x: last dimension D={dim} differs from embed_dim={self.embed_dim} fixed "
                "at construction; pass embed_dim=None for inputs of any width"
            )
        table = self.table(seq_len, dim, x.dtype, offset, _device.device_of(x))
        y = F.add_positional(x, table, out=out)
        if self._recording():
            self._save_for_backward(tuple(x.shape))
        return y

    @_doc
    def backward(self, grad_output):
        """The gradient wrt ``x`` of the matching forward: ``grad_output`` itself.

        Raises
        ------
        {no_forward}
        ValueError
            ``grad_output`` not of that forward input's shape (the record is kept).
        """
        shape = self._saved_context()
        grad_output = _check_grad(grad_output, shape)
        self._release()
        return grad_output

    def extra_repr(self) -> str:
        return f"seq_len={self.seq_len}, embed_dim={self.embed_dim}, base={self.base}"


_LEARNED_INITS = {
    "normal": lambda: initializers.normal(0.0, 0.02),
    "uniform": lambda: initializers.uniform(-0.1, 0.1),
    "xavier_uniform": lambda: initializers.xavier_uniform(),
    "sinusoidal": lambda: initializers.sinusoidal(),
    "zeros": lambda: initializers.zeros(),
}


@_doc
class LearnedPosEmbedding(Module):
    """A learned table of absolute positions added to its input, then dropout (BERT, GPT-2).

    ``y = dropout(x + P[offset : offset + L])``, or ``dropout(x + P[position_ids])``,
    with the rows broadcast over the batch.

    Parameters
    ----------
    max_len : int
        Number of positions M the table holds (> 0).
    embed_dim : int
        Width D (> 0).
    dropout : float, default 0.0
        Drop probability of the :class:`~numbapos.nn.Dropout` applied to the sum.
    init : str or callable, default "normal"
        ``"normal"`` (N(0, 0.02^2), as BERT and GPT-2), ``"uniform"``
        (U(-0.1, 0.1)), ``"xavier_uniform"``, ``"sinusoidal"`` (a warm start from
        the sinusoidal table), ``"zeros"``, or a callable ``init(shape, rng)``.
    seed : int or numpy.random.Generator, optional
        Seeds the initialiser and then the dropout mask.
    dtype : float32 or float64, default float32
        Dtype of the table (inputs must match).
    {device}

    Attributes
    ----------
    weight : Parameter, shape (max_len, embed_dim)
        The position table.
    dropout : Dropout
        The dropout child module (identity in eval mode or with p = 0).
    """

    def __init__(self, max_len, embed_dim, dropout=0.0, init="normal", seed=None,
                 dtype=np.float32, device="cpu"):
        super().__init__()
        self.max_len = _checks.check_int(max_len, "max_len", minimum=1)
        self.embed_dim = _checks.check_int(embed_dim, "embed_dim", minimum=1)
        dtype = _checks.check_float_dtype(dtype)
        if isinstance(init, str):
            if init not in _LEARNED_INITS:
                raise ValueError(
                    f"init: unknown initialiser {_checks.quote(init)}; expected one of "
                    f"{sorted(_LEARNED_INITS)} or a callable init(shape, rng)"
                )
            init = _LEARNED_INITS[init]()
        elif not callable(init):
            raise TypeError(f"init: expected a string or a callable init(shape, rng), got "
                            f"{_checks.quote(init)}")
        rng = _checks.as_rng(seed)
        table = initializers.make_array(init, (self.max_len, self.embed_dim), dtype, rng)
        self._init = init  # for the new rows of extend_(mode="init")
        self.weight = Parameter(table)
        self.dropout = Dropout(dropout, seed=rng)
        self._place(device)

    def forward(self, x, offset=0, position_ids=None):
        """Return ``dropout(x + P[offset : offset + L])`` (or the rows ``position_ids``).

        Parameters
        ----------
        x : ndarray, shape (L, D) or (N, L, D), float32 or float64
            Same dtype as the table.
        offset : int, default 0
            First position; ``0 <= offset`` and ``offset + L <= max_len``.
        position_ids : array_like of int or float, optional
            Rows to add instead, shape (L,), (1, L) or (N, L); each in
            ``[0, max_len)``. ``offset`` must then be 0. Float positions in
            ``[0, max_len - 1]`` blend the two neighbouring rows linearly
            (position interpolation; the backward sends the gradient to both
            rows, see :func:`numbapos.functional.add_positional_backward`).

        Raises
        ------
        TypeError
            Non-float ``x``, a dtype other than the table's, non-integer
            ``offset`` or ``position_ids``.
        ValueError
            ``x`` not 2-D or 3-D, last dimension not ``embed_dim``, ``offset < 0``
            or ``offset + L > max_len``, ``position_ids`` of the wrong shape.
        IndexError
            A position id outside ``[0, max_len)``.
        """
        x = _checks.check_float_array(x, "x", ndim=(2, 3))
        dim = x.shape[x.ndim - 1]
        if dim != self.embed_dim:
            raise ValueError(
                f"x: last dimension {dim} does not match embed_dim={self.embed_dim} "
                f"(x.shape={tuple(x.shape)})"
            )
        if x.dtype != self.weight.dtype:
            raise TypeError(
                f"x: dtype {x.dtype} differs from the position table's dtype "
                f"{self.weight.dtype}"
            )
        y = F.add_positional(x, self.weight.data, offset=offset, position_ids=position_ids)
        drop = self.dropout._draw(_device.device_of(y))
        y = F.dropout(y, out=y, **drop)
        self.dropout._advance(drop)
        if self._recording():
            if fractional.is_fractional(position_ids):
                position_ids = fractional.positions_copy(position_ids)
            elif position_ids is not None:
                position_ids = _device.copy(_checks.check_index_array(position_ids,
                                                                      "position_ids"))
            self._save_for_backward((tuple(x.shape), offset, position_ids, drop))
        return y

    @_doc
    def backward(self, grad_output):
        """Accumulate the table gradient; return the gradient wrt ``x``.

        The gradient passes back through the dropout mask of the matching
        forward; the table gradient sums it over the batch (repeated
        ``position_ids`` are summed deterministically).

        Raises
        ------
        {no_forward}
        {bad_grad_output}
        """
        shape, offset, position_ids, drop = self._saved_context()
        grad_output = _check_grad(grad_output, shape)
        grad = F.dropout_backward(grad_output, **drop)
        table_grad = None
        if self.weight.requires_grad:
            table_grad = F.add_positional_backward(grad, self.max_len, offset=offset,
                                                   position_ids=position_ids)
        self._release()
        if table_grad is not None:
            self.weight.accumulate_grad(table_grad, fresh=True)
        return grad

    @_doc
    def extend_(self, new_len, mode="linear", *, num_prefix_rows=0, optimizer=None, seed=None):
        """Resize the position table to ``new_len`` rows, in place (longer contexts).

        The rows come from :func:`numbapos.functional.resize_pos_table`; with
        ``mode="init"`` the new rows are drawn from the module's initialiser.
        ``weight`` stays the same :class:`Parameter` (optimisers keep it), with
        the new table as ``data``, no gradient, and a new version.

        Parameters
        ----------
        new_len : int
            Rows of the new table (``max_len`` becomes ``new_len``).
        mode : {"linear", "copy", "repeat_last", "init"}, default "linear"
        num_prefix_rows : int, default 0
            Leading rows kept out of the resampling.
        optimizer : numbapos.optim.Optimizer, optional
            Optimiser of ``weight``: its per-row state (momentum, moments, sums)
            keeps the rows whose values are kept (all old rows but for
            ``"linear"``, which keeps only the prefix) and starts the others as a
            fresh parameter's state starts; step counts are kept. Without it an
            optimiser that has state for ``weight`` refuses the next step (the
            shape changed): pass it, or make a new optimiser.
        {resize_seed}

        Raises
        ------
        TypeError, ValueError
            As for :func:`~numbapos.functional.resize_pos_table`; an optimiser
            that does not hold ``weight``.
        {pending_forwards}
        """
        self.max_len = _resize.resize_param_(self, self.weight, new_len, mode, num_prefix_rows,
                                             self._init, seed, optimizer, "extend_")
        return self

    def extra_repr(self) -> str:
        return f"{self.max_len}, {self.embed_dim}"


POSITIONAL_TYPES = ("learnable_addition", "learnable_mult_addition", "transformers")


@_doc
class PositionalEmbedding(Module):
    """NeoML's positional layer (``CPositionalEmbeddingLayer``).

    Works on ``x`` of shape ``(N, L, *features)``; the trailing features are
    flattened into one vector of size ``embed_dim`` per position.

    - ``"learnable_addition"``: ``Y = X + B[:L]``; B starts as U(-0.02, 0.02).
    - ``"learnable_mult_addition"``: ``Y = A[:L] * X + B[:L]`` elementwise; A
      starts as ones, B as U(-0.02, 0.02).
    - ``"transformers"``: ``Y = X + PE[:L]`` with the sinusoidal table (sin and
      cos alternating); ``x`` must be 3-D (one trailing feature dim); no
      parameters.

    Parameters
    ----------
    max_len : int or None
        Longest sequence accepted. None fixes it at the first input's L, as NeoML
        sizes its parameters from the first input; the parameters are then
        created by that first :meth:`forward`.
    embed_dim : int
        Product of the feature dimensions.
    type : str, default "learnable_addition"
        One of ``"learnable_addition"``, ``"learnable_mult_addition"``,
        ``"transformers"``.
    seed : int or numpy.random.Generator, optional
        Seeds the initialisation of B.
    dtype : float32 or float64, default float32
        Dtype of the parameters (inputs must match).
    {device}

    Attributes
    ----------
    addends : Parameter, shape (max_len, embed_dim)
        B (NeoML's "addends"); learnable types only.
    multipliers : Parameter, shape (max_len, embed_dim)
        A; ``"learnable_mult_addition"`` only.
    """

    def __init__(self, max_len, embed_dim, type="learnable_addition", seed=None,
                 dtype=np.float32, device="cpu"):
        super().__init__()
        self.max_len = _check_optional_size(max_len, "max_len")
        self.embed_dim = _checks.check_int(embed_dim, "embed_dim", minimum=1)
        if not isinstance(type, str) or type not in POSITIONAL_TYPES:
            raise ValueError(f"type: expected one of {list(POSITIONAL_TYPES)}, got "
                             f"{_checks.quote(type)}")
        self.type = type
        self.dtype = _checks.check_float_dtype(dtype)
        self._rng = _checks.as_rng(seed)
        self._tables: dict = {}
        self._place(device)
        if self.max_len is not None:
            self._build()

    def _build(self):
        shape = (self.max_len, self.embed_dim)
        if self.type == "transformers":
            return
        if self.type == "learnable_mult_addition":
            self.multipliers = Parameter(np.ones(shape, dtype=self.dtype))
        self.addends = Parameter(initializers.make_array(
            initializers.uniform(-0.02, 0.02), shape, self.dtype, self._rng))
        self._place(self.__dict__.get("_device", "cpu"))

    def _sinusoid(self, dtype, device):
        table = self._tables.get((dtype, device))
        if table is None:
            table = _frozen(F.sinusoidal_pos_embedding(self.max_len, self.embed_dim,
                                                       dtype=dtype, device=device))
            self._tables[(dtype, device)] = table
        return table

    def forward(self, x):
        """Return Y for ``x`` of shape ``(N, L, *features)``.

        Raises
        ------
        TypeError
            Non-float ``x``, or (learnable types) a dtype other than the parameters'.
        ValueError
            ``x`` with fewer than 3 dims (or not 3-D for ``"transformers"``),
            features whose product is not ``embed_dim``, an empty sequence, or
            L > max_len ("sequence is too long").
        """
        x = _checks.check_float_array(x, "x")
        if x.ndim < 3:
            raise ValueError(f"x: expected shape (N, L, *features), got shape {x.shape}")
        if self.type == "transformers" and x.ndim != 3:
            raise ValueError(
                f"x: type 'transformers' needs exactly one feature dim, (N, L, D); "
                f"got shape {x.shape}"
            )
        batch, seq_len = x.shape[:2]
        features = int(np.prod(x.shape[2:]))
        if features != self.embed_dim:
            raise ValueError(
                f"x: features {x.shape[2:]} hold {features} values per position, "
                f"expected embed_dim={self.embed_dim}"
            )
        if seq_len == 0:
            raise ValueError(f"x: expected a non-empty sequence, got shape {x.shape}")
        if self.type != "transformers" and x.dtype != self.dtype:
            raise TypeError(f"x: dtype {x.dtype} differs from the parameters' dtype {self.dtype}")
        if self.max_len is None:
            self.max_len = seq_len
            self._build()
        elif seq_len > self.max_len:
            raise ValueError(
                f"x: sequence is too long: L={seq_len} but max_len={self.max_len}"
            )
        x3 = x.reshape(batch, seq_len, features)
        if self.type == "learnable_addition":
            y = F.add_positional(x3, self.addends.data)
        elif self.type == "learnable_mult_addition":
            y = F.positional_mult_add(x3, self.multipliers.data, self.addends.data)
        else:
            y = F.add_positional(x3, self._sinusoid(x.dtype, _device.device_of(x)))
        if self._recording():
            mult = self.type == "learnable_mult_addition"
            watched = self._watch((("multipliers", self.multipliers),)) if mult else ()
            self._save_for_backward((_device.copy(x3) if mult else None, tuple(x.shape),
                                     watched))
        return y.reshape(x.shape)

    @_doc
    def backward(self, grad_output):
        """Accumulate the parameter gradients; return the gradient wrt ``x``.

        ``dX = dY`` (times A for ``"learnable_mult_addition"``); ``dB`` and ``dA``
        are summed over the batch into rows ``:L``.

        Raises
        ------
        RuntimeError
            No recorded forward is left, or (``"learnable_mult_addition"``) the
            multipliers changed since it.
        {bad_grad_output}
        """
        x3, shape, watched = self._saved_context()
        grad_output = _check_grad(grad_output, shape)
        self._check_unchanged(watched)
        if self.type == "transformers":
            self._release()
            return grad_output
        g3 = grad_output.reshape(shape[0], shape[1], self.embed_dim)
        if self.type == "learnable_addition":
            grad_b = (F.add_positional_backward(g3, self.max_len)
                      if self.addends.requires_grad else None)
            self._release()
            if grad_b is not None:
                self.addends.accumulate_grad(grad_b, fresh=True)
            return grad_output
        grad_x, grad_a, grad_b = F.positional_mult_add_backward(g3, x3, self.multipliers.data)
        self._release()
        self.multipliers.accumulate_grad(grad_a, fresh=True)
        self.addends.accumulate_grad(grad_b, fresh=True)
        return grad_x.reshape(shape)

    @_doc
    def extend_(self, new_len, mode="linear", *, num_prefix_rows=0, optimizer=None, seed=None):
        """Resize ``addends`` (and ``multipliers``) to ``new_len`` rows, in place.

        As :meth:`LearnedPosEmbedding.extend_`: ``mode="init"`` starts new
        addends at U(-0.02, 0.02) and new multipliers at one; ``"transformers"``
        has no parameters and only raises ``max_len``.

        Parameters
        ----------
        new_len : int
        mode : {"linear", "copy", "repeat_last", "init"}, default "linear"
        num_prefix_rows : int, default 0
        optimizer : numbapos.optim.Optimizer, optional
            Its state of the parameters is resized (see
            :meth:`LearnedPosEmbedding.extend_`).
        seed : int or numpy.random.Generator, optional
            Seeds new addends (default: the module's generator).

        Returns
        -------
        self

        Raises
        ------
        ValueError
            The parameters are not made yet (``max_len=None`` before the first
            forward), or as for :meth:`LearnedPosEmbedding.extend_`.
        {pending_forwards}
        """
        if self.max_len is None:
            raise ValueError("extend_: the parameters are made by the first forward "
                             "(max_len=None); run one first")
        if self.type == "transformers":
            _resize.check_no_pending(self, "extend_")
            self.max_len = _checks.check_int(new_len, "new_len", minimum=1)
            self._tables.clear()
            return self
        rng = self._rng if seed is None else _checks.as_rng(seed)
        params = [(self.addends, initializers.uniform(-0.02, 0.02))]
        if self.type == "learnable_mult_addition":
            params.append((self.multipliers, initializers.ones()))
            # both checked before either changes
            _resize.resized(self.multipliers, new_len, mode, num_prefix_rows, params[1][1], rng)
            for param, _ in params:
                _resize.resize_state(optimizer, param, 1, 0)
        for param, init in params:
            self.max_len = _resize.resize_param_(self, param, new_len, mode, num_prefix_rows,
                                                 init, rng, optimizer, "extend_")
        return self

    def extra_repr(self) -> str:
        return f"{self.max_len}, {self.embed_dim}, type={self.type!r}"
