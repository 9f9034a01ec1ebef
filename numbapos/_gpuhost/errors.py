"""Deferred index errors on the GPU: found by kernels, raised by the host later, never fatal.

A kernel that reads indices cannot raise, and asking the host after every op
would cost a synchronisation. So every such kernel records the first bad
index it meets in a per-context **error word** and carries on without
reading out of bounds; every kernel that modifies a table, a gradient or
optimiser state returns at once while an error is pending. The host raises
the CPU's ``IndexError`` (or, for an attention mask, its ``ValueError``: the
tag also says which error, :func:`tag`) when it sees the word: at the next numbapos call
(:func:`raise_pending`, a plain read of mapped host memory, no
synchronisation) once the failing kernel has run, and always at a
synchronising call (:func:`synchronize`, ``to_host``, ``state_dict``). It then
clears the word: nothing was modified, and the context lives on (PyTorch's
device-side assert kills it instead).

The word is five int64 in device memory: the bad position, its value, the
valid size, a tag naming the argument (:func:`tag`), and a lock. The first
four are mirrored to mapped (pinned, device-visible) host memory, written
with a system fence, so the host sees a failure without waiting for the GPU.
Writers take the lock (an integer compare-and-swap: errors are rare), so the
four fields always describe one bad index: the first position of the first
kernel that failed. ``NUMBAPOS_CUDA_SYNC_CHECKS=1`` synchronises after every
launcher that records errors and raises there (for debugging, as
``CUDA_LAUNCH_BLOCKING=1`` does).

**Streams.** There is one word per context, whatever stream a kernel runs
on (:func:`numbapos.cuda.stream`): kernels on every stream record into it and
test it. So the host synchronises the whole device (``cuda.synchronize()``,
every stream of the context) before it trusts or clears the word: a failure
found on one stream is raised however many streams are busy, and the
"nothing modified" promise holds for the kernels queued on the failing
kernel's stream after it (work on other streams is ordered only as the user
ordered it). While a step is being captured nothing is read or cleared (no
kernel has run); a replayed graph records into the same word, raised as
after any op.
"""

from __future__ import annotations

import threading

import numpy as np
from numba import config as numba_config
from numba import cuda

from .. import config
from . import streams

_SIMULATED = bool(numba_config.ENABLE_CUDASIM)


NONE = np.iinfo(np.int64).max  # the position field while no error is pending
POSITION, VALUE, SIZE, TAG, LOCK = range(5)

KINDS = ("index", "binary", "position", "count")  # the errors a tag can stand for (see tag())
_TAGS: dict = {}  # (name, size_name, kind) -> tag
_NAMES: list = []  # tag -> (name, size_name, kind)
_state: dict = {}  # id(context) -> (context, device word, mapped host word)
_lock = threading.Lock()


def tag(name: str = "indices", size_name: str = "num_embeddings", kind: str = "index") -> int:
    """The small integer kernels record for argument ``name`` (the names of the CPU's error).

    ``kind`` says which error the host raises (:data:`KINDS`): ``"index"``, the
    CPU's IndexError for an index outside ``[0, size)`` of ``size_name``;
    ``"binary"``, the ValueError of a mask value other than 0 and 1;
    ``"position"``, the ValueError of a position at or past ``size_name``;
    ``"count"``, the ValueError of a count or length that differs from ``size_name``
    (a span without its grid, a span longer than its grid).
    """
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {list(KINDS)}, got {kind!r}")
    key = (name, size_name, kind)
    found = _TAGS.get(key)
    if found is None:
        with _lock:
            found = _TAGS.setdefault(key, len(_NAMES))
            if found == len(_NAMES):
                _NAMES.append(key)
    return found


class _Last(threading.local):
    state = None  # this thread's last context state (see _current_state)


_last = _Last()


