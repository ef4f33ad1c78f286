"""Ingest as a Dask graph: a raw Arrow/Parquet dataset becomes a store (docs/design.md, "Formats").

Two phases, each one `progress.compute` call on the active scheduler:

* **scan** — ``ingest-nodes`` (labels, splits), ``ingest-scan-feature-i`` (schema and
  node-id ranges per feature file) and ``ingest-scan-edges-i`` (validate, spill edges
  grouped by destination bucket) all run side by side; N comes from the node files'
  footers, so nothing waits for anything.
* **build** — with the scans' counts known, ``ingest-alloc-*`` preallocates the CSC
  arrays, ``ingest-csc-g`` sorts each run of buckets into its slice (plus
  ``ingest-compact-g`` when to_undirected deduplicates or a split column filters),
  ``ingest-feature-shard-p`` writes feature shard p, ``ingest-link`` the link arrays (with a
  link split), ``ingest-edge-shard-p`` edge feature shard p (once the CSC's edge count is known,
  so in a third compute), and ``ingest-manifest`` removes the spills and writes the manifest.

Keys end in a per-run token (``ingest-csc-3-1f0c9a2b``) so that two runs can share a
cluster; the dashboard groups them by the words before the index. (No key word may be
an 8-letter word starting with a-f, such as "features": `dask.utils.key_split` takes
those for hex tokens and drops them from the group name.)

A raw dataset with a ``hetero.json`` is typed: `run_ingest` hands it to `flow.heteroingest`, which builds a typed
store with the same operators, one CSC per edge type.

Everything is built inside a staging directory swapped into place at the end, so a
failure leaves no output that looks valid and an earlier store untouched. A re-run
whose inputs (fingerprints) and options are unchanged returns at once.
"""
from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dask
import numpy as np

from ..errors import ConfigError, InputError
from ..native.constants import ALIGN
from ..operators.formats.atomic import staging_dir
from ..operators.formats.hashing import fingerprint
from ..operators.formats.npyio import aligned_npy_header, create_aligned_npy
from ..operators.formats.outputs import check_free_space, check_replaceable
from ..operators.formats.store import STORE_FORMAT, STORE_KIND
from ..operators.formats.storecheck import CHECKSUMS, Piece, add_pieces, record_checksums
from ..operators.ingest.edges import (
    EdgeAttrTarget,
    EdgeSchema,
    EdgeSpill,
    LinkScan,
    allocate_npy,
    compact_group,
    csc_group,
    edge_schema,
    indices_dtype,
    is_packed,
    scan_edges,
)
from ..operators.ingest.features import (
    FeatureFile,
    check_same_schema,
    scan_features,
    units_overlapping,
    write_edge_feature_shard,
    write_feature_shard,
)
from ..operators.ingest.heterotypes import HETERO_FILE, is_typed_raw
from ..operators.ingest.links import LinkConfig, write_link_arrays
from ..operators.ingest.nodes import ingest_nodes
from ..operators.ingest.raw import (
    EDGE_CSC_BYTES,
    EDGE_CSC_ORDINAL_BYTES,
    SPILL_DIR,
    RawFiles,
    check_memory_budget,
    csc_edge_cap,
    edge_chunk_rows,
    feature_batch_rows,
    find_raw_files,
    fine_bucket_width,
    finish_store,
    group_buckets,
    shard_rows_for,
    store_manifest,
    table_num_rows,
)
from ..operators.ingest.remote import raw_size, remote_fingerprint
from ..operators.options import INGEST_MEMORY
from .progress import compute

__all__ = ["IngestResult", "allocate_total", "ingest_config", "run_ingest", "store_shard_name", "up_to_date",
           "with_pieces"]


