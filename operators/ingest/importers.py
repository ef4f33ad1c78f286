"""Write the raw input format (docs/design.md, "Formats") from a PyG `Data`, numpy `.npy` files or
an OGB dataset.

The raw format is a directory of Arrow-partitioned shards, all named `part-NNNNN.*`::

    RAW/edges/part-*.parquet      src, dst: int64 (one row per directed edge)
    RAW/features/part-*.arrow     node_id: int64, x: fixed_size_list<float32|float16, dim>
                                  (Arrow IPC file format; `.parquet` with the same schema also valid)
    RAW/nodes/part-*.parquet      node_id: int64, label: int64 (-1 = unlabeled),
                                  split: dictionary<string> in {train, val, test, none}
    RAW/manifest.json             written last: {"format": "diskflow-raw", "num_nodes", ...}

Node ids are 0..N-1; every node has exactly one feature row and one nodes row. Each
importer streams its source in chunks (`chunk_bytes`), so memory stays bounded by a chunk
plus what the source itself already holds (a PyG `Data` in memory, N bytes of split codes),
and builds the whole directory under a staging name, manifest last: an interrupted import
leaves nothing that looks valid. The shard writers here are also what `synth` writes with.
"""
from __future__ import annotations

import gzip
import os
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from pyarrow import ipc

from ..formats.atomic import atomic_path, staging_dir
from ..formats.errors import ConfigError, InputError
from ..formats.hashing import fingerprint
from ..formats.manifest import write_manifest
from ..formats.npyio import load_npy
from ..formats.outputs import OutputKind, check_replaceable
from ..formats.store import SPLITS

RAW_FORMAT = "diskflow-raw"
RAW_VERSION = 1
RAW_KIND = OutputKind("a diskflow raw dataset", formats=(RAW_FORMAT,))
FEATURE_FORMATS = ("arrow", "parquet")
DEFAULT_CHUNK_BYTES = 64 << 20  # source bytes streamed (and written as one shard) at a time
_NONE = SPLITS.index("none")
_SPLIT_DICTIONARY = pa.array(SPLITS, pa.string())


# ---------------------------------------------------------------------------- shard writers

def shard_name(index: int, suffix: str) -> str:
    """The file name of shard `index`, e.g. `part-00007.parquet`."""
    return f"part-{index:05d}.{suffix}"


def write_edge_shard(path: str | os.PathLike[str], src: np.ndarray, dst: np.ndarray) -> int:
    """Atomically write one `edges/` shard (`src`, `dst` int64); returns the edge count."""
    table = pa.table({"src": pa.array(np.asarray(src, dtype=np.int64)),
                      "dst": pa.array(np.asarray(dst, dtype=np.int64))})
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

    def edges(self, src: np.ndarray, dst: np.ndarray) -> None:
        """Write one edges shard."""
        if len(src):
            self.num_edges += write_edge_shard(self._next("edges", "parquet"), src, dst)

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


