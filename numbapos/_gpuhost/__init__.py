"""The GPU host path: what runs on the CPU to put numbapos's kernels on a GPU.

The kernels and their launchers are :mod:`numbapos.kernels.cuda`; this package
holds what every launcher shares and none of them computes with:

- :mod:`.streams`: the stream numbapos's work goes to (per thread), capture rules.
- :mod:`.memory`: the caching allocator (per stream pools), ``empty_cache``.
- :mod:`.fastlaunch`: launching a compiled kernel with pre-packed parameters,
  the native ``cuLaunchKernel`` trampoline, device-array factories.
- :mod:`.plans`: per-op plans (record an op's launches and allocations once per
  call signature, replay them with new pointers in one native call).
- :mod:`.graphs`: capturing a training step as a CUDA graph.

Like :mod:`numbapos.kernels.cuda`, it is imported only once CUDA is used:
``import numbapos`` never imports ``numba.cuda``.
"""
