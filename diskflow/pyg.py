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

Link prediction takes PyG's `LinkNeighborLoader` with this module's sampler (``num_neighbors`` is then
PyG's required but unused argument)::

    loader = LinkNeighborLoader((features, graph), num_neighbors=[10, 10], edge_label_index=graph.link_edges("train"),
                                neighbor_sampler=diskflow.pyg.NeighborSampler(graph, [10, 10]),
                                neg_sampling_ratio=1.0, batch_size=1024, shuffle=True)

* `FeatureStore` serves ``x`` (the features) and ``y`` (the labels) of the store's one node type
  (group name None, as PyG's homogeneous loaders ask; ``"node"`` is accepted too). ``x`` rows are
  read from the feature shards with the native direct-I/O reader (O_DIRECT: the page cache is
  bypassed, many reads in flight) through a bounded CPU cache of rows (the one `RowCache` of
  `diskflow.operators.train.rowcache`, read-through), whose bytes are a budget like every other in
  the project (``64MiB``, or ``10%`` of the feature bytes). Where the store has edge features it
  serves them as ``edge_attr`` of the edge type (group ``("node", "to", "node")``, or PyG's
  ``(None, None)``), indexed by edge id: the edge's position in the store's CSC ``indices``.
* `GraphStore` gives the store's CSC topology as PyG's ``csc`` edge layout of the homogeneous
  edge type (None; ``("node", "to", "node")`` is accepted too), so PyG's own `NeighborLoader` can
  sample it where pyg-lib is installed.
* `NeighborSampler` is a PyG `BaseSampler` over diskflow's native multi-hop sampler (no pyg-lib
  needed): PyG's `NodeLoader` and `LinkLoader` (and `LinkNeighborLoader` with
  ``neighbor_sampler=``) take it as their sampler. Its batches carry what `NeighborLoader`'s do:
  ``n_id`` (seeds first), local ``edge_index`` (source -> target), ``e_id`` (each edge's id),
  ``num_sampled_nodes``, ``num_sampled_edges``, ``batch_size``; a link batch ``edge_label_index``,
  ``edge_label`` and ``input_id`` (or, with triplet negatives, ``src_index``, ``dst_pos_index``,
  ``dst_neg_index``), as PyG's own sampler gives them. It samples an in-memory `Data` as well, so a
  script can check the store's batches against the graph it came from.

A typed store (`diskflow.operators.formats.hetero`: node types as ranges of one id space, a CSC per edge
type) is served as PyG's remote backend serves a `HeteroData`, with no new API: node types are the
`FeatureStore`'s group names, edge types ``(src, rel, dst)`` the `GraphStore`'s, ids are each type's
local ids, and `diskflow.pyghetero.HeteroNeighborSampler` samples the pair::

    loader = NodeLoader((features, graph), HeteroNeighborSampler(graph, [10, 10]),
                        input_nodes=("paper", graph.split_ids("train")), batch_size=1024)

* `FeatureStore` serves, per node type, ``x`` (the type's rows at its own width and dtype, the feature
  table's zero padding dropped; global row = the type's offset + local id, read through the same row
  cache, every type of a batch in one read) where the type has features, and ``y`` where it has labels.
  A featureless type (``dim`` 0) has no ``x``; an unknown group is a KeyError listing the node types.
* `GraphStore` gives each edge type's CSC (layout ``csc``, size (nodes of src, nodes of dst)), whose edge
  ids are its CSC positions; `GraphStore.split_ids` gives the target type's local ids of a split, and
  `GraphStore.metadata` what `to_hetero` needs.

PyG 2.8's loaders leave three things out for a ``(feature_store, graph_store)`` pair, which importing
this module adds for diskflow's stores only (any other pair goes to PyG's code unchanged):

* edge attributes: PyG's ``filter_custom_store`` fetches node tensors only (its "TODO Support edge
  features"); for a diskflow `StoreFeatureStore` with edge features a batch gets ``edge_attr`` too,
  the rows of its ``e_id``, column for column with ``edge_index`` (`_filter_custom_store`).
* a plain ``[2, P]`` tensor as a `LinkLoader`'s ``edge_label_index``: PyG's
  ``get_edge_label_index`` asserts a pair's is a tuple, so a plain tensor ended in a bare
  AssertionError from inside PyG; for a diskflow `GraphStore` the tensor, ``(None, tensor)``,
  ``(("node", "to", "node"), tensor)``, the edge type alone and None (every edge) all work, and any
  other form is a `ConfigError` naming ``edge_label_index`` (`link_input`).
* a typed batch's featureless, unlabelled node types: PyG's ``filter_custom_hetero_store`` gives a node
  type a store only through the feature store's tensors, so such a type held only what the loader adds
  afterwards (``n_id``, the counts); over a diskflow typed `GraphStore` every node type of the sample gets
  its ``num_nodes``, as PyG's in-memory ``filter_hetero_data`` gives it (`_filter_custom_hetero_store`).

