"""Typed ingest as a Dask graph: a raw dataset with ``hetero.json`` (`operators.ingest.heterotypes`) becomes a
typed store (`operators.formats.hetero`; docs/design.md, "Formats").

The graph has the homogeneous ingest's shape (`flow.ingest`), once per type:

* **scan** — ``ingest-nodes`` (labels and splits of every labelled type, over global ids),
  ``ingest-scan-feature-i`` (one per feature file of each type, local ids checked against the type's count)
  and ``ingest-scan-edges-i`` (one per edge file of each edge type, and again for each reverse type and
  each reversed CSC a derivation needs: validate the ids against the src and dst types' counts, spill
  grouped by destination bucket).
* **build** — per edge type ``ingest-alloc-*`` and ``ingest-csc-…`` (plus ``ingest-compact-…`` where
  to_undirected deduplicates) write ``etypes/<k>/indptr.npy`` and ``indices.npy`` (``derive/<k>/`` for a
  derivation's reversed CSC) with the homogeneous operators; ``ingest-feature-shard-p`` writes shard p of the
  one global feature table, streaming each type's batches into its rows and columns.

Then, with derive rules, the derivation (`flow.derive.derive_features`) fills the derived types' rows, and the
manifest is written last (its ``hetero`` entry: `HeteroLayout`). Everything is built in a staging directory
swapped into place at the end, as the homogeneous ingest's.
"""
from __future__ import annotations

import math
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import numpy as np

from ..errors import ConfigError, InputError
from ..native.constants import ALIGN
from ..operators.formats.atomic import staging_dir
from ..operators.formats.hashing import fingerprint
from ..operators.formats.hetero import HeteroLayout
from ..operators.formats.manifest import write_manifest
from ..operators.formats.npyio import aligned_npy_header
from ..operators.formats.outputs import check_free_space, check_replaceable
from ..operators.formats.store import STORE_KIND
from ..operators.formats.storecheck import Piece, add_pieces, record_checksums
from ..operators.ingest.edges import (
    EdgeSpill,
    allocate_npy,
    compact_group,
    csc_group,
    edge_schema,
    indices_dtype,
    is_packed,
    scan_edges,
)
from ..operators.ingest.features import FeatureFile, check_same_schema, scan_features, units_overlapping
from ..operators.ingest.heterotypes import (
    DeriveRule,
    HeteroRawFiles,
    Relation,
    TypedSegment,
    derive_paths,
    etype_paths,
    find_hetero_files,
    ingest_typed_nodes,
    node_order,
    parse_derive,
    plan_derive,
    relations,
    write_typed_feature_shard,
)
from ..operators.ingest.raw import (
    EDGE_CSC_BYTES,
    RAW_DIRS,
    SPILL_DIR,
    csc_edge_cap,
    edge_chunk_rows,
    feature_batch_rows,
    fine_bucket_width,
    finish_store,
    group_buckets,
    shard_rows_for,
    store_manifest,
    table_num_rows,
)
from .ingest import IngestResult, allocate_total, ingest_config, store_shard_name, up_to_date, with_pieces
from .progress import compute

__all__ = ["run_hetero_ingest"]


