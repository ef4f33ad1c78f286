"""The MLP baseline as a GNN: `torch_geometric.nn.MLP` called as ``model(x, edge_index)``, the graph ignored,
so the baseline differs from the GNNs only in the graph."""
from __future__ import annotations

import torch
from torch_geometric.nn import MLP

__all__ = ["EdgeFreeMLP"]


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
