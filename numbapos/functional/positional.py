"""Positional embeddings: the sinusoid table, adding positions to a batch, NeoML's
multiply-add, their gradients, and positions computed from padding.
"""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from .._docs import fill_doc
from . import fractional
from ._common import backend_for, check_range, flatten, on_backend
from .dropout import _check_out
from .embedding import _scatter

# Docstring text of x + P and A * x + B, written once (see numbapos/_docs.py).
_doc = fill_doc({
    "out": """\
out : ndarray, optional
    C-contiguous buffer of ``x``'s shape and dtype (it may be ``x`` itself).""",
    "returns": """\
Returns
-------
ndarray, shape of ``x``""",
})


LAYOUTS = ("interleaved", "concat")


def sinusoidal_pos_embedding(seq_len, embed_dim, device="cpu", dtype=None, base=10000.0,
                             offset=0, out=None, layout="interleaved"):
    """The sinusoidal position table of "Attention Is All You Need", in two layouts.

    ``layout="interleaved"`` (the default): ``PE[p, 2i] = sin(p * base**(-2i/D))``
    and ``PE[p, 2i+1] = cos(p * base**(-2i/D))`` for the positions ``p = offset,
    ..., offset + seq_len - 1``: sin and cos alternate along the channels (as in
    NeoML, the Annotated Transformer and Hugging Face's XLM / DistilBERT
    ``create_sinusoidal_embeddings``; Marian's ``[sin | cos]`` table is a column
    permutation of it). An odd ``embed_dim`` ends with an unpaired sin channel.

    ``layout="concat"``: tensor2tensor's table, which fairseq's
    ``SinusoidalPositionalEmbedding.get_embedding`` and, in Hugging Face,
    M2M100 / NLLB / XGLM / Speech2Text and Whisper's ``sinusoids`` build:
    ``PE[p, i] = sin(p w_i)`` and ``PE[p, H + i] = cos(p w_i)`` with ``H = D //
    2`` and ``w_i = exp(-i * log(base) / (H - 1))``, so the frequencies run from
    1 down to exactly ``1 / base`` (note ``H - 1``, not the interleaved table's
    ``D / 2``: the two are not permutations of each other). An odd
    ``embed_dim`` ends with a zero channel, as fairseq pads it; ``embed_dim``
    must be at least 4. Whisper's ``sinusoids(length, channels,
    max_timescale)`` is ``sinusoidal_pos_embedding(length, channels,
    base=max_timescale, layout="concat")``. fairseq's table also zeroes the row
    ``padding_idx`` and its positions start at ``padding_idx + 1``: those
    belong to the caller (see the positions guide, or
    :func:`positions_from_padding`), e.g. for M2M100::

        table = sinusoidal_pos_embedding(max_positions + padding_idx + 1, D,
                                         layout="concat")
        table[padding_idx] = 0
        ids = positions_from_padding(input_ids, padding_idx,
                                     past_length=padding_idx + 1 + cache_length,
                                     pad_position=padding_idx)

    The table is filled by a Numba kernel that rotates (sin, cos) one position at
    a time (angle addition, computed in float64 even for float32 output) and
    re-anchors with a direct sin/cos every few hundred positions, so each entry
    stays within 1e-6 (float32) or 1e-10 (float64) of the formula evaluated in
    float64, for tables of at least 65536 positions (the CUDA kernel computes
    each entry directly).

    Parameters
    ----------
    seq_len : int
        Number of positions L (> 0).
    embed_dim : int
        Number of channels D (> 0; >= 4 for ``layout="concat"``).
    device : {"cpu", "cuda"}, default "cpu"
        Where the table is made; ignored when ``out`` is given (the table is
        made where ``out`` lives).
    dtype : float32 or float64, optional
        Dtype of the result; None means float32, or ``out``'s dtype when ``out``
        is given.
    base : float, default 10000.0
        Base of the geometric progression of wavelengths (> 0): the longest
        wavelength is about ``2 pi base`` (Whisper's ``max_timescale``).
    offset : int, default 0
        First position (>= 0), e.g. the number of tokens already decoded.
    out : ndarray, optional
        C-contiguous, writeable buffer of shape (seq_len, embed_dim) and dtype
        ``dtype`` to fill.
    layout : {"interleaved", "concat"}, default "interleaved"
        Where sin and cos go, and the frequencies that come with it (above).

    Returns
    -------
    ndarray, shape (seq_len, embed_dim)

    Raises
    ------
    TypeError
        A non-integer ``seq_len``, ``embed_dim`` or ``offset``, a non-float
        ``dtype``, a non-real ``base``, a non-array ``out`` or a non-string
        ``layout``.
    ValueError
        ``seq_len <= 0``, ``embed_dim <= 0`` (``< 4`` with ``layout="concat"``),
        ``offset < 0`` (or a last position ``offset + seq_len - 1`` beyond
        int64), ``base <= 0``, an unknown ``layout`` or ``device``, or ``out``
        of the wrong shape or dtype.
    RuntimeError
        ``device="cuda"`` where CUDA cannot be used.

    Examples
    --------
    >>> import numbapos.functional as F
    >>> F.sinusoidal_pos_embedding(4, 6).shape
    (4, 6)
    >>> F.sinusoidal_pos_embedding(3, 4, layout="concat", dtype="float64")[1].round(3)
    array([0.841, 0.   , 0.54 , 1.   ])
    """
    seq_len = _checks.check_int(seq_len, "seq_len", minimum=1)
    embed_dim = _checks.check_int(embed_dim, "embed_dim", minimum=1)
    layout = _check_layout(layout)
    if layout == "concat" and embed_dim < 4:
        raise ValueError(
            f"embed_dim: layout='concat' spaces its embed_dim // 2 frequencies by "
            f"log(base) / (embed_dim // 2 - 1), so it needs embed_dim >= 4, got {embed_dim}"
        )
    if out is not None:
        out = _checks.as_array(out, "out")
    device = _device.check_device(device) if out is None else _device.device_of(out)
    if dtype is None:
        dtype = np.float32 if out is None else out.dtype
    dtype = _checks.check_float_dtype(dtype)
    base = _checks.check_positive(base, "base")
    offset = _checks.check_int(offset, "offset", minimum=0)
    if offset > _checks.INT64_MAX - (seq_len - 1):
        raise ValueError(
            f"offset: the last position offset + seq_len - 1 = {offset + seq_len - 1} does "
            f"not fit in int64 (at most 2**63 - 1)"
        )
    shape = (seq_len, embed_dim)
    K = _device.kernels_for(device)
    if out is None:
        out = K.empty(shape, dtype)
    else:
        out = _checks.check_out(out, shape, dtype)
    if layout == "concat":
        half = embed_dim // 2
        inv_freq = np.exp(np.arange(half, dtype=np.float64) * (-np.log(base) / (half - 1)))
        K.sinusoid_fill(inv_freq, offset, out, concat=True)
    else:
        inv_freq = base ** (-np.arange(0, embed_dim, 2, dtype=np.float64) / embed_dim)
        K.sinusoid_fill(inv_freq, offset, out)
    return out