The stores are read-only: `put_tensor`, `remove_tensor`, `put_edge_index` and
`remove_edge_index` return False (PyG's "not done"). This module is a library: it imports
`diskflow.operators`, `diskflow.native` and `diskflow.flow.options` only.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch_geometric.data as pyg_data
import torch_geometric.loader.link_loader as pyg_link_loader
import torch_geometric.loader.node_loader as pyg_node_loader
import torch_geometric.loader.utils as pyg_loader_utils
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
from torch_geometric.sampler.neighbor_sampler import edge_sample

from .errors import ConfigError, InputError
from .flow.options import DEFAULT_SHARE, byte_budget, fit_default
from .operators.formats.hetero import EdgeType, HeteroLayout, NodeTypeInfo
from .operators.formats.sizes import format_bytes
from .operators.formats.store import Store
from .operators.prepare.sample import NeighborSampler as NativeSampler
from .operators.prepare.sample import check_fanouts
from .operators.train.cachepolicy import READ_THROUGH
from .operators.train.rowcache import RowCache

NODE_TYPE = "node"                          # the one node type's name where a caller names it
EDGE_TYPE = (NODE_TYPE, "to", NODE_TYPE)    # the one edge type's name where a caller names it
ATTRS = ("x", "y")                          # the tensors of the node type: features, labels
EDGE_ATTR = "edge_attr"                     # the tensor of the edge type: edge features
EDGE_GROUPS = ((None, None), EDGE_TYPE)     # the group names edge features are asked by (PyG's homogeneous one first)
CACHE_OPTION = "cache_memory"               # the option a budget error names
POLICIES = READ_THROUGH                     # the row cache's policies a feature store takes (`RowCache`)
_MAX_SEED = (1 << 63) - 1


def open_store(store: Store | str | os.PathLike[str], check_crc: bool | None = None) -> Store:
    """`store` as a `Store` (a path is opened). Every read of it (the features' rows, the topology, the
    labels) is checked against the store's checksums, each block once per process; ``check_crc=False`` (or
    ``Store(path, check_crc=False)``, or ``DISKFLOW_STORE_CRC=0``) turns that off.

    Raises:
        InputError: naming the path, when it is not a store `diskflow ingest` wrote.
    """
    if isinstance(store, Store):
        return store
    path = os.fspath(store)
    if not os.path.isdir(path):
        raise InputError(path, "not a diskflow store (no such directory; run `diskflow ingest` first)")
    return Store(path, check_crc=check_crc)


def _row_ids(index: Any, count: int, what: str = "node") -> tuple[np.ndarray, bool]:
    """PyG's index of a tensor's rows (None: all; a slice; an int; a tensor or array of ids or a boolean
    mask) as int64 row ids (node ids, or edge ids: `what`), and whether it was a single int (the row then
    comes back alone).

    Raises:
        IndexError: an id outside [0, count).
    """
    if index is None:
        return np.arange(count, dtype=np.int64), False
    if isinstance(index, slice):
        return np.arange(count, dtype=np.int64)[index], False
    if isinstance(index, (int, np.integer)):
        ids = np.array([int(index)], dtype=np.int64)
        ids[ids < 0] += count
        scalar = True
    else:
        arr = index.detach().cpu().numpy() if isinstance(index, torch.Tensor) else np.asarray(index)
        if arr.dtype == np.bool_:
            if arr.shape != (count,):
                raise IndexError(f"a boolean mask of the {what}s has {count} entries, got shape {arr.shape}")
            arr = np.flatnonzero(arr)
        if arr.size and arr.dtype.kind not in "iu":
            raise IndexError(f"{what} ids must be integers, got dtype {arr.dtype}")
        ids = np.ascontiguousarray(arr.reshape(-1), dtype=np.int64)
        scalar = False
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= count):
        bad = ids[(ids < 0) | (ids >= count)][0]
        raise IndexError(f"{what} id {int(bad)} is out of range [0, {count})")
    return ids, scalar


def _labelled_types(store: Store, layout: HeteroLayout) -> tuple[str, ...]:
    """The node types of a typed store that have labels (any label >= 0), in the layout's order."""
    labels = store.labels
    return tuple(t.name for t in layout.node_types if t.count and bool(np.any(labels[t.offset:t.stop] >= 0)))


def _own_rows(rows: np.ndarray, info: NodeTypeInfo) -> np.ndarray:
    """Feature table rows of node type `info` at the type's own width and dtype: the zero padding of a narrower
    type dropped, and the table's common dtype cast back to the type's (exact: the table's dtype holds every
    type's values). A dtype numpy lacks (bfloat16) stays the table's."""
    try:
        dtype = rows.dtype if info.dtype is None else np.dtype(info.dtype)
    except TypeError:
        dtype = rows.dtype
    return np.ascontiguousarray(rows[:, :info.dim], dtype=dtype)


def _split_type(layout: HeteroLayout, node_type: str | None) -> NodeTypeInfo:
    """The node type whose split ids a typed store's `split_ids` gives: `node_type`, or the layout's target.

    Raises:
        ConfigError: (``node_type``) an unknown node type, or none given where the store has no single
            labelled type.
    """
    if node_type is None:
        if layout.target is None:
            raise ConfigError("node_type", "the typed store has no single labelled node type: name the node type "
                                           f"whose split ids to give ({', '.join(layout.node_type_names)})")
        node_type = layout.target
    try:
        return layout.node(node_type)
    except InputError as e:
        raise ConfigError("node_type", e.fault) from None


