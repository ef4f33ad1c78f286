"""The preparation's own Dask tasks: thin wrappers over the operators that read and write the cache's and the
packed dataset's files (a plan file, the disk-cache layout, a superbatch's routes and index), so that each
runs where the scheduler puts it and only paths and figures travel. The graph's sample, count, tier, trace
and plan tasks are `flow.graph`'s.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from ...operators.formats import packed as packed_fmt
from ...operators.formats.atomic import atomic_path
from ...operators.formats.packed import SRC_STORE
from ...operators.formats.packedindex import IndexRecord, patch_segments, write_index_file
from ...operators.formats.plan import SRC_MISS, SuperbatchPlan, load_plan, save_plan
from ...operators.formats.samples import read_n_ids
from ...operators.prepare.diskcache import build_layout
from ...operators.prepare.route import route_superbatch, write_index
from ...operators.prepare.superbatch import SuperbatchRef
from ..graph import PlanResult

__all__ = ["completed", "index_task", "route_task", "save_plan_task", "search_task", "store_index_task"]


def completed(result: Any) -> None:
    """A task's completion without its result: what a task that must only come after it waits on, so no
    data moves to it (on a cluster this runs where `result` is)."""


def save_plan_task(plan: PlanResult, out_path: str, after: Any = None) -> dict:
    """Write one plan file (the plan stage's cache) and return its figures. `after`: a task's result this one
    waits for (ordering only)."""
    save_plan(out_path, SuperbatchPlan(plan.batches, plan.final_cache, plan.stats["hits"], plan.stats["misses"],
                                       plan.stats["gpu_hits"]), parents=False)
    misses = np.array([b.misses for b in plan.batches], dtype=np.int64)
    chain_s = plan.timing["plan"]["t1"] - plan.timing["plan"]["t0"]    # this superbatch's link of the serial chain
    return {"path": out_path, **plan.stats, "batch_misses": misses, "chain_s": chain_s}


def _misses_of(sample_path: str, plan_path: str) -> list[np.ndarray]:
    plan = load_plan(plan_path)
    return [n[b.src == SRC_MISS] for n, b in zip(read_n_ids(sample_path), plan.batches)]


def search_task(sample_paths: list[str], plan_paths: list[str], row_bytes: int, disk_budget: int,
                 pad_per_batch: int, k: int, seed: int, shard_rows: int, out_path: str) -> dict:
    """The segmented disk-cache layout (DiskGNN §5.1) for the whole round.

    Only needed when packing every miss exceeds the budget. The caller decides that from a
    padding bound; the exact packed bytes (each (batch, shard) segment padded to 4096) are
    checked here first, so a round whose packed rows fit is not segmented (segment_size None,
    no layout file written).
    """
    import pickle

    misses = [m for s, p in zip(sample_paths, plan_paths) for m in _misses_of(s, p)]
    exact = sum(int(packed_fmt.padded(np.bincount(m // shard_rows) * row_bytes).sum()) for m in misses)
    if exact <= disk_budget:
        return {"segment_size": None, "disk_bytes": exact, "segments": 0}
    layout = build_layout(misses, row_bytes, disk_budget, pad_bytes_per_batch=pad_per_batch, k=k, seed=seed)
    with atomic_path(out_path, parents=False) as tmp, open(tmp, "wb") as f:
        pickle.dump(layout, f, protocol=pickle.HIGHEST_PROTOCOL)
    return {"segment_size": layout.segment_size, "disk_bytes": int(layout.disk_bytes),
            "segments": len(layout.cache_nodes)}


def route_task(ref: SuperbatchRef, sample_path: str, plan_path: str, layout_path: str | None,
                shard_rows: int, num_shards: int, out_path: str, planned: SuperbatchPlan | None = None,
                after: Any = None) -> dict:
    """Route one superbatch: its plan from the plan task (`planned`, same graph) or from its file. Its index is
    written now too (beside the routing file, ``.index.arrow``), completed by `index_task` after packing:
    in the plan phase the route tasks run beside the serial chain, on CPUs it leaves idle. `after`: a
    task's result this one waits for (ordering only)."""
    import pickle

    layout = None
    if layout_path is not None:
        with open(layout_path, "rb") as f:
            layout = pickle.load(f)
    plan = planned if planned is not None else load_plan(plan_path)
    return route_superbatch(ref.key, read_n_ids(sample_path), plan.batches, layout, ref.round_first_batch,
                            shard_rows, num_shards, out_path, epoch=ref.epoch, parents=False,
                            index_path=str(Path(out_path).with_suffix(".index.arrow")))


def store_index_task(ref: SuperbatchRef, sample_path: str, plan_path: str, num_shards: int, out_path: str) -> dict:
    """Ginex-style index: every miss is read from the store row by row (src STORE, idx = node id)."""
    plan = load_plan(plan_path)
    records = []
    zeros = np.zeros(num_shards, np.int64)
    for j, (n_id, b) in enumerate(zip(read_n_ids(sample_path), plan.batches)):
        src = b.src.astype(np.uint8).copy()
        idx = b.idx.astype(np.int64).copy()
        miss = src == SRC_MISS
        src[miss] = SRC_STORE
        idx[miss] = n_id[miss]
        records.append(IndexRecord(ref.round_first_batch + j, ref.epoch, src, idx, b.insert_pos, b.insert_slot,
                                   zeros, zeros, zeros.astype(np.uint32), -1))
    write_index_file(out_path, records, {"key": ref.key})
    return {"key": ref.key, "store_rows": int(sum(int((r.src == SRC_STORE).sum()) for r in records))}


def index_task(route: dict, offsets: np.ndarray, crc: np.ndarray, out_path: str) -> str:
    """Complete a routed superbatch's index with its segments' offsets and checksums and move it into place
    (or, for a route without one, write it from the routing file)."""
    if "index_path" not in route:
        write_index(route["key"], route["path"], offsets, crc, out_path)
        return out_path
    patch_segments(route["index_path"], route["index_at"], offsets, crc)
    os.replace(route["index_path"], out_path)
    return out_path


