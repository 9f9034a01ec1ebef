"""The CUDA kernels' 16-byte vector paths (kernels/cuda/vector.py) and block reductions
(kernels/cuda/reduce.py).

Each launcher with a vector kernel runs here on both of its paths, chosen on the
host by :func:`numbapos.kernels.cuda.vector.aligned`: aligned rows of whole
vectors take the kernel its factory compiles for 16-byte vectors, anything else
(a pointer 4 bytes off, a view such as ``table[:, 1:]``, D % 4 != 0) the one
for single elements. Which kernel ran is read from the launches the launchers
make, and both give the CPU's bits. On the simulator the
vector loads are Python that asserts the 16-byte alignment the hardware needs.
The PTX test compiles the vector kernels for sm_90 and checks that NVVM emits
16-byte accesses (skipped where NVVM is not installed).
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from conftest import dev
from numba import cuda, float32

from numbapos._args import BertIds, BertTables, DropoutArgs, TableFormat
from numbapos.kernels.cpu import blocks as cpu_blocks
from numbapos.kernels.cpu import embedding as cpu
from numbapos.kernels.cuda import blocks as gpu_blocks
from numbapos.kernels.cuda import embedding as gpu
from numbapos.kernels.cuda import vector
from numbapos.kernels.cuda.reduce import block_max, block_sum, block_sum2
from numbapos.kernels.halfbits import BF16

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def placed(host, offset_bytes=0):
    """``host`` copied to a device view whose first element sits ``offset_bytes`` past a
    16-byte boundary (the view is C-contiguous)."""
    itemsize = host.dtype.itemsize
    buf = cuda.device_array(host.size + 64 // itemsize, host.dtype)
    start = (-vector.address(buf) % 16 + offset_bytes) // itemsize
    view = buf[start:start + host.size].reshape(host.shape)
    view.copy_to_device(np.ascontiguousarray(host))
    assert vector.address(view) % 16 == offset_bytes % 16
    return view


def bits(x):
    """The bit patterns of a host or device array, for exact comparisons (NaN included)."""
    x = x.copy_to_host() if hasattr(x, "copy_to_host") else np.asarray(x)
    return x.view(np.dtype(f"u{x.dtype.itemsize}"))


def simulated() -> bool:
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def launches(run, kernel, alone=True):
    """Run ``run()`` and check that the last kernel the block and embedding launchers
    launched was ``kernel`` (the dispatcher; their only one when ``alone``)."""
    seen = []

    def spy(module):
        real = module.launch

        def launch(launched, *args):
            seen.append(launched)
            real(launched, *args)
        return launch

    with (mock.patch.object(gpu, "launch", spy(gpu)),
          mock.patch.object(gpu_blocks, "launch", spy(gpu_blocks))):
        run()
    assert seen[-1:] == [kernel], [k.py_func.__qualname__ for k in seen]
    assert not alone or len(seen) == 1, seen


FLOAT = int(TableFormat.FLOAT)


def gather(lanes, fmt=FLOAT):
    """The lookup's kernel moving ``lanes`` columns at a time: copying rows (two groups in
    flight by vectors, four by elements) or widening 16-bit ones (``fmt`` BF16)."""
    if fmt != FLOAT:
        return gpu._gather_kernel(fmt, lanes, 1)
    return gpu._gather_kernel(FLOAT, lanes, 2 if lanes > 1 else 4)


# ---------------------------------------------------------------- the host decision


def test_aligned_needs_aligned_pointer_row_stride_and_whole_vectors():
    f32 = np.zeros((4, 12), np.float32)
    assert vector.aligned(placed(f32))
    assert vector.aligned(placed(f32), placed(np.zeros((2, 4), np.float32)))
    assert not vector.aligned(placed(f32, 4))  # pointer 4 bytes past a boundary
    assert not vector.aligned(placed(f32), placed(f32, 8))  # one array is enough to refuse
    assert not vector.aligned(placed(f32)[:, 1:])  # the misaligned view of the issue
    assert vector.aligned(placed(f32)[:, 4:])  # a strided view of aligned vectors
    assert not vector.aligned(placed(np.zeros((4, 10), np.float32))[:, :8])  # row stride 40
    assert not vector.aligned(placed(np.zeros((4, 6), np.float32)))  # D % 4 != 0
    assert vector.aligned(placed(np.zeros((3, 2), np.float64)))
    assert not vector.aligned(placed(np.zeros((3, 3), np.float64)))
    assert vector.aligned(placed(np.zeros((3, 8), np.uint16)))
    assert not vector.aligned(placed(np.zeros((3, 4), np.uint16)))
    assert not vector.aligned(placed(f32)[:, ::2])  # strided columns
    assert not vector.aligned(cuda.device_array((0, 8), np.float32))
    assert not vector.aligned(cuda.device_array((3, 0), np.float32))


# ---------------------------------------------------------------- gather


GATHER_CASES = [
    # (dtype, backing table shape, column slice, pointer offset, lanes expected)
    (np.float32, (5, 8), slice(None), 0, 4),
    (np.float32, (5, 12), slice(4, None), 0, 4),
    (np.float32, (5, 4), slice(None), 0, 4),
    (np.float32, (5, 9), slice(1, None), 0, 1),  # table[:, 1:]
    (np.float32, (5, 8), slice(None), 4, 1),  # pointer 4 bytes off
    (np.float32, (5, 6), slice(None), 0, 1),  # D % 4 != 0
    (np.float64, (5, 6), slice(None), 0, 2),
    (np.float64, (5, 3), slice(None), 0, 1),
]


@pytest.mark.parametrize("dtype, shape, cols, offset, lanes", GATHER_CASES)
def test_gather_takes_the_vector_kernel_only_where_aligned(rng, dtype, shape, cols, offset,
                                                           lanes):
    backing = rng.normal(size=shape).astype(dtype)
    weight = placed(backing, offset)[:, cols]
    expect = backing[:, cols]
    # 11 rows: more than one vector pair per thread in some rows of the wider cases
    flat = rng.integers(0, shape[0], size=11)
    out = placed(np.full((flat.size, expect.shape[1]), np.nan, dtype))
    launches(lambda: gpu.gather_rows(dev(flat), weight, out), gather(lanes))
    np.testing.assert_array_equal(bits(out), bits(expect[flat]))


def test_gather_takes_the_scalar_kernel_for_a_misaligned_output(rng):
    weight = placed(rng.normal(size=(5, 8)).astype(np.float32))
    flat = np.array([4, 0, 2])
    out = placed(np.full((3, 8), np.nan, np.float32), 4)
    launches(lambda: gpu.gather_rows(dev(flat), weight, out), gather(1))
    np.testing.assert_array_equal(bits(out), bits(weight.copy_to_host()[flat]))


@pytest.mark.skipif(not simulated(), reason="a GPU faults here (what the test stands for)")
def test_the_simulated_vector_load_refuses_a_misaligned_row(rng):
    """What a GPU would fault on fails on the simulator too: a wrong host decision shows."""
    from numbapos.kernels.cuda import errors

    weight = placed(rng.normal(size=(4, 9)).astype(np.float32))[:, 1:]
    out = placed(np.zeros((2, 8), np.float32))
    word, host = errors.words()
    with pytest.raises(AssertionError, match="misaligned"):
        gather(4)[1, 32](dev(np.array([0, 1])), weight, out, dev(np.zeros(0, np.int64)), word,
                         host, errors.tag())


def test_vector_gather_zero_fills_a_bad_row_and_defers_the_error(rng):
    import numbapos

    host = rng.normal(size=(4, 8)).astype(np.float32)
    out = placed(np.full((3, 8), np.nan, np.float32))
    flat = np.array([1, 7, 3])
    launches(lambda: gpu.gather_rows(dev(flat), placed(host), out), gather(4))
    with pytest.raises(IndexError, match=r"index 7 \(at flat position 1\)"):
        numbapos.synchronize()
    np.testing.assert_array_equal(out.copy_to_host(), np.stack([host[1], 0 * host[0], host[3]]))


# ---------------------------------------------------------------- segment sums


@pytest.mark.parametrize("scale", [False, True])
@pytest.mark.parametrize("dim, offset, lanes", [
    (8, 0, 4),
    (4, 0, 4),
    (8, 4, 1),  # gradient 4 bytes past a boundary
    (6, 0, 1),  # D % 4 != 0
])
def test_scatter_rows_is_the_cpus_bits_on_both_paths(rng, scale, dim, offset, lanes):
    # Row 2 occurs 7 times (the 4-row step and the remainder), row 0 twice, row 4 once.
    flat = np.array([2, 0, 2, 2, 4, 2, 2, 0, 2, 2, 3])
    grad = rng.normal(size=(flat.size, dim)).astype(np.float32)
    want = np.zeros((5, dim), np.float32)
    cpu.scatter_rows(grad, flat, 3, scale, want)
    out = placed(np.zeros((5, dim), np.float32))
    launches(lambda: gpu.scatter_rows(placed(grad, offset), dev(flat), 3, scale, out),
             gpu._sum_kernel(lanes), alone=False)  # after the grouping's launches
    np.testing.assert_array_equal(bits(out), bits(want))
    assert not want[3].any() and want[2].any()  # padding left out, the hot row summed


def test_sum_row_groups_by_vectors_is_the_cpus_bits(rng):
    flat = np.array([1, 3, 1, 1, 1, 1, 0])
    grad = rng.normal(size=(flat.size, 8)).astype(np.float32)
    groups = cpu.group_rows(flat, None, 4)
    want = np.zeros((groups.rows.size, 8), np.float32)
    cpu.sum_row_groups(grad, groups, True, want)
    gpu_groups = gpu.group_rows(dev(flat), None, 4)
    out = placed(np.full((flat.size, 8), np.nan, np.float32))
    launches(lambda: gpu.sum_row_groups(placed(grad), gpu_groups, True, out),
             gpu._sum_kernel(4))
    used = int(gpu_groups.used.copy_to_host()[0])
    np.testing.assert_array_equal(bits(out)[:used], bits(want))


# ---------------------------------------------------------------- GPT-2 forward


@pytest.mark.parametrize("p", [0.0, 0.5])
@pytest.mark.parametrize("dim, lanes", [(8, 4), (6, 1)])
def test_gpt2_forward_is_the_cpus_bits_on_both_paths(rng, p, dim, lanes):
    wte = rng.normal(size=(6, dim)).astype(np.float32)
    wpe = rng.normal(size=(5, dim)).astype(np.float32)
    ids = np.array([5, 0, 3, 3, 1])
    pos = np.array([0, 1, 2, 3, 4])
    drop = DropoutArgs.make(p, seed=7, counter=3)
    want = np.full((ids.size, dim), np.nan, np.float32)
    cpu_blocks.gpt2_forward(ids, pos, wte, wpe, drop, want)
    y = placed(np.full((ids.size, dim), np.nan, np.float32))
    launches(lambda: gpu_blocks.gpt2_forward(dev(ids), dev(pos), placed(wte), placed(wpe), drop,
                                             y), gpu_blocks._gpt2_forward_kernel(FLOAT, lanes))
    np.testing.assert_array_equal(bits(y), bits(want))
    if p:
        assert (want == 0).any()  # dropout did drop something


# ---------------------------------------------------------------- BERT forward


def _bert(rng, tokens, dim, affine, bad=None):
    """BERT ids and tables (host), word ids with ``bad`` at position 1 when given."""
    words = rng.integers(0, 7, tokens)
    if bad is not None:
        words[1] = bad
    ids = BertIds(words, rng.integers(0, 5, tokens), rng.integers(0, 2, tokens))
    tables = BertTables((rng.normal(size=(7, dim)) + 2).astype(np.float32),
                        rng.normal(size=(5, dim)).astype(np.float32),
                        rng.normal(size=(2, dim)).astype(np.float32),
                        (1 + 0.5 * rng.normal(size=dim)).astype(np.float32) if affine else None,
                        rng.normal(size=dim).astype(np.float32) if affine else None)
    return ids, tables


def _gpu_bert(ids, tables, drop, lanes, offset=0):
    tokens, dim = ids.word.size, tables.word.shape[1]
    y = placed(np.full((tokens, dim), np.nan, np.float32))
    mean, rstd = dev(np.full(tokens, np.nan, np.float32)), dev(np.full(tokens, np.nan,
                                                                      np.float32))
    d_ids = BertIds(*map(dev, ids))
    d_tables = BertTables(*(None if t is None else placed(t, offset if t.ndim == 2 else 0)
                            for t in tables))
    launches(lambda: gpu_blocks.bert_forward(d_ids, d_tables, 1e-12, drop, y, mean, rstd),
             gpu_blocks._bert_forward_kernel(np.dtype(np.float32), FLOAT, lanes))
    return y.copy_to_host(), mean.copy_to_host(), rstd.copy_to_host()


@pytest.mark.parametrize("affine, p", [(True, 0.0), (True, 0.5), (False, 0.5)])
@pytest.mark.parametrize("dim, offset, lanes", [
    (8, 0, 4),
    (520, 0, 4),  # more vectors than threads: two rounds for some
    (8, 4, 1),  # tables 4 bytes past a boundary
    (6, 0, 1),  # D % 4 != 0
])
def test_bert_forward_matches_the_cpu_on_both_paths(rng, affine, p, dim, offset, lanes):
    ids, tables = _bert(rng, 3, dim, affine)
    drop = DropoutArgs.make(p, seed=5, counter=2)
    y, mean, rstd = _gpu_bert(ids, tables, drop, lanes, offset)
    want = [np.empty((3, dim), np.float32), np.empty(3, np.float32), np.empty(3, np.float32)]
    cpu_blocks.bert_forward(ids, tables, 1e-12, drop, *want)
    for got, expect in zip((y, mean, rstd), want, strict=True):
        np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(y == 0, want[0] == 0)  # the same dropout mask
    assert (y == 0).any() == bool(p)


def test_vector_bert_forward_zero_fills_a_bad_token_and_defers_the_error(rng):
    import numbapos

    ids, tables = _bert(rng, 3, 8, True, bad=9)
    y, mean, rstd = _gpu_bert(ids, tables, DropoutArgs.make(0.0, 0, 0), 4)
    with pytest.raises(IndexError, match=r"input_ids: index 9 \(at flat position 1\)"):
        numbapos.synchronize()
    assert not y[1].any() and mean[1] == 0 and rstd[1] == 0
    assert np.isfinite(y).all() and y[0].any() and y[2].any()


# ---------------------------------------------------------------- 16-bit lookups


@pytest.mark.parametrize("dim, offset, lanes", [
    (16, 0, 8),
    (8, 0, 8),
    (8, 2, 1),  # table 2 bytes past a boundary
    (4, 0, 1),  # D % 8 != 0
])
def test_half_lookups_are_the_cpus_bits_on_both_paths(rng, dim, offset, lanes):
    table = rng.integers(0, 2 ** 16, size=(5, dim), dtype=np.uint16)
    flat = np.array([4, 1, 1, 0, 3])
    want = np.zeros((flat.size, dim), np.uint32)
    cpu.gather_rows(flat, table, want, BF16)
    out = placed(np.zeros((flat.size, dim), np.uint32))
    launches(lambda: gpu.gather_rows(dev(flat), placed(table, offset), out, BF16),
             gather(lanes, BF16))
    np.testing.assert_array_equal(out.copy_to_host(), want)
    out16 = placed(np.zeros((flat.size, dim), np.uint16))
    launches(lambda: gpu.gather_rows(dev(flat), placed(table, offset), out16, BF16),
             gather(lanes))
    np.testing.assert_array_equal(out16.copy_to_host(), table[flat])


# ---------------------------------------------------------------- block reductions


def _tree(values, use_max):
    """The pairwise order of :func:`numbapos.kernels.cuda.reduce.tree_reduce`, in NumPy."""
    values = values.copy()
    step = values.size // 2
    while step:
        if use_max:
            values[:step] = np.where(values[step:2 * step] > values[:step],
                                     values[step:2 * step], values[:step])
        else:
            values[:step] = values[:step] + values[step:2 * step]
        step //= 2
    return values[0]


@cuda.jit
def _reduce_rows(x, out):
    """Row ``r`` of ``x`` (one value a thread): its block sum, the two sums of
    ``block_sum2`` and its block maximum into ``out[r]``."""
    sh = cuda.shared.array((2, 128), float32)
    tid = cuda.threadIdx.x
    n = cuda.blockDim.x
    for r in range(x.shape[0]):  # several rounds reuse the shared array
        out[r, 0] = block_sum(sh, x[r, tid], tid, n)
        a, b = block_sum2(sh, x[r, tid], -x[r, tid] * x[r, tid], tid, n)
        out[r, 1] = a
        out[r, 2] = b
        out[r, 3] = block_max(sh, x[r, tid], tid, n)


@pytest.mark.parametrize("threads", [32, 64, 128])
def test_block_reductions_add_in_the_tree_order_for_any_power_of_two(rng, threads):
    # Magnitudes far apart: another order of the additions gives other bits.
    x = (rng.normal(size=(2, threads)) * 10.0 ** rng.integers(-4, 5, size=(2, threads)))
    x = x.astype(np.float32)
    out = dev(np.zeros((2, 4), np.float32))
    _reduce_rows[1, threads](dev(x), out)
    got = out.copy_to_host()
    for r in range(2):
        want = [_tree(x[r], False), _tree(x[r], False), _tree(-x[r] * x[r], False),
                _tree(x[r], True)]
        np.testing.assert_array_equal(got[r], np.array(want, np.float32))
        assert got[r, 3] == x[r].max()
    # The data tell the orders apart: added left to right, some row's bits differ.
    assert any(_tree(x[r], False) != np.cumsum(x[r], dtype=np.float32)[-1] for r in range(2))


# ---------------------------------------------------------------- PTX


PTX = textwrap.dedent("""
    import sys
    import numba
    import numpy as np
    import ptx_signatures
    from numba import cuda
    from numbapos.kernels.cuda import blocks, embedding, errors

    ptx_signatures._stand_in_device((9, 0))
    i64 = numba.typeof(np.zeros(3, np.int64))
    f32 = numba.typeof(np.zeros((2, 4), np.float32))
    f1 = numba.typeof(np.zeros(4, np.float32))
    u16 = numba.typeof(np.zeros((2, 8), np.uint16))
    u32 = numba.typeof(np.zeros((2, 8), np.uint32))
    n = numba.int64
    b = numba.boolean
    from numbapos._args import BertIds, BertTables, DropoutArgs, RowGroups, TiledIds

    # The kernels' records: tiled ids, dropout (its device counter, or empty).
    tiled = numba.typeof(TiledIds(np.zeros(3, np.int64), np.int64(0), np.int64(3)))
    drop = numba.typeof(DropoutArgs(np.uint64(0), np.uint64(0), np.uint64(0), np.float32(1),
                                    True, np.zeros(1, np.uint64)))
    groups = numba.typeof(RowGroups(*[np.zeros(3, np.int64)] * 5))
    err = (i64, i64, n)
    gather = embedding._gather_kernel
    signatures = {
        "gather_vec": (gather(-1, 4, 2), (i64, f32, f32, i64, *err)),
        "gather_view_vec": (gather(-1, 4, 2),
                            (i64, numba.typeof(np.zeros((2, 8), np.float32)[:, 4:]), f32,
                             i64, *err)),
        "gather": (gather(-1, 1, 4), (i64, f32, f32, i64, *err)),
        "sum_vec": (embedding._sum_kernel(4), (f32, groups, b, b, f32, i64)),
        "gpt2_vec": (blocks._gpt2_forward_kernel(-1, 4),
                     (i64, tiled, f32, f32, drop, f32, i64, i64, numba.types.UniTuple(n, 2))),
        "bert_vec": (blocks._bert_forward_kernel(np.dtype(np.float32), -1, 4),
                     (numba.types.NamedTuple((i64, tiled, tiled), BertIds),
                      numba.types.NamedTuple((f32, f32, f32, f1, f1), BertTables),
                      numba.float32, drop, f32, f1, f1, i64, i64, i64, numba.types.UniTuple(n, 3))),
        "copy16_vec": (gather(-1, 8, 2), (i64, u16, u16, i64, *err)),
        "widen_vec": (gather(0, 8, 1), (i64, u16, u32, i64, *err)),
    }
    for name, (kernel, argtypes) in signatures.items():
        ptx, _ = cuda.compile_ptx(kernel.py_func, argtypes, cc=(9, 0))
        loads = sorted({w for w in ptx.split() if w.startswith("ld.global.v")})
        stores = sorted({w for w in ptx.split() if w.startswith("st.global.v")})
        order = "".join("L" if w.startswith("ld.global.v") else "S" for w in ptx.split()
                        if w.startswith(("ld.global.v", "st.global.v")))
        print(name, ",".join(loads) or "-", ",".join(stores) or "-", order or "-")
