"""The typed layout of a heterogeneous store: node types as ranges of one global id space, edge types
as their own CSC topologies, one feature table over the global ids.

A typed store (docs/design.md, "Typed graphs") keeps every homogeneous key of its manifest, read the
same way, over global node ids: ``num_nodes`` (all types), ``features`` (one row table, rows of type
``t`` at ``[offset_t, offset_t + count_t)``), ``labels`` and ``splits``. Its ``topology`` is null;
the manifest's ``hetero`` entry holds instead::

    "hetero": {
      "node_types": [{"name", "offset", "count", "dim", "dtype", "derived"}, ...],
      "edge_types": [{"src", "rel", "dst", "indptr", "indices", "indices_dtype",
                      "num_edges", "edge_offset"}, ...],
      "target": "paper" | null
    }

- Node types are in global id order: every type with feature rows first, then the types without
  (``dim`` 0), whose ids lie past the feature table's last row. ``dim``/``dtype`` are the type's own
  width and type; the table holds the widest featured type's width in their common dtype (numpy's
  ``result_type``), narrower rows zero-padded. ``derived`` is null, or the rule its rows were derived
  by (``{"reduce": "mean", "edge_type": [src, rel, dst], "from": type}``).
- Edge type ``k`` has a CSC over its destination type's local ids: ``indptr`` int64 [count_dst + 1],
  ``indices`` (``indices_dtype``) the source type's local ids. Its edges are global edge ids
  ``[edge_offset, edge_offset + num_edges)`` in CSC order (a sampled edge's ``e_id``).
- ``target`` is the node type whose labels a node task learns, when exactly one type has labels.

A homogeneous store has no ``hetero`` entry and is one node type and one edge type.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import InputError

__all__ = ["EdgeType", "EdgeTypeInfo", "HeteroLayout", "NodeTypeInfo", "edge_type_name", "parse_edge_type"]

EdgeType = tuple[str, str, str]     # (source node type, relation, destination node type), as PyG names it


def edge_type_name(et: EdgeType) -> str:
    """PyG's way of writing an edge type on one line: ``src__rel__dst``."""
    return "__".join(et)


def parse_edge_type(text: str, what: str) -> EdgeType:
    """An edge type from ``src__rel__dst`` or ``src,rel,dst``; an InputError naming `what` otherwise."""
    parts = text.split("__") if "__" in text else text.split(",")
    if len(parts) != 3 or not all(p.strip() for p in parts):
        raise InputError(what, f"{text!r} is not an edge type: write it src__rel__dst (or src,rel,dst)")
    return (parts[0].strip(), parts[1].strip(), parts[2].strip())


@dataclass(frozen=True)
class NodeTypeInfo:
    """A node type: its global ids ``[offset, offset + count)``, its own feature width and dtype (0 and
    None without features) and the rule its features were derived by, if any."""

    name: str
    offset: int
    count: int
    dim: int
    dtype: str | None
    derived: dict[str, Any] | None = None

    @property
    def stop(self) -> int:
        return self.offset + self.count

    @property
    def has_features(self) -> bool:
        return self.dim > 0


@dataclass(frozen=True)
class EdgeTypeInfo:
    """An edge type and where its CSC topology lives (paths relative to the store)."""

    src: str
    rel: str
    dst: str
    indptr: str
    indices: str
    indices_dtype: str
    num_edges: int
    edge_offset: int

    @property
    def key(self) -> EdgeType:
        return (self.src, self.rel, self.dst)


