"""Ingest of node features into row-range shards.

Two steps:

1. `scan_features`, once per feature file: checks the schema (``node_id`` integer,
   ``x`` fixed_size_list<float32|float16, dim>), validates ids against N, and records
   the node-id range of every independently readable unit (Parquet row group, IPC
   record batch) by reading the ``node_id`` column only.
2. `write_feature_shard`, once per output shard [lo, hi): reads just the units whose
   id range overlaps it, scatters their rows into the shard buffer, and checks that
   every row of the range arrived exactly once and is finite. The shard is an .npy
   with its data at byte 4096 (see `operators.formats.npyio.create_aligned_npy`).

Duplicate detection is vectorised with a per-slot stamp: the running number of the
input row that filled the slot. A slot already stamped is a repeat from an earlier
batch; a slot whose stamp is not the row just written is a repeat within the batch.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import InputError
from ...native.constants import ALIGN
from ..formats.atomic import tmp_name
from ..formats.npyio import aligned_npy_header, create_aligned_npy, load_npy
from ..formats.storecheck import Piece, add_pieces
from .raw import (
    TableUnit,
    check_id_range,
    int_column,
    iter_units_batches,
    require_columns,
    table_schema,
    table_units,
)
from .remote import raw_path

__all__ = ["FEATURE_COLUMNS", "FEATURE_DTYPES", "FeatureFile", "FeatureUnit", "check_same_schema",
           "feature_type", "fixed_rows", "read_feature_rows", "scan_features", "units_overlapping", "vector_type", "write_aligned",
           "write_edge_feature_shard", "write_feature_shard"]

FEATURE_COLUMNS = ("node_id", "x")
FEATURE_DTYPES: dict[pa.DataType, np.dtype] = {pa.float32(): np.dtype(np.float32), pa.float16(): np.dtype(np.float16)}


@dataclass(frozen=True)
class FeatureUnit:
    """A readable unit of a feature file and the node-id range it holds."""

    unit: TableUnit
    min_id: int
    max_id: int


@dataclass(frozen=True)
class FeatureFile:
    """What a scan learned about one feature file."""

    path: str
    dtype: str       # numpy name: "float32" or "float16"
    dim: int
    units: tuple[FeatureUnit, ...]  # non-empty units only
    rows: int

    @property
    def arrow_type(self) -> str:
        """The canonical Arrow type of ``x`` (e.g. ``fixed_size_list<item: float>[47]``)."""
        return str(pa.list_(pa.from_numpy_dtype(np.dtype(self.dtype)), self.dim))


def vector_type(t: pa.DataType, column: str, path: Path, owner: str = "node", width: str = "dim",
                what: str = "features") -> tuple[np.dtype, int]:
    """(dtype, width) of a column of feature vectors (`t`: its type); InputError naming `column` unless it is
    fixed_size_list<float32|float16, width> with width >= 1 (one fixed-length vector per `owner`). Node and
    edge features are held to the same rule."""
    if not pa.types.is_fixed_size_list(t):
        raise InputError(path, f"column {column!r} has type {t}, expected fixed_size_list<float32|float16, {width}> "
                               f"(one fixed-length vector per {owner})")
    if t.value_type not in FEATURE_DTYPES:
        raise InputError(path, f"column {column!r} has item type {t.value_type}, expected float32 or float16 "
                               f"(cast the {what} before ingest)")
    if t.list_size < 1:
        raise InputError(path, f"column {column!r} has {width} {t.list_size}, expected at least 1")
    return FEATURE_DTYPES[t.value_type], int(t.list_size)


def feature_type(schema: pa.Schema, path: Path) -> tuple[np.dtype, int]:
    """(dtype, dim) of the ``x`` column; InputError unless it is fixed_size_list<float32|float16, dim>."""
    require_columns(schema, FEATURE_COLUMNS, path)
    dtype, dim = vector_type(schema.field("x").type, "x", path)
    if not pa.types.is_integer(schema.field("node_id").type):
        raise InputError(path, f"column 'node_id' has type {schema.field('node_id').type}, expected int64")
    return dtype, dim


def scan_features(path: str | os.PathLike[str], num_nodes: int, batch_rows: int = 1 << 20,
                  node_type: str | None = None) -> FeatureFile:
    """Check one feature file's schema and ids; record each unit's node-id range (`node_type`: the file holds
    local ids of this type of a typed dataset, named in errors).

    Raises:
        InputError: naming the file, for a missing column, a wrong ``x`` type, a null or
        out-of-range node id (with its row), or an unreadable file.
    """
    p = raw_path(path)
    dtype, dim = feature_type(table_schema(p), p)
    all_units = table_units(p)
    lo = np.full(len(all_units), np.iinfo(np.int64).max)
    hi = np.full(len(all_units), -1)
    for unit, row0, batch in iter_units_batches(all_units, ("node_id",), batch_rows):
        ids = int_column(batch, "node_id", p, row0)
        check_id_range(ids, num_nodes, p, row0, "node_id", node_type)
        if len(ids):
            lo[unit.index] = min(lo[unit.index], int(ids.min()))
            hi[unit.index] = max(hi[unit.index], int(ids.max()))
    units = [FeatureUnit(u, int(lo[u.index]), int(hi[u.index])) for u in all_units if hi[u.index] >= 0]
    return FeatureFile(str(p), dtype.name, dim, tuple(units), sum(u.unit.rows for u in units))


def check_same_schema(files: Sequence[FeatureFile]) -> tuple[np.dtype, int]:
    """The common (dtype, dim) of all feature files; InputError naming the first file that differs."""
    first = files[0]
    for f in files[1:]:
        if (f.dtype, f.dim) != (first.dtype, first.dim):
            raise InputError(f.path, f"schema mismatch between feature shards: x is {f.arrow_type} here "
                                     f"but {first.arrow_type} in {first.path}")
    return np.dtype(first.dtype), first.dim


def units_overlapping(files: Sequence[FeatureFile], lo: int, hi: int) -> list[TableUnit]:
    """The units that may hold rows of node ids [lo, hi)."""
    return [u.unit for f in files for u in f.units if u.max_id >= lo and u.min_id < hi]


def fixed_rows(batch: pa.RecordBatch, name: str, dim: int, path: Path, row0: int, what: str = "feature"
               ) -> np.ndarray:
    """A fixed_size_list column of a batch as an (rows, dim) numpy view; InputError naming the row on nulls."""
    col = batch.column(name)
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise InputError(path, f"{what} row {row0 + row} is null")
    flat = col.flatten()
    if flat.null_count:
        row = int(np.flatnonzero(flat.is_null().to_numpy(zero_copy_only=False))[0]) // dim
        raise InputError(path, f"{what} row {row0 + row} holds a null value")
    return flat.to_numpy().reshape(-1, dim)


def _features(batch: pa.RecordBatch, dim: int, path: Path, row0: int) -> np.ndarray:
    """The ``x`` column of a batch as an (rows, dim) numpy view; InputError on nulls."""
    return fixed_rows(batch, "x", dim, path, row0)


def _is_run(ids: np.ndarray) -> bool:
    """Whether `ids` are consecutive ascending integers (checked without a Python loop)."""
    return int(ids[-1]) - int(ids[0]) == len(ids) - 1 and bool((np.diff(ids) == 1).all())


def write_feature_shard(units: Sequence[TableUnit], out_path: str | os.PathLike[str], *, lo: int, hi: int,
                        dtype: np.dtype | str, dim: int, features_dir: str | os.PathLike[str],
                        allow_nonfinite: bool = False, batch_rows: int = 1 << 16,
                        pieces: list[Piece] | None = None, crc_name: str = "") -> dict[str, Any]:
    """Write the feature shard of node ids [lo, hi) from the input units that overlap it.

    Args:
        units: input units whose id range overlaps [lo, hi) (from `units_overlapping`).
        out_path: the shard file (written under a temporary name, then renamed).
        lo, hi: the shard's node-id range.
        dtype, dim: the common feature type (`check_same_schema`).
        features_dir: the input features directory, named by a "missing rows" error.
        allow_nonfinite: accept NaN and inf values.
        batch_rows: input rows decoded at a time.
        pieces: where given, the crc32 pieces of the bytes written are appended to it, as the store file
            `crc_name` (`storecheck.add_pieces`).

    Returns:
        The manifest entry of the shard (path relative to the store is filled by the caller).

    Raises:
        InputError: naming the file and an example node id, for a repeated node row, a
        missing one, a null, or a NaN/inf value.
    """
    buf = np.empty((hi - lo, dim), np.dtype(dtype))
    read_feature_rows(units, buf, lo=lo, hi=hi, dim=dim, features_dir=features_dir,
                      allow_nonfinite=allow_nonfinite, batch_rows=batch_rows)
    write_aligned(Path(out_path), buf, pieces, crc_name)
    return {"row_start": int(lo), "rows": int(hi - lo), "offset": ALIGN, "nbytes": int(buf.nbytes)}


def read_feature_rows(units: Sequence[TableUnit], buf: np.ndarray, *, lo: int, hi: int, dim: int,
                      features_dir: str | os.PathLike[str], allow_nonfinite: bool = False,
                      batch_rows: int = 1 << 16) -> None:
    """Scatter the rows of node ids [lo, hi) from the input units that overlap it into `buf` [hi - lo, dim],
    checking that every row arrives exactly once and is finite. `buf` may be a view of a wider array of
    another dtype (a typed store's feature table: a node type's columns of it), assigned with numpy's cast.

    Raises:
        InputError: as `write_feature_shard`'s.
    """
    rows = hi - lo
    stamp = np.full(rows, -1, np.int64)  # running number of the input row that filled each slot
    batch_starts: list[int] = []          # running number of each batch's first row ...
    batch_paths: list[Path] = []          # ... and its file, to name the earlier file of a repeat
    seen = 0
    for unit, row0, batch in iter_units_batches(units, FEATURE_COLUMNS, batch_rows):
        path = unit.path
        ids = int_column(batch, "node_id", path, row0)
        x = _features(batch, dim, path, row0)
        if not len(ids):
            continue
        if _is_run(ids):  # ascending consecutive ids (the usual layout): slices, no gathers
            a, b = max(lo - int(ids[0]), 0), min(hi - int(ids[0]), len(ids))
            if b <= a:
                continue
            pos: np.ndarray = np.arange(a, b)
            ids, x = ids[a:b], x[a:b]
            slot: slice | np.ndarray = slice(int(ids[0]) - lo, int(ids[0]) - lo + len(ids))
        else:
            pos = np.flatnonzero((ids >= lo) & (ids < hi))
            if not len(pos):
                continue
            if len(pos) < len(ids):
                ids, x = ids[pos], x[pos]
            slot = ids - lo
        if not allow_nonfinite and not np.isfinite(x).all():
            i = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
            raise InputError(path, f"non-finite feature value (NaN or inf) for node {int(ids[i])} at row "
                                   f"{row0 + int(pos[i])} (pass allow_nonfinite=True to accept it)")
        number = seen + np.arange(len(ids), dtype=np.int64)
        earlier = stamp[slot]
        if (earlier >= 0).any():
            i = int(np.flatnonzero(earlier >= 0)[0])
            first = batch_paths[int(np.searchsorted(batch_starts, earlier[i], side="right")) - 1]
            where = "an earlier row of this file" if first == path else f"a row of {first}"
            raise InputError(path, f"duplicate feature row for node {int(ids[i])} at row {row0 + int(pos[i])} "
                                   f"({where} already gave it)")
        stamp[slot] = number
        clash = stamp[slot] != number if isinstance(slot, np.ndarray) else np.zeros(0, bool)
        if clash.any():
            i = int(np.flatnonzero(clash)[0])
            rows_of = row0 + pos[ids == ids[i]][:2]
            raise InputError(path, f"duplicate feature row for node {int(ids[i])} at rows "
                                   f"{int(rows_of[0])} and {int(rows_of[1])}")
        buf[slot] = x
        batch_starts.append(seen)
        batch_paths.append(path)
        seen += len(ids)
    missing = stamp < 0
    if missing.any():
        v = lo + int(np.flatnonzero(missing)[0])
        raise InputError(features_dir, f"no feature row for node {v} ({int(missing.sum())} of nodes {lo}..{hi - 1} "
                                       "missing; every node needs exactly one row)")


def write_edge_feature_shard(order_path: str | os.PathLike[str], attr_path: str | os.PathLike[str],
                             out_path: str | os.PathLike[str], *, lo: int, hi: int,
                             pieces: list[Piece] | None = None, crc_name: str = "") -> dict[str, Any]:
    """Write the edge feature shard of CSC positions [lo, hi): the raw-order edge features (an aligned
    [raw edges, dim] .npy) gathered by the ordinals ``order[lo:hi]`` (an aligned int64 .npy), read in
    ascending raw order so that the gather sweeps the raw array once. `pieces`, `crc_name`: as
    `write_feature_shard`'s.

    Returns:
        The manifest entry of the shard (path filled by the caller).
    """
    order = load_npy(order_path, "r")[lo:hi]
    attrs = load_npy(attr_path, "r")
    sort = np.argsort(order, kind="stable")
    buf = np.empty((hi - lo, attrs.shape[1]), attrs.dtype)
    buf[sort] = attrs[np.asarray(order)[sort]]
    write_aligned(Path(out_path), buf, pieces, crc_name)
    return {"row_start": int(lo), "rows": int(hi - lo), "offset": ALIGN, "nbytes": int(buf.nbytes)}


def write_aligned(path: Path, array: np.ndarray, pieces: list[Piece] | None = None, crc_name: str = "") -> None:
    """Write `array` as an aligned .npy under a temporary name, fsync, rename; with `pieces`, the crc32 of
    every piece written is appended to it as it is written, as the store file `crc_name`.

    Unlike `atomic.atomic_path` this never creates the parent directory, so a task that
    outlives a failed run cannot resurrect its deleted staging directory.
    """
    tmp = tmp_name(path)
    create_aligned_npy(tmp, array.dtype, array.shape)
    add_pieces(pieces, crc_name, 0, np.frombuffer(aligned_npy_header(array.dtype, array.shape), np.uint8))
    try:
        fd = os.open(tmp, os.O_WRONLY)
        try:
            view = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
            done = 0
            while done < len(view):
                chunk = view[done:done + (64 << 20)]
                add_pieces(pieces, crc_name, ALIGN + done, np.frombuffer(chunk, np.uint8))
                wrote = os.pwrite(fd, chunk, ALIGN + done)
                if wrote != len(chunk):
                    raise InputError(path, f"short write at byte {ALIGN + done}")
                done += wrote
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
