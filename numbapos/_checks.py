"""Every input check and error message of numbapos, in one place.

Numba kernels do not bounds-check, so every array reaches a kernel only after
passing through here. Each check raises a ``TypeError``, ``ValueError`` or
``IndexError`` whose message names the argument, the value it got and what was
expected, and none of them modifies its input.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from . import _device

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


MAX_QUOTE = 200


def quote(value) -> str:
    """``repr(value)``, cut to about MAX_QUOTE characters (messages never print whole arrays)."""
    text = repr(value)
    return text if len(text) <= MAX_QUOTE else text[:MAX_QUOTE] + "..."


def type_name(x) -> str:
    """The full name of ``x``'s type (``torch.nn.parameter.Parameter``; ``list`` for builtins)."""
    kind = type(x)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _describe(x) -> str:
    if isinstance(x, np.ndarray) or _device.is_cuda_array(x):
        return f"{type_name(x)} of dtype {x.dtype} and shape {tuple(x.shape)}"
    return f"{type_name(x)} {quote(x)}"


def is_array(x) -> bool:
    """A NumPy array or a CUDA array (Numba device array or ``__cuda_array_interface__``)."""
    return isinstance(x, np.ndarray) or _device.is_cuda_array(x)


# ---------------------------------------------------------------- interop

_VIEW_PROTOCOLS = ("__array_interface__", "__array_struct__", "__array__")


def host_view(x, name: str):
    """A NumPy view of a CPU array of another library, or None if ``x`` is no array.

    The one conversion path of every array input: NumPy's array protocols
    (``__array__``, ``__array_interface__``: PyTorch CPU tensors, JAX arrays,
    numbapos Parameters), DLPack (``__dlpack__``) and the buffer protocol, all
    without a copy where the producer allows one. A PyTorch bfloat16 tensor,
    which none of them can read, is viewed through its bits as
    ``ml_dtypes.bfloat16`` (:func:`numbapos._device.torch_bfloat16_bits`). A
    tensor that requires grad raises TypeError (numbapos has no autograd: pass
    ``.detach()``).
    """
    if getattr(x, "_numbapos_parameter", False):
        return x.data
    if getattr(x, "requires_grad", False) is True and hasattr(x, "detach"):
        raise TypeError(
            f"{name}: got a {type_name(x)} that requires grad; numbapos computes gradients "
            f"itself, so pass {name}.detach() (a view of the same memory, no copy)"
        )
    try:
        bits = _device.torch_bfloat16_bits(x)
        if bits is not None:
            return np.asarray(bits).view(bfloat16_dtype())
        if any(hasattr(x, attr) for attr in _VIEW_PROTOCOLS):
            return np.asarray(x)
        if hasattr(x, "__dlpack__"):
            return np.from_dlpack(x)
        if isinstance(x, (bytes, bytearray, memoryview)):
            return np.asarray(memoryview(x))
    except (TypeError, ValueError, RuntimeError, BufferError) as err:
        raise TypeError(f"{name}: cannot view the {type_name(x)} as a NumPy array: "
                        f"{str(err)[:MAX_QUOTE]}") from err
    return None


def as_array(x, name: str):
    """``x`` as a NumPy array (CPU array-likes viewed without a copy) or a Numba device array.

    TypeError for anything that is not an array (lists included) or for a
    tensor that requires grad.
    """
    if isinstance(x, np.ndarray):
        return x
    if _device.is_cuda_array(x):
        return _device.adopt(x)
    view = host_view(x, name)
    if view is None:
        raise TypeError(f"{name}: expected a NumPy or CUDA array (or a CPU array NumPy can "
                        f"view, such as a detached PyTorch tensor), got {_describe(x)}")
    if _device.is_cuda_array(view):
        view = _device.adopt(view)
    return view


# ---------------------------------------------------------------- scalars