def _split_ids(store: Store, name: str, node_type: str | None) -> torch.Tensor:
    """Ids of a split as a tensor: node ids of a homogeneous store; a typed store's local ids of the split's
    nodes of one node type (`_split_type`), as PyG's ``input_nodes=(node type, ids)`` takes them."""
    ids = store.split_ids(name)
    layout = store.hetero
    if layout is None:
        if node_type not in (None, NODE_TYPE):
            raise ConfigError("node_type", f"a homogeneous store has one node type ({NODE_TYPE!r}, or None), "
                                           f"got {node_type!r}")
        return torch.from_numpy(ids)
    info = _split_type(layout, node_type)
    lo, hi = np.searchsorted(ids, [info.offset, info.stop])      # the split's ids are ascending
    return torch.from_numpy(ids[int(lo):int(hi)] - info.offset)


class StoreFeatureStore(pyg_data.FeatureStore):
    """The tensors of a diskflow store as a PyG `FeatureStore`: ``x`` (features) and ``y`` (labels) of its
    one node type, and ``edge_attr`` (edge features) of its edge type where the store has them;
    read-only. Where ``x``'s rows come from is the subclass's `gather`.

    ``y`` is the store's labels (int64, -1 where unlabeled), held in RAM (8 bytes a node). ``edge_attr``
    is asked by the edge type as group name (``("node", "to", "node")``, or ``(None, None)`` as PyG's
    homogeneous stores name it) and indexed by edge id, an edge's position in the store's CSC
    ``indices`` (what `NeighborSampler` returns as ``e_id``); its rows are read from the edge feature
    shards through their memory maps (`edge_gather`).

    A typed store (`diskflow.operators.formats.hetero`) serves, as PyG's `HeteroData` does, one group per
    node type (the group name is the type's name): ``x``, that type's rows at its own width and dtype
    (the feature table's zero padding of narrower types dropped), indexed by the type's local ids (row
    ``offset + id`` of the table), for every type with features (a featureless type, ``dim`` 0, has no
    ``x``); and ``y`` for every type with labels. Every ``x`` of one `multi_get_tensor` call (one per
    batch in PyG's loaders) is gathered in one read (`gather`). Another group name is a KeyError that
    lists the node types. A typed store has no edge features.
    """

    def __init__(self, store: Store | str | os.PathLike[str]) -> None:
        super().__init__()
        self.store = open_store(store)
        self.num_nodes = int(self.store.num_nodes)
        self.num_edges = int(self.store.num_edges)
        self.labels = self.store.labels
        self.edge_features = self.store.edge_features
        self.layout: HeteroLayout | None = self.store.hetero
        self.labelled: tuple[str, ...] = () if self.layout is None else _labelled_types(self.store, self.layout)
        self._types = {} if self.layout is None else {t.name: t for t in self.layout.node_types}

    @property
    def num_features(self) -> int:
        """The feature dimension: a model's input channels (a typed store: the table's, its widest type's;
        each type's own is ``get_tensor_size(node type, "x")[1]``)."""
        return int(self.store.feature_dim)

    @property
    def num_classes(self) -> int:
        """The label classes: a node classifier's output channels."""
        return int(self.store.num_classes)

    @property
    def num_edge_features(self) -> int:
        """The edge feature dimension (0 where the store has no edge features): an edge-aware model's
        ``edge_dim``."""
        return 0 if self.edge_features is None else int(self.edge_features.dim)

    def gather(self, ids: np.ndarray) -> np.ndarray:
        """Feature rows of `ids` (int64 node ids) as a new writable (len(ids), dim) array."""
        raise NotImplementedError

    def edge_gather(self, ids: np.ndarray) -> np.ndarray:
        """Edge feature rows of `ids` (int64 edge ids: CSC positions) as a new (len(ids), edge dim) array,
        read through the shards' memory maps (a batch's edges are few beside its nodes' features)."""
        if self.edge_features is None:
            raise KeyError(f"{self.store.path} has no edge features (ingest edges with an edge_attr column)")
        return self.edge_features.gather(ids)

    def split_ids(self, name: str, node_type: str | None = None) -> torch.Tensor:
        """Node ids of a split ('train', 'val', 'test') as a tensor: a loader's ``input_nodes`` (a typed
        store: `GraphStore.split_ids`)."""
        return _split_ids(self.store, name, node_type)

    # ------------------------------------------------------------------ typed stores
    def _node_type(self, attr: TensorAttr) -> NodeTypeInfo | None:
        """The node type whose tensor `attr` asks of a typed store; None where the store serves no such tensor."""
        info = self._types.get(attr.group_name) if isinstance(attr.group_name, str) else None
        if info is not None and ((attr.attr_name == "x" and info.has_features)
                                 or (attr.attr_name == "y" and info.name in self.labelled)):
            return info
        return None

    def _typed_attrs(self) -> list[TensorAttr]:
        assert self.layout is not None
        return [TensorAttr(group_name=t.name, attr_name=a) for t in self.layout.node_types
                for a, served in (("x", t.has_features), ("y", t.name in self.labelled)) if served]

    def _typed_fault(self, attr: TensorAttr) -> str:
        """Why a typed store serves no tensor `attr`, in one line."""
        if attr.group_name not in self._types:
            return (f"{attr}: unknown node type {attr.group_name!r} (a typed store's groups are its node types: "
                    f"{', '.join(self._types)})")
        served = [a.attr_name for a in self._typed_attrs() if a.group_name == attr.group_name]
        return (f"{attr}: node type {attr.group_name!r} has no {attr.attr_name!r} "
                f"(it serves {', '.join(map(repr, served)) if served else 'nothing: no features, no labels'})")

    def _typed_ids(self, attr: TensorAttr) -> tuple[NodeTypeInfo, np.ndarray, bool]:
        info = self._node_type(attr)
        if info is None:
            raise KeyError(self._typed_fault(attr))
        ids, scalar = _row_ids(attr.index, info.count, f"{info.name} node")
        return info, ids, scalar

    def _get_typed(self, attr: TensorAttr) -> torch.Tensor:
        info, ids, scalar = self._typed_ids(attr)
        rows = _own_rows(self.gather(ids + info.offset), info) if attr.attr_name == "x" else self.labels[ids + info.offset]
        tensor = torch.from_numpy(rows)
        return tensor[0] if scalar else tensor

    def _multi_get_tensor(self, attrs: list[TensorAttr]) -> list[Any]:
        """The tensors of `attrs`; over a typed store every ``x`` asked is read in one `gather` (one cache
        call for a batch's node types), then split by type."""
        if self.layout is None:
            return super()._multi_get_tensor(attrs)
        out: list[Any] = [None] * len(attrs)
        wanted = []         # (position, node type, local ids, scalar) of each x
        for i, attr in enumerate(attrs):
            if attr.attr_name == "x":
                wanted.append((i, *self._typed_ids(attr)))
            else:
                out[i] = self._get_typed(attr)
        if wanted:
            rows = self.gather(np.concatenate([ids + info.offset for _, info, ids, _ in wanted]))
            start = 0
            for i, info, ids, scalar in wanted:
                tensor = torch.from_numpy(_own_rows(rows[start:start + ids.size], info))
                start += ids.size
                out[i] = tensor[0] if scalar else tensor
        return out

    @staticmethod
    def _is_edge(attr: TensorAttr) -> bool:
        return attr.group_name in EDGE_GROUPS and attr.attr_name == EDGE_ATTR

    def _known(self, attr: TensorAttr) -> bool:
        if self._is_edge(attr):
            return self.edge_features is not None
        return attr.group_name in (None, NODE_TYPE) and attr.attr_name in ATTRS

    def _get_tensor(self, attr: TensorAttr) -> torch.Tensor:
        if self.layout is not None:
            return self._get_typed(attr)
        if not self._known(attr):
            edges = (f"; 'edge_attr' of the edge type {EDGE_TYPE}" if self.edge_features is not None
                     else "; no edge features")
            raise KeyError(f"{attr}: a diskflow store holds 'x' and 'y' of one node type (group None){edges}")
        if self._is_edge(attr):
            ids, scalar = _row_ids(attr.index, self.num_edges, "edge")
            rows = self.edge_gather(ids)
        else:
            ids, scalar = _row_ids(attr.index, self.num_nodes)
            rows = self.gather(ids) if attr.attr_name == "x" else self.labels[ids]
        tensor = torch.from_numpy(rows)
        return tensor[0] if scalar else tensor

    def _get_tensor_size(self, attr: TensorAttr) -> tuple[int, ...] | None:
        if self.layout is not None:
            info = self._node_type(attr)
            return None if info is None else (info.count, info.dim) if attr.attr_name == "x" else (info.count,)
        if not self._known(attr):
            return None
        if self._is_edge(attr):
            return (self.num_edges, self.num_edge_features)
        return (self.num_nodes, int(self.store.feature_dim)) if attr.attr_name == "x" else (self.num_nodes,)

    def get_all_tensor_attrs(self) -> list[TensorAttr]:
        """``x`` and ``y`` of the node type None: what PyG's homogeneous loaders fetch for every batch.

        ``edge_attr`` is not listed: PyG's ``filter_custom_store`` indexes every listed tensor by the
        batch's nodes; a batch's edge features are fetched by its edge ids instead (see the module).
        A typed store lists, per node type in id order, ``x`` where it has features and ``y`` where it
        has labels.
        """
        if self.layout is not None:
            return self._typed_attrs()
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

    A typed store (`diskflow.operators.formats.hetero`) has one CSC per edge type, over local ids: each
    is the ``csc`` layout of its edge type ``(src, rel, dst)``, size (nodes of src, nodes of dst), as
    PyG's `HeteroData` names them; its edge ids are its CSC positions. `relations` holds them (memory
    maps, or arrays in RAM with `in_memory`), which `diskflow.pyghetero.HeteroNeighborSampler` samples;
    ``indptr`` and ``indices``, the homogeneous topology, are None.

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
        self.layout: HeteroLayout | None = self.store.hetero
        self.relations: list[tuple[np.ndarray, np.ndarray]] = []
        self._typed_csc: dict[EdgeType, tuple[torch.Tensor, torch.Tensor]] = {}
        if self.layout is None:
            self.indptr: np.ndarray = np.array(self.store.indptr) if self.in_memory else self.store.indptr
            self.indices: np.ndarray = np.array(self.store.indices) if self.in_memory else self.store.indices
        else:
            self.indptr = self.indices = None  # type: ignore[assignment]
            for k in range(len(self.layout.edge_types)):
                indptr, indices = self.store.relation(k)
                self.relations.append((np.array(indptr), np.array(indices)) if self.in_memory else (indptr, indices))
        self._csc: tuple[torch.Tensor, torch.Tensor] | None = None

    def split_ids(self, name: str, node_type: str | None = None) -> torch.Tensor:
        """Ids of a split ('train', 'val', 'test') as a tensor: a loader's ``input_nodes``.

        A homogeneous store's node ids. A typed store's splits are over its global ids; this gives the
        local ids (0 .. count - 1) of the split's nodes of one node type, by default the store's target
        type (the one labelled type), as PyG's ``input_nodes=(node type, ids)`` takes them::

            NodeLoader((features, graph), HeteroNeighborSampler(graph, [10, 10]),
                       input_nodes=("paper", graph.split_ids("train")), batch_size=1024)

        Raises:
            ConfigError: (``node_type``) an unknown node type; none given where the typed store has no
                single labelled type; another than ``"node"`` for a homogeneous store.
        """
        return _split_ids(self.store, name, node_type)

    def metadata(self) -> tuple[list[str], list[EdgeType]]:
        """A typed store's node types and edge types, PyG's ``HeteroData.metadata()``: what `to_hetero`
        builds a model for.

        Raises:
            ValueError: a homogeneous store (one node type, one edge type: no model to convert).
        """
        if self.layout is None:
            raise ValueError(f"{self.store.path} is a homogeneous store: it has no node and edge types")
        return self.layout.metadata()

    def _homogeneous(self, what: str) -> None:
        if self.layout is not None:
            raise ValueError(f"{what}: {self.store.path} is a typed store, with one topology per edge type "
                             "(get_all_edge_attrs lists them)")

    def link_edges(self, split: str) -> torch.Tensor:
        """The supervision edges of the store's link split ('train', 'val', 'test') as an int64 [2, P]
        tensor: a `LinkLoader`'s ``edge_label_index``.

        Raises:
            InputError: the store has no link split.
        """
        return torch.from_numpy(np.ascontiguousarray(self.store.link_edges(split), dtype=np.int64))

    def edges(self) -> torch.Tensor:
        """Every edge of the topology as an int64 [2, E] tensor (source, target), in CSC order: column
        ``i`` is the edge of id ``i``. 16 bytes an edge, in RAM. A homogeneous store's only (ValueError)."""
        self._homogeneous("edges()")
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(np.asarray(self.indptr)))
        return torch.from_numpy(np.stack([np.asarray(self.indices, dtype=np.int64), dst]))

    def edge_attr(self) -> EdgeAttr:
        """The one edge attribute: type None, layout csc, size (N, N). A homogeneous store's only (ValueError)."""
        self._homogeneous("edge_attr()")
        return EdgeAttr(edge_type=None, layout=EdgeLayout.CSC, is_sorted=True, size=(self.num_nodes, self.num_nodes))

    def get_all_edge_attrs(self) -> list[EdgeAttr]:
        """[`edge_attr`]: PyG then treats the graph as homogeneous. A typed store: one per edge type, in the
        layout's order: type ``(src, rel, dst)``, layout csc, size (nodes of src, nodes of dst)."""
        if self.layout is None:
            return [self.edge_attr()]
        lay = self.layout
        return [EdgeAttr(edge_type=e.key, layout=EdgeLayout.CSC, is_sorted=True,
                         size=(lay.node(e.src).count, lay.node(e.dst).count)) for e in lay.edge_types]

    def _get_typed_edge_index(self, edge_attr: EdgeAttr) -> tuple[torch.Tensor, torch.Tensor] | None:
        """A typed store's CSC of `edge_attr`'s edge type as int64 ``(row, colptr)``, made on the first call
        and kept; None for another layout (PyG converts from csc) or an unknown edge type (PyG's KeyError)."""
        assert self.layout is not None
        key = tuple(edge_attr.edge_type) if isinstance(edge_attr.edge_type, (tuple, list)) else None
        if key is None or edge_attr.layout != EdgeLayout.CSC or key not in self.layout.edge_type_keys:
            return None
        et: EdgeType = key  # type: ignore[assignment]
        if et not in self._typed_csc:
            indptr, indices = self.relations[self.layout.edge_index(et)]
            self._typed_csc[et] = (torch.from_numpy(np.array(indices, dtype=np.int64)),
                                   torch.from_numpy(np.array(indptr, dtype=np.int64)))
        return self._typed_csc[et]

    def _get_edge_index(self, edge_attr: EdgeAttr) -> tuple[torch.Tensor, torch.Tensor] | None:
        if self.layout is not None:
            return self._get_typed_edge_index(edge_attr)
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
        typed = "" if self.layout is None else (f", node_types={len(self.layout.node_types)}, "
                                                f"edge_types={len(self.layout.edge_types)}")
        return f"GraphStore({str(self.store.path)!r}, nodes={self.num_nodes:,}, edges={self.store.num_edges:,}{typed})"