def run_hetero_ingest(raw: str | os.PathLike[str], out: str | os.PathLike[str], *, budget: int, shard_rows: int | None = None,
                      to_undirected: bool = False, allow_nonfinite: bool = False, force: bool = False,
                      derive: Sequence[str] = ()) -> IngestResult:
    """Ingest the typed raw dataset `raw` (it has ``hetero.json``) into the typed store `out`, as Dask tasks on
    the active scheduler. `run_ingest` calls this for a typed dataset, its options checked.

    Args:
        raw: the raw dataset directory.
        out: the store directory to create (or replace).
        budget: bytes one task may use.
        shard_rows: rows per feature shard of the global table (default: from the budget).
        to_undirected: PyG's ``ToUndirected`` (`heterotypes.relations`).
        allow_nonfinite: accept NaN/inf feature values.
        force: rebuild even when `out` is up to date, and replace `out` even when it is not a store.
        derive: derive rules, ``TYPE=mean:SRC__REL__DST`` (`heterotypes.parse_derive`).

    Raises:
        InputError: bad input, naming the file, row and type; an edge file with edge features or a split column.
        ConfigError: a bad derive rule.
        DiskFullError: the store's filesystem has no room for it.
    """
    t0 = time.perf_counter()
    files = find_hetero_files(raw)
    out_p = Path(out).absolute()
    if out_p == files.root or files.root.is_relative_to(out_p) \
            or any(out_p.is_relative_to(files.root / d) for d in RAW_DIRS):
        raise ConfigError("OUT", f"{out_p} overlaps the raw dataset {files.root}; choose a separate directory")
    for et in files.spec.edge_types:
        if files.edges[et]:
            schema = edge_schema(files.edges[et])
            if schema.attr_dtype is not None or schema.split:
                column = "an edge_attr" if schema.attr_dtype is not None else "a split"
                raise InputError(files.edges[et][0], f"{column} column: a typed raw dataset cannot have edge features "
                                                     "or a link split yet (drop the column)")
    rels = relations(files, to_undirected)
    featured_raw = {t for t in files.spec.names if files.features[t]}
    if not featured_raw:
        raise InputError(files.root / "features", "no node type has features: a typed store needs at least one "
                                                  "type with feature rows")
    rules = plan_derive([parse_derive(t) for t in derive], files.spec, [r.key for r in rels], featured_raw)
    inputs = {files.relative(p): fingerprint(p) for p in files.all()}
    input_bytes = sum(p.stat().st_size for p in files.all())
    config = {**ingest_config(memory_budget=budget, shard_rows=shard_rows, to_undirected=to_undirected,
                              allow_nonfinite=allow_nonfinite), "derive": [r.text for r in rules]}
    existing = check_replaceable(out_p, force, STORE_KIND)
    previous = None if force else up_to_date(existing, inputs, config)
    if previous is not None:
        return IngestResult.of(out_p, True, previous, input_bytes, time.perf_counter() - t0)
    with staging_dir(out_p) as stage:
        (stage / "features").mkdir()
        (stage / SPILL_DIR).mkdir()
        plan = _TypedPlan(files, stage, rels, rules, budget, uuid.uuid4().hex[:8], allow_nonfinite, out_p)
        manifest = plan.build(*plan.scan(), shard_rows=shard_rows, inputs=inputs, config=config)
    return IngestResult.of(out_p, False, manifest, input_bytes, time.perf_counter() - t0)


@dataclass(frozen=True)
class _CscJob:
    """One CSC to build: a relation's edges grouped by destination into `folder` (``etypes/<k>`` or
    ``derive/<k>``), destinations `num_dst` ids of one type, sources `num_src` of another."""

    folder: str
    rel: Relation
    num_dst: int
    num_src: int
    bucket_width: int
    num_buckets: int

    @property
    def packed(self) -> bool:
        return is_packed(max(self.num_dst, self.num_src))

    @property
    def names(self) -> dict[str, str]:
        """The crc pieces' file names (as `csc_group` names them) -> the store-relative files."""
        return {"indptr.npy": f"{self.folder}/indptr.npy", "indices.npy": f"{self.folder}/indices.npy"}


def _store_pieces(names: dict[str, str], pieces: Sequence[Piece]) -> list[Piece]:
    """Pieces named by a file's name as the topology operators name them, named by the store-relative file
    instead; those of scratch files dropped."""
    return [(names[p[0]], *p[1:]) for p in pieces if p[0] in names]


def _csc(names: dict[str, str], **kwargs: Any) -> tuple[int, list[Piece]]:
    kept, pieces = with_pieces(csc_group, **kwargs)
    return kept, _store_pieces(names, pieces)


def _compact(g: int, topo: list[tuple[int, list[Piece]]], names: dict[str, str], **kwargs: Any
             ) -> tuple[int, list[Piece]]:
    """Group g's kept indices moved to their final offset (`flow.ingest._compact`, the pieces renamed)."""
    kept = [k for k, _ in topo]
    pieces: list[Piece] = []
    compact_group(kept=kept[g], final_base=int(sum(kept[:g])), pieces=pieces, **kwargs)
    return kept[g], [*topo[g][1], *_store_pieces(names, pieces)]