@dataclass(frozen=True)
class IngestResult:
    """What `run_ingest` did.

    Attributes:
        path: the store directory.
        skipped: True when the store was already up to date (nothing was done).
        num_nodes, num_edges: the store's sizes (edges after to_undirected).
        input_bytes: total size of the raw input files.
        seconds: wall time of the call.
        feature_bytes: bytes of node features in the store.
        num_shards: feature shards written.
        edge_feature_bytes: bytes of edge features in the store (0 without).
        link_counts: supervision edges per link split (None without a link split).
    """

    path: Path
    skipped: bool
    num_nodes: int
    num_edges: int
    input_bytes: int
    seconds: float
    feature_bytes: int = 0
    num_shards: int = 0
    edge_feature_bytes: int = 0
    link_counts: dict[str, int] | None = None

    @classmethod
    def of(cls, path: Path, skipped: bool, manifest: dict[str, Any], input_bytes: int, seconds: float
           ) -> IngestResult:
        """The result that a store's manifest describes."""
        n, feats = int(manifest["num_nodes"]), manifest["features"]
        edge = manifest.get("edge_features")
        link = manifest.get("link")
        rows = sum(int(s["rows"]) for s in feats["shards"])     # N, or a typed store's featured rows
        return cls(path, skipped, n, int(manifest["num_edges"]), input_bytes, seconds, rows * int(feats["row_bytes"]),
                   len(feats["shards"]), 0 if edge is None else int(manifest["num_edges"]) * int(edge["row_bytes"]),
                   None if link is None else dict(link["counts"]))


def ingest_config(*, memory_budget: int, shard_rows: int | None, to_undirected: bool,
                  allow_nonfinite: bool, link: LinkConfig | None = None) -> dict[str, Any]:
    """The options that change the output (recorded in the manifest; a change redoes the ingest).

    The memory budget only matters through the shard size it implies, so it is recorded
    only when `shard_rows` is not given.
    """
    return {
        "to_undirected": bool(to_undirected),
        "allow_nonfinite": bool(allow_nonfinite),
        "shard_rows": None if shard_rows is None else int(shard_rows),
        "memory_budget": int(memory_budget) if shard_rows is None else None,
        **(link or LinkConfig()).as_config(),
    }


def up_to_date(manifest: dict[str, Any] | None, inputs: dict[str, str], config: dict[str, Any]
               ) -> dict[str, Any] | None:
    """The existing store's manifest when it was built from the same inputs and options."""
    if (not manifest or manifest.get("format") != STORE_FORMAT or manifest.get("inputs") != inputs
            or manifest.get("config") != config or CHECKSUMS not in manifest):
        return None         # (a store written before checksums is rebuilt, to add them)
    return manifest


def _check_out(raw: RawFiles, out: Path) -> None:
    if raw.remote:
        return      # a URL's objects and a local store cannot overlap
    assert isinstance(raw.root, Path)
    if out == raw.root or raw.root.is_relative_to(out) or out.is_relative_to(raw.root / "edges") \
            or out.is_relative_to(raw.root / "features") or out.is_relative_to(raw.root / "nodes"):
        raise ConfigError("OUT", f"{out} overlaps the raw dataset {raw.root}; choose a separate directory")


def _count_rows(files: Sequence[Path], what: str) -> int:
    total = sum(table_num_rows(p) for p in files)
    if total == 0:
        raise InputError(files[0].parent, f"empty dataset: the {what} files hold zero rows")
    return total


