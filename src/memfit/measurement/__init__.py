"""Measured memory of real steps (GPU, else CPU) as the same `MemoryProfile` an estimate
returns, and running a user's script inside a context.

May import: `memfit.simulation` and every package below it.
"""
