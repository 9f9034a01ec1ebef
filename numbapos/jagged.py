"""Keyed jagged ids and keyed pooled results, laid out as TorchRec's ``KeyedJaggedTensor``
and ``KeyedTensor``, over NumPy arrays or CUDA device arrays."""

from __future__ import annotations

import numpy as np

from . import _checks, _device
from .functional.collection import check_jagged_offsets, jagged_lengths, jagged_offsets

__all__ = ["JaggedArray", "KeyedArray", "KeyedJaggedArray"]


def _keys(keys, name="keys"):
    if isinstance(keys, str) or not isinstance(keys, (list, tuple)):
        raise TypeError(f"{name}: expected a list of str, got {_checks.type_name(keys)}")
    keys = list(keys)
    for key in keys:
        if not isinstance(key, str):
            raise TypeError(f"{name}: expected str keys, got {_checks.quote(key)}")
    seen = set()
    for key in keys:
        if key in seen:
            raise ValueError(f"{name}: {key!r} appears twice; keys must be unique")
        seen.add(key)
    return keys


def _as_index(x, name, like):
    """An integer 1-D array of ``like``'s device (host arrays copied to a CUDA ``like``)."""
    x = _checks.check_index_array(x, name)
    if x.ndim != 1:
        raise ValueError(f"{name}: expected a 1-D array, got shape {tuple(x.shape)}")
    device = _device.device_of(like)
    if _device.device_of(x) != device:
        if device == "cpu":
            raise TypeError(f"{name}: is a CUDA array but values are on 'cpu'; move them to "
                            "one device first (numbapos.to_device)")
        x = _device.to_device(x, device)
    return x


class JaggedArray:
    """One key's bags: ``values`` split by ``lengths`` / ``offsets`` (TorchRec's
    ``JaggedTensor``), as :meth:`KeyedJaggedArray.to_dict` gives them."""

    __slots__ = ("_values", "_lengths", "_offsets", "_weights")

    def __init__(self, values, lengths, offsets, weights=None):
        self._values, self._lengths, self._offsets = values, lengths, offsets
        self._weights = weights

    def values(self):
        """The ids, bag after bag."""
        return self._values

    def lengths(self):
        """Each bag's number of ids."""
        return self._lengths

    def offsets(self):
        """Where each bag starts, then ``len(values)`` (``len(lengths) + 1`` entries)."""
        return self._offsets

    def weights(self):
        """The entries' weights; ValueError when there are none (TorchRec asserts)."""
        if self._weights is None:
            raise ValueError("weights: this JaggedArray has no weights")
        return self._weights

    def weights_or_none(self):
        """The entries' weights, or None."""
        return self._weights

    def __repr__(self):
        return (f"JaggedArray(values={_device.to_host(self._values)!r}, "
                f"lengths={_device.to_host(self._lengths)!r})")


