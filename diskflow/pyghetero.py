"""PyG's heterogeneous sampling over diskflow's typed sampler (no pyg-lib needed), in memory or out of core.

`HeteroNeighborSampler` is a PyG `BaseSampler` for a `HeteroData` in memory, or for a typed store through
`diskflow.pyg`'s remote backend (its `GraphStore`, or the ``(feature_store, graph_store)`` pair): PyG's
`NodeLoader` over either gives the `HeteroData` batches PyG's heterogeneous `NeighborLoader` gives (per
node type ``x``, ``n_id``, ``num_sampled_nodes``, ``y`` on the labelled types; per edge type
``edge_index``, ``e_id``, ``num_sampled_edges``; ``batch_size`` and ``input_id`` on the seeds' type),
drawn by `operators.prepare.typedsample` with a fanout per edge type::

    import diskflow.pyg
    from diskflow.pyghetero import HeteroNeighborSampler

    features = diskflow.pyg.FeatureStore(store, cache_memory="10%")
    graph = diskflow.pyg.GraphStore(store)
    loader = NodeLoader((features, graph), HeteroNeighborSampler(graph, [10, 10]),
                        input_nodes=("paper", graph.split_ids("train")), batch_size=1024, shuffle=True)
    model = to_hetero(GraphSAGE(-1, 64, 2, out_channels=classes), graph.metadata())

A featureless node type has no ``x`` (derive its rows at ingest, or give the model an embedding of its
``n_id``). Over a store ``x`` is each type's own rows, read out of core (`diskflow.pyg.FeatureStore`), and ``e_id``
an edge's position in its edge type's CSC (a store's edge ids); over a `HeteroData` ``e_id`` is the edge
type's ``edge_index`` column (`edge_permutation`). `hetero_csc` lays a `HeteroData` out as a typed store
does (`operators.formats.hetero`): the same graph, in memory or ingested, gives the same samples (the
same ``n_id`` per type and ``edge_index`` per edge type) for the same seed.
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
from .pyg import GraphStore, SeedStream

__all__ = ["HeteroNeighborSampler", "hetero_csc"]


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
    """A PyG sampler of a `HeteroData`, or of a typed store's `diskflow.pyg.GraphStore`, through diskflow's
    typed sampler (module docstring).

    Over a store it samples the store's own per-edge-type CSC topologies (`GraphStore.relations`: memory
    maps, or RAM with ``GraphStore(store, in_memory=True)``).

    Args:
        data: the graph: a `HeteroData`, a typed store's `GraphStore`, or a ``(feature_store, graph_store)``
            pair of one.
        num_neighbors: fanouts per hop, one list for every edge type or a dict per edge type (an edge
            type the dict leaves out is not sampled), or PyG's `NumNeighbors` of either.
        seed: the seed of the batches' draws (None: torch's default generator).
        num_threads: sampler threads (None: one per core); the samples do not depend on it.

    Raises:
        ConfigError: bad fanouts, or a dict naming an unknown edge type.
        TypeError: `data` is none of those, or a homogeneous store's (`diskflow.pyg.NeighborSampler` samples it).
    """

    def __init__(self, data: HeteroData | GraphStore | tuple[Any, GraphStore],
                 num_neighbors: Sequence[int] | Mapping[Any, Sequence[int]] | NumNeighbors,
                 seed: int | None = None, num_threads: int | None = None) -> None:
        graph = data[1] if isinstance(data, (tuple, list)) and len(data) == 2 else data
        values = num_neighbors.values if isinstance(num_neighbors, NumNeighbors) else num_neighbors
        self.perm: dict[Any, torch.Tensor] | None
        if isinstance(graph, GraphStore):
            if graph.layout is None:
                raise TypeError(f"{graph.store.path} is a homogeneous store: sample it with diskflow.pyg.NeighborSampler")
            self.layout, relations, self.perm = graph.layout, graph.relations, None
        elif isinstance(graph, HeteroData):
            self.layout, relations, self.perm = hetero_csc(graph)
        else:
            raise TypeError(f"expected a torch_geometric HeteroData or a typed store's diskflow.pyg.GraphStore (or a "
                            f"(feature_store, graph_store) pair), got {type(graph).__name__}")
        self.graph = graph
        self.sampler = TypedNeighborSampler(self.layout, relations, values, num_threads=num_threads)
        self.num_neighbors = values
        self.seed = seed
        self.num_threads = num_threads
        self._seeds = SeedStream(seed)

    @property
    def edge_permutation(self) -> dict[Any, torch.Tensor] | None:
        """Per edge type of a `HeteroData`, CSC position -> the edge type's ``edge_index`` column (PyG maps
        ``e_id`` through it); None over a store, whose edge ids are its CSC positions."""
        return self.perm

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its graph (a store's `GraphStore` as its path) and options, for a spawned loader worker;
        its generator starts afresh."""
        return (type(self), (self.graph, self.num_neighbors, self.seed, self.num_threads))

    def _next_seed(self) -> int:
        """The next batch's seed, drawn as the homogeneous sampler draws its own (`diskflow.pyg.SeedStream`)."""
        return self._seeds.next()

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
