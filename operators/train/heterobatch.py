"""A flat batch of a typed graph as the `HeteroData` PyG's heterogeneous `NeighborLoader` gives.

Every loader builds a batch's `Data` over global ids (`batches.batch_data`): the rows, labels and ids
of its nodes in the typed sampler's flat order (`prepare.typedsample`). This module splits it by type,
vectorised: per node type ``x`` (the type's own width: the table's padding dropped), ``n_id`` (the
type's local ids), ``num_sampled_nodes``, and ``y`` where the type has labels; per edge type
``edge_index`` (positions within each end's type), ``e_id`` (the edge type's local edge ids) and
``num_sampled_edges``; and on the target type ``batch_size`` (and ``input_id``, the seeds' positions in
the loader's input, where the flat batch has it: diskflow's loaders, typed or not, draw their seeds
from a split per epoch and do not).
Every node and edge type of the graph is present, empty where the batch has none of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data, HeteroData

from ..formats.hetero import HeteroLayout

__all__ = [
    "TypedBatches",
    "TypedSplit",
    "hetero_batch",
    "seed_count",
    "seed_labels",
    "split_sample",
    "typed_inputs",
]


@dataclass
class TypedSplit:
    """A flat sample split by type: per node type its flat positions (flat order) and local ids, and its
    nodes per hop; per edge type its flat edge positions, its ``edge_index`` within each end's type, its
    local edge ids and its edges per hop."""

    node_pos: list[np.ndarray]
    node_ids: list[np.ndarray]
    node_hops: list[list[int]]
    edge_pos: list[np.ndarray]
    edge_index: list[np.ndarray]
    edge_ids: list[np.ndarray]
    edge_hops: list[list[int]]


def split_sample(n_id: np.ndarray, edge_index: np.ndarray, e_id: np.ndarray, num_sampled_nodes: Any,
                 num_sampled_edges: Any, layout: HeteroLayout) -> TypedSplit:
    """Split a typed sampler's flat sample by node and edge type, vectorised (`TypedSplit`)."""
    n_id = np.asarray(n_id).astype(np.int64, copy=False)
    n = n_id.shape[0]
    t_of = layout.type_of(n_id)
    n_hops = len(num_sampled_nodes)
    hops = np.repeat(np.arange(n_hops), np.asarray(num_sampled_nodes, dtype=np.int64))
    order = np.argsort(t_of, kind="stable")          # flat positions grouped by type, flat order within
    bounds = np.searchsorted(t_of[order], np.arange(len(layout.node_types) + 1))
    within = np.empty(n, dtype=np.int64)              # each node's position within its type
    within[order] = np.arange(n) - np.repeat(bounds[:-1], np.diff(bounds))
    node_pos = [order[bounds[t]:bounds[t + 1]] for t in range(len(layout.node_types))]
    node_ids = [n_id[pos] - info.offset for pos, info in zip(node_pos, layout.node_types)]
    node_hops = [[int(c) for c in np.bincount(hops[pos], minlength=n_hops)] for pos in node_pos]
    row = np.asarray(edge_index[0]).astype(np.int64, copy=False)
    col = np.asarray(edge_index[1]).astype(np.int64, copy=False)
    e_np = np.asarray(e_id).astype(np.int64, copy=False)
    n_edge_hops = len(num_sampled_edges)
    e_hops = np.repeat(np.arange(n_edge_hops), np.asarray(num_sampled_edges, dtype=np.int64))
    r_of = layout.edge_type_of(e_np)
    e_order = np.argsort(r_of, kind="stable")
    e_bounds = np.searchsorted(r_of[e_order], np.arange(len(layout.edge_types) + 1))
    edge_pos = [e_order[e_bounds[k]:e_bounds[k + 1]] for k in range(len(layout.edge_types))]
    return TypedSplit(
        node_pos, node_ids, node_hops, edge_pos,
        [np.stack([within[row[sel]], within[col[sel]]]) for sel in edge_pos],
        [e_np[sel] - et.edge_offset for sel, et in zip(edge_pos, layout.edge_types)],
        [[int(c) for c in np.bincount(e_hops[sel], minlength=n_edge_hops)] for sel in edge_pos])


