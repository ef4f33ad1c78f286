"""Streaming: preprocessing on CPU workers, training on the GPU worker, one Dask graph, bounded by a window.

Per superbatch k of the round (epoch-major, so epoch e+1 is sampled while epoch e trains)::

    sample-e{e}-s{k}  -> plan-e{e}-s{k} -> pack-e{e}-s{k}  -> ship-e{e}-s{k} -> train-e{e}-s{k}
    (CPU workers)        (chained: k-1)   (CPU workers)       (GPU worker)      (GPU worker, in order)

plus, once: ``count-*`` over the first superbatches (``--tier-superbatches``), ``count-merge-*``,
``tiers`` (GPU tier and the CPU tier's first content, as `flow.prepare` decides them),
``pack-base`` and ``ship-base`` (the tier rows and labels). Plan k starts from plan k-1's CPU
cache and looks ahead into superbatch k+1, exactly as offline; ``plan-*`` of the next epoch
chains on this epoch's last plan.

Placement is by annotation at submission (``client.submit(..., resources=...)``; nothing is
fused, so nothing can drop an annotation): ``train-*`` asks for ``GPU=1``; ``ship-*`` for
``GPU=0`` — only a worker that has the resource may run it, but it does not take the GPU, so
superbatch k+1 is staged while k trains. Both are also pinned to the one GPU worker the run
uses (its scratch holds the staged files and its memory the model). Preprocessing is
restricted to the workers without the resource, so the GPU worker only trains. Train k+1 is
queued on the GPU worker while k runs (the resource makes them take turns, priorities keep
stream order), so it starts the moment k ends, without a round trip to the scheduler.

Backpressure: the driver submits superbatch k+W's preparation only when ``train`` k has
finished, so at most W superbatches are staged on the GPU worker's scratch (each deleted by
the ``train`` that consumed it, in the background, before the next ``ship`` reserves space) and
preprocessing runs at most W superbatches ahead; a task's result is released as soon as nothing
downstream can need it. ``train`` k is submitted when ``ship`` k has succeeded; a superbatch
that fails verification on arrival is packed and shipped once more, then the run stops naming
it. At the start only the first superbatch is prepared (the rest of the window follows once its
plan is done), so the GPU worker's first wait is as short as the critical path allows; after
that, plan k and its lookahead sample are submitted when plan k-1 is done, so that a CPU worker
never starts sampling ahead while a pack the GPU worker waits for is about to become ready.

Failures: a CPU worker lost mid-run costs only time (Dask recomputes its tasks; everything is
deterministic, so the checksums and losses are the same). A lost GPU worker stops the run with
the position of its last checkpoint (written into the run directory after every
``--checkpoint-every`` superbatches); ``--resume`` continues from there, re-deriving the tiers
and re-reading the CPU tier's rows for the checkpoint's ids.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..operators.formats.errors import ConfigError, DiskflowError, InputError
from ..operators.formats.files import config_hash
from ..operators.formats.store import Store
from ..operators.prepare.count import merge_counts
from ..operators.prepare.plan import plan_superbatch
from ..operators.prepare.policies import Policy, check_policy, choose_tiers, planned, policy_id
from ..operators.prepare.superbatch import SuperbatchRef, check_round_config, round_layout
from ..operators.prepare.tiers import tier_sizes
from ..operators.stream.pack import (
    Bundle,
    count_bytes,
    pack_base,
    pack_superbatch,
    sample_bytes,
    sample_n_ids,
    stream_header,
)
from ..operators.train.record import final_block
from .options import parse_int
from .plugin import GPU, PLUGIN_NAME, DiskflowPlugin, GpuStateLost
from .progress import bar

MAX_ROWS_MARGIN = 1.10      # staging reserve: the largest batch seen in the tier superbatches, plus 10%
PHASES = ("sample", "plan", "pack", "ship", "train")


class StreamStopped(DiskflowError):
    """The streamed run had to stop (a lost worker or scheduler, a superbatch that fails verification)."""


@dataclass(frozen=True)
class StreamConfig:
    """A streamed run: the round, the tiers' budgets, the stream's window, and the trainer's options.

    Budgets are bytes: `gpu_memory` the GPU tier, `cpu_memory` what the tiers may take of the
    trainer's host memory (CPU tier + staging of `staging_batches` batches), as `PrepareConfig`.
    """

    train: Any                          # operators.stream_train.StreamTrainConfig
    fanouts: tuple[int, ...] = (10, 10, 10)
    batch_size: int = 1024
    superbatch_size: int = 32
    epochs: int = 1
    seed: int = 0
    sampler_threads: int = 1
    cpu_policy: Policy = "belady"       # as PrepareConfig: "belady", "static" or a function
    gpu_policy: Policy = "hottest"
    gpu_memory: int = 0
    cpu_memory: int = 0
    staging_batches: int = 3
    io_reserve: int = 0
    tier_superbatches: int = 2
    window: int = 2
    stage: str | None = None
    checkpoint_every: int = 1
    device: str | None = None
    gpu_wait_s: float = 60.0
    poll_s: float = 0.5

    def validate(self) -> None:
        check_round_config(self.batch_size, self.superbatch_size, self.epochs, self.fanouts)
        check_policy(self.cpu_policy, "cpu", "cpu_policy")
        check_policy(self.gpu_policy, "gpu", "gpu_policy")
        for option, value in (("--window", self.window), ("--tier-superbatches", self.tier_superbatches),
                              ("--checkpoint-every", self.checkpoint_every), ("--staging-batches", self.staging_batches),
                              ("--sampler-threads", self.sampler_threads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(option, f"expected an integer >= 1, got {value!r}")
        if self.gpu_memory < 0 or self.cpu_memory < 0:
            raise ConfigError("--gpu-memory/--cpu-memory", "budgets must be >= 0")
        if self.device is not None and not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise ConfigError("--device", f"expected cpu or cuda[:N], got {self.device!r}")

    def describe(self) -> dict[str, Any]:
        """The config as JSON values, policies by `policy_id` (the GPU policy only when not the default)."""
        out = {**asdict(self), "cpu_policy": policy_id(self.cpu_policy)}
        if self.gpu_policy == "hottest":
            out.pop("gpu_policy")
        else:
            out["gpu_policy"] = policy_id(self.gpu_policy)
        return out

    def fingerprint(self, store_hash: str) -> str:
        """What a checkpoint must match to be resumed (options that change results; not the window)."""
        keep = {k: v for k, v in self.describe().items()
                if k not in ("window", "stage", "checkpoint_every", "gpu_wait_s", "poll_s", "train")}
        train = {k: v for k, v in asdict(self.train).items() if k not in ("queue_depth", "check_crc", "store")}
        return config_hash({"store": store_hash, **keep, "fanouts": list(self.fanouts),
                            "train": {**train, "fanouts": list(train["fanouts"])}})


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
                                    lambda: [b for s in first[:2] for b in sample_n_ids(s.data, s.key)])
    if start_cpu_ids is not None:      # resuming: the CPU tier as the checkpoint left it
        cpu_ids = np.asarray(start_cpu_ids, np.int64)
        if cpu_ids.shape[0] != sizes.cpu_rows:
            raise InputError("checkpoint cpu_ids.npy", f"holds {cpu_ids.shape[0]} CPU-tier slots, this run's budget "
                                                       f"gives {sizes.cpu_rows}; resume with the same options")
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
    from ..operators.stream.ship import drop_source, held_files, stage_bundle

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
    from ..operators.stream.train import StreamTrainer

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


def _worker_table(dask_scheduler: Any) -> dict[str, dict[str, float]]:
    """Runs on the scheduler: every worker's address and resources."""
    return {addr: dict(ws.resources) for addr, ws in dask_scheduler.workers.items()}


