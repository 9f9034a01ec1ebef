"""Numba kernels, one namespace per device.

``cpu`` holds ``@njit`` kernels, ``cuda`` ``@cuda.jit`` kernels (imported only
when a CUDA array or ``device="cuda"`` asks for it). Both export the same
*launchers*: functions that take validated arrays of their device and
caller-owned outputs, and do every data step of one op (grouping, unique rows,
partial sums). Launchers never validate; :mod:`numbapos.functional` does, and
picks the namespace with :func:`numbapos._device.backend`.

``hash`` is shared by both devices: the dropout hash, compiled for either
target. The argument tuples the launchers take are in :mod:`numbapos._args`.
"""
