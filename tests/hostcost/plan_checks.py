"""Checks of the GPU host path's plans, run inside a stub-driver process (``stub.run``).

The stub runs no kernel, so these check what the host does: that a plan's
replay hands ``cuLaunchKernel`` exactly the parameters (values, function,
grid, block, stream) the ordinary path packs for the same arrays, that its
outputs are ordinary device arrays whose memory goes back to the pool, and
that every error the ordinary path raises is still raised (an ``out=`` that
overlaps an input, an index error a kernel left in the error word).
"""

from __future__ import annotations

import gc
import struct
import sys

import numpy as np

_ONE_BY_ONE: list = []


def _spy():
    """Record every packed launch's ``(values, function, grid, block, stream)`` (planned ops
    launch one kernel at a time from here on, through the spied function)."""
    import numbapos
    from numbapos._gpuhost import fastlaunch

    if not _ONE_BY_ONE:  # for the rest of the process (kept: collected, it would end)
        _ONE_BY_ONE.append(numbapos.config.override(cuda_native_launch=False))
        _ONE_BY_ONE[0].__enter__()

    seen = []
    original = fastlaunch.launch_kernel

    def launch_kernel(packed, function, grid, block, stream):
        seen.append((struct.unpack_from(packed.format, packed.buffer), int(function),
                     tuple(grid), tuple(block), int(stream)))
        original(packed, function, grid, block, stream)

    fastlaunch.launch_kernel = launch_kernel
    return seen


def _lookup_cases():
    from numba import cuda

    rng = np.random.default_rng(0)
    for ids_dtype, table_dtype, shape, out_dtype in [
        (np.int64, np.float32, (32, 128), None),
        (np.int32, np.float64, (7,), None),
        (np.int64, np.float32, (3, 5), None),
        (np.int64, np.float16, (4, 6), None),
        (np.int32, np.float16, (4, 6), np.float16),
    ]:
        ids = cuda.to_device(rng.integers(0, 100, shape).astype(ids_dtype))
        table = cuda.to_device(rng.standard_normal((100, 24)).astype(table_dtype))
        yield ids, table, out_dtype


def check_lookups() -> dict:
    """Planned lookups against the ordinary path, launch by launch."""
    import numbapos
    import numbapos.functional as F

    lookup = sys.modules["numbapos.functional.embedding"]
    seen = _spy()
    from numba import cuda

    checked = 0
    for ids, table, out_dtype in _lookup_cases():
        result_dtype = np.dtype(out_dtype or (np.float32 if table.dtype.itemsize == 2
                                              else table.dtype))
        for _ in range(3):  # compile, record, replay
            F.embedding(ids, table, out_dtype=out_dtype)
        # into out=: the replay packs what the ordinary path packs for the same arrays
        out = cuda.device_array(ids.shape + (24,), result_dtype)
        F.embedding(ids, table, out=out, out_dtype=out_dtype)
        seen.clear()
        F.embedding(ids, table, out=out, out_dtype=out_dtype)
        planned = seen[:]
        seen.clear()
        lookup._lookup(ids, table, None, None, 2.0, out, out_dtype)
        assert planned == seen and len(planned) == 1, (planned, seen)
        # allocating: a new array the kernel writes, of the right metadata
        seen.clear()
        result = F.embedding(ids, table, out_dtype=out_dtype)
        planned = seen[:]
        assert (result.shape, result.dtype) == (ids.shape + (24,), result_dtype)
        seen.clear()
        lookup._lookup(ids, table, None, None, 2.0, result, out_dtype)
        assert planned == seen, (planned, seen)
        checked += 1
    return {"lookups": checked, "plans": len(lookup._LOOKUPS.cache.plans),
            "numbapos": numbapos.__version__}


def check_outputs() -> dict:
    """A planned output behaves as any device array and its block goes back to the pool."""
    from numba import cuda

    import numbapos.functional as F

    ids = cuda.to_device(np.arange(12).reshape(3, 4))
    table = cuda.to_device(np.ones((50, 8), np.float32))
    for _ in range(3):
        F.embedding(ids, table)
    result = F.embedding(ids, table)
    assert result.copy_to_host().shape == (3, 4, 8)
    assert result.reshape(12, 8).shape == (12, 8) and result[1].shape == (4, 8)
    assert result.__cuda_array_interface__["shape"] == (3, 4, 8)
    # Each output describes its own memory to Numba's ordinary launch too (which reads the
    # pointer from the cached _strided_memory_view_shim), not its plan's example's.
    other = F.embedding(ids, table)
    for array in (result, other):
        pointer = array.__cuda_array_interface__["data"][0]
        assert array._strided_memory_view_shim.ptr == pointer
        assert array._numbapos_launch_fields[4] == pointer
    assert result.__cuda_array_interface__["data"][0] != other.__cuda_array_interface__["data"][0]
    del other
    pools = cuda.current_context().memory_manager.pools
    before = pools.cached()
    del result
    gc.collect()
    assert pools.cached() == before + 1
    return {"outputs": True}


