"""``@njit`` CPU kernels, one submodule per area (embedding, optim, ...)."""