def check_int(value, name: str, *, minimum: int | None = None,
              maximum: int | None = None) -> int:
    """Return ``value`` as a Python int; TypeError if it is not integral (bool included).

    ValueError if it is below ``minimum`` or above ``maximum`` (where given).
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name}: expected an integer, got {_describe(value)}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name}: expected an integer <= {maximum}, got {value}")
    return value


def check_int64(value, name: str, *, minimum: int = INT64_MIN) -> int:
    """An integer that a kernel receives as int64: in ``[minimum, 2**63 - 1]``."""
    return check_int(value, name, minimum=minimum, maximum=INT64_MAX)


def check_real(value, name: str) -> float:
    """Return ``value`` as a Python float; TypeError if it is not a real number."""
    if type(value) is not float and (isinstance(value, (bool, np.bool_))
                                     or not isinstance(value, numbers.Real)):
        raise TypeError(f"{name}: expected a real number, got {_describe(value)}")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name}: expected a number, got nan")
    return value


def check_positive(value, name: str, *, allow_inf: bool = False) -> float:
    """Return ``value`` as a float > 0 (``inf`` only where ``allow_inf``)."""
    value = check_real(value, name)
    if value <= 0 or (math.isinf(value) and not allow_inf):
        expected = "a positive number (inf allowed)" if allow_inf else "a finite positive number"
        raise ValueError(f"{name}: expected {expected}, got {value}")
    return value


def check_unit_interval(value, name: str) -> float:
    """Return ``value`` as a float in [0, 1] (a probability where 1 is allowed)."""
    value = check_real(value, name)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}: expected a probability in [0, 1], got {value}")
    return value


def check_uint64(value, name: str) -> int:
    """Return ``value`` as a Python int in [0, 2**64) (seeds and counters of hashes)."""
    value = check_int(value, name, minimum=0)
    if value >= 1 << 64:
        raise ValueError(f"{name}: expected an integer < 2**64, got {value}")
    return value


_TORCH_FLOATS = {"torch.float32": np.dtype(np.float32), "torch.float64": np.dtype(np.float64)}


def check_float_dtype(dtype, name: str = "dtype") -> np.dtype:
    """Return ``dtype`` as float32 or float64; TypeError for anything else.

    Accepts NumPy dtypes, their scalar types and names (``"float32"``,
    ``"f8"``, ``"double"``) and ``torch.float32`` / ``torch.float64``
    (recognised without importing torch). The name ``"float"`` is refused as
    ambiguous (NumPy reads it as float64, PyTorch's ``torch.float`` is float32).
    """
    if _device.torch_kind(dtype) == "dtype":
        resolved = _TORCH_FLOATS.get(str(dtype))
        if resolved is None:
            raise TypeError(f"{name}: expected float32 or float64, got {dtype}")
        return resolved
    if _device.is_device_spelling(dtype):
        raise TypeError(f"{name}: expected float32 or float64, got the device {quote(dtype)} "
                        "(pass it as the device)")
    if isinstance(dtype, str) and dtype.strip() == "float":
        raise TypeError(f"{name}: expected float32 or float64, got 'float', which is "
                        "ambiguous (float64 to NumPy, float32 to PyTorch); write 'float32' or "
                        "'float64'")
    try:
        resolved = np.dtype(dtype)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name}: expected float32 or float64, got {quote(dtype)}") from err
    if resolved not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected float32 or float64, got {resolved}")
    return resolved


# ---------------------------------------------------------------- arrays


def check_float_array(x, name: str, *, ndim: int | tuple[int, ...] | None = None):
    """Return ``x`` as a float32/float64 array (no copy), checking its rank.

    NumPy arrays stay NumPy arrays, CPU arrays of other libraries become NumPy
    views (see :func:`as_array`); CUDA arrays come back as Numba device arrays
    (foreign ones adopted without a copy).
    """
    if not isinstance(x, np.ndarray):
        if _device.is_cuda_array(x):
            x = _device.adopt(x)
            check_cuda_contiguous(x, name)
        else:
            view = host_view(x, name)
            if view is None:
                raise TypeError(f"{name}: expected a NumPy or CUDA array of float32 or "
                                "float64 (or a CPU array NumPy can view, such as a detached "
                                f"PyTorch tensor), got {_describe(x)}")
            x = check_float_array(view, name) if _device.is_cuda_array(view) else view
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name}: expected dtype float32 or float64, got {x.dtype}")
    if ndim is not None:
        _check_rank(x, name, ndim)
    return x


def _check_rank(x, name: str, ndim: int | tuple[int, ...]) -> None:
    allowed = (ndim,) if isinstance(ndim, int) else ndim
    if x.ndim not in allowed:
        want = " or ".join(f"{n}-D" for n in allowed)
        raise ValueError(f"{name}: expected a {want} array, got shape {tuple(x.shape)}")


def check_cuda_contiguous(x, name: str) -> None:
    """CUDA arrays reach the kernels C-contiguous: ValueError for a strided one."""
    if not _device.is_c_contiguous(x):
        raise ValueError(f"{name}: expected a C-contiguous CUDA array, got strides "
                         f"{tuple(x.strides)} for shape {tuple(x.shape)}; make a contiguous "
                         "copy first (CuPy: cupy.ascontiguousarray, PyTorch: .contiguous())")


def check_index_array(indices, name: str = "indices") -> np.ndarray:
    """Return ``indices`` as an int32 or int64 ndarray of any shape (0-d included).

    Python ints, NumPy integer scalars and nested lists are accepted; integer
    dtypes other than int32/int64 are converted to int64. Bool and float
    indices raise ``TypeError``.
    """
    if type(indices) is np.ndarray and indices.dtype in INDEX_DTYPES:
        return indices  # the common case, kept fast for small lookups
    if _device.is_cuda_array(indices):
        indices = _device.adopt(indices)
        check_cuda_contiguous(indices, name)
        if indices.dtype not in INDEX_DTYPES:
            raise TypeError(f"{name}: expected integer indices of dtype int32 or int64 on the "
                            f"GPU, got dtype {indices.dtype}; cast them first")
        return indices
    if isinstance(indices, (bool, np.bool_)):
        raise TypeError(f"{name}: expected integer indices, got a bool")
    arr = indices if isinstance(indices, np.ndarray) else host_view(indices, name)
    was_array = arr is not None
    if arr is None:
        try:
            arr = np.asarray(indices)
        except ValueError as err:  # ragged nested lists
            raise ValueError(f"{name}: cannot make an array of integer indices: {err}") from err
    elif _device.is_cuda_array(arr):
        return check_index_array(arr, name)
    if not was_array and arr.size == 0 and arr.dtype == np.float64:
        arr = arr.astype(np.int64)  # an empty Python list has no dtype of its own
    if arr.dtype.kind not in "iu":  # bool, float, timedelta64 (a NumPy "integer"), object...
        raise TypeError(
            f"{name}: expected integer indices (int32 or int64), got dtype {arr.dtype}"
        )
    if arr.dtype not in INDEX_DTYPES:
        if arr.dtype == np.uint64 and arr.size and arr.max() > np.iinfo(np.int64).max:
            bad = int(arr.reshape(-1)[np.argmax(arr.reshape(-1) > np.iinfo(np.int64).max)])
            raise IndexError(f"{name}: index {bad} is out of range")
        arr = arr.astype(np.int64)
    return arr


def check_index_range(flat, size: int, bounds, name: str = "indices",
                      size_name: str = "num_embeddings") -> None:
    """Raise IndexError naming the first index of ``flat`` outside ``[0, size)``.

    ``bounds`` is ``(min, max)`` of ``flat`` as the backend computed it
    (``K.index_bounds``), or None for an empty ``flat``; only a failing check
    looks at the values themselves (on the host) to name the first bad one.
    """
    if bounds is None:
        return
    low, high = bounds
    if low >= 0 and high < size:
        return
    host = _device.to_host(flat).reshape(-1)
    bad_mask = (host < 0) | (host >= size)
    raise_index_error(host, int(np.argmax(bad_mask)), size, name, size_name)


def raise_index_error(flat, position: int, size: int, name: str = "indices",
                      size_name: str = "num_embeddings"):
    """Raise the IndexError for the bad index at ``position`` of the host array ``flat``."""
    bad = int(flat.reshape(-1)[position])
    raise IndexError(
        f"{name}: index {bad} (at flat position {position}) is out of range for "
        f"{size_name}={size}; valid indices are 0 <= index < {size}"
    )


def check_sorted_rows(rows: np.ndarray, num_rows: int, name: str = "indices") -> None:
    """Raise unless the 1-D int ``rows`` are strictly increasing and in ``[0, num_rows)``.

    The row list of a :class:`~numbapos.sparse.SparseRows` gradient: IndexError
    for a row out of range, ValueError for a repeated or out-of-order row.
    """
    rows = _device.to_host(rows)
    bounds = (int(rows.min()), int(rows.max())) if rows.size else None
    check_index_range(rows, num_rows, bounds, name, "num_rows")
    if rows.size > 1:
        bad = rows[1:] <= rows[:-1]
        if bad.any():
            k = int(np.argmax(bad)) + 1
            raise ValueError(
                f"{name}: rows must be unique and sorted ascending, got {int(rows[k - 1])} "
                f"before {int(rows[k])} (at position {k})"
            )


def check_weight(weight, name: str = "weight") -> np.ndarray:
    """An embedding table: a 2-D float32/float64 ndarray."""
    return check_float_array(weight, name, ndim=2)


# ---------------------------------------------------------------- 16-bit tables

FLOAT16 = np.dtype(np.float16)


def is_half_dtype(dtype) -> bool:
    """Whether ``dtype`` (a NumPy dtype) is bfloat16 (``ml_dtypes``) or float16.

    bfloat16 is recognised by its name, so ``ml_dtypes`` is not imported here.
    A training step asks about a dozen times: answers are kept per dtype (a dict
    lookup is 0.05 us; comparing dtypes and reading a name, 0.9-3.8 us).
    """
    if dtype is _FLOAT32_DTYPE or dtype is _FLOAT64_DTYPE:  # the common case, by identity
        return False
    try:
        return _HALF_ANSWERS[dtype]
    except (KeyError, TypeError):  # TypeError: not hashable, so not a dtype
        pass
    answer = dtype == FLOAT16 or getattr(dtype, "name", None) == "bfloat16"
    if isinstance(dtype, np.dtype):
        _HALF_ANSWERS[dtype] = answer
    return answer


_FLOAT32_DTYPE, _FLOAT64_DTYPE = np.dtype(np.float32), np.dtype(np.float64)
_HALF_ANSWERS: dict = {}


bfloat16_dtype = _device.bfloat16_dtype


_TABLE_NAMES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16",
                "half": "float16", "f2": "float16", "float32": "float32",
                "float64": "float64"}
_TABLE_EXPECTED = "float32, float64, bfloat16 or float16"


def check_table_dtype(dtype, name: str = "dtype") -> np.dtype:
    """A table's dtype: float32 / float64 (see :func:`check_float_dtype`), or bfloat16 /
    float16 spelt as a NumPy or ``ml_dtypes`` dtype, a name (``"bfloat16"``, ``"float16"``,
    ``"half"``) or ``torch.bfloat16`` / ``torch.float16`` (recognised without importing torch).
    """
    if _device.torch_kind(dtype) == "dtype":
        text = str(dtype)
        if text in ("torch.bfloat16",):
            return bfloat16_dtype()
        if text in ("torch.float16", "torch.half"):
            return FLOAT16
        if text not in _TORCH_FLOATS:
            raise TypeError(f"{name}: expected {_TABLE_EXPECTED}, got {dtype}")
        return _TORCH_FLOATS[text]
    if isinstance(dtype, str) and _TABLE_NAMES.get(dtype.strip().lower()) == "bfloat16":
        return bfloat16_dtype()
    if getattr(dtype, "__name__", None) == "bfloat16" or getattr(dtype, "name", None) == "bfloat16":
        return np.dtype(dtype)
    try:
        if np.dtype(dtype) == FLOAT16 and not isinstance(dtype, bool):
            return FLOAT16
    except (TypeError, ValueError):
        pass
    try:
        return check_float_dtype(dtype, name)
    except TypeError as err:
        raise TypeError(str(err).replace("float32 or float64", _TABLE_EXPECTED)) from None


def grad_dtype(dtype) -> np.dtype:
    """The dtype of a gradient of a ``dtype`` parameter: float32 for 16-bit ones, else its own."""
    if dtype is _FLOAT32_DTYPE or dtype is _FLOAT64_DTYPE:  # the common case, by identity
        return dtype
    return _FLOAT32_DTYPE if is_half_dtype(dtype) else dtype


def _viewed(x, name: str):
    """``x`` as a NumPy view or an adopted CUDA array where it is an array of another
    library (a PyTorch bfloat16 tensor included), else ``x`` itself."""
    if isinstance(x, np.ndarray):
        return x
    if _device.is_cuda_array(x):
        return _device.adopt(x)
    view = host_view(x, name)
    return x if view is None else view


def check_parameter_data(data, name: str = "data"):
    """A parameter's array: float32 / float64 of any shape, or a 2-D bfloat16 / float16 table."""
    data = _viewed(data, name)
    dtype = getattr(data, "dtype", None)
    if dtype is not None and is_half_dtype(dtype) and getattr(data, "ndim", 0) == 2:
        return check_table(data, name)
    return check_float_array(data, name)


def check_table(weight, name: str = "weight"):
    """An embedding table of any format lookups take: a 2-D float32 / float64 array, or a
    2-D bfloat16 / float16 one (NumPy or CUDA; a PyTorch bfloat16 tensor through its
    bits, see :func:`host_view`)."""
    weight = _viewed(weight, name)
    dtype = getattr(weight, "dtype", None)
    if dtype is not None and is_half_dtype(dtype) and (
            isinstance(weight, np.ndarray) or _device.is_cuda_array(weight)):
        if _device.is_cuda_array(weight):
            weight = _device.adopt(weight)
            check_cuda_contiguous(weight, name)
        if weight.ndim != 2:
            raise ValueError(f"{name}: expected a 2-D array, got shape {tuple(weight.shape)}")
        return weight
    try:
        return check_float_array(weight, name, ndim=2)
    except TypeError as err:
        raise TypeError(str(err).replace("float32 or float64", _TABLE_EXPECTED)) from None


def check_float_or_half_array(x, name: str, *, ndim: int | tuple[int, ...] | None = None):
    """An activation of any float format: float32 / float64 as :func:`check_float_array`
    checks it, or bfloat16 / float16 of any shape (CUDA arrays C-contiguous), no copy."""
    arr = _viewed(x, name)
    if not is_array(arr) or not is_half_dtype(arr.dtype):
        try:
            return check_float_array(arr, name, ndim=ndim)
        except TypeError as err:
            raise TypeError(str(err).replace("float32 or float64", _TABLE_EXPECTED)) from None
    if _device.is_cuda_array(arr):
        check_cuda_contiguous(arr, name)
    if ndim is not None:
        _check_rank(arr, name, ndim)
    return arr


def check_writeable(x, name: str, why: str) -> None:
    """ValueError unless ``x`` can be written in place (``why`` says what writes it)."""
    if not _device.is_writeable(x):
        raise ValueError(f"{name}: the array is read-only, but {why}")


def check_padding_idx(padding_idx, num_embeddings: int, name: str = "padding_idx") -> int | None:
    """Return ``padding_idx`` wrapped into ``[0, num_embeddings)``, or None."""
    if padding_idx is None:
        return None
    padding_idx = check_int(padding_idx, name)
    if not -num_embeddings <= padding_idx < num_embeddings:
        raise ValueError(
            f"{name}: {padding_idx} is outside [-{num_embeddings}, {num_embeddings}) "
            f"for num_embeddings={num_embeddings}"
        )
    return padding_idx % num_embeddings


def check_max_norm(max_norm, norm_type) -> tuple[float | None, float]:
    """Validate the pair (max_norm, norm_type); max_norm may be None."""
    norm_type = check_positive(norm_type, "norm_type", allow_inf=True)
    if max_norm is not None:
        max_norm = check_positive(max_norm, "max_norm", allow_inf=True)
    return max_norm, norm_type


def check_out(out, shape: tuple, dtype: np.dtype, name: str = "out",
              avoid: tuple[np.ndarray | None, ...] = ()) -> np.ndarray:
    """A caller-owned result buffer: exact shape and dtype, C-contiguous, writeable.

    ``out`` must not overlap any array in ``avoid`` (None entries are skipped):
    list every input a kernel reads while writing ``out``, index arrays
    included, since a kernel that reads an index ``out`` has just overwritten
    would read outside its table.
    """
    out = as_array(out, name)
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
        raise ValueError(
            f"{name}: expected shape {tuple(shape)} and dtype {dtype}, "
            f"got shape {tuple(out.shape)} and dtype {out.dtype}"
        )
    if not _device.is_c_contiguous(out) or not _device.is_writeable(out):
        raise ValueError(f"{name}: expected a C-contiguous, writeable array")
    for other in avoid:
        if other is not None and _device.may_share_memory(out, other):
            raise ValueError(f"{name}: must not share memory with an input array")
    return out


def check_values_buffer(buf, min_rows: int, dim: int, dtype: np.dtype,
                        name: str = "values_out", avoid: tuple = ()) -> np.ndarray:
    """A buffer for sparse gradient values: ``(M, dim)``, ``M >= min_rows``; else as check_out."""
    arr = as_array(buf, name)
    rows = arr.shape[0] if arr.ndim == 2 else -1
    if arr.ndim != 2 or rows < min_rows or arr.shape[1] != dim:
        raise ValueError(f"{name}: expected shape (M, {dim}) with M >= {min_rows} (the number "
                         f"of indices), got shape {tuple(arr.shape)}")
    return check_out(arr, (rows, dim), dtype, name, avoid=avoid)


def check_attention_mask(mask, name: str = "attention_mask"):
    """A 1-D or 2-D mask of bool or integer dtype holding only 0 and 1 (no copy of an ndarray).

    A CUDA array stays on the device, its dtype and shape checked: its values are
    checked by the kernel that reads them (``K.positions_from_mask``: a deferred
    ValueError), so the mask is never copied to the host.
    """
    if _device.is_cuda_array(mask):
        arr = _device.adopt(mask)  # a Numba device array, no copy
    else:
        arr = host_view(mask, name) if not isinstance(mask, np.ndarray) else mask
        arr = np.asarray(mask) if arr is None else arr
    if arr.dtype != np.bool_ and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(
            f"{name}: expected a bool or integer mask of 0s and 1s, got dtype {arr.dtype}"
        )
    if arr.ndim not in (1, 2):
        raise ValueError(f"{name}: expected a 1-D or 2-D mask, got shape {tuple(arr.shape)}")
    if isinstance(arr, np.ndarray) and arr.dtype != np.bool_ and arr.size:
        bad = (arr != 0) & (arr != 1)
        if bad.any():
            value = arr.reshape(-1)[int(np.argmax(bad.reshape(-1)))]
            raise ValueError(f"{name}: expected only 0 and 1, got {int(value)}")
    return arr


def check_float_like(x, name: str, shape: tuple, dtype: np.dtype, shape_what: str,
                     dtype_what: str) -> np.ndarray:
    """A float array of exactly ``shape`` (ValueError) and ``dtype`` (TypeError).

    For arrays that must match another: a gradient its activation, a statistic
    or a LayerNorm parameter its input. ``shape_what`` / ``dtype_what`` say
    where the expected values come from, for the message.
    """
    if ((type(x) is np.ndarray or (_device._is_numba_device_array(x) and x.is_c_contiguous()))
            and x.dtype == dtype and dtype in FLOAT_DTYPES and x.shape == tuple(shape)):
        return x  # what the checks below pass, read directly
    x = check_float_array(x, name)
    check_same_shape(x, shape, name, shape_what)
    if x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} ({dtype_what}), got {x.dtype}")
    return x


