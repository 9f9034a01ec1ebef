"""The optimisers' step-dependent scalars, written once for the host and the GPU.

Adam's bias corrections and Adagrad's decayed rate depend on the step count
and the learning rate. The CPU computes them on the host for each step
(:mod:`numbapos.functional.optim`); a captured CUDA step (``numbapos.cuda.capture``)
must compute them on the device, from a step count and a learning rate that
live there, so that each replay advances them. Both call these functions, in
float64, so the GPU's values are the host's bit for bit: ``beta ** step`` is
a product of exact float64 squarings (:func:`powi`, the same on both targets,
not the C library's ``pow``), every product is :func:`~.scalar.mul_rn`
(never fused into an FMA) and the root is the correctly rounded one. The
results are cast to the parameter's dtype by the caller (round to nearest
on both devices).

They are ``register_jitable``: plain Python on the host and on the simulator,
compiled inside the CUDA tick kernels (:mod:`numbapos.kernels.cuda.clock`).
"""

from numba.extending import register_jitable

from .scalar import mul_rn, sqrt_rn

__all__ = []  # scalar helpers, not launchers


@register_jitable
def powi(x, n):
    """``x ** n`` for a float64 ``x`` and an integral ``n >= 0``, by repeated squaring."""
    result = 1.0
    base = x
    k = int(n)
    while k > 0:
        if k & 1:
            result = mul_rn(result, base)
        base = mul_rn(base, base)
        k >>= 1
    return result


@register_jitable
def adam_scalars(lr, beta1, beta2, weight_decay, step, sparse):
    """``(decay, neg_step_size, bias_correction2_sqrt)`` of Adam's step ``step`` (>= 1).

    ``neg_step_size`` is ``-lr / (1 - beta1**step)``, or with ``sparse``
    (``torch.optim.SparseAdam``) ``-lr * sqrt(1 - beta2**step) / (1 - beta1**step)``;
    ``decay`` is AdamW's ``1 - lr * weight_decay``.
    """
    bias_correction1 = 1.0 - powi(beta1, step)
    bias_correction2 = 1.0 - powi(beta2, step)
    root = sqrt_rn(bias_correction2)
    if sparse:
        step_size = mul_rn(lr, root) / bias_correction1
    else:
        step_size = lr / bias_correction1
    return 1.0 - mul_rn(lr, weight_decay), -step_size, root


@register_jitable
def adagrad_neg_clr(lr, lr_decay, step):
    """Adagrad's ``-lr / (1 + (step - 1) * lr_decay)`` at step ``step`` (>= 1)."""
    return -(lr / (1.0 + mul_rn(step - 1.0, lr_decay)))
