"""Every ``@cuda.jit`` kernel the tests launch, compiled to PTX for real GPUs (no GPU needed).

Numba's CUDA simulator runs kernels as Python: it never types them and never
runs NVVM, so a kernel NVVM refuses passes every simulated test. This module
closes that gap in two steps.

1. Recording (in the test run, on the simulator): with ``PTX_SIGNATURES=path``
   set, ``tests/conftest.py`` calls :func:`install_recorder`, which notes each
   kernel launch's kernel and Numba argument types; at the end of the session
   :func:`save` merges them into ``path`` (each pytest-xdist worker its own, under
   a lock: the file ends with every worker's launches). A kernel made by a factory (a
   function that returns a ``@cuda.jit`` closure, such as the kernels
   specialised per dtype) is recorded with the factory and its arguments.
2. Compiling (``python tests/ptx_signatures.py path``, with the real
   ``numba.cuda`` and NVVM, which ``pip install "numba-cuda[cu12]"`` brings
   without a GPU): each recorded signature is compiled with
   ``cuda.compile_ptx`` for every target in :data:`TARGETS`, one process per
   target. Exit status 1 and each failure named when one does not compile.

numba-cuda's device-function compilation asks the current device for its
compute capability; without a GPU that fails, so the compiling process gives
it a stand-in device with the target's capability.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pickle
import subprocess
import sys
import traceback
from pathlib import Path

TARGETS = ((8, 0), (9, 0))

_records: set = set()


# ------------------------------------------------------------------ recording


def _ref(obj):
    """A picklable reference to a factory argument: dtypes by name, functions by path."""
    import numpy as np

    if isinstance(obj, (np.dtype, type)) and obj is not None:
        try:
            return ("dtype", np.dtype(obj).name)
        except TypeError:
            pass
    fn = getattr(obj, "fn", None) or getattr(obj, "py_func", None) or obj
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if module and qualname and "<locals>" not in qualname:
        return ("object", module, qualname)
    if isinstance(obj, (bool, int, float, str)) or obj is None:
        return ("value", obj)
    raise TypeError(f"cannot record a kernel factory argument of type {type(obj).__name__}")


def _factory_of(fn):
    """``(factory qualname, argument refs)`` for a kernel defined inside a factory, else None."""
    qualname = fn.__qualname__
    if ".<locals>." not in qualname:
        return None
    factory = qualname.rsplit(".<locals>.", 1)[0]
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if getattr(code, "co_qualname", code.co_name) == factory or (
                code.co_name == factory.rsplit(".", 1)[-1]
                and frame.f_globals.get("__name__") == fn.__module__):
            names = code.co_varnames[:code.co_argcount]
            return factory, tuple(_ref(frame.f_locals[name]) for name in names)
        frame = frame.f_back
    raise RuntimeError(f"kernel {qualname}: its factory's frame was not found")


def _host_value(arg):
    """``arg`` with each simulated device array, also inside a tuple (the kernels' records),
    as the NumPy array it wraps: typed as a GPU types its device array (the simulator's
    ``FakeCUDAArray`` types an empty array as layout 'A', a GPU as 'C')."""
    import numpy as np
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray

    if isinstance(arg, FakeCUDAArray):
        arg = arg._ary
    if isinstance(arg, np.ndarray) and not arg.flags.writeable:
        arg = arg.copy()  # device arrays are never read-only
    if isinstance(arg, tuple):
        members = [_host_value(member) for member in arg]
        return type(arg)(*members) if hasattr(arg, "_fields") else tuple(members)
    return arg


def _numba_type(arg):
    import numba

    return numba.typeof(_host_value(arg))


def install_recorder() -> None:
    """Record every kernel launch of Numba's CUDA simulator (call before kernels are made)."""
    from numba.cuda.simulator import kernel as simulator

    fake = simulator.FakeCUDAKernel
    if getattr(fake, "_ptx_recording", False):
        return
    original_init, original_call = fake.__init__, fake.__call__

    def __init__(self, fn, device, *args, **kwargs):
        original_init(self, fn, device, *args, **kwargs)
        self._ptx_factory = None if device else _factory_of(fn)

    def __call__(self, *args):
        if not self._device and not simulator._kernel_context:
            argtypes = tuple(_numba_type(a) for a in args)
            _records.add((self.fn.__module__, self.fn.__qualname__, self._ptx_factory, argtypes))
        return original_call(self, *args)

    fake.__init__, fake.__call__ = __init__, __call__
    fake._ptx_recording = True


@contextlib.contextmanager
def _locked(path):
    """Hold an exclusive lock on ``path``'s lock file (``path.lock``): one process at a time
    reads, merges and writes ``path``."""
    import fcntl

    with open(f"{path}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def save(path) -> int:
    """Write the recorded signatures to ``path`` (merged with any already there); returns
    how many there are.

    Several processes may save to one path (the pytest-xdist workers, each recording
    the launches of its own tests): the read, merge and write happen under a lock,
    so no process's records overwrite another's, and the file is replaced whole.
    """
    path = Path(path)
    with _locked(path):
        records = set(_records)
        if path.exists():
            records |= pickle.loads(path.read_bytes())
        partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        partial.write_bytes(pickle.dumps(records))
        os.replace(partial, path)
    return len(records)


# ------------------------------------------------------------------ compiling


def _resolve_ref(ref):
    import numpy as np

    kind = ref[0]
    if kind == "dtype":
        return np.dtype(ref[1])
    if kind == "object":
        target = importlib.import_module(ref[1])
        for part in ref[2].split("."):
            target = getattr(target, part)
        return target
    return ref[1]


def _kernel(module_name, qualname, factory):
    module = importlib.import_module(module_name)
    if factory is None:
        target = module
        for part in qualname.split("."):
            target = getattr(target, part)
        return target
    factory_name, refs = factory
    make = module
    for part in factory_name.split("."):
        make = getattr(make, part)
    kernel = make(*(_resolve_ref(r) for r in refs))
    if kernel.py_func.__qualname__ != qualname:
        raise RuntimeError(f"{factory_name}{refs} made {kernel.py_func.__qualname__}, "
                           f"not {qualname}")
    return kernel


def _stand_in_device(cc):
    """Let numba-cuda compile device functions for ``cc`` without a GPU."""
    from numba.cuda import dispatcher

    class Device:
        compute_capability = cc

    dispatcher.get_current_device = lambda: Device()


def compile_all(records, cc) -> list[str]:
    """Compile every record for ``cc``; the failures, each with its error."""
    from numba import cuda

    _stand_in_device(cc)
    failures = []
    for module_name, qualname, factory, argtypes in sorted(records, key=repr):
        name = f"{module_name}.{qualname}{'' if factory is None else factory[1]}{argtypes}"
        try:
            kernel = _kernel(module_name, qualname, factory)
            cuda.compile_ptx(kernel.py_func, argtypes, cc=cc)
        except Exception as err:  # noqa: BLE001 - every failure is reported
            failures.append(f"{name}: {type(err).__name__}: {err}")
            if os.environ.get("PTX_TRACEBACKS"):
                traceback.print_exc()
    return failures


def never_launched(records) -> list[str]:
    """Module-level kernels of ``numbapos.kernels.cuda`` that no recorded test launched."""
    from numba.cuda.dispatcher import CUDADispatcher

    backend = importlib.import_module("numbapos.kernels.cuda")
    launched = {(m, q) for m, q, _, _ in records}
    missing = []
    for area in backend.AREAS:
        for obj in vars(area).values():
            if (isinstance(obj, CUDADispatcher) and not obj.targetoptions.get("device")
                    and obj.py_func.__module__ == area.__name__
                    and (area.__name__, obj.py_func.__qualname__) not in launched):
                missing.append(f"{area.__name__}.{obj.py_func.__qualname__}")
    return sorted(set(missing))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("signatures", help="the file PTX_SIGNATURES named in the test run")
    parser.add_argument("--cc", help="one target as MAJOR.MINOR (default: each of TARGETS, "
                                     "in a process of its own)")
    parser.add_argument("--only-recorded", action="store_true",
                        help="do not fail for numbapos kernels no test launched")
    args = parser.parse_args(argv)
    records = pickle.loads(Path(args.signatures).read_bytes())
    if not records:
        print("ptx: no kernel launches were recorded")
        return 1
    if args.cc is None:
        status = 0
        for major, minor in TARGETS:
            env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0")
            done = subprocess.run([sys.executable, __file__, args.signatures,
                                   "--cc", f"{major}.{minor}",
                                   *(["--only-recorded"] if args.only_recorded else [])], env=env)
            status = status or done.returncode
        return status
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        print("ptx: NUMBA_ENABLE_CUDASIM=1: the simulator cannot compile to PTX")
        return 1
    cc = tuple(int(part) for part in args.cc.split("."))
    failures = compile_all(records, cc)
    if not args.only_recorded:
        failures += [f"{name}: no test launched it" for name in never_launched(records)]
    kernels = len({(m, q, f) for m, q, f, _ in records})
    for failure in failures:
        print(f"FAILED sm_{cc[0]}{cc[1]}: {failure}")
    print(f"ptx sm_{cc[0]}{cc[1]}: {len(records)} signatures of {kernels} kernels: "
          f"{len(records) - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    # Kernels defined in test modules (tests/<area>/test_*.py) are imported by module name.
    sys.path[1:1] = [str(folder) for folder in sorted(Path(__file__).resolve().parent.iterdir())
                     if folder.is_dir() and any(folder.glob("test_*.py"))]
    sys.exit(main())
