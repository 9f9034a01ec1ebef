"""Row-sparse gradients of embedding tables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SparseRows:
    """A gradient that is zero except on a few rows of a ``(num_rows, D)`` table.

    Parameters
    ----------
    indices : ndarray of int64, shape (U,)
        Row numbers, unique and sorted ascending.
    values : ndarray, shape (U, D)
        ``values[j]`` is the gradient of row ``indices[j]``.
    num_rows : int
        Number of rows of the dense table this gradient belongs to.
    """

    indices: np.ndarray
    values: np.ndarray
    num_rows: int

    def __post_init__(self):
        if self.indices.ndim != 1 or self.values.ndim != 2:
            raise ValueError("SparseRows: indices must be 1-D and values 2-D")
        if self.indices.shape[0] != self.values.shape[0]:
            raise ValueError(
                f"SparseRows: {self.indices.shape[0]} indices but {self.values.shape[0]} value rows"
            )

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