""")


def _nvvm_available() -> bool:
    code = ("from numba import cuda, float32\n"
            "def k(x):\n    x[0] = 1\n"
            "cuda.compile_ptx(k, (float32[::1],), cc=(9, 0))\n")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          timeout=120).returncode == 0


def test_vector_kernels_compile_to_16_byte_accesses():
    if not _nvvm_available():
        pytest.skip("NVVM is not installed (pip install 'numba-cuda[cu12]'; .ci/run does)")
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS)] + [
                   p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    done = subprocess.run([sys.executable, "-c", PTX], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    found = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()}
    for name in ("gather_vec", "gather_view_vec", "sum_vec", "gpt2_vec", "bert_vec"):
        loads, stores, _ = found[name]
        assert "ld.global.v4.f32" in loads.split(","), (name, loads)
        assert "st.global.v4.f32" in stores.split(","), (name, stores)
    for name in ("copy16_vec", "widen_vec"):  # 8 x 16 bits move as 4 x 32
        loads, stores, _ = found[name]
        assert "ld.global.v4.u32" in loads.split(","), (name, loads)
        assert stores.startswith("st.global.v4."), (name, stores)
    # Two vectors in flight per thread: both loads are issued before the first store.
    assert found["gather_vec"][2].startswith("LLSS"), found["gather_vec"]
    assert found["sum_vec"][2].startswith("LLLL"), found["sum_vec"]
    assert found["gather"] == ["-", "-", "-"]  # the scalar twin: 4-byte accesses only
