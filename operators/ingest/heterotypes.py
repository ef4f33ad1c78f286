"""Typed (heterogeneous) raw datasets: their description, their files, and the operators that turn them into
a typed store (`operators.formats.hetero`).

A raw dataset is typed when it has ``RAW/hetero.json``::

    {"node_types": [{"name": "paper", "num_nodes": 736389}, ...],
     "edge_types": [["author", "writes", "paper"], ...]}

and then its shards are grouped by type, each folder holding the homogeneous format's shards:

    RAW/nodes/<type>/part-*.parquet       node_id (LOCAL id of the type), label, split (optional: a type
                                          without a folder has no labels)
    RAW/features/<type>/part-*.arrow      node_id (local), x (optional: a type may have no features; each
                                          type its own width and dtype)
    RAW/edges/<src>__<rel>__<dst>/*.parquet   src, dst: local ids of the src and dst types

A type's folder, where there is one, must cover the type's ids exactly once, as the homogeneous folders
cover 0..N-1. A declared edge type without a folder has no edges. Edge features and link splits are not
supported for typed datasets yet (an ``edge_attr`` or ``split`` column is refused).

The operators here are plain functions over paths and arrays, as the homogeneous ones: `ingest_typed_nodes`
(labels and splits over global ids), `write_typed_feature_shard` (one row-range shard of the global feature
table, streamed from each type's feature batches) and the planning helpers the flow builds its graph from
(`relations`, `node_order`, `plan_derive`).
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError, InputError
from ...native.constants import ALIGN
from ..formats.hetero import EdgeType, edge_type_name, parse_edge_type
from ..formats.store import SPLIT_CODE, SPLITS
from ..formats.storecheck import Piece
from .features import read_feature_rows, write_aligned
from .nodes import read_node_table, save_node_arrays
from .raw import RAW_DIRS, TABLE_SUFFIXES, TableUnit

__all__ = ["DERIVE_REDUCES", "HETERO_FILE", "DeriveRule", "HeteroRawFiles", "HeteroSpec", "NodeTypeSpec", "Relation",
           "TypedSegment", "check_type_name", "derive_paths", "etype_paths", "find_hetero_files", "ingest_typed_nodes",
           "is_typed_raw", "node_order", "parse_derive", "plan_derive", "read_hetero_spec", "relations",
           "write_typed_feature_shard"]

HETERO_FILE = "hetero.json"
DERIVE_REDUCES = ("mean",)      # how a derived type's row is made of its neighbours' rows


# ----------------------------------------------------------------------------- the description

def check_type_name(name: Any, what: str, where: str | os.PathLike[str]) -> str:
    """A node type or relation name usable as a folder name and in ``src__rel__dst``; InputError otherwise."""
    if not isinstance(name, str) or not name.strip():
        raise InputError(where, f"{what} {name!r} is not a name (a non-empty string)")
    if "/" in name or "\\" in name or "__" in name or name.startswith((".", "_")) or name != name.strip():
        raise InputError(where, f"{what} {name!r} cannot name a folder of the raw format: no '/', no '__', "
                                "no leading '.' or '_', no surrounding spaces")
    return name


@dataclass(frozen=True)
class NodeTypeSpec:
    """A node type of a typed raw dataset: its name and its node count (local ids 0..num_nodes-1)."""

    name: str
    num_nodes: int


@dataclass(frozen=True)
class HeteroSpec:
    """What ``hetero.json`` says: the node types (in order) and the edge types (in order)."""

    node_types: tuple[NodeTypeSpec, ...]
    edge_types: tuple[EdgeType, ...]

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.node_types]

    def count(self, name: str) -> int:
        """The node count of type `name`."""
        return next(t.num_nodes for t in self.node_types if t.name == name)

    def to_json(self) -> dict[str, Any]:
        return {"node_types": [{"name": t.name, "num_nodes": t.num_nodes} for t in self.node_types],
                "edge_types": [list(et) for et in self.edge_types]}

    @classmethod
    def from_json(cls, obj: Any, where: str | os.PathLike[str] = HETERO_FILE) -> HeteroSpec:
        """The description in `obj` (``hetero.json``'s content), checked; an InputError naming `where`.

        Raises:
            InputError: a malformed entry, a repeated node or edge type, a node count below 1, a name that
                cannot name a folder, or an edge type naming an unknown node type.
        """
        if not isinstance(obj, dict) or not isinstance(obj.get("node_types"), list) \
                or not isinstance(obj.get("edge_types"), list):
            raise InputError(where, 'expected {"node_types": [{"name", "num_nodes"}, ...], "edge_types": '
                                    '[[src, rel, dst], ...]}')
        nodes: list[NodeTypeSpec] = []
        for t in obj["node_types"]:
            if not isinstance(t, dict) or "name" not in t or "num_nodes" not in t:
                raise InputError(where, f"node type entry {t!r} needs a name and num_nodes")
            name = check_type_name(t["name"], "node type", where)
            n = t["num_nodes"]
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise InputError(where, f"node type {name!r}: num_nodes must be an integer >= 1, got {n!r}")
            nodes.append(NodeTypeSpec(name, int(n)))
        names = [t.name for t in nodes]
        if len(set(names)) != len(names):
            raise InputError(where, f"node type {next(n for n in names if names.count(n) > 1)!r} is listed twice")
        if not nodes:
            raise InputError(where, "no node types")
        edges: list[EdgeType] = []
        for e in obj["edge_types"]:
            if isinstance(e, str):
                et = parse_edge_type(e, str(where))
            elif isinstance(e, (list, tuple)) and len(e) == 3:
                et = (str(e[0]), str(e[1]), str(e[2]))
            else:
                raise InputError(where, f"edge type {e!r} is not [src, rel, dst]")
            for part, what in zip(et, ("node type", "relation", "node type")):
                check_type_name(part, what, where)
            for end in (et[0], et[2]):
                if end not in names:
                    raise InputError(where, f"edge type {edge_type_name(et)} names an unknown node type {end!r} "
                                            f"(node types: {', '.join(names)})")
            if et in edges:
                raise InputError(where, f"edge type {edge_type_name(et)} is listed twice")
            edges.append(et)
        return cls(tuple(nodes), tuple(edges))


def read_hetero_spec(root: str | os.PathLike[str]) -> HeteroSpec:
    """The checked ``hetero.json`` of the raw dataset at `root`."""
    path = Path(root) / HETERO_FILE
    try:
        obj = json.loads(path.read_text())
    except OSError as e:
        raise InputError(path, f"unreadable ({e.strerror or e})") from e
    except json.JSONDecodeError as e:
        raise InputError(path, f"not JSON ({e.msg} at line {e.lineno})") from e
    return HeteroSpec.from_json(obj, path)


def is_typed_raw(raw: Any) -> bool:
    """Whether `raw` is a local raw dataset directory with a ``hetero.json`` (a typed raw dataset)."""
    if not isinstance(raw, (str, os.PathLike)) or "://" in str(raw):
        return False
    return (Path(raw) / HETERO_FILE).is_file()


# ----------------------------------------------------------------------------- the files

@dataclass(frozen=True)
class HeteroRawFiles:
    """The table files of a typed raw dataset, per type, sorted by path within each type's folder."""

    root: Path
    spec: HeteroSpec
    nodes: dict[str, tuple[Path, ...]]          # node type -> its nodes files (empty: no labels)
    features: dict[str, tuple[Path, ...]]       # node type -> its feature files (empty: no features)
    edges: dict[EdgeType, tuple[Path, ...]]     # declared edge type -> its edge files (empty: no edges)

    def all(self) -> list[Path]:
        """``hetero.json`` and every input file: edges, features, nodes, in type order."""
        return [self.root / HETERO_FILE, *(p for et in self.spec.edge_types for p in self.edges[et]),
                *(p for t in self.spec.names for p in self.features[t]),
                *(p for t in self.spec.names for p in self.nodes[t])]

    def relative(self, path: Path) -> str:
        """`path` relative to the dataset root, with forward slashes (manifest keys)."""
        return path.relative_to(self.root).as_posix()


def _tables(folder: Path) -> tuple[Path, ...]:
    return tuple(sorted(p for p in folder.rglob("*")
                        if p.suffix.lower() in TABLE_SUFFIXES and p.is_file()
                        and not any(s.startswith((".", "_")) for s in p.relative_to(folder).parts)))


def find_hetero_files(raw: str | os.PathLike[str]) -> HeteroRawFiles:
    """List a typed raw dataset's files by type (``hetero.json`` says which types there are).

    Raises:
        InputError: a bad ``hetero.json``; a table file outside a type's folder; a folder naming a type or
            edge type ``hetero.json`` does not declare.
    """
    root = Path(raw).absolute()
    spec = read_hetero_spec(root)
    names = set(spec.names)
    by_name = {edge_type_name(et): et for et in spec.edge_types}
    found: dict[str, dict[str, tuple[Path, ...]]] = {}
    for part in RAW_DIRS:
        d = root / part
        found[part] = {}
        if not d.is_dir():
            continue
        for entry in sorted(d.iterdir()):
            if entry.name.startswith((".", "_")):
                continue
            if entry.is_file():
                if entry.suffix.lower() in TABLE_SUFFIXES:
                    where = "edges/SRC__REL__DST/" if part == "edges" else f"{part}/TYPE/"
                    raise InputError(entry, f"a typed raw dataset ({HETERO_FILE}) keeps its shards in one folder "
                                            f"per type ({where}), not directly in {part}/")
                continue
            known = by_name if part == "edges" else names
            if entry.name not in known:
                kind = "edge type" if part == "edges" else "node type"
                listed = ", ".join(sorted(known)) or "none"
                raise InputError(entry, f"names no {kind} of {HETERO_FILE} (its {kind}s: {listed})")
            found[part][entry.name] = _tables(entry)
    return HeteroRawFiles(root, spec,
                          nodes={t: found["nodes"].get(t, ()) for t in spec.names},
                          features={t: found["features"].get(t, ()) for t in spec.names},
                          edges={et: found["edges"].get(edge_type_name(et), ()) for et in spec.edge_types})


# ----------------------------------------------------------------------------- planning

@dataclass(frozen=True)
class Relation:
    """An edge type of the store and what its CSC is built from.

    Attributes:
        key: (src type, relation, dst type) as the store lists it.
        sources: (edge file, reversed) pairs: a reversed file's ``dst`` column gives the sources.
        undirected: the edges are spilled reversed as well and repeated edges dropped (a relation between
            one node type under to_undirected, as PyG's ``ToUndirected`` does it).
    """

    key: EdgeType
    sources: tuple[tuple[str, bool], ...]
    undirected: bool = False

    def reversed(self) -> Relation:
        """The same edges grouped by their sources: the CSC of (dst, rel, src)."""
        s, r, d = self.key
        return Relation((d, r, s), tuple((p, not rev) for p, rev in self.sources), self.undirected)


def relations(files: HeteroRawFiles, to_undirected: bool) -> list[Relation]:
    """The store's edge types, in order: the declared ones, then (with `to_undirected`) the reverse types.

    `to_undirected` follows PyG's ``ToUndirected``: an edge type whose ends are one node type gets its reverse
    edges added (then deduplicated); any other (s, r, d) gets a reverse type (d, "rev_" + r, s), holding its
    edges reversed, unless the dataset declares that type already.
    """
    out = [Relation(et, tuple((str(p), False) for p in files.edges[et]), to_undirected and et[0] == et[2])
           for et in files.spec.edge_types]
    if to_undirected:
        declared = set(files.spec.edge_types)
        for rel in list(out):
            s, r, d = rel.key
            rev = (d, f"rev_{r}", s)
            if s != d and rev not in declared:
                out.append(Relation(rev, tuple((p, True) for p, _ in rel.sources)))
    return out


def node_order(spec: HeteroSpec, featured: set[str] | frozenset[str]) -> list[str]:
    """The node types in global id order: those with feature rows first, then the rest, each in
    ``hetero.json``'s order (the feature table covers a prefix of the global ids)."""
    return [t for t in spec.names if t in featured] + [t for t in spec.names if t not in featured]


def etype_paths(k: int) -> tuple[str, str]:
    """The store-relative (indptr, indices) of edge type k's CSC."""
    return f"etypes/{k}/indptr.npy", f"etypes/{k}/indices.npy"


def derive_paths(k: int) -> tuple[str, str]:
    """The store-relative (indptr, indices) of edge type k's edges grouped by their sources (a derivation's)."""
    return f"derive/{k}/indptr.npy", f"derive/{k}/indices.npy"


@dataclass(frozen=True)
class DeriveRule:
    """How a featureless node type's feature rows are derived: the `reduce` of its neighbours' rows over the
    edges of `edge_type`, one end of which is `type`.

    Attributes:
        type: the node type whose rows are derived.
        edge_type: the edge type (src, rel, dst) whose edges give the neighbours.
        reduce: how the neighbours' rows are combined ("mean").
        indptr, indices: store-relative paths of a CSC grouped by `type` (``indptr`` over its local ids),
            whose indices are local ids of the `neighbour` type (filled in by `plan_derive`).
        neighbour: the other end's node type (filled in by `plan_derive`).
    """

    type: str
    edge_type: EdgeType
    reduce: str = "mean"
    indptr: str = ""
    indices: str = ""
    neighbour: str = ""

    @property
    def text(self) -> str:
        """The rule as ``--derive`` takes it: ``TYPE=mean:SRC__REL__DST``."""
        return f"{self.type}={self.reduce}:{edge_type_name(self.edge_type)}"

    def entry(self) -> dict[str, Any]:
        """The rule as a typed store's node type records it (`HeteroLayout`'s ``derived``)."""
        return {"reduce": self.reduce, "edge_type": list(self.edge_type), "from": self.neighbour}


def parse_derive(text: str) -> DeriveRule:
    """A `DeriveRule` from ``TYPE=mean:SRC__REL__DST`` (``--derive``); a ConfigError naming ``derive`` otherwise."""
    usage = "write TYPE=mean:SRC__REL__DST, e.g. author=mean:author__writes__paper"
    head, sep, tail = str(text).partition("=")
    reduce, colon, et_text = tail.partition(":")
    if not sep or not colon or not head.strip() or not reduce.strip():
        raise ConfigError("derive", f"{text!r} is not a derive rule: {usage}")
    if reduce.strip() not in DERIVE_REDUCES:
        raise ConfigError("derive", f"{text!r}: unknown reduce {reduce.strip()!r} (known: {', '.join(DERIVE_REDUCES)})")
    try:
        et = parse_edge_type(et_text, "derive")
    except InputError:
        raise ConfigError("derive", f"{text!r}: {et_text!r} is not an edge type: {usage}") from None
    return DeriveRule(head.strip(), et, reduce.strip())


def plan_derive(rules: Sequence[DeriveRule], spec: HeteroSpec, store_types: Sequence[EdgeType],
                featured: set[str] | frozenset[str]) -> list[DeriveRule]:
    """Check derive rules against a dataset and complete them (neighbour type and CSC paths), ordered so that
    a rule whose neighbour type is itself derived comes after the rule deriving it.

    Args:
        rules: the parsed rules (`parse_derive`).
        spec: the dataset's types.
        store_types: the store's edge types in order (`relations`' keys: with to_undirected, the reverse ones).
        featured: the node types that have feature rows in the raw data.

    Returns:
        The rules in derivation order, each with ``neighbour`` and with ``indptr``/``indices``: the edge
        type's own CSC when the derived type is its destination, else ``derive/<k>/`` (the edges grouped by
        their sources, which ingest builds for it).

    Raises:
        ConfigError: naming ``derive``, for an unknown node type or edge type, a type that is no end of its
            edge type, a type derived twice, a type that has features in the raw data, a neighbour type
            that has none and no rule, or rules that depend on one another in a cycle.
    """
    index = {et: k for k, et in enumerate(store_types)}
    done: list[DeriveRule] = []
    for r in rules:
        if r.type not in spec.names:
            raise ConfigError("derive", f"{r.text}: unknown node type {r.type!r} (node types: {', '.join(spec.names)})")
        if r.edge_type not in index:
            known = ", ".join(edge_type_name(et) for et in store_types)
            raise ConfigError("derive", f"{r.text}: unknown edge type {edge_type_name(r.edge_type)} "
                                        f"(edge types: {known})")
        s, _, d = r.edge_type
        if r.type not in (s, d):
            raise ConfigError("derive", f"{r.text}: {r.type!r} is no end of edge type {edge_type_name(r.edge_type)}")
        if r.type in featured:
            raise ConfigError("derive", f"{r.text}: node type {r.type!r} has features in the raw data "
                                        "(features/{0}/); only a featureless type is derived".format(r.type))
        if any(x.type == r.type for x in done):
            raise ConfigError("derive", f"{r.text}: node type {r.type!r} is derived by two rules")
        k = index[r.edge_type]
        neighbour = s if r.type == d else d
        indptr, indices = etype_paths(k) if r.type == d else derive_paths(k)
        done.append(replace(r, indptr=indptr, indices=indices, neighbour=neighbour))
    by_type = {r.type: r for r in done}
    for r in done:
        if r.neighbour not in featured and r.neighbour not in by_type:
            raise ConfigError("derive", f"{r.text}: neighbour type {r.neighbour!r} has no features and no rule "
                                        "deriving them")
    ordered: list[DeriveRule] = []
    placed: set[str] = set(featured)
    pending = list(done)
    while pending:          # a pass per rule at most: rules are few
        ready = [r for r in pending if r.neighbour in placed]
        if not ready:
            cycle = " -> ".join(f"{r.type} (from {r.neighbour})" for r in pending)
            raise ConfigError("derive", f"rules derive from one another in a cycle: {cycle}")
        for r in ready:
            ordered.append(r)
            placed.add(r.type)
        pending = [r for r in pending if r not in ready]
    return ordered


# ----------------------------------------------------------------------------- operators

def ingest_typed_nodes(types: Sequence[tuple[str, int, int, Sequence[str]]], num_nodes: int,
                       out_dir: str | os.PathLike[str], batch_rows: int = 1 << 20,
                       pieces: list[Piece] | None = None) -> dict[str, Any]:
    """Write ``labels.npy`` and ``splits.npy`` over global ids from each type's nodes files.

    Args:
        types: per node type (name, global offset, count, its nodes files); a type without files keeps
            label -1 and split "none".
        num_nodes: all types' nodes.
        out_dir: the (staging) store directory.
        batch_rows, pieces: as `nodes.ingest_nodes`'.

    Returns:
        ``{"num_classes", "split_counts", "labelled": the types with at least one label >= 0}``.

    Raises:
        InputError: as `nodes.read_node_table`'s, naming the file, row and type.
    """
    labels = np.full(num_nodes, -1, dtype=np.int64)
    splits = np.full(num_nodes, SPLIT_CODE["none"], dtype=np.uint8)
    labelled: list[str] = []
    for name, offset, count, files in types:     # a loop per type
        if not files:
            continue
        lab, spl = read_node_table(files, count, batch_rows, node_type=name)
        labels[offset:offset + count] = lab
        splits[offset:offset + count] = spl
        if len(lab) and int(lab.max()) >= 0:
            labelled.append(name)
    summary = save_node_arrays(out_dir, labels, splits, pieces)
    assert set(summary["split_counts"]) == set(SPLITS)
    return {**summary, "labelled": labelled}


@dataclass(frozen=True)
class TypedSegment:
    """The rows of one node type within a shard of the global feature table.

    Attributes:
        node_type: the type.
        lo, hi: its local ids [lo, hi) in this shard.
        row: the shard row of local id `lo`.
        dim: the type's own width (columns [0, dim) of its rows; the rest are zeros).
        units: the type's input units that may hold these rows (none for a derived type: zeros, filled later).
        features_dir: the type's features folder (named by a "missing rows" error).
    """

    node_type: str
    lo: int
    hi: int
    row: int
    dim: int
    units: tuple[TableUnit, ...]
    features_dir: str

    @property
    def derived(self) -> bool:
        return not self.units


def write_typed_feature_shard(segments: Sequence[TypedSegment], out_path: str | os.PathLike[str], *,
                              row_start: int, rows: int, dtype: np.dtype | str, dim: int,
                              allow_nonfinite: bool = False, batch_rows: int = 1 << 16,
                              pieces: list[Piece] | None = None, crc_name: str = "") -> dict[str, Any]:
    """Write one shard of a typed store's global feature table: rows [row_start, row_start + rows), each
    type's rows streamed from its own feature batches into its columns (cast to the table's `dtype`), the
    columns past a type's width zero, a derived type's rows zero (filled by the derivation).

    Args:
        segments: the types' rows in this shard (`TypedSegment`), covering it.
        out_path: the shard file (written under a temporary name, then renamed).
        row_start, rows: the shard's global row range.
        dtype, dim: the table's type and width (the widest type's; numpy's result type of the types').
        allow_nonfinite, batch_rows, pieces, crc_name: as `features.write_feature_shard`'s.

    Returns:
        The manifest entry of the shard (path filled by the caller).

    Raises:
        InputError: as `features.write_feature_shard`'s, naming the file and the type's local id.
    """
    buf = np.zeros((rows, dim), np.dtype(dtype))
    for s in segments:      # a loop per type
        if s.derived or s.hi <= s.lo:
            continue
        read_feature_rows(s.units, buf[s.row:s.row + s.hi - s.lo, :s.dim], lo=s.lo, hi=s.hi, dim=s.dim,
                          features_dir=s.features_dir, allow_nonfinite=allow_nonfinite, batch_rows=batch_rows)
    write_aligned(Path(out_path), buf, pieces, crc_name)
    return {"row_start": int(row_start), "rows": int(rows), "offset": ALIGN, "nbytes": int(buf.nbytes)}
