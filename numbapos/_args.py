"""What :mod:`numbapos.functional` hands to the launchers of either device.

Small named tuples that carry the scalars and arrays of wide launchers, the
IntEnums of every format, mode and norm code, the dropout threshold, and the
fixed chunking of deterministic reductions. Plain Python: importing it
compiles nothing.

The launchers of both devices take these records, and so do their kernels.
A CUDA kernel cannot take None, so the CUDA launchers hand their kernels the
same record with an absent array (a TiledIds' computed ``values``, a missing
LayerNorm weight, a counter the host holds) as an empty device array, which
the kernel tests with ``.size``, and floats cast to the data's dtype.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

import numpy as np

_TWO_32 = 1 << 32


def keep_threshold(p):
    """The threshold ``t`` with ``P(dropout_bits >= t) = 1 - p`` (to within 2**-33).

    Parameters
    ----------
    p : float
        Drop probability in ``[0, 1]`` (not validated here).

    Returns
    -------
    int
        ``round(p * 2**32)`` as a Python int in ``[0, 2**32]``: 0 keeps every
        element, and ``2**32`` (p == 1) keeps none. ``2**32`` does not fit a
        uint32, so kernels compare in uint64, where ``bits >= 2**32`` is always
        false; a p just below 1 is capped at ``2**32 - 1`` so that it still
        keeps (very rarely) what it scales.
    """
    if p >= 1.0:
        return _TWO_32
    return min(int(round(p * _TWO_32)), _TWO_32 - 1)



class DropoutArgs(NamedTuple):
    """One dropout call: mask bits of ``(seed, counter, index)`` against ``threshold``.

    ``active`` False means no dropout (the other fields are then ignored).
    ``scale`` is ``1 / (1 - p)`` (0 when p == 1), cast to the data's dtype by
    the kernels. ``live`` is None, or (CUDA only) a ``(1,)`` uint64 device
    array holding the counter: the kernels then read the counter there when
    they run (``counter`` is 0), so a captured step's replays see the value
    the device holds at each replay (:class:`numbapos.nn.Dropout`'s device
    counter, :mod:`numbapos.kernels.cuda.clock`).
    """

    seed: np.uint64
    counter: np.uint64
    threshold: np.uint64
    scale: float
    active: bool
    live: object = None

    @classmethod
    def make(cls, p: float, seed: int, counter, active: bool = True) -> DropoutArgs:
        """The arguments of dropout with probability ``p`` (validated by the caller);
        ``counter`` an int, or a device counter array (see ``live``)."""
        if not active or p == 0.0:
            return cls(np.uint64(0), np.uint64(0), np.uint64(0), 1.0, False)
        scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
        if isinstance(counter, int):
            return cls(np.uint64(seed), np.uint64(counter), np.uint64(keep_threshold(p)), scale,
                       True)
        return cls(np.uint64(seed), np.uint64(0), np.uint64(keep_threshold(p)), scale, True,
                   counter)


NO_DROPOUT = DropoutArgs(np.uint64(0), np.uint64(0), np.uint64(0), 1.0, False)


class SGDHyper(NamedTuple):
    """SGD's options for one parameter, floats already cast to its dtype."""

    lr: object
    momentum: object
    one_minus_dampening: object
    weight_decay: object
    nesterov: bool
    maximize: bool


class HalfRounding(NamedTuple):
    """How a sparse step writes a bfloat16 / float16 table back (its launchers' last argument).

    ``fmt`` is the table's :class:`TableFormat` (``BF16`` / ``F16``);
    with ``stochastic`` each element rounds with the keyed hash of
    ``(seed, step, row, column)``, else to nearest even. ``live`` is
    None, or (CUDA only) a ``(1,)`` uint64 device array holding the step,
    which the kernels read when they run (``step`` is then 0): the rounding
    step of :mod:`numbapos.optim` on the GPU, which a captured step's replays
    advance (:class:`numbapos.kernels.cuda.clock.DeviceCounter`).
    """

    fmt: int
    seed: np.uint64
    step: np.uint64
    stochastic: bool
    live: object = None


class RowGroups(NamedTuple):
    """Positions of a flat index array grouped by the row they name (on the launcher's device).

    ``rows`` (int64) are the distinct rows in ascending order (padding left
    out); positions ``order[starts[j]:starts[j] + counts[j]]`` name ``rows[j]``,
    in increasing order. Made by the launcher ``group_rows``, consumed by
    ``sum_row_groups`` and the fused optimiser updates.

    ``used`` says how many entries are real. On the CPU it is an int and the
    arrays hold exactly that many rows. On the GPU the count depends on the
    data and stays there: ``rows``, ``starts`` and ``counts`` are sized by
    the upper bound (the number of positions) and ``used`` is a device array
    ``[distinct rows, grouped positions]`` that kernels read.
    """

    rows: object
    starts: object
    counts: object
    order: object
    used: object


class TiledIds(NamedTuple):
    """Ids of T tokens without a ``(T,)`` array (what the GPU launchers take, so that
    default and broadcast ids cost no host work and no copy).

    Token ``t`` has id ``values[t % length]``, or ``start + t % length`` when
    ``values`` is None: default positions are ``TiledIds(None, past_length, L)``,
    positions of shape ``(L,)`` broadcast over the batch ``TiledIds(ids, 0, L)``,
    all-zero token types ``TiledIds(None, 0, 1)``. ``length`` divides T (>= 1).
    """

    values: object
    start: int
    length: int


