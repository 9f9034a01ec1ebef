"""Parameter: a trainable array with its gradient."""

from __future__ import annotations

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from .. import _device
from .._checks import (
    FLOAT_DTYPES,
    check_float_array,
    check_parameter_data,
    check_same_device,
    grad_dtype,
)
from ..functional import arrays as _arrays
from ..sparse import SparseRows


class Parameter(NDArrayOperatorsMixin):
    """A float array a module trains, with its accumulated gradient.

    Parameters
    ----------
    data : array_like or CUDA array, float32, float64, bfloat16 or float16
        The values; kept as given (no copy), updated in place by optimisers.
        A CPU array of another library (a detached PyTorch tensor, anything
        with ``__array__`` or DLPack) is kept as a NumPy view of its memory; a
        CUDA array (CuPy, PyTorch, Numba) as a Numba device array sharing its
        memory. Another Parameter gives its ``data``.
    requires_grad : bool, default True
        False freezes the parameter: backward passes accumulate nothing into it
        and optimisers skip it.

    Attributes
    ----------
    grad : ndarray, SparseRows or None
        Accumulated gradient, None until the first backward pass (and after
        ``zero_grad``).
    version : int
        Counts the in-place changes numbapos made to ``data`` (see
        :meth:`bump_version`).

    Notes
    -----
    A Parameter behaves like its array, as a PyTorch parameter does:

    - ``param[i]``, ``param[1:3, ::2]`` index ``data`` and give views of it
      (writes through them change the parameter); ``param[i] = v`` writes
      ``data`` in place and calls :meth:`bump_version`.
    - NumPy ufuncs and operators (``param + 1``, ``np.exp(param)``,
      ``param @ x``, ``param == 0``, ``param.sum()`` is not one: use
      ``np.sum(param)``) compute on ``data`` and return NumPy arrays; the
      in-place operators (``param *= 0.5``) and ufuncs with ``out=param``
      update ``data`` in place, bump the version and keep the Parameter.
      As PyTorch's tensors, ``==`` is elementwise and a Parameter hashes by
      identity.
    - ``numpy.asarray(param)`` gives ``data`` (copied to the host if it lives
      on the GPU), so a Parameter can be passed wherever an array is
      expected; :meth:`numpy` gives ``data`` itself; ``shape``, ``dtype``,
      ``ndim``, ``T``, ``size`` (NumPy's: the element count, an int) and ``len``
      are ``data``'s.

    On the GPU, indexing gives views on the device (Numba device arrays, a
    single element as a host scalar) and ``param[i] = v`` writes on the
    device, but ufuncs, operators and :meth:`numpy` raise ``TypeError``:
    NumPy computes on the host, and numbapos does not copy a GPU table there
    behind an expression (PyTorch computes such expressions on the GPU; here
    use ``numbapos.to_host(param.data)`` for an explicit host copy, or
    ``param.to("cpu")``).
    """

    __hash__ = object.__hash__  # by identity, as PyTorch's tensors (== is elementwise)

    _numbapos_parameter = True  # array inputs take a Parameter's ``data`` (_checks.as_array)

    def __init__(self, data, requires_grad: bool = True):
        if isinstance(data, Parameter):
            data = data.data
        self.data = check_parameter_data(data, "data")
        self.requires_grad = bool(requires_grad)
        self.grad = None
        self._version = 0
        self._post_accumulate_grad_hooks: dict[int, object] = {}
        self._fused_step_hooks: set[int] = set()  # ids of hooks that are optimiser steps

    @property
    def version(self) -> int:
        """How often ``data`` was marked as changed in place (loads, clipping, casts)."""
        return self._version

    def bump_version(self) -> None:
        """Record an in-place change of ``data``.

        A module's backward that reads this parameter (a LayerNorm's weight, a
        block's tables) raises ``RuntimeError`` when the version moved since
        its forward, instead of computing the gradient from the new values.
        numbapos calls it wherever it writes ``data`` (:meth:`Module.load_state_dict`,
        ``max_norm`` clipping, every optimiser's update); call it after writing
        ``data`` in place yourself.
        """
        self._version += 1

    def __array__(self, dtype=None, copy=None):
        host = _device.to_host(self.data)
        if copy:
            return np.array(host, dtype=dtype, copy=True)
        return host if dtype is None else host.astype(dtype, copy=False)

    # ------------------------------------------------------------ the array interface

    def _host_data(self, what: str):
        """``data`` for a NumPy computation; TypeError for a parameter on the GPU."""
        if _device.device_of(self.data) != "cpu":
            raise TypeError(
                f"{what}: the Parameter lives on 'cuda' and NumPy computes on the host; "
                "numbapos does not copy a GPU parameter to the host inside an expression. "
                "Take an explicit host copy with numbapos.to_host(param.data) (or move it "
                "with param.to('cpu'))")
        return self.data

    def numpy(self) -> np.ndarray:
        """``data`` itself, a NumPy array sharing the parameter's memory (PyTorch's ``numpy()``).

        Raises
        ------
        TypeError
            The parameter lives on the GPU (as PyTorch's ``numpy()`` of a CUDA
            tensor): use ``numbapos.to_host(param.data)`` for a host copy.
        """
        return self._host_data("Parameter.numpy()")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        where = f"numpy.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
        written = [inputs[0]] if method == "at" and isinstance(inputs[0], Parameter) else []
        inputs = tuple(x._host_data(where) if isinstance(x, Parameter) else x for x in inputs)
        out = kwargs.get("out")
        if out is not None:
            outs = []
            for x in out:
                if isinstance(x, Parameter):
                    written.append(x)
                    x = x._host_data(where)
                outs.append(x)
            kwargs["out"] = tuple(outs)
        result = getattr(ufunc, method)(*inputs, **kwargs)
        for param in written:
            param.bump_version()
        return result

    def _inplace(self, ufunc, other):
        ufunc(self, other, out=(self,))
        return self

    def __iadd__(self, other):
        return self._inplace(np.add, other)

    def __isub__(self, other):
        return self._inplace(np.subtract, other)

    def __imul__(self, other):
        return self._inplace(np.multiply, other)

    def __itruediv__(self, other):
        return self._inplace(np.true_divide, other)

    def __ipow__(self, other):
        return self._inplace(np.power, other)

    def __getitem__(self, index):
        return self.data[index]

    def __setitem__(self, index, value) -> None:
        if isinstance(value, Parameter):
            value = value.data
        self.data[index] = value
        self.bump_version()

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self):
        return iter(self._host_data("iter(Parameter)"))

    @property
    def T(self):  # noqa: N802 (NumPy's and PyTorch's name)
        """``data.T``, a transposed view."""
        return self.data.T

    @property
    def ndim(self) -> int:
        return self.data.ndim

    @property
    def size(self) -> int:
        """The number of elements (NumPy's ``size``; PyTorch's ``numel()``)."""
        return int(self.data.size)

    def _cast(self, dtype) -> None:
        """Replace ``data`` (and a gradient) by ``dtype`` copies; no-op when already that dtype."""
        if self.data.dtype == dtype:
            return
        device = self.device
        self.data = _device.to_device(_device.to_host(self.data).astype(dtype), device)
        wanted = grad_dtype(dtype)  # float32 for a 16-bit table
        if isinstance(self.grad, SparseRows):
            values = self.grad.materialize().values
            values = _device.to_device(_device.to_host(values).astype(wanted), device)
            self.grad = SparseRows(self.grad.indices, values, self.grad.num_rows)
        elif self.grad is not None:
            self.grad = _device.to_device(_device.to_host(self.grad).astype(wanted), device)
        self.bump_version()

    def register_post_accumulate_grad_hook(self, hook) -> HookHandle:
        """Call ``hook(param)`` each time a backward pass has accumulated into ``grad``.

        As PyTorch's ``Tensor.register_post_accumulate_grad_hook``: the hook
        sees the accumulated ``param.grad`` and may use and clear it, e.g. to
        run an optimiser step inside the backward pass
        (:meth:`numbapos.optim.SGD.fuse_with_backward` does, through
        :meth:`_register_fused_step`). The hook sees a summed gradient, unless
        an optimiser's fused step is registered too (:attr:`fuses_step`): then
        a sparse gradient from :class:`~numbapos.nn.Embedding` is left unsummed
        (``grad.summed`` False, :meth:`SparseRows.materialize` sums it) so that
        the optimiser sums and updates in one pass; if the hooks leave it in
        ``grad``, it is summed before the backward pass returns.

        Returns
        -------
        HookHandle
            ``handle.remove()`` unregisters the hook.
        """
        if not callable(hook):
            raise TypeError(f"hook: expected a callable, got {type(hook).__name__}")
        handle = HookHandle(self._post_accumulate_grad_hooks)
        self._post_accumulate_grad_hooks[handle.id] = hook
        return handle

    def _register_fused_step(self, hook) -> HookHandle:
        """Register an optimiser's fused step (see :attr:`fuses_step`) as a hook."""
        handle = self.register_post_accumulate_grad_hook(hook)
        self._fused_step_hooks.add(handle.id)
        handle._fused = self._fused_step_hooks  # which its remove() updates too
        return handle

    @property
    def has_post_accumulate_grad_hooks(self) -> bool:
        """Whether any hook is registered."""
        return bool(self._post_accumulate_grad_hooks)

    @property
    def fuses_step(self) -> bool:
        """Whether an optimiser's step runs inside the backward
        (:meth:`~numbapos.optim.Optimizer.fuse_with_backward`): a sparse
        :class:`~numbapos.nn.Embedding` then hands it its gradient unsummed."""
        return bool(self._fused_step_hooks)

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    @property
    def dtype(self) -> np.dtype:
        return self.data.dtype

    @property
    def device(self) -> str:
        """Where the values live, ``"cpu"`` or ``"cuda"``."""
        return _device.device_of(self.data)

    def to(self, device: str) -> Parameter:
        """Move ``data`` (and ``grad``) to ``device`` in place of the old arrays; returns self."""
        device = _device.check_device(device)
        if device != self.device:
            self.data = _device.to_device(self.data, device)
            if isinstance(self.grad, SparseRows):
                self.grad = self.grad.to(device)
            elif self.grad is not None:
                self.grad = _device.to_device(self.grad, device)
        return self

    def accumulate_grad(self, grad, *, fresh: bool = False) -> None:
        """Add ``grad`` (dense array or SparseRows) into ``self.grad``.

        Sparse plus sparse stays sparse (rows merged); any dense term makes the
        sum dense. Does nothing when ``requires_grad`` is False. ``fresh=True``
        promises that nobody else holds ``grad``, so it can be kept without a copy.

        Raises
        ------
        TypeError
            ``grad`` not a float array or SparseRows, or of another dtype than
            the parameter (as PyTorch, gradients keep their parameter's dtype;
            unlike PyTorch, a bfloat16 / float16 parameter's gradient is float32).
        ValueError
            ``grad`` of another shape than the parameter.
        """
        if not self.requires_grad:
            return
        data = self.data
        sparse = isinstance(grad, SparseRows)
        if not sparse:
            grad = check_float_array(grad, "grad")
        shape = tuple(data.shape)
        if tuple(grad.shape) != shape:
            raise ValueError(f"grad: expected shape {shape}, got {tuple(grad.shape)}")
        expected = grad_dtype(data.dtype)
        if grad.dtype != expected:
            raise TypeError(f"grad: expected dtype {expected} (the gradient dtype of a "
                            f"{data.dtype} parameter), got {grad.dtype}")
        check_same_device((data, grad._padded()[0] if sparse else grad), ("data", "grad"))
        self._add_grad(grad, fresh)

    def _add_grad(self, grad, fresh: bool) -> None:
        """:meth:`accumulate_grad` once ``grad`` is checked: the sum, then the hooks."""
        sparse = isinstance(grad, SparseRows)
        if self.grad is None:
            self.grad = grad if fresh or sparse else _device.copy(grad)
        elif isinstance(self.grad, SparseRows) and isinstance(grad, SparseRows):
            self.grad = self.grad + grad
        elif isinstance(self.grad, SparseRows):
            dense = grad if fresh else _device.copy(grad)
            self.grad = self.grad.add_to(dense)
        elif isinstance(grad, SparseRows):
            grad.add_to(self.grad)
        else:
            _arrays.add_(self.grad, grad)
        for hook in list(self._post_accumulate_grad_hooks.values()):
            hook(self)
        if isinstance(self.grad, SparseRows):
            self.grad.materialize()  # sum now: the lookup's gradient may change later

    def _accumulate_computed(self, grad) -> None:
        """``accumulate_grad(grad, fresh=True)`` for a gradient a numbapos backward just
        computed for this parameter (C-contiguous): one of the parameter's shape and float
        dtype whose array (a SparseRows's values, summed or not) is of the parameter's type,
        so on its device, is added without checking it again."""
        if not self.requires_grad:
            return
        data = self.data
        if type(grad) is SparseRows:
            values = grad._source()
            shape = (grad._num_rows, values.shape[1])  # grad.shape, without reading it again
        else:
            values = grad
            shape = grad.shape
        if (type(values) is type(data) and values.dtype == data.dtype
                and data.dtype in FLOAT_DTYPES and shape == data.shape):
            self._add_grad(grad, True)
        else:
            self.accumulate_grad(grad, fresh=True)

    def __repr__(self) -> str:
        frozen = "" if self.requires_grad else ", requires_grad=False"
        where = "" if self.device == "cpu" else ", device='cuda'"
        values = np.array2string(_device.to_host(self.data), threshold=20, edgeitems=2,
                                 separator=", ", prefix="array(")
        return (f"Parameter containing:\narray({values}, dtype={self.data.dtype}{where}"
                f"{frozen})")


class HookHandle:
    """Removes a registered hook: ``handle.remove()`` (idempotent)."""

    _next_id = 0

    def __init__(self, hooks: dict):
        self._hooks = hooks
        self._fused: set | None = None  # a fused step's: the ids of those (Parameter)
        self.id = HookHandle._next_id
        HookHandle._next_id += 1

    def remove(self) -> None:
        self._hooks.pop(self.id, None)
        if self._fused is not None:
            self._fused.discard(self.id)