def run_ingest(raw: str | os.PathLike[str], out: str | os.PathLike[str], *, memory_budget: str | int = INGEST_MEMORY,
               shard_rows: int | None = None, to_undirected: bool = False, allow_nonfinite: bool = False,
               force: bool = False, link_split: Sequence[float] | None = None,
               disjoint_train_ratio: float = LinkConfig.disjoint_train_ratio,
               link_negatives: int = LinkConfig.negatives, link_seed: int = LinkConfig.seed,
               storage_options: dict[str, Any] | None = None, derive: Sequence[str] = ()) -> IngestResult:
    """Ingest the raw dataset `raw` into the store `out`, as Dask tasks on the active scheduler.

    Args:
        raw: directory with edges/, features/, nodes/ (docs/design.md, "Formats"), or its URL (``s3://``,
            ``gs://``, ``hdfs://``, any fsspec scheme): the tasks read their shards from it themselves. A
            directory with a ``hetero.json`` is a typed dataset and becomes a typed store
            (`flow.heteroingest`; no link split, no edge features).
        out: the store directory to create (or replace).
        memory_budget: bytes one task may use (e.g. "1GiB"); sets the feature shard size,
            the edge buckets and the read batch sizes.
        shard_rows: rows per feature shard (default: from the memory budget).
        to_undirected: add every edge reversed and drop repeated edges (PyG's to_undirected).
        allow_nonfinite: accept NaN/inf feature values (node and edge features).
        force: rebuild even when `out` is up to date, and replace `out` even when it is not a store.
        link_split: (val, test) shares of a seeded random link split (`operators.ingest.links`), for raw
            edges without a ``split`` column (with one, giving shares too is refused).
        disjoint_train_ratio: share of the training edges held out of message passing (supervision only).
        link_negatives: fixed negatives per validation and test edge (MRR, Hits@K).
        link_seed: seeds the random split, the supervision share and the negatives.
        storage_options: how to reach a URL (fsspec's, as Dask's ``read_parquet`` takes them:
            `operators.ingest.remote`); credentials otherwise come from the environment and config files.
        derive: a typed dataset's derive rules, ``TYPE=mean:SRC__REL__DST`` each: the featureless node type
            TYPE gets the mean of its neighbours' feature rows over that edge type
            (`operators.ingest.heterotypes.DeriveRule`).

    Raises:
        InputError: bad or missing input, naming the file and the fault; `out` holds something
            other than a store (without `force`).
        ConfigError: a bad option.
        DiskFullError: the store's filesystem has no room for it (checked once the scans know
            the feature and edge bytes, and on ENOSPC while writing); nothing is published.
    """
    t0 = time.perf_counter()
    budget = check_memory_budget(memory_budget)
    if shard_rows is not None and int(shard_rows) < 1:
        raise ConfigError("shard_rows", f"must be >= 1, got {shard_rows}")
    link = LinkConfig(None if link_split is None else tuple(link_split), disjoint_train_ratio, link_negatives,
                      link_seed).check()
    if isinstance(derive, str):
        derive = [derive]
    if is_typed_raw(raw):
        if link.split is not None or link.disjoint_train_ratio > 0:
            raise ConfigError("link_split" if link.split is not None else "disjoint_train_ratio",
                              f"{raw} is a typed dataset ({HETERO_FILE}): typed stores have no link split yet")
        if storage_options:
            raise ConfigError("storage_options", f"apply to a URL, not the path {raw}")
        from .heteroingest import run_hetero_ingest

        return run_hetero_ingest(Path(raw), Path(out), budget=budget, shard_rows=shard_rows, to_undirected=to_undirected,
                                 allow_nonfinite=allow_nonfinite, force=force, derive=list(derive))
    if derive:
        raise ConfigError("derive", f"derives a typed dataset's node features, and {raw} has no {HETERO_FILE}")
    files = find_raw_files(raw, storage_options)
    out_p = Path(out).absolute()
    _check_out(files, out_p)
    schema = edge_schema(files.edges)
    if schema.split and link.split is not None:
        raise ConfigError("link_split", f"the edges of {files.root} have a split column; give link_split only "
                                        "for edges without one")
    if not schema.split and link.split is None and link.disjoint_train_ratio > 0:
        raise ConfigError("disjoint_train_ratio", "needs a link split (link_split, or a split column in the edges)")
    inputs = {files.relative(p): remote_fingerprint(p) if files.remote else fingerprint(p) for p in files.all()}
    input_bytes = sum(raw_size(p) for p in files.all())
    config = ingest_config(memory_budget=budget, shard_rows=shard_rows, to_undirected=to_undirected,
                           allow_nonfinite=allow_nonfinite, link=link)
    existing = check_replaceable(out_p, force, STORE_KIND)
    previous = None if force else up_to_date(existing, inputs, config)
    if previous is not None:
        return IngestResult.of(out_p, True, previous, input_bytes, time.perf_counter() - t0)

    num_nodes = _count_rows(files.nodes, "nodes")
    edge_rows = [table_num_rows(p) for p in files.edges]
    if sum(edge_rows) == 0:
        raise InputError(files.edges[0].parent, "empty dataset: the edges files hold zero rows")
    est_edges = sum(edge_rows) * (2 if to_undirected else 1)
    with staging_dir(out_p) as stage:
        (stage / "features").mkdir()
        (stage / SPILL_DIR).mkdir()
        use_link = link if (schema.split or link.split is not None) else None
        if use_link is not None:
            (stage / "link").mkdir()
        if schema.attr_dtype is not None and schema.attr_dim is not None:
            (stage / "edge_features").mkdir()
            create_aligned_npy(stage / SPILL_DIR / "edge-attr-raw.npy", schema.attr_dtype,
                               (sum(edge_rows), schema.attr_dim))
        plan = _Plan(files, stage, num_nodes, budget, uuid.uuid4().hex[:8], to_undirected, allow_nonfinite, out_p,
                     schema=schema, link=use_link, edge_rows=edge_rows)
        nodes, feature_files, spills = plan.scan(est_edges)
        manifest = plan.build(nodes, feature_files, spills, shard_rows, inputs, config)
    return IngestResult.of(out_p, False, manifest, input_bytes, time.perf_counter() - t0)


