"""Renderers of results: terminal text, the JSON contract, timelines (PNG, HTML), the
memory_viz snapshot export, and the comparison of an estimate with a measurement.

May import: `memfit.estimator` and every package below it.
"""
