"""PyG's heterogeneous sampling over diskflow's typed sampler (no pyg-lib needed).

`HeteroNeighborSampler` is a PyG `BaseSampler` for a `HeteroData` in memory: PyG's `NodeLoader` over it
gives the `HeteroData` batches PyG's heterogeneous `NeighborLoader` gives (per node type ``x``, ``n_id``,
``num_sampled_nodes``; per edge type ``edge_index``, ``e_id``, ``num_sampled_edges``; ``batch_size``
and ``input_id`` on the seeds' type), drawn by `operators.prepare.typedsample` with a fanout per edge
type. `hetero_csc` lays a `HeteroData` out as a typed store does (`operators.formats.hetero`): the
same graph, in memory or ingested, gives the same samples for the same seed.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch_geometric.data import HeteroData
from torch_geometric.sampler import BaseSampler, HeteroSamplerOutput, NodeSamplerInput
from torch_geometric.sampler.base import NumNeighbors

from .operators.formats.hetero import HeteroLayout
from .operators.prepare.typedsample import TypedNeighborSampler
from .operators.train.heterobatch import split_sample

__all__ = ["HeteroNeighborSampler", "hetero_csc"]

_MAX_SEED = 2**63 - 1


def hetero_csc(data: HeteroData) -> tuple[HeteroLayout, list[tuple[np.ndarray, np.ndarray]], dict[Any, torch.Tensor]]:
    """A `HeteroData`'s typed layout, per edge type its CSC (by destination, then source: a store's edge
    order) and the permutation from CSC positions to the edge type's ``edge_index`` columns.

    Node types with features (``x``) come first in the global ids, as in a typed store."""
    names = list(data.node_types)
    featured = [n for n in names if "x" in data[n]] + [n for n in names if "x" not in data[n]]
    nodes, offset = [], 0
    for n in featured:
        count = int(data[n].num_nodes)
        x = data[n].get("x")
        nodes.append({"name": n, "offset": offset, "count": count, "dim": 0 if x is None else int(x.size(-1)),
                      "dtype": None if x is None else str(x.numpy().dtype) if x.dtype != torch.bfloat16 else "bfloat16",
                      "derived": None})
        offset += count
    edges, relations, perms, e_off = [], [], {}, 0
    for et in data.edge_types:
        ei = data[et].edge_index.numpy().astype(np.int64, copy=False)
        n_dst = int(data[et[2]].num_nodes)
        order = np.lexsort((ei[0], ei[1]))
        indptr = np.zeros(n_dst + 1, dtype=np.int64)
        np.cumsum(np.bincount(ei[1], minlength=n_dst), out=indptr[1:])
        relations.append((indptr, np.ascontiguousarray(ei[0][order])))
        perms[et] = torch.from_numpy(order)
        edges.append({"src": et[0], "rel": et[1], "dst": et[2], "indptr": "", "indices": "", "indices_dtype": "int64",
                      "num_edges": int(ei.shape[1]), "edge_offset": e_off})
        e_off += int(ei.shape[1])
    labelled = [n for n in names if "y" in data[n]]
    layout = HeteroLayout({"node_types": nodes, "edge_types": edges,
                           "target": labelled[0] if len(labelled) == 1 else None}, "HeteroData")
    return layout, relations, perms


class HeteroNeighborSampler(BaseSampler):
    """A PyG sampler of a `HeteroData` through diskflow's typed sampler (module docstring).

    Args:
        data: the graph.
        num_neighbors: fanouts per hop, one list for every edge type or a dict per edge type (an edge
            type the dict leaves out is not sampled), or PyG's `NumNeighbors` of either.
        seed: the seed of the batches' draws (None: torch's default generator).
        num_threads: sampler threads (None: one per core); the samples do not depend on it.

    Raises:
        ConfigError: bad fanouts, or a dict naming an unknown edge type.
    """

    def __init__(self, data: HeteroData, num_neighbors: Sequence[int] | Mapping[Any, Sequence[int]] | NumNeighbors,
                 seed: int | None = None, num_threads: int | None = None) -> None:
        if not isinstance(data, HeteroData):
            raise TypeError(f"expected a torch_geometric HeteroData, got {type(data).__name__}")
        values = num_neighbors.values if isinstance(num_neighbors, NumNeighbors) else num_neighbors
        self.layout, relations, self.perm = hetero_csc(data)
        self.sampler = TypedNeighborSampler(self.layout, relations, values, num_threads=num_threads)
        self.num_neighbors = values
        self.seed = seed
        self._generator = None if seed is None else torch.Generator().manual_seed(int(seed))

    @property
    def edge_permutation(self) -> dict[Any, torch.Tensor]:
        """Per edge type, CSC position -> the edge type's ``edge_index`` column (PyG maps ``e_id`` through it)."""
        return self.perm

    def _next_seed(self) -> int:
        return int(torch.randint(_MAX_SEED, (), dtype=torch.int64, generator=self._generator))

    def sample_from_nodes(self, index: NodeSamplerInput, **kwargs: Any) -> HeteroSamplerOutput:
        """The typed subgraph around a batch of seeds of one node type (`NodeLoader` calls this per batch)."""
        if index.input_type is None:
            raise ValueError("a heterogeneous graph's seeds need their node type: input_nodes=(type, ids)")
        if index.time is not None:
            raise ValueError("diskflow's neighbour sampler does not sample by time (no temporal graphs)")
        info = self.layout.node(index.input_type)
        seeds = index.node.numpy().astype(np.int64) + info.offset
        b = self.sampler.sample(seeds, self._next_seed(), target=info.name)
        assert b.e_id is not None           # the typed sampler always reports its edges' ids
        sp = split_sample(b.n_id, b.edge_index, b.e_id, b.num_sampled_nodes, b.num_sampled_edges, self.layout)
        lay = self.layout
        node = {t.name: torch.from_numpy(sp.node_ids[i]) for i, t in enumerate(lay.node_types)}
        row = {e.key: torch.from_numpy(sp.edge_index[k][0]) for k, e in enumerate(lay.edge_types)}
        col = {e.key: torch.from_numpy(sp.edge_index[k][1]) for k, e in enumerate(lay.edge_types)}
        edge = {e.key: torch.from_numpy(sp.edge_ids[k]) for k, e in enumerate(lay.edge_types)}
        return HeteroSamplerOutput(
            node=node, row=row, col=col, edge=edge, batch=None,
            num_sampled_nodes={t.name: sp.node_hops[i] for i, t in enumerate(lay.node_types)},
            num_sampled_edges={e.key: sp.edge_hops[k] for k, e in enumerate(lay.edge_types)},
            metadata=(index.input_id, index.time))

    def sample_from_edges(self, index: Any, neg_sampling: Any = None) -> HeteroSamplerOutput:
        raise ValueError("link prediction on a heterogeneous graph is not supported yet: sample from nodes")
