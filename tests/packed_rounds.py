"""A sampled, planned round of a store, and its packed dataset, as the preparation builds them: shared by the
tests of packing (`tests/operators/prepare/test_pack.py`) and of verification (`.../formats/test_verify.py`)."""
from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from diskflow.native.constants import ALIGN
from diskflow.operators.formats.hashing import config_hash
from diskflow.operators.formats.manifest import write_manifest
from diskflow.operators.formats.packed import (
    ROUND_DIR,
    dcache_name,
    file_crc,
    index_name,
    part_name,
    samples_name,
)
from diskflow.operators.formats.plan import SRC_MISS, BatchPlan
from diskflow.operators.formats.samples import read_n_ids
from diskflow.operators.formats.store import Store
from diskflow.operators.prepare.count import count_superbatch, dense_counts, merge_counts
from diskflow.operators.prepare.diskcache import build_layout
from diskflow.operators.prepare.pack import pack_shard, prepare_targets
from diskflow.operators.prepare.plan import initial_fill, plan_belady
from diskflow.operators.prepare.route import route_superbatch, segment_offsets, write_index
from diskflow.operators.prepare.superbatch import round_layout, sample_superbatch
from diskflow.operators.prepare.tiers import hottest

BATCH, SUPERBATCH, EPOCHS, FANOUTS, SEED = 200, 4, 2, (5, 5), 3
GPU_ROWS, CPU_ROWS = 150, 300


@dataclass
class Round:
    store: Path
    samples: Path                       # a round directory holding samples/{key}.arrow
    refs: list                          # SuperbatchRef per superbatch
    n_ids: list[list[np.ndarray]]       # per superbatch, per batch
    plans: list[list[BatchPlan]]        # per superbatch, per batch (real Belady planner)
    gpu_ids: np.ndarray                 # sorted (the planner's GPU slot = position)
    cpu_ids: np.ndarray                 # CPU tier at round start

    def misses(self) -> list[np.ndarray]:
        return [n[p.src == SRC_MISS] for ns, ps in zip(self.n_ids, self.plans) for n, p in zip(ns, ps)]


def sample_round(store: Path, out: Path) -> Round:
    """Sample a 2-epoch round of tiny_store and plan it with static GPU + Belady CPU tiers."""
    refs = round_layout(Store(store).split_ids("train").shape[0], BATCH, SUPERBATCH, EPOCHS)
    paths = [out / ROUND_DIR / samples_name(r.key) for r in refs]
    for ref, path in zip(refs, paths):
        sample_superbatch(store, path, ref, BATCH, FANOUTS, SEED, num_threads=1)
    n_ids = [read_n_ids(p) for p in paths]
    freq = dense_counts(merge_counts(*(count_superbatch(p) for p in paths)), Store(store).num_nodes)
    gpu = np.sort(hottest(freq, GPU_ROWS))
    cache = initial_fill(n_ids[0] + (n_ids[1] if len(n_ids) > 1 else []), CPU_ROWS, freq, gpu)
    cpu_ids, plans = cache.copy(), []
    for k, batches in enumerate(n_ids):
        sp = plan_belady(batches, n_ids[k + 1] if k + 1 < len(n_ids) else [], CPU_ROWS, cache, gpu, freq)
        plans.append(sp.batches)
        cache = sp.final_cache
    return Round(store, out, refs, n_ids, plans, gpu, cpu_ids)


def build_packed(rnd: Round, out: Path, layout) -> dict:
    """Pack `rnd` into `out` (a copy of its samples + everything packing writes + a manifest)."""
    shutil.copytree(rnd.samples / ROUND_DIR / "samples", out / ROUND_DIR / "samples")
    sbs = [(r.key, r.round_first_batch, n, p) for r, n, p in zip(rnd.refs, rnd.n_ids, rnd.plans)]
    res = pack_round(rnd.store, out, sbs, layout, rnd.gpu_ids, rnd.cpu_ids)
    store = Store(rnd.store)
    write_manifest(out, {
        "format": "diskflow-packed", "version": 1, "dtype": str(store.feature_dtype), "dim": store.feature_dim,
        "row_bytes": store.row_bytes, "num_nodes": store.num_nodes, "num_shards": len(store.shards),
        "store": {"path": str(rnd.store), "manifest_hash": config_hash(store.manifest)},
        "round": {"epochs": EPOCHS, "batches": sum(r.num_batches for r in rnd.refs),
                  "superbatches": [{"key": r.key, "epoch": r.epoch, "index": r.index, "batches": r.num_batches,
                                    "first_batch": r.round_first_batch} for r in rnd.refs]},
        "files": res["files"],
    })
    return res


