"""Several GPUs: DDP, FSDP2 and tensor parallelism."""