class KeyedJaggedArray:
    """Bags of ids for several keys (features), key-major, as TorchRec's ``KeyedJaggedTensor``.

    ``values`` holds every sample's ids of the first key, then of the next key,
    and so on; ``lengths[f * B + b]`` is the number of ids of sample ``b`` of
    key ``f`` (``B``, the batch size, is :meth:`stride`).

    Parameters
    ----------
    keys : list of str
        The features, unique.
    values : array_like of int, 1-D
        The ids (int32 / int64), on the CPU (NumPy) or a CUDA device array.
    lengths : array_like of int, optional
        ``len(keys) * B`` non-negative bag sizes summing to ``len(values)``.
    offsets : array_like of int, optional
        ``len(keys) * B + 1`` bag starts, from 0, never decreasing, ending at
        ``len(values)``. Give ``lengths`` or ``offsets`` (or both: they must
        agree; on the GPU that is not checked).
    weights : array_like of float, 1-D, optional
        One weight per id (float32 / float64), for weighted collections.
    stride : int, optional
        The batch size; needed only when ``keys`` is empty (else
        ``len(lengths) / len(keys)``).

    Raises
    ------
    TypeError
        Non-integer ids, lengths or offsets, non-float weights, keys not str,
        arrays on different devices.
    ValueError
        Duplicate keys; lengths or offsets whose size is not a multiple of
        ``len(keys)`` (plus one), negative lengths or lengths that do not sum to
        ``len(values)`` (naming ``lengths``), bad offsets (naming ``offsets``),
        weights of another size. On the GPU the data-dependent checks
        (the lengths' values, the offsets') are deferred errors, raised at a
        later numbapos call (``numbapos.synchronize()`` at the latest).

    Examples
    --------
    >>> import numpy as np
    >>> from numbapos.jagged import KeyedJaggedArray
    >>> kjt = KeyedJaggedArray(["user", "item"], np.array([4, 1, 2, 7, 3]),
    ...                        lengths=np.array([2, 0, 1, 2]))
    >>> kjt.stride()
    2
    >>> kjt.offsets()
    array([0, 2, 2, 3, 5])
    >>> kjt["item"].values()
    array([2, 7, 3])
    """

    def __init__(self, keys, values, lengths=None, offsets=None, weights=None, stride=None):
        self._keys = _keys(keys)
        values = _checks.check_index_array(values, "values")
        if values.ndim != 1:
            raise ValueError(f"values: expected a 1-D array, got shape {tuple(values.shape)}")
        self._values = values
        size = int(values.shape[0])
        if lengths is None and offsets is None:
            raise ValueError("lengths: give lengths or offsets (how values split into bags), "
                             "got neither")
        n = len(self._keys)
        if lengths is not None:
            lengths = _as_index(lengths, "lengths", values)
            bags = int(lengths.shape[0])
            what, got = "lengths", bags
        else:
            offsets = _as_index(offsets, "offsets", values)
            bags = int(offsets.shape[0]) - 1
            what, got = "offsets", bags + 1
        if n == 0:
            if bags > 0:
                raise ValueError(f"{what}: expected no bags for no keys, got {got} entries")
            self._stride = 0 if stride is None else _checks.check_int(stride, "stride",
                                                                      minimum=0)
        else:
            if bags < 0 or bags % n:
                extra = " + 1" if what == "offsets" else ""
                raise ValueError(f"{what}: expected len(keys) * batch{extra} entries with "
                                 f"len(keys)={n}, got {got}")
            self._stride = bags // n
            if stride is not None and _checks.check_int(stride, "stride") != self._stride:
                raise ValueError(f"stride: expected {self._stride} (len({what}) / len(keys)), "
                                 f"got {stride}")
        if lengths is not None:
            made = jagged_offsets(lengths, size)
            if offsets is not None:
                offsets = _as_index(offsets, "offsets", values)
                if offsets.shape != made.shape:
                    raise ValueError(f"offsets: expected len(lengths) + 1 = {made.shape[0]} "
                                     f"entries, got {offsets.shape[0]}")
                if _device.device_of(offsets) == "cpu" and not np.array_equal(offsets, made):
                    raise ValueError("offsets: do not match lengths (offsets must be "
                                     "[0, cumsum(lengths)])")
            self._offsets, self._lengths = made, lengths
        else:
            if n == 0 and offsets.shape[0] == 0:
                offsets = _device.to_device(np.zeros(1, np.int64), _device.device_of(values))
            self._offsets = check_jagged_offsets(offsets, size)
            self._lengths = None
        if weights is not None:
            weights = _checks.check_float_array(weights, "weights", ndim=1)
            _checks.check_same_device((values, weights), ("values", "weights"))
            if weights.shape[0] != size:
                raise ValueError(f"weights: expected len(values)={size} weights, got "
                                 f"{weights.shape[0]}")
        self._weights = weights

    @classmethod
    def _trusted(cls, keys, values, offsets, weights, stride):
        """An array from parts already checked (a module's record): nothing is checked."""
        self = cls.__new__(cls)
        self._keys, self._values, self._offsets = list(keys), values, offsets
        self._lengths, self._weights, self._stride = None, weights, stride
        return self

    @classmethod
    def from_lengths_sync(cls, keys, values, lengths, weights=None, stride=None):
        """TorchRec's name for the constructor with ``lengths``."""
        return cls(keys, values, lengths=lengths, weights=weights, stride=stride)

    @classmethod
    def from_offsets_sync(cls, keys, values, offsets, weights=None, stride=None):
        """TorchRec's name for the constructor with ``offsets``."""
        return cls(keys, values, offsets=offsets, weights=weights, stride=stride)

    @classmethod
    def empty(cls, keys=(), stride=0, device="cpu"):
        """No ids for ``keys`` and ``stride`` samples (every bag empty)."""
        keys = list(keys)
        zeros = _device.to_device(np.zeros(len(keys) * stride, np.int64), device)
        return cls(keys, _device.to_device(np.zeros(0, np.int64), device), lengths=zeros,
                   stride=stride)

    def keys(self) -> list:
        """The features, in order."""
        return list(self._keys)

    def values(self):
        """The ids, key-major."""
        return self._values

    def lengths(self):
        """``len(keys) * stride()`` bag sizes (computed from the offsets if not given)."""
        if self._lengths is None:
            self._lengths = jagged_lengths(self._offsets)
        return self._lengths

    def offsets(self):
        """``len(keys) * stride() + 1`` bag starts (int64 when made from lengths)."""
        return self._offsets

    def weights(self):
        """The ids' weights; ValueError when there are none (TorchRec asserts)."""
        if self._weights is None:
            raise ValueError("weights: this KeyedJaggedArray has no weights")
        return self._weights

    def weights_or_none(self):
        """The ids' weights, or None."""
        return self._weights

    def stride(self) -> int:
        """The batch size: samples per key."""
        return self._stride

    @property
    def device(self) -> str:
        """Where the arrays live, ``"cpu"`` or ``"cuda"``."""
        return _device.device_of(self._values)

    def offset_per_key(self) -> list:
        """Where each key's ids start in ``values``, then ``len(values)`` (host ints; on
        the GPU this reads the offsets back, a synchronisation)."""
        offsets = _device.to_host(self._offsets)
        return [int(offsets[f * self._stride]) for f in range(len(self._keys) + 1)]

    def length_per_key(self) -> list:
        """Each key's number of ids (host ints; a synchronisation on the GPU)."""
        starts = self.offset_per_key()
        return [starts[f + 1] - starts[f] for f in range(len(starts) - 1)]

    def __getitem__(self, key) -> JaggedArray:
        """Key ``key``'s bags (views of the arrays; a synchronisation on the GPU)."""
        if key not in self._keys:
            raise KeyError(f"key {key!r} is not among the keys {self._keys}")
        return self._jagged(self._keys.index(key), self.offset_per_key())

    def _jagged(self, f, starts):
        a, b = starts[f], starts[f + 1]
        bags = slice(f * self._stride, (f + 1) * self._stride)
        offsets = _device.to_host(self._offsets[bags.start:bags.stop + 1]).astype(np.int64) - a
        offsets = _device.to_device(offsets, self.device)
        weights = None if self._weights is None else self._weights[a:b]
        return JaggedArray(self._values[a:b], self.lengths()[bags], offsets, weights)

    def to_dict(self) -> dict:
        """``{key: JaggedArray}`` in key order (TorchRec's ``to_dict``)."""
        starts = self.offset_per_key()
        return {key: self._jagged(f, starts) for f, key in enumerate(self._keys)}

    def to(self, device: str) -> KeyedJaggedArray:
        """This array on ``device`` (itself when it is there already)."""
        device = _device.check_device(device)
        if device == self.device:
            return self
        move = lambda x: None if x is None else _device.to_device(x, device)  # noqa: E731
        return KeyedJaggedArray(self._keys, move(self._values), offsets=move(self._offsets),
                                weights=move(self._weights), stride=self._stride)

    def __len__(self) -> int:
        return int(self._values.shape[0])

    def __repr__(self) -> str:
        weights = "" if self._weights is None else \
            f", weights={_device.to_host(self._weights)!r}"
        return (f"KeyedJaggedArray(keys={self._keys}, values={_device.to_host(self._values)!r}, "
                f"lengths={_device.to_host(self.lengths())!r}{weights})")


