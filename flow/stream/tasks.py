"""The stream's own tasks, as they run on the workers: its sink of the preparation graph (`flow.graph`: sample,
count, tiers, trace and plan) — the manifest header and pack on CPU workers — and ship, train and finish on the
GPU worker."""
from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ...operators.formats.packed import EDGE_ROWS
from ...operators.formats.rowcodec import RowCodec
from ...operators.formats.store import Store, open_table
from ...operators.prepare.edgerows import edge_samples_bytes
from ...operators.prepare.superbatch import SuperbatchRef
from ...operators.stream.pack import Bundle, nest_bundle, pack_base, pack_superbatch, stream_header
from ..dashboard.publish import (
    BYTES,
    PACKED_READ,
    STORE_READ,
    WRITTEN,
    measure,
    measure_rows,
    publish,
    stage_delta,
)
from ..graph import MAX_ROWS_MARGIN, PlanResult, SampleResult, Tiers, TierSpec, stamp
from ..plugin import PLUGIN_NAME, DiskflowPlugin, GpuStateLost
from .config import StreamStopped

__all__ = ["EdgeSplit", "edge_sample_task", "edge_split_task", "final_cache_task", "finish_task", "group_master_task",
           "header_task", "join_group_task", "pack_base_task", "pack_task", "probe_task", "select_task", "ship_task",
           "train_task", "worker_table"]

# ---------------------------------------------------------------------------- tasks (run on workers)

def _worker() -> Any:
    from distributed import get_worker

    return get_worker()


def _plugin() -> DiskflowPlugin:
    w = _worker()
    plugin = w.plugins.get(PLUGIN_NAME)
    if plugin is None:
        raise StreamStopped(f"worker {w.address} has no {PLUGIN_NAME} plugin (registered by the driver)")
    return plugin


def _local_tmp() -> str | None:
    """A temp directory inside the worker's local directory (each worker its own)."""
    with contextlib.suppress(ValueError):
        d = Path(_worker().local_directory) / "diskflow-tmp"
        d.mkdir(parents=True, exist_ok=True)
        return str(d)
    return None


def header_task(store_path: str, tiers: Tiers, config: dict[str, Any], round_batches: int, epochs: int,
                edges: dict[str, Any] | None = None, codec: RowCodec | None = None) -> dict[str, Any]:
    """The manifest fields every superbatch directory of the stream shares (`stream_header`), once the tiers are
    known; `store_path` may name a row table (the edge rows'); `edges`: the manifest's entry of the edge rows
    the superbatches carry (`EdgeSplit.entry`); `codec`: the rows are encoded."""
    header = stream_header(open_table(store_path), config, tiers.figures["gpu_rows"], tiers.figures["cpu_rows"],
                           round_batches, epochs, codec)
    if edges is not None:
        header["edges"] = edges
    return header


@dataclass(frozen=True)
class EdgeSplit:
    """A streamed lane's budgets split between node and edge rows (`flow.prepare.edges.split_budgets`): each
    table's tier spec and the manifest entry that tells the loader the edge rows' part."""

    nodes: TierSpec
    edges: TierSpec
    entry: dict[str, Any]


def edge_sample_task(sample: SampleResult, num_rows: int) -> SampleResult:
    """A superbatch's edge-row samples (its batches' ``e_id`` as the ids of a table of `num_rows` edge rows,
    `edgerows.edge_samples_bytes`), held in memory as the stream's samples are."""
    t0 = time.time()
    if sample.data is None:
        raise ValueError(f"edge samples of {sample.key}: the samples must travel inline, not as {sample.path}")
    data, summary = edge_samples_bytes(sample.data, num_rows, sample.key)
    return SampleResult(sample.key, np.frombuffer(data, np.uint8), summary, {**sample.timing, "edge": stamp(t0)})


