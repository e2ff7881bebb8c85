"""`memfit gpus --for`: GPUs ranked for a run, and their table and JSON."""