def _data_csc(data: pyg_data.Data) -> tuple[np.ndarray, np.ndarray, torch.Tensor, int]:
    """The CSC (``indptr``, ``indices``) of an in-memory homogeneous `Data`, the edge permutation (CSC
    position -> the edge's column in ``data.edge_index``) and the node count.

    Edges are ordered by target, then source, then their column in ``edge_index``: the order in which
    `diskflow ingest` writes a store's CSC, so a store of `data` and `data` itself have the same CSC and
    sample alike (PyG's own sampler orders by target only).

    Raises:
        TypeError: `data` has no ``edge_index``.
        ValueError: ``edge_index`` is not an integer [2, E] tensor of ids in [0, num_nodes).
    """
    edge_index = getattr(data, "edge_index", None)
    if edge_index is None:
        raise TypeError("the Data has no edge_index (diskflow's sampler samples the edge_index topology)")
    ei = torch.as_tensor(edge_index).detach().cpu()
    if ei.dim() != 2 or ei.size(0) != 2 or ei.dtype.is_floating_point or ei.dtype == torch.bool:
        raise ValueError(f"data.edge_index: expected an integer [2, E] tensor, got {ei.dtype} {list(ei.shape)}")
    src, dst = ei.numpy().astype(np.int64, copy=False)
    num_nodes = int(data.num_nodes)
    if src.size and (min(int(src.min()), int(dst.min())) < 0 or max(int(src.max()), int(dst.max())) >= num_nodes):
        raise ValueError(f"data.edge_index: node ids must lie in [0, {num_nodes})")
    perm = np.lexsort((src, dst))          # stable: by target, then source, then column
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst, minlength=num_nodes), out=indptr[1:])
    return indptr, np.ascontiguousarray(src[perm]), torch.from_numpy(perm), num_nodes


