"""Memory moved to the host: optimizer state, activations, the embedding, FSDP2 shards."""