class BertIds(NamedTuple):
    """Flat int64 ids of the BERT block, one entry per token (length T each).

    On the GPU ``position`` and ``token_type`` may also be :class:`TiledIds`.
    """

    word: object
    position: object
    token_type: object


class BertTables(NamedTuple):
    """The BERT block's tables, ``(V, D)``, ``(P, D)``, ``(T, D)``, and LayerNorm ``(D,)``.

    ``gamma`` / ``beta`` may be None (ones / zeros); launchers substitute.
    """

    word: object
    position: object
    token_type: object
    gamma: object
    beta: object


# Sums over rows (LayerNorm weight/bias gradients, the BERT block's token-type
# gradient) are taken per chunk of rows, then over the chunks in order. The
# chunking depends only on the number of rows, never on the thread count or
# the GPU model, so every device and thread count adds the same partials.
MIN_CHUNK_ROWS = 16
MAX_CHUNKS = 256


def chunk_rows(num_rows: int) -> int:
    """Rows per chunk of a deterministic reduction over ``num_rows`` rows."""
    return max(MIN_CHUNK_ROWS, -(-num_rows // MAX_CHUNKS))


def num_chunks(num_rows: int) -> int:
    """How many chunks :func:`chunk_rows` cuts ``num_rows`` rows into (at least 1)."""
    return max(1, -(-num_rows // chunk_rows(num_rows)))


class AdamHyper(NamedTuple):
    """Adam's scalars for one step of one parameter, floats already cast to its dtype.

    ``neg_step_size`` is ``-lr / (1 - beta1**step)`` for a dense step and
    ``-lr * sqrt(1 - beta2**step) / (1 - beta1**step)`` for a sparse one
    (``torch.optim.SparseAdam``); ``decay`` is ``1 - lr * weight_decay``
    (AdamW's decoupled decay).
    """

    one_minus_beta1: object
    beta2: object
    one_minus_beta2: object
    eps: object
    weight_decay: object
    decay: object
    neg_step_size: object
    bias_correction2_sqrt: object
    decoupled: bool
    amsgrad: bool
    maximize: bool


class AdagradHyper(NamedTuple):
    """Adagrad's scalars for one step, cast to the parameter's dtype.

    ``neg_clr`` is ``-lr / (1 + (step - 1) * lr_decay)``.
    """

    neg_clr: object
    weight_decay: object
    eps: object
    maximize: bool


# ---------------------------------------------------------------- codes
#
# Every format, mode and norm code a launcher or kernel takes is one of these
# IntEnums (ints, so NumPy and the launchers compare them as such). Kernel
# sources compare with module-level ``int(...)`` copies of the members: Numba
# types an int global as a literal, which specialises the functions it is
# passed to (and prunes their branches), while an IntEnum member is typed
# ``IntEnum<int64>``, a run-time value and another specialisation. Launchers hand
# kernels plain ints (``np.int64(code)``) for the same reason.


class TableFormat(IntEnum):
    """How a table's elements are stored: what kernels read through ``widen``.

    ``FLOAT``: float32 / float64, read as they are; ``BF16`` / ``F16``: bfloat16
    / float16 tables given as their ``uint16`` bits (``kernels.halfbits``).
    """

    FLOAT = -1
    BF16 = 0
    F16 = 1


class AlibiMode(IntEnum):
    """How an ALiBi bias measures the query-key distance (``kernels/*/alibi.py``).

    ``SYMMETRIC``: ``-|i + shift - j|`` (flash-attention's bidirectional form);
    ``MPT``: ``j - shift``; ``BLOOM``: the key's position from the attention mask.
    """

    SYMMETRIC = 0
    MPT = 1
    BLOOM = 2


class NormKind(IntEnum):
    """The branch a max-norm kernel takes for its ``norm_type`` p (the CPU's branches)."""

    INF = 0
    L2 = 1
    L1 = 2
    P = 3


class ClockKind(IntEnum):
    """What an optimiser's device clock computes at each step (``kernels.cuda.clock``):
    the learning rate alone (SGD), or also the step's Adam / Adagrad scalars."""

    SGD = 0
    ADAM = 1
    ADAGRAD = 2


class WeightDecayMode(IntEnum):
    """Row-wise Adagrad's weight decay, FBGEMM's ``WeightDecayMode`` numbers."""

    NONE = 0
    L2 = 1
    DECOUPLED = 2


# The names RowWiseAdagrad takes.
WEIGHT_DECAY_MODES = {"none": WeightDecayMode.NONE, "l2": WeightDecayMode.L2,
                      "decoupled": WeightDecayMode.DECOUPLED}


class RowWiseAdagradHyper(NamedTuple):
    """Row-wise Adagrad's scalars in the parameter's dtype; ``mode`` from WEIGHT_DECAY_MODES."""

    lr: object
    eps: object
    weight_decay: object
    mode: int


class RotaryAngles(NamedTuple):
    """How a rotary cos / sin table is made from positions and frequencies.

    ``scale`` multiplies cos and sin (the attention scaling of YaRN / LongRoPE);
    ``sign`` is +1 for the forward rotation and -1 for its transpose (the
    backward); ``float32_angle`` rounds the angle as transformers does
    (``float32(position) * float32(inv_freq)``) instead of forming it in float64.
    """

    scale: float
    sign: float
    float32_angle: bool