def _check_layout(layout) -> str:
    if not isinstance(layout, str):
        raise TypeError(f"layout: expected 'interleaved' or 'concat', got "
                        f"{_checks.type_name(layout)} {_checks.quote(layout)}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'interleaved' or 'concat', got {layout!r}")
    return layout


def timestep_embedding(timesteps, embedding_dim, *, flip_sin_to_cos=False,
                       downscale_freq_shift=1.0, scale=1.0, max_period=10000, dtype=None,
                       out=None):
    """Sinusoidal embeddings of diffusion timesteps, as diffusers' ``get_timestep_embedding``.

    For each timestep ``t`` (a float: fractional timesteps are fine) and ``H =
    embedding_dim // 2``::

        w_i = exp(-log(max_period) * i / (H - downscale_freq_shift)),  i < H
        a_i = scale * (t * w_i)
        emb = [sin(a) | cos(a)]        ([cos(a) | sin(a)] with flip_sin_to_cos)

    and an odd ``embedding_dim`` ends with a zero channel. diffusers' ``Timesteps``
    module (Stable Diffusion's UNet: ``flip_sin_to_cos=True,
    downscale_freq_shift=0``; DiT / PixArt / SD3 / Flux time projections) calls
    it with its own options. With ``downscale_freq_shift=1`` and ``scale=1`` it is
    the ``layout="concat"`` sinusoid of :func:`sinusoidal_pos_embedding` at the
    positions ``timesteps``.

    Everything is computed in float64 (diffusers computes in float32, whose
    frequencies and angles carry a relative rounding error of about 1e-7: at
    ``t = 1000`` its values differ from the exact ones by up to about 1e-4);
    a float32 result is within 1e-6 of the float64 formula.

    Parameters
    ----------
    timesteps : array_like, shape (N,) or (B, N)
        Timesteps, integer or float: a NumPy array (or list), or a CUDA array
        (then the result is made on the GPU).
    embedding_dim : int
        Number of channels D (> 0).
    flip_sin_to_cos : bool, default False
        Put the cosines first.
    downscale_freq_shift : float, default 1.0
        The shift ``s`` of the frequency spacing ``log(max_period) / (H - s)``;
        ``H - s`` must not be 0.
    scale : float, default 1.0
        Multiplies the angles (finite).
    max_period : float, default 10000
        The longest period is about ``2 pi max_period`` (> 0).
    dtype : float32 or float64, optional
        Dtype of the result; None means float32 (diffusers' dtype), or ``out``'s
        dtype when ``out`` is given.
    out : ndarray, optional
        C-contiguous, writeable buffer of shape ``timesteps.shape +
        (embedding_dim,)`` on the timesteps' device.

    Returns
    -------
    ndarray, shape ``timesteps.shape + (embedding_dim,)``

    Raises
    ------
    TypeError
        Timesteps that are not numbers (bool, complex, object), a non-integer
        ``embedding_dim``, non-real options, a non-bool ``flip_sin_to_cos``, a
        non-float ``dtype``, ``out`` on another device than the timesteps.
    ValueError
        Timesteps that are not 1-D or 2-D, a non-finite timestep (host
        timesteps; CUDA timesteps are not read back: a non-finite one gives a
        row of NaN, as in diffusers), ``embedding_dim <= 0``, ``max_period <=
        0``, a non-finite ``scale``, ``downscale_freq_shift`` equal to
        ``embedding_dim // 2`` (a division by zero), ``out`` of the wrong shape
        or dtype.

    Examples
    --------
    >>> import numpy as np
    >>> import numbapos.functional as F
    >>> F.timestep_embedding(np.array([0.0, 999.0]), 320, flip_sin_to_cos=True,
    ...                      downscale_freq_shift=0).shape
    (2, 320)
    """
    embedding_dim = _checks.check_int(embedding_dim, "embedding_dim", minimum=1)
    if not isinstance(flip_sin_to_cos, (bool, np.bool_)):
        raise TypeError(f"flip_sin_to_cos: expected a bool, got "
                        f"{_checks.type_name(flip_sin_to_cos)} {_checks.quote(flip_sin_to_cos)}")
    shift = _checks.check_real(downscale_freq_shift, "downscale_freq_shift")
    if not np.isfinite(shift):
        raise ValueError(f"downscale_freq_shift: expected a finite number, got {shift}")
    scale = _checks.check_real(scale, "scale")
    if not np.isfinite(scale):
        raise ValueError(f"scale: expected a finite number, got {scale}")
    max_period = _checks.check_positive(max_period, "max_period")
    half = embedding_dim // 2
    if half and half - shift == 0:
        raise ValueError(
            f"downscale_freq_shift: the frequencies are spaced by log(max_period) / "
            f"(embedding_dim // 2 - downscale_freq_shift), which is a division by zero for "
            f"embedding_dim={embedding_dim} and downscale_freq_shift={downscale_freq_shift}"
        )
    times = _check_timesteps(timesteps)
    if out is not None:
        out = _checks.as_array(out, "out")
    K = backend_for((times, out), ("timesteps", "out"))
    if dtype is None:
        dtype = np.float32 if out is None else out.dtype
    dtype = _checks.check_float_dtype(dtype)
    shape = tuple(times.shape) + (embedding_dim,)
    if out is None:
        out = K.empty(shape, dtype)
    else:
        out = _checks.check_out(out, shape, dtype)
    if times.size:
        # diffusers' order of operations, in float64
        freq = np.exp(-np.log(max_period) * np.arange(half, dtype=np.float64) / (half - shift))
        flat = _device.reshaped(times, (times.size,))
        K.timestep_fill(flat, freq, scale, bool(flip_sin_to_cos),
                        _device.reshaped(out, (times.size, embedding_dim)))
    return out


