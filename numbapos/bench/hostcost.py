"""Host cost of numbapos's CUDA ops: microseconds, launches, allocations, Python calls.

An eager GPU op costs the host time to validate, allocate and launch; when
that exceeds the kernels' own time the GPU waits on Python. :func:`measure`
takes one op's zero-argument callable after a warm-up and reports, per call:

- ``host_us``: the minimum over many calls of ``perf_counter`` around the
  call. Nothing synchronises, so on a GPU this is the host's share only.
- ``launches``: kernels numbapos launched (``numbapos._device.cuda_launches``).
- ``allocations``: calls of the CUDA context's memory manager's ``memalloc``
  (numbapos's caching pool serves most from its cache, but each one still
  costs host time); None on Numba's simulator, which has no manager.
- ``python_calls``: Python function calls (``sys.setprofile`` ``"call"``
  events) of one call, counted outside the timed calls.

:func:`cases` are the issue's op cases at BERT-base sizes (vocabulary 30522,
hidden 768, 32 x 128 tokens). ``python -m numbapos bench --device cuda``
prints them on a GPU; ``tests/hostcost`` runs them on a machine without one,
against a stub CUDA driver whose launches return at once, and gates the
counts. Host times on the simulator say nothing (its kernels run as Python on
the host), so the bench does not measure there.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from .. import _device, nn, optim
from .. import functional as F
from .data import FULL, Shape, Sizes, inputs

CALLS = 200  # timed calls per op (minimum taken)
WARMUP = 5  # calls before timing: compilation, the allocator's cache, lazy optimiser state
COUNTED = 5  # calls whose launches and allocations are counted


class Cost(NamedTuple):
    """The host cost of one op, per call (see the module's docstring)."""

    name: str
    host_us: float
    launches: float
    allocations: float | None
    python_calls: int
    driver: dict | None = None  # per-call deltas of the ``driver`` counters given to measure


class Case(NamedTuple):
    """``make(shape)`` builds the inputs on the device once and returns the op's callable.

    The callable may carry a ``between`` attribute: a zero-argument function
    run after each call, outside what is timed and counted.
    """

    name: str
    make: Callable[[Shape], Callable[[], object]]


def _launches() -> int:
    return _device.cuda_launches()


class _Allocations:
    """Counts ``memalloc`` calls of the current context's memory manager while entered."""

    def __init__(self):
        self.count = 0
        self.manager = None

    def __enter__(self):
        if _device.simulator_enabled():
            return self
        from numba import cuda

        manager = cuda.current_context().memory_manager
        original = manager.memalloc
        self.own = vars(manager).get("memalloc")  # someone's wrapper, put back on exit

        def memalloc(size):
            self.count += 1
            return original(size)

        manager.memalloc = memalloc  # shadows the method on this instance only
        self.manager = manager
        return self

    def __exit__(self, *exc):
        if self.manager is not None:
            if self.own is None:
                del self.manager.memalloc
            else:
                self.manager.memalloc = self.own
            self.manager = None


def _python_calls(fn) -> int:
    calls = [0]

    def profile(frame, event, arg):
        if event == "call":
            calls[0] += 1

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(previous)
    return calls[0] - 1  # less fn itself


def measure(name: str, fn: Callable[[], object], calls: int = CALLS, warmup: int = WARMUP,
            counted: int = COUNTED, driver: Callable[[], dict] | None = None) -> Cost:
    """The host cost per call of ``fn`` (an op on CUDA arrays), after ``warmup`` calls.

    Parameters
    ----------
    name : str
        The op's name in the result.
    fn : callable
        Zero-argument callable making one call of the op; its ``between``
        attribute, if any, runs after each call, outside what is measured.
    calls : int, default 200
        Timed calls; ``host_us`` is their minimum.
    warmup : int, default 5
        Calls before anything is measured.
    counted : int, default 5
        Calls whose launches, allocations and ``driver`` counters are summed.
    driver : callable, optional
        Returns a dict of cumulative counters (a stub driver's); their
        per-call differences over the counted calls go into ``Cost.driver``.

    Returns
    -------
    Cost
    """
    between = getattr(fn, "between", None) or (lambda: None)
    _device.kernels_for("cuda")  # the backend (and its allocator) before anything runs
    for _ in range(warmup):
        fn()
        between()
    best = float("inf")
    clock = time.perf_counter
    for _ in range(calls):
        start = clock()
        fn()
        best = min(best, clock() - start)
        between()
    launches = 0
    totals: dict = {}
    with _Allocations() as allocations:
        for _ in range(counted):
            before = driver() if driver is not None else {}
            first = _launches()
            fn()
            launches += _launches() - first
            if driver is not None:
                after = driver()
                for key, value in after.items():
                    totals[key] = totals.get(key, 0) + value - before[key]
            with _Paused(allocations):
                between()
    python_calls = _python_calls(fn)
    between()
    simulated = _device.simulator_enabled()
    return Cost(name, best * 1e6, launches / counted,
                None if simulated else allocations.count / counted, python_calls,
                {key: value / counted for key, value in totals.items()} if driver else None)


class _Paused:
    """Leaves out the allocations made inside the block (a case's ``between``)."""

    def __init__(self, allocations: _Allocations):
        self.allocations = allocations

    def __enter__(self):
        self.count = self.allocations.count

    def __exit__(self, *exc):
        self.allocations.count = self.count


# ------------------------------------------------------------------ the cases


def _on(*arrays):
    return [_device.to_device(a, "cuda") for a in arrays]


def _lookup_out(shape):
    x = inputs(shape)
    weight, ids = _on(x.weight, x.ids)
    out = _device.empty(x.ids.shape + (shape.dim,), np.float32, "cuda")
    return lambda: F.embedding(ids, weight, out=out)


def _lookup(shape):
    x = inputs(shape)
    weight, ids = _on(x.weight, x.ids)
    return lambda: F.embedding(ids, weight)


def _backward(sparse):
    def make(shape):
        x = inputs(shape)
        grad, ids = _on(x.grad, x.ids)
        return lambda: F.embedding_backward(grad, ids, shape.vocab, sparse=sparse)
    return make


def _backward_of_many_ids(shape):
    """A sparse backward of 8 batches of ids at once: the grouping's onesweep radix sort
    (above the 4,096 ids that one block sorts)."""
    x = inputs(shape._replace(batch=8 * shape.batch))
    grad, ids = _on(x.grad, x.ids)
    return lambda: F.embedding_backward(grad, ids, shape.vocab, sparse=True)


def _bert(backward):
    def make(shape):
        x = inputs(shape)
        block = nn.BertEmbeddings(shape.vocab, shape.dim, max(512, shape.seq),
                                  hidden_dropout_prob=0.1, seed=0, device="cuda").train()
        ids, grad = _on(x.ids, x.grad)
        if backward:
            def step():
                block.zero_grad()
                block(ids)
                block.backward(grad)
            return step

        def forward():
            return block(ids)

        def consume():  # the record a backward would have taken (forwards keep 64 at most)
            block._saved_context()
            block._release()

        forward.between = consume
        return forward
    return make


def _fused_sgd(shape):
    x = inputs(shape)
    emb = nn.Embedding(shape.vocab, shape.dim, sparse=True, _weight=x.weight.copy(),
                       device="cuda")
    opt = optim.SGD(emb.parameters(), lr=1e-3, momentum=0.9)
    opt.fuse_with_backward()  # the row sums applied inside the update
    ids, grad = _on(x.ids, x.grad)

    def step():
        emb.zero_grad()
        emb(ids)
        emb.backward(grad)
        opt.step()
    return step


def cases() -> list[Case]:
    """The host-cost cases: the lookups, both backwards, the BERT block, a training step."""
    return [
        Case("lookup into out=", _lookup_out),
        Case("lookup, allocating its output", _lookup),
        Case("sparse backward", _backward(True)),
        Case("dense backward", _backward(False)),
        Case("sparse backward, 8 batches of ids", _backward_of_many_ids),
        Case("BERT module forward (training, dropout 0.1)", _bert(False)),
        Case("BERT module forward + backward", _bert(True)),
        Case("fused sparse SGD step (momentum 0.9)", _fused_sgd),
    ]


def run(sizes: Sizes = FULL, calls: int = CALLS, only: str | None = None,
        driver: Callable[[], dict] | None = None, errors: list | None = None) -> list[Cost]:
    """Measure every case (those whose names contain ``only``) at ``sizes``.

    A case that raises while being built or measured is left out and
    ``(name, message)`` appended to ``errors`` (raised when ``errors`` is None).
    """
    shape = Shape(sizes.vocab, sizes.dim, sizes.batch, sizes.seq)
    _device.kernels_for("cuda")  # the caching allocator before the first device array
    found = []
    for case in cases():
        if only is not None and only not in case.name:
            continue
        try:
            found.append(measure(case.name, case.make(shape), calls, driver=driver))
        except Exception as exc:
            if errors is None:
                raise
            errors.append((case.name, f"{type(exc).__name__}: {exc}"))
    return found