def tight_layout(rnd: Round, row_bytes: int, num_shards: int):
    """A disk-cache layout: a budget between 'one segment' and 'everything packed'."""
    misses = rnd.misses()
    pad = num_shards * (ALIGN - 1)
    packed_only = build_layout(misses, row_bytes, 1 << 40, pad).search.packed_only_bytes
    distinct = np.unique(np.concatenate(misses)).shape[0] * row_bytes + len(misses) * pad + ALIGN
    return build_layout(misses, row_bytes, (packed_only + distinct) // 2, pad)


def pack_round(store_path: str | os.PathLike[str], packed_dir: str | os.PathLike[str],
               superbatches: Sequence[tuple[str, int, Sequence[np.ndarray], Sequence[Any]]], layout: Any,
               gpu_ids: np.ndarray, cpu_ids: np.ndarray, work_dir: str | os.PathLike[str] | None = None
               ) -> dict[str, Any]:
    """Route, pack and index a whole round in this process, with the operators `flow.prepare` spreads over
    Dask tasks (route_superbatch, pack_shard, write_index), so a test packs a round of its own plans.

    Writes everything of the packed dataset except the samples and the manifest: the tier
    files, ``round-0/part-*.bin``, ``round-0/dcache-*``, ``round-0/index/*.arrow``.

    Args:
        store_path: the ingested store.
        packed_dir: the packed dataset directory being built.
        superbatches: per superbatch in round order, ``(key, first_batch, n_ids, batch_plans)``.
        layout: the round's `DiskCacheLayout`, or None for packed only.
        gpu_ids: node per GPU slot; cpu_ids: node per CPU slot at round start (-1 empty).
        work_dir: where the routing files go (default ``packed_dir/round-0/route``; removed after).

    Returns:
        ``{"files": {"parts": [{path, bytes}], "dcache": [{path, rows, crc}]}, "seg_rows", "pack": [per-shard
        results], "routes": [per-superbatch results]}``; paths are relative to `packed_dir`.
    """
    store = Store(store_path)
    root = Path(packed_dir)
    rnd = root / ROUND_DIR
    work = Path(work_dir) if work_dir is not None else rnd / "route"
    P = len(store.shards)
    routes = [route_superbatch(key, n_ids, plans, layout, first, store.shard_rows, P, work / f"{key}.npz")
              for key, first, n_ids, plans in superbatches]
    seg_rows = np.concatenate([r["seg_rows"] for r in routes]) if routes else np.zeros((0, P), np.int64)
    offsets, part_bytes = segment_offsets(seg_rows, store.row_bytes)
    cache_nodes = [] if layout is None or layout.segment_size is None else list(layout.cache_nodes)
    tiers, caches = prepare_targets(root, gpu_ids, cpu_ids, cache_nodes, store.feature_dtype, store.feature_dim)
    route_paths = [r["path"] for r in routes]
    results = [pack_shard(store_path, p, route_paths, offsets, rnd / part_name(p), dcache_targets=caches,
                          tier_targets=tiers) for p in range(P)]
    crc = np.stack([r["crc"] for r in results], axis=1) if results else np.zeros((seg_rows.shape[0], 0), np.int64)
    for r in routes:
        sl = slice(r["first_batch"], r["first_batch"] + r["batches"])
        write_index(r["key"], r["path"], offsets[sl], crc[sl], rnd / index_name(r["key"]))
    dcache = [{"path": f"{ROUND_DIR}/{dcache_name(g)}", "rows": len(nodes),
               "crc": file_crc(rnd / dcache_name(g), 0, len(nodes) * store.row_bytes)}
              for g, nodes in enumerate(cache_nodes)]
    parts = [{"path": f"{ROUND_DIR}/{part_name(p)}", "bytes": int(part_bytes[p])} for p in range(P)]
    if work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return {"files": {"parts": parts, "dcache": dcache}, "seg_rows": seg_rows, "pack": results, "routes": routes}