class HeteroLayout:
    """A typed store's node and edge types (the manifest's ``hetero`` entry), with the vectorised maps
    between global ids and (type, local id) that batches and plans need."""

    def __init__(self, entry: dict[str, Any], where: str = "manifest.json") -> None:
        try:
            self.node_types = [NodeTypeInfo(str(n["name"]), int(n["offset"]), int(n["count"]), int(n.get("dim", 0)),
                                            n.get("dtype"), n.get("derived")) for n in entry["node_types"]]
            self.edge_types = [EdgeTypeInfo(str(e["src"]), str(e["rel"]), str(e["dst"]), str(e["indptr"]),
                                            str(e["indices"]), str(e["indices_dtype"]), int(e["num_edges"]),
                                            int(e["edge_offset"])) for e in entry["edge_types"]]
        except (KeyError, TypeError, ValueError) as err:
            raise InputError(where, f"hetero: a malformed typed layout ({err!r})") from err
        self.target: str | None = entry.get("target")
        self._node = {t.name: i for i, t in enumerate(self.node_types)}
        self._edge = {e.key: i for i, e in enumerate(self.edge_types)}
        if len(self._node) != len(self.node_types) or len(self._edge) != len(self.edge_types):
            raise InputError(where, "hetero: a node or edge type is listed twice")
        for e in self.edge_types:
            for end in (e.src, e.dst):
                if end not in self._node:
                    raise InputError(where, f"hetero: edge type {edge_type_name(e.key)} names an unknown node type "
                                            f"{end!r} (node types: {', '.join(self._node)})")
        self.offsets = np.array([t.offset for t in self.node_types] + [self.num_nodes], dtype=np.int64)
        self.edge_offsets = np.array([e.edge_offset for e in self.edge_types] + [self.num_edges], dtype=np.int64)

    # ------------------------------------------------------------------ names
    @property
    def node_type_names(self) -> list[str]:
        return [t.name for t in self.node_types]

    @property
    def edge_type_keys(self) -> list[EdgeType]:
        return [e.key for e in self.edge_types]

    def metadata(self) -> tuple[list[str], list[EdgeType]]:
        """PyG's ``HeteroData.metadata()``: what `to_hetero` needs to build a model for this graph."""
        return self.node_type_names, self.edge_type_keys

    @property
    def num_nodes(self) -> int:
        return sum(t.count for t in self.node_types)

    @property
    def num_edges(self) -> int:
        return sum(e.num_edges for e in self.edge_types)

    def node_index(self, name: str, what: str = "node type") -> int:
        """The position of node type `name`; an InputError naming `what` when there is none."""
        try:
            return self._node[name]
        except KeyError:
            raise InputError(what, f"unknown node type {name!r} (node types: {', '.join(self._node)})") from None

    def edge_index(self, et: EdgeType, what: str = "edge type") -> int:
        """The position of edge type `et`; an InputError naming `what` when there is none."""
        try:
            return self._edge[et]
        except KeyError:
            known = ", ".join(edge_type_name(k) for k in self._edge)
            raise InputError(what, f"unknown edge type {edge_type_name(et)!r} (edge types: {known})") from None

    def node(self, name: str) -> NodeTypeInfo:
        return self.node_types[self.node_index(name)]

    # ------------------------------------------------------------------ id maps
    def type_of(self, global_ids: np.ndarray) -> np.ndarray:
        """The node type (position) of each global id, vectorised."""
        return np.searchsorted(self.offsets, np.asarray(global_ids, dtype=np.int64), side="right") - 1

    def edge_type_of(self, global_edges: np.ndarray) -> np.ndarray:
        """The edge type (position) of each global edge id, vectorised."""
        return np.searchsorted(self.edge_offsets, np.asarray(global_edges, dtype=np.int64), side="right") - 1

    @property
    def feature_rows(self) -> int:
        """Rows of the feature table: the featured types' ids, which come first."""
        return sum(t.count for t in self.node_types if t.has_features)

    def featureless(self) -> list[str]:
        return [t.name for t in self.node_types if not t.has_features]

    def to_entry(self) -> dict[str, Any]:
        """The manifest entry this layout was read from (a round trip)."""
        return {
            "node_types": [{"name": t.name, "offset": t.offset, "count": t.count, "dim": t.dim, "dtype": t.dtype,
                            "derived": t.derived} for t in self.node_types],
            "edge_types": [{"src": e.src, "rel": e.rel, "dst": e.dst, "indptr": e.indptr, "indices": e.indices,
                            "indices_dtype": e.indices_dtype, "num_edges": e.num_edges, "edge_offset": e.edge_offset}
                           for e in self.edge_types],
            "target": self.target,
        }
