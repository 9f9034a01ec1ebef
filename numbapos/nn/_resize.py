"""Growing (or shrinking) a position table in place, with its optimiser state kept consistent.

Shared by ``LearnedPosEmbedding.extend_``, ``PositionalEmbedding.extend_`` and
the blocks' ``resize_position_embeddings``. The :class:`Parameter` object stays
(optimisers and tied modules keep referring to it); its ``data`` is replaced by
the resized table, its gradient dropped and its version bumped.
"""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from .. import functional as F
from ..functional.resize import RESIZE_MODES
from . import init as initializers


def kept_rows(old_len: int, new_len: int, mode: str, num_prefix_rows: int) -> int:
    """How many leading rows keep their values: all shared rows, but for ``"linear"`` only the
    prefix (every resampled row changes, unless the length does not)."""
    if mode == "linear" and new_len != old_len:
        return num_prefix_rows
    return min(old_len, new_len)


def check_no_pending(module, call: str) -> None:
    if any(module.pending_backwards(channel) for channel in ("forward", "attend")):
        raise RuntimeError(f"{type(module).__name__}.{call}: forwards are recorded that no "
                           "backward has consumed; their backward would use the old table. "
                           f"Run the backwards first (or the forwards under numbapos.no_grad())")


def resized(param, new_len, mode, num_prefix_rows, init, rng):
    """The resized table of ``param`` (validated; nothing changed yet) and its kept rows.

    A bfloat16 / float16 table is resized in float32 (widened exactly) and rounded
    back to nearest even: copied rows keep their bits, new ones are rounded.
    """
    if not isinstance(mode, str) or mode not in RESIZE_MODES:
        raise ValueError(f"mode: expected one of {list(RESIZE_MODES)}, got "
                         f"{_checks.quote(mode)}")
    data = param.data
    half = _checks.is_half_dtype(data.dtype)
    source = F.widen_table(data) if half else data
    old_len, dim = (int(n) for n in data.shape)
    new_len = _checks.check_int(new_len, "new_len", minimum=1)
    fill = None
    if mode == "init" and new_len > old_len:
        rows = initializers.make_array(init, (new_len - old_len, dim), source.dtype, rng)
        fill = _device.to_device(rows, _device.device_of(data))
    table = F.resize_pos_table(source, new_len, mode=mode, num_prefix_rows=num_prefix_rows,
                               fill=fill)
    if half:
        wide, table = table, _device.empty(tuple(table.shape), data.dtype,
                                           _device.device_of(data))
        F.store_rounded_(table, wide, stochastic_rounding=False)
    return table, kept_rows(old_len, new_len, mode, num_prefix_rows)


def _group_of(optimizer, param):
    for group in optimizer.param_groups:
        if any(p is param for p in group["params"]):
            return group
    raise ValueError("optimizer: does not optimise this table's parameter")


def resize_state(optimizer, param, new_len: int, kept: int):
    """A function that resizes ``optimizer``'s state of ``param`` (checked now, run later).

    Per-row state arrays (leading dimension = the table's rows: momentum,
    Adam's moments, Adagrad's sums, RowWiseAdagrad's accumulator) keep the
    rows of the ``kept`` unchanged rows and start the others at the value a
    fresh parameter's state starts at, as if those rows had never been
    updated; scalars (step counts) are kept.
    """
    if optimizer is None:
        return lambda: None
    group = _group_of(optimizer, param)
    state = optimizer.state.get(id(param))

    def run():
        if not state:
            return
        data = param.data
        old_rows = int(data.shape[0])
        shape = (new_len,) + tuple(data.shape[1:])
        arrays, _ = optimizer._state_spec(shape, data.dtype, group)
        for name, value in list(state.items()):
            if not _checks.is_array(value) or value.ndim == 0 or value.shape[0] != old_rows:
                continue
            spec = arrays.get(name)
            host = _device.to_host(value)
            grown = np.full((new_len,) + tuple(host.shape[1:]),
                            0 if spec is None else spec.fill, host.dtype)
            grown[:kept] = host[:kept]
            state[name] = _device.to_device(grown, _device.device_of(value))

    return run


def resize_param_(module, param, new_len, mode, num_prefix_rows, init, seed, optimizer, call):
    """Replace ``param.data`` by the resized table; resize ``optimizer``'s state; return new_len.

    Everything is checked before anything changes.
    """
    check_no_pending(module, call)
    table, kept = resized(param, new_len, mode, num_prefix_rows, init, _checks.as_rng(seed))
    update_state = resize_state(optimizer, param, table.shape[0], kept)
    update_state()
    param.data = table
    param.grad = None
    param.bump_version()
    return int(table.shape[0])