class SeedStream:
    """The seeds a sampler draws its batches with: from torch's default generator (``seed=None``: then
    ``torch.manual_seed`` reproduces the whole loader), else from a stream of its own, one for the sampler's
    life in the main process and one per loader worker, from the worker's seed (which torch draws per worker
    and epoch from the loader's generator)."""

    def __init__(self, seed: int | None) -> None:
        self.seed = seed
        self._generator: torch.Generator | None = None
        self._key: tuple[int, int | None] | None = None

    def next(self) -> int:
        """The next batch's seed."""
        if self.seed is None:
            return int(torch.randint(_MAX_SEED, (), dtype=torch.int64))
        info = torch.utils.data.get_worker_info()
        key = (os.getpid(), None if info is None else int(info.seed))
        if self._generator is None or self._key != key:
            mixed = int(self.seed) if info is None else (int(self.seed) * 1_000_003 + int(info.seed)) & _MAX_SEED
            self._generator = torch.Generator().manual_seed(mixed)
            self._key = key
        return int(torch.randint(_MAX_SEED, (), dtype=torch.int64, generator=self._generator))


class NeighborSampler(BaseSampler):
    """A PyG sampler over diskflow's native multi-hop neighbour sampler (no pyg-lib needed).

    Uniform sampling without replacement, PyG's ``directional`` subgraph of a homogeneous graph
    (`diskflow.operators.prepare.sample`): the batch's ``n_id`` starts with the seeds, ``edge_index``
    is local, source -> target, ``e_id`` gives each of its edges' id, and ``num_sampled_nodes`` /
    ``num_sampled_edges`` count per hop.

    It samples a store's `GraphStore`, or an in-memory PyG `Data` (its ``edge_index`` put in CSC order
    by target, then source: the order of a store ingested from it; `edge_permutation` maps the CSC
    positions back to ``edge_index``'s columns, so PyG's loaders give a `Data` batch the ``e_id`` and
    ``edge_attr`` of the `Data`'s own edges). Over a store of a `Data` and over the `Data` itself the
    same seed gives the same batches.

    Every batch draws with its own seed: from a generator seeded with `seed`, or, with ``seed=None``,
    from torch's default generator (``torch.manual_seed`` then reproduces the whole loader). A loader
    worker process draws from its own stream.

    Link batches (`sample_from_edges`) follow PyG's own `NeighborSampler` with ``disjoint=False``: the
    seeds are the sorted unique end nodes of the batch's links and of its negatives (``"binary"``:
    random pairs; ``"triplet"``: random destinations, PyG's `NegativeSampling`), and ``edge_label_index``,
    ``edge_label`` (or ``src_index``, ``dst_pos_index``, ``dst_neg_index``) index them.

    Args:
        data: a `GraphStore`, a ``(feature_store, graph_store)`` pair, or a homogeneous PyG `Data`.
        num_neighbors: neighbours per hop (-1: all), a list or PyG's `NumNeighbors` of one.
        seed: the seed of the batches' seeds (None: torch's default generator).
        num_threads: sampler threads (None: one per core); the samples do not depend on it.

    Raises:
        ConfigError: bad fanouts or num_threads.
        TypeError: `data` holds no diskflow `GraphStore` and is no `Data`.
        ValueError: a `Data`'s ``edge_index`` is not a [2, E] tensor of its node ids.
    """

    def __init__(self, data: GraphStore | tuple[Any, GraphStore] | pyg_data.Data,
                 num_neighbors: Sequence[int] | NumNeighbors,
                 seed: int | None = None, num_threads: int | None = None) -> None:
        graph = data[1] if isinstance(data, (tuple, list)) else data
        if not isinstance(graph, (GraphStore, pyg_data.Data)):
            raise TypeError(f"expected a diskflow.pyg.GraphStore (or a (feature_store, graph_store) pair) or a "
                            f"torch_geometric Data, got {type(graph).__name__}")
        values = num_neighbors.values if isinstance(num_neighbors, NumNeighbors) else num_neighbors
        if isinstance(values, dict):
            raise ConfigError("num_neighbors", "a diskflow store is homogeneous: give one list of fanouts, e.g. [10, 10]")
        try:
            self.num_neighbors = check_fanouts(values)
        except ConfigError as e:
            raise ConfigError("num_neighbors", e.fault) from None
        if num_threads is not None and int(num_threads) < 1:
            raise ConfigError("num_threads", f"{num_threads} must be >= 1")
        if isinstance(graph, GraphStore) and graph.layout is not None:
            raise TypeError(f"{graph.store.path} is a typed store: sample it with diskflow.pyghetero."
                            "HeteroNeighborSampler (a fanout list per edge type, seeds of one node type)")
        self.graph = graph
        self.perm: torch.Tensor | None = None
        if isinstance(graph, GraphStore):
            self.indptr, self.indices, self.num_nodes = graph.indptr, graph.indices, graph.num_nodes
        else:
            self.indptr, self.indices, self.perm, self.num_nodes = _data_csc(graph)
        self.seed = seed
        self.num_threads = num_threads
        self._native: NativeSampler | None = None
        self._native_pid = -1
        self._seeds = SeedStream(seed)

    @property
    def edge_permutation(self) -> torch.Tensor | None:
        """CSC position -> edge id (a `Data`'s ``edge_index`` column); None over a store, whose edge ids
        are its CSC positions. PyG's loaders map the sampled edges through it."""
        return self.perm

    def _sampler(self) -> NativeSampler:
        """This process's native sampler (its threads do not survive a fork into a loader worker)."""
        if self._native is None or self._native_pid != os.getpid():
            self._native = NativeSampler(self.indptr, self.indices, self.num_neighbors, self.num_threads)
            self._native_pid = os.getpid()
        return self._native

    def _next_seed(self) -> int:
        """The next batch's seed (`SeedStream`)."""
        return self._seeds.next()

    def _sample(self, seed: torch.Tensor, seed_time: torch.Tensor | None = None, **kwargs: Any) -> SamplerOutput:
        """Sample around the unique node ids `seed` (PyG's sampling function signature)."""
        if seed_time is not None:
            raise ValueError("diskflow's neighbour sampler does not sample by time (no temporal graphs)")
        if isinstance(seed, dict):
            raise TypeError("a diskflow store is homogeneous: seeds are node ids, not a dict by node type")
        b = self._sampler().sample(seed, seed=self._next_seed())
        edge_index = torch.from_numpy(np.asarray(b.edge_index, dtype=np.int64))
        e_id = getattr(b, "e_id", None)
        edge = None if e_id is None else torch.from_numpy(np.asarray(e_id, dtype=np.int64))
        return SamplerOutput(node=torch.from_numpy(np.asarray(b.n_id, dtype=np.int64)), row=edge_index[0],
                             col=edge_index[1], edge=edge, batch=None, num_sampled_nodes=list(b.num_sampled_nodes),
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
        """The subgraph around a batch of seed links' end nodes (`LinkLoader` calls this per batch), with
        PyG's own negative sampling and labels (PyG's ``edge_sample``, ``disjoint=False``).

        Raises:
            ValueError: links of another edge type, or with times (no temporal sampling here).
        """
        if index.input_type not in (None, EDGE_TYPE):
            raise ValueError(f"a diskflow store has one edge type {EDGE_TYPE}; got input type {index.input_type!r}")
        if index.time is not None:
            raise ValueError("edge_label_time: diskflow's neighbour sampler does not sample by time "
                             "(no temporal graphs)")
        homogeneous = dataclasses.replace(index, input_type=None) if index.input_type is not None else index
        return edge_sample(homogeneous, self._sample, self.num_nodes, False, None, neg_sampling)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.graph, self.num_neighbors, self.seed, self.num_threads))

    def __repr__(self) -> str:
        return f"NeighborSampler(num_neighbors={self.num_neighbors}, seed={self.seed})"