@dataclass
class _Plan:
    """The graph of one ingest run: which tasks, with which arguments and keys."""

    files: RawFiles
    stage: Path
    num_nodes: int
    budget: int
    token: str  # makes keys unique per run, so two ingests can share a cluster
    to_undirected: bool
    allow_nonfinite: bool
    out: Path | None = None     # the store being built in `stage` (what messages name)
    schema: EdgeSchema = field(default_factory=EdgeSchema)  # the edge files' optional columns
    link: LinkConfig | None = None      # the link split's options (None: no link split)
    edge_rows: list[int] | None = None  # rows per edge file (the raw ordinals' offsets)
    packed: bool = field(init=False, default=True)  # the spill layout, set by `scan`
    bucket_width: int = field(init=False, default=1)
    num_buckets: int = field(init=False, default=1)

    def key(self, name: str, i: int | None = None) -> str:
        return f"ingest-{name}-{self.token}" if i is None else f"ingest-{name}-{i}-{self.token}"

    @property
    def edge_starts(self) -> list[int]:
        """The raw ordinal of each edge file's first row."""
        rows = self.edge_rows if self.edge_rows is not None else [0] * len(self.files.edges)
        return np.concatenate([[0], np.cumsum(rows)]).astype(np.int64).tolist()[:-1]

    @property
    def attr_path(self) -> Path:
        return self.stage / SPILL_DIR / "edge-attr-raw.npy"

    def _edge_extra_bytes(self) -> int:
        """Scan bytes per edge beyond src and dst: two copies of its features, its ordinal and tag."""
        s = self.schema
        attr = 0 if s.attr_dtype is None or s.attr_dim is None else 2 * s.attr_dim * np.dtype(s.attr_dtype).itemsize
        return attr + (32 if attr or self.link is not None else 0)

    def _edge_scan_options(self, i: int) -> dict[str, Any]:
        s = self.schema
        attr = None if s.attr_dtype is None or s.attr_dim is None else \
            EdgeAttrTarget(str(self.attr_path), s.attr_dtype, s.attr_dim, self.allow_nonfinite)
        link = None if self.link is None else \
            LinkScan(self.link, s.split, str(self.stage / SPILL_DIR / f"link-{i:05d}"))
        return {"ordinal_start": self.edge_starts[i],
                "expected_rows": None if self.edge_rows is None else self.edge_rows[i],
                "edge_attr": attr, "link": link}

    # ------------------------------------------------------------------ phase 1
    def scan(self, est_edges: int) -> tuple[tuple[dict[str, Any], list[Piece]], list[FeatureFile], list[EdgeSpill]]:
        """Run the node build and the feature and edge scans; check the feature schemas agree."""
        n = self.num_nodes
        self.packed = is_packed(n)
        self.bucket_width = fine_bucket_width(n, est_edges, self.budget)
        self.num_buckets = math.ceil(n / self.bucket_width)
        d = dask.delayed
        nodes = d(with_pieces, pure=False)(ingest_nodes, list(self.files.nodes), n, self.stage, batch_rows=1 << 20,
                                            dask_key_name=self.key("nodes"))
        feats = [d(scan_features, pure=False)(p, n, dask_key_name=self.key("scan-feature", i))
                 for i, p in enumerate(self.files.features)]
        edges = [d(scan_edges, pure=False)(p, self.stage / SPILL_DIR / f"edges-{i:05d}.bin", num_nodes=n,
                                           bucket_width=self.bucket_width, num_buckets=self.num_buckets,
                                           chunk_rows=edge_chunk_rows(self.budget, self._edge_extra_bytes()), to_undirected=self.to_undirected,
                                           packed=self.packed, **self._edge_scan_options(i),
                                           dask_key_name=self.key("scan-edges", i))
                 for i, p in enumerate(self.files.edges)]
        results = compute([nodes, *feats, *edges], desc="ingest: scan")
        feature_files = results[1:1 + len(feats)]
        check_same_schema(feature_files)
        return results[0], feature_files, results[1 + len(feats):]

    def check_space(self, row_bytes: int, shard_rows: int, scanned: int, index_bytes: int, extra: int = 0) -> None:
        """Fail before building when the store's filesystem cannot hold what the build writes.

        Feature shards, indptr and indices (twice when to_undirected deduplicates through a
        scratch copy), each with its 4096-byte header, plus `extra` bytes (edge features, link
        arrays, ordinals); the scans' spills are already on disk.
        """
        n = self.num_nodes
        shards = math.ceil(n / shard_rows)
        nbytes = (n * row_bytes + shards * ALIGN + (n + 1) * 8 + ALIGN
                  + scanned * index_bytes * (2 if self.to_undirected else 1) + ALIGN + extra)
        check_free_space({self.out or self.stage: nbytes})

    # ------------------------------------------------------------------ phase 2
    def build(self, nodes: tuple[dict[str, Any], list[Piece]], feature_files: list[FeatureFile], spills: list[EdgeSpill],
              shard_rows: int | None, inputs: dict[str, str], config: dict[str, Any]) -> dict[str, Any]:
        """Build topology, feature shards and link arrays, then edge feature shards and the manifest;
        return the manifest."""
        d = dask.delayed
        n = self.num_nodes
        dtype, dim = check_same_schema(feature_files)
        row_bytes = dim * dtype.itemsize
        rows = int(shard_rows) if shard_rows is not None else shard_rows_for(self.budget, row_bytes, n)
        index_dtype = indices_dtype(n)
        ordinals = bool(spills) and spills[0].ordinals
        tags = bool(spills) and spills[0].tags
        sch = self.schema
        edge_row_bytes = 0 if sch.attr_dtype is None or sch.attr_dim is None \
            else sch.attr_dim * np.dtype(sch.attr_dtype).itemsize

        # topology: runs of spill buckets that fit the budget, each placed at its scan offset
        counts = np.sum([s.bucket_counts() for s in spills], axis=0)
        scanned = int(counts.sum())
        link_pairs = sum(p.count for s in spills for p in s.link)
        held = sum(p.count for s in spills for p in s.link if p.split != "train")
        extra = (scanned * (edge_row_bytes + (16 if ordinals else 0)) + link_pairs * 16
                 + held * 8 * (self.link.negatives if self.link is not None else 0))
        self.check_space(row_bytes, rows, scanned, index_dtype.itemsize, extra)
        groups = group_buckets(counts, csc_edge_cap(self.budget, EDGE_CSC_ORDINAL_BYTES if ordinals else EDGE_CSC_BYTES))
        compact = self.to_undirected or tags
        indptr = d(allocate_npy, pure=False)(self.stage / "indptr.npy", np.int64, n + 1,
                                             dask_key_name=self.key("alloc-indptr"))
        target = self.stage / (f"{SPILL_DIR}/indices-scratch.npy" if compact else "indices.npy")
        indices = d(allocate_npy, pure=False)(target, index_dtype, scanned, dask_key_name=self.key("alloc-indices"))
        order: Any = None
        if ordinals:
            order_target = self.stage / SPILL_DIR / ("order-scratch.npy" if compact else "order.npy")
            order = d(allocate_npy, pure=False)(order_target, np.int64, scanned, dask_key_name=self.key("alloc-order"))
        bases = np.concatenate([[0], np.cumsum([counts[a:b].sum() for a, b in groups])]).astype(np.int64)
        ranges = [(a * self.bucket_width, min(b * self.bucket_width, n)) for a, b in groups]
        sources = list(zip((str(p) for p in self.files.edges), self.edge_starts))
        topo = []
        for g, (a, b) in enumerate(groups):
            runs = [(s.path, s.offsets[:, a], s.offsets[:, b]) for s in spills
                    if len(s.offsets) and (s.offsets[:, b] > s.offsets[:, a]).any()]
            topo.append(d(with_pieces, pure=False)(csc_group, runs, lo=ranges[g][0], hi=ranges[g][1], base=int(bases[g]),
                                                 indptr_path=indptr, indices_path=indices, index_dtype=index_dtype,
                                                 packed=self.packed, dedupe=self.to_undirected, order_path=order,
                                                 tags=tags, sources=sources, undirected=self.to_undirected,
                                                 dask_key_name=self.key("csc", g)))
        if compact:
            final = d(allocate_total, pure=False)(self.stage / "indices.npy", index_dtype, topo,
                                                   dask_key_name=self.key("alloc-indices-final"))
            order_final = None if order is None else d(allocate_total, pure=False)(
                self.stage / SPILL_DIR / "order.npy", np.dtype(np.int64), topo, dask_key_name=self.key("alloc-order-final"))
            topo = [d(_compact, pure=False)(g, topo, scratch_path=indices, scratch_base=int(bases[g]),
                                            indices_path=final, indptr_path=indptr, lo=ranges[g][0], hi=ranges[g][1],
                                            index_dtype=index_dtype, order_scratch_path=order, order_path=order_final,
                                            dask_key_name=self.key("compact", g))
                    for g in range(len(groups))]

        # features: one task per row-range shard, reading only the units that overlap it
        shards = []
        for p in range(math.ceil(n / rows)):
            lo, hi = p * rows, min(n, (p + 1) * rows)
            shards.append(d(with_pieces, pure=False)(
                write_feature_shard, units_overlapping(feature_files, lo, hi), self.stage / store_shard_name(p),
                crc_name=store_shard_name(p), lo=lo, hi=hi, dtype=dtype, dim=dim, features_dir=self.files.root / "features",
                allow_nonfinite=self.allow_nonfinite, batch_rows=feature_batch_rows(self.budget, row_bytes),
                dask_key_name=self.key("feature-shard", p)))

        link: Any = None
        if self.link is not None:
            link = d(with_pieces, pure=False)(write_link_arrays, [list(s.link) for s in spills], self.stage / "link",
                                               num_nodes=n, cfg=self.link, dask_key_name=self.key("link"))

        features = {"dtype": dtype.name, "dim": dim, "row_bytes": row_bytes, "shard_rows": rows,
                    "arrow_type": feature_files[0].arrow_type}
        static = {"num_nodes": n, "indices_dtype": index_dtype.name, "nodes": nodes, "features": features,
                  "inputs": inputs, "config": config, "link": None}
        if self.link is not None:
            static["link"] = {"source": "column" if sch.split else "random", "cfg": self.link,
                              "undirected": self.to_undirected}
        if not edge_row_bytes:
            manifest = d(_write_manifest, pure=False)(self.stage, topo, shards, static, link, None,
                                                      dask_key_name=self.key("manifest"))
            return compute([*topo, *shards, *([link] if link is not None else []), manifest],
                           desc="ingest: build")[-1]

        # edge features: shards of CSC positions, once the CSC's edge count is known
        done = compute([*topo, *shards, *([link] if link is not None else [])], desc="ingest: build")
        kept, shard_entries = done[:len(topo)], done[len(topo):len(topo) + len(shards)]
        link_done = done[-1] if link is not None else None
        num_edges = int(sum(k for k, _ in kept))
        edge_rows = int(shard_rows) if shard_rows is not None else shard_rows_for(self.budget, edge_row_bytes,
                                                                                   max(1, num_edges))
        order_path = self.stage / SPILL_DIR / "order.npy"
        edge_shards = [d(with_pieces, pure=False)(
            write_edge_feature_shard, order_path, self.attr_path, self.stage / store_shard_name(p, "edge_features"),
            crc_name=store_shard_name(p, "edge_features"), lo=p * edge_rows, hi=min(num_edges, (p + 1) * edge_rows),
            dask_key_name=self.key("edge-shard", p))
            for p in range(math.ceil(num_edges / edge_rows))]
        static["edge_features"] = {"dtype": sch.attr_dtype, "dim": sch.attr_dim, "row_bytes": edge_row_bytes,
                                   "shard_rows": edge_rows, "arrow_type": sch.arrow_type}
        manifest = d(_write_manifest, pure=False)(self.stage, kept, shard_entries, static, link_done, edge_shards,
                                                  dask_key_name=self.key("manifest"))
        return compute([*edge_shards, manifest], desc="ingest: edge features")[-1]