_CUDA_TIMESTEP_DTYPES = tuple(np.dtype(t) for t in ("int32", "int64", "float16", "float32",
                                                    "float64"))


def _check_timesteps(timesteps):
    """Timesteps as a 1-D or 2-D array of numbers: a float64 host array, checked finite,
    or a C-contiguous CUDA array of int32 / int64 / float16 / float32 / float64."""
    if _device.is_cuda_array(timesteps):
        times = _device.adopt(timesteps)
        _checks.check_cuda_contiguous(times, "timesteps")
        if times.dtype not in _CUDA_TIMESTEP_DTYPES:
            raise TypeError(f"timesteps: expected integer or float numbers (on the GPU: "
                            f"int32, int64, float16, float32 or float64), got dtype "
                            f"{times.dtype}")
    else:
        times = None if isinstance(timesteps, (list, tuple)) else _checks.host_view(
            timesteps, "timesteps")
        if times is None:
            try:
                times = np.asarray(timesteps)
            except ValueError as err:  # ragged nested lists
                raise ValueError(f"timesteps: cannot make an array of numbers: {err}") from err
        if times.dtype.kind not in "iuf":
            raise TypeError(f"timesteps: expected integer or float numbers, got dtype "
                            f"{times.dtype}")
    if times.ndim not in (1, 2):
        raise ValueError(f"timesteps: expected a 1-D or 2-D array, got shape "
                         f"{tuple(times.shape)}")
    if _device.is_cuda_array(times):
        return times
    times = np.asarray(times, dtype=np.float64)
    finite = np.isfinite(times)
    if not finite.all():
        where = int(np.argmin(finite.reshape(-1)))
        raise ValueError(f"timesteps: expected finite numbers, got {times.reshape(-1)[where]} "
                         f"(at flat position {where})")
    return times