def check_same_shape(x, expected: tuple, name: str, what: str) -> None:
    """ValueError unless ``x.shape == expected``."""
    if tuple(x.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)} ({what}), got "
                         f"{tuple(x.shape)}")


def as_rng(seed, name: str = "seed") -> np.random.Generator:
    """A ``numpy.random.Generator`` from None, an int seed or a Generator."""
    if seed is None or isinstance(seed, np.random.Generator):
        return np.random.default_rng(seed)
    return np.random.default_rng(check_int(seed, name, minimum=0))


def check_eps(eps, name: str = "eps") -> float:
    """``eps`` (LayerNorm's) as a finite float >= 0."""
    eps = check_real(eps, name)
    if eps < 0 or not math.isfinite(eps):
        raise ValueError(f"{name}: expected a finite number >= 0, got {eps}")
    return eps


def check_dropout_args(p, seed, counter) -> tuple[float, int, object]:
    """``(p, seed, counter)`` of a dropout call: p in [0, 1], seed and counter in [0, 2**64).

    ``counter`` may also be a device counter: a CUDA array of one uint64 (its
    metadata is checked, its value is read by the kernels, never here).
    """
    p = check_unit_interval(p, "p")
    seed = check_uint64(seed, "seed")
    if _device.is_cuda_array(counter):
        return p, seed, check_device_counter(counter, "counter")
    return p, seed, check_uint64(counter, "counter")


