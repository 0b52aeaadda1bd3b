"""Lowering: Numba kernels that turn a step's decisions into engine arrays (KV pool, batch plan)."""
