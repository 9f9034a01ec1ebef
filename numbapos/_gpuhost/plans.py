"""Plans: an op's launches resolved once per call signature, then replayed with new pointers.

An eager op spends most of its host time deciding things that only depend on
its arguments' metadata: which checks pass, which kernel variant and launch
geometry to use, how to pack each kernel's parameters. A :class:`PlanCache`
(one per op) does that once per **call signature** — the op's static options,
each array's Numba type (dtype, rank, layout), shape, strides and pointer
alignment, the CUDA context and numbapos's current stream — by running the op's
ordinary path once while recording its launches (:func:`recording`). The
recorded launches become a :class:`Plan`: for each kernel its function handle,
grid, block and a parameter block packed with every value, and the places
(slots) where a parameter is the data pointer of one of the op's arrays (or a
fixed offset into it). A later call with the same signature looks the plan up,
checks what depends on pointers (an ``out=`` that overlaps an input, the
deferred error word), allocates its outputs, patches the slots and launches.

What may be planned is decided by each op (its cache's ``call``): only a path
whose launches depend on nothing but the signature — every scalar it passes to
a kernel derives from metadata and options, every array it passes is one of
the op's arrays, a view at a fixed offset of one, or an array made once per
context (the error word, :func:`.arrays.absent`, marked :func:`persistent`).
A recording that saw anything else (a scratch array, a launch the fast path
does not pack, a launch through the ordinary path while a signature compiles)
builds no plan, and the op keeps its ordinary path for that signature until a
later recording succeeds.

Bounds and safety. Each op's cache holds at most :data:`MAX_PLANS` plans and
is emptied when full (signatures rarely change in a training loop; a fresh
one costs one ordinary call). A plan keeps its scratch arrays in one
workspace block of its own (at most :data:`MAX_WORKSPACE` bytes: a call that
needs more stays ordinary), and all plans' workspaces together at most
:data:`WORKSPACE_BUDGET` bytes: a plan that would pass it empties every cache
first (varying shapes, such as dynamic padding, make many signatures);
``numbapos.cuda_empty_cache()`` drops every plan before it empties the pool.
The key holds the context and the stream, so a new context, device or stream
never meets another's plan. Two threads may
call one plan: packing and launching happen under the plan's lock
(``cuLaunchKernel`` copies the parameters before it returns). Plans are used
only where :mod:`.fastlaunch` is (a real GPU, or the stub driver of the
host-cost tests, with ``cuda_fast_launch`` on), never while a step is
captured or with ``cuda_sync_checks``, and never while an error is pending
(the ordinary path raises it). :func:`clear` drops every plan.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import struct
import threading
import weakref

import numpy as np

from .. import config as settings
from . import errors, fastlaunch, streams

__all__ = []  # not launchers

MAX_PLANS = 256  # per op
MAX_WORKSPACE = 64 << 20  # bytes of scratch a plan may keep; larger calls stay ordinary
WORKSPACE_BUDGET = 256 << 20  # bytes all plans' workspaces may hold together
_held = [0]  # bytes the plans' workspaces hold now

class _Local(threading.local):
    record = None  # the recording in progress in this thread (a class default: a fast read)


_local = _Local()
_caches: list = []  # every PlanCache, for clear()
_POINTER = struct.Struct("@Q")
LAUNCHES = [0]  # kernels launched in this process, planned or not (see .launch.launches)


def persistent(array):
    """Mark ``array`` (made once per context) as one a plan may keep; returns it."""
    array._numbapos_persistent = True
    return array


class _Recording:
    """What one ordinary call did: its launches and the device arrays it allocated."""

    __slots__ = ("launches", "allocations", "unplaceable")

    def __init__(self):
        self.launches: list = []  # (kernel, blocks, threads, stream, args)
        self.allocations: list = []  # arrays made by .arrays.empty, in order
        self.unplaceable = False  # an allocation a plan cannot place (an empty one)


@contextlib.contextmanager
def recording():
    """Record every launch and allocation in this thread (see :class:`_Recording`)."""
    record = _Recording()
    outer = _local.record
    _local.record = record
    try:
        yield record
    finally:
        _local.record = outer


def note_launch(kernel, blocks, threads, stream, args) -> None:
    """Called by :func:`.launch.launch` for every launch: kept while recording."""
    record = _local.record
    if record is not None:
        record.launches.append((kernel, blocks, threads, stream, args))


def note_allocation(array) -> None:
    """Called by :func:`.arrays.empty` for every array it makes; None for one no plan can
    place (an empty array's null pointer, a copy of host data)."""
    record = _local.record
    if record is not None:
        if array is None:
            record.unplaceable = True
        else:
            record.allocations.append(array)


def clear() -> None:
    """Forget every plan of every op (their workspaces go back to the pool)."""
    for cache in _caches:
        cache.plans.clear()
    _held[0] = 0


def _described(x):
    """``(signature, pointer, first byte, end byte)`` of a Numba device array, worked out
    once per array object (its metadata never changes); None for anything else."""
    if type(x) is not _DEVICE_ARRAY[0]:
        if _DEVICE_ARRAY[0] is not None:
            return None
        _DEVICE_ARRAY[0] = _device_array_type()
        return _described(x)
    try:
        return x._numbapos_plan
    except AttributeError:
        pass
    fields = fastlaunch._array_fields(x)
    pointer = fields[4]
    span = _span(x.shape, x.strides, x.dtype.itemsize)
    # A DeviceNDArray's Numba type follows from these (its layout from shape and strides).
    signature = interned((x.dtype, x.shape, x.strides, pointer & 15))
    found = x._numbapos_plan = (signature, pointer, pointer + span[0], pointer + span[1])
    return found


_INTERNED: dict = {}  # (dtype, shape, strides, alignment) -> its number (see interned)
_NUMBERS = itertools.count()
MAX_SIGNATURES = 4096  # numbered signatures kept; past it the table starts over


def interned(signature: tuple) -> int:
    """The number of an array's ``signature``: one number per signature, never reused for
    another, so a plan key holds numbers (hashed several times faster than dtypes and
    shape tuples: about 1 us per BERT block call). When the table is full it starts over
    with new numbers; arrays numbered before keep theirs, which still name only their
    signature (their calls may build a plan of their own, never use another's)."""
    number = _INTERNED.get(signature)
    if number is None:
        if len(_INTERNED) >= MAX_SIGNATURES:
            _INTERNED.clear()
        number = _INTERNED.setdefault(signature, next(_NUMBERS))
    return number


def signature(x):
    """The part of a plan's key that a Numba device array gives (the number of its dtype,
    shape, strides and the alignment of its pointer, see :func:`interned`); None for
    anything else."""
    found = _described(x)
    return None if found is None else found[0]


_DEVICE_ARRAY = [None]  # Numba's DeviceNDArray, once imported


def _device_array_type():
    try:
        from numba.cuda.cudadrv.devicearray import DeviceNDArray
    except ImportError:  # Numba's simulator, whose arrays no plan describes
        return _NoDeviceArray
    return DeviceNDArray


class _NoDeviceArray:
    """Stands for Numba's DeviceNDArray where there is none (the simulator)."""


def _span(shape, strides, itemsize) -> tuple:
    low = high = 0
    for extent, stride in zip(shape, strides, strict=True):
        if extent == 0:
            return 0, 0
        reach = (extent - 1) * stride
        if reach < 0:
            low += reach
        else:
            high += reach
    return low, high + itemsize


class _Step:
    """One kernel of a plan: its parameters packed, with slots for the op's pointers."""

    __slots__ = ("function", "grid", "block", "buffer", "address", "slots", "format", "_keep")

    def __init__(self, direct, function, blocks, threads, values, slots):
        self.function = function
        self.grid, self.block = fastlaunch._dim3(blocks), fastlaunch._dim3(threads)
        self.format = direct.format
        self.buffer = ctypes.create_string_buffer(len(direct.buffer))
        struct.pack_into(direct.format, self.buffer, 0, *values)
        base = ctypes.addressof(self.buffer)
        pointers = (ctypes.c_void_p * len(direct.pointers))(
            *(base + offset for offset in direct.offsets))
        self.address = ctypes.addressof(pointers)
        self.slots = slots  # ((byte offset, which array, byte delta), ...)
        self._keep = pointers  # the pointer array must live as long as the step


class Plan:
    """An op's launches for one call signature (see the module notes)."""

    __slots__ = ("steps", "host_word", "outputs", "avoid", "lock", "keep", "layout",
                 "workspace", "table", "made", "sizes", "context", "patches", "packed")

    def __init__(self, steps, host_word, outputs, avoid, keep):
        # ``keep`` holds what the packed parameters point into for the plan's life: the
        # persistent arrays and the workspace that replaces the recorded call's scratch.
        self.steps = steps
        self.host_word = host_word
        # (context, size of each block the outputs live in, ((position among the op's
        # arrays, its ArrayFactory, its block, byte offset in it or None: the block), ...),
        # whether slots name the blocks themselves)
        self.outputs = outputs
        self.avoid = avoid  # ((given output, input), ...) that must not overlap
        self.lock = threading.Lock()
        self.keep = keep
        self.layout = None  # how an unpacked result is made of its arrays (PlanCache.call)
        # The steps as fastlaunch.native_launcher's launch table.
        self.table = np.array([(int(step.function), *step.grid, *step.block, step.address)
                               for step in steps], np.uint64).reshape(len(steps), 8)
        workspace = keep[0] if keep else None
        self.workspace = workspace.size if workspace is not None else 0  # bytes it holds
        # What run() does per call, worked out once: each output's factory fields and
        # place, and every slot as (buffer, byte offset, which pointer, byte delta).
        context, sizes, made, _ = outputs
        self.context, self.sizes = context, sizes
        # An output at the start of its block takes the block itself as its memory, as an
        # output that is a whole block does (its data pointer is the block's; only the
        # memory's size, never read for an array, is the block's): no view per call.
        self.made = tuple((position, base, offset or None, factory.nbytes, factory.cls,
                           factory.state, factory.head, factory.tail,
                           (factory.signature, factory.low, factory.high))
                          for position, factory, base, offset in made)
        # The slots grouped by the pointer they take, with the pointer each group last
        # packed (under the lock): a pointer the same as last call's is not packed again.
        slots: dict = {}
        for step in steps:
            for offset, which, delta in step.slots:
                slots.setdefault(which, []).append((step.buffer, offset, delta))
        self.patches = tuple((which, tuple(found)) for which, found in slots.items())
        self.packed = [None] * len(self.patches)

    def run(self, arrays: list, stream: int, native=None):
        """Launch on new arrays of the plan's signature; False where the ordinary path must
        run instead (an overlap it reports, an error now pending). ``native``: the
        setting ``cuda_native_launch`` (read by the caller), None to read it here."""
        if self.host_word[0] != _NO_ERROR:
            return False
        for output, source in self.avoid:
            a, b = arrays[output]._numbapos_plan, arrays[source]._numbapos_plan
            if a[2] < b[3] and b[2] < a[3]:
                return False
        starts = None
        if self.sizes:
            # Every output lives in one block or a few (the recorded call's allocations);
            # the arrays and views on them are made here, attributes set directly
            # (fastlaunch.ArrayFactory and memory_view, inline: no call per output).
            memalloc = self.context.memory_manager.memalloc  # Context.memalloc's own call
            blocks, starts = [], []  # loops, not comprehensions: no call of their own
            for size in self.sizes:
                block = memalloc(size)
                blocks.append(block)
                starts.append(int(block.device_pointer))  # device_pointer_value, no call
            view_cls, _, direct = _VIEW[0] if fastlaunch._VIEW else _view()
            for (position, base, offset, nbytes, cls, state, head, tail,
                 (signature, low, high)) in self.made:
                memory, pointer = blocks[base], starts[base]
                if offset is not None:  # a view into the block, which it keeps alive
                    pointer += offset
                    if direct:
                        view = view_cls.__new__(view_cls)
                        # Dicts built, then assigned (here and below): cheaper than update().
                        fields = {"context": memory.context, "_numbapos_address": pointer,
                                  "size": nbytes, "_cuda_memsize_": nbytes,
                                  "is_managed": False, "refct": 1, "_owner": memory}
                        view.__dict__ = fields
                        memory = view
                    else:
                        memory = fastlaunch.memory_view(memory, offset, nbytes, pointer)
                array = cls.__new__(cls)
                fields = state.copy()
                fields["gpu_data"] = memory
                fields["_numbapos_launch_fields"] = (*head, pointer, *tail)
                fields["_numbapos_plan"] = (signature, pointer, pointer + low, pointer + high)
                array.__dict__ = fields
                if position == len(arrays):
                    arrays.append(array)  # a part of an unpacked result
                else:
                    arrays[position] = array
        if native is None:
            native = settings.get("cuda_native_launch")
        if native:
            native = _NATIVE[0]
            if native is False:
                native = _NATIVE[0] = fastlaunch.native_launcher()
        else:
            native = None
        count = len(arrays)
        pack = _POINTER.pack_into
        LAUNCHES[0] += len(self.steps)
        with self.lock:
            packed = self.packed
            for k, (which, slots) in enumerate(self.patches):
                # Slots past the op's arrays name the blocks the outputs live in.
                pointer = arrays[which]._numbapos_plan[1] if which < count \
                    else starts[which - count]
                if pointer != packed[k]:
                    packed[k] = None  # until every slot holds it
                    for buffer, offset, delta in slots:
                        pack(buffer, offset, pointer + delta)
                    packed[k] = pointer
            if native is not None:  # every kernel in one call of compiled code
                failed = native(self.table, stream)
                if failed >= 0:
                    fastlaunch.raise_launch_failure(failed)
            else:
                launch_kernel = fastlaunch.launch_kernel
                for step in self.steps:
                    launch_kernel(step, step.function, step.grid, step.block, stream)
        return True


_NO_ERROR = errors.NONE
_VIEW = fastlaunch._VIEW  # (fastlaunch View, CUdeviceptr, whether set directly), once made


def _view():
    fastlaunch._VIEW.append(fastlaunch._view_maker())
    return fastlaunch._VIEW[0]


_NATIVE = [False]  # fastlaunch.native_launcher(), once asked (None where there is none)


class PlanCache:
    """The plans of one op, keyed by call signature."""

    def __init__(self, op: str):
        self.op = op
        self.plans: dict = {}
        _caches.append(self)

    def call(self, full, arrays: tuple, options: tuple, outputs=(), avoid=(), unpack=None,
             pack=None):
        """``full()`` (the op's ordinary path) or its plan for this call signature.

        ``arrays`` are the op's arrays in a fixed order (None for an output the op
        allocates); ``outputs`` the positions of those it returns (one: the result,
        several: a tuple of them, in that order); ``avoid`` pairs of positions (a
        caller's output, an input) that must not overlap. ``full`` returns the
        op's result. A result that is not made of arrays (a SparseRows) gives
        ``unpack(result)``: ``(the arrays the op allocated for it, its layout)``, any
        value that says how they make the result (kept by the plan), and
        ``pack(arrays, layout)`` makes the result from new ones.
        """
        values = settings._current  # the settings now, read once (config.get's dict)
        if values is None:
            settings.get("cuda_fast_launch")
            values = settings._current
        key = self._key(arrays, options, values)
        if key is None:
            return full()
        try:
            plan = self.plans.get(key)
        except TypeError:
            return full()  # an unhashable option the ordinary path will reject
        if plan is not None:
            found = list(arrays)
            if plan.run(found, key[-1], values["cuda_native_launch"]):
                if pack is not None:
                    return pack(found[len(arrays):], plan.layout)
                if len(outputs) == 1:
                    return found[outputs[0]]
                return tuple(map(found.__getitem__, outputs))  # no frame of its own
            return full()
        with recording() as record:
            result = full()
        done = list(arrays)
        layout = None
        if unpack is not None:
            made, layout = unpack(result)
            allocated = list(range(len(done), len(done) + len(made)))
            done.extend(made)
        else:
            produced = (result,) if len(outputs) == 1 else result
            for position, array in zip(outputs, produced, strict=True):
                done[position] = array
            allocated = [i for i in outputs if arrays[i] is None]
        plan = _build(record, done, allocated,
                      [(a, b) for a, b in avoid if arrays[a] is not None and arrays[b] is not None],
                      key[-1])
        if plan is not None:
            plan.layout = layout
            if _held[0] + plan.workspace > WORKSPACE_BUDGET:
                clear()  # many signatures with large scratch: start over
            elif len(self.plans) >= MAX_PLANS:
                _held[0] -= sum(old.workspace for old in self.plans.values())
                self.plans.clear()
            self.plans[key] = plan
            _held[0] += plan.workspace
        return result

    @staticmethod
    def _key(arrays, options, values):
        if not (fastlaunch.ENABLED and values["cuda_fast_launch"]) \
                or values["cuda_sync_checks"] or streams._local.capture is not None:
            return None
        signatures = []
        device_array = _DEVICE_ARRAY[0]
        for x in arrays:
            if x is None:
                signatures.append(None)
                continue
            if type(x) is device_array:  # _described's common case, inline
                try:
                    signatures.append(x._numbapos_plan[0])
                    continue
                except AttributeError:
                    pass
            found = _described(x)
            if found is None:
                return None
            signatures.append(found[0])
        # The context object, checked against the driver's current one (a context made
        # anew after cuda.close() is a new object even where its handle is the old one);
        # the plan holds it, so its id stays its own while the plan lives.
        context = errors._current_state()[0]  # errors.current_context(), one call less
        if context is None:
            return None
        stream = streams._local.stream  # streams.current(), read directly
        if stream:
            stream = fastlaunch._stream_handle(stream)
        return (options, tuple(signatures), id(context), stream)  # hashed by the caller


def _build(record, arrays, allocated, avoid, stream):
    """A :class:`Plan` from what one ordinary call did (``record``), or None.

    Arrays the call allocated that are not among its outputs are its scratch:
    the plan lays them out in one workspace block of its own, allocated here
    and reused by every replay (on the plan's stream, so a replay's kernels
    run after the previous one's), and bakes their pointers into the
    parameters. Scratch that outlives the call (kept by the result or
    elsewhere) is not scratch: no plan is built.
    """
    launches = record.launches
    if not launches or record.unplaceable or not errors.state_made():
        return None
    described = [_described(x) if x is not None else None for x in arrays]
    if any(d is None for x, d in zip(arrays, described, strict=True) if x is not None):
        return None
    made = _output_places(arrays, allocated, record.allocations)
    if made is None:
        return None
    bases = sorted({base for _, base, _ in made})
    scratch = [x for k, x in enumerate(record.allocations) if k not in bases]
    record_sizes = [x.alloc_size for x in record.allocations]
    placed, size = [], 0  # (first byte, end byte, offset in the workspace) of each scratch
    for pointer, nbytes in [(_described(x)[1], x.alloc_size) for x in scratch]:
        placed.append((pointer, pointer + nbytes, size))
        size += -(-nbytes // 256) * 256
    if size > MAX_WORKSPACE:
        return None  # kernels this big outweigh the host's time; don't hold their scratch
    workspace = errors.current_context().memalloc(size) if size else None
    keep = [workspace]
    # The blocks the outputs live in are places too (a kernel may write a part of a block
    # that no output shows): slots past the op's arrays name them.
    blocks = [record.allocations[k] for k in bases]
    steps = _steps(launches, [*arrays, *blocks], [*described, *map(_described, blocks)],
                   placed,
                   workspace.device_pointer_value if size else 0, stream, keep)
    escaped = [weakref.ref(x) for x in scratch]
    del scratch, launches, blocks
    record.launches.clear()
    record.allocations.clear()
    if steps is None or any(ref() is not None for ref in escaped):
        return None  # or "scratch" still referenced after the call: the plan cannot own it
    host = errors.host_word_view()
    context = errors.current_context()
    sizes = tuple(record_sizes[k] for k in bases)
    outputs = tuple((i, fastlaunch.ArrayFactory(arrays[i], described[i], context),
                     bases.index(base), offset) for i, base, offset in made)
    names_blocks = any(which >= len(arrays) for step in steps for _, which, _ in step.slots)
    return Plan(steps, host, (context, sizes, outputs, names_blocks), tuple(avoid), keep)


def _output_places(arrays, allocated, allocations):
    """``[(position, allocation index, byte offset)]``: where each allocated output lies
    (an allocation itself, offset None, or a view into one), or None."""
    places = []
    for i in allocated:
        x = arrays[i]
        found = next((k for k, y in enumerate(allocations) if y is x), None)
        if found is not None:
            places.append((i, found, None))
            continue
        _, pointer, low, high = _described(x)
        for k, y in enumerate(allocations):
            start = _described(y)[1]
            if start <= low and high <= start + y.alloc_size:
                places.append((i, k, pointer - start))
                break
        else:
            return None  # neither an allocation of the call nor inside one
    return places


def _steps(launches, arrays, described, placed, base, stream, keep):
    """The plan's :class:`_Step` of each recorded launch, or None where one cannot be
    planned. Scratch pointers are moved into the workspace at ``base``; persistent
    arrays are added to ``keep``."""
    steps = []
    context = fastlaunch.current_context_handle()
    for kernel, blocks, threads, launch_stream, args in launches:
        if fastlaunch._stream_handle(launch_stream) != stream:
            return None
        direct = fastlaunch.direct_for(kernel, args)
        if direct is None:
            return None
        try:
            values, marks = fastlaunch.flatten_marked(direct.spec, args)
        except fastlaunch._NotPacked:
            return None
        slots = []
        for index, array in marks:
            pointer = values[index]
            where = _alias(array, pointer, arrays, described)
            if where is not None:
                slots.append((direct.offsets[index], *where))
                continue
            inside = [(low, start) for low, high, start in placed if low <= pointer < high]
            if inside:
                values[index] = base + inside[0][1] + pointer - inside[0][0]
            elif getattr(array, "_numbapos_persistent", False):
                keep.append(array)
            else:
                return None  # an array the signature does not fix
        steps.append(_Step(direct, direct.function(context), blocks, threads, values,
                           tuple(slots)))
    return tuple(steps)


def _alias(array, pointer, arrays, described):
    """``(which op array, byte delta)`` when ``array`` is one of ``arrays`` or lies inside
    one at a fixed offset, else None."""
    for which, (x, d) in enumerate(zip(arrays, described, strict=True)):
        if d is None:
            continue
        if array is x:
            return which, 0
        if d[2] <= pointer < max(d[3], d[2] + 1):
            return which, pointer - d[1]
    return None
