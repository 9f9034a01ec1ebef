"""Deferred index errors on the GPU, the kernels' side: record a bad index, test the word.

The error word, its tags and the host's side (raising at the next call, clearing,
synchronising) are :mod:`numbapos._gpuhost.errors`; the names a launcher needs from
it are re-exported here, so a kernel module reads one ``errors`` namespace.
"""

from __future__ import annotations

from numba import cuda, int64

from ..._gpuhost.errors import (  # noqa: F401 (the launchers' side of the word)
    LOCK,
    NONE,
    POSITION,
    SIZE,
    TAG,
    VALUE,
    after_launch,
    current_context,
    device_word,
    host_word_view,
    raise_pending,
    tag,
    words,
)

__all__ = []  # not launchers: imported by the launchers that record errors


@cuda.jit(device=True)
def is_pending(word):
    """Whether an error is pending: every state-modifying kernel returns when it is."""
    return word[POSITION] != NONE


@cuda.jit(device=True)
def record(word, host, position, value, size, which):
    """Record a bad index unless an earlier kernel's error or an earlier position of this
    kernel is already there (under the word's lock; errors are rare)."""
    if word[POSITION] <= position:
        return
    while cuda.atomic.cas(word, LOCK, 0, 1) != 0:
        pass
    cuda.threadfence()
    if position < word[POSITION] and (word[POSITION] == NONE or word[TAG] == which):
        word[POSITION] = position
        word[VALUE] = value
        word[SIZE] = size
        word[TAG] = which
        host[POSITION] = position
        host[VALUE] = value
        host[SIZE] = size
        host[TAG] = which
        cuda.threadfence_system()
    cuda.threadfence()
    cuda.atomic.exch(word, LOCK, 0)


@cuda.jit(device=True)
def checked(word, host, index, position, size, which):
    """``index`` as a row of a table of ``size`` rows, or -1 after recording it as bad."""
    value = int64(index)
    if value < 0 or value >= size:
        record(word, host, int64(position), value, int64(size), which)
        return int64(-1)
    return value
