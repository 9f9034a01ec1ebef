"""The bench's output: a fixed-width comparison table, and the scaling curves as a PNG."""

from __future__ import annotations

from typing import NamedTuple

NAMES = {"numbapos": "numbapos", "numpy": "NumPy", "torch": "PyTorch", "cupy": "CuPy"}
NAME_WIDTH = 46


class Row(NamedTuple):
    """One timed case: median seconds per side (absent: the side could not run)."""

    name: str
    seconds: dict
    moved: int | None = None
    note: str = ""


def _ms(seconds) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3g}"


def _ratio(peer, ours) -> str:
    return "-" if peer is None or not ours else f"{peer / ours:.2f}x"


def header(peers) -> str:
    """The column titles for the peer sides ``peers`` (e.g. ``["numpy", "torch"]``)."""
    titles = [f"{'case':<{NAME_WIDTH}}", f"{'numbapos ms':>11}", f"{'GB/s':>7}"]
    titles += [f"{NAMES[p] + ' ms':>11}" for p in peers]
    titles += [f"{'vs ' + NAMES[p]:>10}" for p in peers]
    return " ".join(titles)


def format_row(row: Row, peers) -> str:
    """One line of the table; a note, when there is one, on the next line."""
    ours = row.seconds.get("numbapos")
    gbs = "-" if row.moved is None or not ours else f"{row.moved / ours / 1e9:.1f}"
    cells = [f"{row.name:<{NAME_WIDTH}}", f"{_ms(ours):>11}", f"{gbs:>7}"]
    cells += [f"{_ms(row.seconds.get(p)):>11}" for p in peers]
    cells += [f"{_ratio(row.seconds.get(p), ours):>10}" for p in peers]
    line = " ".join(cells)
    return line + (f"\n    ({row.note})" if row.note else "")


def legend(peers) -> str:
    """What the ratio columns mean."""
    names = ", ".join(NAMES[p] for p in peers)
    return (f"vs {names}: the peer's median time / numbapos's (above 1: numbapos is faster).\n"
            "GB/s: the bytes a call must at least read and write (rows gathered, output, "
            "gradient) / numbapos's median.\n"
            "Medians of interleaved rounds after a warm-up; JIT compilation excluded.")


HOST_COLUMNS = (("host us", 9), ("launches", 9), ("allocations", 12), ("Python calls", 13))


def host_header() -> str:
    """The column titles of the host-cost table (:mod:`.hostcost`)."""
    return " ".join([f"{'op':<{NAME_WIDTH}}"] + [f"{t:>{w}}" for t, w in HOST_COLUMNS])


def _count(value) -> str:
    return "-" if value is None else f"{value:g}"


def format_host(cost) -> str:
    """One line of the host-cost table for a :class:`.hostcost.Cost`."""
    cells = [f"{cost.host_us:.1f}", _count(cost.launches), _count(cost.allocations),
             str(cost.python_calls)]
    return " ".join([f"{cost.name:<{NAME_WIDTH}}"]
                    + [f"{c:>{w}}" for c, (_, w) in zip(cells, HOST_COLUMNS, strict=True)])


def host_legend(calls: int) -> str:
    """What the host-cost columns mean."""
    return (f"Per call, after a warm-up. host us: the minimum over {calls} calls (the host's "
            "time, nothing synchronised);\nlaunches: kernels launched; allocations: device "
            "arrays asked of the memory manager (numbapos's pool\nserves them from its cache); "
            "Python calls: Python functions one call runs.")


def plot(points, path: str, title: str) -> None:
    """Draw the scaling curves: median ms against D and against the batch, per op and side.

    Parameters
    ----------
    points : list of (op, axis, value, Row)
        ``axis`` is ``"D"`` or ``"batch"``.
    path : str
        Where to write the PNG.
    title : str
        The figure's title (machine, threads).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_names = ("D", "batch")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, axis in zip(axes, axes_names, strict=True):
        curves = {}
        for op, where, value, row in points:
            if where != axis:
                continue
            for side, seconds in row.seconds.items():
                curves.setdefault((op, side), []).append((value, seconds * 1e3))
        for (op, side), xy in sorted(curves.items()):
            xs, ys = zip(*sorted(xy), strict=True)
            ax.plot(xs, ys, marker="o", linestyle="-" if side == "numbapos" else "--",
                    label=f"{op}: {NAMES[side]}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("embedding dimension D" if axis == "D" else "batch (sequences)")
        ax.set_ylabel("median ms per call")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
