"""Slow, obvious NumPy versions of every numbapos op: the oracles the tests trust.

Nothing here is clever; each function is a direct transcription of the
definition (``np.add.at`` for scatter, float64 loops where order matters).
"""

from __future__ import annotations

import numpy as np

# ----------------------------------------------------------------- embedding


def row_norm(row: np.ndarray, norm_type: float) -> float:
    row = row.astype(np.float64)
    if np.isinf(norm_type):
        return float(np.max(np.abs(row)))
    return float(np.sum(np.abs(row) ** norm_type) ** (1.0 / norm_type))


def embedding_renorm_(weight, indices, max_norm, norm_type=2.0):
    for row in np.unique(np.asarray(indices).reshape(-1)):
        norm = row_norm(weight[row], norm_type)
        if norm > max_norm:
            weight[row] *= weight.dtype.type(max_norm / (norm + 1e-7))
    return weight


def embedding(indices, weight, max_norm=None, norm_type=2.0):
    indices = np.asarray(indices)
    if max_norm is not None:
        embedding_renorm_(weight, indices, max_norm, norm_type)
    return weight[indices]


def embedding_backward(grad_output, indices, num_embeddings, padding_idx=None,
                       scale_grad_by_freq=False):
    indices = np.asarray(indices).reshape(-1)
    dim = grad_output.shape[-1]
    grad = grad_output.reshape(-1, dim).astype(np.float64)
    if scale_grad_by_freq:
        counts = np.bincount(indices, minlength=num_embeddings)
        grad = grad / counts[indices][:, None]
    out = np.zeros((num_embeddings, dim), dtype=np.float64)
    np.add.at(out, indices, grad)
    if padding_idx is not None:
        out[padding_idx] = 0
    return out.astype(grad_output.dtype)


def padding_mask(indices, padding_idx):
    return np.asarray(indices) != padding_idx


# ----------------------------------------------------------------- optim


def sgd_step(param, grad, buf, lr, momentum=0.0, dampening=0.0, weight_decay=0.0,
             nesterov=False, maximize=False):
    """One dense SGD step in float64; returns (param, buf) (buf None on the first step)."""
    g = -grad if maximize else grad
    if weight_decay:
        g = g + weight_decay * param
    if momentum:
        buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf
    return param - lr * g, buf


# ----------------------------------------------------------------- checking


def finite_difference(f, x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central-difference gradient of scalar ``f`` at float64 ``x`` (x restored after)."""
    grad = np.zeros_like(x, dtype=np.float64)
    flat_x = x.reshape(-1)
    flat_g = grad.reshape(-1)
    for i in range(flat_x.size):
        old = flat_x[i]
        flat_x[i] = old + eps
        up = f()
        flat_x[i] = old - eps
        down = f()
        flat_x[i] = old
        flat_g[i] = (up - down) / (2 * eps)
    return grad
