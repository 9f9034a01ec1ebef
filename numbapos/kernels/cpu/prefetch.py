"""Software prefetch of table rows for the CPU kernels that visit rows in index order.

A lookup, a gradient sum or a sparse optimiser update reads rows at random
places of a table much larger than the cache. Each row is a short sequential
run, so the hardware prefetcher only starts after the first miss of every
row; asking for the row ``AHEAD`` iterations ahead keeps several rows in
flight per thread. Whether that pays depends on the processor and the kernel
(measured on the development VMs: ``docs/performance.rst``, "Row prefetch"),
so the cache lines asked for per row are chosen per kind of kernel:

- :data:`PREFETCH_LINES`, the float kernels: whole rows on AMD Zen (LLVM CPU
  name ``znver*``), nothing elsewhere (on Intel the requests compete with the
  hardware prefetcher's for the line fill buffers);
- :data:`HALF_PREFETCH_LINES`, the kernels that widen 16-bit rows or decode
  int8 / int4 ones element by element, whose longer work per byte leaves
  their misses exposed: at least 8 lines on every CPU; the int8 / int4 rows,
  read once, with ``prefetchnta`` (``read_once_prefetch_listed``);
- :data:`OUTPUT_PREFETCH_LINES`, the output rows of the 16-bit and int8
  lookups, to write, :data:`OUTPUT_AHEAD` rows ahead (a store to a line that
  is not in the first-level cache waits for it).

``NUMBAPOS_PREFETCH_LINES=N`` (0-64) overrides all of them. The setting is
compiled into the kernels; the cache guard (:mod:`.cachestamp`) counts it.
A prefetch is a hint: it never faults and never changes a result, so an
address past the end of a table costs nothing but a wasted request.
"""

import llvmlite.binding as ll
from llvmlite import ir
from numba import types
from numba.core import cgutils, config
from numba.extending import intrinsic

from ... import config as settings
from .jit import kernel
from .rowaddress import row_address

__all__ = ["AHEAD", "HALF_PREFETCH_LINES", "MAX_LINES", "PREFETCH_LINES",
           "half_prefetch_listed", "half_prefetch_listed_for_write", "prefetch_listed",
           "prefetch_listed_for_write", "prefetch_output_ahead", "prefetch_row",
           "prefetch_row_for_write", "read_once_prefetch_listed",
           "table_prefetch_listed_for_write"]

AHEAD = 8
"""Iterations of lookahead: rows in flight per thread (measured best of 2, 4, 8)."""

MAX_LINES = 64
"""The most cache lines prefetched per row (4 KB); the hardware prefetcher follows a longer row."""

PREFETCH_ENV = settings.SETTINGS["prefetch_lines"].variable


def cpu_name() -> str:
    """The CPU Numba compiles for (``NUMBA_CPU_NAME`` or the host's), as LLVM names it."""
    return config.CPU_NAME or ll.get_host_cpu_name()


def prefetch_lines(lines=None, cpu=None) -> int:
    """Cache lines to prefetch per row: ``lines`` (default: :mod:`numbapos.config`'s
    ``prefetch_lines``, ``NUMBAPOS_PREFETCH_LINES``) when set, else by CPU."""
    if lines is None:
        lines = settings.get("prefetch_lines")
    if lines is not None:
        return lines
    cpu = cpu or cpu_name()
    return MAX_LINES if cpu.startswith("znver") else 0


PREFETCH_LINES = prefetch_lines()
"""Cache lines prefetched per row in the kernels compiled by this process (0: none)."""

HALF_WIDEN_MIN_LINES = 8
"""The least the kernels that widen 16-bit rows prefetch per row when no setting is given."""


def half_prefetch_lines(lines=None, cpu=None) -> int:
    """Cache lines to prefetch per row in the kernels that widen 16-bit rows: the setting
    when given (as :func:`prefetch_lines`), else at least :data:`HALF_WIDEN_MIN_LINES`."""
    if lines is None:
        lines = settings.get("prefetch_lines")
    if lines is not None:
        return lines
    return max(prefetch_lines(None, cpu), HALF_WIDEN_MIN_LINES)


