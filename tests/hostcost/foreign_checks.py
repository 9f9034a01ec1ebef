"""Foreign arrays (``__cuda_array_interface__``) wrapped once per object, checked inside a
stub-driver process (see test_foreign_arrays.py)."""

import gc

import numpy as np

from numbapos import _device
from numbapos import functional as F
from numbapos._gpuhost import fastlaunch


class Foreign:
    """A CuPy-like array: device memory described by ``__cuda_array_interface__``."""

    def __init__(self, device, pointer=None, shape=None, typestr=None):
        self.device = device  # keeps the memory alive
        self.pointer = device.device_ctypes_pointer.value if pointer is None else pointer
        self.shape = device.shape if shape is None else shape
        self.typestr = device.dtype.str if typestr is None else typestr

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "strides": None, "typestr": self.typestr,
                "data": (self.pointer, False), "version": 3, "stream": None}


def _described(x):
    return (x.shape, x.strides, x.dtype.str, x.gpu_data.device_pointer_value)


def check_wrapped_once():
    base = _device.to_device(np.arange(12, dtype=np.float32).reshape(3, 4), "cuda")
    a = Foreign(base)
    first, second = _device.adopt(a), _device.adopt(a)
    entry = fastlaunch._ADOPTED.get(id(a))
    same_entry = entry is not None and entry[0]() is a
    again = _device.adopt(a)
    reused = fastlaunch._ADOPTED.get(id(a)) is entry
    # The wrapper made from the cache is Numba's, field for field, and keeps ``a`` alive.
    fields_match = (_described(first) == _described(second) == _described(again)
                    and fastlaunch._array_fields(second) == fastlaunch._array_fields(first)
                    and second.gpu_data._owner is a)
    values = _device.to_host(second).tolist() == _device.to_host(base).tolist()
    # The same object now describing other memory (a resized tensor) is wrapped anew.
    other = _device.to_device(np.ones((2, 2), np.float64), "cuda")
    a.device, a.pointer, a.shape, a.typestr = (other, other.device_ctypes_pointer.value,
                                               (2, 2), "<f8")
    moved = _device.adopt(a)
    follows = (_described(moved) == ((2, 2), (16, 8), "<f8", a.pointer)
               and _device.to_host(moved).tolist() == [[1.0, 1.0], [1.0, 1.0]])
    # A new object at the address of a freed one (same id possible) is never served the
    # freed one's wrapper: the entry goes with the object.
    key = id(a)
    del a, first, second, again, moved
    gc.collect()
    forgotten = key not in fastlaunch._ADOPTED
    b = Foreign(base, shape=(12,))
    flat = _device.adopt(b)
    fresh = _described(flat) == ((12,), (4,), "<f4", base.device_ctypes_pointer.value)
    # Ops take the wrapped arrays as they take Numba's (the stub runs no kernel: the
    # launches are compared, as the driver got them).
    ids_device = _device.to_device(np.array([2, 0, 1], np.int64), "cuda")
    ids, table = Foreign(ids_device), Foreign(base)
    launched = []
    for x, w in [(ids_device, base)] + [(ids, table)] * 3:
        out = F.embedding(x, w)
        launched.append((out.shape, out.dtype.str))
    lookups = launched == [((3, 4), "<f4")] * 4
    return {"same_entry": same_entry, "reused": reused, "fields_match": fields_match,
            "values": values, "follows": follows, "forgotten": forgotten, "fresh": fresh,
            "lookups": lookups}


class Unreferenceable:
    __slots__ = ("inner",)

    def __init__(self, inner):
        self.inner = inner

    @property
    def __cuda_array_interface__(self):
        return self.inner.__cuda_array_interface__


def check_not_cached():
    base = _device.to_device(np.arange(4, dtype=np.float32), "cuda")
    before = len(fastlaunch._ADOPTED)
    plain = Unreferenceable(Foreign(base))  # no weak reference: wrapped every time
    wrapped = _device.adopt(plain)
    streamed = Foreign(base)
    streamed_interface = dict(streamed.__cuda_array_interface__, stream=1)
    # An interface with a stream goes through Numba's wrapper (it synchronises the stream).
    made = fastlaunch.adopt(streamed, streamed_interface, lambda x: "numba's")
    return {"unreferenceable": _device.to_host(wrapped).tolist() == [0.0, 1.0, 2.0, 3.0],
            "not_kept": len(fastlaunch._ADOPTED) == before, "stream": made}
