"""The models a run can name: the built-ins (GraphSAGE, GCN, GAT and an MLP baseline, as `Model` objects) and
`load_model`, which gives the `Model` of a built-in name or of a user's ``.py`` file (docs/design.md,
"Pipelines as data"). Importing it imports no torch: the factories import PyG when a model is built."""
from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

from ...errors import ConfigError
from ..formats.userfile import import_user_file
from .modeldef import DATA_ONLY, USER_MODULE, Model, check_model_option, file_hash, is_model_file

__all__ = ["BUILTINS", "load_model"]


def _sage(in_channels: int, out_channels: int, hidden_channels: int = 128, num_layers: int = 3,
          dropout: float = 0.0) -> Any:
    from torch_geometric.nn.models import GraphSAGE

    return GraphSAGE(in_channels, hidden_channels, num_layers, out_channels, dropout=dropout)


def _gcn(in_channels: int, out_channels: int, hidden_channels: int = 128, num_layers: int = 3,
         dropout: float = 0.0) -> Any:
    # Sampled subgraphs are directed (neighbour -> seed); GCN's self-loops keep each node's own row.
    from torch_geometric.nn.models import GCN

    return GCN(in_channels, hidden_channels, num_layers, out_channels, dropout=dropout)


def _gat(in_channels: int, out_channels: int, hidden_channels: int = 128, num_layers: int = 3,
         dropout: float = 0.0, heads: int = 4, edge_dim: int | None = None) -> Any:
    if heads < 1 or hidden_channels % heads:
        raise ConfigError("hidden", f"GAT needs a hidden size divisible by its {heads} heads, got {hidden_channels}")
    from torch_geometric.nn.models import GAT

    # with edge features, every layer's attention reads them too (GATConv's edge_dim)
    return GAT(in_channels, hidden_channels, num_layers, out_channels, dropout=dropout, heads=heads,
               **({"edge_dim": edge_dim} if edge_dim else {}))


def _mlp(in_channels: int, out_channels: int, hidden_channels: int = 128, num_layers: int = 3,
         dropout: float = 0.0) -> Any:
    from .mlp import EdgeFreeMLP

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



_loaded: dict[tuple[str, str], Model] = {}      # (resolved path, code hash) -> the file's Model, per process


def load_model(model: str | os.PathLike[str] | Model) -> Model:
    """The `Model` of a built-in name, of a ``.py`` file that defines one at module level, or `model` itself.

    A file is imported once per process and content (an edited file is imported again).

    Raises:
        ConfigError: unknown name, no such file, a file that defines no `Model` or several.
        InputError: the file exists but cannot be imported (naming it and the error).
    """
    if isinstance(model, Model):
        return model
    text = os.fspath(model)
    check_model_option(text, "model")
    if text == DATA_ONLY:
        raise ConfigError("model", f"{DATA_ONLY!r} trains no model (it runs the data path only)")
    if not is_model_file(text):
        return BUILTINS[text]
    path = Path(text).resolve()
    digest = file_hash(path)
    key = (str(path), digest)
    if key not in _loaded:
        module = _import_file(path, digest)
        _loaded[key] = _model_of(module, text, digest)
    return _loaded[key]


def _import_file(path: Path, digest: str) -> ModuleType:
    """Import a user's model file as a fresh module (its content's hash in the module's name)."""
    return import_user_file(path, f"{USER_MODULE}_{digest[:16]}")


def _model_of(module: ModuleType, text: str, digest: str) -> Model:
    """The one `Model` a module defines at module level (``MODEL`` first, if it has one), with its source."""
    from dataclasses import replace

    chosen = getattr(module, "MODEL", None)
    if not isinstance(chosen, Model):
        found = {id(v): v for v in vars(module).values() if isinstance(v, Model)}
        if len(found) != 1:
            raise ConfigError("model", f"{text!r} defines {'no' if not found else len(found)} diskflow.Model "
                                       "objects at module level; it must define exactly one (e.g. "
                                       "model = diskflow.Model(\"mine\", MyNet))")
        chosen = next(iter(found.values()))
    return replace(chosen, source=text, code_hash=digest)