def check_device_counter(counter, name: str):
    """``counter`` (a CUDA array) adopted, if it is one uint64 (metadata only)."""
    counter = _device.adopt(counter)
    if counter.dtype != np.uint64 or tuple(counter.shape) != (1,):
        raise ValueError(f"{name}: a device counter must be a CUDA array of one uint64, got "
                         f"shape {tuple(counter.shape)} and dtype {counter.dtype}")
    return counter


def check_counter_device(counter, device: str) -> None:
    """TypeError when a device counter (a CUDA array) goes with data on the CPU."""
    if device != "cuda" and not isinstance(counter, int):
        raise TypeError("counter: a device counter (a CUDA array) needs CUDA data; on the CPU "
                        "pass an int")


def check_same_device(arrays, names) -> str:
    """The one device all non-None ``arrays`` live on; TypeError naming two that differ."""
    device = first = None
    for x, name in zip(arrays, names, strict=True):
        if x is None:
            continue
        here = _device.device_of(x)
        if device is None:
            device, first = here, name
        elif here != device:
            raise TypeError(f"{name}: is on {here!r} but {first} is on {device!r}; "
                            "move them to one device first (numbapos.to_device)")
    return device or "cpu"


def check_matching_table(x, table, table_name: str, x_name: str = "x"):
    """A 2-D float ``table`` of ``x``'s width (its last dimension) and dtype."""
    table = check_float_array(table, table_name, ndim=2)
    if table.shape[1] != x.shape[x.ndim - 1]:
        raise ValueError(
            f"{table_name}: has {table.shape[1]} columns but {x_name} has last dimension "
            f"{x.shape[x.ndim - 1]} ({x_name}.shape={tuple(x.shape)}); they must be equal"
        )
    if table.dtype != x.dtype:
        raise TypeError(
            f"{table_name}: dtype {table.dtype} differs from {x_name}'s dtype {x.dtype}; "
            "cast one of them so both match"
        )
    return table


