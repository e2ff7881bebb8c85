"""A simulated GPU for real CPU code (`simulate`), and the explanation of an out-of-memory
error, simulated or measured.

May import: `memfit.report` and every package below it.
"""