def _numpy(t: Any) -> np.ndarray:
    return t.cpu().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)


def hetero_batch(data: Data, layout: HeteroLayout, target: str, labelled: frozenset[str] | None = None,
                 x: torch.Tensor | None = None, full_width: bool = False) -> HeteroData:
    """Split the flat batch `data` of a typed graph into a `HeteroData` (module docstring).

    `labelled`: the node types whose ``y`` the batch carries (default: the target's only). `x`: the rows
    to split instead of ``data.x`` (e.g. cast to float32). `full_width`: every type's rows at the table's
    width (narrower types zero-padded), as a model built for the table's width reads them.
    """
    e_id = getattr(data, "e_id", None)
    if e_id is None:
        raise ValueError("a typed batch needs its edges' ids (e_id) to tell their edge types")
    sp = split_sample(_numpy(data.n_id), _numpy(data.edge_index), _numpy(e_id), data.num_sampled_nodes,
                      data.num_sampled_edges, layout)
    out = HeteroData()
    x = data.x if x is None else x
    y = getattr(data, "y", None)
    labelled = frozenset([target]) if labelled is None else labelled
    for t, info in enumerate(layout.node_types):
        idx = torch.from_numpy(sp.node_pos[t])
        store = out[info.name]
        if x is not None and info.has_features:
            rows = x.index_select(0, idx.to(x.device))
            store.x = rows if full_width else rows[:, :info.dim]
        else:                   # no rows: PyG counts such a type's nodes
            store.num_nodes = int(idx.numel())
        store.n_id = torch.from_numpy(sp.node_ids[t])
        if y is not None and info.name in labelled:
            store.y = y.index_select(0, idx.to(y.device))
        store.num_sampled_nodes = sp.node_hops[t]
        if info.name == target:
            store.batch_size = int(data.batch_size)
            input_id = getattr(data, "input_id", None)
            if input_id is not None:
                store.input_id = input_id
    edge_attr = getattr(data, "edge_attr", None)
    for k, et in enumerate(layout.edge_types):
        store = out[et.key]
        store.edge_index = torch.from_numpy(sp.edge_index[k])
        store.e_id = torch.from_numpy(sp.edge_ids[k])
        if edge_attr is not None:
            store.edge_attr = edge_attr.index_select(0, torch.from_numpy(sp.edge_pos[k]).to(edge_attr.device))
        store.num_sampled_edges = sp.edge_hops[k]
    return out


def typed_inputs(batch: HeteroData) -> tuple[dict[str, torch.Tensor], dict[Any, torch.Tensor]]:
    """A typed batch's ``(x_dict, edge_index_dict)``, the features as float32 (a store may keep float16)."""
    return {k: v.float() for k, v in batch.x_dict.items()}, batch.edge_index_dict


def seed_count(batch: Data | HeteroData, target: str | None = None) -> int:
    """The batch's seeds: ``batch_size`` of a `Data`, or of the target type of a `HeteroData`."""
    if isinstance(batch, HeteroData):
        return int(batch[target].batch_size)
    return int(batch.batch_size)


def seed_labels(batch: Data | HeteroData, target: str | None = None) -> torch.Tensor:
    """The seeds' labels: ``y[:batch_size]`` of the batch, or of its target type."""
    if isinstance(batch, HeteroData):
        store = batch[target]
        return store.y[:int(store.batch_size)]
    return batch.y[:batch.batch_size]


class TypedBatches:
    """A loader of a typed graph's flat batches that yields them as `HeteroData` (`hetero_batch`); every other
    attribute (``set_epoch``, ``close``, ``len``, ``stats``, ...) is the wrapped loader's."""

    def __init__(self, loader: Any, layout: HeteroLayout, target: str) -> None:
        self.loader, self.layout, self.target = loader, layout, target

    def __iter__(self) -> Any:
        for data in self.loader:
            yield hetero_batch(data, self.layout, self.target)

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def __enter__(self) -> Any:
        self.loader.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loader.__exit__(*exc)
