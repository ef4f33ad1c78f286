"""The built-in models (stock PyG models behind one call, `model(x, edge_index)`) and building any model.

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
from .modeldef import Model, load_model

__all__ = ["BUILTINS", "MODELS", "EdgeFreeMLP", "Model", "build_model", "spec_of", "supports_trim"]

SPEC_ATTRIBUTE = "_diskflow_model"
CLASSES_ATTRIBUTE = "_diskflow_classes"


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


def _sage(in_channels: int, out_channels: int, hidden_channels: int = 128, num_layers: int = 3,
          dropout: float = 0.0) -> torch.nn.Module:
    return GraphSAGE(in_channels, hidden_channels, num_layers, out_channels, dropout=dropout)


def _gcn(in_channels: int, out_channels: int, hidden_channels: int = 128, num_layers: int = 3,
         dropout: float = 0.0) -> torch.nn.Module:
    # Sampled subgraphs are directed (neighbour -> seed); GCN's self-loops keep each node's own row.
    return GCN(in_channels, hidden_channels, num_layers, out_channels, dropout=dropout)


def _gat(in_channels: int, out_channels: int, hidden_channels: int = 128, num_layers: int = 3,
         dropout: float = 0.0, heads: int = 4) -> torch.nn.Module:
    if heads < 1 or hidden_channels % heads:
        raise ConfigError("hidden", f"GAT needs a hidden size divisible by its {heads} heads, got {hidden_channels}")
    return GAT(in_channels, hidden_channels, num_layers, out_channels, dropout=dropout, heads=heads)


def _mlp(in_channels: int, out_channels: int, hidden_channels: int = 128, num_layers: int = 3,
         dropout: float = 0.0) -> torch.nn.Module:
    return EdgeFreeMLP(in_channels, hidden_channels, out_channels, num_layers, dropout=dropout)


# PyG's `trim_to_layer` leaves the seeds' outputs of GraphSAGE and GAT bit-identical (their layers
# only read a target's in-edges) at about half the cost. GCN is not trimmed: its symmetric
# normalisation reads the *source* node's degree, which trimming changes.
BUILTINS: dict[str, Model] = {
    "sage": Model("sage", _sage, trim=True),
    "gcn": Model("gcn", _gcn),
    "gat": Model("gat", _gat, trim=True),
    "mlp": Model("mlp", _mlp, seeds_only=True),
}


def spec_of(module: torch.nn.Module) -> Model | None:
    """The `Model` that built `module` (`build_model`), if any."""
    spec = getattr(module, SPEC_ATTRIBUTE, None)
    return spec if isinstance(spec, Model) else None


def supports_trim(model: torch.nn.Module) -> bool:
    """Whether `model` may skip, at layer k, the nodes and edges that cannot reach the seeds: its
    `Model` declares `trim`, or it is a stock GraphSAGE or GAT."""
    spec = spec_of(model)
    return spec.trim if spec is not None else isinstance(model, (GraphSAGE, GAT))


def build_model(name: str | Model, in_channels: int, hidden_channels: int, out_channels: int, num_layers: int,
                dropout: float = 0.0, heads: int = 4) -> torch.nn.Module:
    """Build a model, called uniformly as `model(x, edge_index)`: a built-in, a `.py` file's or a `Model`.

    Args:
        name: "sage" (GraphSAGE, mean aggregation), "gcn", "gat", "mlp" (ignores edges), the path
            of a ``.py`` file that defines a `diskflow.Model`, or a `Model`.
        in_channels: feature dimension.
        hidden_channels: width of the hidden layers (for "gat": total over all heads).
        out_channels: number of classes.
        num_layers: message-passing layers (normally the number of sampled hops).
        dropout: dropout probability between layers.
        heads: attention heads for "gat"; `hidden_channels` must be divisible by it.

    The module keeps its `Model` (`spec_of`): the loop reads its loss, trimming and source from it.

    Raises:
        ConfigError: unknown name or inconsistent sizes, naming the option.
        InputError: a model file that cannot be imported or whose factory fails, naming the file.
    """
    spec = load_model(name)
    if hidden_channels < 1:
        raise ConfigError("hidden", f"expected an integer >= 1, got {hidden_channels}")
    if num_layers < 1:
        raise ConfigError("num_layers", f"expected an integer >= 1, got {num_layers}")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError("dropout", f"expected a probability in [0, 1), got {dropout}")
    module = spec.build(in_channels, out_channels, hidden_channels=hidden_channels, num_layers=num_layers,
                        dropout=dropout, heads=heads)
    object.__setattr__(module, SPEC_ATTRIBUTE, spec)    # a plain attribute: not a submodule, not in state_dict
    object.__setattr__(module, CLASSES_ATTRIBUTE, int(out_channels))
    return module