def check_vector_param(param, name: str, dim: int, dtype, dim_what: str, dtype_what: str):
    """None, or a 1-D float array of shape ``(dim,)`` and ``dtype`` (LayerNorm weight/bias)."""
    if param is None:
        return None
    check_float_array(param, name, ndim=1)
    return check_float_like(param, name, (dim,), dtype, dim_what, dtype_what)


def check_offset_only(offset, position_ids) -> int:
    """``offset`` must be 0 when explicit ``position_ids`` are given."""
    offset = check_int(offset, "offset")
    if position_ids is not None and offset != 0:
        raise ValueError(
            f"offset: got {offset} together with position_ids; pass either an offset "
            "or explicit position_ids, not both"
        )
    return offset


def check_update_target(param, name: str = "param"):
    """A parameter an optimiser writes in place: a float array that is writeable."""
    dtype = getattr(param, "dtype", None)
    if dtype is not None and is_half_dtype(dtype):
        raise TypeError(f"{name}: the functional optimiser ops update float32 / float64 "
                        f"arrays; a {dtype} table is updated by the numbapos.optim "
                        "optimisers (in float32, stored back with stochastic rounding), or "
                        "through functional.widen_table / store_rounded_")
    param = check_float_array(param, name)
    if not _device.is_writeable(param):
        raise ValueError(f"{name}: the parameter of shape {tuple(param.shape)} is read-only")
    return param


