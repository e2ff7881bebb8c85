"""The doctor: memory anti-patterns found at run time (graphs kept alive, growth, eval
without no_grad): recorders, graph walks, saved tensors, source sites, findings, rendering.

May import: `memfit.measurement` and every package below it.
"""
