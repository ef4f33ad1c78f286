"""The GNN models every pipeline trains: stock PyG models behind one call, `model(x, edge_index)`.

Pipelines differ only in where a batch's features come from, never in the model, so
accuracy and speed compare like for like. The MLP baseline takes (and ignores) the same
`edge_index`, so one training loop serves all four and the SAGE-vs-MLP gap measures
exactly what the graph adds.
"""
from __future__ import annotations

import torch
from torch_geometric.nn import MLP
from torch_geometric.nn.models import GAT, GCN, GraphSAGE

from ..formats.errors import ConfigError
from .config import MODELS

__all__ = ["MODELS", "EdgeFreeMLP", "build_model", "supports_trim"]


class EdgeFreeMLP(torch.nn.Module):
    """`torch_geometric.nn.MLP` with the GNN call signature; the graph is ignored."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, num_layers: int,
                 dropout: float = 0.0) -> None:
        super().__init__()
        # No normalisation, like the GNNs below: the baseline differs from them only in the graph.
        self.mlp = MLP(in_channels=in_channels, hidden_channels=hidden_channels, out_channels=out_channels,
                       num_layers=num_layers, dropout=dropout, norm=None)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor | None = None) -> torch.Tensor:
        """Per-node logits from the node's own features only."""
        return self.mlp(x)

    def reset_parameters(self) -> None:
        self.mlp.reset_parameters()


def supports_trim(model: torch.nn.Module) -> bool:
    """Whether `model` may skip, at layer k, the nodes and edges that cannot reach the seeds.

    PyG's `trim_to_layer` (the `num_sampled_*_per_hop` arguments) leaves the seeds' outputs
    of GraphSAGE and GAT bit-identical (their layers only read a target's in-edges) at about
    half the cost. GCN is not trimmed: its symmetric normalisation reads the *source*
    node's degree, which trimming changes.
    """
    return isinstance(model, (GraphSAGE, GAT))


def build_model(name: str, in_channels: int, hidden_channels: int, out_channels: int, num_layers: int,
                dropout: float = 0.0, heads: int = 4) -> torch.nn.Module:
    """Build one of the models in `MODELS`, called uniformly as `model(x, edge_index)`.

    Args:
        name: "sage" (GraphSAGE, mean aggregation), "gcn", "gat" or "mlp" (ignores edges).
        in_channels: feature dimension.
        hidden_channels: width of the hidden layers (for "gat": total over all heads).
        out_channels: number of classes.
        num_layers: message-passing layers (normally the number of sampled hops).
        dropout: dropout probability between layers.
        heads: attention heads for "gat"; `hidden_channels` must be divisible by it.

    Raises:
        ConfigError: unknown name or inconsistent sizes, naming the CLI option.
    """
    if name not in MODELS:
        raise ConfigError("--model", f"unknown model {name!r}; expected one of {', '.join(MODELS)}")
    if hidden_channels < 1:
        raise ConfigError("--hidden", f"expected an integer >= 1, got {hidden_channels}")
    if num_layers < 1:
        raise ConfigError("--num-layers", f"expected an integer >= 1, got {num_layers}")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError("--dropout", f"expected a probability in [0, 1), got {dropout}")
    if name == "sage":
        return GraphSAGE(in_channels, hidden_channels, num_layers, out_channels, dropout=dropout)
    if name == "gcn":
        # Sampled subgraphs are directed (neighbour -> seed); GCN's self-loops keep each node's own row.
        return GCN(in_channels, hidden_channels, num_layers, out_channels, dropout=dropout)
    if name == "gat":
        if heads < 1 or hidden_channels % heads:
            raise ConfigError("--hidden", f"GAT needs a hidden size divisible by its {heads} heads, "
                                          f"got {hidden_channels}")
        return GAT(in_channels, hidden_channels, num_layers, out_channels, dropout=dropout, heads=heads)
    return EdgeFreeMLP(in_channels, hidden_channels, out_channels, num_layers, dropout=dropout)
