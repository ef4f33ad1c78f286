"""The raw input format (docs/design.md, "Formats") and its writer, which every importer and `synth` write
with.

The raw format is a directory of Arrow-partitioned shards, all named `part-NNNNN.*`::

    RAW/edges/part-*.parquet      src, dst: int64 (one row per directed edge); optionally
                                  edge_attr: fixed_size_list<float32|float16, D> (the edge's features)
                                  and split: string in {train, val, test} (a link split)
    RAW/features/part-*.arrow     node_id: int64, x: fixed_size_list<float32|float16, dim>
                                  (Arrow IPC file format; `.parquet` with the same schema also valid)
    RAW/nodes/part-*.parquet      node_id: int64, label: int64 (-1 = unlabeled),
                                  split: dictionary<string> in {train, val, test, none}
    RAW/manifest.json             written last: {"format": "diskflow-raw", "num_nodes", ...}

A typed raw dataset (`heterotypes`) adds ``RAW/hetero.json`` (its node types and counts, its edge types) and
groups the same shards by type: ``nodes/<type>/``, ``features/<type>/`` (each optional per type, each type its
own width and dtype) and ``edges/<src>__<rel>__<dst>/`` (local ids of the src and dst types); `HeteroRawWriter`
and `publish_hetero_raw` write it, chunked as the homogeneous writer does.

Node ids are 0..N-1; every node has exactly one feature row and one nodes row. The shard writers
write one shard each, atomically; `RawWriter` numbers and tallies them; `publish_raw` builds a whole
raw dataset under a staging name, manifest last, so an interrupted import leaves nothing that looks
valid. The checks and conversions here (`labels_as_int64`, `split_from_indices`, `check_edge_ids`,
`check_features`) turn a source's arrays into the format's columns, with errors naming the source.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import ipc

from ...errors import ConfigError, InputError
from ..formats.atomic import atomic_path, staging_dir, write_json
from ..formats.hetero import EdgeType, edge_type_name
from ..formats.manifest import write_manifest
from ..formats.outputs import OutputKind, check_replaceable
from ..formats.store import SPLITS
from .heterotypes import HETERO_FILE, HeteroSpec

__all__ = ["DEFAULT_CHUNK_BYTES", "FEATURE_FORMATS", "NO_SPLIT", "RAW_FORMAT", "RAW_KIND", "RAW_VERSION",
           "HeteroRawWriter", "RawWriter", "TypedNodes", "check_edge_features", "check_edge_ids", "check_features",
           "feature_batch", "feature_schema", "labels_as_int64", "publish_hetero_raw", "publish_raw",
           "raw_feature_dtype", "rows_per_chunk", "shard_name", "split_from_indices", "write_arrays",
           "write_edge_shard", "write_feature_shard", "write_node_shard", "write_typed_arrays"]

RAW_FORMAT = "diskflow-raw"
RAW_VERSION = 1
RAW_KIND = OutputKind("a diskflow raw dataset", formats=(RAW_FORMAT,))
FEATURE_FORMATS = ("arrow", "parquet")
DEFAULT_CHUNK_BYTES = 64 << 20  # source bytes streamed (and written as one shard) at a time
NO_SPLIT = SPLITS.index("none")  # the split code of a node in no split
_SPLIT_DICTIONARY = pa.array(SPLITS, pa.string())


# ---------------------------------------------------------------------------- shard writers

def shard_name(index: int, suffix: str) -> str:
    """The file name of shard `index`, e.g. `part-00007.parquet`."""
    return f"part-{index:05d}.{suffix}"


def write_edge_shard(path: str | os.PathLike[str], src: np.ndarray, dst: np.ndarray,
                     edge_attr: np.ndarray | None = None) -> int:
    """Atomically write one `edges/` shard (`src`, `dst` int64, and `edge_attr` [n, D] where given); returns
    the edge count."""
    cols = {"src": pa.array(np.asarray(src, dtype=np.int64)), "dst": pa.array(np.asarray(dst, dtype=np.int64))}
    if edge_attr is not None:
        ea = np.ascontiguousarray(edge_attr)
        cols["edge_attr"] = pa.FixedSizeListArray.from_arrays(pa.array(ea.reshape(-1)), ea.shape[1])
    table = pa.table(cols)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="snappy")
    return table.num_rows


def feature_schema(dim: int, dtype: np.dtype | str) -> pa.Schema:
    """Schema of a features shard: `node_id` int64 and `x` fixed_size_list<float, dim>."""
    value_type = pa.from_numpy_dtype(np.dtype(dtype))
    return pa.schema([("node_id", pa.int64()), ("x", pa.list_(value_type, dim))])


def feature_batch(node_id: np.ndarray, x: np.ndarray) -> pa.RecordBatch:
    """A features record batch from ids [n] and a row-major feature matrix [n, dim] (no copy of x)."""
    x = np.ascontiguousarray(x)
    values = pa.array(x.reshape(-1))
    return pa.RecordBatch.from_arrays(
        [pa.array(np.asarray(node_id, dtype=np.int64)), pa.FixedSizeListArray.from_arrays(values, x.shape[1])],
        schema=feature_schema(x.shape[1], x.dtype))


def write_feature_shard(path: str | os.PathLike[str], chunks: Iterable[tuple[np.ndarray, np.ndarray]],
                        dim: int, dtype: np.dtype | str, feature_format: str = "arrow") -> int:
    """Atomically write one `features/` shard from (node_id [n], x [n, dim]) chunks; returns rows.

    Chunks are written as they come (one record batch / row group each), so only one chunk
    is in memory at a time. `feature_format` is `arrow` (IPC file) or `parquet`.
    """
    schema = feature_schema(dim, dtype)
    rows = 0
    with atomic_path(path) as tmp:
        if feature_format == "arrow":
            with pa.OSFile(str(tmp), "wb") as sink, ipc.new_file(sink, schema) as writer:
                for node_id, x in chunks:
                    writer.write_batch(feature_batch(node_id, x))
                    rows += len(node_id)
        elif feature_format == "parquet":
            # Random-looking floats barely compress; skip the CPU cost.
            with pq.ParquetWriter(str(tmp), schema, compression="none") as writer:
                for node_id, x in chunks:
                    writer.write_batch(feature_batch(node_id, x))
                    rows += len(node_id)
        else:
            raise ConfigError("feature_format", f"unknown feature format {feature_format!r} (use arrow or parquet)")
    return rows


def write_node_shard(path: str | os.PathLike[str], node_id: np.ndarray, label: np.ndarray,
                     split_code: np.ndarray) -> int:
    """Atomically write one `nodes/` shard; `split_code` indexes `SPLITS` (0 train .. 3 none)."""
    split = pa.DictionaryArray.from_arrays(pa.array(np.asarray(split_code, dtype=np.int8)), _SPLIT_DICTIONARY)
    table = pa.table({"node_id": pa.array(np.asarray(node_id, dtype=np.int64)),
                      "label": pa.array(np.asarray(label, dtype=np.int64)), "split": split})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="snappy")
    return table.num_rows


class RawWriter:
    """Writes shards with consecutive numbers into a raw-dataset directory and tallies them.

    Importers feed it chunks in node order (features and nodes) and in any order (edges);
    `manifest()` then describes what was written and checks that every node got exactly
    one feature row and one nodes row.
    """

    def __init__(self, root: Path, feature_format: str = "arrow") -> None:
        if feature_format not in FEATURE_FORMATS:
            raise ConfigError("feature_format", f"unknown feature format {feature_format!r} (use arrow or parquet)")
        self.root = root
        self.feature_format = feature_format
        for sub in ("edges", "features", "nodes"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.num_edges = 0
        self.feature_rows = 0
        self.node_rows = 0
        self.feature_dim: int | None = None
        self.feature_dtype: np.dtype | None = None
        self.split_counts = np.zeros(len(SPLITS), dtype=np.int64)
        self.max_label = -1
        self._shards = {"edges": 0, "features": 0, "nodes": 0}

    def _next(self, kind: str, suffix: str) -> Path:
        i = self._shards[kind]
        self._shards[kind] += 1
        return self.root / kind / shard_name(i, suffix)

    def edges(self, src: np.ndarray, dst: np.ndarray, edge_attr: np.ndarray | None = None) -> None:
        """Write one edges shard (with its edges' features where given: float16 kept, else float32)."""
        if len(src):
            attr = None if edge_attr is None else raw_feature_dtype(edge_attr)
            self.num_edges += write_edge_shard(self._next("edges", "parquet"), src, dst, attr)

    def features(self, x: np.ndarray) -> None:
        """Write the next rows of the feature matrix (node ids continue from the last call)."""
        if not len(x):
            return
        x = raw_feature_dtype(x)
        if self.feature_dim is None:
            self.feature_dim, self.feature_dtype = int(x.shape[1]), x.dtype
        start = self.feature_rows
        node_id = np.arange(start, start + len(x), dtype=np.int64)
        self.feature_rows += write_feature_shard(self._next("features", self.feature_format), [(node_id, x)],
                                                 self.feature_dim, x.dtype, self.feature_format)

    def nodes(self, label: np.ndarray, split_code: np.ndarray) -> None:
        """Write the next rows of labels and split codes (node ids continue from the last call)."""
        if not len(label):
            return
        start = self.node_rows
        node_id = np.arange(start, start + len(label), dtype=np.int64)
        self.node_rows += write_node_shard(self._next("nodes", "parquet"), node_id, label, split_code)
        self.split_counts += np.bincount(split_code, minlength=len(SPLITS))[: len(SPLITS)]
        if len(label):
            self.max_label = max(self.max_label, int(np.max(label)))

    def manifest(self, num_nodes: int, source: dict[str, Any]) -> dict[str, Any]:
        """The raw manifest (not yet written); checks the row counts against `num_nodes`."""
        if self.feature_rows != num_nodes:
            raise InputError(source.get("features", source.get("path", "features")),
                             f"{self.feature_rows} feature rows for {num_nodes} nodes")
        if self.node_rows != num_nodes:
            raise InputError(source.get("labels", source.get("path", "labels")),
                             f"{self.node_rows} label rows for {num_nodes} nodes")
        if self.feature_dim is None or self.feature_dtype is None:
            raise InputError(source.get("features", source.get("path", "features")), "no nodes")
        return {
            "format": RAW_FORMAT, "version": RAW_VERSION,
            "num_nodes": num_nodes, "num_edges": self.num_edges,
            "num_classes": self.max_label + 1,
            "feature_dim": self.feature_dim, "feature_dtype": str(self.feature_dtype),
            "feature_format": self.feature_format,
            "feature_bytes": num_nodes * self.feature_dim * self.feature_dtype.itemsize,
            "split_counts": dict(zip(SPLITS, self.split_counts.tolist())),
            "shards": dict(self._shards),
            "source": source,
        }


def raw_feature_dtype(x: np.ndarray) -> np.ndarray:
    """Features as the raw format stores them: float16 stays, everything else becomes float32."""
    x = np.asarray(x)
    if x.dtype == np.float16 or x.dtype == np.float32:
        return x
    return x.astype(np.float32)


def rows_per_chunk(row_bytes: int, chunk_bytes: int) -> int:
    """Rows of `row_bytes` each in about `chunk_bytes` of source (at least one)."""
    return max(1, chunk_bytes // max(1, row_bytes))


def write_arrays(w: RawWriter, x: np.ndarray, labels: np.ndarray | None, codes: np.ndarray, src: np.ndarray,
                 dst: np.ndarray, chunk_bytes: int, edge_name: str, labels_name: str | None = None,
                 edge_attr: np.ndarray | None = None, edge_attr_name: str = "edge_attr") -> int:
    """Write whole (or memory-mapped) arrays through `w` in chunks of about `chunk_bytes`: the feature rows
    `x`, the nodes (`labels`, split `codes`), then the edges `src` -> `dst`, each chunk's ids checked against
    the node count (errors name `edge_name`). `labels`: None leaves every node unlabeled; with `labels_name`
    each chunk goes through `labels_as_int64` under that name, else they are int64 labels already. Returns
    the node count (what `publish_raw`'s build returns). `edge_attr` [E, D] (aligned with the edges) goes with
    them, each chunk checked finite (errors name `edge_attr_name`)."""
    num_nodes = int(x.shape[0])
    rows = rows_per_chunk(x.shape[1] * x.dtype.itemsize, chunk_bytes)
    for lo in range(0, num_nodes, rows):
        w.features(np.asarray(x[lo: lo + rows]))
    node_rows = rows_per_chunk(16, chunk_bytes)
    for lo in range(0, num_nodes, node_rows):
        hi = min(lo + node_rows, num_nodes)
        if labels is None:
            y = np.full(hi - lo, -1, dtype=np.int64)
        elif labels_name is not None:
            y = labels_as_int64(np.asarray(labels[lo:hi]), labels_name)
        else:
            y = labels[lo:hi]
        w.nodes(y, codes[lo:hi])
    edge_rows = rows_per_chunk(16 + (0 if edge_attr is None else edge_attr.shape[1] * edge_attr.dtype.itemsize),
                               chunk_bytes)
    for lo in range(0, len(src), edge_rows):
        cs, cd = np.asarray(src[lo: lo + edge_rows]), np.asarray(dst[lo: lo + edge_rows])
        check_edge_ids(cs, cd, num_nodes, edge_name)
        ea = None if edge_attr is None else np.asarray(edge_attr[lo: lo + edge_rows])
        if ea is not None and np.issubdtype(ea.dtype, np.floating) and not np.isfinite(ea).all():
            row = lo + int(np.flatnonzero(~np.isfinite(ea).all(axis=1))[0])
            raise InputError(edge_attr_name, f"non-finite edge feature value (NaN or inf) at edge {row}")
        w.edges(cs, cd, ea)
    return num_nodes


def publish_raw(out: str | os.PathLike[str], force: bool, source: dict[str, Any], feature_format: str,
             build: Any) -> Path:
    """Run `build(writer) -> num_nodes` in a staging directory and publish it, manifest last.

    Skips the work when `out` already holds a raw dataset made from the same source
    (same file fingerprints), unless `force`.
    """
    previous = check_replaceable(out, force, RAW_KIND)
    if previous is not None and not force and previous.get("source") == source and source.get("inputs"):
        return Path(out)
    with staging_dir(out) as stage:
        writer = RawWriter(stage, feature_format)
        num_nodes = build(writer)
        write_manifest(stage, writer.manifest(num_nodes, source))
    return Path(out)


class HeteroRawWriter:
    """Writes a typed raw dataset's shards (`heterotypes`): per node type its feature and nodes shards (local
    ids continue from the type's last call), per edge type its edge shards, each folder numbered on its own;
    `manifest()` then checks that every type given features or nodes got exactly one row per node."""

    def __init__(self, root: Path, spec: HeteroSpec, feature_format: str = "arrow") -> None:
        if feature_format not in FEATURE_FORMATS:
            raise ConfigError("feature_format", f"unknown feature format {feature_format!r} (use arrow or parquet)")
        self.root = root
        self.spec = spec
        self.feature_format = feature_format
        for sub in ("edges", "features", "nodes"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        names = spec.names
        self.feature_rows = dict.fromkeys(names, 0)
        self.node_rows = dict.fromkeys(names, 0)
        self.feature_type: dict[str, tuple[int, np.dtype]] = {}
        self.num_edges: dict[EdgeType, int] = dict.fromkeys(spec.edge_types, 0)
        self.split_counts = np.zeros(len(SPLITS), dtype=np.int64)
        self.max_label = -1
        self.labelled: set[str] = set()
        self._shards: dict[str, int] = {}

    def _next(self, folder: str, suffix: str) -> Path:
        i = self._shards.get(folder, 0)
        self._shards[folder] = i + 1
        return self.root / folder / shard_name(i, suffix)

    def _count(self, node_type: str) -> int:
        if node_type not in self.feature_rows:
            raise InputError(node_type, f"not a node type of this dataset ({', '.join(self.spec.names)})")
        return self.spec.count(node_type)

    def features(self, node_type: str, x: np.ndarray) -> None:
        """Write the next feature rows of `node_type` (float16 kept, else float32)."""
        self._count(node_type)
        if not len(x):
            return
        x = raw_feature_dtype(x)
        dim, dtype = self.feature_type.setdefault(node_type, (int(x.shape[1]), x.dtype))
        start = self.feature_rows[node_type]
        node_id = np.arange(start, start + len(x), dtype=np.int64)
        self.feature_rows[node_type] += write_feature_shard(
            self._next(f"features/{node_type}", self.feature_format), [(node_id, x)], dim, dtype, self.feature_format)

    def nodes(self, node_type: str, label: np.ndarray, split_code: np.ndarray) -> None:
        """Write the next labels and split codes of `node_type`."""
        self._count(node_type)
        if not len(label):
            return
        start = self.node_rows[node_type]
        node_id = np.arange(start, start + len(label), dtype=np.int64)
        self.node_rows[node_type] += write_node_shard(self._next(f"nodes/{node_type}", "parquet"), node_id, label,
                                                      split_code)
        self.split_counts += np.bincount(split_code, minlength=len(SPLITS))[: len(SPLITS)]
        top = int(np.max(label))
        self.max_label = max(self.max_label, top)
        if top >= 0:
            self.labelled.add(node_type)

    def edges(self, edge_type: EdgeType, src: np.ndarray, dst: np.ndarray, name: str = "edge_index") -> None:
        """Write one shard of `edge_type`'s edges (local ids of its src and dst types; errors name `name`)."""
        if edge_type not in self.num_edges:
            raise InputError(name, f"edge type {edge_type_name(edge_type)} is not in {HETERO_FILE}")
        if not len(src):
            return
        s, _, d = edge_type
        for ids, end, what in ((src, s, "source"), (dst, d, "destination")):
            count = self.spec.count(end)
            lo, hi = int(np.min(ids)), int(np.max(ids))
            if lo < 0 or hi >= count:
                raise InputError(name, f"{what} id out of range [0, {count}) of node type {end!r} (min {lo}, max {hi})")
        self.num_edges[edge_type] += write_edge_shard(self._next(f"edges/{edge_type_name(edge_type)}", "parquet"),
                                                      src, dst)

    def manifest(self, source: dict[str, Any]) -> dict[str, Any]:
        """The raw manifest (not yet written); checks each type's row counts."""
        where = source.get("path", "features")
        for t in self.spec.node_types:
            rows = self.feature_rows[t.name]
            if rows and rows != t.num_nodes:
                raise InputError(where, f"{rows} feature rows for the {t.num_nodes} nodes of type {t.name!r}")
            rows = self.node_rows[t.name]
            if rows and rows != t.num_nodes:
                raise InputError(where, f"{rows} label rows for the {t.num_nodes} nodes of type {t.name!r}")
        if not self.feature_type:
            raise InputError(where, "no node type has features (x)")
        widths = {t: d for t, (d, _) in self.feature_type.items()}
        dtype = np.result_type(*[dt for _, dt in self.feature_type.values()])
        feature_bytes = sum(self.spec.count(t) * d * dt.itemsize for t, (d, dt) in self.feature_type.items())
        return {
            "format": RAW_FORMAT, "version": RAW_VERSION,
            "num_nodes": sum(t.num_nodes for t in self.spec.node_types),
            "num_edges": sum(self.num_edges.values()),
            "num_classes": self.max_label + 1,
            "feature_dim": max(widths.values()), "feature_dtype": str(dtype),
            "feature_format": self.feature_format, "feature_bytes": int(feature_bytes),
            "split_counts": dict(zip(SPLITS, self.split_counts.tolist())),
            "shards": dict(self._shards),
            "hetero": {
                "node_types": [{"name": t.name, "num_nodes": t.num_nodes, "feature_dim": widths.get(t.name, 0),
                                "feature_dtype": str(self.feature_type[t.name][1]) if t.name in widths else None,
                                "labelled": t.name in self.labelled} for t in self.spec.node_types],
                "edge_types": [{"edge_type": list(et), "num_edges": n} for et, n in self.num_edges.items()]},
            "source": source,
        }


TypedNodes = tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]   # (x, labels, split codes)


def write_typed_arrays(w: HeteroRawWriter, nodes: dict[str, TypedNodes],
                       edges: dict[EdgeType, tuple[np.ndarray, np.ndarray]], chunk_bytes: int, name: str) -> None:
    """Write whole (or memory-mapped) arrays through `w` in chunks of about `chunk_bytes`: per node type its
    feature rows and, where it has labels or splits, its nodes (labels None: -1; codes None: "none"), then
    per edge type its (src, dst) local ids (errors name ``name: edge type``)."""
    for t, (x, labels, codes) in nodes.items():     # a loop per type, then per chunk
        count = w.spec.count(t)
        if x is not None:
            rows = rows_per_chunk(x.shape[1] * x.dtype.itemsize, chunk_bytes)
            for lo in range(0, count, rows):
                w.features(t, np.asarray(x[lo:lo + rows]))
        if labels is None and codes is None:
            continue
        step = rows_per_chunk(16, chunk_bytes)
        for lo in range(0, count, step):
            hi = min(lo + step, count)
            y = np.full(hi - lo, -1, np.int64) if labels is None else np.asarray(labels[lo:hi], np.int64)
            c = np.full(hi - lo, NO_SPLIT, np.uint8) if codes is None else np.asarray(codes[lo:hi], np.uint8)
            w.nodes(t, y, c)
    step = rows_per_chunk(16, chunk_bytes)
    for et, (src, dst) in edges.items():
        for lo in range(0, len(src), step):
            w.edges(et, np.asarray(src[lo:lo + step]), np.asarray(dst[lo:lo + step]),
                    f"{name}: {edge_type_name(et)}.edge_index")


def publish_hetero_raw(out: str | os.PathLike[str], force: bool, source: dict[str, Any], feature_format: str,
                       spec: HeteroSpec, build: Any) -> Path:
    """Run `build(writer)` (a `HeteroRawWriter`) in a staging directory and publish a typed raw dataset:
    ``hetero.json``, then the manifest last. Skips the work as `publish_raw` does."""
    previous = check_replaceable(out, force, RAW_KIND)
    if previous is not None and not force and previous.get("source") == source and source.get("inputs"):
        return Path(out)
    with staging_dir(out) as stage:
        writer = HeteroRawWriter(stage, spec, feature_format)
        build(writer)
        write_json(stage / HETERO_FILE, spec.to_json())
        write_manifest(stage, writer.manifest(source))
    return Path(out)


def split_from_indices(num_nodes: int, indices: Sequence[tuple[int, np.ndarray, str]]) -> np.ndarray:
    """Split codes [N] (uint8) from per-split node-id arrays; overlaps and bad ids are errors."""
    codes = np.full(num_nodes, NO_SPLIT, dtype=np.uint8)
    for code, idx, name in indices:
        idx = np.asarray(idx)
        if idx.size == 0:
            continue
        if not np.issubdtype(idx.dtype, np.integer):
            raise InputError(name, f"split indices must be integers, got {idx.dtype}")
        idx = idx.reshape(-1)
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= num_nodes:
            raise InputError(name, f"node id out of range [0, {num_nodes}) (min {lo}, max {hi})")
        taken = codes[idx] != NO_SPLIT
        if taken.any():
            other = SPLITS[int(codes[idx[np.argmax(taken)]])]
            raise InputError(name, f"{int(taken.sum())} node(s) also in the {other} split "
                                   f"(e.g. node {int(idx[np.argmax(taken)])})")
        codes[idx] = code
    return codes


def labels_as_int64(y: np.ndarray, name: str) -> np.ndarray:
    """Labels [n] as int64 with -1 = unlabeled; NaN (OGB's marker) becomes -1."""
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise InputError(name, f"labels must be one class per node, shape [N] or [N, 1], got {list(y.shape)}")
    if np.issubdtype(y.dtype, np.floating):
        nan = np.isnan(y)
        filled = np.where(nan, -1.0, y)
        if not np.array_equal(filled, np.round(filled)):
            raise InputError(name, "labels must be integral class ids (floats with fractions found)")
        out = filled.astype(np.int64)
    elif np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_:
        out = y.astype(np.int64)
    else:
        raise InputError(name, f"labels must be integers, got dtype {y.dtype}")
    if out.size and int(out.min()) < -1:
        raise InputError(name, f"labels must be >= -1 (-1 = unlabeled), found {int(out.min())}")
    return out


def check_edge_ids(src: np.ndarray, dst: np.ndarray, num_nodes: int, name: str) -> None:
    """Every edge endpoint is a node id in [0, `num_nodes`); errors name `name`."""
    if not len(src):
        return
    lo = min(int(src.min()), int(dst.min()))
    hi = max(int(src.max()), int(dst.max()))
    if lo < 0 or hi >= num_nodes:
        raise InputError(name, f"edge endpoint out of range [0, {num_nodes}) (min {lo}, max {hi})")


def check_edge_features(attr: np.ndarray, num_edges: int, name: str) -> np.ndarray:
    """Edge features as [E, D]: a numeric [E] (one value per edge, D = 1) or [E, D] array with one row per
    edge; errors name `name`."""
    a = attr.reshape(-1, 1) if attr.ndim == 1 else attr
    if a.ndim != 2 or a.shape[0] != num_edges:
        raise InputError(name, f"edge features must be [E={num_edges}, D] (one row per edge), got shape "
                               f"{list(attr.shape)}")
    check_features(a, name)
    return a


def check_features(x: np.ndarray, name: str) -> None:
    """`x` is a numeric [N, dim] matrix with dim >= 1; errors name `name`."""
    if x.ndim != 2:
        raise InputError(name, f"features must be a 2-D [N, dim] array, got shape {list(x.shape)}")
    if x.shape[1] < 1:
        raise InputError(name, "features have dimension 0")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_):
        raise InputError(name, f"features must be numeric, got dtype {x.dtype}")
