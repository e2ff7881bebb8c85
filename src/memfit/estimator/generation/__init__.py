"""`mode="generate"`: transformers' own generate traced, KV caches, decode extension."""
