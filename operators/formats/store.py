"""Read access to an ingested store (the output of `ingest`).

Layout (docs/design.md, "Formats")::

    STORE/manifest.json         written last; describes everything below
    STORE/indptr.npy            int64 [N+1], CSC by destination
    STORE/indices.npy           int32 (int64 when N >= 2**31) [E], source of each in-edge
    STORE/features/part-PPPPP.npy   row-range shard p: rows [p*R, min((p+1)*R, N)),
                                    row-major, data at byte 4096 (an .npy with a padded header)
    STORE/labels.npy            int64 [N] (-1 = unlabeled)
    STORE/splits.npy            uint8 [N] (0 train, 1 val, 2 test, 3 none)
    STORE/edge_features/part-PPPPP.npy  (optional) row-range shards of edge features in CSC edge
                                    order: row i is the edge at position i of ``indices``
    STORE/link/{train,val,test}.npy     (optional) int64 [2, P]: the supervision edges of a link split
    STORE/link/{val,test}_neg.npy       (optional) int64 [P, K]: fixed negative destinations per positive

Manifest keys: ``format`` ("diskflow-store"), ``version``, ``num_nodes``, ``num_edges``,
``num_classes``, ``topology`` {``indptr``, ``indices``, ``indices_dtype``},
``features`` {``dtype``, ``dim``, ``row_bytes``, ``shard_rows``, ``arrow_type``,
``shards``: [{``path``, ``row_start``, ``rows``, ``offset``, ``nbytes``}]},
``labels``, ``splits``, ``split_counts``, ``inputs`` (fingerprints), ``config``; optionally
``edge_features`` (the keys of ``features``), ``hetero`` (a typed store: `hetero.HeteroLayout`; then
``topology`` is null and each edge type has its own CSC, `Store.relation`) and ``link`` {``source`` ("column" | "random"),
``val``, ``test`` (the random split's shares, else null), ``disjoint_train_ratio``, ``seed``,
``negatives``, ``counts`` {split: P}, ``undirected``, ``files``}. With a link split the
topology holds only the message-passing edges: no validation or test edge, nor (undirected)
its reverse, nor the training edges held out for supervision. And ``checksums``: a crc32 per MiB
block of every file (`storecheck`; absent from a store written before them). Every read through a
`Store` checks the blocks it reads, once per process, unless checks are off (``check_crc=False``).
"""
from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError
from .hetero import HeteroLayout
from .manifest import read_manifest
from .npyio import load_npy
from .outputs import OutputKind
from .storecheck import CHECKSUMS, StoreChecks

__all__ = ["LINK_ARRAYS", "SPLITS", "SPLIT_CODE", "STORE_FORMAT", "STORE_KIND", "STORE_VERSION", "TABLE_OF",
           "FeatureShard", "RowTable", "Store", "edge_table_manifest", "map_shard", "open_table", "table_locator"]

_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)   # Linux 5.14+; older kernels refuse it

STORE_FORMAT = "diskflow-store"
STORE_KIND = OutputKind("a diskflow store", formats=(STORE_FORMAT,))   # what `ingest` may replace
STORE_VERSION = 1
SPLITS = ("train", "val", "test", "none")
SPLIT_CODE = {name: i for i, name in enumerate(SPLITS)}
LINK_ARRAYS = ("train", "val", "test")   # the link splits whose edges a store holds (negatives: val, test)
TABLE_OF = "table_of"       # a table view's manifest key: the store and table its rows are (`Store.edge_table`)
TABLE_SEP = "::"            # a locator's separator between a store's path and one of its tables (`table_locator`)


@dataclass(frozen=True)
class FeatureShard:
    """One row-range feature shard: rows [row_start, row_start + rows) at byte `offset` of `path`."""

    index: int
    path: Path
    row_start: int
    rows: int
    offset: int
    nbytes: int

    @property
    def row_stop(self) -> int:
        return self.row_start + self.rows


