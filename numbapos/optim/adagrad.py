"""Adagrad (PyTorch's) and row-wise Adagrad (FBGEMM's), on dense and row-sparse gradients."""

from __future__ import annotations

from .._docs import fill_doc
from ..functional import optim as F
from ..nn.parameter import Parameter
from ..sparse import SparseRows
from ._base import DOC, Optimizer, StateArray, num_rows


@fill_doc(DOC)
class Adagrad(Optimizer):
    """Adagrad, ``torch.optim.Adagrad``'s rule on dense and sparse gradients.

    Each element keeps the sum of its squared gradients ``s`` and steps by
    ``lr_t * g / (sqrt(s) + eps)`` with ``lr_t = lr / (1 + (step - 1) * lr_decay)``
    (:func:`numbapos.functional.adagrad_`). A
    :class:`~numbapos.sparse.SparseRows` gradient updates only the listed rows
    and their sums, with PyTorch's sparse formula (the same operations,
    :func:`numbapos.functional.sparse_adagrad_`), in O(rows used * D). As in
    PyTorch, ``weight_decay`` with a sparse gradient is refused
    (``ValueError`` here, ``RuntimeError`` in PyTorch), and ``step`` counts
    every step of the parameter, dense or sparse, so ``lr_decay`` decays with
    the parameter's steps, not the row's. Dense and sparse steps may
    alternate: both add into the same sums.

    State per parameter (see :class:`Optimizer` for the per-row
    convention): ``step`` (int) and ``sum`` (the parameter's shape and dtype,
    per row, starting at ``initial_accumulator_value``): V x D values. It is
    made on the parameter's first step (PyTorch makes it in the constructor).

    Parameters
    ----------
    params : iterable of Parameter, or of dicts
        Parameters to optimise, or parameter groups.
    lr : float, default 1e-2
    lr_decay : float, default 0
    weight_decay : float, default 0
        L2 penalty (dense gradients only).
    initial_accumulator_value : float, default 0
        Starting value of ``sum``.
    eps : float, default 1e-10
    maximize : bool, default False
        All options are finite and >= 0.
    {rounding}
    """

    _OPTIONS = ("lr", "lr_decay", "weight_decay", "initial_accumulator_value", "eps",
                "maximize")

    def __init__(self, params, lr=1e-2, lr_decay=0.0, weight_decay=0.0,
                 initial_accumulator_value=0.0, eps=1e-10, *, maximize=False,
                 stochastic_rounding=True, seed=0):
        super().__init__(params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value,
                                      eps=eps, maximize=maximize))
        self._set_rounding(stochastic_rounding, seed)

    def _check_options(self, options):
        return F.check_adagrad_options(options)

    def _state_spec(self, shape, dtype, group):
        return ({"sum": StateArray(shape, dtype, group["initial_accumulator_value"])},
                {"step": 0})

    def _check_sparse(self, group):
        if group["weight_decay"] != 0:
            raise ValueError("weight_decay: not compatible with SparseRows gradients (as in "
                             f"torch.optim.Adagrad), got {group['weight_decay']}")

    def _update(self, param: Parameter, group: dict, rounding: dict) -> None:
        state = self._state(param, group)
        clock = self._clock(param, group, state)
        state["step"] += 1
        options = {name: group[name] for name in ("lr", "lr_decay", "eps", "maximize")}
        if isinstance(param.grad, SparseRows):
            F.sparse_adagrad_(param.data, param.grad, state["sum"], step=state["step"],
                              clock=clock, **options, **rounding)
        else:
            F.adagrad_(param.data, param.grad, state["sum"], step=state["step"],
                       weight_decay=group["weight_decay"], clock=clock, **options)


@fill_doc(DOC)
class RowWiseAdagrad(Optimizer):
    """FBGEMM's exact row-wise Adagrad: one accumulator per row of an embedding table.

    The optimiser large recommendation tables are trained with
    (``fbgemm_gpu``'s ``EmbOptimType.EXACT_ROWWISE_ADAGRAD``). For row ``r``
    with gradient row ``g`` (D values)::

        s[r] += mean(h * h)      h = g + weight_decay * p[r] for "l2", else g
        mult = lr / (sqrt(s[r]) + eps)
        p[r] = c * p[r] - mult * g
        c = 1 - mult * weight_decay ("l2"), 1 - lr * weight_decay ("decoupled"), 1 ("none")

    as :func:`numbapos.functional.rowwise_adagrad_` describes, matching
    FBGEMM's CPU update (its ``split_weight_update_cpu``) operation for
    operation in the parameter's dtype; FBGEMM's defaults ``eps=1e-8``,
    ``weight_decay=0``, ``weight_decay_mode="none"`` (its ``WeightDecayMode``
    NONE, L2, DECOUPLED; the counter-based modes and ``max_norm`` are not
    provided). FBGEMM has no ``maximize`` or ``lr_decay`` and neither has this.

    A :class:`~numbapos.sparse.SparseRows` gradient updates only the listed
    rows and their accumulators (FBGEMM's sparse update); a dense gradient
    updates every row, adding ``mean(g * g)`` (0 for an all-zero row) to each
    accumulator. Both may alternate on one parameter.

    State per parameter of shape ``(V, ...)``: ``sum``, shape ``(V,)`` in the
    parameter's dtype (per row, see :class:`Optimizer`): V values instead of
    Adagrad's V x D. A 1-D parameter has rows of one value (plain Adagrad
    without ``lr_decay``); a 0-d one is a single row.

    Parameters
    ----------
    params : iterable of Parameter, or of dicts
        Parameters to optimise, or parameter groups.
    lr : float, default 1e-2
    eps : float, default 1e-8
    weight_decay : float, default 0
    weight_decay_mode : {"none", "l2", "decoupled"}, default "none"
        How ``weight_decay`` acts (a nonzero ``weight_decay`` needs "l2" or
        "decoupled").
    {rounding}
    """

    _OPTIONS = ("lr", "eps", "weight_decay", "weight_decay_mode")

    def __init__(self, params, lr=1e-2, eps=1e-8, weight_decay=0.0, weight_decay_mode="none",
                 *, stochastic_rounding=True, seed=0):
        super().__init__(params, dict(lr=lr, eps=eps, weight_decay=weight_decay,
                                      weight_decay_mode=weight_decay_mode))
        self._set_rounding(stochastic_rounding, seed)

    def _check_options(self, options):
        return F.check_rowwise_adagrad_options(options)

    def _state_spec(self, shape, dtype, group):
        return {"sum": StateArray((num_rows(shape),), dtype, 0)}, {}

    def _update(self, param: Parameter, group: dict, rounding: dict) -> None:
        state = self._state(param, group)
        options = {name: group[name] for name in self._OPTIONS}
        if isinstance(param.grad, SparseRows):
            F.sparse_rowwise_adagrad_(param.data, param.grad, state["sum"],
                                      clock=self._clock(param, group, state), **options,
                                      **rounding)
        else:
            F.rowwise_adagrad_(param.data, param.grad, state["sum"],
                               clock=self._clock(param, group, state), **options)
