"""Dropout: inverted dropout with a reproducible, counter-based mask."""

from __future__ import annotations

import numpy as np

from .. import _checks, _device
from .. import functional as F
from .._docs import MODULE, fill_doc
from ..functional.capture import device_counter
from .module import Module


def _resolve_seed(seed) -> int:
    if seed is None:
        return int(np.random.SeedSequence().generate_state(1, dtype=np.uint64)[0])
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(0, np.iinfo(np.uint64).max, dtype=np.uint64, endpoint=True))
    return _checks.check_uint64(seed, "seed")


class Dropout(Module):
    """Zero each element with probability ``p`` while training; scale the rest by 1/(1-p).

    The mask of a training call is a hash of ``(seed, counter, element
    index)`` (see :func:`numbapos.functional.dropout`): the module owns the seed
    and a call counter that every training-mode :meth:`forward` uses and then
    advances by one (when ``p > 0``), so successive calls draw fresh masks and a module rebuilt
    with the same seed replays the same sequence of masks, on any number of
    threads. In evaluation mode (:meth:`~Module.eval`) it is the identity and
    the counter does not move.

    Parameters
    ----------
    p : float, default 0.5
        Drop probability in ``[0, 1]``.
    seed : int, numpy.random.Generator or None, default None
        The hash seed, an integer in ``[0, 2**64)``. None draws one from the
        operating system's entropy once, here; a Generator draws one from it.
    device : {"cpu", "cuda"}, default "cpu"
        Recorded for :attr:`device`; dropout runs wherever its input lives and
        draws the same mask on either device.

    Attributes
    ----------
    p : float
    seed : int
        The seed in use (read it to reproduce a run that used ``seed=None``);
        may be set.
    counter : int
        The counter the next training-mode forward will use; may be set.

    Notes
    -----
    The module has no parameters. ``seed`` and ``counter`` are 0-d uint64
    buffers: they are in :meth:`~Module.state_dict`, so loading a checkpoint
    resumes the mask stream where it was saved. :meth:`backward` regenerates
    the mask of its forward from ``(seed, counter)`` rather than storing it.

    On CUDA input the counter also lives in device memory (made at the first
    training forward there): each forward launches a one-thread kernel that
    hands this forward's counter to its kernels (and to its backward) and
    advances the device's counter, so a step captured with
    :func:`numbapos.cuda.capture` draws a fresh mask at every replay, the
    masks of the same number of eager steps, bit for bit (and the CPU's). The
    ``counter`` attribute and the state dict stay exact without reading the
    device: the host counts the forwards (and each replay's); a counter set
    on the host is copied to the device at the next forward or replay. The
    seed is a kernel argument: set it outside a captured step's life.
    """

    # A state dict without the stream loads (strictly) and keeps the current one.
    _optional_state = ("seed", "counter")

    def __init__(self, p=0.5, seed=None, device="cpu"):
        super().__init__()
        self.p = _checks.check_unit_interval(p, "p")
        self.register_buffer("seed", np.array(_resolve_seed(seed), dtype=np.uint64))
        self.register_buffer("counter", np.array(0, dtype=np.uint64))
        self._place(device)

    # The seed and the counter are 0-d uint64 buffers (in the state dict, so a
    # checkpoint restores the mask stream), read and set as Python ints.

    @property
    def seed(self) -> int:
        return int(self._buffers["seed"])

    @seed.setter
    def seed(self, value) -> None:
        self._buffers["seed"][()] = _checks.check_uint64(value, "seed")

    @property
    def counter(self) -> int:
        return int(self._buffers["counter"])

    @counter.setter
    def counter(self, value) -> None:
        self._buffers["counter"][()] = _checks.check_uint64(value, "counter")

    def _draw(self, device: str = "cpu", defer: bool = False) -> dict:
        """The dropout keywords of the next forward on ``device`` (call :meth:`_advance` once
        it succeeded).

        Used by this module and by the layers that apply their Dropout child's
        mask inside their own kernels (the fused blocks, LearnedPosEmbedding).
        On ``"cuda"`` the counter is this draw's device counter (a ``(1,)``
        uint64 CUDA array, see the class notes): the device's counter has
        advanced already, the host's moves in :meth:`_advance`. With ``defer``
        it is the :class:`~numbapos.kernels.cuda.clock.DeviceCounter` itself,
        for an op that draws from it (``draw_into``); :meth:`_advance` then puts
        the op's drawn array in its place.
        """
        buffers = self._buffers
        p = self.p
        active = self.training and p > 0.0
        if active and device == "cuda":
            source = self.__dict__.get("_counter_on_device") or self._device_counter()
            counter = source.prepared() if defer else source.draw()
        else:
            counter = int(buffers["counter"]) if active else 0
        return {"p": p, "seed": int(buffers["seed"]), "training": active, "counter": counter}

    def _advance(self, drop: dict, drawn=None) -> None:
        """Move the counter past a mask drawn by a forward that succeeded.

        ``drawn``: the array an op drew a deferred draw (``_draw(defer=True)``)
        into, or that holds it (``BertEmbeddings``'s record); the device
        counter's host count advances too, and ``drawn`` becomes ``drop``'s
        counter (this forward's, for its backward).
        """
        if drawn is not None:
            drop["counter"].host += 1
            drop["counter"] = drawn
        if drop["training"]:
            counter = self._buffers["counter"]
            counter[()] = int(counter) + 1

    def _device_counter(self):
        """The counter on the device (:class:`numbapos.kernels.cuda.clock.DeviceCounter`),
        made from the host's at the first CUDA draw."""
        found = self.__dict__.get("_counter_on_device")
        if found is None:
            found = device_counter(self._host_counter, self._set_host_counter)
            self.__dict__["_counter_on_device"] = found
        return found

    def _host_counter(self) -> int:
        return int(self._buffers["counter"])

    def _set_host_counter(self, value: int) -> None:
        self._buffers["counter"][()] = value

    def __getstate__(self):
        # The device counter is a mirror of the host's (remade at the next CUDA draw).
        state = self.__dict__.copy()
        state.pop("_counter_on_device", None)
        return state

    def forward(self, x, out=None):
        """Apply dropout to ``x`` (any shape, float32/float64).

        Parameters
        ----------
        x : ndarray
        out : ndarray, optional
            Result buffer, as for :func:`numbapos.functional.dropout`.

        Returns
        -------
        ndarray
            In training mode with ``p > 0`` a new array (or ``out``); in
            evaluation mode, or with ``p == 0``, ``x`` itself (unless ``out``
            is given).
        """
        x = _checks.check_float_array(x, "x")
        drop = self._draw(_device.device_of(x))
        y = F.dropout(x, out=out, **drop)
        self._advance(drop)
        if self._recording():
            self._save_for_backward((tuple(x.shape), drop))
        return y

    @fill_doc(MODULE)
    def backward(self, grad_output, out=None):
        """Gradient wrt the input of the matching :meth:`forward`: ``grad_output`` times its mask.

        With ``p == 0`` this is the identity (``grad_output`` itself is returned).

        Raises
        ------
        {no_forward}
        ValueError
            ``grad_output``'s shape differs from that forward's input (the
            record is kept).
        """
        shape, drop = self._saved_context()
        grad_output = _checks.check_float_array(grad_output, "grad_output")
        _checks.check_same_shape(grad_output, shape, "grad_output",
                                 "the shape of the matching forward's input")
        grad = F.dropout_backward(grad_output, out=out, **drop)
        self._release()
        return grad

    def extra_repr(self) -> str:
        return f"p={self.p}, seed={self.seed}"