def _current_state() -> tuple:
    """``(context, device word, host word, objects)`` of the current context, the word
    made on first use; ``objects`` is a dict of small per-context arrays (see
    :func:`context_objects`)."""
    if not _SIMULATED:
        # Asking Numba for the current context walks its device list under a lock
        # whenever it did not make the context current itself (PyTorch or cuda.core
        # did): tens of microseconds, several times per op. The driver's current
        # handle, and the context object still being its device's primary one
        # (cuda.close() releases it), say whether this thread's last answer holds.
        last = _last.state
        if last is not None:
            driver = streams.bindings()
            err, handle = driver.cuCtxGetCurrent()
            if (err == driver.CUresult.CUDA_SUCCESS and int(handle) == last[0]
                    and last[1][0].device.primary_context is last[1][0]):
                return last[1]
    # The simulator makes a new context object at every call: it has one word.
    context = None if _SIMULATED else cuda.current_context()
    state = _state.get(id(context))
    if state is None or state[0] is not context:
        streams.refuse_in_capture("making the deferred error word (its first use)")
        with _lock:
            state = _state.get(id(context))
            if state is None or state[0] is not context:
                host = cuda.mapped_array(5, np.int64)
                _host_view(host)[:] = (NONE, 0, 0, 0, 0)
                device = cuda.to_device(np.array([NONE, 0, 0, 0, 0], np.int64))
                host._numbapos_persistent = device._numbapos_persistent = True  # see .plans
                state = _state[id(context)] = (context, device, host, {})
    if not _SIMULATED:
        _last.state = (int(context.handle), state)
    return state


def words():
    """``(device word, mapped host word)`` of the current context, made on first use."""
    state = _current_state()
    return state[1], state[2]


def current_context():
    """Numba's current context object (found cheaply, see :func:`_current_state`); None
    on the simulator."""
    return _current_state()[0]


def context_objects() -> dict:
    """A dict kept with the current context, for small device arrays made once per
    context (they go when the context does)."""
    return _current_state()[3]


def state_made() -> bool:
    """Whether the current context's error word exists (plans keep it)."""
    return bool(_state)


def host_word_view() -> np.ndarray:
    """The current context's mapped host word as a NumPy array (a plain memory read)."""
    return _host_view(words()[1])


def device_word():
    """The device word alone, for kernels that only test whether an error is pending."""
    return words()[0]


def _host_view(host) -> np.ndarray:
    # A mapped array is an ndarray on a GPU; the simulator wraps one in a FakeCUDAArray.
    return host if isinstance(host, np.ndarray) else host._ary


def pending() -> tuple | None:
    """``(position, value, size, name, size_name, kind)`` of a failure the host can see, or
    None.

    A plain read of mapped host memory: no synchronisation. None while a step is
    being captured (its kernels have not run).
    """
    if not _state or streams.capturing() is not None:
        return None
    host = _host_view(words()[1])
    position = int(host[POSITION])
    if position == NONE:
        return None
    cuda.synchronize()  # the failing kernel and any after it have finished: the word is final
    position, value, size, which = (int(v) for v in host[:4])
    name, size_name, kind = (_NAMES[which] if 0 <= which < len(_NAMES)
                             else ("indices", "size", "index"))
    return position, value, size, name, size_name, kind


_LATER = ("(found on the GPU by a call queued earlier, raised at this one; no table, gradient "
          "or optimiser state was modified by the failing call or any queued after it)")


def raise_pending() -> None:
    """Raise the CPU's error (IndexError, or ValueError for a mask, a position or a count)
    for a failure the host can see, and clear the word."""
    found = pending()
    if found is None:
        return
    position, value, size, name, size_name, kind = found
    clear()
    if kind == "binary":
        raise ValueError(f"{name}: expected only 0 and 1, got {value} (at flat position "
                         f"{position}) {_LATER}")
    if kind == "position":
        raise ValueError(f"{name}: gives position {value} (at flat position {position}), but "
                         f"{size_name}={size}: positions must stay below {size} {_LATER}")
    if kind == "count":
        raise ValueError(f"{name}: item {value} (at flat position {position}) does not match "
                         f"{size_name}={size} {_LATER}")
    raise IndexError(
        f"{name}: index {value} (at flat position {position}) is out of range for "
        f"{size_name}={size}; valid indices are 0 <= index < {size} {_LATER}")


def clear() -> None:
    """Reset the word of the current context (after a synchronisation)."""
    device, host = words()
    device.copy_to_device(np.array([NONE, 0, 0, 0, 0], np.int64), stream=streams.current())
    _host_view(host)[:] = (NONE, 0, 0, 0, 0)
    cuda.synchronize()  # reset before any stream's next kernel reads it (errors are rare)


def synchronize() -> None:
    """Wait for every queued kernel (on every stream), then raise any pending index error."""
    streams.refuse_in_capture("a synchronisation")
    if not _state:
        return
    cuda.synchronize()
    raise_pending()


def after_launch() -> None:
    """With ``NUMBAPOS_CUDA_SYNC_CHECKS=1``, synchronise and raise now."""
    if config.get("cuda_sync_checks") and streams.capturing() is None:
        synchronize()
