"""Save and load model state as safetensors files.

:func:`save_state` writes a module's ``state_dict()`` (or any mapping of names
to arrays) and :func:`load_state` reads a file back into a dict of NumPy
arrays, ready for :meth:`numbapos.nn.Module.load_state_dict` or for the
``from_hf_state_dict`` constructors of the BERT / GPT-2 blocks (a Hugging Face
``model.safetensors`` loads the same way).

Nested state (a checkpoint of a whole run: ``{"model": model.state_dict(),
"optimizer": opt.state_dict(), "epoch": 3}``) is saved too, without pickle:
its arrays as safetensors tensors, everything else (dicts, lists, tuples,
ints, floats, strings, bools, None) as JSON in the file's metadata, under the
key ``"numbapos.state"``; :func:`load_state` rebuilds it. A flat mapping of
names to arrays is saved and loaded exactly as before (a Hugging Face
checkpoint is one).

The ``safetensors`` package is an optional dependency (``pip install
numbapos[io]``); it is imported when one of these functions is first called,
so ``import numbapos`` works without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import struct
import uuid
from collections.abc import Mapping

import numpy as np

from . import _checks, _device

__all__ = ["load_metadata", "load_state", "save_state"]

# Dtypes that safetensors.numpy can write and NumPy can hold.
_SAVABLE = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32, np.int64,
    np.uint64, np.float16, np.float32, np.float64, np.complex64,
))
# safetensors dtype tags that safetensors.numpy loads as NumPy arrays.
_LOADABLE = frozenset(("BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64",
                       "F16", "F32", "F64", "C64"))


def _safetensors():
    """Import safetensors lazily, with an install hint if it is missing."""
    try:
        import safetensors
        import safetensors.numpy  # noqa: F401
    except ImportError as err:
        raise ImportError(
            "numbapos.io needs the 'safetensors' package to read and write .safetensors "
            "files; install it with `pip install numbapos[io]` (or `pip install safetensors`)"
        ) from err
    return safetensors


def _fspath(path, name: str = "path") -> str:
    try:
        path = os.fsdecode(os.fspath(path))
    except TypeError as err:
        raise TypeError(
            f"{name}: expected a str or os.PathLike, got {type(path).__name__} "
            f"{_checks.quote(path)}"
        ) from err
    if not path:
        raise ValueError(f"{name}: expected a file path, got an empty string")
    return path


def _read_header(path: str) -> tuple[dict, int]:
    """The JSON header of a safetensors file and the byte offset where its data starts."""
    with open(path, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return header, 8 + size


def _bfloat16(path: str, data_start: int, entry: dict, keep_dtype: bool) -> np.ndarray:
    begin, end = entry["data_offsets"]
    raw = np.fromfile(path, dtype="<u2", count=(end - begin) // 2, offset=data_start + begin)
    if keep_dtype:  # the bits as they are, as ml_dtypes.bfloat16
        return raw.astype(np.uint16, copy=False).view(_checks.bfloat16_dtype()).reshape(
            entry["shape"])
    # A bfloat16 is the upper half of a float32: shifting it back up is exact.
    return (raw.astype(np.uint32) << np.uint32(16)).view(np.float32).reshape(entry["shape"])


def load_state(path, keep_dtype=False) -> dict[str, np.ndarray]:
    """Read every tensor of a safetensors file into a dict of NumPy arrays.

    Parameters
    ----------
    path : str or os.PathLike
        A ``.safetensors`` file, such as one written by :func:`save_state` or a
        Hugging Face ``model.safetensors``.
    keep_dtype : bool, default False
        Return bfloat16 tensors as bfloat16 (``ml_dtypes.bfloat16`` arrays,
        the file's bits, half the memory of float32), ready for a bfloat16
        :class:`~numbapos.nn.Embedding` (``from_pretrained`` or
        ``load_state_dict``) or the BERT / GPT-2 blocks
        (``from_hf_state_dict(state, keep_dtype=True)``). float16 tensors
        are float16 either way.

    Returns
    -------
    dict
        Tensor name to array, in the file's order; or, for a file that
        :func:`save_state` wrote from nested state, that state rebuilt (dicts
        with their keys of any JSON type, lists, tuples, scalars, NumPy
        scalars and arrays as saved). The arrays are writeable and
        independent of the file. Every dtype keeps its own NumPy dtype
        (float16, float32, float64, the integer types, bool, complex64), with
        one exception unless ``keep_dtype``: **bfloat16 tensors are returned as
        float32**. NumPy has no bfloat16 of its own, and the conversion is
        exact (a bfloat16 is the upper 16 bits of a float32), so checkpoints
        stored in bfloat16 load directly into float32 modules.

    Raises
    ------
    ImportError
        ``safetensors`` is not installed (``pip install numbapos[io]``).
    FileNotFoundError
        ``path`` does not exist.
    ValueError
        A tensor has a dtype NumPy cannot hold (the float8 and float4 formats);
        the message names the tensor. Nothing is returned in that case.
    safetensors.SafetensorError
        The file is not a valid safetensors file.
    """
    safetensors = _safetensors()
    path = _fspath(path)
    tensors = {}
    with safetensors.safe_open(path, framework="numpy") as f:  # validates the file
        header, data_start = _read_header(path)
        names = list(f.keys())
        for name in names:
            dtype = header[name]["dtype"]
            if dtype not in _LOADABLE and dtype != "BF16":
                raise ValueError(
                    f"load_state: tensor {name!r} in {path!r} has dtype {dtype}, which NumPy "
                    "cannot hold; convert it to float16/float32 before saving"
                )
        for name in names:
            entry = header[name]
            if entry["dtype"] == "BF16":
                tensors[name] = _bfloat16(path, data_start, entry, bool(keep_dtype))
            else:
                tensors[name] = f.get_tensor(name)
        tree = (f.metadata() or {}).get(STATE_KEY)
    if tree is None:
        return tensors
    try:
        return _decode(json.loads(tree), tensors)
    except (ValueError, KeyError, TypeError, IndexError) as err:
        raise ValueError(f"load_state: {path!r}: the nested state in its metadata "
                         f"({STATE_KEY!r}) is damaged: {str(err)[:200]}") from err


def load_metadata(path) -> dict[str, str]:
    """The text metadata stored in a safetensors file's header (empty dict if none).

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    dict of str to str
        What was passed as ``metadata`` to :func:`save_state`.
    """
    safetensors = _safetensors()
    path = _fspath(path)
    with safetensors.safe_open(path, framework="numpy") as f:
        metadata = dict(f.metadata() or {})
    metadata.pop(STATE_KEY, None)  # the structure of nested state, not the caller's text
    return metadata


def _collect(module_or_dict) -> dict[str, np.ndarray]:
    from .nn.module import Module
    from .nn.parameter import Parameter

    if isinstance(module_or_dict, Module):
        items = module_or_dict.state_dict()
    elif isinstance(module_or_dict, Mapping):
        items = module_or_dict
    else:
        raise TypeError(
            "module_or_dict: expected a numbapos Module or a mapping of str to arrays, "
            f"got {type(module_or_dict).__name__}"
        )
    tensors = {}
    for name, value in items.items():
        if not isinstance(name, str):
            raise TypeError(f"save_state: tensor names must be str, got {type(name).__name__} "
                            f"{name!r}")
        if isinstance(value, Parameter):
            value = value.data
        if _device.is_cuda_array(value):
            value = _device.to_host(value)  # GPU arrays are saved from a host copy
        elif not isinstance(value, np.ndarray):
            view = _checks.host_view(value, f"save_state: {name!r}")  # a PyTorch CPU tensor...
            if view is None:
                raise TypeError(f"save_state: {name!r} must be a NumPy array, got "
                                f"{_checks.type_name(value)}")
            value = _device.to_host(view)
        if _checks.is_half_dtype(value.dtype) and value.dtype.name == "bfloat16":
            # ml_dtypes.bfloat16: safetensors writes it as BF16.
            tensors[name] = value if value.flags.c_contiguous else value.copy(order="C")
            continue
        native = value.dtype.newbyteorder("=")
        if native not in _SAVABLE:
            raise TypeError(
                f"save_state: {name!r} has dtype {value.dtype}, which safetensors cannot store; "
                "supported: bool, (u)int8/16/32/64, bfloat16, float16/32/64, complex64"
            )
        if value.dtype != native:
            value = value.astype(native, order="C")
        # Not np.ascontiguousarray: it turns a 0-d array into shape (1,).
        tensors[name] = value if value.flags.c_contiguous else value.copy(order="C")
    return tensors


STATE_KEY = "numbapos.state"

_LEAVES = (str, bool, int, float, type(None))


def _is_flat(items) -> bool:
    """Whether a mapping holds only arrays (the format of a model's state, saved as before)."""
    # NumPy scalars count as arrays (0-d tensors, as before), np.float64 included.
    return all(isinstance(v, np.generic) or not isinstance(v, (Mapping, list, tuple, *_LEAVES))
               for v in items.values())


def _encode(value, path: str, tensors: dict, names: str):
    """``value`` as JSON: tagged dicts for containers and arrays, JSON scalars as themselves.

    Arrays go into ``tensors`` under a name made from their path (made unique).
    """
    from .nn.parameter import Parameter

    if isinstance(value, _LEAVES) and not isinstance(value, np.generic):
        return value
    if isinstance(value, Mapping):
        pairs = []
        for key, item in value.items():
            if not isinstance(key, _LEAVES):
                raise TypeError(f"save_state: {path}: dict keys must be str, int, float, bool or "
                                f"None, got {_checks.type_name(key)} {_checks.quote(key)}")
            pairs.append([key, _encode(item, f"{path}[{key!r}]", tensors,
                                       f"{names}.{key}" if names else str(key))])
        return {"dict": pairs}
    if isinstance(value, (list, tuple)):
        items = [_encode(item, f"{path}[{i}]", tensors, f"{names}.{i}" if names else str(i))
                 for i, item in enumerate(value)]
        return {"tuple" if isinstance(value, tuple) else "list": items}
    scalar = isinstance(value, np.generic)
    if isinstance(value, Parameter):
        value = value.data
    if not (scalar or _checks.is_array(value) or _checks.host_view(value, path) is not None):
        hint = " (save its state_dict())" if hasattr(value, "state_dict") else ""
        raise TypeError(f"save_state: {path}: cannot store a {_checks.type_name(value)}{hint}: "
                        "nested state holds dicts, lists, tuples, str, int, float, bool, None "
                        "and arrays")
    name = names or "tensor"
    while name in tensors:
        name += "_"
    tensors[name] = np.asarray(value) if scalar else value
    return {"scalar" if scalar else "tensor": name}


def _decode(node, tensors: dict):
    """The inverse of :func:`_encode`."""
    if node is None or isinstance(node, (str, bool, int, float)):
        return node
    if not isinstance(node, dict) or len(node) != 1:
        raise ValueError(f"unknown node {_checks.quote(node)}")
    ((kind, content),) = node.items()
    if kind == "dict":
        return {key: _decode(item, tensors) for key, item in content}
    if kind in ("list", "tuple"):
        items = [_decode(item, tensors) for item in content]
        return items if kind == "list" else tuple(items)
    if kind == "tensor":
        return tensors[content]
    if kind == "scalar":
        return tensors[content][()]
    raise ValueError(f"unknown node kind {kind!r}")


def _check_metadata(metadata) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise TypeError(f"metadata: expected a mapping of str to str, got "
                        f"{type(metadata).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(
                f"metadata: keys and values must be str, got {key!r}: {type(value).__name__}"
            )
    if STATE_KEY in metadata:
        raise ValueError(f"metadata: the key {STATE_KEY!r} is numbapos's own (the structure "
                         "of nested state); choose another")
    return dict(metadata)


def _fsync(path: str, directory: bool = False) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        if directory:
            return  # not every platform can open a directory (Windows); best effort
        raise
    try:
        os.fsync(fd)
    except OSError:
        if not directory:
            raise
    finally:
        os.close(fd)


def save_state(module_or_dict, path, metadata=None) -> None:
    """Write a module's state, or a mapping of arrays, to a safetensors file, atomically.

    The tensors are written to a temporary file in the target's directory,
    flushed to disk, and then renamed over ``path`` (``os.replace``), so a
    reader sees either the old file or the complete new one, never a partial
    write; if anything fails the temporary file is removed and an existing
    ``path`` is left as it was. If ``path`` is a symbolic link, the file it
    points to is replaced.

    Parameters
    ----------
    module_or_dict : numbapos.nn.Module, mapping of str to ndarray, or nested state
        A module (its :meth:`~numbapos.nn.Module.state_dict` is saved),
        names mapped to arrays (:class:`~numbapos.nn.Parameter` values are
        accepted too; saved as before, one tensor each), or nested state: a
        mapping that also holds dicts, lists, tuples, str, int, float, bool
        or None (an optimiser's ``state_dict()``, or ``{"model": ...,
        "optimizer": ..., "step": 100}``). Its arrays (NumPy scalars
        included) become tensors named by their path
        (``"optimizer.state.0.exp_avg"``), the rest JSON in the metadata; no
        pickle. :func:`load_state` gives it back, bit for bit.
        Non-contiguous arrays are made C-contiguous. bfloat16
        (``ml_dtypes.bfloat16``) and float16 arrays are written as BF16 / F16
        tensors (``load_state(path, keep_dtype=True)`` reads them back as such).
    path : str or os.PathLike
        Destination file; its directory must exist.
    metadata : mapping of str to str, optional
        Free text stored in the header (read it with :func:`load_metadata`).

    Raises
    ------
    ImportError
        ``safetensors`` is not installed (``pip install numbapos[io]``).
    TypeError
        ``module_or_dict`` is neither a Module nor a mapping; a name is not a
        str; a value is not a NumPy array or has a dtype safetensors cannot
        store (e.g. object, float128, complex128); nested state holds another
        kind of object or a dict key that is not a JSON scalar (the message
        gives its path); ``metadata`` is not str to str.
    ValueError
        ``metadata`` uses the reserved key ``"numbapos.state"``.
    FileNotFoundError
        The directory of ``path`` does not exist.
    """
    metadata = _check_metadata(metadata)
    if isinstance(module_or_dict, Mapping) and not _is_flat(module_or_dict):
        arrays: dict = {}
        tree = _encode(module_or_dict, "state", arrays, "")
        tensors = _collect(arrays)
        metadata = {**(metadata or {}), STATE_KEY: json.dumps(tree, allow_nan=True)}
    else:
        tensors = _collect(module_or_dict)
    safetensors = _safetensors()
    target = os.path.realpath(_fspath(path))
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"save_state: directory {directory!r} does not exist")
    if os.path.isdir(target):
        raise IsADirectoryError(f"save_state: {target!r} is a directory")
    temp = os.path.join(directory,
                        f".{os.path.basename(target)}.{uuid.uuid4().hex}.tmp")
    try:
        safetensors.numpy.save_file(tensors, temp, metadata=metadata)
        _fsync(temp)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temp)
        raise
    _fsync(directory, directory=True)