def link_input(graph: GraphStore, edge_label_index: Any) -> tuple[None, torch.Tensor]:
    """A `LinkLoader`'s ``edge_label_index`` over a diskflow `GraphStore` as PyG's
    ``(input type, [2, P] tensor)``: a plain int [2, P] tensor of node ids, ``(None, tensor)``,
    ``(("node", "to", "node"), tensor)``, the edge type alone, ``(edge type or None, None)`` or None
    (the last three: every edge of the topology, `GraphStore.edges`). The input type is always None:
    the store is homogeneous.

    Raises:
        ConfigError: (``edge_label_index``) any other form, another edge type, a tensor not int
            [2, P], or node ids out of range; the message says which.
    """
    def fail(fault: str) -> ConfigError:
        return ConfigError("edge_label_index", fault)

    value = edge_label_index
    edge_type: Any = None
    if isinstance(value, (tuple, list)):
        if len(value) == 3 and all(isinstance(v, str) for v in value):
            edge_type, value = tuple(value), None
        elif len(value) == 2 and (value[0] is None or isinstance(value[0], (tuple, list, str))):
            edge_type, value = value
            edge_type = None if edge_type is None else (edge_type if isinstance(edge_type, str) else tuple(edge_type))
        else:
            raise fail(f"expected a [2, P] tensor of node ids, (None, tensor) or (edge type, tensor); got a "
                       f"{type(value).__name__} of {len(value)}")
        if edge_type not in (None, (None, None), EDGE_TYPE):
            raise fail(f"a diskflow store has one edge type {EDGE_TYPE} (or None); got {edge_type!r}")
    if value is None:
        return None, graph.edges()
    if not isinstance(value, torch.Tensor):
        raise fail(f"expected a [2, P] tensor of node ids, got {type(value).__name__}")
    if value.dim() != 2 or value.size(0) != 2:
        raise fail(f"expected a [2, P] tensor of node ids (row 0 sources, row 1 targets), got shape {list(value.shape)}")
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise fail(f"node ids must be integers, got {value.dtype}")
    if value.numel() and (int(value.min()) < 0 or int(value.max()) >= graph.num_nodes):
        raise fail(f"node ids must lie in [0, {graph.num_nodes}), got {int(value.min())}..{int(value.max())}")
    return None, value.to(torch.long)


