"""An optimiser's state for one parameter, split into per-row and global parts.

The state is read and written through the optimiser's ``state_dict()`` /
``load_state_dict()`` (PyTorch's layout, ``{"state": {index: {name: value}},
"param_groups": [...]}``). By the convention numbapos's optimisers keep, a
state array whose first dimension is the parameter's number of rows is
per-row state (momentum, moments, row flags, row accumulators): a shard
holds the part of its rows and resharding moves it with them. Everything
else (step counts, flags of the whole parameter) is global: every shard
holds the same value.
"""

from __future__ import annotations

import numpy as np


def export_state(optimizer) -> dict:
    """``{name: value}`` of the optimiser's only parameter (arrays are copies)."""
    return dict(optimizer.state_dict()["state"].get(0, {}))


def import_state(optimizer, state: dict) -> None:
    """Make ``state`` the state of the optimiser's only parameter (none: nothing to do)."""
    if state:
        saved = optimizer.state_dict()
        saved["state"] = {0: dict(state)}
        optimizer.load_state_dict(saved)


def split_state(state: dict, num_rows: int) -> tuple[dict, dict, dict]:
    """``(per_row_arrays, global_arrays, global_scalars)`` of one parameter's state."""
    rows, arrays, scalars = {}, {}, {}
    for name, value in state.items():
        if isinstance(value, np.ndarray):
            target = rows if value.ndim >= 1 and value.shape[0] == num_rows else arrays
            target[name] = value
        elif isinstance(value, (bool, int, float, np.generic)):
            scalars[name] = value.item() if isinstance(value, np.generic) else value
        else:
            raise TypeError(f"optimizer state {name!r}: cannot checkpoint a "
                            f"{type(value).__name__} (expected arrays and numbers)")
    return rows, arrays, scalars