# ---------------------------------------------------------------------------- the driver

def _merge_tree(client: Any, parts: list[Any], tok: str, kw: dict[str, Any]) -> Any:
    level = 0
    while len(parts) > 1:
        parts = [client.submit(merge_counts, *parts[i:i + 2], key=f"count-merge-{level}-{i // 2}-{tok}", **kw)
                 if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
        level += 1
    return parts[0]


class StreamRun:
    """Drive one streamed run on a connected `distributed.Client` (see the module docstring).

    Args:
        client: the client (embedded LocalCluster or a remote scheduler).
        store: the ingested store (a path the CPU workers can read).
        run_dir: the run directory (checkpoints go to ``run_dir/checkpoints``).
        cfg: the run's configuration.
        resume: continue from the latest checkpoint in `run_dir`.
        progress: show a progress bar per phase (on a terminal).
        on_epoch: called with each finished epoch's record.
        on_superbatch: called with each trained superbatch's result (small dict).
    """

    def __init__(self, client: Any, store: str | os.PathLike[str], run_dir: str | os.PathLike[str], cfg: StreamConfig,
                 *, resume: bool = False, progress: bool = True,
                 on_epoch: Callable[[dict[str, Any]], None] | None = None,
                 on_superbatch: Callable[[dict[str, Any]], None] | None = None) -> None:
        cfg.validate()
        self.client = client
        self.store = Store(store)
        self.store_path = str(self.store.path.resolve())
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        self.resume = resume
        self.progress = progress
        self.on_epoch, self.on_superbatch = on_epoch, on_superbatch
        self.refs = round_layout(self.store.split_ids("train").shape[0], cfg.batch_size, cfg.superbatch_size, cfg.epochs)
        self.n = len(self.refs)
        self.round_batches = sum(r.num_batches for r in self.refs)
        self.tok = f"{uuid.uuid4().int % 10**8:08d}"
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", self.run_dir.name).strip("-.") or "run"
        self.run_id = f"{safe}-{self.tok}"
        self.fingerprint = cfg.fingerprint(config_hash(self.store.manifest))
        self.ckpt_root = self.run_dir / "checkpoints"
        # futures per phase and superbatch, and what each watched future is
        self.f: dict[str, dict[int, Any]] = {k: {} for k in ("sample", "plan", "ship", "train")}
        self.watch: dict[Any, tuple[str, int]] = {}
        self.shipped_ok: set[int] = set()
        self.prepared: set[int] = set()
        self.planned: set[int] = set()          # plans done
        self.deferred: set[int] = set()         # due for preparation, waiting for the previous plan
        self.reshipped: set[int] = set()
        self.next_train = 0
        self.timeline: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []
        self.bars: dict[str, Any] = {}
        self.last_checkpoint: Path | None = None
        self._ckpt_writer: Any = None           # one background thread: checkpoints are written in order
        self._ckpt_pending: list[Any] = []
        self.trained = 0

    # ------------------------------------------------------------------ cluster
    def _workers(self) -> dict[str, dict[str, float]]:
        try:
            return self.client.run_on_scheduler(_worker_table)
        except Exception as e:   # any comm failure means the scheduler is gone
            raise StreamStopped(f"lost the Dask scheduler ({type(e).__name__}: {e}); {self._where()}") from e

    def _find_workers(self) -> None:
        """The GPU worker this run uses (waits `gpu_wait_s` for one) and the CPU workers."""
        deadline = time.monotonic() + self.cfg.gpu_wait_s
        while True:
            table = self._workers()
            gpus = sorted(a for a, r in table.items() if float(r.get(GPU, 0)) > 0)
            if gpus:
                break
            if time.monotonic() > deadline:
                raise StreamStopped(f"no worker with the {GPU} resource joined within {self.cfg.gpu_wait_s:.0f} s "
                                    f"({len(table)} workers without it); start one with `diskflow worker SCHEDULER "
                                    f"--gpu --scratch DIR` or `dask worker SCHEDULER --resources {GPU}=1`")
            time.sleep(0.5)
        self.gpu_addr = gpus[0]
        if len(gpus) > 1:
            print(f"note: {len(gpus)} GPU workers; this run trains on {self.gpu_addr}", file=sys.stderr)
        self.cpu_addrs = sorted(a for a, r in table.items() if float(r.get(GPU, 0)) <= 0)

    def _check_health(self) -> None:
        table = self._workers()
        if self.gpu_addr not in table:
            raise StreamStopped(f"the GPU worker {self.gpu_addr} left the cluster; {self._where()}")
        if self.cpu_addrs:
            alive = [a for a in self.cpu_addrs if a in table]
            if not alive:
                raise StreamStopped(f"every CPU worker this run was using ({', '.join(self.cpu_addrs)}) left the "
                                    f"cluster; {self._where()}")
            fresh = sorted(a for a, r in table.items() if float(r.get(GPU, 0)) <= 0)
            self.cpu_addrs = fresh     # later submissions use the workers there are now

    def _where(self) -> str:
        for fut in self._ckpt_pending:        # name the newest checkpoint that is really on disk
            with contextlib.suppress(Exception):
                fut.result()
        ck = f"the last checkpoint is {self.last_checkpoint}" if self.last_checkpoint else "no checkpoint was written"
        return (f"{self.trained} of {self.n} superbatches are trained and {ck}; continue with the same command and "
                f"`--resume {self.run_dir}`")

    def _cpu(self, k: int) -> dict[str, Any]:
        kw: dict[str, Any] = {"priority": -k}
        if self.cpu_addrs:
            kw.update(workers=list(self.cpu_addrs), allow_other_workers=False)
        return kw

    def _gpu(self, priority: int, amount: float) -> dict[str, Any]:
        return {"priority": priority, "resources": {GPU: amount}, "workers": [self.gpu_addr],
                "allow_other_workers": False}

    def _ship_priority(self, k: int) -> int:
        """Ships (and ship-base, k = -1) in stream order, all before any waiting ``train`` (see `_submit_trains`)."""
        return self.n + 1 - k

    # ------------------------------------------------------------------ submission
    def _watch(self, fut: Any, kind: str, k: int) -> Any:
        self.watch[fut] = (kind, k)
        return fut

    def _sample(self, k: int) -> Any:
        if k >= self.n:
            return None
        if k not in self.f["sample"]:
            r = self.refs[k]
            self.f["sample"][k] = self._watch(self.client.submit(
                sample_task, self.store_path, r, self.cfg.batch_size, tuple(self.cfg.fanouts), self.cfg.seed,
                self.cfg.sampler_threads, key=f"sample-{r.key}-{self.tok}", **self._cpu(k)), "sample", k)
        return self.f["sample"][k]

    def _prepare(self, k: int, attempt: int = 0) -> None:
        """Submit plan (once), pack and ship of superbatch k (`attempt` > 0: pack and ship again).

        Plan k (with its lookahead sample k+1) is submitted only once plan k-1 is done; until then
        k waits in `deferred`. A CPU worker runs whatever task it holds that is ready, so a sample
        submitted early would run ahead of pack k-1, whose plan had just finished but which the
        scheduler had not handed over yet; each such sample delays a ``ship`` by its whole duration.
        With more CPU workers, sampling runs ahead by one superbatch per extra worker (`_sample_lead`).
        """
        if not attempt and k not in self.f["plan"] and k > self.start and k - 1 not in self.planned:
            self.deferred.add(k)
            return
        self.deferred.discard(k)
        for j in range(k + 2, k + 2 + self._sample_lead()):
            self._sample(j)
        r, c = self.refs[k], self.client
        suffix = f"-r{attempt}" if attempt else ""
        if k not in self.f["plan"]:
            prev = self.f["plan"][k - 1] if k > self.start else None
            self.f["plan"][k] = self._watch(c.submit(
                plan_task, prev, self._sample(k), self._sample(k + 1), self.tiers, self.cfg.cpu_policy,
                key=f"plan-{r.key}-{self.tok}", **self._cpu(k)), "plan", k)
        pack = self._watch(c.submit(
            pack_task, self.store_path, r, self._sample(k), self.f["plan"][k], self.tiers, k, self.cfg.stage, self.run_id,
            key=f"pack-{r.key}{suffix}-{self.tok}", **self._cpu(k)), "pack", k)
        self.f["ship"][k] = self._watch(c.submit(
            ship_task, self.run_id, pack, self.start, self.ship_base, key=f"ship-{r.key}{suffix}-{self.tok}",
            **self._gpu(self._ship_priority(k), 0)), "ship", k)
        self.prepared.add(k)

    def _sample_lead(self) -> int:
        """Superbatches sampling may run ahead of the plan chain's needs: one per CPU worker beyond the first,
        at most the window (so what is held in workers' memory stays bounded by the window)."""
        return min(max(0, len(self.cpu_addrs) - 1), self.cfg.window)

    def _submit_trains(self) -> None:
        """Submit train k for every shipped superbatch whose predecessor is submitted (in order).

        Train k does not depend on train k-1: both wait on the GPU worker itself, which runs
        them one at a time (each takes the whole ``GPU`` resource) in priority order, so train
        k starts the moment k-1 ends instead of after a round trip to the scheduler. Ships carry
        a higher priority than any train, so one waiting for the resource never holds a ship
        back (the worker's queue of resource-restricted tasks is served strictly by priority).
        """
        while self.next_train < self.n and self.next_train in self.shipped_ok:
            k, r = self.next_train, self.refs[self.next_train]
            nxt = self.refs[k + 1] if k + 1 < self.n else None
            entry = {"key": r.key, "index": k, "epoch": r.epoch, "first_batch": r.round_first_batch,
                     "epoch_batch": r.first_batch, "batches": r.num_batches,
                     "epoch_end": nxt is None or nxt.epoch != r.epoch}
            ckpt = k + 1 == self.n or entry["epoch_end"] or (k - self.start + 1) % self.cfg.checkpoint_every == 0
            self.f["train"][k] = self._watch(self.client.submit(
                train_task, self.run_id, self.f["ship"][k], entry, self.cfg.train, self.device, self.fingerprint,
                self.resume_state if k == self.start else None, ckpt, key=f"train-{r.key}-{self.tok}",
                **self._gpu(-k, 1)), "train", k)
            self.next_train += 1

    def _release(self) -> None:
        """Drop the futures no later submission needs (a pending task keeps its inputs on the workers itself).

        Sample k feeds plan k-1 (lookahead), plan k and pack k; plan k feeds plan k+1 and pack k;
        a pack can be submitted again until its ship succeeded; ship k feeds train k (a train's
        own future is dropped once its result is handled).
        """
        f = self.f
        for k in [k for k in f["sample"] if (k < self.start and k not in self.prepared)
                  or (k in self.prepared and k in self.shipped_ok)]:
            del f["sample"][k]
        for k in [k for k in f["plan"] if k in self.shipped_ok and (k + 1 in self.prepared or k + 1 >= self.n)]:
            del f["plan"][k]
        for k in [k for k in f["ship"] if k in f["train"] or k < self.next_train]:
            del f["ship"][k]

    # ------------------------------------------------------------------ the run
    def run(self) -> dict[str, Any]:
        wall0 = time.perf_counter()
        c = self.client
        c.register_plugin(DiskflowPlugin())
        self._find_workers()
        info = c.submit(probe_task, key=f"probe-{self.tok}", pure=False, **self._gpu(0, 0)).result()
        self.gpu_info = info
        self.device = self.cfg.device or str(info["device"])
        self.start, self.resume_state, start_ids = 0, None, None
        self.resumed_from: str | None = None
        if self.resume:
            self.start, self.resume_state, start_ids = self._load_resume()
        if self.start >= self.n:
            self.t_start = time.time()
            return self._report(wall0, {}, {})
        self.next_train = self.start
        self.t_start = time.time()      # the stream's clock: from the first submission
        self._open_bars()
        try:
            self._submit_head(start_ids)
            self._prepare(self.start)     # the rest of the window once its plan is done
            self._loop()
            self._checkpoints_written()
            finish = c.submit(finish_task, self.run_id, key=f"finish-{self.tok}", pure=False, **self._gpu(-self.n, 0))
            done = finish.result()
        except BaseException:
            self._abort()
            raise
        finally:
            for b in self.bars.values():
                b.close()
            if self._ckpt_writer is not None:
                self._ckpt_writer.shutdown(wait=True)
        return self._report(wall0, done.get("summary", {}), done.get("usage", {}))

    def _submit_head(self, start_ids: np.ndarray | None) -> None:
        """Counts over the tier superbatches, the tiers, and the base bundle (pack-base, ship-base)."""
        c = self.client
        per_epoch0 = sum(1 for r in self.refs if r.epoch == 0)
        t = min(self.cfg.tier_superbatches, per_epoch0)
        firsts = [self._sample(k) for k in range(max(t, 2 if self.n > 1 else 1))]
        kw = self._cpu(-1)
        counts = [c.submit(count_task, firsts[k], self.store.num_nodes, key=f"count-{self.refs[k].key}-{self.tok}", **kw)
                  for k in range(t)]
        total = _merge_tree(c, counts, self.tok, kw)
        self.tiers = self._watch(c.submit(tiers_task, total, firsts, self.store_path, replace(self.cfg, train=None),
                                          self.device, self.round_batches, start_ids, key=f"tiers-{self.tok}", **kw),
                                 "tiers", -1)
        base = c.submit(pack_base_task, self.store_path, self.tiers, self.cfg.stage, self.run_id,
                        key=f"pack-base-{self.tok}", **kw)
        self.ship_base = self._watch(c.submit(ship_task, self.run_id, base, self.start, key=f"ship-base-{self.tok}",
                                              **self._gpu(self._ship_priority(-1), 0)), "ship-base", -1)
        self.base_info: dict[str, Any] = {}

    def _loop(self) -> None:
        """Wait for completions; a lost scheduler connection becomes a clear StreamStopped, not a traceback."""
        from concurrent.futures import CancelledError

        from distributed.comm import CommClosedError

        try:
            self._wait_all()
        except DiskflowError:
            raise
        except (CancelledError, CommClosedError, OSError) as e:
            raise StreamStopped(f"lost the connection to the Dask scheduler ({type(e).__name__}: "
                                f"{str(e).splitlines()[0] if str(e) else ''}); {self._where()}") from e

    def _wait_all(self) -> None:
        from distributed import wait

        last_check = 0.0
        while self.trained < self.n - self.start:
            done = set()
            try:
                if self.watch:
                    done, _ = wait(list(self.watch), timeout=self.cfg.poll_s, return_when="FIRST_COMPLETED")
                else:
                    time.sleep(self.cfg.poll_s)
            except TimeoutError:
                pass
            if time.monotonic() - last_check > self.cfg.poll_s or not done:
                self._check_health()
                last_check = time.monotonic()
            order = {kind: i for i, kind in enumerate(("tiers", "ship-base", *PHASES))}
            for fut in sorted(done, key=lambda f: (self.watch[f][1], order[self.watch[f][0]])):   # stream order
                kind, k = self.watch.pop(fut)
                if fut.status == "cancelled":
                    raise StreamStopped(f"task {kind} of superbatch {k} was cancelled (the scheduler lost it, or the "
                                        f"connection to it was lost); {self._where()}")
                if fut.status == "error":
                    self._failed(kind, k, fut)
                else:
                    self._completed(kind, k, fut)
            self._release()

    def _completed(self, kind: str, k: int, fut: Any) -> None:
        if kind in self.bars and k >= self.start:
            self.bars[kind].update(1)
        if kind == "plan":
            self.planned.add(k)
            if k == self.start:
                self._open_window()
            if k + 1 in self.deferred:
                self._prepare(k + 1)
        elif kind == "ship-base":
            self.base_info = fut.result()
        elif kind == "ship":
            self.shipped_ok.add(k)
            self._submit_trains()
        elif kind == "train":
            self._trained(k, fut.result())

    def _failed(self, kind: str, k: int, fut: Any) -> None:
        from ..operators.stream.ship import ShipVerifyError

        exc = fut.exception()
        what = f"{kind}-{self.refs[k].key}" if k >= 0 else kind
        if kind == "ship" and isinstance(exc, ShipVerifyError) and k not in self.reshipped:
            self.reshipped.add(k)
            print(f"diskflow: superbatch {self.refs[k].key} failed verification on arrival ({exc}); shipping it again",
                  file=sys.stderr, flush=True)
            self._prepare(k, attempt=1)
            return
        if kind == "ship" and isinstance(exc, ShipVerifyError):
            raise StreamStopped(f"superbatch {self.refs[k].key} failed verification on arrival twice ({exc}); "
                                f"{self._where()}") from exc
        if isinstance(exc, GpuStateLost):
            raise StreamStopped(f"{exc}; {self._where()}") from exc
        if isinstance(exc, DiskflowError):
            raise exc
        raise StreamStopped(f"task {what} failed: {type(exc).__name__}: {exc}; {self._where()}") from exc

    def _open_window(self) -> None:
        """Submit the preparation of the window's other superbatches.

        Held back until the first superbatch's plan is done: until then the CPU workers are on
        the stream's critical path (samples, counts, tiers, the first plan), and a sample of a
        later superbatch that happens to be ready while one of those waits on the scheduler
        would delay the first ``train`` by its whole duration. The window is full long before
        the first superbatch has trained.
        """
        for k in range(self.start + 1, min(self.start + self.cfg.window, self.n)):
            if k not in self.prepared:
                self._prepare(k)        # k = start + 1 now, the rest each when its previous plan is done

    def _trained(self, k: int, out: dict[str, Any]) -> None:
        self.trained += 1
        self.f["train"].pop(k, None)
        ck = out.pop("checkpoint", None)
        if ck is not None:
            self._write_checkpoint(ck)
        record = out.get("record")
        if record is not None:
            self.records.append(record)
            if self.on_epoch is not None:
                self.on_epoch(record)
        self.timeline.append(self._timeline_entry(k, out))
        self.last_usage = out.get("usage", {})
        b = self.bars.get("train")
        if b is not None and out.get("loss") is not None:
            b.set_postfix(loss=f"{out['loss']:.4f}", seeds_s=f"{out.get('seeds_per_s') or 0:,.0f}", refresh=False)
        if self.on_superbatch is not None:
            self.on_superbatch({k2: v for k2, v in out.items() if k2 != "record"})
        if k + self.cfg.window < self.n:
            self._prepare(k + self.cfg.window)

    def _timeline_entry(self, k: int, out: dict[str, Any]) -> dict[str, Any]:
        r = self.refs[k]
        phases = {name: {"start": t["t0"] - self.t_start, "end": t["t1"] - self.t_start, "worker": t["worker"]}
                  for name, t in out["timing"].items()}
        return {"key": r.key, "index": k, "epoch": r.epoch, "batches": r.num_batches, "phases": phases,
                "prepared": phases["pack"]["end"], "shipped": phases["ship"]["end"], "trained": phases["train"]["end"],
                "loss": out.get("loss"), "seeds_per_s": out.get("seeds_per_s"), "bytes": out.get("bytes"),
                "held_bytes": out.get("held_bytes"),
                "figures": out.get("pack", {}).get("figures", {}), "plan": out.get("pack", {}).get("plan", {})}

    def _write_checkpoint(self, ck: dict[str, Any]) -> None:
        """Save a checkpoint in the background (in order, one writer thread), so the driver goes on
        submitting the next superbatches while it is written and synced; a failed write surfaces here
        or at the end of the run."""
        from concurrent.futures import ThreadPoolExecutor

        if self._ckpt_writer is None:
            self._ckpt_writer = ThreadPoolExecutor(1, thread_name_prefix="diskflow-checkpoint")
        self._ckpt_pending.append(self._ckpt_writer.submit(self._save_checkpoint, ck))
        while self._ckpt_pending and self._ckpt_pending[0].done():
            self._ckpt_pending.pop(0).result()

    def _checkpoints_written(self) -> None:
        """Wait until the checkpoints being written are on disk (a failed write raises)."""
        while self._ckpt_pending:
            self._ckpt_pending.pop(0).result()

    def _save_checkpoint(self, ck: dict[str, Any]) -> None:
        from ..operators.train.checkpoint import save_checkpoint

        st = ck["state"]
        self.last_checkpoint = save_checkpoint(self.ckpt_root, int(st["epoch"]), int(st["batch"]), st, ck["arrays"])

    def _load_resume(self) -> tuple[int, dict[str, Any] | None, np.ndarray | None]:
        from ..operators.train.checkpoint import latest_checkpoint, load_checkpoint

        latest = latest_checkpoint(self.ckpt_root)
        if latest is None:
            return 0, None, None
        ck = load_checkpoint(latest)
        st = ck.state
        if st.get("fingerprint") != self.fingerprint or "stream_index" not in st:
            raise ConfigError("--resume", f"the checkpoint {latest} was made by another run (other options, dataset or "
                                          "pipeline); use the same options, or start a new run without --resume")
        self.records = list(st.get("records") or [])
        self.last_checkpoint = latest
        self.resumed_from = str(latest)
        ids = ck.array("cpu_ids.npy")
        return int(st["stream_index"]), st, None if ids is None else np.array(ids)

    def _open_bars(self) -> None:
        total = self.n - self.start
        disable = None if self.progress else True
        self.bars = {name: bar(total=total, desc=f"{name:<6}", unit="sb", disable=disable) for name in PHASES}

    def _abort(self) -> None:
        """Stop everything this run submitted; free the GPU worker's scratch if it is still there."""
        # Releasing the futures is the cancellation: the scheduler forgets what no client wants (running
        # tasks finish and their results are dropped). `client.cancel` would recurse into dependents this
        # driver already released, which the scheduler asserts against.
        for d in self.f.values():
            d.clear()
        self.watch.clear()
        self.tiers = self.ship_base = None
        with contextlib.suppress(Exception):
            if self.client.status == "running" and self.gpu_addr in self._workers():
                self.client.submit(finish_task, self.run_id, key=f"finish-{self.tok}", pure=False,
                                   **self._gpu(-self.n, 0)).result(timeout=30)

    # ------------------------------------------------------------------ the report
    def _report(self, wall0: float, summary: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
        wall = time.perf_counter() - wall0
        tl = self.timeline
        train_busy = sum(e["phases"]["train"]["end"] - e["phases"]["train"]["start"] for e in tl)
        end = max((e["trained"] for e in tl), default=0.0)
        tcfg = self.cfg.train
        base_meta = self.base_info.get("meta", {}) if getattr(self, "base_info", None) else {}
        seen = getattr(self, "last_usage", {}) or {}
        scratch = {**seen, **usage}
        for k in ("peak", "peak_disk", "peak_staged"):
            scratch[k] = max(int(usage.get(k) or 0), int(seen.get(k) or 0))
        report: dict[str, Any] = {
            "pipeline": "streaming",
            "title": f"streaming: {tcfg.model}, fanouts {list(self.cfg.fanouts)}, window {self.cfg.window}",
            "config": {**replace(self.cfg, train=None).describe(), "fanouts": list(self.cfg.fanouts),
                       "train": {**asdict(tcfg), "fanouts": list(tcfg.fanouts)}, "device": getattr(self, "device", None)},
            "dataset": {"store": self.store_path, "nodes": self.store.num_nodes, "dim": self.store.feature_dim,
                        "dtype": str(self.store.feature_dtype), "num_classes": self.store.num_classes,
                        "batches": self.round_batches, "superbatches": self.n,
                        "feature_bytes": self.store.feature_bytes},
            "epochs": self.records,
            "final": final_block(self.records),
            "stage_s": {k: sum(r["stage_s"].get(k, 0.0) for r in self.records)
                        for k in ("load", "assemble", "graph", "gather", "train", "eval")},
            "stream": {
                "run": self.run_id, "window": self.cfg.window, "superbatches": self.n, "start_index": self.start,
                "trained": self.trained, "gpu_worker": getattr(self, "gpu_addr", None),
                "cpu_workers": getattr(self, "cpu_addrs", []), "gpu_info": getattr(self, "gpu_info", {}),
                "stage": self.cfg.stage, "reshipped": [self.refs[k].key for k in sorted(self.reshipped)],
                "stream_s": end, "train_busy_s": train_busy,
                "gpu_idle_fraction": (1.0 - train_busy / end) if end > 0 else None,
                "tiers": base_meta.get("tiers", {}), "scratch": scratch,
            },
            "timeline": tl,
            "trainer": summary,
            "checkpoint": str(self.last_checkpoint) if self.last_checkpoint else None,
            "resumed_from": getattr(self, "resumed_from", None),
            "run_dir": str(self.run_dir),
            "wall_s": wall,
        }
        return report


# ---------------------------------------------------------------------------- `diskflow run` options

def _int_at_least(option: str, minimum: int) -> Callable[[str], int]:
    return lambda text: parse_int(option, text, minimum)


def _float_at_least(option: str, minimum: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(option, f"expected a number >= {minimum}, got {text!r}") from None
        if not value >= minimum:
            raise ConfigError(option, f"expected a number >= {minimum}, got {text!r}")
        return value
    return parse


# option attribute -> (flag, parser, help): the flags `diskflow run` adds for split and streamed runs
RUN_OPTIONS: dict[str, tuple[str, Callable[[str], Any], str]] = {
    "scheduler": ("--scheduler", str, "tcp://HOST:PORT of a running Dask scheduler (default: an embedded cluster)"),
    "window": ("--window", _int_at_least("--window", 1),
               "superbatches staged on the GPU worker / prepared ahead of training at most (default 2)"),
    "workers": ("--workers", _int_at_least("--workers", 0), "CPU workers of the embedded cluster (default: cores - 1)"),
    "scratch": ("--scratch", str, "the embedded GPU worker's scratch directory (default RUN/scratch)"),
    "quota": ("--quota", str, "the embedded GPU worker's scratch quota, e.g. 10GiB (default: none)"),
    "hold_memory": ("--hold-memory", str, ("the embedded GPU worker's memory for staged index and samples, which "
                                           "skip the scratch disk while they fit (default 256MiB; 0: all on disk)")),
    "stage": ("--stage", str, "an fsspec URL both machines reach; superbatches travel through it instead of Dask"),
    "superbatch_size": ("--superbatch-size", _int_at_least("--superbatch-size", 1),
                        "batches per superbatch (streaming default 32)"),
    "tier_superbatches": ("--tier-superbatches", _int_at_least("--tier-superbatches", 1),
                          "superbatches whose counts decide the GPU tier (default 2)"),
    "checkpoint_every": ("--checkpoint-every", _int_at_least("--checkpoint-every", 1),
                         "superbatches between checkpoints (default 1; also at every epoch's end)"),
    "cpu_memory": ("--cpu-memory", str, "trainer host memory for features: bytes (4GiB) or a share (10%%)"),
    "gpu_memory": ("--gpu-memory", str, "GPU memory for the GPU tier: bytes or a share of the features"),
    "gpu_wait": ("--gpu-wait", _float_at_least("--gpu-wait", 0.0),
                 "seconds to wait for a GPU-resource worker to join (default 60)"),
    "resume": ("--resume", lambda text: True, ("continue the run in directory RUN from its last checkpoint "
                                               "(same options; RUN is used instead of a new run directory)")),
}


def add_run_arguments(parser: Any) -> None:
    """Add the split/streamed-run flags (`RUN_OPTIONS`, ``--resume RUN`` among them) to `diskflow run`'s parser."""
    for name, (flag, _, text) in RUN_OPTIONS.items():
        metavar = {"resume": "RUN", "scheduler": "ADDRESS", "stage": "URL"}.get(name, name.split("_")[0].upper())
        parser.add_argument(flag, dest=name, default=None, metavar=metavar, help=text)


def resume_dir(args: Any) -> Path | None:
    """The run directory `--resume RUN` names (it must hold checkpoints), or None."""
    if getattr(args, "resume", None) is None:
        return None
    path = Path(args.resume)
    if not (path / "checkpoints").is_dir():
        raise InputError(path, "no checkpoints to resume from (give the run directory of the interrupted run)")
    return path
