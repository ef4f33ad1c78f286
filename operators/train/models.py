"""Building any model (a built-in, a user's file or a `Model`) as a module called `model(x, edge_index)`.

Pipelines differ only in where a batch's features come from, never in the model, so
accuracy and speed compare like for like. The MLP baseline takes (and ignores) the same
`edge_index`, so one training loop serves all four and the SAGE-vs-MLP gap measures
exactly what the graph adds.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch
from torch_geometric.nn.models import GAT, GraphSAGE

from ...errors import ConfigError
from .catalog import BUILTINS, load_model
from .linkmodel import DotProduct, LinkModel
from .mlp import EdgeFreeMLP
from .modeldef import BUILTIN_MODELS as MODELS
from .modeldef import Model

__all__ = ["BUILTINS", "CLASSES_ATTRIBUTE", "MODELS", "EdgeFreeMLP", "LinkModel", "Model", "build_model", "hetero_of",
           "spec_of", "supports_trim", "takes_edge_attr"]

SPEC_ATTRIBUTE = "_diskflow_model"
CLASSES_ATTRIBUTE = "_diskflow_classes"
HETERO_ATTRIBUTE = "_diskflow_hetero"


def hetero_of(module: torch.nn.Module) -> tuple[Any, str] | None:
    """(the typed layout, the target node type) of a model built for a typed graph (`build_model`), else None."""
    return getattr(module, HETERO_ATTRIBUTE, None)


def spec_of(module: torch.nn.Module) -> Model | None:
    """The `Model` that built `module` (`build_model`), if any."""
    spec = getattr(module, SPEC_ATTRIBUTE, None)
    return spec if isinstance(spec, Model) else None


def supports_trim(model: torch.nn.Module) -> bool:
    """Whether `model` may skip, at layer k, the nodes and edges that cannot reach the seeds: its
    `Model` declares `trim`, or it is a stock GraphSAGE or GAT."""
    spec = spec_of(model)
    if isinstance(model, LinkModel):
        return spec.trim if spec is not None else supports_trim(model.encoder)
    return spec.trim if spec is not None else isinstance(model, (GraphSAGE, GAT))


def takes_edge_attr(model: torch.nn.Module) -> bool:
    """Whether `model`'s forward takes ``edge_attr`` (stock PyG models that use it, and a user's that names it)."""
    inner = model.encoder if isinstance(model, LinkModel) else model
    if isinstance(inner, (GraphSAGE,)):
        return False            # its layers read no edge features (PyG drops them)
    try:
        return "edge_attr" in inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return False


def _takes_metadata(factory: Any) -> bool:
    try:
        return "metadata" in inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False


def build_model(name: str | Model, in_channels: int, hidden_channels: int, out_channels: int, num_layers: int,
                dropout: float = 0.0, heads: int = 4, edge_dim: int | None = None,
                link: bool = False, hetero: tuple[Any, str] | None = None) -> torch.nn.Module:
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
        edge_dim: the width of the graph's edge features (None: it has none); "gat" attends over them,
            a factory that takes ``edge_dim`` gets it.
        link: build a link task's model (`linkmodel.LinkModel`): the model as the encoder, with
            `out_channels` embedding channels, and the `Model`'s decoder (None: the dot product).
        hetero: (layout, target type) of a typed graph (`formats.hetero.HeteroLayout`): the module is
            called ``model(x_dict, edge_index_dict)`` and its target type's rows are the logits. A factory
            that takes ``metadata`` gets PyG's ``(node_types, edge_types)`` and builds a heterogeneous
            module itself (`HeteroConv`, `to_hetero`, ...); any other is made heterogeneous by PyG's
            `to_hetero` (one copy of each layer per edge type, summed per node type). Every type's rows
            reach the module at `in_channels` (the feature table's width: narrower types zero-padded).
            A model that reads a node's own row only (the MLP) stays as it is: it sees the seeds' rows.

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
    if hetero is not None and link:
        raise ConfigError("task", "link prediction on a typed graph is not supported yet: train a node task")
    typed_factory = hetero is not None and _takes_metadata(spec.factory)
    module = spec.build(in_channels, out_channels, hidden_channels=hidden_channels, num_layers=num_layers,
                        dropout=dropout, heads=heads, edge_dim=edge_dim,
                        **({"metadata": hetero[0].metadata()} if typed_factory and hetero is not None else {}))
    if hetero is not None and not (isinstance(module, EdgeFreeMLP) or spec.seeds_only):
        if not typed_factory:
            from torch_geometric.nn import to_hetero

            try:
                module = to_hetero(module, hetero[0].metadata(), aggr="sum")
            except Exception as e:      # torch.fx cannot trace it: say which model and what to do
                raise spec.error(f"PyG's to_hetero could not make it heterogeneous ({type(e).__name__}: {e}); give "
                                 "its factory a `metadata` argument and build a heterogeneous module there") from e
        object.__setattr__(module, HETERO_ATTRIBUTE, hetero)
    if link:
        decoder = DotProduct() if spec.decoder is None else \
            spec.call("decoder factory", spec.decoder, (out_channels,), {}, torch.nn.Module, "a torch.nn.Module",
                      f"channels={out_channels}")
        object.__setattr__(module, SPEC_ATTRIBUTE, spec)
        module = LinkModel(module, decoder)
    object.__setattr__(module, SPEC_ATTRIBUTE, spec)    # a plain attribute: not a submodule, not in state_dict
    object.__setattr__(module, CLASSES_ATTRIBUTE, int(out_channels))
    return module
