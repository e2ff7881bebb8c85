"""The trace: the step run on fake tensors under the storage tracker, with CUDA's
behaviour emulated (tracker, step runner, attention kernel choice, block replay, the trace
cache)."""