HALF_PREFETCH_LINES = half_prefetch_lines()
"""Cache lines prefetched per row by the kernels that widen 16-bit rows (this process)."""

OUTPUT_AHEAD = 4
"""Rows ahead that :func:`prefetch_output_ahead` asks for (measured best of 1, 2 and 4)."""

OUTPUT_MIN_LINES = 16
"""Output lines prefetched per row when no setting is given: 1 KB, a float32 row at D = 256
(a longer row's later lines follow the hardware prefetcher)."""


def output_prefetch_lines(lines=None) -> int:
    """Cache lines of an output row :func:`prefetch_output_ahead` asks for: the setting when
    given (as :func:`prefetch_lines`), else :data:`OUTPUT_MIN_LINES` (a 1 KB row) on every CPU."""
    if lines is None:
        lines = settings.get("prefetch_lines")
    return OUTPUT_MIN_LINES if lines is None else lines


OUTPUT_PREFETCH_LINES = output_prefetch_lines()
"""Cache lines of an output row prefetched by :func:`prefetch_output_ahead` (this process)."""


_LINE_BYTES = 64
_READ, _WRITE = 0, 1
_KEEP_IN_ALL_CACHES = 3  # prefetcht0
_READ_ONCE = 0  # prefetchnta: into the first-level cache, past the others where the CPU can
_DATA_CACHE = 1


def _lines(kind) -> int:
    # Read when a kernel is compiled: tests may change them.
    return {"rows": PREFETCH_LINES, "half": HALF_PREFETCH_LINES,
            "output": OUTPUT_PREFETCH_LINES}[kind]


def _make_prefetch(intent, name, kind="rows", locality=_KEEP_IN_ALL_CACHES):
    def prefetch(typingctx, table, row):
        if not (isinstance(table, types.Array) and table.ndim == 2
                and isinstance(row, types.Integer)):
            return None
        return types.void(table, row), _codegen(intent, kind, locality)

    prefetch.__name__ = prefetch.__qualname__ = name
    return prefetch


