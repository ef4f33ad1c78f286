"""diskflow as a PyG remote backend: a `FeatureStore`, a `GraphStore` and a sampler over an ingested store.

PyG's loaders read graphs from a ``(feature_store, graph_store)`` pair (its "remote backend"
convention) as readily as from an in-memory `Data`. This module gives that pair for a store that
`diskflow ingest` wrote, so a PyG training script keeps its loader and its model and trains out of
core::

    from torch_geometric.loader import NodeLoader
    import diskflow.pyg

    features = diskflow.pyg.FeatureStore(store, cache_memory="10%")
    graph = diskflow.pyg.GraphStore(store)
    loader = NodeLoader((features, graph), diskflow.pyg.NeighborSampler(graph, num_neighbors=[10, 10]),
                        input_nodes=graph.split_ids("train"), batch_size=1024, shuffle=True)

* `FeatureStore` serves ``x`` (the features) and ``y`` (the labels) of the store's one node type
  (group name None, as PyG's homogeneous loaders ask; ``"node"`` is accepted too). ``x`` rows are
  read from the feature shards with the native direct-I/O reader (O_DIRECT: the page cache is
  bypassed, many reads in flight) through a bounded CPU cache of rows (the one `RowCache` of
  `diskflow.operators.train.rowcache`, read-through), whose bytes are a budget like every other in
  the project (``64MiB``, or ``10%`` of the feature bytes).
* `GraphStore` gives the store's CSC topology as PyG's ``csc`` edge layout of the homogeneous
  edge type (None; ``("node", "to", "node")`` is accepted too), so PyG's own `NeighborLoader` can
  sample it where pyg-lib is installed.
* `NeighborSampler` is a PyG `BaseSampler` over diskflow's native multi-hop sampler (no pyg-lib
  needed): PyG's `NodeLoader` (and `LinkLoader`) take it as their sampler. Its batches carry what
  `NeighborLoader`'s do: ``n_id`` (seeds first), local ``edge_index`` (source -> target),
  ``num_sampled_nodes``, ``num_sampled_edges``, ``batch_size``.

The stores are read-only: `put_tensor`, `remove_tensor`, `put_edge_index` and
`remove_edge_index` return False (PyG's "not done"). This module is a library: it imports
`diskflow.operators`, `diskflow.native` and `diskflow.flow.options` only.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch_geometric.data as pyg_data
from torch_geometric.data.feature_store import TensorAttr
from torch_geometric.data.graph_store import EdgeAttr, EdgeLayout
from torch_geometric.sampler import (
    BaseSampler,
    EdgeSamplerInput,
    NegativeSampling,
    NodeSamplerInput,
    SamplerOutput,
)
from torch_geometric.sampler.base import NumNeighbors

from .errors import ConfigError, InputError
from .flow.options import DEFAULT_SHARE, byte_budget, fit_default
from .operators.formats.sizes import format_bytes
from .operators.formats.store import Store
from .operators.prepare.sample import NeighborSampler as NativeSampler
from .operators.prepare.sample import check_fanouts
from .operators.train.cachepolicy import READ_THROUGH
from .operators.train.rowcache import RowCache

NODE_TYPE = "node"                          # the one node type's name where a caller names it
EDGE_TYPE = (NODE_TYPE, "to", NODE_TYPE)    # the one edge type's name where a caller names it
ATTRS = ("x", "y")                          # the tensors of the node type: features, labels
CACHE_OPTION = "cache_memory"               # the option a budget error names
POLICIES = READ_THROUGH                     # the row cache's policies a feature store takes (`RowCache`)
_MAX_SEED = (1 << 63) - 1


def open_store(store: Store | str | os.PathLike[str]) -> Store:
    """`store` as a `Store` (a path is opened).

    Raises:
        InputError: naming the path, when it is not a store `diskflow ingest` wrote.
    """
    if isinstance(store, Store):
        return store
    path = os.fspath(store)
    if not os.path.isdir(path):
        raise InputError(path, "not a diskflow store (no such directory; run `diskflow ingest` first)")
    return Store(path)


def _node_ids(index: Any, num_nodes: int) -> tuple[np.ndarray, bool]:
    """PyG's index of a tensor's rows (None: all; a slice; an int; a tensor or array of ids or a boolean
    mask) as int64 node ids, and whether it was a single int (the row then comes back alone).

    Raises:
        IndexError: an id outside [0, num_nodes).
    """
    if index is None:
        return np.arange(num_nodes, dtype=np.int64), False
    if isinstance(index, slice):
        return np.arange(num_nodes, dtype=np.int64)[index], False
    if isinstance(index, (int, np.integer)):
        ids = np.array([int(index)], dtype=np.int64)
        ids[ids < 0] += num_nodes
        scalar = True
    else:
        arr = index.detach().cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
        if arr.dtype == np.bool_:
            if arr.shape != (num_nodes,):
                raise IndexError(f"a boolean mask of the nodes has {num_nodes} entries, got shape {arr.shape}")
            arr = np.flatnonzero(arr)
        if arr.size and arr.dtype.kind not in "iu":
            raise IndexError(f"node ids must be integers, got dtype {arr.dtype}")
        ids = np.ascontiguousarray(arr.reshape(-1), dtype=np.int64)
        scalar = False
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= num_nodes):
        bad = ids[(ids < 0) | (ids >= num_nodes)][0]
        raise IndexError(f"node id {int(bad)} is out of range [0, {num_nodes})")
    return ids, scalar


class StoreFeatureStore(pyg_data.FeatureStore):
    """The tensors of a diskflow store as a PyG `FeatureStore`: ``x`` (features) and ``y`` (labels) of its
    one node type; read-only. Where ``x``'s rows come from is the subclass's `gather`.

    ``y`` is the store's labels (int64, -1 where unlabeled), held in RAM (8 bytes a node).
    """

    def __init__(self, store: Store | str | os.PathLike[str]) -> None:
        super().__init__()
        self.store = open_store(store)
        self.num_nodes = int(self.store.num_nodes)
        self.labels = self.store.labels

    @property
    def num_features(self) -> int:
        """The feature dimension: a model's input channels."""
        return int(self.store.feature_dim)

    @property
    def num_classes(self) -> int:
        """The label classes: a node classifier's output channels."""
        return int(self.store.num_classes)

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """Feature rows of `ids` (int64 node ids) as a new writable (len(ids), dim) array."""
        raise NotImplementedError

    def split_ids(self, name: str) -> torch.Tensor:
        """Node ids of a split ('train', 'val', 'test') as a tensor: a loader's ``input_nodes``."""
        return torch.from_numpy(self.store.split_ids(name))

    @staticmethod
    def _known(attr: TensorAttr) -> bool:
        return attr.group_name in (None, NODE_TYPE) and attr.attr_name in ATTRS

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        if not self._known(attr):
            raise KeyError(f"{attr}: a diskflow store holds 'x' and 'y' of one node type (group None)")
        ids, scalar = _node_ids(attr.index, self.num_nodes)
        rows = self.gather(ids) if attr.attr_name == "x" else self.labels[ids]
        tensor = torch.from_numpy(rows)
        return tensor[0] if scalar else tensor

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        if not self._known(attr):
            return None
        return (self.num_nodes, int(self.store.feature_dim)) if attr.attr_name == "x" else (self.num_nodes,)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        """``x`` and ``y`` of the node type None: what PyG's homogeneous loaders fetch for every batch."""
        return [TensorAttr(group_name=None, attr_name=name) for name in ATTRS]

    def _put_tensor(self, tensor: Any, attr: TensorAttr) -> bool:
        return False        # a store is written by `diskflow ingest`, never through the loader

    def _remove_tensor(self, attr: TensorAttr) -> bool:
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.store.path)!r})"


