"""Trainer integrations: callbacks that estimate a real run before its first step, and the
accelerate config reader of `memfit estimate --accelerate-config`.

Import the one you use; `memfit.integrations` itself imports neither transformers nor
Lightning:
- `memfit.integrations.transformers`: `MemfitCallback` for transformers' `Trainer`, and
  `training_arguments_for(plan, args)`;
- `memfit.integrations.lightning`: `MemfitCallback` for Lightning (`lightning` and
  `pytorch_lightning`);
- `memfit.integrations.accelerate_config`: `read_accelerate_config(path)`.
"""