def store_shard_name(p: int, folder: str = "features") -> str:
    """The store-relative path of row-range shard p of `folder` (``features/part-00003.npy``)."""
    return f"{folder}/part-{p:05d}.npy"


def with_pieces(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, list[Piece]]:
    """`fn`'s result and the crc32 pieces of the store files it wrote (its `pieces` argument), for the
    manifest task's checksums (`storecheck`)."""
    pieces: list[Piece] = []
    return fn(*args, pieces=pieces, **kwargs), pieces


def allocate_total(path: Path, dtype: np.dtype, topo: list[tuple[int, list[Piece]]]) -> str:
    """Allocate a final CSC-length array once the compacting CSC tasks have counted their edges."""
    return allocate_npy(path, dtype, int(sum(k for k, _ in topo)))


def _compact(g: int, topo: list[tuple[int, list[Piece]]], **kwargs: Any) -> tuple[int, list[Piece]]:
    """Move group g's kept indices (and ordinals) to their final offset (the sum of earlier groups' counts);
    its kept count and the pieces of its CSC task followed by its own (which rewrite some)."""
    kept = [k for k, _ in topo]
    pieces = list(topo[g][1])
    compact_group(kept=kept[g], final_base=int(sum(kept[:g])), pieces=pieces, **kwargs)
    return kept[g], pieces