def check_errors() -> dict:
    """An overlapping ``out=`` and a pending index error raise through a plan as without."""
    from numba import cuda

    import numbapos.functional as F
    from numbapos.kernels.cuda import errors

    ids = cuda.to_device(np.arange(12).reshape(3, 4))
    memory = cuda.to_device(np.zeros(96 + 400, np.float32))
    table = memory[96:].reshape(50, 8)
    for _ in range(3):
        F.embedding(ids, table, out=cuda.device_array((3, 4, 8), np.float32))
    messages = []
    try:
        F.embedding(ids, table, out=memory[8:104].reshape(3, 4, 8))
    except ValueError as err:
        messages.append(str(err))
    host = errors.host_word_view()
    host[:4] = (5, 99, 50, errors.tag())
    try:
        F.embedding(ids, table, out=cuda.device_array((3, 4, 8), np.float32))
    except IndexError as err:
        messages.append(str(err))
    F.embedding(ids, table, out=cuda.device_array((3, 4, 8), np.float32))  # cleared
    return {"messages": messages}


def _same_but_pointers(planned, ordinary):
    """Whether two launch lists agree but for pointers, each planned one standing for one
    ordinary one throughout (the plan's workspace in place of the ordinary call's scratch,
    its new outputs in place of those; the ordinary call may reuse a freed scratch block
    where the plan's workspace keeps each scratch array apart)."""
    if len(planned) != len(ordinary):
        return False
    moved: dict = {}
    for (values, *rest), (others, *more) in zip(planned, ordinary, strict=True):
        if rest != more or len(values) != len(others):
            return False
        for a, b in zip(values, others, strict=True):
            if a != b and (min(a, b) < 1 << 20 or moved.setdefault(a, b) != b):
                return False
    return True


def check_dense_backward() -> dict:
    """A planned dense lookup backward: the ordinary path's launches, scratch in a workspace."""
    from numba import cuda

    import numbapos.functional as F

    lookup = sys.modules["numbapos.functional.embedding"]
    seen = _spy()
    rng = np.random.default_rng(1)
    cases = 0
    for n, rows, dim, padding_idx, scale in [(4096, 30522, 64, None, False),
                                             (37, 50, 8, 3, True), (5, 7, 4, -1, False)]:
        ids = cuda.to_device(rng.integers(0, rows, n))
        grad = cuda.to_device(rng.standard_normal((n, dim)).astype(np.float32))
        for _ in range(3):
            F.embedding_backward(grad, ids, rows, padding_idx, scale)
        seen.clear()
        result = F.embedding_backward(grad, ids, rows, padding_idx, scale)
        planned = seen[:]
        seen.clear()
        lookup._backward(grad, ids, rows, padding_idx, scale, False, False, None)
        assert result.shape == (rows, dim) and _same_but_pointers(planned, seen), planned
        cases += 1
    return {"dense_backwards": cases,
            "plans": len(lookup._DENSE_BACKWARDS.cache.plans)}