def edge_split_task(store_path: str, edge_table: str, first: list[SampleResult], edge_first: list[SampleResult],
                    cfg: Any, spec: TierSpec) -> EdgeSplit:
    """Split a streamed lane's budgets (`spec`, from `cfg`) between its node rows and its edge rows by their
    shares of the bytes the first superbatches read (`first`, `edge_first`: those the tiers are counted
    over). Each table's staging is reserved for its largest batch there plus `MAX_ROWS_MARGIN`, as
    the tiers task reserves it."""
    from ..prepare.edges import split_budgets

    store, table = Store(store_path), open_table(edge_table)

    def seen(samples: list[SampleResult], rows: int) -> list[dict[str, Any]]:
        return [{**s.summary, "max_nodes": min(rows, math.ceil(int(s.summary["max_nodes"]) * MAX_ROWS_MARGIN))}
                for s in samples]

    node_bytes = sum(int(s.summary["accesses"]) for s in first) * store.row_bytes
    edge_bytes = sum(int(s.summary["accesses"]) for s in edge_first) * table.row_bytes
    share = edge_bytes / (edge_bytes + node_bytes) if edge_bytes else 0.0
    (gpu_n, cpu_n, _), (gpu_e, cpu_e, _) = split_budgets(cfg, share, (store, seen(first, store.num_nodes)),
                                                         (table, seen(edge_first, table.num_nodes)))
    entry = {"path": EDGE_ROWS, "dtype": table.feature_dtype.name, "dim": table.feature_dim,
             "row_bytes": table.row_bytes, "rows": table.num_nodes, "read_share": share, "gpu_memory": gpu_e,
             "cpu_memory": cpu_e, "disk_budget": None}
    return EdgeSplit(replace(spec, gpu_memory=gpu_n, cpu_memory=cpu_n),
                     replace(spec, gpu_memory=gpu_e, cpu_memory=cpu_e, batch_size=0, fanouts=(), row_bytes=0), entry)


def select_task(sample: SampleResult, rank: int, world: int) -> SampleResult:
    """One GPU worker's share of a sampled superbatch: its batches at positions rank, rank + world, ...
    (`formats.samples.select_batches`), with the share's own summary."""
    from ...operators.formats.samples import read_n_ids, select_batches

    t0 = time.time()
    if sample.data is None:
        raise ValueError(f"select of {sample.key}: the samples must travel inline, not as {sample.path}")
    data, kept = select_batches(f"samples of {sample.key}", sample.data, rank, world)
    arr = np.frombuffer(data, np.uint8)
    sizes = [int(n.shape[0]) for n in read_n_ids(f"samples of {sample.key}", arr)]
    summary = {"key": sample.key, "batches": kept, "accesses": sum(sizes), "max_nodes": max(sizes, default=0),
               "lane": rank, "lanes": world}
    return SampleResult(sample.key, arr, summary, {**sample.timing, "select": stamp(t0)})


def final_cache_task(plan: PlanResult) -> Any:
    """The CPU tier a superbatch's plan leaves (what a checkpoint of a shared tier saves)."""
    return plan.final_cache


def group_master_task(run: str, world: int) -> tuple[str, int]:
    """On the first GPU worker: open the rendezvous of the run's process group (`DiskflowPlugin.group_master`)."""
    return _plugin().group_master(run, world)


def join_group_task(job: str, group: str, host: str, port: int, rank: int, world: int, timeout_s: float
                    ) -> dict[str, Any]:
    """On every GPU worker of a data-parallel run: join its process group (blocks until all ranks did)."""
    return _plugin().join_group(job, group, host, port, rank, world, timeout_s)


def pack_task(store: str, ref: SuperbatchRef, sample: SampleResult, plan: PlanResult, header: dict[str, Any],
              index: int, stage: str | None, run: str, share: tuple[int, int, int] | None = None,
              edges: tuple[str, SampleResult, PlanResult, dict[str, Any]] | None = None,
              codec: RowCodec | None = None) -> Bundle:
    """The stream's sink of the preparation graph: route and pack one superbatch into a bundle.

    `share` (rank, world, the superbatch's first batch in the round): a GPU worker's share of a
    superbatch planned for a CPU tier the workers share (``--cache shared``): `sample` holds its
    batches, `plan` the whole superbatch's, of which its batches' plans are packed, each numbered in
    the merged stream. `edges` (the edge table, its samples, plan and header): the superbatch's edge
    rows, packed from their own plan into the bundle's ``edges/``. `codec`: the node rows packed encoded."""
    t0 = time.time()
    url = f"{stage.rstrip('/')}/{run}/{ref.key}" if stage else None
    if sample.data is None:      # the stream keeps its samples in memory (`graph.sample_task` without out_path)
        raise ValueError(f"pack of {ref.key}: the samples must travel inline, not as {sample.path}")
    plans, order = plan.batches, None
    final: np.ndarray | None = plan.final_cache
    if share is not None:
        rank, world, first = share
        plans, final = plans[rank::world], None
        order = [first + i for i in range(rank, len(plan.batches), world)]
    bundle = pack_superbatch(store, ref, sample.data, plans, header, final_cache=final,
                             stream_index=index, url=url, tmp_dir=_local_tmp(), global_batches=order, codec=codec)
    read = int(bundle.meta["figures"]["store_read_bytes"])        # rows gathered from the store
    if edges is not None:
        table, esample, eplan, eheader = edges
        if esample.data is None:
            raise ValueError(f"pack of {ref.key}: the edge samples must travel inline, not as {esample.path}")
        inner = pack_superbatch(table, ref, esample.data, eplan.batches, eheader, final_cache=eplan.final_cache,
                                stream_index=index, url=f"{url}/{EDGE_ROWS}" if url else None, tmp_dir=_local_tmp())
        nest_bundle(bundle, EDGE_ROWS, inner)
        bundle.meta["figures"]["edges"] = inner.meta["figures"]
        read += int(inner.meta["figures"]["store_read_bytes"])
    timing = stamp(t0)
    bundle.meta.update(timing={**plan.timing, "pack": timing}, plan=plan.stats, index=index)
    bundle.meta["figures"]["store_read_bytes"] = read
    measure(STORE_READ, read, BYTES)
    publish("packed", job=run, index=index, key=ref.key, store_read_bytes=read, t=timing["t1"])
    return bundle


