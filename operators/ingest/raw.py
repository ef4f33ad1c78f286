"""Ingest, the shared part: find a raw dataset's files, read them as Arrow, size the work.

A raw dataset (docs/design.md, "Formats") is a directory with ``edges/``, ``features/`` and
``nodes/``, each holding Arrow-partitioned shards (Parquet, or Arrow IPC in the file
or the stream format). The stage-specific operators live next to this module:
`ingest_nodes` (labels and splits), `ingest_edges` (CSC by destination, bucketed
through spill files) and `ingest_features` (row-range feature shards). Everything
here reads files in bounded record batches, so no operator needs a whole file in
memory, and every read error becomes an `InputError` naming the file.
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import ipc

from ...errors import ConfigError, InputError
from ..formats.atomic import tmp_name
from ..formats.manifest import MANIFEST, write_manifest
from ..formats.npyio import npy_bytes
from ..formats.sizes import format_bytes, parse_bytes
from ..formats.store import SPLITS, STORE_FORMAT, STORE_VERSION
from ..formats.storecheck import Piece, add_pieces
from .remote import RemotePath, is_url, list_files, raw_source

__all__ = ["EDGE_CSC_BYTES", "EDGE_CSC_ORDINAL_BYTES", "EDGE_SCAN_BYTES", "FINE_BUCKETS_PER_TASK", "IPC_SUFFIXES", "MAX_CSC_EDGES",
           "MAX_FINE_BUCKETS", "MAX_SHARD_BYTES", "MIN_FINE_BUCKETS", "MIN_MEMORY_BUDGET", "PARQUET_SUFFIXES",
           "RAW_DIRS", "SPILL_DIR", "TABLE_SUFFIXES", "RawFiles", "TableUnit", "check_id_range",
           "check_memory_budget", "csc_edge_cap", "edge_chunk_rows", "feature_batch_rows", "find_raw_files",
           "fine_bucket_width", "finish_store", "group_buckets", "int_column", "iter_file_batches",
           "iter_unit_batches", "iter_units_batches", "require_columns", "save_npy_in_place",
           "shard_rows_for", "store_manifest", "table_num_rows", "table_schema", "table_units",
           "write_raw_dataset"]

RAW_DIRS = ("edges", "features", "nodes")
PARQUET_SUFFIXES = (".parquet", ".pq")
IPC_SUFFIXES = (".arrow", ".ipc", ".feather")
TABLE_SUFFIXES = PARQUET_SUFFIXES + IPC_SUFFIXES

# Working-set estimates, in bytes, that turn the memory budget into task sizes.
EDGE_SCAN_BYTES = 64      # per edge in a scan chunk: src, dst, key, bucket id, sort order, sorted key
EDGE_CSC_BYTES = 16       # per edge in a CSC task: the 8-byte sort key plus the sort's and writes' slack
EDGE_CSC_ORDINAL_BYTES = 48  # ... when ordinals (and tags) ride along: key, ordinal, tag, the lexsort's order
FINE_BUCKETS_PER_TASK = 64  # spill buckets per CSC task, so CSC tasks can be regrouped around skew
MIN_FINE_BUCKETS = 1024
MAX_FINE_BUCKETS = 1 << 16  # bucket ids stay 16-bit (a radix sort in the scans)
MAX_CSC_EDGES = 1 << 22    # 32 MiB of sort keys: bigger CSC tasks only serialise the sorting
MAX_SHARD_BYTES = 64 << 20  # bigger shards buy no sequential-read speed, only fewer parallel tasks
MIN_MEMORY_BUDGET = 4096
SPILL_DIR = "_spill"


# ----------------------------------------------------------------------------- discovery

@dataclass(frozen=True)
class RawFiles:
    """The table files of a raw dataset, sorted by path within each part."""

    root: Path | RemotePath        # a URL's files are `RemotePath`s (`remote`)
    edges: tuple[Any, ...]
    features: tuple[Any, ...]
    nodes: tuple[Any, ...]

    def all(self) -> list[Any]:
        """Every input file, edges then features then nodes."""
        return [*self.edges, *self.features, *self.nodes]

    def relative(self, path: Any) -> str:
        """`path` relative to the dataset root, with forward slashes (manifest keys)."""
        return path.relative_to(self.root).as_posix()

    @property
    def remote(self) -> bool:
        """Whether the files are read from a URL (`remote`), not a local directory."""
        return isinstance(self.root, RemotePath)


def _skipped(parts: Sequence[str]) -> bool:
    return any(s.startswith((".", "_")) for s in parts)


def _find_remote(raw: str, storage_options: dict[str, Any] | None) -> RawFiles:
    root = raw_source(raw, storage_options)
    listed = list_files(root)
    if any(p.rel == (root / "hetero.json").rel for p in listed):
        raise InputError(root / "hetero.json", "a typed raw dataset is ingested from a local directory only (for now): "
                                               "copy it to local disk first")
    parts: dict[str, tuple[RemotePath, ...]] = {}
    for name in RAW_DIRS:
        d = root / name
        below = [p for p in listed if p.rel.startswith(d.rel + "/")]
        if not below:
            raise InputError(d, f"missing directory: a raw dataset needs {', '.join(p + '/' for p in RAW_DIRS)}")
        files = [p for p in below if p.suffix.lower() in TABLE_SUFFIXES and not _skipped(p.relative_to(d).parts)]
        if not files:
            raise InputError(d, f"empty dataset: no table files ({', '.join('*' + s for s in TABLE_SUFFIXES)})")
        parts[name] = tuple(files)
    return RawFiles(root, parts["edges"], parts["features"], parts["nodes"])


def find_raw_files(raw: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> RawFiles:
    """List a raw dataset's edge, feature and node files: in a directory, or at a URL (``s3://``,
    ``gs://``, ``hdfs://``, any fsspec scheme: `remote`, with `storage_options`).

    Files whose name (or a parent folder's name) starts with ``.`` or ``_`` are
    skipped, as Arrow/Spark/Hive writers use them for metadata and markers.

    Raises:
        InputError: the directory or one of its parts is missing, or a part holds no table files; for a
            URL also a missing bucket, missing credentials or an endpoint that does not answer.
        ConfigError: `storage_options` given for a local path.
    """
    if is_url(raw):
        return _find_remote(str(raw), storage_options)
    if storage_options:
        raise ConfigError("storage_options", f"apply to a URL (s3://, gs://, hdfs://, ...), not the path {raw}")
    root = Path(raw).absolute()
    if not root.is_dir():
        raise InputError(root, "no such directory (expected a raw dataset with edges/, features/, nodes/)")
    parts: dict[str, tuple[Path, ...]] = {}
    for name in RAW_DIRS:
        d = root / name
        if not d.is_dir():
            raise InputError(d, f"missing directory: a raw dataset needs {', '.join(p + '/' for p in RAW_DIRS)}")
        files = sorted(
            p for p in d.rglob("*")
            if p.suffix.lower() in TABLE_SUFFIXES and p.is_file()
            and not any(s.startswith((".", "_")) for s in p.relative_to(d).parts)
        )
        if not files:
            raise InputError(d, f"empty dataset: no table files ({', '.join('*' + s for s in TABLE_SUFFIXES)})")
        parts[name] = tuple(files)
    return RawFiles(root, parts["edges"], parts["features"], parts["nodes"])


# ----------------------------------------------------------------------------- reading

def _is_parquet(path: Path) -> bool:
    return path.suffix.lower() in PARQUET_SUFFIXES


def _parquet(path: Path) -> Any:
    """What `pq` opens: a local path as it is, a `RemotePath` as its open file (read on this process)."""
    return path.open() if isinstance(path, RemotePath) else path


def _unreadable(path: Path, e: BaseException) -> InputError:
    kind = "Parquet" if _is_parquet(path) else "Arrow IPC"
    return InputError(path, f"unreadable {kind} file ({type(e).__name__}: {e})")


def _open_ipc(path: Path) -> ipc.RecordBatchFileReader | ipc.RecordBatchStreamReader:
    """An IPC reader over a memory map: the file format if the file has its footer, else the stream format."""
    source = path.open() if isinstance(path, RemotePath) else pa.memory_map(str(path))
    try:
        return ipc.open_file(source)
    except pa.ArrowInvalid:
        source.seek(0)
        return ipc.open_stream(source)


def table_schema(path: Path) -> pa.Schema:
    """The Arrow schema of one table file (Parquet footer or IPC header only)."""
    try:
        if _is_parquet(path):
            return pq.read_schema(_parquet(path))
        return _open_ipc(path).schema
    except (pa.ArrowException, OSError) as e:
        raise _unreadable(path, e) from e


def table_num_rows(path: Path) -> int:
    """Row count of one table file: the Parquet footer, or the IPC batches' headers (memory-mapped)."""
    try:
        if _is_parquet(path):
            with pq.ParquetFile(_parquet(path)) as pf:
                return int(pf.metadata.num_rows)
        reader = _open_ipc(path)
        if isinstance(reader, ipc.RecordBatchFileReader):
            return int(reader.count_rows())
        return sum(b.num_rows for b in reader)
    except (pa.ArrowException, OSError) as e:
        raise _unreadable(path, e) from e


@dataclass(frozen=True)
class TableUnit:
    """A piece of a table file readable on its own: a Parquet row group, an IPC-file record
    batch, or a whole IPC stream (which has no random access)."""

    path: Path
    kind: str  # "row_group" | "batch" | "stream"
    index: int
    row_start: int  # first row of the unit within its file
    rows: int


def table_units(path: Path) -> list[TableUnit]:
    """The independently readable units of a table file, in file order."""
    try:
        if _is_parquet(path):
            with pq.ParquetFile(_parquet(path)) as pf:
                sizes = [pf.metadata.row_group(i).num_rows for i in range(pf.metadata.num_row_groups)]
            kind = "row_group"
        else:
            reader = _open_ipc(path)
            if isinstance(reader, ipc.RecordBatchFileReader):
                sizes = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
                kind = "batch"
            else:
                sizes = [sum(b.num_rows for b in reader)]
                kind = "stream"
    except (pa.ArrowException, OSError) as e:
        raise _unreadable(path, e) from e
    starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])
    return [TableUnit(path, kind, i, int(starts[i]), int(n)) for i, n in enumerate(sizes)]