def check_sparse_backward() -> dict:
    """A planned sparse lookup backward: a SparseRows made of new arrays, the ordinary
    path's launches, with and without a caller's values buffer."""
    from numba import cuda

    import numbapos.functional as F

    lookup = sys.modules["numbapos.functional.embedding"]
    seen = _spy()
    rng = np.random.default_rng(2)
    cases = 0
    for n, rows, dim, padding_idx, scale, into in [(4096, 30522, 64, None, False, False),
                                                   (37, 50, 8, 3, True, False),
                                                   (300, 90, 16, None, False, True)]:
        ids = cuda.to_device(rng.integers(0, rows, n))
        grad = cuda.to_device(rng.standard_normal((n, dim)).astype(np.float32))
        buffer = cuda.device_array((n, dim), np.float32) if into else None
        for _ in range(3):
            F.embedding_backward(grad, ids, rows, padding_idx, scale, sparse=True,
                                 values_out=buffer)
        seen.clear()
        result = F.embedding_backward(grad, ids, rows, padding_idx, scale, sparse=True,
                                      values_out=buffer)
        planned = seen[:]
        seen.clear()
        again = lookup._backward(grad, ids, rows, padding_idx, scale, True, False, buffer)
        assert _same_but_pointers(planned, seen), planned
        assert type(result) is type(again) and result.num_rows == rows
        for name in ("_indices", "_values", "_used"):
            a, b = getattr(result, name), getattr(again, name)
            assert (a.shape, a.dtype) == (b.shape, b.dtype), name
        if into:
            assert result._values.__cuda_array_interface__["data"][0] == \
                buffer.__cuda_array_interface__["data"][0]
        cases += 1
    return {"sparse_backwards": cases,
            "plans": len(lookup._SPARSE_BACKWARDS.cache.plans)}


def check_lazy_backward() -> dict:
    """A planned lazy sparse backward: new row groups of the ordinary path's metadata, the
    ordinary path's launches, the gradient kept for the update."""
    from numba import cuda

    import numbapos.functional as F

    lookup = sys.modules["numbapos.functional.embedding"]
    seen = _spy()
    rng = np.random.default_rng(3)
    cases = 0
    for n, rows, dim, padding_idx, scale in [(4096, 30522, 64, None, False),
                                             (37, 50, 8, 3, True), (9000, 70000, 4, 0, False)]:
        ids = cuda.to_device(rng.integers(0, rows, n))
        grad = cuda.to_device(rng.standard_normal((n, dim)).astype(np.float32))
        for _ in range(3):
            F.embedding_backward(grad, ids, rows, padding_idx, scale, sparse=True, lazy=True)
        seen.clear()
        result = F.embedding_backward(grad, ids, rows, padding_idx, scale, sparse=True,
                                      lazy=True)
        planned = seen[:]
        seen.clear()
        again = lookup._backward(grad, ids, rows, padding_idx, scale, True, True, None)
        assert _same_but_pointers(planned, seen), planned
        (groups, values, scaled), (other, values_again, scaled_again) = \
            result._pending, again._pending
        assert scaled == scaled_again == scale and values.shape == values_again.shape
        for a, b in zip(groups, other, strict=True):
            assert (a.shape, a.dtype) == (b.shape, b.dtype)
        assert result._indices is groups.rows and result._used is groups.used
        cases += 1
    return {"lazy_backwards": cases, "plans": len(lookup._LAZY_BACKWARDS.cache.plans)}


