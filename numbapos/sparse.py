"""Row-sparse gradients of embedding tables."""

from __future__ import annotations

import numpy as np

from . import _checks, _device
from .functional import sparse as _ops  # (numbapos imports functional, which imports this)


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

    Notes
    -----
    :func:`~numbapos.functional.embedding_backward` with ``lazy=True`` returns
    a SparseRows whose ``values`` are not summed yet (``summed`` is False), so
    that an optimiser's sparse update sums each row inside the update, in one
    pass. :meth:`materialize` sums them; reading ``values`` before that raises
    ``RuntimeError`` (as PyTorch's ``values()`` of an uncoalesced sparse tensor
    asks for ``coalesce()``). Every other method works on either.

    On the GPU, a gradient made by numbapos (``embedding_backward``, a
    module's backward) keeps the number of its rows on the device, so that
    making and applying it never waits for the GPU: its arrays are sized by
    the number of looked-up positions and only their first rows are real.
    Reading :attr:`indices` or :attr:`values` trims them, which reads that
    number back (a synchronisation); optimisers never read them.
    """

    __slots__ = ("_indices", "_values", "_num_rows", "_pending", "_used", "_private")

    def __init__(self, indices, values, num_rows):
        # Optimisers write the listed rows with unchecked kernels: validate here.
        indices = _checks.check_index_array(indices, "SparseRows: indices")
        values = _checks.check_float_array(values, "SparseRows: values", ndim=2)
        num_rows = _checks.check_int(num_rows, "SparseRows: num_rows", minimum=0)
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
        self._indices, self._values, self._num_rows = indices, values, num_rows
        self._pending = self._used = None
        self._private = False

    @classmethod
    def _grouped(cls, groups, values, num_rows):
        """The summed gradient of a lookup, from its :class:`~numbapos._args.RowGroups`
        (rows validated by the grouping) and ``values`` with as many rows as
        ``groups.rows``: nothing is checked or read back."""
        self = cls.__new__(cls)
        self._indices, self._values, self._num_rows = groups.rows, values, num_rows
        self._pending = None
        self._used = None if isinstance(groups.used, int) else groups.used
        self._private = True
        return self

    @classmethod
    def _unsummed(cls, groups, grad, scale_grad_by_freq, num_rows):
        """The gradient of a lookup, its row sums not done yet (see Notes).

        ``groups`` (:class:`~numbapos._args.RowGroups`, validated rows) and the
        ``(N, D)`` ``grad`` live on one device; ``values`` will be row ``j``'s
        sum of ``grad`` over its positions.
        """
        self = cls.__new__(cls)  # _grouped(groups, None, num_rows), inline
        self._indices, self._values, self._num_rows = groups.rows, None, num_rows
        self._pending = (groups, grad, bool(scale_grad_by_freq))
        self._used = None if isinstance(groups.used, int) else groups.used
        self._private = True
        return self

    def _trim(self):
        """Cut padded device arrays to their real rows (reads the count: a synchronisation)."""
        if self._used is not None:
            used = int(_device.to_host(self._used)[0])
            self._indices = self._indices[:used]
            if self._values is not None:
                self._values = self._values[:used]
            self._used = None

    def _padded(self):
        """``(rows, values, used)`` for kernels, without reading anything back.

        ``used`` is the number of real rows: an int, or a device array whose
        first entry is (rows past it are padding).
        """
        if self._used is None:
            return self._indices, self._values, int(self._indices.shape[0])
        return self._indices, self._values, self._used

    @property
    def indices(self):
        """Row numbers (int64 or int32), unique and ascending."""
        self._trim()
        self._private = False  # the caller may change them: check them again before a step
        return self._indices

    @property
    def values(self):
        """``(U, D)`` gradient rows, ``values[j]`` for row ``indices[j]``.

        Raises
        ------
        RuntimeError
            The rows are not summed yet (``summed`` False): call
            :meth:`materialize` first.
        """
        if self._pending is not None:
            raise RuntimeError(
                "SparseRows.values: this gradient's rows are not summed yet (a lazy gradient "
                "from embedding_backward(lazy=True) or a fused optimiser step): call "
                ".materialize() first")
        self._trim()
        self._private = False
        return self._values

    def materialize(self) -> SparseRows:
        """Sum the rows of an unsummed gradient now (no-op when summed); returns self."""
        if self._pending is not None:
            groups, grad, scale = self._pending
            values = _ops.sum_row_groups(groups, grad, scale)
            if self._used is None:  # the rows were trimmed already (read since): trim these too
                values = values[:self._indices.shape[0]]
            self._values, self._pending = values, None
        return self

    @property
    def num_rows(self) -> int:
        """Rows of the dense table this gradient belongs to."""
        return self._num_rows

    @property
    def summed(self) -> bool:
        """False while ``values`` are still to be summed from a lookup's gradient."""
        return self._pending is None

    def _take_unsummed(self):
        """``(groups, grad, scale_grad_by_freq)`` of an unsummed gradient, else None."""
        return self._pending

    def __repr__(self) -> str:
        self._trim()  # a synchronisation on the GPU: repr is for people
        return (f"SparseRows(rows={int(self._indices.shape[0])}, num_rows={self._num_rows}, "
                f"dim={self.shape[1]}, dtype={self.dtype}, device={self.device!r}"
                f"{'' if self.summed else ', summed=False'})")

    def _source(self):
        # The array whose dtype, device and width the values have (or will have).
        return self._values if self._pending is None else self._pending[1]

    @property
    def shape(self) -> tuple[int, int]:
        """Shape of the dense gradient, ``(num_rows, D)``."""
        return (self._num_rows, self._source().shape[1])

    @property
    def dtype(self) -> np.dtype:
        return self._source().dtype

    @property
    def device(self) -> str:
        """Where the gradient lives, ``"cpu"`` or ``"cuda"``."""
        return _device.device_of(self._source())

    def to(self, device: str) -> SparseRows:
        """This gradient on ``device`` (itself when it is already there)."""
        if _device.check_device(device) == self.device:
            return self
        self.materialize()
        return SparseRows(_device.to_device(self.indices, device),
                          _device.to_device(self.values, device), self.num_rows)

    def __array__(self, dtype=None, copy=None):
        # As PyTorch's sparse tensors refuse .numpy(): a silent 0-d object array (NumPy's
        # fallback) or an implicit densification would both surprise.
        raise TypeError(
            "SparseRows cannot be converted to a NumPy array implicitly (numpy.asarray, "
            "numpy.array, NumPy functions): it stores only the rows a lookup used. Call "
            ".to_dense() for the dense (num_rows, D) gradient (then numbapos.to_host for a "
            "GPU one), or read .indices and .values")

    def to_dense(self):
        """The dense ``(num_rows, D)`` gradient, on this gradient's device."""
        self.materialize()
        dense = _device.zeros(self.shape, self.values.dtype, self.device)
        return self.add_to(dense)

    def add_to(self, dense):
        """Add these rows into ``dense`` (C-contiguous, same device and dtype) in place."""
        self.materialize()
        rows, values, used = self._padded()
        return _ops.add_rows_(dense, rows, values, used)

    def __add__(self, other: SparseRows) -> SparseRows:
        """Merge two sparse gradients of the same table (rows summed, still sorted).

        The sum lives on this gradient's device (``other`` is copied there if it
        lives elsewhere) in the dtype of the two values' result type. Each
        row's value is the first's plus the second's (a row in one only keeps
        its bits, -0.0 included, as PyTorch's ``coalesce`` of the concatenation
        does). On the GPU nothing is read back: the rows are concatenated and
        grouped on the device, as a backward groups positions.
        """
        if not isinstance(other, SparseRows):
            return NotImplemented
        if other.shape != self.shape:
            raise ValueError(f"SparseRows: cannot add shapes {self.shape} and {other.shape}")
        self.materialize()
        other.materialize()
        if other.device != self.device:
            other = other.to(self.device)
        for grad, name in ((self, "self"), (other, "other")):
            if not grad._private:  # its arrays were handed out: check them again
                grad._trim()
                _checks.check_sorted_rows(grad._indices, grad.num_rows,
                                          f"SparseRows: {name}.indices")
                if grad._indices.shape[0] != grad._values.shape[0]:
                    raise ValueError(f"SparseRows: {name}: {grad._indices.shape[0]} indices "
                                     f"but {grad._values.shape[0]} value rows")
        rows_a, values_a, used_a = self._padded()
        rows_b, values_b, used_b = other._padded()
        groups, summed = _ops.merge_rows(rows_a, values_a, used_a, rows_b, values_b, used_b,
                                         self.num_rows)
        return SparseRows._grouped(groups, summed, self.num_rows)
