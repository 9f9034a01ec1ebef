"""Array steps the layers above need on whichever device the arrays live.

A parameter accumulating a dense gradient adds it in place (:func:`add_`); a
module handing a gradient to a parameter of another dtype converts it
(:func:`contiguous`). Both run where the arrays are, through the launchers of
that device's ``arrays`` area: :mod:`numbapos.nn` calls these instead of
reaching a backend itself.
"""

from __future__ import annotations

from .. import _device
from .._docs import OPS, fill_doc

__all__ = ["add_", "contiguous"]


@fill_doc(OPS)
def add_(out, x):
    """``out += x`` elementwise, in place, on ``out``'s device.

    Parameters
    ----------
    out : ndarray or CUDA array
        C-contiguous and writeable; modified in place.
    x : ndarray or CUDA array
        Same shape and dtype as ``out``, on its device (not checked here:
        callers pass arrays they checked, as
        :meth:`numbapos.nn.Parameter.accumulate_grad` does).

    Returns
    -------
    ndarray or CUDA array
        ``out``.

    Raises
    ------
    RuntimeError
        ``out`` is a CUDA array and CUDA cannot be used.
    {deferred_error}
    """
    _device.backend(out).add_(out, x)
    return out


@fill_doc(OPS)
def contiguous(x, dtype=None):
    """``x`` as a C-contiguous array of ``dtype`` on its device (``x`` itself when it is one).

    A dtype change copies, elementwise (a plain cast, as NumPy's ``astype``).

    Parameters
    ----------
    x : ndarray or CUDA array
        On the GPU it must be C-contiguous already (``numbapos._checks``
        refuses other CUDA arrays).
    dtype : dtype, optional
        The result's dtype (default: ``x``'s).

    Returns
    -------
    ndarray or CUDA array
        On ``x``'s device.

    Raises
    ------
    RuntimeError
        ``x`` is a CUDA array and CUDA cannot be used.
    {deferred_error}
    """
    return _device.backend(x).contiguous(x, dtype)
