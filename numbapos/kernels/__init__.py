"""Numba kernels, one namespace per device.

``cpu`` holds ``@njit`` kernels, ``cuda`` ``@cuda.jit`` kernels (imported only
when a CUDA array or ``device="cuda"`` asks for it). Both export the same
*launchers*: functions that take validated arrays of their device and
caller-owned outputs, and do every data step of one op (grouping, unique rows,
partial sums). Launchers never validate; :mod:`numbapos.functional` does, and
picks the namespace with :func:`numbapos._device.backend`.

The modules directly here are shared by both devices (the keyed hash, the
16-bit conversions, the optimisers' element updates, binary searches), compiled for either
target. The argument tuples the launchers take are in :mod:`numbapos._args`.
"""

import importlib
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def area_names() -> list[str]:
    """The op areas: the modules both backends have (``cpu/<area>.py`` and
    ``cuda/<area>.py``, twins with the same launchers). A backend's other modules are
    its own helpers. Read from the folders, so a new op family is its two files."""
    def modules(folder):
        return {path.stem for path in (_HERE / folder).glob("*.py")} - {"__init__"}
    return sorted(modules("cpu") & modules("cuda"))


def import_areas(package: str, namespace: dict) -> tuple:
    """Import ``package``'s area modules (:func:`area_names`) and put every launcher of
    their ``__all__`` in ``namespace``; returns the modules."""
    areas = tuple(importlib.import_module(f"{package}.{name}") for name in area_names())
    for area in areas:
        namespace.update({name: getattr(area, name) for name in area.__all__})
    return areas