def check_bert() -> dict:
    """The planned BERT block forward and backward against their ordinary paths, with a
    device dropout counter (as the module passes) and with dropout off, dense and sparse
    word gradients."""
    from numba import cuda

    import numbapos.functional as F
    from numbapos.kernels.cuda import clock

    blocks = sys.modules["numbapos.functional.blocks"]
    seen = _spy()
    rng = np.random.default_rng(4)
    vocab, positions, dim, batch, length = 50, 16, 8, 2, 6
    tables = [cuda.to_device(rng.standard_normal((rows, dim)).astype(np.float32))
              for rows in (vocab, positions, 2)]
    gamma = cuda.to_device(np.ones(dim, np.float32))
    beta = cuda.to_device(np.zeros(dim, np.float32))
    ids = cuda.to_device(rng.integers(0, vocab, (batch, length)))
    grad = cuda.to_device(rng.standard_normal((batch, length, dim)).astype(np.float32))
    cases = 0
    for p, sparse in [(0.1, False), (0.0, True)]:
        counter = cuda.to_device(np.array([7], np.uint64))
        drop = dict(p=p, seed=3, training=True, counter=counter if p else 0)
        forward = dict(eps=1e-12, **drop)
        for _ in range(3):
            y, mean, rstd = F.bert_embeddings_forward(ids, *tables, gamma, beta, **forward)
        seen.clear()
        y, mean, rstd = F.bert_embeddings_forward(ids, *tables, gamma, beta, **forward)
        planned = seen[:]
        seen.clear()
        blocks._bert_forward(ids, *tables, gamma, beta, token_type_ids=None, position_ids=None,
                             past_length=0, out=y, table_options=None, **forward)
        assert len(planned) == 1 and _same_but_pointers(planned, seen), (planned, seen)
        for _ in range(3):
            F.bert_embeddings_backward(grad, ids, *tables, mean, rstd, gamma, beta,
                                       sparse=sparse, **drop)
        seen.clear()
        grads = F.bert_embeddings_backward(grad, ids, *tables, mean, rstd, gamma, beta,
                                           sparse=sparse, **drop)
        planned = seen[:]
        seen.clear()
        again = blocks._bert_backward(grad, ids, *tables, mean, rstd, gamma, beta,
                                      token_type_ids=None, position_ids=None, past_length=0,
                                      padding_idx=None, sparse=sparse, table_options=None,
                                      output_mask=None, **drop)
        assert _same_but_pointers(planned, seen), (planned, seen)
        assert type(grads) is type(again)
        for a, b in zip(grads, again, strict=True):
            assert type(a) is type(b)
            if hasattr(a, "shape"):
                assert (a.shape, a.dtype) == (b.shape, b.dtype)
        cases += 1
        # The module's form: mean, rstd, a counter drawn by the op and a copy of the ids in
        # one record.
        source = clock.DeviceCounter(lambda: 7, print) if p else 0  # a module's counter
        call = (ids, *tables, gamma, beta, None, None, 0, 1e-12, drop["p"], drop["seed"],
                True, source, None, None, True, ids.dtype)
        for _ in range(3):
            y, record = blocks._bert_forward_call(*call)
        seen.clear()
        y, record = blocks._bert_forward_call(*call)
        planned = seen[:]
        seen.clear()
        y_again, record_again = blocks._bert_forward(*call)
        assert len(planned) == 1 + bool(p) and _same_but_pointers(planned, seen), (planned, seen)
        size = blocks._record_size(blocks._record_wanted((batch, length), np.float32, bool(p),
                                                         ids.dtype))
        assert record.shape == record_again.shape == (size,) and record.dtype == np.uint8
        keywords = dict(token_type_ids=None, position_ids=None, past_length=0,
                        padding_idx=None, sparse=sparse, table_options=None, output_mask=None,
                        recorded=((batch, length), bool(p), ids.dtype),
                        **dict(drop, counter=record if p else 0))
        args = (grad, None, *tables, record, None, gamma, beta)
        for _ in range(3):
            blocks._bert_backward_call(args, keywords)
        seen.clear()
        blocks._bert_backward_call(args, keywords)
        planned = seen[:]
        seen.clear()
        blocks._bert_backward(*args, **keywords)
        assert _same_but_pointers(planned, seen), (planned, seen)
        cases += 1
    return {"bert": cases, "forward_plans": len(blocks._BERT_FORWARDS.cache.plans),
            "backward_plans": len(blocks._BERT_BACKWARDS.cache.plans)}


def check_gpt2() -> dict:
    """The planned GPT-2 block forward and backward against their ordinary paths, as
    :func:`check_bert` (device dropout counter, dropout off with a sparse ``wte``
    gradient); the backward's position gradient is the one-launch kernel's."""
    from numba import cuda

    import numbapos.functional as F

    blocks = sys.modules["numbapos.functional.blocks"]
    seen = _spy()
    rng = np.random.default_rng(5)
    vocab, positions, dim, batch, length = 50, 16, 8, 2, 6
    wte, wpe = [cuda.to_device(rng.standard_normal((rows, dim)).astype(np.float32))
                for rows in (vocab, positions)]
    ids = cuda.to_device(rng.integers(0, vocab, (batch, length)))
    grad = cuda.to_device(rng.standard_normal((batch, length, dim)).astype(np.float32))
    cases = 0
    for p, sparse in [(0.1, False), (0.0, True)]:
        counter = cuda.to_device(np.array([7], np.uint64))
        drop = dict(p=p, seed=3, training=True, counter=counter if p else 0)
        for _ in range(3):
            y = F.gpt2_embeddings(ids, wte, wpe, past_length=2, **drop)
        seen.clear()
        y = F.gpt2_embeddings(ids, wte, wpe, past_length=2, **drop)
        planned = seen[:]
        seen.clear()
        blocks._gpt2_forward(ids, wte, wpe, past_length=2, position_ids=None,
                             attention_mask=None, out=y, table_options=None, **drop)
        assert len(planned) == 1 and _same_but_pointers(planned, seen), (planned, seen)
        for _ in range(3):
            F.gpt2_embeddings_backward(grad, ids, vocab, positions, past_length=2,
                                       sparse=sparse, **drop)
        seen.clear()
        grads = F.gpt2_embeddings_backward(grad, ids, vocab, positions, past_length=2,
                                           sparse=sparse, **drop)
        planned = seen[:]
        seen.clear()
        again = blocks._gpt2_backward(grad, ids, vocab, positions, past_length=2,
                                      position_ids=None, attention_mask=None, sparse=sparse,
                                      table_options=None, output_mask=None, **drop)
        assert _same_but_pointers(planned, seen), (planned, seen)
        assert type(grads) is type(again) is F.GPT2EmbeddingsGrads
        for a, b in zip(grads, again, strict=True):
            assert type(a) is type(b)
            if hasattr(a, "shape"):
                assert (a.shape, a.dtype) == (b.shape, b.dtype)
        assert grads.wpe.shape == (positions, dim)
        cases += 1
    return {"gpt2": cases, "forward_plans": len(blocks._GPT2_FORWARDS.cache.plans),
            "backward_plans": len(blocks._GPT2_BACKWARDS.cache.plans)}


