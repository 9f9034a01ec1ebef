"""Numba kernels. ``cpu`` holds ``@njit`` kernels; each submodule does one job.

Kernels never validate and never allocate result buffers: ``numbapos.functional``
checks inputs, allocates, and picks the kernel.
"""
