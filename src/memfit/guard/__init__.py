"""Surviving OOM at run time: `oom_guard` retries with a smaller micro-batch that keeps the
effective batch, and `find_batch_size` searches the largest batch that runs.

May import: `memfit.diagnosis` and every package below it.
"""
