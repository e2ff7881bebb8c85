"""Tied embeddings: one matrix for the input embedding and the output projection (and, for
encoder-decoder models, one embedding shared by encoder and decoder).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memfit.errors import BadInputError
from memfit.techniques.registry import Build, handler


@dataclass(frozen=True, kw_only=True)
class TieEmbeddingsConfig:
    """One matrix for the input embedding and the output projection (and, for encoder-decoder
    models, one embedding shared by encoder and decoder)."""

    @property
    def label(self) -> str:
        """How reports and `apply_` name the technique."""
        return "tied embeddings"


def tie_embeddings(model: torch.nn.Module, name: str) -> None:
    """Make the output projection share the input embedding's weight (in place)."""
    get_in = getattr(model, "get_input_embeddings", None)
    get_out = getattr(model, "get_output_embeddings", None)
    inp = get_in() if callable(get_in) else None
    out = get_out() if callable(get_out) else None
    if inp is None or out is None:
        raise BadInputError(
            f"--tie-embeddings needs a model with input and output embeddings; {name!r} has "
            "no output embedding (an encoder or a vision model)."
        )
    if inp.weight.shape != out.weight.shape:
        raise BadInputError(
            f"Cannot tie the embeddings of {name!r}: input {tuple(inp.weight.shape)} and output "
            f"{tuple(out.weight.shape)} differ in shape."
        )
    out.weight = inp.weight


def tie_all_embeddings(model: torch.nn.Module) -> None:
    """Tie the output projection to the input embedding; for an encoder-decoder model, also
    make the decoder use the encoder's embedding. Marks the HF config as tied."""
    tie_embeddings(model, type(model).__name__)
    get_enc = getattr(model, "get_encoder", None)
    get_dec = getattr(model, "get_decoder", None)
    if callable(get_enc) and callable(get_dec):
        enc, dec = get_enc(), get_dec()
        e = getattr(enc, "embed_tokens", None)
        d = getattr(dec, "embed_tokens", None)
        if isinstance(e, torch.nn.Embedding) and isinstance(d, torch.nn.Embedding):
            if e.weight.shape != d.weight.shape:
                raise BadInputError(
                    f"Cannot share the encoder and decoder embeddings of "
                    f"{type(model).__name__}: shapes {tuple(e.weight.shape)} and "
                    f"{tuple(d.weight.shape)} differ."
                )
            d.weight = e.weight
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "tie_word_embeddings"):
        config.tie_word_embeddings = True


@handler
def _tie(config: TieEmbeddingsConfig, build: Build) -> None:
    tie_all_embeddings(build.model)
    build.applied.append(config.label)