def _write_manifest(stage: Path, topo: list[tuple[int, list[Piece]]], shards: list[tuple[dict[str, Any], list[Piece]]],
                    static: dict[str, Any], link: tuple[dict[str, int], list[Piece]] | None,
                    edge_shards: list[tuple[dict[str, Any], list[Piece]]] | None) -> dict:
    """Assemble the manifest from the tasks' results, with every file's checksums, and write it last."""
    features = dict(static["features"])
    features["shards"] = [{"path": store_shard_name(p), **s} for p, (s, _) in enumerate(shards)]
    num_edges = int(sum(k for k, _ in topo))
    nodes, pieces = static["nodes"]
    pieces = list(pieces)
    n = int(static["num_nodes"])
    add_pieces(pieces, "indptr.npy", 0, np.frombuffer(aligned_npy_header(np.dtype(np.int64), (n + 1,)), np.uint8))
    add_pieces(pieces, "indices.npy", 0,
               np.frombuffer(aligned_npy_header(static["indices_dtype"], (num_edges,)), np.uint8))
    for _, written in (*topo, *shards, *(edge_shards or ()), *([link] if link is not None else [])):
        pieces.extend(written)
    edge_features = None
    if edge_shards is not None:
        edge_features = {**static["edge_features"],
                         "shards": [{"path": store_shard_name(p, "edge_features"), **s} for p, (s, _) in enumerate(edge_shards)]}
    link_entry = None
    if static["link"] is not None and link is not None:
        spec = static["link"]
        link_entry = spec["cfg"].describe(spec["source"], link[0], spec["undirected"])
    manifest = store_manifest(num_nodes=n, num_edges=num_edges, indices_dtype=static["indices_dtype"], nodes=nodes,
                              features=features, inputs=static["inputs"], config=static["config"],
                              edge_features=edge_features, link=link_entry)
    manifest = record_checksums(stage, manifest, pieces)
    finish_store(stage, manifest)
    return manifest
