"""A Lightning callback (the `lightning` package's namespace, `lightning.pytorch`) that estimates
the run before its first step, stops it when it will not fit (naming the Trainer arguments to
change), and measures the first steps. For the `pytorch_lightning` package, import the same
callback from memfit.integrations.pytorch_lightning.

Example:
    >>> import lightning as L
    >>> from memfit.integrations.lightning import MemfitCallback
    >>> L.Trainer(callbacks=[MemfitCallback(gpu="rtx-4090")]).fit(module, loader)

See memfit.integrations._lightning_hooks for what is read, and docs/integrations.md.
"""

from __future__ import annotations

import lightning.pytorch

from memfit.integrations._lightning_hooks import LightningHooks
from memfit.integrations._session import Comparison, WontFitError

__all__ = ["Comparison", "MemfitCallback", "WontFitError"]


class MemfitCallback(LightningHooks, lightning.pytorch.Callback):
    __doc__ = LightningHooks.__doc__
