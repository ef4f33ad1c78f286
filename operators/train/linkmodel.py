"""A link task's model: an encoder of node embeddings and a decoder that scores pairs of them.

The encoder is any model the node task trains (a built-in, a user's `Model`), built with node
embeddings as its output; the decoder scores a batch's pairs from their two ends' embeddings,
the dot product unless the `Model` names its own. Wrapping both in one module keeps what every
path does with a model (moving it to a device, its optimizer over `parameters()`, checkpoints of
its `state_dict`, the data-parallel reduction) unchanged for a link task.
"""
from __future__ import annotations

from typing import Any

import torch

__all__ = ["DotProduct", "LinkModel", "is_link_model"]


class DotProduct(torch.nn.Module):
    """The default decoder: the dot product of a pair's two embeddings, as a logit."""

    def forward(self, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
        return (src * dst).sum(dim=-1)


class LinkModel(torch.nn.Module):
    """`encoder` (called as the node task's model is: ``encoder(x, edge_index, ...)`` -> node embeddings)
    and `decoder` (``decoder(h_src, h_dst)`` -> one logit per pair)."""

    def __init__(self, encoder: torch.nn.Module, decoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    @property
    def num_layers(self) -> Any:
        """The encoder's layers (what trimming to the sampled hops reads)."""
        return getattr(self.encoder, "num_layers", None)

    def forward(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.encoder(*args, **kwargs)

    def score(self, h: torch.Tensor, label_index: torch.Tensor) -> torch.Tensor:
        """The logits of the pairs `label_index` ([2, pairs], rows of `h`)."""
        out: torch.Tensor = self.decoder(h.index_select(0, label_index[0]), h.index_select(0, label_index[1]))
        return out.reshape(-1)


def is_link_model(model: torch.nn.Module) -> bool:
    """Whether `model` is a link task's (encoder and decoder)."""
    return isinstance(model, LinkModel)
