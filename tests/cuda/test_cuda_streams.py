"""Streams (issue 19, item 6): every launch, allocation and copy on numbapos's current stream.

On Numba's CUDA simulator (which has stream objects but runs everything in
order): ops under ``numbapos.cuda.stream(s)`` give the same bits as without,
every kernel they launch is configured with ``s``, contexts nest and restore,
external stream objects are accepted by protocol, and bad objects raise
TypeError naming ``stream``. The allocator's per-stream pools and the launch
helper's structure are checked without a GPU.
"""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest

import numbapos
import numbapos.functional as F
from numbapos import nn, optim

pytestmark = pytest.mark.skipif(not numbapos.cuda_available(),
                                reason="needs CUDA or its simulator")

CUDA_KERNELS = pathlib.Path(numbapos.__file__).parent / "kernels" / "cuda"


def _simulated() -> bool:
    from numba import config

    return bool(config.ENABLE_CUDASIM)


def _train_step(ids, seed=0):
    """A sparse Embedding forward, backward and SGD(momentum) step on the GPU; host results."""
    rng = np.random.default_rng(seed)
    emb = nn.Embedding(9, 5, sparse=True, device="cuda")
    emb.weight.data.copy_to_device(rng.standard_normal((9, 5)).astype(np.float32))
    opt = optim.SGD(emb.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        y = emb(ids)
        emb.backward(numbapos.to_device(np.ones(y.shape, np.float32), "cuda"))
        opt.step()
        emb.zero_grad()
    return numbapos.to_host(y), numbapos.to_host(emb.weight.data)


@pytest.fixture
def launched_streams(monkeypatch):
    """The stream of every kernel launch configured while the test runs (simulator only)."""
    if not _simulated():
        pytest.skip("spies on the simulator's kernel configuration")
    from numba.cuda.simulator import kernel as sim_kernel

    seen = []
    original = sim_kernel.FakeCUDAKernel.__getitem__

    def __getitem__(self, configuration):
        seen.append(configuration[2] if len(configuration) > 2 else 0)
        return original(self, configuration)

    monkeypatch.setattr(sim_kernel.FakeCUDAKernel, "__getitem__", __getitem__)
    return seen


def test_ops_on_a_stream_give_the_same_bits_and_launch_there(launched_streams):
    from numba import cuda

    ids = numbapos.to_device(np.array([[1, 4, 4], [0, 8, 1]]), "cuda")
    expected = _train_step(ids)
    assert launched_streams and not any(launched_streams)  # the legacy default stream
    launched_streams.clear()
    s = cuda.stream()
    with numbapos.cuda.stream(s) as chosen:
        assert chosen is s and numbapos.cuda.current_stream() is s
        got = _train_step(ids)
    assert launched_streams and all(x is s for x in launched_streams)
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_array_equal(a, b)


def test_contexts_nest_and_restore():
    from numba import cuda

    a, b = cuda.stream(), cuda.stream()
    assert numbapos.cuda.current_stream() == 0
    with numbapos.cuda.stream(a):
        with numbapos.cuda.stream(b):
            assert numbapos.cuda.current_stream() is b
            with numbapos.cuda.stream(None):
                assert numbapos.cuda.current_stream() == 0
            assert numbapos.cuda.current_stream() is b
        assert numbapos.cuda.current_stream() is a
        with pytest.raises(ValueError), numbapos.cuda.stream(b):
            raise ValueError("restored on the way out of an error too")
        assert numbapos.cuda.current_stream() is a
    assert numbapos.cuda.current_stream() == 0


def test_the_current_stream_is_per_thread():
    from numba import cuda

    seen = []
    with numbapos.cuda.stream(cuda.stream()):
        worker = threading.Thread(target=lambda: seen.append(numbapos.cuda.current_stream()))
        worker.start()
        worker.join()
    assert seen == [0]


class _ProtocolStream:
    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


class _CupyLike:
    ptr = 12345


class _TorchLike:
    cuda_stream = 23456


@pytest.mark.parametrize("make", [lambda: _ProtocolStream(4242), _CupyLike, _TorchLike],
                         ids=["__cuda_stream__", "cupy_ptr", "torch_cuda_stream"])
def test_external_stream_objects_are_accepted(make, launched_streams):
    ids = numbapos.to_device(np.array([3, 1, 3]), "cuda")
    weight = numbapos.to_device(np.arange(20, dtype=np.float32).reshape(4, 5), "cuda")
    expected = numbapos.to_host(F.embedding(ids, weight))
    launched_streams.clear()
    with numbapos.cuda.stream(make()) as chosen:
        got = numbapos.to_host(F.embedding(ids, weight))
    assert chosen != 0 and launched_streams and all(x is chosen for x in launched_streams)
    np.testing.assert_array_equal(got, expected)
    with numbapos.cuda.stream(make()) as again:
        assert again is chosen  # one simulated stream per external handle


@pytest.mark.parametrize("bad, match", [
    (7, "stream: expected a CUDA stream.*got int 7"),
    ("s1", "stream: expected a CUDA stream.*got str"),
    (np.zeros(2), "stream: expected a CUDA stream.*got ndarray"),
])
def test_bad_stream_objects_raise_type_error_naming_the_argument(bad, match):
    with pytest.raises(TypeError, match=match), numbapos.cuda.stream(bad):
        pass
    assert numbapos.cuda.current_stream() == 0


def test_a_bad_cuda_stream_protocol_answer_is_refused():
    class Broken:
        def __cuda_stream__(self):
            return "not a pair"

    with pytest.raises(TypeError, match=r"stream: __cuda_stream__\(\) must return"), \
            numbapos.cuda.stream(Broken()):
        pass


def test_allocator_pools_keep_blocks_on_their_stream():
    from numbapos._gpuhost.memory import StreamPools

    pools = StreamPools()
    pools.give(1, 512, "block-a")
    assert pools.take(2, 512) is None  # another stream never gets it
    assert pools.take(0, 512) is None
    assert pools.take(1, 1024) is None  # nor another size
    assert pools.cached() == 1
    assert pools.take(1, 512) == "block-a"
    assert pools.take(1, 512) is None
    pools.give(3, 512, "block-b")
    pools.clear()
    assert pools.cached() == 0


def test_every_launch_of_the_cuda_backend_goes_through_the_launch_helper():
    direct = []
    for path in sorted(CUDA_KERNELS.glob("*.py")):
        if path.name == "launch.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                direct.append(f"{path.name}:{node.lineno}")
    assert not direct, f"kernels launched as kernel[grid, block](...): {direct}"


def test_the_fast_launch_internals_exist_in_the_installed_numba_cuda():
    # The fast path (_gpuhost/fastlaunch.py) uses numba-cuda internals; the cuda
    # extra pins the minor versions, and this fails when an upgrade moves them. Checked
    # against the real numba.cuda (no GPU needed to import it), not the simulator's.
    code = (
        "import numpy as np\n"
        "from numba.cuda.typing.typeof import Purpose, typeof\n"
        "from numbapos._args import AdamHyper, DropoutArgs, TiledIds\n"
        "from numbapos._gpuhost import fastlaunch\n"
        "values = [True, 2.5, 7, np.int64(3), np.float32(1), np.uint64(9),\n"
        "          AdamHyper(*[np.float32(0.5)] * 8, False, True, False),\n"
        "          (np.int64(1), np.int64(2)), TiledIds(np.zeros(2, np.int64), 0, 2),\n"
        "          DropoutArgs(*[np.uint64(1)] * 3, np.float32(2), True, np.zeros(0, np.uint64))]\n"
        "for value in values * 2:  # the second time from the cache\n"
        "    assert fastlaunch._type_of(value) == typeof(value, Purpose.argument), value\n"
        "print(fastlaunch.supported(), fastlaunch.ENABLED)\n")
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["True", "True"]


def test_the_fast_launch_is_off_on_the_simulator():
    from numbapos._gpuhost import fastlaunch

    assert fastlaunch.ENABLED is (not _simulated())


def test_the_fast_launch_resolves_each_signature_once_and_falls_back_otherwise(monkeypatch):
    # The fast path runs only on a real GPU; its bookkeeping is checked here with
    # stand-ins for Numba's dispatcher, compiled kernel, typing and stream conversion.
    from numbapos._gpuhost import fastlaunch

    launched = []

    class Compiled:
        debug = False
        launch_config_sensitive = False

        def launch(self, args, griddim, blockdim, stream, sharedmem):
            launched.append((args, griddim, blockdim, stream, sharedmem))

    class Dispatcher:
        def __init__(self):
            self.overloads = {}

    # Interned stand-ins for Numba's types (which Numba interns: one object per type).
    monkeypatch.setattr(fastlaunch, "_type_of", lambda value: sys.intern(type(value).__name__))
    monkeypatch.setattr(fastlaunch, "_core_stream", lambda stream: ("core", stream))
    monkeypatch.setattr(fastlaunch, "_compiled", {})
    kernel = Dispatcher()
    assert not fastlaunch.launch(kernel, 4, 32, 0, (1, 2.0))  # not compiled yet: ordinary
    kernel.overloads[("int", "float")] = compiled = Compiled()
    assert fastlaunch.launch(kernel, 4, 32, 0, (1, 2.0))
    assert launched == [((1, 2.0), (4, 1, 1), (32, 1, 1), ("core", 0), 0)]
    kernel.overloads.clear()  # resolved once: the cache answers from now on
    assert fastlaunch.launch(kernel, (2, 3), (8, 4, 1), "s", (5, 6.0))
    assert launched[-1] == ((5, 6.0), (2, 3, 1), (8, 4, 1), ("core", "s"), 0)
    assert not fastlaunch.launch(kernel, 1, 1, 0, (1, 2))  # another signature: ordinary
    kernel.overloads[("int", "int")] = debug = Compiled()
    debug.debug = True  # kernels compiled with debug=True check errors after launch
    assert not fastlaunch.launch(kernel, 1, 1, 0, (1, 2))
    assert len(launched) == 2 and compiled is not debug


_ALLOCATOR_SCRIPT = r'''
import contextlib
import gc
from numbapos._gpuhost import memory, streams

manager_class = memory._manager_class()
made = []


class Block:  # what the driver would allocate: a device pointer
    def __init__(self, size):
        self.device_pointer = (1 << 30) + len(made) * (1 << 20)
        made.append(size)


manager_class.__mro__[1].memalloc = lambda self, size: Block(size)


class Context:
    pass


class Stream:
    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


context = Context()
manager = manager_class(context=context)
relaxed = []


@contextlib.contextmanager
def relaxed_capture_mode():  # no driver here: record that the allocator asked for it
    relaxed.append("relaxed")
    yield
    relaxed.append("restored")


streams.relaxed_capture_mode = relaxed_capture_mode


def alloc(size=1000):
    return manager.memalloc(size)


def address(pointer):
    return int(pointer.device_pointer)


a = alloc()
first = address(a)
del a
gc.collect()
assert address(alloc()) == first, "a freed block is reused on its stream"
gc.collect()
side = Stream(77)
with streams.using(side):
    b = alloc()
    assert address(b) != first, "another stream never gets a block freed on the default one"
    warm = address(b)
    del b
    gc.collect()
capture = streams.Capture(Stream(78), side)
with streams.capture_state(capture):
    c = alloc()
    assert address(c) == warm, "a capture takes the blocks its warm-up left"
    del c
    gc.collect()
    d = alloc()
    assert address(d) == warm, "and reuses its own freed blocks"
    before = len(made)
    e = alloc()  # none cached: from the driver, with the capture mode relaxed around it
    assert len(made) == before + 1 and relaxed == ["relaxed", "restored"], relaxed
    fresh = address(e)
    del e
    gc.collect()
    assert address(alloc()) == fresh, "a block made while capturing is the capture's"
del d
gc.collect()
with streams.using(side):
    f, g = alloc(), alloc()
    got = {address(f), address(g)}
    assert not got & {warm, fresh}, "a block the graph uses is never handed out again"
print("ok", len(made))
'''


def test_the_allocator_keeps_blocks_on_their_stream_and_the_capture_s_blocks_apart(tmp_path):
    # The caching manager needs the real numba.cuda (no GPU: the driver's allocation is
    # stood in for), so it runs in a process without the simulator.
    assert _run_without_simulator(tmp_path, _ALLOCATOR_SCRIPT) == ["ok", "5"]


def _run_without_simulator(tmp_path, code: str) -> list:
    """Run ``code`` as a script with the real numba.cuda (no GPU needed); its output's words."""
    script = tmp_path / "script.py"
    script.write_text(code)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0",
           "PYTHONPATH": os.pathsep.join([str(CUDA_KERNELS.parents[2]),
                                          os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.split()


_PACKING_SCRIPT = r'''
import ctypes
import struct
from types import SimpleNamespace

import numpy as np
from numba.cuda import dispatcher
from numba.cuda.cudadrv.devicearray import DeviceNDArray
from numba.cuda.typing.typeof import Purpose, typeof

from numbapos._args import AdamHyper
from numbapos._gpuhost import fastlaunch


class Memory:  # a device allocation at a made-up address (no GPU here)
    def __init__(self, address):
        self.address = address

    @property
    def device_ctypes_pointer(self):
        return ctypes.c_size_t(self.address)


def device(shape, strides, dtype, address):
    return DeviceNDArray(shape, strides, np.dtype(dtype), gpu_data=Memory(address))


table = device((5, 8), (32, 4), np.float32, 1 << 33)
column = device((5, 2), (32, 12), np.float32, (1 << 33) + 4)  # a strided view
scalar = device((), (), np.uint16, 3 << 40)
rows = device((7,), (8,), np.int64, 5 << 36)
args = (table, True, np.bool_(False), 7, np.int32(-3), np.uint64(2**63 + 5), np.float32(1.5),
        2.25, np.float16(0.1), np.uint8(200), np.int16(-7), column, scalar,
        AdamHyper(*[np.float32(0.5 + i) for i in range(8)], False, True, False),
        (rows, rows, np.int64(4)))
argtypes = tuple(typeof(value, Purpose.argument) for value in args)

# What numba-cuda's own launch passes: its flattened arguments, as the bytes a
# parameter of each one's size holds (Python ints are pointer-sized, bools one byte).
class Kernel:  # numba-cuda's argument flattening, without a compiled kernel
    extensions = []
    _prepare_args = dispatcher._Kernel._prepare_args


expected = []
for ty, value in zip(argtypes, args):
    flat = []
    Kernel()._prepare_args(ty, value, 0, [], flat)
    for item in flat:
        if isinstance(item, (bool, np.bool_)):
            expected.append(struct.pack("?", item))
        elif isinstance(item, int):
            expected.append(struct.pack("q", item))
        else:
            expected.append(bytes(item))

launched = []


class Driver:  # the bindings' calls the packed launch makes, recording what it passes
    CUresult = SimpleNamespace(CUDA_SUCCESS=0)

    @staticmethod
    def cuCtxGetCurrent():
        return 0, 1234

    @staticmethod
    def cuLaunchKernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        pointers = (ctypes.c_void_p * len(expected)).from_address(params)
        launched.append(((function, gx, gy, gz, bx, by, bz, shared, stream, extra),
                         [ctypes.string_at(pointers[i], len(want))
                          for i, want in enumerate(expected)]))
        return (0,)


ordinary = []


class Compiled:
    debug = cooperative = False
    extensions = []
    _codelibrary = SimpleNamespace(get_cufunc=lambda: SimpleNamespace(handle="function"))

    def launch(self, args, griddim, blockdim, stream, sharedmem):
        ordinary.append(args)


class Dispatcher:
    def __init__(self):
        self.overloads = {argtypes: Compiled()}


class Stream:
    def __cuda_stream__(self):
        return (0, 77)


kernel = Dispatcher()
fastlaunch._core_stream = lambda stream: stream
fastlaunch._cuda_driver = lambda: Driver
fastlaunch._compiled.clear()
assert fastlaunch.launch(kernel, (3, 2), 64, Stream(), args)
assert type(fastlaunch._compiled[kernel, tuple(map(id, argtypes))]) is fastlaunch._Direct
assert fastlaunch.launch(kernel, 4, (32, 2), 0, args)  # the cached signature
assert len(launched) == 2 and not ordinary
for (call, params), grid, block, stream in zip(launched, [(3, 2, 1), (4, 1, 1)],
                                                [(64, 1, 1), (32, 2, 1)], [77, 0]):
    assert call == ("function", *grid, *block, 0, stream, 0), call
    assert params == expected, (params, expected)
# An argument that is not device memory (Numba copies a host array): its own launch.
host = args[:11] + (np.zeros((5, 6), np.float32)[:, ::3],) + args[12:]
assert fastlaunch.launch(kernel, 1, 1, 0, host)
assert len(launched) == 2 and len(ordinary) == 1
# A type the packing does not cover (a complex scalar): the compiled kernel's launch.
odd_types = argtypes + (typeof(1j, Purpose.argument),)
kernel.overloads = {odd_types: Compiled()}
assert fastlaunch.launch(kernel, 1, 1, 0, args + (1j,))
assert type(fastlaunch._compiled[kernel, tuple(map(id, odd_types))]) is Compiled
print("ok", len(expected))
'''


def test_the_fast_launch_packs_parameters_as_numba_cuda_does(tmp_path):
    # Without a GPU: device arrays at made-up addresses, and the driver's calls stood in
    # for. The packed parameters must be byte for byte what numba-cuda's launch passes.
    pytest.importorskip("cuda.bindings.driver")
    assert _run_without_simulator(tmp_path, _PACKING_SCRIPT) == ["ok", "59"]


_EMPTY_SCRIPT = r'''
import ctypes

import numpy as np

from numbapos.kernels.cuda import arrays, errors

asked = []


class Memory:  # a device allocation at a made-up address (no GPU here)
    device_ctypes_pointer = ctypes.c_size_t(1 << 30)


class Context:  # the current context: its memory manager serves the allocation
    def memalloc(self, size):
        asked.append(size)
        return Memory()


errors.current_context = Context
table = arrays.empty((3, 5), np.float32)
assert (table.shape, table.strides, table.dtype, asked) == ((3, 5), (20, 4), np.float32, [60])
ids = arrays.empty(7, "int64")
assert (ids.shape, ids.strides, ids.dtype, asked[-1]) == ((7,), (8,), np.int64, 56)
print("ok", len(asked))
'''


def test_empty_allocates_from_the_current_context_as_numba_does(tmp_path):
    # On a GPU arrays.empty builds the device array itself, from the context that
    # errors.current_context found (Numba's device_array looks it up twice more).
    assert _run_without_simulator(tmp_path, _EMPTY_SCRIPT) == ["ok", "2"]