def check_threads() -> dict:
    """Two threads replaying one plan: every launch gets its own pointers (the plan packs
    and launches under its lock)."""
    import threading

    from numba import cuda

    import numbapos.functional as F

    seen = _spy()
    ids = cuda.to_device(np.arange(12).reshape(3, 4))
    table = cuda.to_device(np.ones((50, 8), np.float32))
    outs = [cuda.device_array((3, 4, 8), np.float32) for _ in range(2)]
    for out in outs:
        for _ in range(3):
            F.embedding(ids, table, out=out)
    seen.clear()
    failures = []

    def work(out):
        try:
            for _ in range(200):
                F.embedding(ids, table, out=out)
        except Exception as err:  # reported below
            failures.append(repr(err))

    threads = [threading.Thread(target=work, args=(out,)) for out in outs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    pointers = {out.__cuda_array_interface__["data"][0] for out in outs}
    # The gather's parameters: flat ids (7 fields), table (9), out's rows (9: the data
    # pointer its 5th), the error words, a tag.
    written = [values[7 + 9 + 4] for values, *_ in seen]
    return {"failures": failures, "launches": len(seen),
            "each": sorted(written.count(p) for p in pointers)}


def check_streams() -> dict:
    """A plan belongs to the stream it was recorded on: on another numbapos stream the op
    records (and launches) there."""
    from numba import cuda

    import numbapos
    import numbapos.functional as F
    from numbapos._gpuhost import plans as plans_module

    lookup = sys.modules["numbapos.functional.embedding"]
    seen = _spy()
    ids = cuda.to_device(np.arange(6).reshape(2, 3))
    table = cuda.to_device(np.ones((10, 4), np.float32))  # a shape no other check uses
    side = cuda.stream()
    handles = []
    for stream in (None, side):
        with numbapos.cuda.stream(stream) if stream is not None else _nothing():
            for _ in range(3):
                F.embedding(ids, table)
            seen.clear()
            F.embedding(ids, table)
            handles.append(seen[-1][-1])
    number = plans_module.signature(table)  # the number of the table's signature
    plans = [key for key in lookup._LOOKUPS.cache.plans if key[1][1] == number]
    return {"plans": len(plans), "default stream": handles[0],
            "side stream": handles[1] == int(side.handle)}


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def check_budget() -> dict:
    """All plans' workspaces together stay within the budget (many signatures, as dynamic
    padding makes, start the caches over instead of holding every workspace)."""
    from numba import cuda

    import numbapos.functional as F
    from numbapos._gpuhost import plans

    budget, plans.WORKSPACE_BUDGET = plans.WORKSPACE_BUDGET, 1 << 20  # 2 or 3 plans here
    try:
        rng = np.random.default_rng(5)
        held = []
        for n in range(5000, 5400, 40):  # the radix path: scratch of about 90 bytes an id
            ids = cuda.to_device(rng.integers(0, 70000, n))
            grad = cuda.to_device(np.ones((n, 4), np.float32))
            for _ in range(3):
                F.embedding_backward(grad, ids, 70000)
            held.append(plans._held[0])
        return {"within": max(held) <= 1 << 20, "planned": min(held) > 0,
                "started over": any(b < a for a, b in zip(held, held[1:], strict=False))}
    finally:
        plans.WORKSPACE_BUDGET = budget


def _launch_log(count):
    """The stub driver's record of its last ``count`` cuLaunchKernel calls."""
    import ctypes

    library = ctypes.CDLL("libcuda.so.1")
    fields = 11
    out = (ctypes.c_ulonglong * (count * fields))()
    library.stub_launch_log.argtypes = [ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_int]
    got = library.stub_launch_log(out, count)
    return [tuple(out[i * fields:(i + 1) * fields]) for i in range(got)]


def check_native() -> dict:
    """A planned op's kernels launched in one native call reach the driver with exactly the
    arguments of the one-call-per-kernel path (function, grid, block, shared bytes,
    stream, parameter pointers, extra), on both paths and for a multi-kernel op; a
    failing launch raises."""
    from numba import cuda

    import numbapos
    import numbapos.functional as F
    from numbapos._gpuhost import fastlaunch

    assert fastlaunch.native_launcher() is not None
    rng = np.random.default_rng(6)
    ids = cuda.to_device(rng.integers(0, 300, 2000))
    grad = cuda.to_device(np.ones((2000, 8), np.float32))
    out = cuda.device_array((2000, 8), np.float32)
    table = cuda.to_device(np.ones((300, 8), np.float32))
    calls = [lambda: F.embedding(ids, table, out=out),
             lambda: F.embedding_backward(grad, ids, 300)]
    logs = {}
    side = cuda.stream()
    for native in (True, False):
        for stream in (None, side):
            with numbapos.config.override(cuda_native_launch=native), \
                    numbapos.cuda.stream(stream) if stream is not None else _nothing():
                for call in calls:
                    for _ in range(3):
                        call()
                before = numbapos._device.cuda_launches()
                for call in calls:
                    call()
                count = numbapos._device.cuda_launches() - before
            logs[native, stream is None] = _launch_log(count)
    on_side = {entry[8] for entry in logs[True, False]}
    return {"kernels": len(logs[True, True]),
            "same": all(logs[True, default] == logs[False, default] for default in (True, False)),
            "side stream": on_side == {int(side.handle)}}


def check_empty_shapes() -> dict:
    """Empty batches keep their shapes through the real host path (numba-cuda 0.30 indexes
    an empty device array to a wrong shape, which the simulator does not)."""
    from numba import cuda

    from numbapos import nn

    block = nn.BertEmbeddings(30, 6, 16, 2, seed=0, device="cuda")
    shapes = []
    for shape in [(1, 0), (2, 0), (3, 0)]:
        y = block(cuda.to_device(np.zeros(shape, np.int64)))
        block.backward(cuda.to_device(np.zeros(shape + (6,), np.float32)))
        shapes.append(list(y.shape))
    return {"shapes": shapes}



def check_pool() -> dict:
    """The caching pool lends blocks without a finalizer per allocation: a block comes back
    when the last array or view on it dies, also when the garbage collector frees it
    from a reference cycle (its memory not freed meanwhile), and a lent block outlives
    ``empty_cache``."""
    from numba import cuda

    manager = cuda.current_context().memory_manager
    pools = manager.pools

    def allocated(pointer):  # Numba still holds the device memory (not queued to be freed)
        return any(int(key) == pointer for key in manager.allocations)

    def pointer_of(array):
        return array.__cuda_array_interface__["data"][0]

    found = {}
    gc.collect()
    gc.disable()  # collections when this check says so only
    try:
        return _pool_lending(found, pools, allocated, pointer_of, manager)
    finally:
        gc.enable()


def _pool_lending(found, pools, allocated, pointer_of, manager):
    from numba import cuda

    x = cuda.device_array(1000, np.float32)
    first, before = pointer_of(x), pools.cached()
    found["no finalizer"] = (type(x.gpu_data).__name__ == "Lent"
                             and not hasattr(x.gpu_data, "_finalizer"))
    view = x[10:20]
    del x
    gc.collect()
    found["kept by its view"] = pools.cached() == before
    del view
    found["back with its view"] = pools.cached() == before + 1
    cycle = cuda.device_array(1000, np.float32)
    found["reused"] = pointer_of(cycle) == first
    cycle.me = cycle
    del cycle
    found["in a cycle until collected"] = pools.cached() == before
    gc.collect()
    found["back from a cycle"] = pools.cached() == before + 1 and allocated(first)
    lent = cuda.device_array(1000, np.float32)
    found["reused after the cycle"] = pointer_of(lent) == first
    manager.empty_cache()
    found["lent through empty_cache"] = allocated(first) and pools.cached() == 0
    del lent
    found["back after empty_cache"] = pools.cached() == 1 and allocated(first)
    return found
