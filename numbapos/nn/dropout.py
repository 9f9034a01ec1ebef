"""Dropout: inverted dropout with a reproducible, counter-based mask."""

from __future__ import annotations

import numpy as np

from .. import _checks
from .. import functional as F
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
    advances by one, so successive calls draw fresh masks and a module rebuilt
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
        The seed in use (read it to reproduce a run that used ``seed=None``).
    counter : int
        The counter the next training-mode forward will use; may be set.

    Notes
    -----
    The module has no parameters. :meth:`backward` regenerates the mask of the
    last forward from ``(seed, counter)`` rather than storing it.
    """

    def __init__(self, p=0.5, seed=None, device="cpu"):
        super().__init__()
        self.p = _checks.check_unit_interval(p, "p")
        self.seed = _resolve_seed(seed)
        self.counter = 0
        self._last = None  # (counter, shape, p) of the last forward; counter None: identity
        self._place(device)

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
            In training mode a new array (or ``out``); in evaluation mode, or with
            ``p == 0``, ``x`` itself (unless ``out`` is given).
        """
        counter = _checks.check_uint64(self.counter, "counter")
        if self.training:
            y = F.dropout(x, self.p, self.seed, training=True, counter=counter, out=out)
            self.counter = counter + 1
            self._last = (counter, x.shape, self.p)
        else:
            y = F.dropout(x, self.p, self.seed, training=False, out=out)
            self._last = (None, x.shape, self.p)
        return y

    def backward(self, grad_output, out=None):
        """Gradient wrt the input of the last :meth:`forward`: ``grad_output`` times its mask.

        After an evaluation-mode forward this is the identity (``grad_output``
        itself is returned).

        Raises
        ------
        RuntimeError
            No forward has run yet.
        ValueError
            ``grad_output``'s shape differs from that forward's input.
        """
        if self._last is None:
            raise RuntimeError("Dropout.backward called before forward")
        counter, shape, p = self._last
        grad_output = _checks.check_float_array(grad_output, "grad_output")
        _checks.check_same_shape(grad_output, shape, "grad_output",
                                 "the shape of the last forward's input")
        if counter is None:
            return F.dropout_backward(grad_output, p, self.seed, training=False, out=out)
        return F.dropout_backward(grad_output, p, self.seed, counter=counter, out=out)

    def extra_repr(self) -> str:
        return f"p={self.p}, seed={self.seed}"
