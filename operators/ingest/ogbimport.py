"""Import an OGB node-property dataset in its on-disk layout as a raw dataset (`rawwriter`): the csv.gz
files streamed with pyarrow's CSV reader, or the large datasets' ``data.npz`` streamed out of the zip,
about `chunk_bytes` at a time."""
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

from ...errors import InputError
from ..formats.hashing import fingerprint
from .rawwriter import (
    DEFAULT_CHUNK_BYTES,
    NO_SPLIT,
    RawWriter,
    check_edge_ids,
    check_features,
    labels_as_int64,
    publish_raw,
    rows_per_chunk,
    split_from_indices,
)

__all__ = ["from_ogb"]


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
        return np.full(num_nodes, NO_SPLIT, dtype=np.uint8), None
    found = []
    for code, stem in enumerate(("train", "valid", "test")):
        for suffix in (".csv.gz", ".csv"):
            p = d / f"{stem}{suffix}"
            if p.is_file():
                found.append((code, _read_id_csv(p), os.fspath(p)))
                break
    if not found:
        raise InputError(d, "no train/valid/test.csv.gz files in the split folder")
    return split_from_indices(num_nodes, found), d


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
                w.nodes(labels_as_int64(batch.column(0).to_numpy(zero_copy_only=False), os.fspath(label_f)),
                        codes[lo: lo + batch.num_rows])
        else:
            _write_unlabeled(w, codes, chunk_bytes)
        for batch in _csv_batches(edge_f, ["src", "dst"], pa.int64(), chunk_bytes):
            s, d = batch.column(0).to_numpy(), batch.column(1).to_numpy()
            check_edge_ids(s, d, num_nodes, os.fspath(edge_f))
            w.edges(s, d)
        if w.num_edges != num_edges:
            raise InputError(edge_f, f"has {w.num_edges} edges but num-edge-list.csv.gz says {num_edges}")
        return num_nodes

    return publish_raw(out, force, source, feature_format, build)


def _write_unlabeled(w: RawWriter, codes: np.ndarray, chunk_bytes: int) -> None:
    rows = rows_per_chunk(16, chunk_bytes)
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
            check_features(np.empty((0, feat.shape[1]), feat.dtype), f"{data_f}: node_feat")
            dim = feat.shape[1]
            rows = rows_per_chunk(dim * feat.dtype.itemsize, chunk_bytes)
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
                rows = rows_per_chunk(lab.dtype.itemsize, chunk_bytes)
                for lo in range(0, num_nodes, rows):
                    n = min(rows, num_nodes - lo)
                    w.nodes(labels_as_int64(lab.read(n), os.fspath(label_f)), codes[lo: lo + n])
            finally:
                lab.close()
        else:
            _write_unlabeled(w, codes, chunk_bytes)
        edges = _NpyStream(data_f, "edge_index")
        try:
            chunk_edges = rows_per_chunk(2 * edges.dtype.itemsize, chunk_bytes)
            for s, d in _ogb_npz_edges(edges, num_edges, chunk_edges):
                check_edge_ids(s, d, num_nodes, f"{data_f}: edge_index")
                w.edges(s, d)
        finally:
            edges.close()
        return num_nodes

    return publish_raw(out, force, source, feature_format, build)