def map_shard(shard: FeatureShard, dtype: np.dtype, dim: int, populate: bool = False) -> np.ndarray:
    """Shard rows [rows, dim] as a read-only memory map of the file's pages (the map lives as long as the
    array, its base). `populate`: map every page at once (MAP_POPULATE where there is one) for a caller
    about to touch most of them from the page cache: one call instead of a fault per 64 KiB."""
    nbytes = shard.rows * dim * np.dtype(dtype).itemsize
    if nbytes == 0:
        return np.zeros((0, dim), dtype=dtype)
    start = shard.offset - shard.offset % mmap.ALLOCATIONGRANULARITY
    flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
    try:
        fd = os.open(shard.path, os.O_RDONLY)
    except OSError as e:
        raise InputError(shard.path, f"cannot open feature shard ({e.strerror or e})") from e
    try:
        mm = mmap.mmap(fd, shard.offset - start + nbytes, flags=flags, prot=mmap.PROT_READ, offset=start)
    except (OSError, ValueError) as e:
        raise InputError(shard.path, f"cannot map feature shard ({e})") from e
    finally:
        os.close(fd)
    return np.frombuffer(mm, dtype=dtype, count=shard.rows * dim, offset=shard.offset - start).reshape(shard.rows, dim)


class RowTable:
    """Rows in row-range shards (node features, edge features): each shard an .npy with its data at
    byte `offset`, memory-mapped on demand. With `checks`, what `read_all` and `gather` read is checked
    against the store's checksums (each block once per process); `what` names the rows in its errors.

    Attributes:
        dtype, dim, row_bytes, shard_rows: the rows' type and width, and rows per shard.
        shards: the `FeatureShard` of each shard, in row order.
        num_rows: rows in all.
        checks: the store's `StoreChecks`, or None (nothing checked).
    """

    def __init__(self, root: Path, entry: dict[str, Any], checks: StoreChecks | None = None,
                 what: str = "features") -> None:
        self.dtype = np.dtype(entry["dtype"])
        self.dim: int = int(entry["dim"])
        self.row_bytes: int = int(entry["row_bytes"])
        self.shard_rows: int = int(entry["shard_rows"])
        self.shards = [
            FeatureShard(i, root / s["path"], int(s["row_start"]), int(s["rows"]), int(s["offset"]), int(s["nbytes"]))
            for i, s in enumerate(entry["shards"])
        ]
        self.num_rows: int = sum(s.rows for s in self.shards)
        self.checks = checks
        self.what = what

    def __repr__(self) -> str:
        return f"RowTable(rows={self.num_rows}, dim={self.dim}, dtype={self.dtype}, shards={len(self.shards)})"

    def shard_of(self, rows: np.ndarray) -> np.ndarray:
        """Shard index of each row (vectorised)."""
        return np.asarray(rows, dtype=np.int64) // self.shard_rows

    def shard_array(self, p: int) -> np.ndarray:
        """Shard p as a read-only memory map of shape (rows, dim) (`map_shard`)."""
        return map_shard(self.shards[p], self.dtype, self.dim)

    def check_shard(self, p: int, what: str = "") -> int:
        """Check every block of shard p not checked yet in this process (`what`: the reader, for the error);
        the bytes checked (0 with checks off or no checksums)."""
        if self.checks is None:
            return 0
        return self.checks.check_file(self.shards[p].path, what)

    def check_rows(self, p: int, rows: np.ndarray, what: str = "") -> int:
        """Check the blocks that rows `rows` (local to shard p) lie in, those not checked yet in this process."""
        if self.checks is None or not self.checks.active:
            return 0
        s = self.shards[p]
        return self.checks.check_offsets(s.path, s.offset + np.asarray(rows, np.int64) * self.row_bytes,
                                         self.row_bytes, what)

    def read_all(self) -> np.ndarray:
        """Every row in RAM as one (rows, dim) array (each shard checked from the bytes read)."""
        out = np.empty((self.num_rows, self.dim), dtype=self.dtype)
        for s in self.shards:
            out[s.row_start:s.row_stop] = self.shard_array(s.index)
            if self.checks is not None:
                self.checks.check_view(s.path, s.offset, out[s.row_start:s.row_stop], f"loading the {self.what}")
        return out

    def gather(self, rows: np.ndarray, shard_arrays: Sequence[np.ndarray] | None = None) -> np.ndarray:
        """table[rows] read through the shards' memmaps (page cache), vectorised per shard.

        Args:
            rows: the rows to gather.
            shard_arrays: the shards as (rows, dim) arrays already mapped by the caller (e.g. with
                other madvise advice); by default each touched shard is memory-mapped afresh.
        """
        ids = np.asarray(rows, dtype=np.int64)
        out = np.empty((ids.shape[0], self.dim), dtype=self.dtype)
        if ids.size == 0:
            return out
        shard = ids // self.shard_rows
        order = np.argsort(shard, kind="stable")
        bounds = np.searchsorted(shard[order], np.arange(len(self.shards) + 1))
        for p in np.flatnonzero(np.diff(bounds)):
            pos = order[bounds[p]:bounds[p + 1]]
            local = ids[pos] - self.shards[p].row_start
            self.check_rows(int(p), local, f"a gather of {self.what}")
            shard_rows = self.shard_array(int(p)) if shard_arrays is None else shard_arrays[int(p)]
            out[pos] = shard_rows[local]
        return out


