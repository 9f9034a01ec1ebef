"""Block-wide reductions through shared memory: the one tree every CUDA kernel uses.

:func:`tree_reduce` combines ``sh[r, :nthreads]`` into ``sh[r, 0]`` for the
first ``rows`` rows of a 2-D shared array, halving the active threads each
round (thread ``t`` adds ``t + step`` for ``step = nthreads / 2, ..., 1``).
``nthreads`` is the block size, a power of two. The order of the additions
is fixed by ``nthreads`` alone, so a kernel's bits do not change from run to
run; they are the bits the LayerNorm, BERT block and max-norm kernels had
with their own trees. :func:`block_sum`, :func:`block_sum2` and
:func:`block_max` wrap it: every thread of the block must call them (they
hold barriers), each gets the result, and ``sh`` is free again when they
return.
"""

from numba import cuda

from .arrays import THREADS

__all__ = ["tree_threads"]  # and the device helpers below


def tree_threads(items: int) -> int:
    """Threads of a block that reduces ``items`` values per row: the power of two from 32
    (a warp) to ``THREADS`` that covers them. A narrow row (LayerNorm at D = 64, a 16-wide
    test table) then runs one warp, not 128 threads of which most add zeros through every
    round of the tree."""
    threads = 32
    while threads < items and threads < THREADS:
        threads *= 2
    return threads


@cuda.jit(device=True)
def tree_reduce(sh, rows, tid, nthreads, use_max):
    """Combine ``sh[r, :nthreads]`` into ``sh[r, 0]`` for ``r < rows``: sums, or maxima
    when ``use_max`` (the larger by ``>``). Starts and ends with a barrier."""
    cuda.syncthreads()
    step = nthreads // 2
    while step > 0:
        if tid < step:
            for r in range(rows):
                if use_max:
                    if sh[r, tid + step] > sh[r, tid]:
                        sh[r, tid] = sh[r, tid + step]
                else:
                    sh[r, tid] += sh[r, tid + step]
        cuda.syncthreads()
        step //= 2


@cuda.jit(device=True)
def block_sum(sh, value, tid, nthreads):
    """Sum over the block of every thread's ``value`` (``sh``: shared, ``(k, >= nthreads)``)."""
    sh[0, tid] = value
    tree_reduce(sh, 1, tid, nthreads, False)
    total = sh[0, 0]
    cuda.syncthreads()
    return total


@cuda.jit(device=True)
def block_sum2(sh, a, b, tid, nthreads):
    """Block sums of ``a`` and ``b`` in one tree (``sh``: shared, ``(2, >= nthreads)``)."""
    sh[0, tid] = a
    sh[1, tid] = b
    tree_reduce(sh, 2, tid, nthreads, False)
    total_a = sh[0, 0]
    total_b = sh[1, 0]
    cuda.syncthreads()
    return total_a, total_b


@cuda.jit(device=True)
def block_max(sh, value, tid, nthreads):
    """Maximum over the block of every thread's ``value`` (``sh`` as :func:`block_sum`)."""
    sh[0, tid] = value
    tree_reduce(sh, 1, tid, nthreads, True)
    total = sh[0, 0]
    cuda.syncthreads()
    return total