class KeyedArray:
    """Pooled results of several keys side by side (TorchRec's ``KeyedTensor``).

    Parameters
    ----------
    keys : list of str
        The keys, in column order.
    length_per_key : list of int
        Each key's number of columns.
    values : ndarray or CUDA array, shape (B, sum(length_per_key))
        Key ``k``'s columns are ``offset_per_key()[k] .. offset_per_key()[k + 1]``.
    """

    __slots__ = ("_keys", "_lengths", "_offsets", "_values")

    def __init__(self, keys, length_per_key, values):
        self._keys = _keys(keys)
        self._lengths = [_checks.check_int(n, "length_per_key", minimum=0)
                         for n in length_per_key]
        if len(self._lengths) != len(self._keys):
            raise ValueError(f"length_per_key: expected {len(self._keys)} lengths (one per "
                             f"key), got {len(self._lengths)}")
        self._offsets = [0]
        for n in self._lengths:
            self._offsets.append(self._offsets[-1] + n)
        if getattr(values, "ndim", None) != 2 or values.shape[1] != self._offsets[-1]:
            raise ValueError(f"values: expected shape (B, {self._offsets[-1]}), got "
                             f"{tuple(getattr(values, 'shape', ()))}")
        self._values = values

    def keys(self) -> list:
        """The keys, in column order."""
        return list(self._keys)

    def values(self):
        """The ``(B, total)`` array."""
        return self._values

    def length_per_key(self) -> list:
        """Each key's number of columns."""
        return list(self._lengths)

    def offset_per_key(self) -> list:
        """Each key's first column, then the total."""
        return list(self._offsets)

    def __getitem__(self, key):
        """Key ``key``'s ``(B, D)`` columns (a view)."""
        if key not in self._keys:
            raise KeyError(f"key {key!r} is not among the keys {self._keys}")
        k = self._keys.index(key)
        return self._values[:, self._offsets[k]:self._offsets[k + 1]]

    def to_dict(self) -> dict:
        """``{key: (B, D) view}`` in key order."""
        return {key: self[key] for key in self._keys}

    def __repr__(self) -> str:
        return f"KeyedArray(keys={self._keys}, length_per_key={self._lengths})"
