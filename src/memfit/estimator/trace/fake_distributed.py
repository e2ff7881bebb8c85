"""A fake process group for estimating sharded training on one CPU.

PyTorch's "fake" backend (torch.testing._internal.distributed.fake_pg) runs collectives as
no-ops that still allocate their outputs, so FSDP2's real code (sharding, all-gathers,
reduce-scatters) runs on FakeTensors for rank 0 of N. This is how memfit estimates the memory
of one rank of an N-GPU FSDP2 job (torchtitan estimates memory the same way).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from memfit._compat import ensure_c10d_meta_kernels
from memfit.errors import BadInputError


@contextlib.contextmanager
def fake_world(n: int) -> Iterator[Any]:
    """A fake default process group of `n` ranks (this process is rank 0) and its CPU mesh;
    the group is destroyed on exit. Refused inside a real distributed job."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise BadInputError(
            f"Estimating for {n} GPUs runs a fake process group, and this process already has "
            "a real one. Estimate outside the distributed job (memfit works on one CPU)."
        )
    ensure_c10d_meta_kernels()  # torch < 2.10 has none for the fake group's collectives
    dist.init_process_group("fake", rank=0, world_size=n, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (n,))
    finally:
        dist.destroy_process_group()
