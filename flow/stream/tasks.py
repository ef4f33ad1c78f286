"""The tasks of a streamed run, as they run on the workers: sample, count, tiers, plan and pack on CPU workers;
ship, train and finish on the GPU worker; and the small results they pass along."""
from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...operators.formats.store import Store
from ...operators.prepare.plan import plan_superbatch
from ...operators.prepare.policies import Policy, choose_tiers, planned, policy_id
from ...operators.prepare.superbatch import SuperbatchRef
from ...operators.prepare.tiers import tier_sizes
from ...operators.stream.pack import (
    Bundle,
    count_bytes,
    pack_base,
    pack_superbatch,
    sample_bytes,
    sample_n_ids,
    stream_header,
)
from ..plugin import PLUGIN_NAME, DiskflowPlugin, GpuStateLost
from .config import MAX_ROWS_MARGIN, StreamConfig, StreamStopped

# ---------------------------------------------------------------------------- results of tasks

@dataclass
class SampleResult:
    """A sampled superbatch: its Arrow IPC samples and summary, and when/where it was made."""

    key: str
    data: np.ndarray             # uint8: the samples file's bytes
    summary: dict[str, Any]
    timing: dict[str, Any]

    def __sizeof__(self) -> int:      # what Dask's memory accounting (`dask.sizeof`) counts: the file's bytes
        return object.__sizeof__(self) + self.data.nbytes


@dataclass
class Tiers:
    """The run's tiers (decided once), the access counts the planner breaks ties with, and the manifest header."""

    gpu_ids: np.ndarray
    cpu_ids: np.ndarray          # the CPU tier where the stream starts (round start, or the checkpoint's)
    frequency: np.ndarray
    header: dict[str, Any]
    figures: dict[str, Any]

    def __sizeof__(self) -> int:      # `dask.sizeof`: the tiers' arrays
        return object.__sizeof__(self) + self.gpu_ids.nbytes + self.cpu_ids.nbytes + self.frequency.nbytes


@dataclass
class PlanResult:
    """A superbatch's plan and the CPU cache it leaves for the next one."""

    key: str
    batches: list[Any]
    final_cache: np.ndarray
    stats: dict[str, Any]
    timing: dict[str, Any] = field(default_factory=dict)

    def __sizeof__(self) -> int:      # `dask.sizeof`: the final cache and the batches' plans
        return object.__sizeof__(self) + self.final_cache.nbytes + sum(sys.getsizeof(b) for b in self.batches)


# ---------------------------------------------------------------------------- tasks (run on workers)

def _worker() -> Any:
    from distributed import get_worker

    return get_worker()


def _stamp(t0: float) -> dict[str, Any]:
    """When a task ran (wall clock, so machines compare) and on which worker."""
    try:
        addr = str(_worker().address)
    except ValueError:
        addr = "local"
    return {"t0": t0, "t1": time.time(), "worker": addr}


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


def sample_task(store: str, ref: SuperbatchRef, batch_size: int, fanouts: tuple[int, ...], seed: int,
                threads: int) -> SampleResult:
    t0 = time.time()
    data, summary = sample_bytes(store, ref, batch_size, fanouts, seed, threads)
    return SampleResult(ref.key, data, summary, _stamp(t0))


