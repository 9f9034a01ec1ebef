"""Initialisers for parameter arrays.

An initialiser is any callable ``init(shape, rng) -> array_like`` where ``rng``
is a ``numpy.random.Generator``; :func:`make_array` calls it, checks the shape
and casts to the parameter's dtype. The factories here return such callables.

:func:`keyed_normal_` fills an existing table in place with normal values
keyed by (seed, row, column), so any set of rows can be made on its own (the
shards of :class:`numbapos.distributed.ShardedEmbedding` do); :func:`keyed_normal`
is the same as an initialiser for ``Embedding(init=...)``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .. import _checks
from .._alignment import table_copy
from ..functional.init import keyed_normal_

Initializer = Callable[[tuple, np.random.Generator], np.ndarray]


def normal(mean: float = 0.0, std: float = 1.0) -> Initializer:
    """Draws from N(mean, std^2) (PyTorch's ``nn.init.normal_``)."""

    def init(shape, rng):
        return rng.normal(mean, std, size=shape)

    return init


def uniform(low: float = -0.1, high: float = 0.1) -> Initializer:
    """Draws from U(low, high) (PyTorch's ``nn.init.uniform_``)."""

    def init(shape, rng):
        return rng.uniform(low, high, size=shape)

    return init


def xavier_uniform(gain: float = 1.0) -> Initializer:
    """Glorot uniform: U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)) of a 2-D shape."""

    def init(shape, rng):
        fan_out, fan_in = shape[0], shape[1] if len(shape) > 1 else 1
        bound = gain * np.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-bound, bound, size=shape)

    return init


def zeros() -> Initializer:
    """All zeros."""

    def init(shape, rng):
        return np.zeros(shape)

    return init


def ones() -> Initializer:
    """All ones."""

    def init(shape, rng):
        return np.ones(shape)

    return init


def sinusoidal(base: float = 10000.0) -> Initializer:
    """The sinusoidal position table of a 2-D ``(max_len, D)`` shape (a warm start).

    See :func:`numbapos.functional.sinusoidal_pos_embedding`; computed in float64.
    """

    def init(shape, rng):
        from ..functional.positional import sinusoidal_pos_embedding

        if len(shape) != 2:
            raise ValueError(f"sinusoidal: expected a 2-D shape (max_len, D), got {shape}")
        return sinusoidal_pos_embedding(shape[0], shape[1], dtype=np.float64, base=base)

    return init


def keyed_normal(seed: int = 0, mean: float = 0.0, std: float = 1.0) -> Initializer:
    """N(mean, std^2) keyed by (seed, row, column): :func:`keyed_normal_` as an initialiser.

    The ``rng`` argument is ignored; ``Embedding(V, D, init=keyed_normal(seed))``
    equals ``keyed_normal_(Embedding(V, D).weight.data, seed)`` (before any
    padding row is zeroed).
    """

    def init(shape, rng):
        if len(shape) != 2:
            raise ValueError(f"keyed_normal: expected a 2-D shape (V, D), got {shape}")
        return keyed_normal_(np.empty(shape, np.float64), seed, mean=mean, std=std)

    return init


def make_array(init: Initializer, shape: tuple, dtype, rng: np.random.Generator,
               name: str = "init") -> np.ndarray:
    """Run ``init(shape, rng)`` and return a fresh C-contiguous array of ``dtype`` (from
    1 MB on, on a cache line; from 32 MB on, in huge pages: :mod:`numbapos._alignment`)."""
    if not callable(init):
        raise TypeError(f"{name}: expected a callable init(shape, rng), got "
                        f"{_checks.quote(init)}")
    values = np.asarray(init(tuple(shape), rng))
    if values.shape != tuple(shape):
        raise ValueError(f"{name}: returned shape {values.shape}, expected {tuple(shape)}")
    return table_copy(values, dtype)
