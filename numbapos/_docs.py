"""Docstring text written once, put into several docstrings (as SciPy's ``docfiller``).

A docstring line that holds only ``{name}`` is replaced by the fragment
``name``, each of its lines indented as the placeholder. Fragments are written
from column 0 (a parameter's description four spaces in); only whole lines are
replaced, so braces elsewhere (``{"cpu", "cuda"}``) stay as they are::

    _DOC = {"out": '''\\
    out : ndarray, optional
        C-contiguous buffer of ``x``'s shape and dtype.'''}

    @fill_doc(_DOC)
    def op(x, out=None):
        '''... Parameters / ---------- / {out} ...'''
"""

from __future__ import annotations

import re

__all__ = ["MODULE", "OPS", "fill_doc"]

_PLACEHOLDER = re.compile(r"^(\s*)\{([A-Za-z_]\w*)\}\s*$")

# Shared by the ops of numbapos.functional.
OPS = {
    "deferred_error": """\
IndexError
    An index error deferred by an earlier GPU call.""",
}

# Shared by the modules of numbapos.nn.
MODULE = {
    "device": """\
device : {"cpu", "cuda"}, default "cpu"
    Where the parameters live and the module computes (see :meth:`Module.to`).""",
    "no_forward": """\
RuntimeError
    No recorded forward is left.""",
    "pending_forwards": """\
RuntimeError
    Forwards recorded that no backward has consumed yet.""",
    # the new rows of a position table resized in place (extend_, resize_position_embeddings)
    "resize_seed": """\
seed : int or numpy.random.Generator, optional
    Seeds the new rows of ``"init"``.

Returns
-------
self""",
}


def fill_doc(*dicts, **fragments):
    """A decorator (for functions, methods, classes) that fills the ``{name}`` lines of
    ``__doc__`` from the fragments of ``dicts`` and ``fragments`` (later ones win).

    KeyError, when it decorates, for a ``{name}`` line with no fragment; a
    stripped docstring (``python -OO``) is left alone.
    """
    fragments = {name: text for d in dicts + (fragments,) for name, text in d.items()}

    def fill(obj):
        if obj.__doc__:
            obj.__doc__ = "\n".join(_fill_line(line, fragments)
                                    for line in obj.__doc__.split("\n"))
        return obj

    return fill


def _fill_line(line, fragments):
    match = _PLACEHOLDER.match(line)
    if match is None:
        return line
    indent, name = match.groups()
    if name not in fragments:
        raise KeyError(f"fill_doc: no fragment {name!r} for the docstring line {line.strip()!r}")
    return "\n".join(indent + text if text else "" for text in fragments[name].split("\n"))
