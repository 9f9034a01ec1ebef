"""Row-sparse gradients of embedding tables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _checks


@dataclass(frozen=True)
class SparseRows:
    """A gradient that is zero except on a few rows of a ``(num_rows, D)`` table.

    Parameters
    ----------
    indices : array_like of int, shape (U,)
        Row numbers, unique and sorted ascending, each in ``[0, num_rows)``
        (kept as int32 or int64; other integer types are converted to int64).
    values : ndarray, shape (U, D), float32 or float64
        ``values[j]`` is the gradient of row ``indices[j]``.
    num_rows : int
        Number of rows of the dense table this gradient belongs to (>= 0).

    Raises
    ------
    TypeError
        Non-integer ``indices`` or ``num_rows``, ``values`` not a float array.
    ValueError
        Wrong ranks, as many indices as value rows, negative ``num_rows``, or
        ``indices`` not unique and sorted.
    IndexError
        An index outside ``[0, num_rows)``.
    """

    indices: np.ndarray
    values: np.ndarray
    num_rows: int

    def __post_init__(self):
        # Optimisers write the listed rows with unchecked kernels: validate here.
        indices = _checks.check_index_array(self.indices, "SparseRows: indices")
        values = _checks.check_float_array(self.values, "SparseRows: values", ndim=2)
        num_rows = _checks.check_int(self.num_rows, "SparseRows: num_rows", minimum=0)
        if indices.ndim != 1:
            raise ValueError(f"SparseRows: indices: expected a 1-D array, got shape "
                             f"{indices.shape}")
        if indices.shape[0] != values.shape[0]:
            raise ValueError(
                f"SparseRows: {indices.shape[0]} indices but {values.shape[0]} value rows"
            )
        _checks.check_sorted_rows(indices, num_rows, "SparseRows: indices")
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "num_rows", num_rows)

    @property
    def shape(self) -> tuple[int, int]:
        """Shape of the dense gradient, ``(num_rows, D)``."""
        return (self.num_rows, self.values.shape[1])

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    def to_dense(self) -> np.ndarray:
        """The dense ``(num_rows, D)`` gradient."""
        dense = np.zeros(self.shape, dtype=self.values.dtype)
        dense[self.indices] = self.values
        return dense

    def add_to(self, dense: np.ndarray) -> np.ndarray:
        """Add these rows into ``dense`` in place and return it."""
        dense[self.indices] += self.values
        return dense

    def __add__(self, other: SparseRows) -> SparseRows:
        """Merge two sparse gradients of the same table (rows summed, still sorted)."""
        if not isinstance(other, SparseRows):
            return NotImplemented
        if other.shape != self.shape:
            raise ValueError(f"SparseRows: cannot add shapes {self.shape} and {other.shape}")
        rows = np.union1d(self.indices, other.indices)
        values = np.zeros((rows.size, self.values.shape[1]),
                          dtype=np.result_type(self.values, other.values))
        values[np.searchsorted(rows, self.indices)] += self.values
        values[np.searchsorted(rows, other.indices)] += other.values
        return SparseRows(rows.astype(np.int64, copy=False), values, self.num_rows)