@dataclass
class _TypedPlan:
    """The graph of one typed ingest run."""

    files: HeteroRawFiles
    stage: Path
    rels: list[Relation]
    rules: list[DeriveRule]
    budget: int
    token: str
    allow_nonfinite: bool
    out: Path

    def key(self, name: str, i: int | None = None) -> str:
        return f"ingest-{name}-{self.token}" if i is None else f"ingest-{name}-{i}-{self.token}"

    @property
    def derived(self) -> dict[str, DeriveRule]:
        return {r.type: r for r in self.rules}

    @property
    def order(self) -> list[str]:
        """Node types in global id order."""
        return node_order(self.files.spec, {t for t in self.files.spec.names if self.files.features[t]}
                          | set(self.derived))

    @property
    def offsets(self) -> dict[str, int]:
        counts = [self.files.spec.count(t) for t in self.order]
        return dict(zip(self.order, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64).tolist()))

    def _job(self, folder: str, rel: Relation) -> _CscJob:
        count = self.files.spec.count
        src, _, dst = rel.key
        est = sum(table_num_rows(Path(p)) for p, _ in rel.sources) * (2 if rel.undirected else 1)
        width = fine_bucket_width(count(dst), est, self.budget)
        return _CscJob(folder, rel, count(dst), count(src), width, math.ceil(count(dst) / width))

    @property
    def jobs(self) -> list[_CscJob]:
        """Every CSC: each edge type's, then each derivation's reversed one."""
        out = [self._job(str(Path(etype_paths(k)[0]).parent), rel) for k, rel in enumerate(self.rels)]
        keys = [r.key for r in self.rels]
        for r in self.rules:
            if r.indptr != etype_paths(keys.index(r.edge_type))[0]:
                k = keys.index(r.edge_type)
                out.append(self._job(str(Path(derive_paths(k)[0]).parent), self.rels[k].reversed()))
        return out

    # ------------------------------------------------------------------ phase 1
    def scan(self) -> tuple[tuple[dict[str, Any], list[Piece]], dict[str, list[FeatureFile]], list[_CscJob],
                            list[list[EdgeSpill]]]:
        """Run the node build and every feature and edge scan side by side."""
        d = dask.delayed
        spec, offsets = self.files.spec, self.offsets
        n = sum(t.num_nodes for t in spec.node_types)
        types = [(t, offsets[t], spec.count(t), [str(p) for p in self.files.nodes[t]]) for t in self.order]
        nodes = d(with_pieces, pure=False)(ingest_typed_nodes, types, n, self.stage, batch_rows=1 << 20,
                                            dask_key_name=self.key("nodes"))
        feats: list[Any] = []
        owners: list[str] = []
        for t in self.order:
            for p in self.files.features[t]:
                feats.append(d(scan_features, pure=False)(p, spec.count(t), node_type=t,
                                                          dask_key_name=self.key("scan-feature", len(feats))))
                owners.append(t)
        jobs = self.jobs
        edges: list[Any] = []
        per_job: list[int] = []
        chunk = edge_chunk_rows(self.budget)
        for j, job in enumerate(jobs):
            src, _, dst = job.rel.key
            for i, (path, rev) in enumerate(job.rel.sources):
                spill = self.stage / SPILL_DIR / f"edges-{j}-{i:05d}.bin"
                edges.append(d(scan_edges, pure=False)(
                    path, spill, num_nodes=job.num_dst, num_src=job.num_src, bucket_width=job.bucket_width,
                    num_buckets=job.num_buckets, chunk_rows=chunk, to_undirected=job.rel.undirected,
                    packed=job.packed, reverse=rev, types=(dst, src) if rev else (src, dst),
                    dask_key_name=self.key("scan-edges", len(edges))))
            per_job.append(len(job.rel.sources))
        results = compute([nodes, *feats, *edges], desc="ingest: scan")
        by_type: dict[str, list[FeatureFile]] = {t: [] for t in self.order}
        for t, f in zip(owners, results[1:1 + len(feats)]):
            by_type[t].append(f)
        spills = results[1 + len(feats):]
        bounds = np.concatenate([[0], np.cumsum(per_job)]).astype(int).tolist()
        return results[0], by_type, jobs, [spills[bounds[j]:bounds[j + 1]] for j in range(len(jobs))]

    # ------------------------------------------------------------------ phase 2
    def _topology(self, j: int, job: _CscJob, spills: list[EdgeSpill]) -> tuple[list[Any], int]:
        """The delayed CSC tasks of one job (each: (kept, pieces)) and the edges its scans spilled."""
        d = dask.delayed
        (self.stage / job.folder).mkdir(parents=True, exist_ok=True)
        n = job.num_dst
        counts = np.sum([s.bucket_counts() for s in spills], axis=0) if spills else np.zeros(job.num_buckets, np.int64)
        scanned = int(counts.sum())
        groups = group_buckets(counts, csc_edge_cap(self.budget, EDGE_CSC_BYTES))
        index_dtype = indices_dtype(job.num_src)
        compact = job.rel.undirected
        indptr = d(allocate_npy, pure=False)(self.stage / job.folder / "indptr.npy", np.int64, n + 1,
                                             dask_key_name=self.key(f"alloc-indptr-r{j}"))
        target = self.stage / (f"{SPILL_DIR}/indices-scratch-{j}.npy" if compact else f"{job.folder}/indices.npy")
        indices = d(allocate_npy, pure=False)(target, index_dtype, scanned,
                                              dask_key_name=self.key(f"alloc-indices-r{j}"))
        bases = np.concatenate([[0], np.cumsum([counts[a:b].sum() for a, b in groups])]).astype(np.int64)
        ranges = [(a * job.bucket_width, min(b * job.bucket_width, n)) for a, b in groups]
        topo = []
        for g, (a, b) in enumerate(groups):
            runs = [(s.path, s.offsets[:, a], s.offsets[:, b]) for s in spills
                    if len(s.offsets) and (s.offsets[:, b] > s.offsets[:, a]).any()]
            topo.append(d(_csc, pure=False)(job.names, runs=runs, lo=ranges[g][0], hi=ranges[g][1],
                                            base=int(bases[g]), indptr_path=indptr, indices_path=indices,
                                            index_dtype=index_dtype, packed=job.packed, dedupe=compact,
                                            undirected=compact, dask_key_name=self.key(f"csc-r{j}", g)))
        if compact:
            final = d(allocate_total, pure=False)(self.stage / job.folder / "indices.npy", index_dtype, topo,
                                                   dask_key_name=self.key(f"alloc-indices-final-r{j}"))
            topo = [d(_compact, pure=False)(g, topo, job.names, scratch_path=indices, scratch_base=int(bases[g]),
                                            indices_path=final, indptr_path=indptr, lo=ranges[g][0],
                                            hi=ranges[g][1], index_dtype=index_dtype,
                                            dask_key_name=self.key(f"compact-r{j}", g))
                    for g in range(len(groups))]
        return topo, scanned

    def _layout(self, feature_files: dict[str, list[FeatureFile]]) -> list[dict[str, Any]]:
        """The node types' entries (`HeteroLayout`'s), each featured type's width and dtype checked."""
        schema: dict[str, tuple[int, str]] = {}
        for t in self.order:
            if feature_files.get(t):
                dtype, dim = check_same_schema(feature_files[t])
                schema[t] = (dim, dtype.name)
        for r in self.rules:                # derivation order: a neighbour's schema is known first
            schema[r.type] = schema[r.neighbour]
        offsets, count = self.offsets, self.files.spec.count
        return [{"name": t, "offset": offsets[t], "count": count(t), "dim": schema.get(t, (0, None))[0],
                 "dtype": schema.get(t, (0, None))[1],
                 "derived": self.derived[t].entry() if t in self.derived else None} for t in self.order]

    def build(self, nodes: tuple[dict[str, Any], list[Piece]], feature_files: dict[str, list[FeatureFile]],
              jobs: list[_CscJob], spills: list[list[EdgeSpill]], *, shard_rows: int | None,
              inputs: dict[str, str], config: dict[str, Any]) -> dict[str, Any]:
        """Build every CSC and the feature table, derive, and write the manifest; return it."""
        d = dask.delayed
        node_entries = self._layout(feature_files)
        featured = [e for e in node_entries if e["dim"] > 0]
        dtype = np.result_type(*[np.dtype(e["dtype"]) for e in featured])
        dim = max(e["dim"] for e in featured)
        row_bytes = dim * dtype.itemsize
        table_rows = sum(e["count"] for e in featured)
        rows = int(shard_rows) if shard_rows is not None else shard_rows_for(self.budget, row_bytes, table_rows)
        num_shards = math.ceil(table_rows / rows)

        topo_of: list[list[Any]] = []
        need = table_rows * row_bytes + num_shards * ALIGN
        for j, job in enumerate(jobs):
            tasks, scanned = self._topology(j, job, spills[j])
            topo_of.append(tasks)
            need += (job.num_dst + 1) * 8 + 2 * ALIGN \
                + scanned * indices_dtype(job.num_src).itemsize * (2 if job.rel.undirected else 1)
        check_free_space({self.out: need})

        shards = []
        for p in range(num_shards):
            lo, hi = p * rows, min(table_rows, (p + 1) * rows)
            segments = []
            for e in featured:      # a loop per type
                a, b = max(lo, e["offset"]), min(hi, e["offset"] + e["count"])
                if b <= a:
                    continue
                t, llo, lhi = e["name"], a - e["offset"], b - e["offset"]
                units = () if e["derived"] else tuple(units_overlapping(feature_files[t], llo, lhi))
                segments.append(TypedSegment(t, llo, lhi, a - lo, e["dim"], units,
                                             str(self.files.root / "features" / t)))
            shards.append(d(with_pieces, pure=False)(
                write_typed_feature_shard, segments, self.stage / store_shard_name(p), row_start=lo, rows=hi - lo,
                dtype=dtype, dim=dim, allow_nonfinite=self.allow_nonfinite,
                batch_rows=feature_batch_rows(self.budget, row_bytes), crc_name=store_shard_name(p),
                dask_key_name=self.key("feature-shard", p)))
        flat = [t for tasks in topo_of for t in tasks]
        done = compute([*flat, *shards], desc="ingest: build")
        topo_done, shard_done = done[:len(flat)], done[len(flat):]

        pieces: list[Piece] = list(nodes[1])
        kept_of: list[int] = []
        at = 0
        for j, job in enumerate(jobs):
            mine = topo_done[at:at + len(topo_of[j])]
            at += len(topo_of[j])
            kept = int(sum(k for k, _ in mine))
            kept_of.append(kept)
            names = job.names
            add_pieces(pieces, names["indptr.npy"], 0,
                       np.frombuffer(aligned_npy_header(np.dtype(np.int64), (job.num_dst + 1,)), np.uint8))
            add_pieces(pieces, names["indices.npy"], 0,
                       np.frombuffer(aligned_npy_header(indices_dtype(job.num_src), (kept,)), np.uint8))
            for _, written in mine:
                pieces.extend(written)
        for _, written in shard_done:
            pieces.extend(written)

        edge_entries = []
        offset = 0
        for k, rel in enumerate(self.rels):
            indptr, indices = etype_paths(k)
            edge_entries.append({"src": rel.key[0], "rel": rel.key[1], "dst": rel.key[2], "indptr": indptr,
                                 "indices": indices, "indices_dtype": indices_dtype(jobs[k].num_src).name,
                                 "num_edges": kept_of[k], "edge_offset": offset})
            offset += kept_of[k]
        summary = nodes[0]
        labelled = summary["labelled"]
        layout = HeteroLayout({"node_types": node_entries, "edge_types": edge_entries,
                               "target": labelled[0] if len(labelled) == 1 else None}, str(self.stage))
        features = {"dtype": dtype.name, "dim": dim, "row_bytes": row_bytes, "shard_rows": rows,
                    "arrow_type": FeatureFile("", dtype.name, dim, (), 0).arrow_type,
                    "shards": [{"path": store_shard_name(p), **s} for p, (s, _) in enumerate(shard_done)]}
        manifest = store_manifest(num_nodes=layout.num_nodes, num_edges=layout.num_edges,
                                  indices_dtype=edge_entries[0]["indices_dtype"] if edge_entries else "int32",
                                  nodes=summary, features=features, inputs=inputs, config=config)
        manifest["topology"] = None
        manifest["hetero"] = layout.to_entry()
        if not self.rules:
            manifest = record_checksums(self.stage, manifest, pieces)
            finish_store(self.stage, manifest)
            return manifest
        # a provisional manifest (in the staging directory, never published) describes the store to the
        # derivation, without checksums: a rule may read rows an earlier rule has just derived. Then the
        # checksums are taken (the derived rows' shards read afresh) and the manifest written again, last
        finish_store(self.stage, manifest)
        seconds = _derive(self.stage, manifest, self.rules, self.budget)
        ranges = [(t.offset, t.stop) for t in layout.node_types if t.derived]
        rewritten = {s["path"] for s in features["shards"]
                     if any(a < s["row_start"] + s["rows"] and s["row_start"] < b for a, b in ranges)}
        manifest = record_checksums(self.stage, {**manifest, "stats": {"derive_seconds": round(seconds, 3)}},
                                    [p for p in pieces if p[0] not in rewritten])
        write_manifest(self.stage, manifest)
        return manifest


def _derive(stage: Path, manifest: dict[str, Any], rules: list[DeriveRule], budget: int) -> float:
    """Run the derivation (`flow.derive.derive_features`) over the staged store; its wall seconds."""
    try:
        from .derive import derive_features
    except ImportError as e:
        raise ConfigError("derive", f"this diskflow has no feature derivation ({e}); ingest without --derive") from e
    t0 = time.perf_counter()
    derive_features(stage, manifest, rules, budget)
    return time.perf_counter() - t0

