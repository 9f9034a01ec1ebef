"""Collections of pooled tables read by named features (TorchRec's ``EmbeddingBagConfig``
and ``EmbeddingBagCollection``), every table in one kernel launch per direction."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import _checks, _device
from .._alignment import table_empty
from ..functional.collection import (
    CollectionLayout,
    _backward,
    _forward,
    check_pooling,
    pack_tables,
)
from ..functional.half import to_table_dtype
from ..jagged import KeyedArray, KeyedJaggedArray
from ._outputs import OutputBuffer
from .bag import EmbeddingBag
from .containers import ModuleDict
from .module import Module

__all__ = ["EmbeddingBagCollection", "EmbeddingBagConfig"]


@dataclass(frozen=True)
class EmbeddingBagConfig:
    """One table of an :class:`EmbeddingBagCollection` (TorchRec's ``EmbeddingBagConfig``).

    Parameters
    ----------
    name : str
        The table's name (its state is ``embedding_bags.<name>.weight``).
    num_embeddings : int
        Rows (>= 1).
    embedding_dim : int
        Columns (>= 1).
    feature_names : list of str
        The input keys this table pools, each its own output key.
    pooling : {"sum", "mean", "max"}, default "sum"
        How a bag pools; any case, or an enum whose ``value`` is one of them
        (TorchRec's ``PoolingType.SUM`` / ``MEAN``). TorchRec's default is sum.

    Raises
    ------
    TypeError, ValueError
        A name or feature that is not a non-empty str, sizes below 1, no
        features or one twice, an unknown pooling.
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: tuple = ()
    pooling: str = "sum"

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name or "." in self.name:
            raise ValueError(f"name: expected a non-empty str without dots, got "
                             f"{_checks.quote(self.name)}")
        _checks.check_int(self.num_embeddings, "num_embeddings", minimum=1)
        _checks.check_int(self.embedding_dim, "embedding_dim", minimum=1)
        features = self.feature_names
        if isinstance(features, str) or not isinstance(features, (list, tuple)):
            raise TypeError(f"feature_names: expected a list of str, got "
                            f"{_checks.type_name(features)}")
        if not features:
            raise ValueError(f"feature_names: table {self.name!r} reads no feature")
        for feature in features:
            if not isinstance(feature, str) or not feature:
                raise TypeError(f"feature_names: expected non-empty str, got "
                                f"{_checks.quote(feature)}")
        if len(set(features)) != len(features):
            raise ValueError(f"feature_names: table {self.name!r} lists a feature twice: "
                             f"{list(features)}")
        object.__setattr__(self, "feature_names", tuple(features))
        object.__setattr__(self, "pooling", check_pooling(self.pooling, "pooling"))


class EmbeddingBagCollection(Module):
    """Several pooled tables, each read by named features, in one kernel per direction
    (TorchRec's ``EmbeddingBagCollection``).

    The forward takes a :class:`~numbapos.jagged.KeyedJaggedArray` and returns a
    :class:`~numbapos.jagged.KeyedArray` whose columns are each (table,
    feature)'s pooled bag, in table order then feature order (TorchRec's); a
    feature read by several tables is keyed ``"feature@table"`` in each. All
    the tables' bags are pooled by one kernel, and one kernel writes every
    table's gradient; the tables live in one flat buffer, each table's
    :class:`Parameter` a ``(num_embeddings, embedding_dim)`` view of it.

    Parameters
    ----------
    tables : sequence of EmbeddingBagConfig
        Unique names.
    is_weighted : bool, default False
        Scale each id by the input's weights (TorchRec's weighted collection);
        every table must then pool with sum.
    sparse : bool, default True
        Accumulate each table's gradient as :class:`~numbapos.sparse.SparseRows`
        (the rows used only), as TorchRec's fused (FBGEMM) tables update only
        the rows looked up; False gives dense gradients (TorchRec's unsharded
        module, plain ``nn.EmbeddingBag`` tables).
    dtype : float32, float64, bfloat16 or float16, default float32
        The tables' dtype; 16-bit tables pool in float32 (exact widening) and
        get float32 gradients, as :class:`~numbapos.nn.EmbeddingBag`'s.
    device : {"cpu", "cuda"}, default "cpu"
    seed : int or numpy.random.Generator, optional
        Each table is drawn from U(-sqrt(1/V), sqrt(1/V)) (TorchRec's default
        initialiser), tables in order, from ``numpy.random.default_rng(seed)``.

    Attributes
    ----------
    embedding_bags : ModuleDict
        One :class:`~numbapos.nn.EmbeddingBag` per table (as TorchRec), its
        ``weight`` a view of the shared buffer: ``state_dict()`` keys are
        ``embedding_bags.<name>.weight``.

    Notes
    -----
    Unlike TorchRec, an input key that no table reads raises ``ValueError``
    naming it (TorchRec ignores it silently, which hides a misspelt feature).
    An id outside its table raises ``IndexError`` naming the feature, the
    sample and the id, before anything is written (on the GPU as a deferred
    error at the next call, nothing modified). Moving (``to``) or casting the
    module, or replacing a table's ``.data``, rebuilds the shared buffer at
    the next forward.

    Examples
    --------
    >>> import numpy as np
    >>> from numbapos.jagged import KeyedJaggedArray
    >>> from numbapos.nn.collection import EmbeddingBagCollection, EmbeddingBagConfig
    >>> ebc = EmbeddingBagCollection([
    ...     EmbeddingBagConfig(name="users", num_embeddings=10, embedding_dim=4,
    ...                        feature_names=["user"]),
    ...     EmbeddingBagConfig(name="products", num_embeddings=20, embedding_dim=3,
    ...                        feature_names=["item", "clicked"], pooling="mean")], seed=0)
    >>> kjt = KeyedJaggedArray(["user", "item", "clicked"], np.array([1, 2, 5, 7, 9, 11]),
    ...                        lengths=np.array([1, 1, 1, 2, 0, 1]))
    >>> out = ebc(kjt)
    >>> out.keys(), out.values().shape
    (['user', 'item', 'clicked'], (2, 10))
    >>> ebc.backward(np.ones((2, 10), np.float32)) is None
    True
    """

    def __init__(self, tables, *, is_weighted=False, sparse=True, dtype=np.float32,
                 device="cpu", seed=None):
        super().__init__()
        if isinstance(tables, EmbeddingBagConfig) or not isinstance(tables, (list, tuple)):
            raise TypeError(f"tables: expected a list of EmbeddingBagConfig, got "
                            f"{_checks.type_name(tables)}")
        names = set()
        for k, table in enumerate(tables):
            if not isinstance(table, EmbeddingBagConfig):
                raise TypeError(f"tables[{k}]: expected an EmbeddingBagConfig, got "
                                f"{_checks.type_name(table)}")
            if table.name in names:
                raise ValueError(f"tables: the name {table.name!r} is used twice; table names "
                                 "must be unique")
            names.add(table.name)
            if hasattr(ModuleDict, table.name):
                raise ValueError(f"tables[{k}]: the name {table.name!r} is an attribute of "
                                 "ModuleDict (embedding_bags.<name> must be free, as in "
                                 "PyTorch's ModuleDict); rename the table")
        dtype = _checks.check_table_dtype(dtype)
        half = _checks.is_half_dtype(dtype)
        self._configs = tuple(tables)
        self._layout = CollectionLayout(
            [(t.name, t.num_embeddings, t.embedding_dim, t.pooling, t.feature_names)
             for t in tables], is_weighted)
        self.is_weighted = bool(is_weighted)
        self.sparse = bool(sparse)
        rng = _checks.as_rng(seed)
        flat = table_empty(self._layout.num_elements, np.float32 if half else dtype)
        for t, table in enumerate(tables):
            bound = np.sqrt(1.0 / table.num_embeddings)
            start, end = self._layout.table_start[t], self._layout.table_start[t + 1]
            flat[start:end] = rng.uniform(-bound, bound, end - start)
        if half:
            flat = to_table_dtype(flat, dtype)
        views = self._layout.tables(flat)
        self.embedding_bags = ModuleDict({
            table.name: EmbeddingBag(table.num_embeddings, table.embedding_dim,
                                     mode=table.pooling, sparse=self.sparse,
                                     include_last_offset=True, _weight=view)
            for table, view in zip(tables, views, strict=True)})
        self._flat, self._views = flat, [p.data for p in self._params()]
        self._grad_values = OutputBuffer()  # reused values of sparse gradients (CPU)
        self._place(device)

    def _params(self):
        return [bag.weight for bag in self.embedding_bags.values()]

    def _on_device_change(self) -> None:
        super()._on_device_change()
        self._grad_values.clear()

    def embedding_bag_configs(self) -> list:
        """The tables' configs (TorchRec's method)."""
        return list(self._configs)

    def _buffer(self):
        """The flat buffer the tables are views of; rebuilt (the tables copied in, their
        ``data`` replaced by views of it) when one was moved, cast or replaced."""
        params = self._params()
        if all(p.data is v for p, v in zip(params, self._views, strict=True)):
            return self._flat
        flat = pack_tables([p.data for p in params], self._layout)
        for p, view in zip(params, self._layout.tables(flat), strict=True):
            p.data = view
        self._flat, self._views = flat, [p.data for p in params]
        return flat

    def forward(self, features):
        """Pool every table's bags of ``features`` (a
        :class:`~numbapos.jagged.KeyedJaggedArray`); returns a
        :class:`~numbapos.jagged.KeyedArray` of ``(B, total_dim)``.

        Outside :class:`numbapos.no_grad` copies of the ids (and weights) are
        recorded for the matching :meth:`backward`.
        """
        if not isinstance(features, KeyedJaggedArray):
            raise TypeError(f"features: expected a KeyedJaggedArray, got "
                            f"{_checks.type_name(features)}")
        flat = self._buffer()
        recording = self._recording()
        # Recording, the kernel copies the ids as it reads them (the record's copy).
        values, ids = _forward(features, flat, self._layout, None, recording)
        if recording:
            copy = _device.copy
            weights = features.weights_or_none() if self.is_weighted else None
            saved = KeyedJaggedArray._trusted(
                features.keys(), ids, copy(features.offsets()),
                None if weights is None else copy(weights), features.stride())
            named = [(f"embedding_bags.{n}.weight", b.weight)
                     for n, b in self.embedding_bags.items()]
            self._save_for_backward((saved, flat, tuple(values.shape), self._watch(named)))
        return KeyedArray(self._layout.embedding_names, self._layout.dims, values)

    def backward(self, grad_output):
        """Accumulate each table's gradient of the latest unconsumed :meth:`forward`.

        ``grad_output`` is the ``(B, total_dim)`` gradient of the output's
        ``values()`` (or a :class:`~numbapos.jagged.KeyedArray` of it). Returns
        the gradient of that forward's weights (weighted collections), else None.

        Raises
        ------
        RuntimeError
            No recorded forward is left, or (max tables, weighted) a table
            changed since it.
        TypeError, ValueError
            ``grad_output`` not of the forward's output shape and dtype; the
            record is kept.
        """
        saved, flat, shape, watched = self._saved_context()
        if isinstance(grad_output, KeyedArray):
            grad_output = grad_output.values()
        grad_output = _checks.check_float_like(
            grad_output, "grad_output", shape, _checks.grad_dtype(flat.dtype),
            "the shape of the matching forward's output", "the tables' gradient dtype")
        if self.is_weighted or "max" in self._layout.poolings:
            self._check_unchanged(watched)
        # The recorded ids were checked by the forward and are the record's own copy.
        take = self._grad_values.take if type(flat) is np.ndarray else None
        # Every table's update fused: plain sums are summed inside the updates.
        lazy = self.sparse and all(p.fuses_step or not p.requires_grad for p in self._params())
        grads, grad_weights = _backward(grad_output, saved, flat, self._layout, self.sparse,
                                        False, take, lazy)
        self._release()
        for param, grad in zip(self._params(), grads, strict=True):
            if param.requires_grad:
                param.accumulate_grad(grad, fresh=True)
        return grad_weights

    def extra_repr(self) -> str:
        tables = ", ".join(f"{t.name}: {t.num_embeddings}x{t.embedding_dim} {t.pooling} "
                           f"{list(t.feature_names)}" for t in self._configs)
        weighted = ", is_weighted=True" if self.is_weighted else ""
        return f"tables=[{tables}]{weighted}, sparse={self.sparse}"
