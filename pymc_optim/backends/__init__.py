"""Who computes the numbers: scipy callbacks, graph-native loops, JAX/numba dispatch, batching."""
