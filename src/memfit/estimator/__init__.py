"""The estimate: trace a step on fake CPU tensors (tracker, step runner, CUDA emulation,
attention choice), replay repeated blocks, and turn the stream into device memory.

May import: `memfit.techniques`, `memfit.models`, `memfit.cuda` and the top level.
"""
