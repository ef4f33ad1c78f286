"""The sampler of a store: the native homogeneous one, or the typed one over a typed store's edge types.

Every pipeline draws its samples through `store_sampler`, so a typed store is sampled with a fanout per
edge type wherever a homogeneous one is sampled, and the samples (one flat sample over global ids,
`typedsample`) flow through the same counting, tiers, plans, packing and loaders.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import ConfigError, InputError
from ..formats.hetero import HeteroLayout, edge_type_name
from .sample import NeighborSampler
from .typedsample import EdgeFanouts, TypedNeighborSampler, typed_fanouts

__all__ = ["check_store_fanouts", "check_typed_rows", "global_indptr", "global_sources", "refuse_typed", "store_sampler", "topology_view",
           "train_target"]


def check_typed_rows(layout: HeteroLayout, fanouts: Sequence[int] | Mapping[Any, Sequence[int]],
                     where: Any) -> None:
    """Refuse, in one line, a typed store whose sampled edge types reach a node type without features:
    its nodes would join batches with no rows to read (`where`: the store, for the error)."""
    per_type = typed_fanouts(layout, fanouts)
    for k, et in enumerate(layout.edge_types):
        if any(f != 0 for f in per_type[k]) and not layout.node(et.src).has_features:
            raise InputError(where, f"node type {et.src!r} has no features, and edge type {edge_type_name(et.key)} "
                                    f"samples its nodes: derive them at ingest (--derive {et.src}=mean:SRC__REL__DST) "
                                    f"or leave the edge type out of the fanouts")


def refuse_typed(history: Any, link: bool) -> None:
    """Refuse, in one line, what a typed store does not run yet: a historical embedding cache (OUTRE's, the
    memory split; its subtree pruning needs the homogeneous sampler) and link prediction."""
    if history:
        raise ConfigError("history_memory", "a typed store's sampler does not prune subtrees: the historical "
                                            "embedding cache (outre, belady_outre, the memory split) runs on "
                                            "homogeneous stores only")
    if link:
        raise ConfigError("task", "link prediction on a typed store is not supported yet: train a node task")


def train_target(layout: HeteroLayout | None, where: Any) -> tuple[HeteroLayout, str] | None:
    """(layout, target type) a node task on a typed store trains on (None on a homogeneous store).

    Raises:
        InputError: (`where`) no node type, or several, with labels: the seeds' type is not known.
    """
    if layout is None:
        return None
    if layout.target is None:
        raise InputError(where, "a typed store's node task needs seeds of one labelled node type, and this one has "
                                "none with labels, or several: give labels to one type at ingest")
    return layout, layout.target


def check_store_fanouts(store: Any, fanouts: Sequence[int] | Mapping[Any, Sequence[int]]) -> None:
    """Check `fanouts` against `store` before any work: fanouts per edge type only on a typed store, naming its
    edge types; on a typed store, no featureless node type sampled (`check_typed_rows`).

    Raises:
        ConfigError: (``fanouts``) per edge type on a homogeneous store, or naming an unknown edge type.
        InputError: (the store) a featureless node type would be sampled.
    """
    layout = getattr(store, "hetero", None)
    if layout is None:
        if isinstance(fanouts, (Mapping, EdgeFanouts)):
            raise ConfigError("fanouts", f"fanouts per edge type need a typed store, and {store.path} has one edge type")
        return
    check_typed_rows(layout, fanouts, store.path)


def store_sampler(store: Any, fanouts: Sequence[int] | Mapping[Any, Sequence[int]], num_threads: int | None = None,
                  in_ram: bool = False) -> NeighborSampler | TypedNeighborSampler:
    """The sampler of `store` (a `formats.store.Store`) with `fanouts` per hop (a dict per edge type on a
    typed store); `in_ram`: over RAM copies of the topology rather than its memory maps."""
    check_store_fanouts(store, fanouts)
    layout = getattr(store, "hetero", None)
    if layout is None:
        indptr, indices = store.indptr, store.indices
        if in_ram:
            indptr, indices = np.array(indptr), np.array(indices)
        return NeighborSampler(indptr, indices, list(fanouts), num_threads=num_threads)
    relations = []
    for k in range(len(layout.edge_types)):
        indptr, indices = store.relation(k)
        relations.append((np.array(indptr), np.array(indices)) if in_ram else (indptr, indices))
    return TypedNeighborSampler(layout, relations, fanouts, num_threads=num_threads)


def global_indptr(store: Any) -> np.ndarray:
    """The CSC column pointer over global ids: a homogeneous store's as stored; a typed store's built from every
    edge type's in-degrees (RAM, O(N)), for what reads in-degrees only (the hybrid cache policy)."""
    layout = getattr(store, "hetero", None)
    if layout is None:
        return np.asarray(store.indptr)
    deg = np.zeros(layout.num_nodes, dtype=np.int64)
    for k, et in enumerate(layout.edge_types):
        d = layout.node(et.dst)
        deg[d.offset:d.stop] += np.diff(np.asarray(store.relation(k)[0], dtype=np.int64))
    indptr = np.zeros(layout.num_nodes + 1, dtype=np.int64)
    np.cumsum(deg, out=indptr[1:])
    return indptr


def global_sources(store: Any) -> np.ndarray:
    """Every edge's source over global ids: a homogeneous store's CSC indices; a typed store's edge types' in
    turn (RAM, O(E); grouped by edge type, not by destination), for what counts them (the degree policy)."""
    layout = getattr(store, "hetero", None)
    if layout is None:
        return np.asarray(store.indices)
    parts = [np.asarray(store.relation(k)[1], dtype=np.int64) + layout.node(et.src).offset
             for k, et in enumerate(layout.edge_types)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def topology_view(store: Any) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices) of a store over global ids: a homogeneous store's CSC as stored, or a typed store's
    edge types merged into one CSC by destination (each node's in-edges of every type; RAM, O(N + E)), for
    what reads neighbour lists without the types (partition batches)."""
    layout = getattr(store, "hetero", None)
    if layout is None:
        return store.indptr, store.indices
    dst_parts = []
    for k, et in enumerate(layout.edge_types):
        d = layout.node(et.dst)
        counts: np.ndarray = np.diff(np.asarray(store.relation(k)[0], dtype=np.int64))
        dst_parts.append(np.repeat(np.arange(d.offset, d.stop, dtype=np.int64), counts))
    dst = np.concatenate(dst_parts) if dst_parts else np.zeros(0, np.int64)
    return global_indptr(store), global_sources(store)[np.argsort(dst, kind="stable")]