class FeatureStore(StoreFeatureStore):
    """A diskflow store's features and labels as a PyG `FeatureStore`, read out of core.

    ``x`` rows are read with the native direct-I/O reader through a read-through `RowCache`
    (`RowCache.for_store`) of `cache_memory` bytes: bytes (``64MiB``, or an int) or a share of the
    store's feature bytes (``10%``), checked like every other budget of the project. In a loader with
    ``num_workers > 0`` every worker process holds its own cache (each of `cache_memory`).

    Args:
        store: a store (`diskflow ingest`'s output), or its path.
        cache_memory: the row cache's bytes (rows, tables and read buffers together); by default 10% of the
            feature bytes, or the smallest budget that works where that is more (a small store).
        policy: the row cache's policy (`POLICIES`), ``"degree"`` (keep the rows of the nodes most
            neighbour lists hold) or ``"lru"`` (the least recently used give way first).

    Raises:
        InputError: naming the path, when it is not a store.
        ConfigError: (``cache_memory``) not a byte size or share, or too small for the cache's tables and
            read buffers and one row; the message names the smallest budget that works. (``policy``)
            an unknown policy.
    """

    def __init__(self, store: Store | str | os.PathLike[str], cache_memory: int | str = DEFAULT_SHARE,
                 policy: str = "degree") -> None:
        super().__init__(store)
        budget = int(byte_budget(cache_memory, CACHE_OPTION, self.store.feature_bytes) or 0)
        if policy in POLICIES:      # the default never fails: raised to what works on a small store
            budget = fit_default(cache_memory, budget, RowCache.smallest_budget(self.store, policy), CACHE_OPTION)
        self.cache_memory = cache_memory
        self.cache = RowCache.for_store(self.store, budget, policy, CACHE_OPTION)

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """Feature rows of `ids` through the row cache (misses read with O_DIRECT)."""
        return self.cache.gather(ids)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its store's path, budget and policy (a spawned loader worker opens its own reader and
        cache)."""
        return (type(self), (str(self.store.path), self.cache.budget, self.cache.policy.name))

    def __repr__(self) -> str:
        return (f"FeatureStore({str(self.store.path)!r}, cache_memory={format_bytes(self.cache.budget)!r}, "
                f"policy={self.cache.policy.name!r})")


class GraphStore(pyg_data.GraphStore):
    """A diskflow store's topology as a PyG `GraphStore`: its CSC (``indptr``, ``indices``) as the ``csc``
    edge layout of the homogeneous edge type (None), size (N, N).

    `get_edge_index` returns ``(row, colptr)`` = (``indices``, ``indptr``) as int64 tensors, as pyg-lib's
    sampler needs them; the int64 copy of ``indices`` (stored as int32 below 2**31 nodes) is made on the
    first call and kept. `NeighborSampler` samples the store's arrays themselves (`indptr`, `indices`):
    memory maps, or arrays in RAM with `in_memory`.

    Args:
        store: a store, or its path.
        in_memory: load the topology into RAM instead of memory-mapping it (the sampler then never
            waits for a page the page cache gave away to other files).

    Raises:
        InputError: naming the path, when it is not a store (or its topology is unreadable).
    """

    def __init__(self, store: Store | str | os.PathLike[str], in_memory: bool = False) -> None:
        super().__init__()
        self.store = open_store(store)
        self.num_nodes = int(self.store.num_nodes)
        self.in_memory = bool(in_memory)
        self.indptr: np.ndarray = np.array(self.store.indptr) if self.in_memory else self.store.indptr
        self.indices: np.ndarray = np.array(self.store.indices) if self.in_memory else self.store.indices
        self._csc: tuple[torch.Tensor, torch.Tensor] | None = None

    def split_ids(self, name: str) -> torch.Tensor:
        """Node ids of a split ('train', 'val', 'test') as a tensor: a loader's ``input_nodes``."""
        return torch.from_numpy(self.store.split_ids(name))

    def edge_attr(self) -> EdgeAttr:
        """The one edge attribute: type None, layout csc, size (N, N)."""
        return EdgeAttr(edge_type=None, layout=EdgeLayout.CSC, is_sorted=True, size=(self.num_nodes, self.num_nodes))

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        """[`edge_attr`]: PyG then treats the graph as homogeneous."""
        return [self.edge_attr()]

    def _get_edge_index(self, edge_attr: EdgeAttr) -> tuple[torch.Tensor, torch.Tensor] | None:
        if edge_attr.edge_type not in (None, EDGE_TYPE) or edge_attr.layout != EdgeLayout.CSC:
            return None         # PyG converts from the csc layout itself (`coo()`, `csr()`)
        if self._csc is None:
            row = torch.from_numpy(np.array(self.indices, dtype=np.int64))
            colptr = torch.from_numpy(np.array(self.indptr, dtype=np.int64))
            self._csc = (row, colptr)
        return self._csc

    def _put_edge_index(self, edge_index: Any, edge_attr: EdgeAttr) -> bool:
        return False

    def _remove_edge_index(self, edge_attr: EdgeAttr) -> bool:
        return False

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self.store.path), self.in_memory))

    def __repr__(self) -> str:
        return f"GraphStore({str(self.store.path)!r}, nodes={self.num_nodes:,}, edges={self.store.num_edges:,})"