# ---------------------------------------------------------------- shared checks


def _check_activation(x, name: str = "x"):
    return _checks.check_float_array(x, name, ndim=(2, 3))


def _as_3d(K, x):
    """``x`` as a C-contiguous (N, L, D) array (a 2-D ``x`` is one sequence)."""
    x = K.contiguous(x)
    return x.reshape((1,) + tuple(x.shape)) if x.ndim == 2 else x


def _check_offset(offset, seq_len: int, num_positions: int) -> int:
    offset = _checks.check_int(offset, "offset")
    if offset < 0 or offset + seq_len > num_positions:
        raise ValueError(
            f"offset: positions offset={offset} .. offset+L-1={offset + seq_len - 1} "
            f"(L={seq_len}) must lie in [0, max_len={num_positions}); need "
            f"0 <= offset and offset + L <= max_len"
        )
    return offset


def _check_position_ids(K, position_ids, x_shape: tuple, num_positions: int, inline=False):
    """Position ids of shape (L,), or (N, L) / (1, L) for 3-D x, as a 2-D (P, L) array.

    With ``inline`` the GPU kernel that reads them checks them (deferred, no
    separate launch); the CPU checks here."""
    ids = on_backend(K, position_ids, "position_ids")
    x_shape = tuple(x_shape)
    seq_len = x_shape[-2]
    allowed = [(seq_len,)]
    if len(x_shape) == 3:
        allowed += [(1, seq_len), (x_shape[0], seq_len)]
    if tuple(ids.shape) not in allowed:
        want = " or ".join(str(s) for s in dict.fromkeys(allowed))
        raise ValueError(
            f"position_ids: expected shape {want} for x of shape {x_shape}, got "
            f"{tuple(ids.shape)}"
        )
    flat = flatten(K, ids)
    check_range(K, flat, num_positions, "position_ids", "max_len", checked_by_kernel=inline)
    return flat.reshape(ids.shape[0] if ids.ndim == 2 else 1, seq_len)


# ---------------------------------------------------------------- x + P


