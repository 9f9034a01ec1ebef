"""Row-sparse gradients of embedding tables."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _checks, _device


@dataclass(frozen=True)
class SparseRows:
    """A gradient that is zero except on a few rows of a ``(num_rows, D)`` table.

    Parameters
    ----------
    indices : array_like of int, shape (U,)
        Row numbers, unique and sorted ascending, each in ``[0, num_rows)``
        (kept as int32 or int64; other integer types are converted to int64).
        Moved to the device of ``values`` when they differ.
    values : ndarray or CUDA array, shape (U, D), float32 or float64
        ``values[j]`` is the gradient of row ``indices[j]``. Its device is the
        gradient's device.
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
        device = _device.device_of(values)
        if _device.device_of(indices) != device:
            indices = _device.to_device(indices, device)
        object.__setattr__(self, "indices", indices)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "num_rows", num_rows)

    @property
    def shape(self) -> tuple[int, int]:
        """Shape of the dense gradient, ``(num_rows, D)``."""
        return (self.num_rows, self.values.shape[1])

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    @property
    def device(self) -> str:
        """Where the gradient lives, ``"cpu"`` or ``"cuda"``."""
        return _device.device_of(self.values)

    def to(self, device: str) -> SparseRows:
        """This gradient on ``device`` (itself when it is already there)."""
        if _device.check_device(device) == self.device:
            return self
        return SparseRows(_device.to_device(self.indices, device),
                          _device.to_device(self.values, device), self.num_rows)

    def to_dense(self):
        """The dense ``(num_rows, D)`` gradient, on this gradient's device."""
        dense = _device.zeros(self.shape, self.values.dtype, self.device)
        return self.add_to(dense)

    def add_to(self, dense):
        """Add these rows into ``dense`` (C-contiguous, same device and dtype) in place."""
        K = _device.backend(dense, self.values)
        K.add_rows_(dense, K.contiguous(self.indices, np.int64), K.contiguous(self.values))
        return dense

    def __add__(self, other: SparseRows) -> SparseRows:
        """Merge two sparse gradients of the same table (rows summed, still sorted).

        Rows are merged on the host (index arrays are short); the sum keeps
        this gradient's device.
        """
        if not isinstance(other, SparseRows):
            return NotImplemented
        if other.shape != self.shape:
            raise ValueError(f"SparseRows: cannot add shapes {self.shape} and {other.shape}")
        mine = [_device.to_host(a) for a in (self.indices, self.values)]
        theirs = [_device.to_host(a) for a in (other.indices, other.values)]
        rows = np.union1d(mine[0], theirs[0])
        values = np.zeros((rows.size, self.values.shape[1]),
                          dtype=np.result_type(mine[1], theirs[1]))
        values[np.searchsorted(rows, mine[0])] += mine[1]
        values[np.searchsorted(rows, theirs[0])] += theirs[1]
        merged = SparseRows(rows.astype(np.int64, copy=False), values, self.num_rows)
        return merged.to(self.device)