def _diskflow_pair(data: Any) -> tuple[StoreFeatureStore | None, GraphStore] | None:
    """``(feature store or None, graph store)`` where `data` is a pair whose graph store is diskflow's."""
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[1], GraphStore):
        return (data[0] if isinstance(data[0], StoreFeatureStore) else None), data[1]
    return None


def _pyg_own(module: Any, name: str) -> Callable[..., Any]:
    """PyG's own function `name` of `module`, where an earlier import of this module wrapped it."""
    function = getattr(module, name)
    return getattr(function, "__wrapped__", function)  # type: ignore[no-any-return]


_PYG_EDGE_LABEL_INDEX = _pyg_own(pyg_loader_utils, "get_edge_label_index")
_PYG_FILTER_CUSTOM_STORE = _pyg_own(pyg_loader_utils, "filter_custom_store")
_PYG_FILTER_CUSTOM_HETERO_STORE = _pyg_own(pyg_loader_utils, "filter_custom_hetero_store")


def _get_edge_label_index(data: Any, edge_label_index: Any) -> tuple[Any, torch.Tensor]:
    """PyG's ``get_edge_label_index``, with `link_input` for a pair over a diskflow `GraphStore`."""
    pair = _diskflow_pair(data)
    if pair is None:
        return _PYG_EDGE_LABEL_INDEX(data, edge_label_index)
    return link_input(pair[1], edge_label_index)


