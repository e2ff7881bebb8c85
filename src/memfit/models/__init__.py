"""Models: where they come from (catalog names, HF config.json, factories, modules), the
built-in catalog and zoo, and their structure (repeated blocks, embeddings, LoRA targets).

May import: `memfit.cuda` and the top level (errors, units, workload, profile, events).
"""