def _codegen(intent, kind, locality):
    def codegen(context, builder, signature, args):
        lines = _lines(kind)
        if lines == 0:
            return context.get_dummy_value()
        table_type, row_type = signature.args
        table = context.make_array(table_type)(context, builder, args[0])
        start = row_address(context, builder, table_type, args[0], args[1], row_type)
        i64 = ir.IntType(64)
        i32 = ir.IntType(32)
        byte_ptr = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        row_bytes = builder.mul(builder.extract_value(table.shape, 1),
                                ir.Constant(i64, table_type.dtype.bitwidth // 8))
        limit = ir.Constant(i64, lines * _LINE_BYTES)
        row_bytes = builder.select(builder.icmp_signed("<", row_bytes, limit), row_bytes, limit)
        flags = [ir.Constant(i32, intent), ir.Constant(i32, locality),
                 ir.Constant(i32, _DATA_CACHE)]
        with cgutils.for_range_slice(builder, ir.Constant(i64, 0), row_bytes,
                                     ir.Constant(i64, _LINE_BYTES), intp=i64) as (offset, _):
            address = builder.inttoptr(builder.add(start, offset), byte_ptr)
            builder.call(fn, [address] + flags)
        return context.get_dummy_value()

    return codegen


prefetch_row = intrinsic(_make_prefetch(_READ, "prefetch_row"))
prefetch_row.__doc__ = """``prefetch_row(table, row)``: request ``table[row]`` (2-D) to read."""

prefetch_row_for_write = intrinsic(_make_prefetch(_WRITE, "prefetch_row_for_write"))
prefetch_row_for_write.__doc__ = """``prefetch_row_for_write(table, row)``: as :func:`prefetch_row`,
for a row about to be written (``prefetchw`` where the CPU has it)."""


_half_prefetch_row = intrinsic(_make_prefetch(_READ, "_half_prefetch_row", "half"))
_half_prefetch_row_for_write = intrinsic(_make_prefetch(_WRITE, "_half_prefetch_row_for_write",
                                                        "half"))
_read_once_prefetch_row = intrinsic(_make_prefetch(_READ, "_read_once_prefetch_row", "half",
                                                   locality=_READ_ONCE))
_output_prefetch_row = intrinsic(_make_prefetch(_WRITE, "_output_prefetch_row", "output"))


@intrinsic
def _table_prefetch_row_for_write(typingctx, like, table, row):
    # prefetch_row_for_write with the lines of like's kind: "half" for a 16-bit table's
    # bits (uint16), "rows" for a float table.
    if not (isinstance(like, types.Array) and isinstance(table, types.Array)
            and table.ndim == 2 and isinstance(row, types.Integer)):
        return None
    kind = "half" if isinstance(like.dtype, types.Integer) else "rows"
    row_codegen = _codegen(_WRITE, kind, _KEEP_IN_ALL_CACHES)

    def codegen(context, builder, signature, args):
        return row_codegen(context, builder, types.void(table, row), args[1:])
    return types.void(like, table, row), codegen


@kernel(inline="always")
def prefetch_listed(table, rows, j):
    """Prefetch ``table[rows[j]]`` (to read) when ``j`` is within ``rows``."""
    if j < rows.size:
        prefetch_row(table, rows[j])


@kernel(inline="always")
def prefetch_listed_for_write(table, rows, j):
    """Prefetch ``table[rows[j]]`` (to write) when ``j`` is within ``rows``."""
    if j < rows.size:
        prefetch_row_for_write(table, rows[j])


@kernel(inline="always")
def half_prefetch_listed(table, rows, j):
    """:func:`prefetch_listed` with :data:`HALF_PREFETCH_LINES` (kernels widening 16-bit rows)."""
    if j < rows.size:
        _half_prefetch_row(table, rows[j])


@kernel(inline="always")
def half_prefetch_listed_for_write(table, rows, j):
    """:func:`prefetch_listed_for_write` with :data:`HALF_PREFETCH_LINES`."""
    if j < rows.size:
        _half_prefetch_row_for_write(table, rows[j])


@kernel(inline="always")
def table_prefetch_listed_for_write(like, table, rows, j):
    """Prefetch ``table[rows[j]]`` (to write) when ``j`` is within ``rows``, as many lines as
    the kernels of table ``like`` ask for: :data:`HALF_PREFETCH_LINES` when ``like`` holds a
    16-bit table's bits, :data:`PREFETCH_LINES` when it is a float table (the sparse
    optimisers, one kernel for both, prefetch a table and its state alike)."""
    if j < rows.size:
        _table_prefetch_row_for_write(like, table, rows[j])


@kernel(inline="always")
def read_once_prefetch_listed(table, rows, j):
    """:func:`half_prefetch_listed` with ``prefetchnta``, for rows read once and not written
    back by the same step (the int8 / int4 inference lookups): the rows are not kept in
    the outer caches, so they do not evict the output and the rows other calls reuse."""
    if j < rows.size:
        _read_once_prefetch_row(table, rows[j])


@kernel(inline="always")
def prefetch_output_ahead(out, i):
    """Prefetch ``out[i + OUTPUT_AHEAD]`` (2-D) to write, when within ``out``:
    :data:`OUTPUT_PREFETCH_LINES` lines of it.

    For the lookups that widen or decode rows, or copy 16-bit ones, into an output
    larger than the second-level cache (the bfloat16 / float16 and int8 lookups):
    each first store to an output line waits for the line, and asking for it a
    few rows ahead overlaps those waits with the work on earlier rows.
    """
    if i + OUTPUT_AHEAD < out.shape[0]:
        _output_prefetch_row(out, i + OUTPUT_AHEAD)