@_doc
def add_positional(x, table, offset=0, position_ids=None, out=None):
    """Add rows of a position table to every sequence of a batch.

    ``out[..., l, :] = x[..., l, :] + table[offset + l]``, or
    ``table[position_ids[..., l]]`` when ``position_ids`` is given; the rows are
    broadcast over the batch dimension.

    Parameters
    ----------
    x : ndarray, shape (L, D) or (N, L, D), float32 or float64
        The activations.
    table : ndarray, shape (M, D), same dtype as ``x``
        One row per position (learned, or a sinusoid table).
    offset : int, default 0
        Position of the first token; ``offset + L`` must not exceed M. Ignored
        when ``position_ids`` is given (it must then be 0).
    position_ids : array_like of int or float, optional
        Arbitrary rows of ``table`` to add: shape (L,), or for 3-D ``x`` also
        (N, L) or (1, L). Each id must lie in ``[0, M)``. Float positions
        ``p`` in ``[0, M - 1]`` read ``(1 - w) * table[floor(p)] + w *
        table[floor(p) + 1]``, ``w = p - floor(p)`` (position interpolation of
        an absolute table, on the fly; the blend is formed in float64; on
        CUDA they are checked on the device, deferred as index ids are).
    {out}

    {returns}

    Raises
    ------
    TypeError
        Non-float ``x`` or ``table``, different dtypes, non-integer ``offset``
        or ``position_ids`` of a dtype other than integer or float.
    ValueError
        ``x`` not 2-D or 3-D, ``table`` not 2-D or of another width, ``offset``
        outside ``[0, M - L]``, both ``offset`` and ``position_ids`` given,
        ``position_ids`` of the wrong shape, ``out`` of the wrong shape or dtype.
    IndexError
        A position id outside ``[0, M)``. On CUDA it is found by the kernel
        and raised by the next synchronising call (``numbapos.synchronize()``,
        ``to_host``) or the next op that sees it; nothing is modified.
    """
    x = _check_activation(x)
    table = _checks.check_matching_table(x, table, "table")
    K = backend_for((x, table, out), ("x", "table", "out"))
    seq_len = x.shape[x.ndim - 2]
    num_positions = table.shape[0]
    ids = None
    if fractional.is_fractional(position_ids):
        _checks.check_offset_only(offset, position_ids)
        out = _inplace_out(K, x, out, (table,))
        fractional.add_fractional(K, _as_3d(K, x), table, position_ids, tuple(x.shape),
                                  _as_3d(K, out))
        return out
    if position_ids is None:
        offset = _check_offset(offset, seq_len, num_positions)
    else:
        _checks.check_offset_only(offset, position_ids)
        ids = _check_position_ids(K, position_ids, x.shape, num_positions, inline=True)
    out = _inplace_out(K, x, out, (table, ids))
    x3 = _as_3d(K, x)
    out3 = _as_3d(K, out)
    if ids is None:
        K.add_rows(x3, table, offset, out3)
    else:
        K.add_gathered_rows(x3, table, ids, out3)
    return out


def _inplace_out(K, x, out, others):
    """A result buffer of x's shape: ``out`` checked (it may be ``x`` itself), or a new one."""
    out = _check_out(x, out, others)
    return K.empty(x.shape, x.dtype) if out is None else out


def add_positional_backward(grad_output, num_positions, offset=0, position_ids=None):
    """Gradient of :func:`add_positional` with respect to the table.

    The gradient with respect to ``x`` is ``grad_output`` itself. The table
    gradient sums ``grad_output`` over the batch into the rows that were added;
    with ``position_ids`` the rows are scattered deterministically (repeated ids
    summed in input order, see :func:`numbapos.functional.embedding_backward`).
    A float position sends ``(1 - w) * grad`` to row ``floor(p)`` and ``w *
    grad`` to the next row (products in float64, rounded once), summed the same
    deterministic way.

    Parameters
    ----------
    grad_output : ndarray, shape (L, D) or (N, L, D), float32 or float64
        Gradient of the loss with respect to the output.
    num_positions : int
        Number of rows M of the table.
    offset, position_ids
        As given to :func:`add_positional`.

    Returns
    -------
    ndarray, shape (M, D)
        Zero in the rows that were not used.

    Raises
    ------
    TypeError, ValueError, IndexError
        As for :func:`add_positional`.
    """
    grad_output = _checks.check_float_array(grad_output, "grad_output", ndim=(2, 3))
    K = backend_for((grad_output,), ("grad_output",))
    num_positions = _checks.check_int(num_positions, "num_positions", minimum=1)
    seq_len, dim = grad_output.shape[-2:]
    if fractional.is_fractional(position_ids):
        _checks.check_offset_only(offset, position_ids)
        return fractional.add_fractional_backward(K, _as_3d(K, grad_output), num_positions,
                                                  position_ids, tuple(grad_output.shape))
    if position_ids is not None:
        _checks.check_offset_only(offset, position_ids)
        ids = _check_position_ids(K, position_ids, grad_output.shape, num_positions)
        grad3 = _as_3d(K, grad_output)
        batch = grad3.shape[0]
        if ids.shape[0] != batch:  # one row of ids shared by the batch: tiled on its device
            tiled = K.empty((batch * seq_len,), np.int64)
            K.tile_ids(K.contiguous(ids, np.int64).reshape(seq_len), 0, seq_len, tiled)
            ids = tiled.reshape(batch, seq_len)
        return _scatter(K, grad3, ids.reshape(batch * seq_len), num_positions, None, False,
                        False)
    offset = _check_offset(offset, seq_len, num_positions)
    result = K.empty((num_positions, dim), grad_output.dtype)
    K.sum_over_batch(_as_3d(K, grad_output), offset, result)
    return result


