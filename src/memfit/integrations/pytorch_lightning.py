"""memfit.integrations.lightning's callback for the `pytorch_lightning` package, whose Trainer
takes its own namespace's Callback class.

Example:
    >>> import pytorch_lightning as pl
    >>> from memfit.integrations.pytorch_lightning import MemfitCallback
    >>> pl.Trainer(callbacks=[MemfitCallback(gpu="rtx-4090")]).fit(module, loader)
"""

from __future__ import annotations

import pytorch_lightning

from memfit.integrations._lightning_hooks import LightningHooks
from memfit.integrations._session import Comparison, WontFitError

__all__ = ["Comparison", "MemfitCallback", "WontFitError"]


class MemfitCallback(LightningHooks, pytorch_lightning.Callback):
    __doc__ = LightningHooks.__doc__
