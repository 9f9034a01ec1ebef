"""Adam and AdamW: PyTorch's rule on dense gradients, SparseAdam's lazy rule on row-sparse ones."""

from __future__ import annotations

from .._docs import fill_doc
from ..functional import optim as F
from ..nn.parameter import Parameter
from ..sparse import SparseRows
from ._base import DOC, Optimizer, StateArray, momentum_dtype_doc

_doc = fill_doc(DOC, momentum_dtype=momentum_dtype_doc("the first moment ``exp_avg``"))


@_doc
class Adam(Optimizer):
    """Adam, ``torch.optim.Adam`` on dense gradients and ``torch.optim.SparseAdam`` on sparse ones.

    A dense gradient gets exactly PyTorch's Adam step (see
    :func:`numbapos.functional.adam_`), L2 ``weight_decay`` or, with
    ``decoupled_weight_decay=True`` (:class:`AdamW`), decoupled decay, and
    ``amsgrad``.

    A :class:`~numbapos.sparse.SparseRows` gradient (``Embedding(sparse=True)``)
    gets ``torch.optim.SparseAdam``'s *lazy* step
    (:func:`numbapos.functional.sparse_adam_`): only the listed rows of the
    parameter and of its moments are read and written, so a step costs
    O(rows used * D); rows not listed keep their moments (they do not decay)
    and their values. The step count is per parameter, as in SparseAdam: a row
    first touched at step 100 gets step 100's bias correction. SparseAdam has
    no ``weight_decay``; here it acts on the listed rows only (L2 into their
    gradient, or AdamW's decay of those rows) and with ``weight_decay=0`` the
    result is SparseAdam's. ``amsgrad`` with a sparse gradient is refused
    (``ValueError``), as SparseAdam has none.

    Dense and sparse steps may alternate on one parameter: both update the
    same moments and step count; a dense step moves every row (PyTorch's Adam
    formula), a sparse step the listed rows (SparseAdam's, which places
    ``eps`` after the bias correction instead of before).

    State per parameter of shape ``(V, ...)`` (see :class:`Optimizer` for the
    per-row convention): ``step`` (int, steps taken), ``exp_avg`` and
    ``exp_avg_sq`` (the parameter's shape and dtype, per row) and, with
    ``amsgrad``, ``max_exp_avg_sq`` (same). Memory: 2 (or 3) x V x D values.

    Parameters
    ----------
    params : iterable of Parameter, or of dicts
        Parameters to optimise, or parameter groups (dicts with ``"params"``
        and option overrides).
    lr : float, default 1e-3
        Learning rate (>= 0).
    betas : (float, float), default (0.9, 0.999)
        Decay rates of the moments, each in ``[0, 1)``.
    eps : float, default 1e-8
        Added to the denominator (>= 0).
    weight_decay : float, default 0
        L2 penalty, or decoupled decay rate with ``decoupled_weight_decay``.
    amsgrad : bool, default False
        Use the running maximum of ``exp_avg_sq`` (AMSGrad); dense gradients only.
    maximize : bool, default False
        Ascend the objective.
    decoupled_weight_decay : bool, default False
        AdamW's decoupled decay: ``p *= 1 - lr * weight_decay`` before the step.
    {rounding}
    {momentum_dtype}

    Examples
    --------
    >>> import numpy as np
    >>> from numbapos import nn, optim
    >>> emb = nn.Embedding(1000, 8, sparse=True, seed=0)
    >>> opt = optim.Adam(emb.parameters(), lr=1e-2)
    >>> out = emb(np.array([3, 5, 3]))
    >>> _ = emb.backward(np.ones_like(out))
    >>> opt.step()  # rows 3 and 5 (and their moments) change, nothing else
    >>> opt.state_dict()["state"][0]["step"]
    1
    """

    _OPTIONS = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize",
                "decoupled_weight_decay")
    _MOMENTUM = "exp_avg"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 amsgrad=False, *, maximize=False, decoupled_weight_decay=False,
                 stochastic_rounding=True, seed=0, momentum_dtype=None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                      amsgrad=amsgrad, maximize=maximize,
                                      decoupled_weight_decay=decoupled_weight_decay))
        self._set_rounding(stochastic_rounding, seed, momentum_dtype)

    def _check_options(self, options):
        return F.check_adam_options(options)

    def _state_spec(self, shape, dtype, group):
        names = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")[:3 if group["amsgrad"] else 2]
        return {name: StateArray(shape, dtype, 0) for name in names}, {"step": 0}

    def _check_sparse(self, group):
        if group["amsgrad"]:
            raise ValueError("amsgrad: not supported with SparseRows gradients (as "
                             "torch.optim.SparseAdam); use amsgrad=False for sparse tables")

    def _update(self, param: Parameter, group: dict, rounding: dict) -> None:
        state = self._state(param, group)
        clock = self._clock(param, group, state)
        state["step"] += 1
        options = {name: group[name] for name in ("lr", "betas", "eps", "weight_decay",
                                                  "maximize", "decoupled_weight_decay")}
        moments = (state["exp_avg"], state["exp_avg_sq"])
        if isinstance(param.grad, SparseRows):
            F.sparse_adam_(param.data, param.grad, *moments, step=state["step"], clock=clock,
                           **options, **rounding)
        else:
            F.adam_(param.data, param.grad, *moments, state.get("max_exp_avg_sq"),
                    step=state["step"], amsgrad=group["amsgrad"], clock=clock, **options)


@_doc
class AdamW(Adam):
    """AdamW: :class:`Adam` with decoupled weight decay, ``torch.optim.AdamW``'s defaults.

    Each step first shrinks the parameter, ``p *= 1 - lr * weight_decay``,
    then takes Adam's step without weight decay in the gradient. With a
    :class:`~numbapos.sparse.SparseRows` gradient only the listed rows are
    shrunk and stepped (lazily, see :class:`Adam`).

    Parameters
    ----------
    params : iterable of Parameter, or of dicts
        As for :class:`Adam`.
    lr : float, default 1e-3
    betas : (float, float), default (0.9, 0.999)
    eps : float, default 1e-8
    weight_decay : float, default 1e-2
        Decoupled decay rate.
    amsgrad : bool, default False
    maximize : bool, default False
    {rounding}
    {momentum_dtype}
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                 amsgrad=False, *, maximize=False, stochastic_rounding=True, seed=0,
                 momentum_dtype=None):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, maximize=maximize, decoupled_weight_decay=True,
                         stochastic_rounding=stochastic_rounding, seed=seed,
                         momentum_dtype=momentum_dtype)

    def _check_options(self, options):
        checked = super()._check_options(options)
        if not checked["decoupled_weight_decay"]:
            raise ValueError("decoupled_weight_decay: AdamW always decouples weight decay "
                             "(use Adam for L2 weight decay)")
        return checked