def pack_base_task(store: str, tiers: Tiers, stage: str | None, run: str, cpu_rows: bool = True,
                   edges: tuple[str, Tiers] | None = None, codec: RowCodec | None = None) -> Bundle:
    """The base bundle of a lane: its tiers' ids and rows (`cpu_rows` False: no CPU-tier rows, `pack_base`);
    `edges` (the edge table and its tiers): the edge rows' tiers too, under ``edges/``."""
    t0 = time.time()
    url = f"{stage.rstrip('/')}/{run}/base" if stage else None
    bundle = pack_base(store, tiers.gpu_ids, tiers.cpu_ids, url=url, cpu_rows=cpu_rows, codec=codec)
    read = _tier_bytes(tiers, cpu_rows, Store(store).row_bytes)
    if edges is not None:
        table, etiers = edges
        inner = pack_base(table, etiers.gpu_ids, etiers.cpu_ids, url=f"{url}/{EDGE_ROWS}" if url else None)
        nest_bundle(bundle, EDGE_ROWS, inner)
        read += _tier_bytes(etiers, True, open_table(table).row_bytes)
        bundle.meta["edge_tiers"] = etiers.figures
    bundle.meta.update(timing={"pack": stamp(t0)}, tiers=tiers.figures)
    measure(STORE_READ, read, BYTES)
    return bundle


def _tier_bytes(tiers: Tiers, cpu_rows: bool, row_bytes: int) -> int:
    """Bytes a base bundle reads of the store for `tiers`: the GPU tier's rows, and the CPU tier's (`cpu_rows`)."""
    rows = int(np.count_nonzero(np.asarray(tiers.gpu_ids) >= 0))
    rows += int(np.count_nonzero(np.asarray(tiers.cpu_ids) >= 0)) if cpu_rows else 0
    return rows * row_bytes


def probe_task() -> dict[str, Any]:
    """A GPU worker's description (`DiskflowPlugin.describe`) and its scratch disk's read floor, measured now
    (`flow.dashboard.floor`), which the diskflow page draws the run's disk throughput against."""
    from ..dashboard.floor import read_floor

    plugin = _plugin()
    info = plugin.describe()
    if plugin.is_gpu:
        info["floor_bps"] = read_floor(plugin.scratch)
        publish("floor", bps=info["floor_bps"])
    return info


def ship_task(run: str, bundle: Bundle, start_index: int, after: Any = None) -> dict[str, Any]:
    """Stage a bundle into the run's scratch directory on this (GPU) worker, verified, within the quota.

    `after` is the base bundle's ship result for a superbatch (its tier files are linked in).
    """
    from ...operators.stream.ship import drop_source, held_files, stage_bundle

    t0 = time.time()
    plugin = _plugin()
    job = plugin.open_job(run, start_index) if bundle.key == "base" else plugin.job(run)
    space = plugin.gpu_space()
    name = f"{run}/{bundle.key}"
    hold = held_files(bundle)       # index and samples: held in memory (the result) while the budget allows
    held_bytes = sum(bundle.sizes[rel] for rel in hold)
    if not space.try_hold(name, held_bytes):
        hold, held_bytes = [], 0
    try:
        space.reserve(name, bundle.nbytes - held_bytes)
        out = stage_bundle(bundle, job.root / bundle.key, base=None if bundle.key == "base" else job.base, hold=hold)
    except BaseException:
        space.release(name)
        raise
    disk = space.observe(job.root)
    drop_source(bundle)
    timing = stamp(t0)
    written = int(out.get("bytes", 0))
    measure(WRITTEN, written, BYTES)
    if "index" in bundle.meta:
        publish("shipped", job=run, index=int(bundle.meta["index"]), written_bytes=written, t=timing["t1"])
    return {**out, "disk_bytes": disk, "usage": space.usage(),
            "meta": {k: v for k, v in bundle.meta.items() if k != "timing"},
            "timing": {**bundle.meta.get("timing", {}), "ship": timing}}