class Store:
    """An ingested dataset: memory-mapped topology, feature shards, labels and splits; optionally edge
    features (`edge_features`, in CSC edge order) and a link split (`link_edges`, `link_negatives`)."""

    def __init__(self, path: str | os.PathLike[str], manifest: dict[str, Any] | None = None,
                 check_crc: bool | None = None) -> None:
        """Open the store at `path` (`manifest`: a view's, rather than the one at `path`); `check_crc`: check
        what is read against the store's checksums (default: on, unless ``DISKFLOW_STORE_CRC=0``:
        `storecheck.store_checks_enabled`)."""
        self.path = Path(path)
        if manifest is None:
            manifest = read_manifest(self.path)
        if manifest is None:
            raise InputError(self.path, "not a diskflow store (no manifest.json; run `diskflow ingest` first)")
        if manifest.get("format") != STORE_FORMAT:
            raise InputError(self.path / "manifest.json", f"format is {manifest.get('format')!r}, expected {STORE_FORMAT!r}")
        self.manifest: dict[str, Any] = manifest
        self.num_nodes: int = int(manifest["num_nodes"])
        self.num_edges: int = int(manifest["num_edges"])
        self.num_classes: int = int(manifest["num_classes"])
        self.checks = StoreChecks(self.path, manifest, check_crc)
        self.features = RowTable(self.path, manifest["features"], self.checks, "features")
        self.feature_dtype = self.features.dtype
        self.feature_dim: int = self.features.dim
        self.row_bytes: int = self.features.row_bytes
        self.shard_rows: int = self.features.shard_rows
        self.shards = self.features.shards
        edge = manifest.get("edge_features")
        self.edge_features: RowTable | None = (None if edge is None
                                               else RowTable(self.path, edge, self.checks, "edge features"))
        self._relations: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    @property
    def has_checksums(self) -> bool:
        """Whether the store records checksums (False: written before they existed, read unchecked)."""
        return self.checks.present

    def edge_table(self) -> Store:
        """The edge features as a store of their own (`edge_table_manifest`): rows are edges, in CSC order.

        What the preparation plans and packs for node rows applies to it unchanged; the view has no
        topology, labels or splits. An InputError when the store has no edge features."""
        return Store(self.path, edge_table_manifest(self))

    @property
    def table_of(self) -> dict[str, str] | None:
        """For a table view (`edge_table`): ``{"path": the store, "table": "edge_features"}``; else None."""
        return self.manifest.get(TABLE_OF)

    def __repr__(self) -> str:
        edge = "" if self.edge_features is None else f", edge_dim={self.edge_features.dim}"
        link = "" if not self.has_link else ", link"
        return (f"Store({str(self.path)!r}, nodes={self.num_nodes}, edges={self.num_edges}, "
                f"dim={self.feature_dim}, dtype={self.feature_dtype}, shards={len(self.shards)}{edge}{link})")

    # ------------------------------------------------------------------ typed stores
    @cached_property
    def hetero(self) -> HeteroLayout | None:
        """A typed store's node and edge types (`HeteroLayout`), or None for a homogeneous store."""
        entry = self.manifest.get("hetero")
        return None if entry is None else HeteroLayout(entry, str(self.path / "manifest.json"))

    def relation(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Edge type k's CSC of a typed store: (indptr int64 [count_dst + 1], indices: the source type's local
        ids), memory-mapped and checked against the store's checksums like the other arrays (once per process).

        Raises:
            InputError: a homogeneous store, or k out of range.
        """
        layout = self.hetero
        if layout is None:
            raise InputError(self.path, "a homogeneous store has one topology (Store.indptr, Store.indices), not "
                                        "one per edge type")
        if not 0 <= int(k) < len(layout.edge_types):
            raise InputError(self.path, f"edge type {k} out of range: the store has {len(layout.edge_types)}")
        if int(k) not in self._relations:
            e = layout.edge_types[int(k)]
            self._relations[int(k)] = (self._load(e.indptr), self._load(e.indices))
        return self._relations[int(k)]

    def topology_nbytes(self) -> int:
        """Bytes of the topology: the CSC, or every edge type's of a typed store."""
        layout = self.hetero
        if layout is None:
            return int(self.indptr.nbytes + self.indices.nbytes)
        return sum(int(a.nbytes) for k in range(len(layout.edge_types)) for a in self.relation(k))

    def _topology(self, key: str) -> str:
        if self.manifest.get("hetero") is not None:
            raise InputError(self.path, "a typed store has one topology per edge type: read Store.relation(k) "
                                        "(Store.hetero lists the edge types), not Store.indptr/indices")
        if self.manifest.get("topology") is None:
            raise InputError(self.path, "has no topology (a row table of a store)")
        return str(self.manifest["topology"][key])

    # ------------------------------------------------------------------ topology
    def _load(self, rel: str, mmap: bool = True) -> np.ndarray:
        p = self.path / rel
        self.checks.check_file(rel, "loading it")
        try:
            return load_npy(p, "r" if mmap else None)
        except (OSError, ValueError) as e:
            raise InputError(p, f"unreadable array ({e})") from e

    @cached_property
    def indptr(self) -> np.ndarray:
        """CSC column pointer (int64, N+1), memory-mapped."""
        return self._load(self._topology("indptr"))

    @cached_property
    def indices(self) -> np.ndarray:
        """CSC row indices: the source node of every in-edge, grouped by destination; memory-mapped."""
        return self._load(self._topology("indices"))

    def populate_topology(self) -> bool:
        """Fault the memory-mapped topology in before sampling; True when it was done.

        A sampler touches nearly every neighbour list; faulted in at random from a cold page
        cache that costs several times one sequential pass (MADV_POPULATE_READ, Linux 5.14+).
        Skipped (False) where the kernel lacks it or the topology is over half the memory
        available, where it could only evict itself.
        """
        layout = self.hetero
        arrays = [self.indptr, self.indices] if layout is None else \
            [a for k in range(len(layout.edge_types)) for a in self.relation(k)]
        size = sum(int(a.nbytes) for a in arrays)
        try:
            available = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            return False
        if size > available // 2:
            return False
        for a in arrays:
            m = getattr(a, "_mmap", None)
            if m is None or a.nbytes == 0:
                continue
            try:
                m.madvise(_MADV_POPULATE_READ)
            except (OSError, ValueError):
                return False
        return True

    @cached_property
    def labels(self) -> np.ndarray:
        return self._load(self.manifest["labels"], mmap=False)

    @cached_property
    def splits(self) -> np.ndarray:
        return self._load(self.manifest["splits"], mmap=False)

    def split_ids(self, name: str) -> np.ndarray:
        """Node ids of a split ('train', 'val', 'test'), ascending, int64."""
        if name not in SPLIT_CODE:
            raise ValueError(f"unknown split {name!r}; expected one of {SPLITS}")
        return np.flatnonzero(self.splits == SPLIT_CODE[name]).astype(np.int64)

    # ------------------------------------------------------------------ features
    @property
    def feature_bytes(self) -> int:
        """Bytes of the feature table: N rows, or a typed store's featured rows (its featureless types have none)."""
        return self.features.num_rows * self.row_bytes

    @property
    def budget_bytes(self) -> int:
        """The bytes of every row a batch reads: node features and, where kept, edge features. A budget given
        as a share of the features (``"10%"``) is a share of these."""
        edges = self.edge_features
        return self.feature_bytes + (0 if edges is None else edges.num_rows * edges.row_bytes)

    def shard_of(self, node_ids: np.ndarray) -> np.ndarray:
        """Shard index of each node id (vectorised)."""
        return self.features.shard_of(node_ids)

    def shard_array(self, p: int) -> np.ndarray:
        """Shard p as a read-only memory map of shape (rows, dim) (`map_shard`)."""
        return self.features.shard_array(p)

    def read_features(self) -> np.ndarray:
        """All features in RAM as one (N, dim) array (the in-memory baseline)."""
        return self.features.read_all()

    def check_shard(self, p: int, what: str = "") -> int:
        """Check every block of feature shard p not checked yet in this process (`RowTable.check_shard`)."""
        return self.features.check_shard(p, what)

    def check_rows(self, p: int, rows: np.ndarray, what: str = "") -> int:
        """Check the blocks that feature rows `rows` (local to shard p) lie in (`RowTable.check_rows`)."""
        return self.features.check_rows(p, rows, what)

    def gather(self, node_ids: np.ndarray, shard_arrays: Sequence[np.ndarray] | None = None) -> np.ndarray:
        """features[node_ids] read through the shards' memmaps (page cache), vectorised per shard.

        Args:
            node_ids: the rows to gather.
            shard_arrays: the shards as (rows, dim) arrays already mapped by the caller (e.g. with
                other madvise advice); by default each touched shard is memory-mapped afresh.
        """
        return self.features.gather(node_ids, shard_arrays)

    # ------------------------------------------------------------------ link prediction
    @property
    def has_link(self) -> bool:
        """Whether the store holds a link split (``link/``)."""
        return self.manifest.get("link") is not None

    def _link_file(self, split: str, suffix: str = "") -> str:
        if split not in LINK_ARRAYS or (suffix and split == "train"):
            choices = LINK_ARRAYS if not suffix else LINK_ARRAYS[1:]
            raise ValueError(f"unknown link split {split!r}; expected one of {choices}")
        if not self.has_link:
            raise InputError(self.path, "has no link split (ingest with --link-split, or edges with a split column)")
        return self.manifest["link"].get("files", {}).get(split + suffix, f"link/{split}{suffix}.npy")

    def link_edges(self, split: str) -> np.ndarray:
        """The supervision edges of a link split ('train', 'val', 'test'): int64 [2, P], row 0 src, row 1 dst."""
        return self._load(self._link_file(split), mmap=False)

    def link_negatives(self, split: str) -> np.ndarray:
        """The fixed negative destinations of a link split ('val', 'test'): int64 [P, K]; memory-mapped."""
        return self._load(self._link_file(split, "_neg"))


