"""CUDA groups: numbapos's ``@cuda.jit`` kernels next to PyTorch CUDA on the same GPU.

Skipped without a real GPU (the simulator is for tests, not timings). Every
timed call ends with a device synchronisation, so the times are those of the
work, not of the launch. Bandwidth-bound cases report the bytes they move in
``extra_info``: ``GB/s`` and ``of_copy``, the fraction of the device-to-device
copy bandwidth measured in the same run (``copy_bandwidth`` group). The
``cuda_launch_cost`` group reports, per op, the kernels it launches and the
host microseconds it takes to queue them (with numbapos's fast launch path on
and off), and ``cuda_captured_step`` a training step replayed as a CUDA graph
(``numbapos.cuda.capture``) next to the same step run eagerly::

    NUMBA_ENABLE_CUDASIM=0 pytest benchmarks/test_bench_cuda.py \\
        --benchmark-group-by=group --benchmark-columns=min,median,rounds
"""

import time

import numpy as np
import pytest

import numbapos
from numbapos import _device, nn, optim
from numbapos import functional as F

if not numbapos.cuda_available() or _device.simulator_enabled():
    pytest.skip("needs a real CUDA GPU (NUMBA_ENABLE_CUDASIM=0)", allow_module_level=True)

from numba import cuda  # noqa: E402

try:
    import torch
except ImportError:  # PyTorch is an optional peer
    torch = None
if torch is not None and not torch.cuda.is_available():
    torch = None

VOCAB, DIM = 30522, 768
BATCH, SEQ = 32, 128
IMPLS = ["numbapos", "torch"]
_COPY = {}


def _peer(impl):
    if impl == "torch" and torch is None:
        pytest.skip("PyTorch with CUDA is not installed")


def _sync():
    cuda.synchronize()
    if torch is not None:
        torch.cuda.synchronize()


def _time(benchmark, fn, bytes_moved=None):
    """Warm up (JIT, caches) for a second, then time ``fn`` + sync; record the bandwidth."""
    start = time.perf_counter()
    while time.perf_counter() - start < 1.0:
        fn()
        _sync()

    def call():
        result = fn()
        _sync()
        return result

    result = benchmark.pedantic(call, rounds=50, iterations=1, warmup_rounds=2)
    if bytes_moved:
        gbs = bytes_moved / benchmark.stats.stats.min / 1e9
        benchmark.extra_info["GB/s"] = round(gbs, 1)
        if "GB/s" in _COPY:
            benchmark.extra_info["of_copy"] = round(gbs / _COPY["GB/s"], 3)
    return result


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    weight = rng.normal(size=(VOCAB, DIM)).astype(np.float32)
    ids = rng.integers(0, VOCAB, size=(BATCH, SEQ))
    grad = rng.normal(size=(BATCH, SEQ, DIM)).astype(np.float32)
    return weight, ids, grad


def test_copy_bandwidth(benchmark):
    """Device-to-device copy of 512 MiB: the bandwidth the other groups are measured against."""
    benchmark.group = "copy_bandwidth"
    src = cuda.device_array(1 << 27, np.float32)
    dst = cuda.device_array(1 << 27, np.float32)
    _time(benchmark, lambda: dst.copy_to_device(src))
    _COPY["GB/s"] = 2 * src.nbytes / benchmark.stats.stats.min / 1e9
    benchmark.extra_info["GB/s"] = round(_COPY["GB/s"], 1)


@pytest.mark.parametrize("impl", IMPLS)
def test_lookup(benchmark, data, impl):
    """4096 tokens x 768 float32 gathered from a 30522-row table (into out= for numbapos)."""
    _peer(impl)
    benchmark.group = "cuda_lookup"
    weight, ids, _ = data
    moved = 2 * ids.size * DIM * 4
    if impl == "numbapos":
        w, i = numbapos.to_device(weight, "cuda"), numbapos.to_device(ids, "cuda")
        out = cuda.device_array(ids.shape + (DIM,), np.float32)
        y = _time(benchmark, lambda: F.embedding(i, w, out=out), moved)
    else:
        w, i = torch.from_numpy(weight).cuda(), torch.from_numpy(ids).cuda()
        with torch.no_grad():
            y = _time(benchmark, lambda: torch.nn.functional.embedding(i, w), moved)
    np.testing.assert_array_equal(numbapos.to_host(y) if impl == "numbapos" else y.cpu().numpy(),
                                  weight[ids])