def _slices(batch: pa.RecordBatch, row0: int, batch_rows: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    for off in range(0, batch.num_rows, batch_rows):
        yield row0 + off, batch.slice(off, batch_rows)


def _runs(units: Sequence[TableUnit]) -> Iterator[list[TableUnit]]:
    """Group units into runs of consecutive units of one file (each run opens its file once)."""
    run: list[TableUnit] = []
    for u in units:
        if run and (u.path != run[-1].path or u.kind != run[-1].kind or u.index != run[-1].index + 1):
            yield run
            run = []
        run.append(u)
    if run:
        yield run


def _raw_run_batches(run: list[TableUnit], columns: list[str], batch_rows: int
                     ) -> Iterator[tuple[TableUnit, int, pa.RecordBatch]]:
    path, kind = run[0].path, run[0].kind
    if kind == "row_group":
        with pq.ParquetFile(_parquet(path)) as pf:
            for u in run:
                row = u.row_start
                for b in pf.iter_batches(batch_size=batch_rows, row_groups=[u.index], columns=columns):
                    yield u, row, b
                    row += b.num_rows
        return
    reader = _open_ipc(path)
    if kind == "batch":
        if not isinstance(reader, ipc.RecordBatchFileReader):
            raise InputError(path, "its record batches were listed from an Arrow IPC file, but it now holds an IPC "
                                   "stream (the file changed while it was being read)")
        for u in run:
            for row, b in _slices(reader.get_batch(u.index).select(columns), u.row_start, batch_rows):
                yield u, row, b
        return
    row = 0
    for b in reader:
        for r, piece in _slices(b.select(columns), row, batch_rows):
            yield run[0], r, piece
        row += b.num_rows


def iter_units_batches(units: Sequence[TableUnit], columns: Sequence[str], batch_rows: int
                       ) -> Iterator[tuple[TableUnit, int, pa.RecordBatch]]:
    """Yield (unit, first row within the file, record batch of at most `batch_rows` rows) over `units`.

    Consecutive units of one file are read with a single open (a Parquet footer is parsed
    once per run, not once per row group).

    Raises:
        InputError: a file cannot be decoded (corrupt, truncated), naming it.
    """
    for run in _runs(units):
        it = _raw_run_batches(run, list(columns), max(1, batch_rows))
        while True:
            try:
                item = next(it)
            except StopIteration:
                break
            except (pa.ArrowException, OSError) as e:
                raise _unreadable(run[0].path, e) from e
            yield item


def iter_unit_batches(unit: TableUnit, columns: Sequence[str], batch_rows: int
                      ) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Yield (first row within the file, record batch of at most `batch_rows` rows) of one unit."""
    for _, row, batch in iter_units_batches([unit], columns, batch_rows):
        yield row, batch


def iter_file_batches(path: Path, columns: Sequence[str], batch_rows: int
                      ) -> Iterator[tuple[int, pa.RecordBatch]]:
    """Yield (first row within the file, record batch) over a whole file, `batch_rows` rows at most each."""
    for _, row, batch in iter_units_batches(table_units(path), columns, batch_rows):
        yield row, batch


def require_columns(schema: pa.Schema, names: Sequence[str], path: Path) -> None:
    """Raise an InputError naming the file when one of `names` is not a column of `schema`."""
    missing = [n for n in names if schema.get_field_index(n) < 0]
    if missing:
        raise InputError(path, f"schema mismatch: missing column {missing[0]!r} (has {', '.join(schema.names) or 'none'})")


def int_column(batch: pa.RecordBatch, name: str, path: Path, row0: int) -> np.ndarray:
    """One integer column of a batch as int64 numpy (zero-copy when already int64).

    Raises:
        InputError: the column is not of an integer type, or holds nulls (names the row).
    """
    col = batch.column(name)
    if not pa.types.is_integer(col.type):
        raise InputError(path, f"column {name!r} has type {col.type}, expected int64")
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(path, f"column {name!r} is null at row {row0 + row}")
    return np.asarray(col.to_numpy(), dtype=np.int64)


def check_id_range(ids: np.ndarray, num_nodes: int, path: Path, row0: int, what: str,
                   node_type: str | None = None) -> None:
    """Raise an InputError naming the file, row and id when an id is negative or >= num_nodes (`node_type`:
    the ids are local ids of that node type of a typed dataset, which the message names)."""
    bad = (ids < 0) | (ids >= num_nodes)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        held = f"the nodes files hold {num_nodes} rows" if node_type is None \
            else f"node type {node_type!r} has {num_nodes} nodes in hetero.json"
        kind = "node ids" if node_type is None else f"{node_type} ids"
        raise InputError(path, f"{what} {int(ids[i])} at row {row0 + i} is out of range: {kind} must be "
                               f"0..{num_nodes - 1} ({held})")


# ----------------------------------------------------------------------------- sizing

def check_memory_budget(value: str | int) -> int:
    """The memory budget in bytes; a ConfigError when it is not a size or absurdly small."""
    budget = parse_bytes(value, "memory_budget")
    if budget < MIN_MEMORY_BUDGET:
        raise ConfigError("memory_budget", f"must be at least {format_bytes(MIN_MEMORY_BUDGET)}, got {value!r}")
    return budget


def shard_rows_for(budget: int, row_bytes: int, num_nodes: int) -> int:
    """Rows per feature shard: a shard plus its validation stamps must fit half a task's budget
    (the other half reads input batches), and no shard exceeds MAX_SHARD_BYTES."""
    per_row = row_bytes + 8
    rows = min(budget // 2 // per_row, MAX_SHARD_BYTES // row_bytes)
    return int(max(1, min(rows, num_nodes)))


def feature_batch_rows(budget: int, row_bytes: int) -> int:
    """Input rows per record batch in a feature task (a quarter of the budget, twice for the copies)."""
    return int(max(1, budget // 4 // (2 * row_bytes)))


def edge_chunk_rows(budget: int, extra_bytes: int = 0) -> int:
    """Edges per scan chunk (one bucket sort and one spill write each); `extra_bytes` per edge ride along
    (edge features, ordinals, tags)."""
    return int(max(1, budget // (EDGE_SCAN_BYTES + extra_bytes)))


def csc_edge_cap(budget: int, per_edge: int = EDGE_CSC_BYTES) -> int:
    """Edges per CSC task: what its budget holds at `per_edge` bytes an edge, and at most MAX_CSC_EDGES
    so that the sorting spreads over the workers."""
    return int(max(1, min(budget // per_edge, MAX_CSC_EDGES)))


def fine_bucket_width(num_nodes: int, est_edges: int, budget: int) -> int:
    """Destination-range width of a spill bucket.

    Buckets are much finer than CSC tasks (at least FINE_BUCKETS_PER_TASK per task and
    MIN_FINE_BUCKETS in all) so that, once the scans have counted every bucket, CSC
    tasks can be formed from runs of buckets that fit the budget even when in-degrees
    are skewed. Fine buckets are cheap: a task still reads one contiguous run per spill
    chunk, and the scans only keep a per-chunk offset table.
    """
    tasks = max(1, math.ceil(est_edges / csc_edge_cap(budget)))
    buckets = int(min(num_nodes, max(tasks * FINE_BUCKETS_PER_TASK, MIN_FINE_BUCKETS), MAX_FINE_BUCKETS))
    width = math.ceil(num_nodes / max(1, buckets))
    return 1 << (width - 1).bit_length()  # a power of two: the scans bucket with a shift


def group_buckets(counts: np.ndarray, cap: int) -> list[tuple[int, int]]:
    """Split buckets [0, len(counts)) into contiguous runs of at most `cap` edges each (greedy).

    A single bucket larger than `cap` gets a run of its own (its task then exceeds the budget:
    one destination's in-edges cannot be split).
    """
    groups: list[tuple[int, int]] = []
    start, total = 0, 0
    for b, c in enumerate(counts.tolist()):  # one step per bucket, not per edge
        if b > start and total + c > cap:
            groups.append((start, b))
            start, total = b, 0
        total += c
    groups.append((start, len(counts)))
    return groups


# ----------------------------------------------------------------------------- writing into the stage

def save_npy_in_place(path: str | os.PathLike[str], array: np.ndarray, pieces: list[Piece] | None = None) -> None:
    """Write a plain .npy under a temporary sibling name, fsync, rename; with `pieces`, append the crc32
    pieces of the bytes written (as the store file named by the file's name: `storecheck.add_pieces`).

    Unlike `npyio.save_npy` this never creates the parent directory: a task that outlives
    a failed run must not resurrect the staging directory the run has just removed.
    """
    final = Path(path)
    tmp = tmp_name(final)
    try:
        with open(tmp, "xb") as f:
            if pieces is None:
                np.save(f, np.ascontiguousarray(array))
            else:
                data = npy_bytes(array)
                add_pieces(pieces, final.name, 0, data)
                f.write(data.data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ----------------------------------------------------------------------------- manifest

def store_manifest(*, num_nodes: int, num_edges: int, indices_dtype: str, nodes: dict[str, Any],
                   features: dict[str, Any], inputs: dict[str, str], config: dict[str, Any],
                   edge_features: dict[str, Any] | None = None, link: dict[str, Any] | None = None
                   ) -> dict[str, Any]:
    """The store manifest (keys documented in `operators.formats.store`); `edge_features` and `link`
    only where the store has them."""
    extra = {**({"edge_features": edge_features} if edge_features is not None else {}),
             **({"link": link} if link is not None else {})}
    return {
        "format": STORE_FORMAT,
        "version": STORE_VERSION,
        "num_nodes": int(num_nodes),
        "num_edges": int(num_edges),
        "num_classes": int(nodes["num_classes"]),
        "topology": {"indptr": "indptr.npy", "indices": "indices.npy", "indices_dtype": indices_dtype},
        "features": features,
        "labels": "labels.npy",
        "splits": "splits.npy",
        "split_counts": {k: int(nodes["split_counts"][k]) for k in SPLITS},
        **extra,
        "inputs": inputs,
        "config": config,
    }


def finish_store(stage: str | os.PathLike[str], manifest: dict[str, Any]) -> str:
    """Remove the spill directory, then write the manifest: from now on `stage` is a valid store."""
    import shutil

    stage_p = Path(stage)
    shutil.rmtree(stage_p / SPILL_DIR, ignore_errors=True)
    write_manifest(stage_p, manifest)
    return str(stage_p / MANIFEST)


# ----------------------------------------------------------------------------- writing raw data

def write_raw_dataset(out: str | os.PathLike[str], *, src: np.ndarray, dst: np.ndarray, features: np.ndarray,
                      labels: np.ndarray, splits: Sequence[str] | np.ndarray, edge_parts: int = 1,
                      feature_parts: int = 1, node_parts: int = 1, feature_format: str = "parquet",
                      row_group_rows: int | None = None, edge_attr: np.ndarray | None = None,
                      edge_split: Sequence[str] | np.ndarray | None = None) -> Path:
    """Write in-memory arrays as a raw dataset (docs/design.md, "Formats"): the inverse of ingest.

    Rows are split into contiguous parts, one file each, in node/edge order. Meant for
    tests, benchmarks and small imports; large datasets are written by `synth` part by part.

    Args:
        out: directory to create (parts are written into edges/, features/, nodes/).
        src, dst: int64 [E] edge endpoints.
        features: [N, dim] float32 or float16; row v is node v's features.
        labels: int64 [N] (-1 = unlabeled).
        splits: [N] strings in {train, val, test, none}.
        feature_format: "parquet", "arrow" (IPC file) or "stream" (IPC stream).
        row_group_rows: Parquet row group / IPC batch size (default: one per file).
        edge_attr: [E, D] float32 or float16 edge features (the ``edge_attr`` column).
        edge_split: [E] link split strings in {train, val, test} (the edges' ``split`` column).
    """
    root = Path(out)
    n = features.shape[0]
    dim = features.shape[1]
    ftype = pa.list_(pa.from_numpy_dtype(features.dtype), dim)

    def parts(count: int, k: int) -> list[tuple[int, int]]:
        b = np.linspace(0, count, max(1, k) + 1).astype(np.int64)
        return list(zip(b[:-1].tolist(), b[1:].tolist()))

    def write(table: pa.Table, path: Path, fmt: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "parquet":
            pq.write_table(table, path, row_group_size=row_group_rows)
        elif fmt in ("arrow", "stream"):
            opener = ipc.new_file if fmt == "arrow" else ipc.new_stream
            with pa.OSFile(str(path), "wb") as sink, opener(sink, table.schema) as w:
                w.write_table(table, max_chunksize=row_group_rows)
        else:
            raise ConfigError("feature_format", f"unknown format {fmt!r} (parquet, arrow, stream)")

    for i, (a, b) in enumerate(parts(len(src), edge_parts)):
        cols: dict[str, Any] = {"src": np.asarray(src[a:b], np.int64), "dst": np.asarray(dst[a:b], np.int64)}
        if edge_attr is not None:
            ea = np.ascontiguousarray(edge_attr[a:b])
            cols["edge_attr"] = pa.FixedSizeListArray.from_arrays(pa.array(ea.reshape(-1)), ea.shape[1])
        if edge_split is not None:
            cols["split"] = pa.array(np.asarray(edge_split)[a:b].astype(str)).dictionary_encode()
        write(pa.table(cols), root / "edges" / f"part-{i:05d}.parquet", "parquet")
    suffix = "parquet" if feature_format == "parquet" else "arrow"
    for i, (a, b) in enumerate(parts(n, feature_parts)):
        x = pa.FixedSizeListArray.from_arrays(pa.array(np.ascontiguousarray(features[a:b]).reshape(-1)), type=ftype)
        write(pa.table({"node_id": np.arange(a, b, dtype=np.int64), "x": x}),
              root / "features" / f"part-{i:05d}.{suffix}", feature_format)
    split_arr = np.asarray(splits)
    for i, (a, b) in enumerate(parts(n, node_parts)):
        write(pa.table({"node_id": np.arange(a, b, dtype=np.int64), "label": np.asarray(labels[a:b], np.int64),
                        "split": pa.array(split_arr[a:b].astype(str)).dictionary_encode()}),
              root / "nodes" / f"part-{i:05d}.parquet", "parquet")
    return root
