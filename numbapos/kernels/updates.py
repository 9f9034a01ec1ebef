"""The optimisers' element updates, written once and compiled for both devices.

Each function updates one element (or, for row-wise Adagrad, computes one
row's factors) operation for operation as the reference optimiser does, in
the parameter's dtype: the CPU kernels (``kernels/cpu/optim.py``) and their
CUDA twins (``kernels/cuda/optim.py``) call the same code, so they cannot
drift apart, and the CPU-as-oracle tests keep guarding the bits.

``h`` is the hyper-parameter named tuple of :mod:`numbapos._args`, floats
already cast to the parameter's dtype. Options that are the same for every
element arrive as flags and are applied with :func:`~.scalar.choose` (a
select, so CPU loops still vectorise). Every product that feeds a sum goes
through :func:`~.scalar.mul_rn`, which the GPU compiles to an unfused
``mul.rn`` (NVVM would otherwise contract it into an FMA, which the CPU never
does). The functions are ``register_jitable``: callable from ``@njit`` and
``@cuda.jit`` code, and from Python on the CUDA simulator.
"""

from numba.extending import register_jitable

from .._args import WeightDecayMode
from .scalar import choose, mul_rn, sqrt_rn

__all__ = []  # device helpers, not launchers

# The modes as plain ints: kernels compare ``h.mode`` (an int field) with them.
_L2 = int(WeightDecayMode.L2)
_DECOUPLED = int(WeightDecayMode.DECOUPLED)


# ---------------------------------------------------------------- SGD


@register_jitable
def sgd_gradient(p, g, h, maximize, decay):
    """The gradient SGD applies: negated with ``maximize``, plus L2 decay with ``decay``."""
    g = choose(maximize, -g, g)
    return choose(decay, g + mul_rn(h.weight_decay, p), g)


@register_jitable
def sgd_plain_update(p, g, h, maximize, decay):
    """One element without momentum: the new ``p``."""
    return p - mul_rn(h.lr, sgd_gradient(p, g, h, maximize, decay))


@register_jitable
def sgd_momentum_update(p, g, buf, h, first, nesterov, maximize, decay):
    """One element with momentum (``first``: the buffer starts as the gradient):
    ``(new_p, new_buf)``."""
    g = sgd_gradient(p, g, h, maximize, decay)
    buf = choose(first, g, mul_rn(buf, h.momentum) + mul_rn(h.one_minus_dampening, g))
    g = choose(nesterov, g + mul_rn(h.momentum, buf), buf)
    return p - mul_rn(h.lr, g), buf


# ---------------------------------------------------------------- Adam / AdamW


@register_jitable
def adam_decay_flags(h):
    """``(l2, decoupled)``: which weight decay applies, if any."""
    decay = h.weight_decay != 0
    return decay and not h.decoupled, decay and h.decoupled


@register_jitable
def adam_prologue(p, g, h, maximize, l2, decoupled):
    """``maximize`` and weight decay (L2 into the gradient, or AdamW's decay of p): ``(p, g)``."""
    g = choose(maximize, -g, g)
    p = choose(decoupled, mul_rn(p, h.decay), p)
    return p, choose(l2, g + mul_rn(h.weight_decay, p), g)


@register_jitable
def adam_moments(g, m, v, h, low_weight, beta1):
    """Dense Adam's new moments ``(m, v)``. ``low_weight`` says ``1 - beta1 < 0.5``:
    which of ``torch.lerp``'s two forms applies."""
    w = h.one_minus_beta1
    m = choose(low_weight, m + mul_rn(w, g - m), g - mul_rn(g - m, beta1))
    return m, mul_rn(v, h.beta2) + mul_rn(mul_rn(h.one_minus_beta2, g), g)


@register_jitable
def adam_dense_param(p, m, v, h):
    """Dense Adam's new parameter from the (amsgrad-maxed) moments."""
    return p + mul_rn(h.neg_step_size, m / (sqrt_rn(v) / h.bias_correction2_sqrt + h.eps))


@register_jitable
def sparse_adam_update(p, g, m, v, h, l2, decoupled):
    """One element of ``torch.optim.SparseAdam``'s update: ``(p, m, v)``."""
    p, g = adam_prologue(p, g, h, h.maximize, l2, decoupled)
    m = m + mul_rn(g - m, h.one_minus_beta1)
    v = v + mul_rn(mul_rn(g, g) - v, h.one_minus_beta2)
    return p + mul_rn(h.neg_step_size, m / (sqrt_rn(v) + h.eps)), m, v


# ---------------------------------------------------------------- Adagrad


@register_jitable
def adagrad_update(p, g, s, h, decay):
    """One element of ``torch.optim.Adagrad``: ``(new_p, new_sum)``."""
    g = choose(h.maximize, -g, g)
    g = choose(decay, g + mul_rn(h.weight_decay, p), g)
    s = s + mul_rn(g, g)
    return p + mul_rn(h.neg_clr, g / (sqrt_rn(s) + h.eps)), s


# ---------------------------------------------------------------- row-wise Adagrad


@register_jitable
def rowwise_term(g, p, h, l2):
    """Element ``(g, p)``'s square in its row's mean square (L2 decay folded into g)."""
    g = choose(l2, g + mul_rn(h.weight_decay, p), g)
    return mul_rn(g, g)


@register_jitable
def rowwise_factors(state, square_sum, dim, one, h):
    """A row's new accumulator and its update's factors, from its square sum
    (FBGEMM's ``split_weight_update_cpu``): ``(state, correction, multiplier)``;
    the row's elements become ``correction * p - multiplier * g``. ``dim``
    (the row's width) and ``one`` are in the parameter's dtype."""
    acc = state + square_sum / dim
    multiplier = h.lr / (sqrt_rn(acc) + h.eps)
    decoupled = choose(h.mode == _DECOUPLED, one - mul_rn(h.lr, h.weight_decay), one)
    correction = choose(h.mode == _L2, one - mul_rn(multiplier, h.weight_decay), decoupled)
    return acc, correction, multiplier


@register_jitable
def rowwise_apply(p, g, correction, multiplier):
    """One element of a row-wise Adagrad row update."""
    return mul_rn(correction, p) - mul_rn(multiplier, g)