@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("impl", IMPLS)
def test_backward(benchmark, data, impl, sparse):
    """Table gradient of the lookup (numbapos: deterministic; torch: its default kernel)."""
    _peer(impl)
    benchmark.group = f"cuda_backward_{'sparse' if sparse else 'dense'}"
    weight, ids, grad = data
    if impl == "numbapos":
        g, i = numbapos.to_device(grad, "cuda"), numbapos.to_device(ids, "cuda")
        _time(benchmark, lambda: F.embedding_backward(g, i, VOCAB, sparse=sparse))
    else:
        w = torch.from_numpy(weight).cuda().requires_grad_()
        i, g = torch.from_numpy(ids).cuda(), torch.from_numpy(grad).cuda()

        def step():
            w.grad = None
            torch.nn.functional.embedding(i, w, sparse=sparse).backward(g)
        _time(benchmark, step)


@pytest.mark.parametrize("impl", IMPLS)
def test_sparse_training_step(benchmark, data, impl):
    """Forward + backward + SGD(momentum=0.9); numbapos sparse and lazy, torch dense."""
    _peer(impl)
    benchmark.group = "cuda_sparse_step"
    weight, ids, grad = data
    if impl == "numbapos":
        emb = nn.Embedding(VOCAB, DIM, sparse=True, _weight=weight.copy(), device="cuda")
        opt = optim.SGD(emb.parameters(), lr=0.1, momentum=0.9)
        i, g = numbapos.to_device(ids, "cuda"), numbapos.to_device(grad, "cuda")

        def step():
            emb(i)
            emb.backward(g)
            opt.step()
            emb.zero_grad()
    else:
        emb = torch.nn.Embedding.from_pretrained(torch.from_numpy(weight.copy()), freeze=False)
        emb = emb.cuda()
        opt = torch.optim.SGD(emb.parameters(), lr=0.1, momentum=0.9)
        i, g = torch.from_numpy(ids).cuda(), torch.from_numpy(grad).cuda()

        def step():
            opt.zero_grad()
            emb(i).backward(g)
            opt.step()
    _time(benchmark, step)


@pytest.mark.parametrize("impl", IMPLS)
def test_sinusoid(benchmark, impl):
    """The (8192, 768) float32 sinusoid table (torch: the usual arange/exp/sin/cos formula)."""
    _peer(impl)
    benchmark.group = "cuda_sinusoid"
    moved = 8192 * DIM * 4
    if impl == "numbapos":
        out = cuda.device_array((8192, DIM), np.float32)
        _time(benchmark, lambda: F.sinusoidal_pos_embedding(8192, DIM, out=out), moved)
    else:
        def table():
            pos = torch.arange(8192, device="cuda", dtype=torch.float32)[:, None]
            freq = torch.exp(torch.arange(0, DIM, 2, device="cuda", dtype=torch.float32)
                             * (-np.log(10000.0) / DIM))
            pe = torch.empty(8192, DIM, device="cuda")
            pe[:, 0::2] = torch.sin(pos * freq)
            pe[:, 1::2] = torch.cos(pos * freq)
            return pe
        _time(benchmark, table, moved)


BAG_VOCAB, BAG_DIM, BAGS, BAG_SIZE = 1_000_000, 128, 2048, 20
BAG_MODES = ["sum", "mean", "max"]


@pytest.fixture(scope="module")
def bag_data():
    """The recommender shape of issue 37: 2,048 bags of 20 ids from a 1e6 x 128 table."""
    rng = np.random.default_rng(1)
    weight = rng.normal(size=(BAG_VOCAB, BAG_DIM)).astype(np.float32)
    ids = rng.integers(0, BAG_VOCAB, size=BAGS * BAG_SIZE)
    offsets = np.arange(0, ids.size, BAG_SIZE)
    grad = rng.normal(size=(BAGS, BAG_DIM)).astype(np.float32)
    return weight, ids, offsets, grad