def check_sparse_grad(grad, param, name: str = "grad", summed: bool = True):
    """A SparseRows gradient of the 2-D ``param``: its shape, rows unique, sorted, in range.

    The arrays of a SparseRows can be changed after it was made, so they are
    checked again here, before a kernel writes the rows they name, unless
    they never left numbapos (a gradient numbapos grouped, whose arrays no
    caller has read): those are used as they are, padded on the GPU, without
    reading anything back. With ``summed=False`` the values of an unsummed
    gradient are left unsummed (returned as None).

    Returns ``(rows, values, used)``: ``used`` is the number of real rows, an
    int or (GPU) a device array whose first entry is.
    """
    if param.ndim != 2:
        raise ValueError(f"{name}: a SparseRows gradient needs a 2-D parameter, got shape "
                         f"{tuple(param.shape)}")
    if tuple(grad.shape) != tuple(param.shape):
        raise ValueError(f"{name}: SparseRows of shape {tuple(grad.shape)}, expected the "
                         f"parameter's shape {tuple(param.shape)}")
    if grad._private:
        rows, values, used = grad._padded()
        return rows, values if summed else None, used
    rows = check_index_array(grad.indices, f"{name}.indices")
    values = check_float_array(grad.values, f"{name}.values", ndim=2) if summed else None
    if rows.ndim != 1 or (summed and rows.shape[0] != values.shape[0]):
        raise ValueError(f"{name}: {tuple(rows.shape)} indices for "
                         f"{values.shape[0] if summed else '?'} value rows")
    check_sorted_rows(rows, param.shape[0], f"{name}.indices")
    return rows, values, int(rows.shape[0])


