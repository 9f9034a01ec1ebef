"""Binary searches over ascending integer arrays, written once for both devices
(``register_jitable``: compiled into each CPU or CUDA kernel that calls them)."""

from numba.extending import register_jitable

__all__ = []  # device helpers, not launchers


@register_jitable
def last_at_most(first_row, row):
    """The last ``t`` in ``[0, first_row.size - 2]`` with ``first_row[t] <= row``: the table
    whose global rows hold ``row`` (``first_row``: each table's first global row, then the
    end)."""
    low, high = 0, first_row.size - 2
    while low < high:
        mid = (low + high + 1) // 2
        if first_row[mid] <= row:
            low = mid
        else:
            high = mid - 1
    return low


@register_jitable
def first_at_least(values, used, value):
    """The first ``k`` in ``[0, used)`` with ``values[k] >= value`` (``used`` when none)."""
    low, high = 0, used
    while low < high:
        mid = (low + high) // 2
        if values[mid] < value:
            low = mid + 1
        else:
            high = mid
    return low