def train_task(run: str, shipped: dict[str, Any], entry: dict[str, Any], cfg: Any, device: str,
               fingerprint: str, resume: dict[str, Any] | None, checkpoint: bool) -> dict[str, Any]:
    """Train one staged superbatch with the run's trainer (created by the first one), then discard it.

    The staged directory is deleted in the background (`ScratchSpace.discard`), so the next
    ``train`` task starts at once. ``entry["empty"]``: this data-parallel rank holds no batch of the
    superbatch and only takes part in its steps; `shipped` is then the base bundle's ship result, which
    it only waits for (its job is open, its tiers are staged).
    """
    from ...operators.stream.train import StreamTrainer

    t0 = time.time()
    plugin = _plugin()
    job = plugin.job(run)
    space = plugin.gpu_space()
    if entry.get("empty"):       # `shipped` was the base's ship result: the job is open, its tiers staged
        shipped = {"dir": None, "held": None, "timing": {}, "meta": {}}
    with job.lock:
        if job.next_index != entry["index"]:
            raise GpuStateLost(f"the GPU worker {plugin.address} expected superbatch {job.next_index} of run {run}, "
                               f"got {entry['index']} ({entry['key']}): its state does not match this task")
        if job.trainer is None:
            job.trainer = StreamTrainer(cfg, device, fingerprint, resume)
        job.trainer.base_dir = str(job.base)
        before = job.trainer.loader.stats() if job.trainer.loader is not None else None
        out = job.trainer.train(shipped["dir"], entry, shipped["held"])
        after = job.trainer.loader.stats() if job.trainer.loader is not None else None
        if shipped["dir"] is not None:
            job.trainer.release()
            space.discard(f"{run}/{entry['key']}", shipped["dir"])
        job.next_index += 1
        if checkpoint:
            state, arrays = job.trainer.checkpoint()
            out["checkpoint"] = {"state": state, "arrays": arrays}
    out["timing"] = {**shipped["timing"], "train": stamp(t0)}
    out["loader"] = _superbatch_figures(run, entry, before, after, out["timing"]["train"])
    out["usage"] = space.usage()
    out["pack"] = shipped.get("meta", {})
    out["bytes"] = int(shipped.get("bytes", 0))
    out["held_bytes"] = int(shipped.get("held_bytes", 0))
    return out


def _superbatch_figures(run: str, entry: dict[str, Any], before: dict[str, Any] | None, after: dict[str, Any] | None,
                        timing: dict[str, Any]) -> dict[str, Any]:
    """What the loader did for this superbatch (`publish.stage_delta`: stage busy seconds, packed bytes read,
    rows per tier): reported as Dask measures and published for the diskflow page, after the superbatch."""
    delta: dict[str, Any] = stage_delta(before, after) if after is not None else {"stages": {}, "rows": {}, "bytes_read": 0,
                                                                    "read_s": 0.0}
    measure(PACKED_READ, delta["bytes_read"], BYTES)
    measure_rows(delta["rows"])
    publish("trained", job=run, index=int(entry["index"]), key=entry["key"], t0=timing["t0"], t1=timing["t1"],
            batches=0 if entry.get("empty") else int(entry["batches"]), **delta)
    return delta


def finish_task(run: str) -> dict[str, Any]:
    """Close the run's trainer on the GPU worker and remove its scratch directory; return its figures."""
    plugin = _plugin()
    summary: dict[str, Any] = {}
    job = plugin.jobs.get(run)
    if job is not None and job.trainer is not None:
        summary = job.trainer.summary()
    if plugin.space is not None:
        plugin.space.drain(timeout=60)      # consumed superbatches still being deleted
    usage = plugin.close_job(run)
    return {"summary": summary, "usage": usage}


def worker_table(dask_scheduler: Any) -> dict[str, dict[str, float]]:
    """Runs on the scheduler: every worker's address and resources."""
    return {addr: dict(ws.resources) for addr, ws in dask_scheduler.workers.items()}
