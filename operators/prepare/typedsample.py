"""Multi-hop neighbour sampling over a typed graph, with a fanout per edge type (PyG's heterogeneous
`NeighborLoader` semantics, ``disjoint=False``), written as one flat sample over global ids.

Semantics. Seeds are nodes of one target type. At hop ``h`` the frontier of node type ``t`` is the
set of type-``t`` nodes first discovered at hop ``h-1`` (hop 0: the seeds). Each edge type ``(s, r,
d)`` expands the frontier of ``d``: a node takes all its in-neighbours of that edge type when it has
at most the edge type's fanout at that hop (or the fanout is -1), else that many distinct ones drawn
uniformly. A drawn neighbour joins its type's nodes if it is new there; the edge joins the edge type.

The flat sample. Everything downstream of sampling (counting, tiers, Belady, packing, the loaders)
addresses rows by one global id and is unchanged by types, so the sampler writes what the homogeneous
one does: ``n_id`` (global ids), ``edge_index`` (local positions in ``n_id``), ``e_id`` (global edge
ids: an edge type's range, `formats.hetero`), ``num_sampled_nodes`` and ``num_sampled_edges`` per hop.
Nodes are ordered by hop, then type, then discovery; edges by hop, then edge type, then frontier
position and draw. Each type's nodes, and each edge type's edges, read in flat order, are exactly the
per-type order PyG's loader gives (`train.heterobatch` splits a flat batch into a `HeteroData`).

Draws are a pure function of (seed, hop, edge type, node): the same seed gives the same sample
whatever the thread count, as for the homogeneous sampler.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import ConfigError
from ..formats.hetero import EdgeType, HeteroLayout, edge_type_name, parse_edge_type
from .sample import SampledBatch, check_fanouts

__all__ = ["EdgeFanouts", "Fanouts", "TypedNeighborSampler", "as_fanouts", "fanouts_json", "typed_fanouts"]

Fanouts = Sequence[int] | Mapping[Any, Sequence[int]]    # one list for every edge type, or one per edge type
_UINT64_MASK = (1 << 64) - 1


class EdgeFanouts(tuple):   # type: ignore[type-arg]
    """Fanouts per edge type, as options and configurations carry them.

    As a tuple it is the largest fanout of each hop, what hop counts and batch bounds read wherever
    fanouts are one list; `per_type` holds the (``src__rel__dst``, hops) pairs as given, which the typed
    sampler reads (`typed_fanouts`) and keys, reports and JSON keep (`fanouts_json`). Two are equal only
    when their pairs are.
    """

    per_type: tuple[tuple[str, tuple[int, ...]], ...]

    def __new__(cls, pairs: Mapping[Any, Sequence[int]] | Sequence[tuple[Any, Sequence[int]]],  # noqa: PYI034
                option: str = "fanouts") -> EdgeFanouts:
        items = list(pairs.items()) if isinstance(pairs, Mapping) else list(pairs)
        if items and all(isinstance(i, (int, np.integer)) for i in items):
            # rebuilt from its items (dataclasses.asdict copies a tuple so): they are the per-hop largest only
            return tuple(int(i) for i in items)  # type: ignore[return-value, call-overload]
        if not items:
            raise ConfigError(option, "an empty dict: give every edge type to sample a list of fanouts")
        per_type = []
        for key, values in items:
            et = parse_edge_type(key, option) if isinstance(key, str) else tuple(key)
            if len(et) != 3:
                raise ConfigError(option, f"{key!r} is not an edge type: write it src__rel__dst")
            try:
                hops = tuple(check_fanouts(values))
            except ConfigError as e:
                raise ConfigError(option, f"{edge_type_name(et)}: {e.fault}") from None  # type: ignore[arg-type]
            per_type.append((edge_type_name(et), hops))  # type: ignore[arg-type]
        lengths = sorted({len(h) for _, h in per_type})
        if len(lengths) != 1:
            raise ConfigError(option, f"the edge types' lists differ in length ({lengths}): give every edge type one "
                                      "fanout per hop")
        columns = [[h[i] for _, h in per_type] for i in range(lengths[0])]
        largest = [-1 if -1 in col else max(col) for col in columns]
        obj = super().__new__(cls, largest)
        obj.per_type = tuple(per_type)
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (EdgeFanouts, (self.per_type,))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EdgeFanouts) and self.per_type == other.per_type

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(("EdgeFanouts", self.per_type))

    def __repr__(self) -> str:
        return f"EdgeFanouts({dict(self.per_type)!r})"

    def as_dict(self) -> dict[str, list[int]]:
        return {name: list(hops) for name, hops in self.per_type}


def as_fanouts(value: Any, option: str = "fanouts") -> tuple[int, ...]:
    """Fanouts as configurations keep them: a tuple of ints, or an `EdgeFanouts` (from a dict per edge type,
    or one already), kept as it is where a plain ``tuple(...)`` would drop its edge types."""
    if isinstance(value, EdgeFanouts):
        return value
    if isinstance(value, Mapping):
        return EdgeFanouts(value, option)
    return tuple(int(f) for f in value)


def fanouts_json(value: Any) -> list[int] | dict[str, list[int]]:
    """Fanouts as JSON (reports, manifests, cache keys): a list, or a dict per edge type."""
    return value.as_dict() if isinstance(value, EdgeFanouts) else [int(f) for f in value]


def typed_fanouts(layout: HeteroLayout, fanouts: Fanouts, option: str = "fanouts") -> list[list[int]]:
    """Per edge type (in the layout's order), the fanout of each hop.

    `fanouts` is one list for every edge type, or a dict from edge types (tuples, or ``src__rel__dst``
    strings) to lists; an edge type the dict leaves out is not sampled (fanout 0). Every list has the
    same number of hops.

    Raises:
        ConfigError: naming `option`: an unknown edge type, lists of different lengths, bad values.
    """
    if isinstance(fanouts, EdgeFanouts):
        fanouts = dict(fanouts.per_type)
    if not isinstance(fanouts, Mapping):
        hops = check_fanouts(fanouts)
        return [list(hops) for _ in layout.edge_types]
    if not fanouts:
        raise ConfigError(option, "an empty dict: give every edge type to sample a list of fanouts")
    out = [[] for _ in layout.edge_types]      # type: list[list[int]]
    lengths = set()
    for key, values in fanouts.items():
        et: EdgeType = parse_edge_type(key, option) if isinstance(key, str) else tuple(key)  # type: ignore[assignment]
        if et not in layout.edge_type_keys:
            known = ", ".join(edge_type_name(k) for k in layout.edge_type_keys)
            raise ConfigError(option, f"names an unknown edge type {edge_type_name(et)!r} (edge types: {known})")
        try:
            hops = check_fanouts(values)
        except ConfigError as e:
            raise ConfigError(option, f"{edge_type_name(et)}: {e.fault}") from None
        out[layout.edge_index(et)] = hops
        lengths.add(len(hops))
    if len(lengths) != 1:
        raise ConfigError(option, f"the edge types' lists differ in length ({sorted(lengths)}): give every edge type "
                                  "one fanout per hop")
    n_hops = lengths.pop()
    return [hops if hops else [0] * n_hops for hops in out]


class TypedNeighborSampler:
    """The typed sampler over a typed store's per-edge-type CSC topologies (module docstring).

    Args:
        layout: the store's node and edge types.
        relations: per edge type (layout order), its (indptr, indices), local ids.
        fanouts: one list for all edge types, or a dict per edge type (`typed_fanouts`).
        target: the node type of the seeds (default: the layout's target; `sample` may name another).
        num_threads: threads per draw (None: `os.cpu_count()`); the output does not depend on it.

    One object may be shared by threads: calls are serialised (it keeps a per-type scratch of batch
    positions, 4 bytes per node of the graph, like the homogeneous sampler's).
    """

    def __init__(self, layout: HeteroLayout, relations: Sequence[tuple[np.ndarray, np.ndarray]], fanouts: Fanouts,
                 target: str | None = None, num_threads: int | None = None) -> None:
        self.layout = layout
        self.per_type = typed_fanouts(layout, fanouts)
        self.fanouts = [max(hops[h] for hops in self.per_type) for h in range(len(self.per_type[0]))] \
            if self.per_type else []
        self.num_hops = len(self.per_type[0]) if self.per_type else 0
        name = target if target is not None else layout.target
        self.target = None if name is None else layout.node_index(name, "target")
        if len(relations) != len(layout.edge_types):
            raise ValueError(f"{len(relations)} relations for {len(layout.edge_types)} edge types")
        self.relations = [(np.asarray(p), np.asarray(i)) for p, i in relations]
        threads = (os.cpu_count() or 1) if num_threads is None else int(num_threads)
        if threads < 1:
            raise ConfigError("num_threads", f"{threads} must be >= 1")
        self.num_threads = threads
        self._scratch = [np.full(t.count, -1, dtype=np.int32) for t in layout.node_types]
        self._lock = threading.Lock()

    @property
    def num_nodes(self) -> int:
        return self.layout.num_nodes

    def sample(self, seeds: Any, seed: int, narrow: bool = False, target: str | None = None,
               **unsupported: Any) -> SampledBatch:
        """The flat sample around `seeds` (global ids of target-type nodes, unique), deterministic in `seed`;
        `target` names the seeds' node type where it is not the sampler's.

        `narrow`: ``n_id`` and ``edge_index`` as int32 (and ``e_id`` when the graph has at most 2**31 edges),
        as the samples files store them.

        Raises:
            ValueError: seeds not of the target type, or repeated.
            ConfigError: an option the typed sampler does not offer (a history plan's stop nodes).
        """
        if any(v not in (None, False, 0) for v in unsupported.values()):
            raise ConfigError("pipeline", "a typed graph's sampler does not prune subtrees (the historical embedding "
                                          "cache): use a pipeline without it")
        from ...native.kernels import sample_ranges

        lay = self.layout
        t_index = self.target if target is None else lay.node_index(target, "target")
        if t_index is None:
            raise ConfigError("target", "the graph has no single labelled node type: name the seeds' node type")
        tgt = lay.node_types[t_index]
        g = np.ascontiguousarray(np.asarray(seeds), dtype=np.int64).reshape(-1)
        if g.size and (int(g.min()) < tgt.offset or int(g.max()) >= tgt.stop):
            raise ValueError(f"seeds must be {tgt.name} nodes, global ids [{tgt.offset}, {tgt.stop})")
        with self._lock:
            scratch = self._scratch
            touched: list[list[np.ndarray]] = [[] for _ in lay.node_types]
            try:
                local = g - tgt.offset
                if np.any(scratch[t_index][local] >= 0) or np.unique(local).size != local.size:
                    raise ValueError("seeds must be unique (duplicates found)")
                scratch[t_index][local] = np.arange(local.size, dtype=np.int32)
                touched[t_index].append(local)
                n_parts = [g]
                frontier: list[np.ndarray | None] = [None] * len(lay.node_types)
                frontier[t_index] = local
                front_pos: list[np.ndarray | None] = [None] * len(lay.node_types)
                front_pos[t_index] = np.arange(local.size, dtype=np.int64)
                rows_parts: list[np.ndarray] = []
                cols_parts: list[np.ndarray] = []
                e_parts: list[np.ndarray] = []
                num_nodes = [int(local.size)]
                num_edges: list[int] = []
                next_pos = int(local.size)
                for hop in range(self.num_hops):
                    drawn = []          # (edge type, src type, neighbours, cols, global edge ids)
                    for k, et in enumerate(lay.edge_types):
                        f = self.per_type[k][hop]
                        d = lay.node_index(et.dst)
                        fr = frontier[d]
                        if f == 0 or fr is None or fr.size == 0:
                            continue
                        indptr, indices = self.relations[k]
                        counts, nbrs, pos = sample_ranges(indptr[fr], indptr[fr + 1], fr + lay.node_types[d].offset,
                                                          indices, f, int(seed) & _UINT64_MASK,
                                                          hop * len(lay.edge_types) + k, self.num_threads)
                        cols = np.repeat(front_pos[d], counts)   # type: ignore[arg-type]
                        drawn.append((k, lay.node_index(et.src), nbrs, cols, pos + et.edge_offset))
                    new_front: list[np.ndarray | None] = [None] * len(lay.node_types)
                    new_pos: list[np.ndarray | None] = [None] * len(lay.node_types)
                    added = 0
                    for t, info in enumerate(lay.node_types):
                        cands = [nb for (_, s, nb, _, _) in drawn if s == t]
                        if not cands:
                            continue
                        cand = np.concatenate(cands) if len(cands) > 1 else cands[0]
                        fresh = cand[scratch[t][cand] < 0]
                        uniq, first = np.unique(fresh, return_index=True)
                        new = uniq[np.argsort(first, kind="stable")]
                        positions = np.arange(next_pos, next_pos + new.size, dtype=np.int64)
                        scratch[t][new] = positions.astype(np.int32)
                        touched[t].append(new)
                        n_parts.append(new + info.offset)
                        new_front[t], new_pos[t] = new, positions
                        next_pos += int(new.size)
                        added += int(new.size)
                    for (_, s, nb, cols, eids) in drawn:
                        rows_parts.append(scratch[s][nb].astype(np.int64))
                        cols_parts.append(cols)
                        e_parts.append(eids)
                    num_nodes.append(added)
                    num_edges.append(int(sum(nb.size for (_, _, nb, _, _) in drawn)))
                    frontier, front_pos = new_front, new_pos
            finally:
                for t, parts in enumerate(touched):
                    for p in parts:
                        scratch[t][p] = -1
        n_id = np.concatenate(n_parts)
        rows = np.concatenate(rows_parts) if rows_parts else np.zeros(0, np.int64)
        cols = np.concatenate(cols_parts) if cols_parts else np.zeros(0, np.int64)
        e_id = np.concatenate(e_parts) if e_parts else np.zeros(0, np.int64)
        edge_index = np.stack([rows, cols])
        if narrow:
            n_id, edge_index = n_id.astype(np.int32), edge_index.astype(np.int32)
            if lay.num_edges <= 2**31:
                e_id = e_id.astype(np.int32)
        return SampledBatch(n_id, edge_index, num_nodes, num_edges, int(g.size), e_id, typed=True)
