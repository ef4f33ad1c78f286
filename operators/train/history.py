"""The historical embedding cache on the training side (OUTRE §4.3), for stock PyG models.

`HistoryCache.attach(model, rows)` adds a table of `rows` cached embeddings to a
`torch_geometric.nn` GraphSAGE or GAT (a model with a ``convs`` list of two or more layers, one per
sampled hop; not GCN, whose normalisation reads the pruned nodes' sampled degrees) and a forward
hook on its second-to-last layer. For a training batch that carries a history plan
(`operators.prepare.history`: ``hist_push``/``hist_push_slot``, ``hist_prune``/``hist_prune_slot``,
local row positions and cache slots), the hook writes the pushed nodes' fresh outputs of that
layer into the table and puts the cached rows in place of the pruned nodes' outputs (whose
subtrees were not sampled). The training loop and the model are unchanged otherwise: `loop.forward`
binds each batch, and evaluation (no plan) runs the plain model. The table is a buffer of the
model, so checkpoints carry it.

What it approximates (OUTRE's trade): a fresh cached row is what the layer computed for that node
a few batches ago. Under the last-hop rules (the default, `operators.prepare.history`) that row is the
only approximation of the forward pass: the pruned node's own subtree is sampled but for its last
hop, so the seeds' lower layers read its exact lower-layer embeddings. Under OUTRE's subtree rule,
with three or more layers, they read lower-layer embeddings computed from its own features alone.
With staleness 1 nothing is pruned and training is exact.

The gradient is the other approximation. A cached row is a constant: taken alone, it would stop the
gradient that the seeds' loss sends down through the pruned node into the lower layers, and the
cached nodes are the most frequent one-hop nodes of the round. On a 50k-node graph of 24 classes
(10 epochs, four seeds; docs/benchmarks.md) that lost gradient, not the staleness, was what cost
accuracy: exact rows with the gradient stopped lost 2.9 points of test accuracy, and a staleness
bound of 10 or 20 batches instead of 100 lost about as much as 100. So the substitution is
straight-through: the value is the cached row, and the gradient flows through what this batch
computed for the node from the part of its subtree it sampled (all but the last hop under the
last-hop rule). That reads nothing more, since those rows are in the batch anyway; there it brought
belady_outre from 2.41 points below in-memory training to 0.25. Under the last-hop rule the pruned
node's children were drawn without neighbours of their own, so the gradient reaches them through rows
computed from their features alone; the thin rule (the default) draws each of them one neighbour,
which on a harder 2M-node graph brought belady_outre from 1.8 points below in-memory to 0.1 below.
"""
from __future__ import annotations

from typing import Any

import torch
from torch_geometric.data import Data

from ...errors import ConfigError
from ..prepare.history import EMBEDDING_DTYPE

__all__ = ["ATTR", "FIELDS", "HistoryCache", "history_of"]

FIELDS = ("hist_prune", "hist_prune_slot", "hist_push", "hist_push_slot")
ATTR = "diskflow_history"        # the model's child module


class HistoryCache(torch.nn.Module):
    """`rows` cached layer outputs of width `dim`, substituted by a forward hook on `layer`; stored as
    `dtype` (float16 by default, as `operators.prepare.history` sizes the cache)."""

    table: torch.Tensor

    def __init__(self, layer: torch.nn.Module, rows: int, dim: int, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.register_buffer("table", torch.zeros(int(rows), int(dim), dtype=dtype or getattr(torch, EMBEDDING_DTYPE)))
        self._plan: tuple[torch.Tensor, ...] | None = None
        self.pruned = 0
        self.pushed = 0
        layer.register_forward_hook(self._hook)

    @classmethod
    def attach(cls, model: torch.nn.Module, rows: int, dtype: torch.dtype | None = None) -> HistoryCache:
        """Add a cache of `rows` embeddings to `model` (as its child ``diskflow_history``) and return it;
        `dtype`: the table's (default float16)."""
        convs = getattr(model, "convs", None)
        if not isinstance(convs, torch.nn.ModuleList) or len(convs) < 2:
            raise ConfigError("history_memory", f"a historical embedding cache needs a message-passing model of "
                                                f"two or more layers (a `convs` list), got {type(model).__name__}")
        layer = convs[len(convs) - 2]
        if type(layer).__name__ == "GCNConv":
            raise ConfigError("model", "a historical embedding cache cannot stand in under GCN: its normalisation "
                                       "reads each source's sampled degree, which pruning changes")
        dim = int(getattr(layer, "out_channels", 0) or 0)
        heads = getattr(layer, "heads", 1)
        if getattr(layer, "concat", False):
            dim *= int(heads)
        if dim < 1:
            raise ConfigError("history_memory", f"cannot tell the output width of {type(layer).__name__}")
        cache = cls(layer, rows, dim, dtype)
        model.add_module(ATTR, cache)
        return cache

    def bind(self, batch: Data | None) -> None:
        """The plan of the batch about to be forwarded (None, or a batch without one: plain forward)."""
        if batch is None or getattr(batch, FIELDS[0], None) is None:
            self._plan = None
            return
        self._plan = tuple(getattr(batch, f).to(self.table.device) for f in FIELDS)

    def _hook(self, module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor | None:
        if self._plan is None or not torch.is_tensor(output):
            return None
        prune, prune_slot, push, push_slot = self._plan
        self._plan = None                      # one forward per bind
        if push.numel():
            rows = output[push].detach().to(self.table.dtype)
            if not bool(torch.isfinite(rows).all()):
                raise ConfigError("history_memory", f"a pushed embedding does not fit the cache's {self.table.dtype} "
                                      f"(largest |value| {float(output[push].detach().abs().max()):.4g}): this "
                                      "model's activations pass its range; train without the cache")
            self.table[push_slot] = rows
            self.pushed += int(push.numel())
        if not prune.numel():
            return None
        out = output.clone()
        own = output[prune]     # this batch's own computation of the pruned nodes, from the part of their
        # subtrees it sampled: it adds nothing to the value (own - own is 0) but carries the gradient
        out[prune] = self.table[prune_slot].to(out.dtype) + (own - own.detach())
        self.pruned += int(prune.numel())
        return out


def history_of(model: torch.nn.Module) -> HistoryCache | None:
    """The model's cache, if `HistoryCache.attach` gave it one."""
    cache = getattr(model, ATTR, None)
    return cache if isinstance(cache, HistoryCache) else None