# ---------------------------------------------------------------- quantised tables

QUANTIZED_BITS = (8, 4)


def check_bits(bits, name: str = "bits") -> int:
    """The code width of a row-wise quantised table: 8 or 4."""
    if isinstance(bits, (bool, np.bool_)) or not isinstance(bits, numbers.Integral):
        raise TypeError(f"{name}: expected 8 or 4, got {_describe(bits)}")
    if int(bits) not in QUANTIZED_BITS:
        raise ValueError(f"{name}: expected 8 or 4 (bits per code), got {int(bits)}")
    return int(bits)


def rowwise_width(dim: int, bits: int) -> int:
    """Bytes per row of a fused row-wise table: codes, then scale and bias."""
    return dim + 8 if bits == 8 else (dim + 1) // 2 + 4


def check_packed(packed, bits: int, dim=None, name: str = "packed"):
    """A fused row-wise quantised table and its row length D: ``(packed, D)``.

    ``packed`` is a 2-D uint8 array (CUDA arrays C-contiguous) of width
    ``D + 8`` (8 bits) or ``ceil(D / 2) + 4`` (4 bits). ``dim`` is only
    needed for an odd D with 4 bits (default ``2 * (width - 4)``).
    """
    packed = as_array(packed, name)
    if _device.is_cuda_array(packed):
        check_cuda_contiguous(packed, name)
    if packed.dtype != np.uint8 or packed.ndim != 2:
        raise TypeError(f"{name}: expected a 2-D uint8 array (a table from "
                        f"quantize_rowwise), got dtype {packed.dtype} and shape "
                        f"{tuple(packed.shape)}")
    width = packed.shape[1]
    overhead = 8 if bits == 8 else 4
    if width < overhead:
        raise ValueError(f"{name}: a {bits}-bit row holds its codes and {overhead} bytes of "
                         f"scale and bias, so at least {overhead} bytes; got rows of {width}")
    natural = width - 8 if bits == 8 else 2 * (width - 4)
    if dim is None:
        return packed, natural
    dim = check_int(dim, "dim", minimum=0)
    if rowwise_width(dim, bits) != width:
        raise ValueError(f"dim: {dim} columns take {rowwise_width(dim, bits)} bytes per "
                         f"{bits}-bit row, but {name} has rows of {width} bytes "
                         f"(dim {natural}" + (f" or {natural - 1})" if bits == 4 and natural
                                              else ")"))
    return packed, dim