def _filter_custom_store(feature_store: Any, graph_store: Any, node: torch.Tensor, row: torch.Tensor,
                         col: torch.Tensor, edge: torch.Tensor | None, custom_cls: Any = None) -> Any:
    """PyG's ``filter_custom_store`` (the batch's nodes' tensors), plus, from a diskflow feature store with
    edge features, the batch's ``edge_attr``: the rows of its edge ids `edge`, aligned with ``edge_index``."""
    data = _PYG_FILTER_CUSTOM_STORE(feature_store, graph_store, node, row, col, edge, custom_cls)
    if isinstance(feature_store, StoreFeatureStore) and feature_store.edge_features is not None and edge is not None:
        data.edge_attr = feature_store[EDGE_TYPE, EDGE_ATTR, edge]
    return data


def _filter_custom_hetero_store(feature_store: Any, graph_store: Any, node_dict: dict[str, torch.Tensor],
                                row_dict: dict[Any, torch.Tensor], col_dict: dict[Any, torch.Tensor],
                                edge_dict: dict[Any, torch.Tensor | None], custom_cls: Any = None) -> Any:
    """PyG's ``filter_custom_hetero_store`` (each node type's listed tensors, each edge type's ``edge_index``),
    plus, over a diskflow typed `GraphStore`, ``num_nodes`` of every node type of the sample: PyG's gives a
    node type a store only through its tensors, so a featureless, unlabelled type had none (its nodes then
    counted only by inference from the ``n_id`` the loader adds, where PyG's in-memory ``filter_hetero_data``
    gives ``num_nodes``)."""
    data = _PYG_FILTER_CUSTOM_HETERO_STORE(feature_store, graph_store, node_dict, row_dict, col_dict, edge_dict,
                                           custom_cls)
    if isinstance(graph_store, GraphStore) and graph_store.layout is not None:
        for name, node in node_dict.items():
            if "num_nodes" not in data[name]:
                data[name].num_nodes = int(node.numel())
    return data


def _teach_pyg() -> None:
    """Route PyG's loaders' ``get_edge_label_index``, ``filter_custom_store`` and ``filter_custom_hetero_store``
    through this module's, which hand anything not diskflow's to PyG's own (kept as their ``__wrapped__``, so
    a re-import of this module wraps PyG's functions again, never its own wrappers)."""
    _get_edge_label_index.__wrapped__ = _PYG_EDGE_LABEL_INDEX  # type: ignore[attr-defined]
    _filter_custom_store.__wrapped__ = _PYG_FILTER_CUSTOM_STORE  # type: ignore[attr-defined]
    _filter_custom_hetero_store.__wrapped__ = _PYG_FILTER_CUSTOM_HETERO_STORE  # type: ignore[attr-defined]
    for module in (pyg_loader_utils, pyg_link_loader):
        module.get_edge_label_index = _get_edge_label_index
    for module in (pyg_loader_utils, pyg_node_loader, pyg_link_loader):
        module.filter_custom_store = _filter_custom_store
        module.filter_custom_hetero_store = _filter_custom_hetero_store


_teach_pyg()

__all__ = ["EDGE_ATTR", "EDGE_GROUPS", "EDGE_TYPE", "NODE_TYPE", "FeatureStore", "GraphStore", "NeighborSampler",
           "RowCache", "SeedStream", "StoreFeatureStore", "link_input", "open_store"]