class NeighborSampler(BaseSampler):
    """A PyG sampler over diskflow's native multi-hop neighbour sampler (no pyg-lib needed).

    Uniform sampling without replacement, PyG's ``directional`` subgraph of a homogeneous graph
    (`diskflow.operators.prepare.sample`): the batch's ``n_id`` starts with the seeds, ``edge_index``
    is local, source -> target, and ``num_sampled_nodes`` / ``num_sampled_edges`` count per hop.

    Every batch draws with its own seed: from a generator seeded with `seed`, or, with ``seed=None``,
    from torch's default generator (``torch.manual_seed`` then reproduces the whole loader). A loader
    worker process draws from its own stream.

    Args:
        data: a `GraphStore`, or a ``(feature_store, graph_store)`` pair.
        num_neighbors: neighbours per hop (-1: all), a list or PyG's `NumNeighbors` of one.
        seed: the seed of the batches' seeds (None: torch's default generator).
        num_threads: sampler threads (None: one per core); the samples do not depend on it.

    Raises:
        ConfigError: bad fanouts or num_threads.
        TypeError: `data` holds no diskflow `GraphStore`.
    """

    def __init__(self, data: GraphStore | tuple[Any, GraphStore], num_neighbors: Sequence[int] | NumNeighbors,
                 seed: int | None = None, num_threads: int | None = None) -> None:
        graph = data[1] if isinstance(data, (tuple, list)) else data
        if not isinstance(graph, GraphStore):
            raise TypeError(f"expected a diskflow.pyg.GraphStore (or a (feature_store, graph_store) pair), "
                            f"got {type(graph).__name__}")
        values = num_neighbors.values if isinstance(num_neighbors, NumNeighbors) else num_neighbors
        if isinstance(values, dict):
            raise ConfigError("num_neighbors", "a diskflow store is homogeneous: give one list of fanouts, e.g. [10, 10]")
        try:
            self.num_neighbors = check_fanouts(values)
        except ConfigError as e:
            raise ConfigError("num_neighbors", e.fault) from None
        if num_threads is not None and int(num_threads) < 1:
            raise ConfigError("num_threads", f"{num_threads} must be >= 1")
        self.graph = graph
        self.num_nodes = graph.num_nodes
        self.seed = seed
        self.num_threads = num_threads
        self._native: NativeSampler | None = None
        self._native_pid = -1
        self._generator: torch.Generator | None = None
        self._generator_key: tuple[int, int | None] | None = None

    def _sampler(self) -> NativeSampler:
        """This process's native sampler (its threads do not survive a fork into a loader worker)."""
        if self._native is None or self._native_pid != os.getpid():
            self._native = NativeSampler(self.graph.indptr, self.graph.indices, self.num_neighbors, self.num_threads)
            self._native_pid = os.getpid()
        return self._native

    def _next_seed(self) -> int:
        """The next batch's seed: from this sampler's generator, or torch's default one (see the class)."""
        if self.seed is None:
            return int(torch.randint(_MAX_SEED, (), dtype=torch.int64))
        info = torch.utils.data.get_worker_info()
        key = (os.getpid(), None if info is None else int(info.seed))
        if self._generator is None or self._generator_key != key:
            # the main process: one stream for the sampler's life; a loader worker: a stream of its own, from
            # the worker's seed (which torch draws per worker and epoch from the loader's generator)
            mixed = int(self.seed) if info is None else (int(self.seed) * 1_000_003 + int(info.seed)) & _MAX_SEED
            self._generator = torch.Generator().manual_seed(mixed)
            self._generator_key = key
        return int(torch.randint(_MAX_SEED, (), dtype=torch.int64, generator=self._generator))

    def _sample(self, seed: torch.Tensor, seed_time: torch.Tensor | None = None, **kwargs: Any) -> SamplerOutput:
        """Sample around the unique node ids `seed` (PyG's sampling function signature)."""
        if seed_time is not None:
            raise ValueError("diskflow's neighbour sampler does not sample by time (no temporal graphs)")
        if isinstance(seed, dict):
            raise TypeError("a diskflow store is homogeneous: seeds are node ids, not a dict by node type")
        b = self._sampler().sample(seed, seed=self._next_seed())
        edge_index = torch.from_numpy(b.edge_index)
        return SamplerOutput(node=torch.from_numpy(b.n_id), row=edge_index[0], col=edge_index[1], edge=None,
                             batch=None, num_sampled_nodes=list(b.num_sampled_nodes),
                             num_sampled_edges=list(b.num_sampled_edges))

    def sample_from_nodes(self, index: NodeSamplerInput, **kwargs: Any) -> SamplerOutput:
        """The subgraph around a batch's seed nodes (`NodeLoader` calls this per batch)."""
        if index.input_type not in (None, NODE_TYPE):
            raise ValueError(f"a diskflow store has one node type; got input type {index.input_type!r}")
        out = self._sample(index.node, index.time)
        out.metadata = (index.input_id, index.time)
        return out

    def sample_from_edges(self, index: EdgeSamplerInput,
                          neg_sampling: NegativeSampling | None = None) -> SamplerOutput:
        """The subgraph around a batch of seed links' end nodes (`LinkLoader` calls this per batch),
        with PyG's own negative sampling."""
        from torch_geometric.sampler.neighbor_sampler import edge_sample

        return edge_sample(index, self._sample, self.num_nodes, False, None, neg_sampling)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.graph, self.num_neighbors, self.seed, self.num_threads))

    def __repr__(self) -> str:
        return f"NeighborSampler(num_neighbors={self.num_neighbors}, seed={self.seed})"


__all__ = ["EDGE_TYPE", "NODE_TYPE", "FeatureStore", "GraphStore", "NeighborSampler", "RowCache",
           "StoreFeatureStore", "open_store"]