def _bag_reference(weight, ids, mode):
    rows = weight[ids].reshape(BAGS, BAG_SIZE, BAG_DIM)
    return {"sum": rows.sum(1), "mean": rows.mean(1), "max": rows.max(1)}[mode]


@pytest.mark.parametrize("mode", BAG_MODES)
@pytest.mark.parametrize("impl", IMPLS)
def test_bag_forward(benchmark, bag_data, impl, mode):
    """EmbeddingBag forward, 1-D ids with offsets (torch: F.embedding_bag)."""
    _peer(impl)
    benchmark.group = f"cuda_bag_forward_{mode}"
    weight, ids, offsets, _ = bag_data
    moved = ids.size * BAG_DIM * 4 + BAGS * BAG_DIM * 4
    if impl == "numbapos":
        w, i, o = (numbapos.to_device(a, "cuda") for a in (weight, ids, offsets))
        y = _time(benchmark, lambda: F.embedding_bag(i, w, o, mode=mode), moved)
        y = numbapos.to_host(y)
    else:
        w, i, o = (torch.from_numpy(a).cuda() for a in (weight, ids, offsets))
        with torch.no_grad():
            y = _time(benchmark, lambda: torch.nn.functional.embedding_bag(i, w, o, mode=mode),
                      moved).cpu().numpy()
    np.testing.assert_allclose(y, _bag_reference(weight, ids, mode), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", BAG_MODES)
@pytest.mark.parametrize("impl", IMPLS)
def test_bag_backward(benchmark, bag_data, impl, mode):
    """EmbeddingBag table gradient: sparse for sum and mean, dense for max (PyTorch has no
    sparse max); numbapos deterministic, torch its default kernels."""
    _peer(impl)
    benchmark.group = f"cuda_bag_backward_{mode}"
    weight, ids, offsets, grad = bag_data
    sparse = mode != "max"
    if impl == "numbapos":
        w, i, o, g = (numbapos.to_device(a, "cuda") for a in (weight, ids, offsets, grad))
        _time(benchmark, lambda: F.embedding_bag_backward(g, i, w, o, mode=mode, sparse=sparse))
    else:
        w = torch.from_numpy(weight).cuda().requires_grad_()
        i, o, g = (torch.from_numpy(a).cuda() for a in (ids, offsets, grad))

        def step():
            w.grad = None
            torch.nn.functional.embedding_bag(i, w, o, mode=mode, sparse=sparse).backward(g)
        _time(benchmark, step)


def _torch_bert(weights):
    word = torch.nn.Embedding.from_pretrained(torch.from_numpy(weights[0]), freeze=False)
    pos = torch.nn.Embedding.from_pretrained(torch.from_numpy(weights[1]), freeze=False)
    typ = torch.nn.Embedding.from_pretrained(torch.from_numpy(weights[2]), freeze=False)
    norm = torch.nn.LayerNorm(DIM, eps=1e-12)
    return [m.cuda() for m in (word, pos, typ, norm)]


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward_backward"])
@pytest.mark.parametrize("impl", IMPLS)
def test_bert_block(benchmark, data, impl, backward):
    """BertEmbeddings at BERT-base size, 32 x 128 tokens, dropout off (torch eager)."""
    _peer(impl)
    benchmark.group = f"cuda_bert_{'fwd_bwd' if backward else 'fwd'}"
    _, ids, grad = data
    block = nn.BertEmbeddings(VOCAB, DIM, seed=0, hidden_dropout_prob=0.0)
    if impl == "numbapos":
        block.to("cuda")
        i, g = numbapos.to_device(ids, "cuda"), numbapos.to_device(grad, "cuda")

        def step():
            y = block(i)
            if backward:
                block.backward(g)
                block.zero_grad()
            return y
    else:
        word, pos, typ, norm = _torch_bert([p.data for p in block.parameters()][:3])
        i, g = torch.from_numpy(ids).cuda(), torch.from_numpy(grad).cuda()
        positions = torch.arange(SEQ, device="cuda")[None]
        types = torch.zeros_like(i)

        def step():
            y = norm(word(i) + typ(types) + pos(positions))
            if backward:
                y.backward(g)
                for m in (word, pos, typ, norm):
                    m.zero_grad()
            return y
    _time(benchmark, step)


def _lookup_op(data):
    weight, ids, _ = data
    w, i = numbapos.to_device(weight, "cuda"), numbapos.to_device(ids, "cuda")
    out = cuda.device_array(ids.shape + (DIM,), np.float32)
    return lambda: F.embedding(i, w, out=out)


def _bert_forward_op(data):
    block = nn.BertEmbeddings(VOCAB, DIM, seed=0, hidden_dropout_prob=0.0).to("cuda")
    i = numbapos.to_device(data[1], "cuda")
    return lambda: block(i)


def _sparse_step_op(data):
    weight, ids, grad = data
    emb = nn.Embedding(VOCAB, DIM, sparse=True, _weight=weight.copy(), device="cuda")
    opt = optim.SGD(emb.parameters(), lr=0.1, momentum=0.9)
    i, g = numbapos.to_device(ids, "cuda"), numbapos.to_device(grad, "cuda")

    def step():
        emb(i)
        emb.backward(g)
        opt.step()
        emb.zero_grad()
    return step


@pytest.mark.parametrize("fast", [True, False], ids=["fast_launch", "ordinary_launch"])
@pytest.mark.parametrize("op", ["lookup", "bert_forward", "sparse_sgd_step"])
def test_launch_cost(benchmark, data, op, fast):
    """Host time to queue one op (no synchronisation inside the loop), and its launches."""
    from numbapos._gpuhost import launch

    benchmark.group = "cuda_launch_cost"
    fn = {"lookup": _lookup_op, "bert_forward": _bert_forward_op,
          "sparse_sgd_step": _sparse_step_op}[op](data)
    calls = 100

    def queue():
        for _ in range(calls):
            fn()

    with numbapos.config.override(cuda_fast_launch=fast):
        for _ in range(3):
            fn()
        _sync()
        before = launch.launches()
        fn()
        per_op = launch.launches() - before
        _sync()
        benchmark.pedantic(queue, rounds=5, iterations=1, warmup_rounds=1)
        _sync()
    host_us = benchmark.stats.stats.min / calls * 1e6
    benchmark.extra_info["launches"] = per_op
    benchmark.extra_info["host_us_per_op"] = round(host_us, 1)
    benchmark.extra_info["host_us_per_launch"] = round(host_us / max(per_op, 1), 1)


def _torch_adam_step(data, captured):
    """PyTorch's Embedding forward + backward + Adam (dense: its Adam takes no sparse
    gradients), eager or captured as a CUDA graph (PyTorch's whole-step recipe)."""
    weight, ids, grad = data
    emb = torch.nn.Embedding.from_pretrained(torch.from_numpy(weight.copy()), freeze=False)
    emb = emb.cuda()
    opt = torch.optim.Adam(emb.parameters(), lr=1e-3, capturable=captured)
    i, g = torch.from_numpy(ids).cuda(), torch.from_numpy(grad).cuda()

    def step():
        opt.zero_grad(set_to_none=True)
        emb(i).backward(g)
        opt.step()

    if not captured:
        return step
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        emb(i).backward(g)
        opt.step()
    return graph.replay


@pytest.mark.parametrize("mode", ["captured", "eager", "torch_captured", "torch_eager"])
def test_captured_step(benchmark, data, mode):
    """Sparse Embedding forward + backward + Adam, replayed as a CUDA graph or run eagerly
    (PyTorch: its dense Embedding and Adam, the same two ways)."""
    benchmark.group = "cuda_captured_step"
    if mode.startswith("torch"):
        _peer("torch")
        _time(benchmark, _torch_adam_step(data, mode == "torch_captured"))
        return
    weight, ids, grad = data
    emb = nn.Embedding(VOCAB, DIM, sparse=True, _weight=weight.copy(), device="cuda")
    opt = optim.Adam(emb.parameters(), lr=1e-3)
    i, g = numbapos.to_device(ids, "cuda"), numbapos.to_device(grad, "cuda")

    def step():
        y = emb(i)
        emb.backward(g)
        opt.step()
        emb.zero_grad()
        return y

    _time(benchmark, numbapos.cuda.capture(step).replay if mode == "captured" else step)