def edge_table_manifest(store: Store) -> dict[str, Any]:
    """The manifest of `store`'s edge features as a store of their own: one row per edge (``num_nodes`` is
    the edge count), the ``features`` entry the edge table's with its shard paths made absolute, so that
    the manifest may be written anywhere and every worker reads the store's own shard files. Planning
    and packing read nothing else of a store, so the edge rows are counted, tiered, planned and packed
    by the same tasks as node rows. ``table_of`` names the store and table. Where the store has checksums
    the view carries those of the edge shards, under the same absolute paths, so that its readers check
    what they read as the store's do."""
    entry = store.manifest.get("edge_features")
    if entry is None or store.edge_features is None:
        raise InputError(store.path, "has no edge features")
    root = store.path.resolve()
    shards = [{**s, "path": str(root / s["path"])} for s in entry["shards"]]
    view = {"format": STORE_FORMAT, "version": store.manifest.get("version", STORE_VERSION),
            "num_nodes": store.edge_features.num_rows, "num_edges": 0, "num_classes": 0,
            "features": {**entry, "shards": shards},
            TABLE_OF: {"path": str(root), "table": "edge_features"}}
    if store.checks.present:
        files = {str(root / s["path"]): store.checks.files[s["path"]] for s in entry["shards"]
                 if s["path"] in store.checks.files}
        view[CHECKSUMS] = {**store.manifest[CHECKSUMS], "files": files}
    return view


def table_locator(store_path: str | os.PathLike[str], table: str | None = None) -> str:
    """A string naming a store or one of its row tables (``edge_features``), for tasks that open it where
    they run (`open_table`): a worker reads the store's own files, and nothing is written beside them."""
    return str(store_path) if table is None else f"{store_path}{TABLE_SEP}{table}"


def open_table(locator: str | os.PathLike[str]) -> Store:
    """The store or row table a `table_locator` names: the store itself, or its edge features as a store
    (`Store.edge_table`)."""
    path, sep, table = str(locator).rpartition(TABLE_SEP)
    if not sep:
        return Store(locator)
    if table != "edge_features":
        raise InputError(path, f"has no row table {table!r} (only 'edge_features')")
    return Store(path).edge_table()
