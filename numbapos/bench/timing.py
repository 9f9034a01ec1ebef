"""Interleaved medians: each side of a case warmed up, then timed round by round in turn.

On a shared machine one side timed after another sees different neighbours;
interleaving the sides round by round and taking medians keeps their ratio
honest. Calls far shorter than a millisecond are repeated within a round so
the timer's resolution does not matter. Before each timed block the timer
sleeps ``settle_s``: the OpenMP threads of the side timed just before
(PyTorch's spin about a millisecond after each op) go idle instead of taking
the cores from the side being timed, as they would not in a program running
one library alone.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from statistics import median
from typing import NamedTuple


class Plan(NamedTuple):
    """How long to time: ``rounds`` rounds (fewer once ``budget_s`` has passed, never < 3),
    after ``warmup_s`` of calls per side; a round of one side lasts >= ``min_round_s`` and
    starts after a pause of ``settle_s``."""

    rounds: int
    warmup_s: float
    min_round_s: float
    budget_s: float
    settle_s: float = 0.0


def _timed(fn: Callable[[], object], sync: Callable[[], None], number: int,
           settle_s: float = 0.0) -> float:
    """Seconds per call of ``number`` calls of ``fn``, the device synchronised at the end."""
    if settle_s:
        time.sleep(settle_s)
    start = time.perf_counter()
    for _ in range(number):
        fn()
    sync()
    return (time.perf_counter() - start) / number


def _warm(fn, sync, plan: Plan) -> int:
    """Call ``fn`` for ``plan.warmup_s`` (at least twice: JIT, caches); calls per round."""
    start = time.perf_counter()
    calls = 0
    while calls < 2 or time.perf_counter() - start < plan.warmup_s:
        single = _timed(fn, sync, 1)
        calls += 1
    return max(1, min(10_000, int(plan.min_round_s / max(single, 1e-9)) + 1))


def no_sync() -> None:
    """The synchronisation of host code: nothing to wait for."""


def interleaved_medians(sides: Mapping[str, Callable[[], object]], plan: Plan,
                        syncs: Mapping[str, Callable[[], None]] | None = None) -> dict:
    """Median seconds per call of every side, timed in turns (the order rotating per round).

    Parameters
    ----------
    sides : mapping of name to callable
        Zero-argument callables doing one call of the timed work.
    plan : Plan
    syncs : mapping of name to callable, optional
        Per side, what waits for its device (a GPU's queue); default none.

    Returns
    -------
    dict of name to float
        Median seconds per call, per side.
    """
    syncs = syncs or {}
    names = list(sides)
    sync = {name: syncs.get(name, no_sync) for name in names}
    number = {name: _warm(sides[name], sync[name], plan) for name in names}
    samples = {name: [] for name in names}
    start = time.perf_counter()
    for r in range(plan.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(_timed(sides[name], sync[name], number[name],
                                        plan.settle_s))
        if r >= 2 and time.perf_counter() - start > plan.budget_s:
            break
    return {name: median(values) for name, values in samples.items()}