# ---------------------------------------------------------------- A * X + B


@_doc
def positional_mult_add(x, a, b, out=None):
    """NeoML's learnable multiply-add: ``Y = a[:L] * x + b[:L]``, elementwise.

    Parameters
    ----------
    x : ndarray, shape (L, D) or (N, L, D), float32 or float64
        The activations.
    a, b : ndarray, shape (M, D) with M >= L, same dtype as ``x``
        Per-position multipliers and addends; their first L rows are used,
        broadcast over the batch.
    {out}

    {returns}

    Raises
    ------
    TypeError
        Non-float arrays or different dtypes.
    ValueError
        Wrong ranks or widths, ``a`` and ``b`` of different shapes, the sequence
        longer than M ("sequence is too long"), ``out`` of the wrong shape or dtype.
    """
    x = _check_activation(x)
    a = _checks.check_matching_table(x, a, "a")
    b = _checks.check_matching_table(x, b, "b")
    K = backend_for((x, a, b, out), ("x", "a", "b", "out"))
    _checks.check_same_shape(b, a.shape, "b", "the shape of a")
    _check_length(x.shape[x.ndim - 2], a.shape[0])
    out = _inplace_out(K, x, out, (a, b))
    K.mult_add(_as_3d(K, x), a, b, _as_3d(K, out))
    return out


def _check_length(seq_len: int, num_positions: int) -> None:
    if seq_len > num_positions:
        raise ValueError(
            f"x: sequence is too long: L={seq_len} positions but the tables hold "
            f"max_len={num_positions}"
        )


def positional_mult_add_backward(grad_output, x, a):
    """Gradients of :func:`positional_mult_add`.

    ``grad_x = grad_output * a[:L]``; ``grad_a[:L] = sum over the batch of
    grad_output * x``; ``grad_b[:L] = sum over the batch of grad_output``. The
    sums run in batch order, one position per thread, so they are deterministic.

    Parameters
    ----------
    grad_output : ndarray, shape of ``x``
        Gradient of the loss with respect to the output.
    x : ndarray, shape (L, D) or (N, L, D)
        The input of the forward pass.
    a : ndarray, shape (M, D)
        The multipliers of the forward pass.

    Returns
    -------
    grad_x : ndarray, shape of ``x``
    grad_a, grad_b : ndarray, shape (M, D)
        Zero in the rows ``>= L``.

    Raises
    ------
    TypeError, ValueError
        As for :func:`positional_mult_add`, or ``grad_output`` not of ``x``'s
        shape and dtype.
    """
    x = _check_activation(x)
    a = _checks.check_matching_table(x, a, "a")
    grad_output = _checks.check_float_like(grad_output, "grad_output", x.shape, x.dtype,
                                           "the shape of x", "the dtype of x")
    K = backend_for((x, a, grad_output), ("x", "a", "grad_output"))
    _check_length(x.shape[x.ndim - 2], a.shape[0])
    grad_x = K.empty(x.shape, x.dtype)
    grad_a = K.empty(a.shape, x.dtype)
    grad_b = K.empty(a.shape, x.dtype)
    K.mult_add_backward(_as_3d(K, grad_output), _as_3d(K, x), a, _as_3d(K, grad_x), grad_a,
                        grad_b)
    return grad_x, grad_a, grad_b


# ---------------------------------------------------------------- positions from padding