def _rows_per_chunk(row_bytes: int, chunk_bytes: int) -> int:
    return max(1, chunk_bytes // max(1, row_bytes))


def _publish(out: str | os.PathLike[str], force: bool, source: dict[str, Any], feature_format: str,
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


def _split_from_indices(num_nodes: int, indices: Sequence[tuple[int, np.ndarray, str]]) -> np.ndarray:
    """Split codes [N] (uint8) from per-split node-id arrays; overlaps and bad ids are errors."""
    codes = np.full(num_nodes, _NONE, dtype=np.uint8)
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
        taken = codes[idx] != _NONE
        if taken.any():
            other = SPLITS[int(codes[idx[np.argmax(taken)]])]
            raise InputError(name, f"{int(taken.sum())} node(s) also in the {other} split "
                                   f"(e.g. node {int(idx[np.argmax(taken)])})")
        codes[idx] = code
    return codes


def _labels_as_int64(y: np.ndarray, name: str) -> np.ndarray:
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


def _check_edge_ids(src: np.ndarray, dst: np.ndarray, num_nodes: int, name: str) -> None:
    if not len(src):
        return
    lo = min(int(src.min()), int(dst.min()))
    hi = max(int(src.max()), int(dst.max()))
    if lo < 0 or hi >= num_nodes:
        raise InputError(name, f"edge endpoint out of range [0, {num_nodes}) (min {lo}, max {hi})")


def _check_features(x: np.ndarray, name: str) -> None:
    if x.ndim != 2:
        raise InputError(name, f"features must be a 2-D [N, dim] array, got shape {list(x.shape)}")
    if x.shape[1] < 1:
        raise InputError(name, "features have dimension 0")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_):
        raise InputError(name, f"features must be numeric, got dtype {x.dtype}")


# ---------------------------------------------------------------------------- PyG

def from_pyg(data: Any, out: str | os.PathLike[str], *, split_masks: bool = True, name: str = "Data",
             feature_format: str = "arrow", chunk_bytes: int = DEFAULT_CHUNK_BYTES,
             force: bool = False) -> Path:
    """Write a homogeneous `torch_geometric.data.Data` as a raw dataset.

    Uses `x` [N, dim] (float16 kept, anything else stored as float32), `edge_index` [2, E]
    (src = row 0, dst = row 1, written as given: add reverse edges yourself or let ingest
    symmetrise), `y` [N] (missing: all -1) and, when `split_masks`, `train_mask`/`val_mask`/
    `test_mask` (missing or unset: split `none`).

    Args:
        data: the graph.
        out: the raw dataset directory to create.
        split_masks: take splits from the masks; False marks every node `none`.
        name: how errors refer to the source (the CLI passes the file path).
        feature_format: `arrow` or `parquet` feature shards.
        chunk_bytes: rows (or edges) of about this many bytes go into each shard.
        force: replace `out` even when it is not a raw dataset.
    """
    x_t = getattr(data, "x", None)
    ei_t = getattr(data, "edge_index", None)
    if x_t is None:
        raise InputError(name, "Data has no node features `x` (the raw format needs one feature row per node)")
    if ei_t is None:
        raise InputError(name, "Data has no `edge_index`")
    x = x_t.detach().cpu().numpy() if hasattr(x_t, "detach") else np.asarray(x_t)
    _check_features(x, f"{name}: x")
    num_nodes = int(x.shape[0])
    ei = ei_t.detach().cpu().numpy() if hasattr(ei_t, "detach") else np.asarray(ei_t)
    if ei.ndim != 2 or ei.shape[0] != 2 or not np.issubdtype(ei.dtype, np.integer):
        raise InputError(f"{name}: edge_index", f"must be an integer [2, E] array, got {ei.dtype} {list(ei.shape)}")
    y_t = getattr(data, "y", None)
    if y_t is not None:
        y = _labels_as_int64(y_t.detach().cpu().numpy() if hasattr(y_t, "detach") else np.asarray(y_t), f"{name}: y")
        if len(y) != num_nodes:
            raise InputError(f"{name}: y", f"has {len(y)} labels for {num_nodes} nodes")
    else:
        y = np.full(num_nodes, -1, dtype=np.int64)
    codes = np.full(num_nodes, _NONE, dtype=np.uint8)
    if split_masks:
        masks = []
        for code, attr in enumerate(("train_mask", "val_mask", "test_mask")):
            m = getattr(data, attr, None)
            if m is None:
                continue
            m = m.detach().cpu().numpy() if hasattr(m, "detach") else np.asarray(m)
            if m.dtype != np.bool_ or m.shape != (num_nodes,):
                raise InputError(f"{name}: {attr}", f"must be a bool [N={num_nodes}] mask, got {m.dtype} {list(m.shape)}")
            masks.append((code, np.flatnonzero(m), f"{name}: {attr}"))
        codes = _split_from_indices(num_nodes, masks)

    def build(w: RawWriter) -> int:
        rows = _rows_per_chunk(x.shape[1] * x.dtype.itemsize, chunk_bytes)
        for lo in range(0, num_nodes, rows):
            w.features(x[lo: lo + rows])
        node_rows = _rows_per_chunk(16, chunk_bytes)
        for lo in range(0, num_nodes, node_rows):
            w.nodes(y[lo: lo + node_rows], codes[lo: lo + node_rows])
        edge_rows = _rows_per_chunk(16, chunk_bytes)
        for lo in range(0, ei.shape[1], edge_rows):
            src, dst = ei[0, lo: lo + edge_rows], ei[1, lo: lo + edge_rows]
            _check_edge_ids(src, dst, num_nodes, f"{name}: edge_index")
            w.edges(src, dst)
        return num_nodes

    return _publish(out, force, {"kind": "pyg", "path": name}, feature_format, build)


def load_pyg_file(path: str | os.PathLike[str]) -> Any:
    """Load a `Data` saved with `torch.save` (full unpickling: only load files you trust)."""
    import torch

    p = Path(path)
    if not p.is_file():
        raise InputError(p, "no such file")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises many kinds for a corrupt file
        raise InputError(p, f"cannot load with torch.load ({type(e).__name__}: {e})") from e
    if isinstance(obj, (tuple, list)) and obj and hasattr(obj[0], "edge_index"):
        obj = obj[0]  # a (data, slices) pair as InMemoryDataset saves it, or [data]
    if isinstance(obj, dict) and "x" in obj and "edge_index" in obj:
        from torch_geometric.data import Data
        obj = Data(**obj)
    if not hasattr(obj, "edge_index"):
        raise InputError(p, f"does not hold a torch_geometric Data (found {type(obj).__name__})")
    return obj


# ---------------------------------------------------------------------------- .npy files

def _load_npy(path: str | os.PathLike[str]) -> np.ndarray:
    p = Path(path)
    if not p.is_file():
        raise InputError(p, "no such file")
    try:
        return load_npy(p, "r")
    except (ValueError, OSError, EOFError) as e:
        raise InputError(p, f"not a readable .npy file ({e})") from e


def _npy_edges(edge_index: Any, src: Any, dst: Any) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    """(src view, dst view, {role: path}) from either one [2, E] file or two [E] files."""
    if (edge_index is None) == (src is None and dst is None):
        raise ConfigError("edge_index", "give either an edge_index file or both src and dst files")
    if edge_index is not None:
        arr = _load_npy(edge_index)
        if arr.ndim == 2 and arr.shape[0] == 2:
            s, d = arr[0], arr[1]
        elif arr.ndim == 2 and arr.shape[1] == 2:
            s, d = arr[:, 0], arr[:, 1]
        else:
            raise InputError(edge_index, f"edge index must have shape [2, E] or [E, 2], got {list(arr.shape)}")
        if not np.issubdtype(arr.dtype, np.integer):
            raise InputError(edge_index, f"edge index must be integers, got {arr.dtype}")
        return s, d, {"edge_index": os.fspath(edge_index)}
    if src is None or dst is None:
        raise ConfigError("src" if src is None else "dst", "both src and dst files are needed")
    s, d = _load_npy(src), _load_npy(dst)
    for arr, path in ((s, src), (d, dst)):
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise InputError(path, f"must be a 1-D integer array, got {arr.dtype} {list(arr.shape)}")
    if len(s) != len(d):
        raise InputError(dst, f"has {len(d)} entries but {src} has {len(s)}")
    return s, d, {"src": os.fspath(src), "dst": os.fspath(dst)}


def from_npy(out: str | os.PathLike[str], *, features: str | os.PathLike[str],
             edge_index: str | os.PathLike[str] | None = None, src: str | os.PathLike[str] | None = None,
             dst: str | os.PathLike[str] | None = None, labels: str | os.PathLike[str] | None = None,
             split: str | os.PathLike[str] | None = None, train_idx: str | os.PathLike[str] | None = None,
             val_idx: str | os.PathLike[str] | None = None, test_idx: str | os.PathLike[str] | None = None,
             feature_format: str = "arrow", chunk_bytes: int = DEFAULT_CHUNK_BYTES,
             force: bool = False) -> Path:
    """Write a raw dataset from `.npy` files, read memory-mapped chunk by chunk.

    Args:
        out: the raw dataset directory to create.
        features: [N, dim] numeric array (float16 kept, else stored as float32).
        edge_index: [2, E] (or [E, 2]) integer array; alternatively `src` and `dst`, [E] each.
        labels: [N] integer class ids (-1 = unlabeled; float NaN also means unlabeled).
        split: [N] split per node, either integer codes 0 train, 1 val, 2 test, 3 none or
            strings from {train, val, test, none}. Exclusive with the `*_idx` files.
        train_idx, val_idx, test_idx: 1-D node-id arrays; nodes in none of them get `none`.
        feature_format: `arrow` or `parquet` feature shards.
        chunk_bytes: rows (or edges) of about this many bytes go into each shard.
        force: replace `out` even when it is not a raw dataset.
    """
    x = _load_npy(features)
    _check_features(x, os.fspath(features))
    num_nodes = int(x.shape[0])
    s, d, edge_files = _npy_edges(edge_index, src, dst)
    if labels is not None:
        y = _load_npy(labels)
        if y.shape[0] != num_nodes:
            raise InputError(labels, f"has {y.shape[0]} labels but {features} has {num_nodes} rows")
    if split is not None and any(p is not None for p in (train_idx, val_idx, test_idx)):
        raise ConfigError("split", "give either split or train_idx/val_idx/test_idx, not both")
    if split is not None:
        codes = _split_codes(_load_npy(split), num_nodes, split)
    else:
        codes = _split_from_indices(num_nodes, [
            (code, np.asarray(_load_npy(p)), os.fspath(p))
            for code, p in enumerate((train_idx, val_idx, test_idx)) if p is not None])
    inputs = {role: fingerprint(p) for role, p in
              [("features", features), *((r, p) for r, p in edge_files.items()), ("labels", labels),
               ("split", split), ("train_idx", train_idx), ("val_idx", val_idx), ("test_idx", test_idx)]
              if p is not None}
    paths = {role: os.fspath(p) for role, p in
             [("features", features), ("labels", labels), ("split", split), ("train_idx", train_idx),
              ("val_idx", val_idx), ("test_idx", test_idx)] if p is not None}
    source = {"kind": "npy", **paths, **edge_files, "inputs": inputs}
    edge_name = edge_files.get("edge_index") or edge_files["src"]

    def build(w: RawWriter) -> int:
        rows = _rows_per_chunk(x.shape[1] * x.dtype.itemsize, chunk_bytes)
        for lo in range(0, num_nodes, rows):
            w.features(np.asarray(x[lo: lo + rows]))
        node_rows = _rows_per_chunk(16, chunk_bytes)
        for lo in range(0, num_nodes, node_rows):
            hi = min(lo + node_rows, num_nodes)
            yl = (_labels_as_int64(np.asarray(y[lo:hi]), os.fspath(labels)) if labels is not None
                  else np.full(hi - lo, -1, dtype=np.int64))
            w.nodes(yl, codes[lo:hi])
        edge_rows = _rows_per_chunk(16, chunk_bytes)
        for lo in range(0, len(s), edge_rows):
            cs, cd = np.asarray(s[lo: lo + edge_rows]), np.asarray(d[lo: lo + edge_rows])
            _check_edge_ids(cs, cd, num_nodes, edge_name)
            w.edges(cs, cd)
        return num_nodes

    return _publish(out, force, source, feature_format, build)


def _split_codes(arr: np.ndarray, num_nodes: int, name: str | os.PathLike[str]) -> np.ndarray:
    """Split codes from an [N] array of integer codes 0..3 or of split names."""
    if arr.ndim != 1 or arr.shape[0] != num_nodes:
        raise InputError(name, f"split must have shape [N={num_nodes}], got {list(arr.shape)}")
    if arr.dtype.kind in "US":
        names = np.asarray(arr).astype(str)
        lookup = np.array(SPLITS)
        order = np.argsort(lookup)
        pos = np.searchsorted(lookup[order], names)
        pos = np.minimum(pos, len(SPLITS) - 1)
        ok = lookup[order][pos] == names
        if not ok.all():
            raise InputError(name, f"unknown split name {str(names[np.argmin(ok)])!r} (use train, val, test, none)")
        return order[pos].astype(np.uint8)
    if not np.issubdtype(arr.dtype, np.integer):
        raise InputError(name, f"split must be integer codes (0 train, 1 val, 2 test, 3 none) or names, got {arr.dtype}")
    codes = np.asarray(arr)
    if codes.size and (int(codes.min()) < 0 or int(codes.max()) >= len(SPLITS)):
        raise InputError(name, f"split codes must be in 0..3 (0 train, 1 val, 2 test, 3 none), "
                               f"found {int(codes.min())}..{int(codes.max())}")
    return codes.astype(np.uint8)


# ---------------------------------------------------------------------------- OGB layout

def _count_file(path: Path) -> int:
    """The single count in OGB's num-node-list / num-edge-list files (one graph only)."""
    try:
        with gzip.open(path, "rt") as f:
            values = [int(float(line)) for line in f.read().split()]
    except (OSError, ValueError, EOFError) as e:
        raise InputError(path, f"unreadable count file ({e})") from e
    if len(values) != 1:
        raise InputError(path, f"expected one count (a node-property dataset has one graph), found {len(values)}")
    return values[0]


def _csv_batches(path: Path, columns: Sequence[str], dtype: pa.DataType,
                 chunk_bytes: int) -> Iterator[pa.RecordBatch]:
    """Stream a header-less csv(.gz) in record batches of about `chunk_bytes` of text."""
    if not path.is_file():
        raise InputError(path, "no such file")
    try:
        reader = pacsv.open_csv(
            str(path),
            read_options=pacsv.ReadOptions(column_names=list(columns), block_size=max(1 << 16, chunk_bytes)),
            convert_options=pacsv.ConvertOptions(column_types={c: dtype for c in columns}))
        yield from reader
    except (pa.ArrowInvalid, OSError, EOFError) as e:
        raise InputError(path, f"malformed CSV ({e})") from e


def _csv_width(path: Path) -> int:
    """Number of comma-separated values on the first line of a csv(.gz)."""
    if not path.is_file():
        raise InputError(path, "no such file")
    try:
        with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
            first = f.readline()
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise InputError(path, f"unreadable ({e})") from e
    if not first.strip():
        raise InputError(path, "empty file")
    return len(first.rstrip("\r\n").split(","))


def _read_id_csv(path: Path) -> np.ndarray:
    """All node ids of an OGB split file (one id per line)."""
    parts = [b.column(0).to_numpy() for b in _csv_batches(path, ["id"], pa.int64(), DEFAULT_CHUNK_BYTES)]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _find_split_dir(root: Path, split: str | None) -> Path | None:
    split_root = root / "split"
    if split is not None:
        d = split_root / split
        if not d.is_dir():
            raise InputError(d, "no such split folder")
        return d
    if not split_root.is_dir():
        return None
    dirs = sorted(p for p in split_root.iterdir() if p.is_dir())
    if len(dirs) > 1:
        raise InputError(split_root, f"several split folders ({', '.join(p.name for p in dirs)}); choose one with split")
    return dirs[0] if dirs else None


def _ogb_split_codes(root: Path, split: str | None, num_nodes: int) -> tuple[np.ndarray, Path | None]:
    d = _find_split_dir(root, split)
    if d is None:
        return np.full(num_nodes, _NONE, dtype=np.uint8), None
    found = []
    for code, stem in enumerate(("train", "valid", "test")):
        for suffix in (".csv.gz", ".csv"):
            p = d / f"{stem}{suffix}"
            if p.is_file():
                found.append((code, _read_id_csv(p), os.fspath(p)))
                break
    if not found:
        raise InputError(d, "no train/valid/test.csv.gz files in the split folder")
    return _split_from_indices(num_nodes, found), d


class _NpyStream:
    """Sequential reads of one array inside an .npz, chunk by chunk, without loading it whole.

    Works for stored and compressed members alike (zipfile decompresses as it reads).
    """

    def __init__(self, npz: Path, key: str) -> None:
        self.path = npz
        self.key = key
        try:
            self._zip = zipfile.ZipFile(npz)
        except (OSError, zipfile.BadZipFile) as e:
            raise InputError(npz, f"not a readable .npz file ({e})") from e
        member = f"{key}.npy"
        if member not in self._zip.namelist():
            self._zip.close()
            raise InputError(npz, f"has no array {key!r} (found {', '.join(n.removesuffix('.npy') for n in self._zip.namelist())})")
        self._member = member
        self.f = self._open()
        self.data_start = self.f.tell()

    def _open(self) -> IO[bytes]:
        f = self._zip.open(self._member)
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            else:
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
            raise InputError(self.path, f"array {self.key!r} is not a valid .npy ({e})") from e
        if dtype.hasobject:
            raise InputError(self.path, f"array {self.key!r} holds Python objects; not supported")
        self.shape, self.fortran, self.dtype = tuple(shape), bool(fortran), np.dtype(dtype)
        return f

    def reopen_at(self, item: int) -> IO[bytes]:
        """A second independent reader positioned `item` elements into the data."""
        f = self._open()
        _skip(f, item * self.dtype.itemsize, self.path)
        return f

    def read(self, count: int, f: IO[bytes] | None = None) -> np.ndarray:
        """The next `count` elements (flat) from `f` (default: the main reader)."""
        f = f or self.f
        nbytes = count * self.dtype.itemsize
        try:
            buf = f.read(nbytes)
        except (OSError, EOFError, zipfile.BadZipFile) as e:
            raise InputError(self.path, f"array {self.key!r}: corrupt data ({e})") from e
        if len(buf) != nbytes:
            raise InputError(self.path, f"array {self.key!r} is truncated")
        return np.frombuffer(buf, dtype=self.dtype)

    def read_small(self) -> np.ndarray:
        """The whole (small) array."""
        n = int(np.prod(self.shape, dtype=np.int64))
        return self.read(n).reshape(self.shape, order="F" if self.fortran else "C")

    def close(self) -> None:
        self._zip.close()


def _skip(f: IO[bytes], nbytes: int, path: Path) -> None:
    """Advance a (possibly compressed) zip member by `nbytes`, reading in bounded pieces."""
    step = 16 << 20
    while nbytes > 0:
        got = len(f.read(min(step, nbytes)))
        if got == 0:
            raise InputError(path, "array is truncated")
        nbytes -= got


def _ogb_npz_edges(stream: _NpyStream, num_edges: int, chunk_edges: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(src, dst) chunks of an npz `edge_index` [2, E] (C or Fortran order)."""
    if len(stream.shape) != 2 or stream.shape[0] != 2 or not np.issubdtype(stream.dtype, np.integer):
        raise InputError(stream.path, f"edge_index must be an integer [2, E] array, got {stream.dtype} {list(stream.shape)}")
    if stream.shape[1] != num_edges:
        raise InputError(stream.path, f"edge_index has {stream.shape[1]} edges but num_edges_list says {num_edges}")
    if stream.fortran:  # memory order [E, 2]: pairs interleaved
        for lo in range(0, num_edges, chunk_edges):
            pairs = stream.read(2 * min(chunk_edges, num_edges - lo)).reshape(-1, 2)
            yield pairs[:, 0], pairs[:, 1]
        return
    dst_f = stream.reopen_at(num_edges)
    for lo in range(0, num_edges, chunk_edges):
        n = min(chunk_edges, num_edges - lo)
        yield stream.read(n), stream.read(n, dst_f)


def from_ogb(root: str | os.PathLike[str], out: str | os.PathLike[str], *, split: str | None = None,
             feature_format: str = "arrow", chunk_bytes: int = DEFAULT_CHUNK_BYTES, force: bool = False) -> Path:
    """Write a raw dataset from an OGB node-property dataset in its on-disk layout.

    Reads `ROOT/raw/{edge,node-feat,node-label,num-node-list,num-edge-list}.csv.gz` (streamed
    with pyarrow's CSV reader) or, for the large datasets, `ROOT/raw/data.npz` (edge_index,
    node_feat, num_nodes_list, num_edges_list) with `ROOT/raw/node-label.npz` (node_label),
    streamed out of the zip. Splits come from `ROOT/split/NAME/{train,valid,test}.csv.gz`
    (the only folder there, or `split`). Edges are written as OGB stores them (one direction
    for undirected datasets such as ogbn-arxiv: let ingest symmetrise).

    Args:
        root: the dataset folder (the one holding `raw/` and `split/`).
        out: the raw dataset directory to create.
        split: name of the split folder when there are several.
        feature_format: `arrow` or `parquet` feature shards.
        chunk_bytes: about this much source data is read (and one shard written) at a time.
        force: replace `out` even when it is not a raw dataset.
    """
    root_p = Path(root)
    raw = root_p / "raw"
    if not raw.is_dir():
        raise InputError(root_p, "not an OGB dataset folder (no raw/ inside)")
    if (raw / "data.npz").is_file():
        return _from_ogb_npz(root_p, out, split, feature_format, chunk_bytes, force)
    return _from_ogb_csv(root_p, out, split, feature_format, chunk_bytes, force)


def _ogb_source(root: Path, files: Iterable[Path], split_dir: Path | None, layout: str) -> dict[str, Any]:
    inputs = {os.fspath(p.relative_to(root)): fingerprint(p) for p in files if p.is_file()}
    if split_dir is not None:
        inputs.update({os.fspath(p.relative_to(root)): fingerprint(p) for p in sorted(split_dir.iterdir()) if p.is_file()})
    return {"kind": "ogb", "layout": layout, "path": os.fspath(root), "inputs": inputs}


def _from_ogb_csv(root: Path, out: str | os.PathLike[str], split: str | None, feature_format: str,
                  chunk_bytes: int, force: bool) -> Path:
    raw = root / "raw"
    num_nodes = _count_file(raw / "num-node-list.csv.gz")
    num_edges = _count_file(raw / "num-edge-list.csv.gz")
    edge_f, feat_f, label_f = raw / "edge.csv.gz", raw / "node-feat.csv.gz", raw / "node-label.csv.gz"
    dim = _csv_width(feat_f)
    codes, split_dir = _ogb_split_codes(root, split, num_nodes)
    source = _ogb_source(root, [raw / "num-node-list.csv.gz", raw / "num-edge-list.csv.gz", edge_f, feat_f, label_f],
                         split_dir, "csv")
    source.update(features=os.fspath(feat_f), labels=os.fspath(label_f))

    def build(w: RawWriter) -> int:
        cols = [f"f{i}" for i in range(dim)]
        for batch in _csv_batches(feat_f, cols, pa.float32(), chunk_bytes):
            if w.feature_rows + batch.num_rows > num_nodes:
                raise InputError(feat_f, f"more than {num_nodes} rows (num-node-list.csv.gz says {num_nodes} nodes)")
            w.features(np.stack([c.to_numpy(zero_copy_only=False) for c in batch.columns], axis=1))
        if label_f.is_file():
            for batch in _csv_batches(label_f, ["y"], pa.float64(), chunk_bytes):
                lo = w.node_rows
                if lo + batch.num_rows > num_nodes:
                    raise InputError(label_f, f"more than {num_nodes} rows (num-node-list.csv.gz says {num_nodes} nodes)")
                w.nodes(_labels_as_int64(batch.column(0).to_numpy(zero_copy_only=False), os.fspath(label_f)),
                        codes[lo: lo + batch.num_rows])
        else:
            _write_unlabeled(w, codes, chunk_bytes)
        for batch in _csv_batches(edge_f, ["src", "dst"], pa.int64(), chunk_bytes):
            s, d = batch.column(0).to_numpy(), batch.column(1).to_numpy()
            _check_edge_ids(s, d, num_nodes, os.fspath(edge_f))
            w.edges(s, d)
        if w.num_edges != num_edges:
            raise InputError(edge_f, f"has {w.num_edges} edges but num-edge-list.csv.gz says {num_edges}")
        return num_nodes

    return _publish(out, force, source, feature_format, build)


def _write_unlabeled(w: RawWriter, codes: np.ndarray, chunk_bytes: int) -> None:
    rows = _rows_per_chunk(16, chunk_bytes)
    for lo in range(0, len(codes), rows):
        c = codes[lo: lo + rows]
        w.nodes(np.full(len(c), -1, dtype=np.int64), c)


def _from_ogb_npz(root: Path, out: str | os.PathLike[str], split: str | None, feature_format: str,
                  chunk_bytes: int, force: bool) -> Path:
    raw = root / "raw"
    data_f, label_f = raw / "data.npz", raw / "node-label.npz"
    counts = {k: _NpyStream(data_f, k) for k in ("num_nodes_list", "num_edges_list")}
    try:
        nn, ne = (counts[k].read_small().reshape(-1) for k in ("num_nodes_list", "num_edges_list"))
    finally:
        for c in counts.values():
            c.close()
    if len(nn) != 1 or len(ne) != 1:
        raise InputError(data_f, f"num_nodes_list has {len(nn)} graphs; a node-property dataset has one")
    num_nodes, num_edges = int(nn[0]), int(ne[0])
    codes, split_dir = _ogb_split_codes(root, split, num_nodes)
    source = _ogb_source(root, [data_f, label_f], split_dir, "npz")
    source.update(features=os.fspath(data_f), labels=os.fspath(label_f))

    def build(w: RawWriter) -> int:
        feat = _NpyStream(data_f, "node_feat")
        try:
            if len(feat.shape) != 2 or feat.shape[0] != num_nodes:
                raise InputError(data_f, f"node_feat must be [N={num_nodes}, dim], got {list(feat.shape)}")
            if feat.fortran:
                raise InputError(data_f, "node_feat is stored in Fortran order; re-save it C-contiguous")
            _check_features(np.empty((0, feat.shape[1]), feat.dtype), f"{data_f}: node_feat")
            dim = feat.shape[1]
            rows = _rows_per_chunk(dim * feat.dtype.itemsize, chunk_bytes)
            for lo in range(0, num_nodes, rows):
                n = min(rows, num_nodes - lo)
                w.features(feat.read(n * dim).reshape(n, dim))
        finally:
            feat.close()
        if label_f.is_file():
            lab = _NpyStream(label_f, "node_label")
            try:
                if lab.shape[0] != num_nodes or int(np.prod(lab.shape)) != num_nodes:
                    raise InputError(label_f, f"node_label must be [N={num_nodes}] or [N, 1], got {list(lab.shape)}")
                rows = _rows_per_chunk(lab.dtype.itemsize, chunk_bytes)
                for lo in range(0, num_nodes, rows):
                    n = min(rows, num_nodes - lo)
                    w.nodes(_labels_as_int64(lab.read(n), os.fspath(label_f)), codes[lo: lo + n])
            finally:
                lab.close()
        else:
            _write_unlabeled(w, codes, chunk_bytes)
        edges = _NpyStream(data_f, "edge_index")
        try:
            chunk_edges = _rows_per_chunk(2 * edges.dtype.itemsize, chunk_bytes)
            for s, d in _ogb_npz_edges(edges, num_edges, chunk_edges):
                _check_edge_ids(s, d, num_nodes, f"{data_f}: edge_index")
                w.edges(s, d)
        finally:
            edges.close()
        return num_nodes

    return _publish(out, force, source, feature_format, build)
