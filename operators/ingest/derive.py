"""Derived features of a typed store: a featureless node type's rows as the mean of a neighbour type's rows.

MAG240M's reference baselines give each author the mean of its papers' features, and each institution
the mean of its authors' (chained). The typed ingest writes the feature table with the derived types'
rows reserved as zeros (docs/design.md, "Typed graphs"); these operators fill them in place, out of
core, one row range of the derived type per task (`derive_rows`), graphed by `flow.derive`.

A rule reads a CSC grouped by the derived type (``indptr`` int64 [count + 1], ``indices`` the neighbour
type's local ids, memory-mapped ``.npy`` files) and the neighbour's rows of the feature table (global row
= the neighbour's offset + local id) through the shard memmaps, vectorised per shard, a chunk of edges
at a time. Sums accumulate in float64 (`np.add.reduceat` over each chunk's runs of one destination) and
the means are cast to the table's dtype; a node without neighbours gets a zero row. Only the first
``dim`` columns (the neighbour type's width) are written; the table's padding past them stays zero.
The rows go into the shard files at their byte offsets with ``os.pwrite``: tasks write disjoint row
ranges, so no two tasks write the same bytes.

Memory: a task holds its rows' accumulators and output (`DeriveJob.costs`: bytes per row) and one chunk
of edges with their gathered rows (bytes per edge); `task_ranges` cuts the rows so that each half of a
task's share holds one of them. The bound excludes the memmaps' page cache, which the kernel owns.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ...errors import ConfigError, DiskFullError, InputError, is_disk_full
from ..formats.hetero import EdgeType, HeteroLayout
from ..formats.npyio import load_npy
from ..formats.store import FeatureShard, RowTable, map_shard

__all__ = ["CHUNKS_PER_TASK", "REDUCTIONS", "DeriveJob", "DeriveRuleLike", "derive_jobs", "derive_rows",
           "rewritten_files", "task_ranges"]

REDUCTIONS = ("mean",)      # the reductions a rule may ask for
CHUNKS_PER_TASK = 16        # edge chunks a task reads at most, beyond one node's own edges (balances skewed degrees)
_ROW_EXTRA = 64             # bytes per row for the task's small per-row arrays (indptr, degrees, masks, run starts)
_EDGE_EXTRA = 64            # bytes per edge: its int64 id, shard, sort order and local row, and a sort's scratch


class DeriveRuleLike(Protocol):
    """What a derivation rule says (the ingest's `DeriveRule` is one): `type`'s rows are the `reduce` of its
    `neighbour`s' rows over the CSC (`indptr`, `indices`: store-relative paths) grouped by `type`."""

    @property
    def type(self) -> str: ...
    @property
    def neighbour(self) -> str: ...
    @property
    def indptr(self) -> str: ...
    @property
    def indices(self) -> str: ...
    @property
    def edge_type(self) -> EdgeType | Sequence[str]: ...
    @property
    def reduce(self) -> str: ...


@dataclass(frozen=True)
class DeriveJob:
    """One rule resolved against the store: what its tasks read and where they write (plain values, cheap
    to pickle).

    Attributes:
        store: the store directory, absolute.
        features: the manifest's ``features`` entry (the row table the rows are read from and written to).
        type, offset, count: the derived node type and its global ids [offset, offset + count).
        neighbour, neighbour_offset, neighbour_count: the type whose rows are averaged, likewise.
        dim: the neighbour type's width: the table columns read and written.
        indptr, indices: the CSC grouped by `type`, store-relative.
        after: the derived type whose rows this rule reads (its rule must finish first), or None.
    """

    store: str
    features: dict[str, Any] = field(repr=False)
    type: str
    offset: int
    count: int
    neighbour: str
    neighbour_offset: int
    neighbour_count: int
    dim: int
    indptr: str
    indices: str
    after: str | None = None

    @property
    def table(self) -> RowTable:
        return RowTable(Path(self.store), self.features, None, "features")

    def costs(self, index_itemsize: int | None = None) -> tuple[int, int]:
        """(bytes per row, bytes per edge) a task holds at its peak: per row the float64 sums, a chunk's
        run sums and their masked copy, and the output row in the table's dtype; per edge its gathered
        row, a gather's temporary copy, a float64 row should reduceat upcast at once, and the edge's ids."""
        itemsize = np.dtype(self.features["dtype"]).itemsize
        row_bytes = int(self.features["row_bytes"])
        if index_itemsize is None:
            index_itemsize = 8
        per_row = 3 * self.dim * 8 + row_bytes + _ROW_EXTRA
        per_edge = 2 * self.dim * itemsize + self.dim * 8 + index_itemsize + _EDGE_EXTRA
        return per_row, per_edge

    def min_share(self) -> int:
        """The smallest task share that holds one row and one edge (each half of it)."""
        return 2 * max(self.costs())

    def load(self, name: str) -> np.ndarray:
        """The CSC array `name` (``indptr`` or ``indices``), memory-mapped; an InputError naming it if unreadable."""
        path = Path(self.store) / getattr(self, name)
        try:
            arr = load_npy(path, "r")
        except (OSError, ValueError) as e:
            raise InputError(path, f"unreadable {name} of the rule deriving {self.type!r} ({e})") from e
        if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise InputError(path, f"{name} must be a 1-d integer array, got {arr.dtype} {arr.shape}")
        return arr


def _rule_name(rule: DeriveRuleLike) -> str:
    return f"rules[{getattr(rule, 'type', '?')!r}]"


def derive_jobs(store_dir: str | os.PathLike[str], manifest: dict[str, Any], rules: Sequence[DeriveRuleLike]
                ) -> list[DeriveJob]:
    """The rules resolved against the store's manifest (not yet on disk), in an order where a rule comes
    after the rule deriving its neighbour type (`DeriveJob.after`).

    Raises:
        ConfigError: a rule with another reduction, a type derived twice, or rules that derive each other.
        InputError: a type or CSC that does not fit the manifest (naming the file and the fault).
    """
    root = Path(store_dir).absolute()
    where = str(root / "manifest.json")
    if manifest.get("hetero") is None:
        raise InputError(where, "derived features need a typed store (a manifest with a 'hetero' entry)")
    layout = HeteroLayout(manifest["hetero"], where)
    features = manifest["features"]
    table = RowTable(root, features, None)
    jobs: dict[str, DeriveJob] = {}
    for rule in rules:
        name = _rule_name(rule)
        if rule.reduce not in REDUCTIONS:
            raise ConfigError(name, f"reduce is {rule.reduce!r}; only {', '.join(map(repr, REDUCTIONS))} is known")
        if rule.type in jobs:
            raise ConfigError(name, f"node type {rule.type!r} is derived by two rules")
        derived = layout.node_types[layout.node_index(rule.type, name)]
        nb = layout.node_types[layout.node_index(rule.neighbour, name)]
        if not nb.has_features:
            raise InputError(where, f"{name}: neighbour type {nb.name!r} has no feature rows to average")
        if not derived.has_features or derived.dim != nb.dim:
            raise InputError(where, f"{name}: node type {derived.name!r} must have rows reserved in the feature "
                                    f"table {nb.dim} wide (its neighbour's width), has dim {derived.dim}")
        if nb.dim > table.dim:
            raise InputError(where, f"{name}: neighbour width {nb.dim} exceeds the feature table's {table.dim}")
        for t in (derived, nb):
            if t.stop > table.num_rows:
                raise InputError(where, f"{name}: node type {t.name!r} has rows up to {t.stop}, past the feature "
                                        f"table's {table.num_rows}")
        job = DeriveJob(str(root), features, derived.name, derived.offset, derived.count, nb.name, nb.offset,
                        nb.count, nb.dim, str(rule.indptr), str(rule.indices))
        indptr, indices = job.load("indptr"), job.load("indices")
        if indptr.shape[0] != derived.count + 1:
            raise InputError(root / job.indptr, f"has {indptr.shape[0]} entries, expected {derived.count + 1} "
                                                f"(node type {derived.name!r} has {derived.count} nodes)")
        if int(indptr[0]) != 0 or int(indptr[-1]) != indices.shape[0]:
            raise InputError(root / job.indptr, f"runs from {int(indptr[0])} to {int(indptr[-1])}, expected 0 to "
                                                f"{indices.shape[0]} (the edges of {job.indices})")
        jobs[rule.type] = job
    ordered: list[DeriveJob] = []
    placed: set[str] = set()
    pending = list(jobs.values())
    while pending:                                  # a loop per rule: dependencies first
        ready = [j for j in pending if j.neighbour not in jobs or j.neighbour in placed]
        if not ready:
            raise ConfigError("rules", "the rules derive each other in a cycle: "
                                       + ", ".join(f"{j.type} from {j.neighbour}" for j in pending))
        for j in ready:
            ordered.append(replace(j, after=j.neighbour if j.neighbour in jobs else None))
            placed.add(j.type)
        pending = [j for j in pending if j.type not in placed]
    return ordered


def task_ranges(job: DeriveJob, share: int) -> list[tuple[int, int]]:
    """The derived type's local row ranges [lo, hi), one per task, for tasks of `share` bytes each: at most
    as many rows as half the share holds (`DeriveJob.costs`), and at most `CHUNKS_PER_TASK` edge chunks
    each unless one node's own edges are more (`derive_rows` chunks those).

    Raises:
        ConfigError: `share` cannot hold one row and one edge.
    """
    if share < job.min_share():
        raise ConfigError("memory_budget", f"leaves {share} bytes per derive task; deriving {job.type!r} "
                                           f"({job.dim} wide) needs at least {job.min_share()}")
    if job.count == 0:
        return []
    indptr = job.load("indptr")
    per_row, per_edge = job.costs(job.load("indices").dtype.itemsize)
    rows = max(1, share // 2 // per_row)
    edge_cap = max(1, share // 2 // per_edge) * CHUNKS_PER_TASK
    num_edges = int(indptr[-1])
    by_edges = np.searchsorted(indptr, np.arange(edge_cap, num_edges, edge_cap, dtype=np.int64), side="left")
    cuts = np.unique(np.concatenate([np.arange(0, job.count, rows, dtype=np.int64), by_edges, [job.count]]))
    cuts = cuts[(cuts >= 0) & (cuts <= job.count)]
    return list(zip(cuts[:-1].tolist(), cuts[1:].tolist()))


def _gather(table: RowTable, views: dict[int, np.ndarray], rows: np.ndarray, dim: int) -> np.ndarray:
    """table[rows, :dim] (`rows` global, int64, range-checked) through the shard memmaps, vectorised per shard;
    `views` caches the task's shard maps."""
    def view(p: int) -> np.ndarray:
        if p not in views:
            views[p] = map_shard(table.shards[p], table.dtype, table.dim)[:, :dim]
        return views[p]

    # (fancy indexing, not np.take: take copies a strided source, the whole shard, to a contiguous one)
    first, last = int(rows.min()) // table.shard_rows, int(rows.max()) // table.shard_rows
    if first == last:                               # the usual case: one shard, no sort
        return view(first)[rows - table.shards[first].row_start]
    out = np.empty((rows.shape[0], dim), dtype=table.dtype)
    shard = rows // table.shard_rows
    order = np.argsort(shard, kind="stable")
    bounds = np.searchsorted(shard, np.arange(first, last + 2), sorter=order)
    del shard
    for p in np.flatnonzero(np.diff(bounds)).tolist():     # a loop per shard
        pos = order[bounds[p]:bounds[p + 1]]
        local = rows[pos]
        local -= table.shards[first + p].row_start
        out[pos] = view(first + p)[local]
    return out


def _pwrite_rows(shard: FeatureShard, row_bytes: int, first: int, rows: np.ndarray) -> None:
    """Write `rows` (whole table rows) at global row `first` of `shard`, in place."""
    data = np.ascontiguousarray(rows).reshape(-1).view(np.uint8).data
    at = shard.offset + (first - shard.row_start) * row_bytes
    try:
        fd = os.open(shard.path, os.O_WRONLY)
    except OSError as e:
        raise InputError(shard.path, f"cannot open feature shard to write derived rows ({e.strerror or e})") from e
    try:
        done = 0
        while done < len(data):
            wrote = os.pwrite(fd, data[done:], at + done)
            if wrote <= 0:
                raise InputError(shard.path, f"short write of derived rows at byte {at + done}")
            done += wrote
        os.fsync(fd)
    except OSError as e:
        if is_disk_full(e):
            raise DiskFullError(shard.path) from e
        raise InputError(shard.path, f"cannot write derived rows at byte {at} ({e.strerror or e})") from e
    finally:
        os.close(fd)


def derive_rows(job: DeriveJob, lo: int, hi: int, share: int) -> int:
    """Derive rows [lo, hi) (local ids) of `job`'s type and write them into the feature table in place.

    Each row is the mean of its neighbours' first `dim` columns, summed in float64, cast to the table's
    dtype; a node without neighbours gets a zero row. Edges are read `share // 2 // bytes per edge` at a
    time (`DeriveJob.costs`), so the task holds at most about `share` bytes beside the page cache.

    Returns:
        The edges read.

    Raises:
        InputError: an indptr that decreases, or a neighbour id outside the neighbour type (naming the file).
    """
    table = job.table
    indptr, indices = job.load("indptr"), job.load("indices")
    ptr = np.asarray(indptr[lo:hi + 1], dtype=np.int64)
    deg = np.diff(ptr)
    if (deg < 0).any():
        bad = lo + int(np.flatnonzero(deg < 0)[0])
        raise InputError(Path(job.store) / job.indptr, f"decreases at node {bad} (a CSC's indptr never does)")
    e0, e1 = int(ptr[0]), int(ptr[-1])
    chunk = max(1, share // 2 // job.costs(indices.dtype.itemsize)[1])
    acc = np.zeros((hi - lo, job.dim), dtype=np.float64)
    views: dict[int, np.ndarray] = {}
    for a in range(e0, e1, chunk):                  # a loop per chunk of edges
        b = min(a + chunk, e1)
        ids = np.asarray(indices[a:b], dtype=np.int64)
        low, high = int(ids.min()), int(ids.max())
        if low < 0 or high >= job.neighbour_count:
            raise InputError(Path(job.store) / job.indices,
                             f"neighbour id {low if low < 0 else high} among edges {a}..{b - 1} is outside node type "
                             f"{job.neighbour!r} (0..{job.neighbour_count - 1})")
        ids += job.neighbour_offset
        rows = _gather(table, views, ids, job.dim)
        del ids
        # the task's rows whose edges meet [a, b), each one run of `rows`
        r0 = int(np.searchsorted(ptr, a, side="right")) - 1
        r1 = int(np.searchsorted(ptr[:-1], b, side="left"))
        starts = np.clip(ptr[r0:r1] - a, 0, None)
        ends = np.minimum(ptr[r0 + 1:r1 + 1] - a, b - a)
        runs = ends > starts
        sums = np.add.reduceat(rows, starts[runs], axis=0, dtype=np.float64)
        del rows
        acc[r0:r1][runs] += sums
        del sums
    acc /= np.maximum(deg, 1)[:, None]
    out_row = job.offset + lo
    for s in table.shards[out_row // table.shard_rows:(job.offset + hi - 1) // table.shard_rows + 1]:
        s0, s1 = max(out_row, s.row_start), min(job.offset + hi, s.row_stop)    # a loop per shard written
        buf = np.zeros((s1 - s0, table.dim), dtype=table.dtype)
        buf[:, :job.dim] = acc[s0 - out_row:s1 - out_row]
        _pwrite_rows(s, table.row_bytes, s0, buf)
        del buf
    return e1 - e0


def rewritten_files(jobs: Sequence[DeriveJob]) -> list[str]:
    """The feature shards (store-relative paths) that hold derived rows: their bytes change after their
    writer reported its checksum pieces, so the manifest's checksums of these must be taken by reading
    them once derivation is done (`storecheck.record_checksums` reads a file no writer reported)."""
    out: list[str] = []
    for job in jobs:
        for s in job.features["shards"]:
            start, rows = int(s["row_start"]), int(s["rows"])
            if start < job.offset + job.count and job.offset < start + rows and s["path"] not in out:
                out.append(str(s["path"]))
    return out