def positions_from_padding(input_ids, padding_idx, past_length=0, pad_position=0):
    """Position ids that skip padding, so left- and right-padded batches agree.

    Along the last axis, the real tokens (``!= padding_idx``) of each sequence are
    numbered ``past_length, past_length + 1, ...`` from its first real token;
    padding tokens get ``pad_position``. A sequence therefore gets the same
    positions whether it is padded on the left or on the right.

    Relation to other libraries:

    - fairseq's ``make_positions(tensor, padding_idx)`` (also Hugging Face's
      RoBERTa ``create_position_ids_from_input_ids``) numbers real tokens from
      ``padding_idx + 1`` and gives padding ``padding_idx``: it equals
      ``positions_from_padding(ids, padding_idx, past_length=padding_idx + 1,
      pad_position=padding_idx)`` (add the cached length to ``past_length``
      where RoBERTa adds ``past_key_values_length``).
    - Hugging Face's generation convention ``attention_mask.cumsum(-1) - 1``
      (then ``masked_fill_(attention_mask == 0, 1)``) equals
      ``positions_from_padding(ids, padding_idx, pad_position=1)`` when
      ``attention_mask == (ids != padding_idx)``. When generating with a cache,
      pass the number of real tokens already in the cache of each sequence as
      ``past_length``.

    Parameters
    ----------
    input_ids : array_like of int, shape (..., L)
        Token ids, at least 1-D; the last axis is the sequence.
    padding_idx : int
        The padding id.
    past_length : int or array_like of int, default 0
        Position of the first real token (>= 0): one int for every sequence, or
        one per sequence, of shape ``input_ids.shape[:-1]``.
    pad_position : int, default 0
        Position given to padding tokens.

    Returns
    -------
    ndarray of int64, shape of ``input_ids``

    Raises
    ------
    TypeError
        Non-integer ids or arguments.
    ValueError
        0-d ``input_ids``, a negative ``past_length``, a ``past_length`` array
        of the wrong shape, or a ``padding_idx``, ``pad_position`` or last
        position ``past_length + L - 1`` outside the int64 range.

    Examples
    --------
    >>> import numpy as np
    >>> from numbapos.functional import positions_from_padding
    >>> positions_from_padding(np.array([[0, 0, 7, 8], [7, 8, 0, 0]]), padding_idx=0)
    array([[0, 0, 0, 1],
           [0, 1, 0, 0]])
    """
    ids = _checks.check_index_array(input_ids, "input_ids")
    K = backend_for((ids,), ("input_ids",))
    if ids.ndim == 0:
        raise ValueError("input_ids: expected at least 1 dimension (..., L), got a 0-d array")
    padding_idx = _checks.check_int64(padding_idx, "padding_idx")
    pad_position = _checks.check_int64(pad_position, "pad_position")
    rows_shape = ids.shape[:-1]
    # The last position, past_length + L - 1, must fit in the int64 result.
    max_past = _checks.INT64_MAX - max(ids.shape[ids.ndim - 1] - 1, 0)
    if _device.is_cuda_array(past_length) and K.DEVICE == "cuda":
        # Values are checked by the kernel (deferred: an IndexError naming past_length
        # at the next synchronising call), not read back here.
        past = _checks.check_index_array(past_length, "past_length")
        _checks.check_same_shape(past, rows_shape, "past_length", "input_ids.shape[:-1]")
        past = K.contiguous(past, np.int64).reshape(past.size)
    elif (isinstance(past_length, (list, tuple)) or _checks.is_array(past_length)
            or hasattr(past_length, "__array__") and not isinstance(past_length, np.generic)):
        past = _device.to_host(_checks.check_index_array(past_length, "past_length"))
        _checks.check_same_shape(past, rows_shape, "past_length", "input_ids.shape[:-1]")
        if past.size and past.min() < 0:
            raise ValueError(
                f"past_length: expected values >= 0, got {int(past.min())}"
            )
        if past.size and past.max() > max_past:
            raise ValueError(f"past_length: expected values <= {max_past} (so that "
                             f"past_length + L - 1 fits in int64), got {int(past.max())}")
        past = np.ascontiguousarray(past, dtype=np.int64).reshape(-1)
    else:
        past_length = _checks.check_int(past_length, "past_length", minimum=0,
                                        maximum=max_past)
        past = (past_length if K.DEVICE == "cuda"  # one int: no array to copy up
                else np.full(int(np.prod(rows_shape)), past_length, dtype=np.int64))
    flat_shape = (int(np.prod(rows_shape)), ids.shape[ids.ndim - 1])
    out = K.empty(ids.shape, np.int64)
    if ids.size:
        if not isinstance(past, int) and not _device.is_cuda_array(past):
            past = K.asarray(past)
        K.positions_from_padding(K.contiguous(ids).reshape(flat_shape), padding_idx, past,
                                 pad_position, out.reshape(flat_shape))
    return out