def count_task(sample: SampleResult, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    return count_bytes(sample.data, num_nodes)


def tiers_task(counts: tuple[np.ndarray, np.ndarray], first: list[SampleResult], store_path: str, cfg: StreamConfig,
               device: str, round_batches: int, start_cpu_ids: np.ndarray | None) -> Tiers:
    """GPU tier (hottest rows) and the CPU tier's first content, from the tier superbatches' counts.

    `cfg` comes without its trainer options (``train=None``): unpickling those would import torch
    on a CPU worker that never trains.
    """
    store = Store(store_path)
    freq = np.zeros(store.num_nodes, np.int64)
    freq[counts[0]] = counts[1]
    seen = max(int(s.summary["max_nodes"]) for s in first)
    max_rows = min(store.num_nodes, math.ceil(seen * MAX_ROWS_MARGIN))
    sizes = tier_sizes(cfg.gpu_memory, cfg.cpu_memory, store.row_bytes, store.num_nodes,
                       "cuda" if device.startswith("cuda") else "cpu", max_rows, cfg.staging_batches,
                       len(store.shards), cfg.io_reserve)
    gpu_ids, cpu_ids = choose_tiers(cfg.gpu_policy, cfg.cpu_policy, freq, sizes.gpu_rows, sizes.cpu_rows,
                                    lambda: [b for s in first[:2] for b in sample_n_ids(s.data, s.key)],
                                    cpu_slots=start_cpu_ids)     # resuming: the CPU tier as the checkpoint left it
    config = {"fanouts": list(cfg.fanouts), "batch_size": cfg.batch_size, "superbatch_size": cfg.superbatch_size,
              "epochs": cfg.epochs, "seed": cfg.seed, "cpu_policy": policy_id(cfg.cpu_policy), "gpu_memory": cfg.gpu_memory,
              "cpu_memory": cfg.cpu_memory, "device": device, "staging_batches": cfg.staging_batches,
              "tier_superbatches": cfg.tier_superbatches}
    header = stream_header(store, config, sizes.gpu_rows, sizes.cpu_rows, round_batches, cfg.epochs)
    figures = {"gpu_rows": sizes.gpu_rows, "cpu_rows": sizes.cpu_rows, "staging_bytes": sizes.staging_bytes,
               "max_batch_rows_reserved": max_rows}
    return Tiers(gpu_ids, cpu_ids, freq, header, figures)


def plan_task(prev: PlanResult | None, sample: SampleResult, lookahead: SampleResult | None, tiers: Tiers,
              policy: Policy) -> PlanResult:
    """Plan one superbatch from the previous plan's final cache (the stream's start tier for the first)."""
    t0 = time.time()
    batches = sample_n_ids(sample.data, sample.key)
    ahead = sample_n_ids(lookahead.data, lookahead.key) if lookahead is not None else []
    plan = plan_superbatch(batches, ahead, tiers.gpu_ids, tiers.cpu_ids, tiers.frequency,
                           None if prev is None else prev.final_cache, planned(policy))
    stats = {"hits": plan.hits, "misses": plan.misses, "gpu_hits": plan.gpu_hits, "inserts": plan.inserts}
    return PlanResult(sample.key, plan.batches, plan.final_cache, stats, {"sample": sample.timing, "plan": _stamp(t0)})


def pack_task(store: str, ref: SuperbatchRef, sample: SampleResult, plan: PlanResult, tiers: Tiers, index: int,
              stage: str | None, run: str) -> Bundle:
    t0 = time.time()
    url = f"{stage.rstrip('/')}/{run}/{ref.key}" if stage else None
    bundle = pack_superbatch(store, ref, sample.data, plan.batches, tiers.header, final_cache=plan.final_cache,
                             stream_index=index, url=url, tmp_dir=_local_tmp())
    bundle.meta.update(timing={**plan.timing, "pack": _stamp(t0)}, plan=plan.stats)
    return bundle


def pack_base_task(store: str, tiers: Tiers, stage: str | None, run: str) -> Bundle:
    t0 = time.time()
    url = f"{stage.rstrip('/')}/{run}/base" if stage else None
    bundle = pack_base(store, tiers.gpu_ids, tiers.cpu_ids, url=url)
    bundle.meta.update(timing={"pack": _stamp(t0)}, tiers=tiers.figures)
    return bundle


def probe_task() -> dict[str, Any]:
    return _plugin().describe()


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
    return {**out, "disk_bytes": disk, "usage": space.usage(),
            "meta": {k: v for k, v in bundle.meta.items() if k != "timing"},
            "timing": {**bundle.meta.get("timing", {}), "ship": _stamp(t0)}}


def train_task(run: str, shipped: dict[str, Any], entry: dict[str, Any], cfg: Any, device: str,
               fingerprint: str, resume: dict[str, Any] | None, checkpoint: bool) -> dict[str, Any]:
    """Train one staged superbatch with the run's trainer (created by the first one), then discard it.

    The staged directory is deleted in the background (`ScratchSpace.discard`), so the next
    ``train`` task starts at once.
    """
    from ...operators.stream.train import StreamTrainer

    t0 = time.time()
    plugin = _plugin()
    job = plugin.job(run)
    space = plugin.gpu_space()
    with job.lock:
        if job.next_index != entry["index"]:
            raise GpuStateLost(f"the GPU worker {plugin.address} expected superbatch {job.next_index} of run {run}, "
                               f"got {entry['index']} ({entry['key']}): its state does not match this task")
        if job.trainer is None:
            job.trainer = StreamTrainer(cfg, device, fingerprint, resume)
        out = job.trainer.train(shipped["dir"], entry, shipped["held"])
        job.trainer.release()
        space.discard(f"{run}/{entry['key']}", shipped["dir"])
        job.next_index += 1
        if checkpoint:
            state, arrays = job.trainer.checkpoint()
            out["checkpoint"] = {"state": state, "arrays": arrays}
    out["timing"] = {**shipped["timing"], "train": _stamp(t0)}
    out["usage"] = space.usage()
    out["pack"] = shipped.get("meta", {})
    out["bytes"] = int(shipped.get("bytes", 0))
    out["held_bytes"] = int(shipped.get("held_bytes", 0))
    return out


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
