"""The driver of a streamed run (`StreamRun`): submits each superbatch's tasks, keeps the window, checkpoints."""
from __future__ import annotations

import contextlib
import logging
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError, DiskflowError
from ...operators.formats.hashing import config_hash
from ...operators.formats.store import Store
from ...operators.prepare.partition import default_parts
from ...operators.prepare.policies import policy_id
from ...operators.prepare.seeds import BatchOrder, parts_fingerprint
from ...operators.prepare.superbatch import lane_layout, round_layout
from ..dashboard.spans import SpannedClient
from ..dashboard.stream import announce_run
from ..graph import PrepGraph, TierSpec, history_spec, partition_task
from ..plugin import GPU, DiskflowPlugin, GpuStateLost
from ..progress import bar
from .config import PARTITION_FILE, PHASES, StreamConfig, StreamStopped
from .lanes import Lane, interleave, merge_epoch
from .report import stream_report
from .tasks import (
    final_cache_task,
    finish_task,
    group_master_task,
    header_task,
    join_group_task,
    pack_base_task,
    pack_task,
    probe_task,
    select_task,
    ship_task,
    train_task,
)
from .workers import (
    WorkerTable,
    assign_gpu_workers,
    check_all_gpus,
    check_health,
    check_lanes,
    cpu_workers,
    wait_for_gpu_workers,
    worker_resources,
)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------- the driver


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
        self.store = Store(store)
        self.store_path = str(self.store.path.resolve())
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        self.resume = resume
        self.progress = progress
        self.on_epoch, self.on_superbatch = on_epoch, on_superbatch
        self.refs = round_layout(self.store.split_ids("train").shape[0], cfg.batch_size, cfg.superbatch_size, cfg.epochs)
        self.client = SpannedClient(client, [r.key for r in self.refs])     # a Dask span per superbatch and phase
        self.n = len(self.refs)
        self.round_batches = sum(r.num_batches for r in self.refs)
        self.tok = f"{uuid.uuid4().int % 10**8:08d}"
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", self.run_dir.name).strip("-.") or "run"
        self.run_id = f"{safe}-{self.tok}"
        self.fingerprint = cfg.fingerprint(config_hash(self.store.manifest))
        self.lanes: list[Lane] = []
        self._make_lanes(cfg.gpus or 1)        # --gpus all (0): remade for every GPU worker once they are found
        self.ckpt_root = self.run_dir / "checkpoints"
        self.f: dict[str, dict[int, Any]] = {"sample": {}}     # the superbatches' samples (every lane's source)
        self.watch: dict[Any, tuple[str, int, int]] = {}       # future -> (kind, superbatch, lane)
        self.timeline: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []
        self.bars: dict[str, Any] = {}
        self.last_checkpoint: Path | None = None
        self._ckpt_writer: Any = None           # one background thread: checkpoints are written in order
        self._ckpt_pending: list[Any] = []
        self.trained = 0
        self.models_checked = 0                 # superbatches after which every lane's weights were compared
        self.partition: dict[str, Any] | None = None     # partition batches: the partition's figures
        self.group: dict[str, Any] | None = None          # a data-parallel run's process group
        self.final_ids: dict[int, Any] = {}              # shared tier: k -> the tier plan k leaves (checkpoints)

    def _prep_graph(self, refs: list[Any], tok: str) -> PrepGraph:
        cfg = self.cfg
        return PrepGraph(self.store_path, refs, (cfg.batch_size, cfg.fanouts, cfg.seed, cfg.sampler_threads),
                         cfg.cpu_policy, tok, self._submit_cpu, None, history_spec(cfg))

    def _make_lanes(self, gpus: int) -> None:
        """One lane per GPU worker; the sampling graph; the shared tier's planner (``--cache shared``)."""
        self.gpus = gpus
        self.lanes = [self._lane(r) for r in range(gpus)]
        # the graph the superbatches are sampled by (with one GPU worker, its lane's)
        self.graph = self.lanes[0].graph if gpus == 1 else self._prep_graph(self.refs, self.tok)
        # --cache shared: one CPU tier for every GPU worker, one Belady chain over the merged stream (the
        # superbatches in their order), whose plans every lane packs its share of
        self.shared = self.cfg.cache == "shared" and gpus > 1
        self.planner: Lane | None = Lane(-1, self.refs, self.graph, self.tok) if self.shared else None

    def _lane(self, r: int) -> Lane:
        refs = self.refs if self.gpus == 1 else lane_layout(self.refs, self.gpus, r)
        tok = self.tok if self.gpus == 1 else f"{self.tok}-g{r}"
        return Lane(r, refs, self._prep_graph(refs, tok), tok, self.run_id if self.gpus == 1 else f"{self.run_id}-g{r}")

    @property
    def gpu_addr(self) -> str:
        return self.lanes[0].gpu_addr

    @property
    def reshipped(self) -> set[int]:
        return set().union(*(lane.reshipped for lane in self.lanes))

    # ------------------------------------------------------------------ cluster
    def _workers(self) -> WorkerTable:
        """Every worker's resources now (`workers.worker_resources`)."""
        return worker_resources(self.client, self._where)

    def _find_workers(self) -> None:
        """The GPU workers this run uses (waits `gpu_wait_s` for `gpus` of them) and the CPU workers."""
        need = self.cfg.gpus or 1
        table, gpus = wait_for_gpu_workers(self._workers, need, self.cfg.gpu_wait_s)
        if self.cfg.gpus == 0:      # --gpus all: every GPU worker there is now
            check_all_gpus(self.cfg, len(gpus))
            self._make_lanes(len(gpus))
            self.fingerprint = replace(self.cfg, gpus=len(gpus)).fingerprint(config_hash(self.store.manifest))
            need = len(gpus)
        check_lanes(self.cfg, self.lanes, sum(r.num_batches for r in self.refs if r.epoch == 0))
        assign_gpu_workers(self.lanes, gpus, need)
        self.cpu_addrs = cpu_workers(table)

    def _check_health(self) -> None:
        self.cpu_addrs = check_health(self._workers(), self.lanes, self.cpu_addrs, self._where)

    def _setup_group(self) -> None:
        """A data-parallel run: every GPU worker joins the run's process group (rank = its lane)."""
        c, world = self.client, self.gpus
        host, port = c.submit(group_master_task, self.run_id, world, key=f"group-master-{self.tok}", pure=False,
                              **self._gpu(self.lanes[0], 0, 0)).result()
        joins = [c.submit(join_group_task, lane.run, self.run_id, host, port, lane.rank, world, self.cfg.group_timeout_s,
                          key=f"group-join-{self.tok}-g{lane.rank}", pure=False, **self._gpu(lane, 0, 0))
                 for lane in self.lanes]
        members = c.gather(joins)
        self.group = {"world": world, "backend": members[0]["backend"], "rendezvous": f"{host}:{port}",
                      "ranks": {m["address"]: m["rank"] for m in members}}

    def _where(self) -> str:
        for fut in self._ckpt_pending:        # name the newest checkpoint that is really on disk
            with contextlib.suppress(Exception):
                fut.result()
        ck = f"the last checkpoint is {self.last_checkpoint}" if self.last_checkpoint else "no checkpoint was written"
        return (f"{self.start + self.trained} of {self.n} superbatches are trained and {ck}; continue with the same "
                f"options and resume=True in the run directory {self.run_dir}")

    def _cpu(self, k: int) -> dict[str, Any]:
        kw: dict[str, Any] = {"priority": -k}
        if self.cpu_addrs:
            kw.update(workers=list(self.cpu_addrs), allow_other_workers=False)
        return kw

    def _gpu(self, lane: Lane, priority: int, amount: float) -> dict[str, Any]:
        return {"priority": priority, "resources": {GPU: amount}, "workers": [lane.gpu_addr],
                "allow_other_workers": False}

    def _ship_priority(self, k: int) -> int:
        """Ships (and ship-base, k = -1) in stream order, all before any waiting ``train`` (see `_submit_trains`)."""
        return self.n + 1 - k

    # ------------------------------------------------------------------ submission
    def _watch(self, fut: Any, kind: str, k: int, lane: int = 0) -> Any:
        self.watch[fut] = (kind, k, lane)
        return fut

    def _submit_cpu(self, fn: Any, *args: Any, key: str, k: int) -> Any:
        """The preparation graph's `Submit` (`flow.graph`): a future on the CPU workers, in stream order."""
        return self.client.submit(fn, *args, key=key, **self._cpu(k))

    def _sample(self, k: int) -> Any:
        if k >= self.n:
            return None
        if k not in self.f["sample"]:
            self.f["sample"][k] = self._watch(self.graph.sample(k), "sample", k)
        return self.f["sample"][k]

    def _lane_sample(self, lane: Lane, k: int) -> Any:
        """Lane's share of superbatch k's samples (the samples themselves with one GPU worker)."""
        if k >= self.n:
            return None
        if self.gpus == 1 or lane.rank < 0:      # one worker, or the shared tier's planner: the whole superbatch
            return self._sample(k)
        if k not in lane.f["select"]:
            lane.f["select"][k] = self.client.submit(select_task, self._sample(k), lane.rank, self.gpus,
                                                     key=f"select-{self.refs[k].key}-{lane.tok}", **self._cpu(k))
        return lane.f["select"][k]

    def _chains(self) -> list[Lane]:
        """The plan chains: each lane's own (``--cache per-worker``), or the shared tier's planner."""
        return [self.planner] if self.planner is not None else self.lanes

    def _holders(self) -> list[Lane]:
        """Every lane and the shared tier's planner: what holds futures of the run."""
        return self.lanes + ([self.planner] if self.planner is not None else [])

    def _chain_of(self, lane: Lane) -> Lane:
        return self.planner if self.planner is not None else lane

    def _rank(self, r: int) -> Lane:
        return self.planner if r < 0 and self.planner is not None else self.lanes[r]

    def _prepare(self, k: int, attempt: int = 0) -> None:
        """Prepare superbatch k on every chain (`_prepare_chain`)."""
        for chain in self._chains():
            self._prepare_chain(chain, k, attempt)

    def _prepare_chain(self, chain: Lane, k: int, attempt: int = 0, only: list[Lane] | None = None) -> None:
        """Submit plan k of `chain` (once), then pack and ship of every lane's share of it (`attempt` > 0: pack
        and ship again, for the lanes in `only`).

        Plan k (with its lookahead sample k+1) is submitted only once plan k-1 is done; until then
        k waits in `deferred`. A CPU worker runs whatever task it holds that is ready, so a sample
        submitted early would run ahead of pack k-1, whose plan had just finished but which the
        scheduler had not handed over yet; each such sample delays a ``ship`` by its whole duration.
        With more CPU workers, sampling runs ahead by one superbatch per extra worker (`_sample_lead`).
        A lane with no batch of superbatch k (fewer batches than GPU workers) has nothing to prepare.
        """
        if not attempt and k not in chain.f["plan"] and k > self.start and k - 1 not in chain.planned:
            chain.deferred.add(k)
            return
        chain.deferred.discard(k)
        for j in range(k + 2, k + 2 + self._sample_lead()):
            self._sample(j)
        if chain.empty(k):          # a lane's own chain, with no share of k
            chain.planned.add(k)
            self._pack_ship(chain, k, None)
            if k == self.start:
                self._open_window(chain)
            if k + 1 in chain.deferred:
                self._prepare_chain(chain, k + 1)
            return
        if k not in chain.f["plan"]:
            prev = chain.prev_plan(k, self.start)
            chain.f["plan"][k] = self._watch(chain.graph.plan(k, prev, self._lane_sample(chain, k),
                                                              self._lane_sample(chain, k + 1), chain.tiers,
                                                              chain.f["trace"].get(k)), "plan", k, chain.rank)
            self._trace_ahead(chain, k + 1)
        if chain is self.planner:
            chain.prepared.add(k)
            chain.shipped_ok.add(k)     # (the planner ships nothing: its samples are no longer needed)
            if self._is_checkpoint(k) and k not in self.final_ids:     # the tier a checkpoint after k saves
                self.final_ids[k] = self.client.submit(final_cache_task, chain.f["plan"][k],
                                                       key=f"final-cache-{self.refs[k].key}-{self.tok}", **self._cpu(k))
        for lane in only or ([chain] if chain is not self.planner else self.lanes):
            self._pack_ship(lane, k, chain.f["plan"][k], attempt)

    def _pack_ship(self, lane: Lane, k: int, plan: Any, attempt: int = 0) -> None:
        """Submit pack k of lane's share (from `plan`, its chain's) and its ship to lane's GPU worker; a lane with
        no share of k has nothing to ship, and its train joins the steps at once."""
        if lane.empty(k):
            lane.prepared.add(k)
            lane.shipped_ok.add(k)
            self._submit_trains(lane)
            return
        r, c = lane.refs[k], self.client
        suffix = f"-r{attempt}" if attempt else ""
        share = (lane.rank, self.gpus, self.refs[k].round_first_batch) if self.shared else None
        pack = self._watch(c.submit(
            pack_task, self.store_path, r, self._lane_sample(lane, k), plan, lane.header, k,
            self.cfg.stage, lane.run, share, key=f"pack-{r.key}{suffix}-{lane.tok}", **self._cpu(k)), "pack", k,
            lane.rank)
        lane.f["ship"][k] = self._watch(c.submit(
            ship_task, lane.run, pack, self.start, lane.ship_base, key=f"ship-{r.key}{suffix}-{lane.tok}",
            **self._gpu(lane, self._ship_priority(k), 0)), "ship", k, lane.rank)
        lane.prepared.add(k)

    def _trace_ahead(self, lane: Lane, k: int) -> None:
        """Trace superbatch k's window now, while plan k-1 runs, if its samples are already submitted.

        Submitting a sample early for it would put that sample ahead of a pack the GPU worker waits
        for (see `_prepare`); a plan whose window was not traced ahead traces it itself.
        """
        if k >= self.n or k in lane.f["trace"] or k in lane.f["plan"] or lane.empty(k):
            return
        if k in self.f["sample"] and (k + 1 >= self.n or k + 1 in self.f["sample"]):
            trace = lane.graph.trace(k, self._lane_sample(lane, k), self._lane_sample(lane, k + 1), lane.tiers)
            if trace is not None:
                lane.f["trace"][k] = trace

    def _sample_lead(self) -> int:
        """Superbatches sampling may run ahead of the plan chain's needs: one per CPU worker beyond the first,
        at most the window (so what is held in workers' memory stays bounded by the window)."""
        return min(max(0, len(self.cpu_addrs) - 1), self.cfg.window)

    def _submit_trains(self, lane: Lane) -> None:
        """Submit lane's train k for every shipped superbatch whose predecessor is submitted (in order).

        Train k does not depend on train k-1: both wait on the GPU worker itself, which runs
        them one at a time (each takes the whole ``GPU`` resource) in priority order, so train
        k starts the moment k-1 ends instead of after a round trip to the scheduler. Ships carry
        a higher priority than any train, so one waiting for the resource never holds a ship
        back (the worker's queue of resource-restricted tasks is served strictly by priority).
        The lanes of a data-parallel run meet in every step of their trains (the gradients'
        all-reduce), so each lane's train k runs while the others' do.
        """
        while lane.next_train < self.n and lane.next_train in lane.shipped_ok:
            k, r = lane.next_train, lane.refs[lane.next_train]
            g = self.refs[k]
            entry = {"key": r.key, "index": k, "epoch": r.epoch, "first_batch": r.round_first_batch,
                     "epoch_batch": r.first_batch, "batches": r.num_batches, "pass_batches": g.num_batches,
                     "epoch_end": self._epoch_end(k)}
            ckpt = self._is_checkpoint(k)
            if lane.empty(k):   # nothing shipped: it waits for the base (its job, tiers) and joins the steps
                entry.update(empty=True, dim=self.store.feature_dim, num_classes=self.store.num_classes)
                shipped = lane.ship_base
            else:
                shipped = lane.f["ship"][k]
            lane.f["train"][k] = self._watch(self.client.submit(
                train_task, lane.run, shipped, entry, self._train_cfg(lane), lane.device, self.fingerprint,
                lane.resume_state if k == self.start else None, ckpt, key=f"train-{g.key}-{lane.tok}",
                **self._gpu(lane, -k, 1)), "train", k, lane.rank)
            lane.next_train += 1

    def _epoch_end(self, k: int) -> bool:
        """Whether superbatch k is its epoch's last (or the round's)."""
        return k + 1 >= self.n or self.refs[k + 1].epoch != self.refs[k].epoch

    def _is_checkpoint(self, k: int) -> bool:
        """Whether a checkpoint is written after superbatch k: every `checkpoint_every`, each epoch's last, the end."""
        return self._epoch_end(k) or (k - self.start + 1) % self.cfg.checkpoint_every == 0

    def _train_cfg(self, lane: Lane) -> Any:
        """The trainer's options on lane's GPU worker (its rank among the run's GPU workers, the shared tier)."""
        from ...operators.train.shared_tier import shared_tier_path

        if self.gpus == 1:
            return self.cfg.train
        shared = str(shared_tier_path(self.run_id)) if self.shared else None
        return replace(self.cfg.train, world=self.gpus, rank=lane.rank, shared_tier=shared,
                       shared_timeout_s=self.cfg.group_timeout_s)

    def _release(self) -> None:
        """Drop the futures no later submission needs (a pending task keeps its inputs on the workers itself).

        Sample k feeds plan k-1 (lookahead), plan k and pack k (through each lane's select k); plan k
        feeds plan k+1 and pack k (and, of a shared tier, the checkpoint after superbatch k); a pack
        can be submitted again until its ship succeeded; ship k feeds train k (a train's own future is
        dropped once its result is handled).
        """
        trained = self.start + self.trained
        for chain in self._chains():
            lanes = self.lanes if chain is self.planner else [chain]
            f = chain.f
            for k in [k for k in f["plan"] if all(k in lane.shipped_ok for lane in lanes)
                      and (chain is not self.planner or k < trained)
                      and all(j in chain.prepared or j >= self.n for j in range(k + 1, chain.next_share(k, self.n) + 1))]:
                del f["plan"][k]
            for k in [k for k in f["trace"] if k in f["plan"] or k < self.start]:   # its plan holds it now
                del f["trace"][k]
        for lane in self.lanes:
            f = lane.f
            planned = self._chain_of(lane).planned
            for k in [k for k in f["select"] if (k < self.start and k not in lane.prepared)
                      or (k in lane.prepared and k in lane.shipped_ok and (k - 1 < self.start or k - 1 in planned))]:
                del f["select"][k]
            for k in [k for k in f["ship"] if k in f["train"] or k < lane.next_train]:
                del f["ship"][k]
        for k in [k for k in self.f["sample"] if all(
                (k < self.start and k not in lane.prepared) or (k in lane.prepared and k in lane.shipped_ok)
                for lane in self._holders())]:
            del self.f["sample"][k]

    # ------------------------------------------------------------------ the run
    def run(self) -> dict[str, Any]:
        wall0 = time.perf_counter()
        c = self.client
        c.register_plugin(DiskflowPlugin())
        self._find_workers()
        if self.shared:
            from distributed.comm import get_address_host

            hosts = sorted({get_address_host(lane.gpu_addr) for lane in self.lanes})
            if len(hosts) > 1:
                raise ConfigError("cache", f"a shared CPU tier lives in one machine's memory; the GPU workers are on "
                                           f"{', '.join(hosts)} (use cache='per-worker')")
        if self.cfg.batches == "partition":
            self._partition()
        infos = c.gather([c.submit(probe_task, key=f"probe-{self.tok}" + (f"-g{lane.rank}" if self.gpus > 1 else ""),
                                   pure=False, **self._gpu(lane, 0, 0)) for lane in self.lanes])
        self.gpu_info = infos[0]
        self.floors = [info.get("floor_bps") for info in infos]     # each GPU worker's scratch read floor
        for lane, info in zip(self.lanes, infos):   # each GPU worker trains on its own device (cuda:K each)
            own, want = str(info["device"]), self.cfg.device
            lane.device = own if want is None or (want == "cuda" and own.startswith("cuda")) else want
        kinds = sorted({lane.device.split(":")[0] for lane in self.lanes})
        if len(kinds) > 1:
            raise ConfigError("device", f"the GPU workers train on different kinds of device ({', '.join(kinds)}); "
                                        "give them the same device")
        self.device = self.lanes[0].device
        self.start = 0
        self.resumed_from: str | None = None
        if self.resume:
            self.start = self._load_resume()
        if self.start >= self.n:
            self.t_start = time.time()
            return self._report(wall0, {}, {})
        for lane in self.lanes:
            lane.next_train = self.start
        self.t_start = time.time()      # the stream's clock: from the first submission
        announce_run(c, self.run_id, self.t_start, self.n, self.start, [(lane.run, lane.gpu_addr) for lane in self.lanes])
        self._open_bars()
        try:
            if self.gpus > 1:
                self._setup_group()
            self._submit_head()
            self._prepare(self.start)     # the rest of the window once its plan is done
            self._loop()
            self._checkpoints_written()
            finishes = [c.submit(finish_task, lane.run, key=f"finish-{self.tok}" +
                                 (f"-g{lane.rank}" if self.gpus > 1 else ""), pure=False,
                                 **self._gpu(lane, -self.n, 0)) for lane in self.lanes]
            done = c.gather(finishes)
        except BaseException:
            self._abort()
            raise
        finally:
            for b in self.bars.values():
                b.close()
            if self._ckpt_writer is not None:
                self._ckpt_writer.shutdown(wait=True)
        self.lane_summaries = [d.get("summary", {}) for d in done]
        return self._report(wall0, done[0].get("summary", {}), done[0].get("usage", {}))

    def _partition(self) -> None:
        """Partition batches: the graph's min-cut parts, computed once by a task on a CPU worker into the run
        directory (the CPU workers' sample tasks read it there, so it must be on a filesystem they share
        with the driver, as the store is); a resumed run keeps the parts it started with."""
        cfg = self.cfg
        path = (self.run_dir / PARTITION_FILE).resolve()
        if self.resume and path.is_file():
            self.partition = {"path": str(path), "cached": True}
        else:
            parts = default_parts(int(self.store.split_ids("train").shape[0]), self.store.num_nodes, cfg.partitions,
                                  cfg.batch_size)
            fut = self.client.submit(partition_task, self.store_path, parts, "kaminpar", cfg.seed, 1, str(path),
                                     key=f"partition-{self.tok}", pure=False, **self._cpu(-2))
            self.partition = {**fut.result(), "cached": False}
        self.partition["group_by"] = cfg.group_by
        # a checkpoint resumes only on the parts it was trained with
        self.fingerprint = config_hash({"run": self.fingerprint, "parts": parts_fingerprint(path)})
        self.graph.order = BatchOrder("partition", str(path), cfg.parts_per_group, cfg.group_by,
                                      str(self.store.path.resolve() / self.store.manifest["labels"]))

    def _submit_head(self) -> None:
        """Per lane: counts over the tier superbatches, the tiers, and the base bundle (pack-base, ship-base)."""
        c = self.client
        per_epoch0 = sum(1 for r in self.refs if r.epoch == 0)
        t = min(self.cfg.tier_superbatches, per_epoch0)
        kw = self._cpu(-1)
        cfg = self.cfg
        device = "cuda" if self.device.startswith("cuda") else "cpu"
        spec = TierSpec(cfg.gpu_memory, cfg.cpu_memory, device, cfg.staging_batches, cfg.io_reserve, cfg.gpu_policy,
                        cfg.cpu_policy, batch_size=cfg.batch_size, fanouts=tuple(cfg.fanouts))
        config = {"fanouts": list(cfg.fanouts), "batch_size": cfg.batch_size, "superbatch_size": cfg.superbatch_size,
                  "epochs": cfg.epochs, "seed": cfg.seed, "cpu_policy": policy_id(cfg.cpu_policy),
                  "gpu_memory": cfg.gpu_memory, "cpu_memory": cfg.cpu_memory, "device": self.device,
                  "staging_batches": cfg.staging_batches, "tier_superbatches": cfg.tier_superbatches}
        if self.gpus > 1:
            config.update(gpus=self.gpus, cache=cfg.cache, lane=0)
        if self.planner is not None:        # one tier of every worker's share of the budget, planned once
            spec = replace(spec, pool=self.gpus)
        for chain in self._chains():        # counts over its first superbatches, then its tiers
            firsts = [self._lane_sample(chain, k) for k in range(max(t, 2 if self.n > 1 else 1))]
            total = chain.graph.counts([(k, firsts[k]) for k in range(t)])
            chain.tiers = self._watch(chain.graph.tiers(total, firsts, spec, max_rows=None, whole_round=False,
                                                        start_cpu_ids=chain.start_ids), "tiers", -1, chain.rank)
        for lane in self.lanes:
            lane.tiers = self._chain_of(lane).tiers
            if self.gpus > 1:
                config = {**config, "lane": lane.rank}
            lane.header = c.submit(header_task, self.store_path, lane.tiers, config, lane.round_batches, cfg.epochs,
                                   key=f"header-{lane.tok}", **kw)
            base = c.submit(pack_base_task, self.store_path, lane.tiers, self.cfg.stage, lane.run,
                            not self.shared or lane.rank == 0,      # a shared tier's rows: rank 0 fills it
                            key=f"pack-base-{lane.tok}", **kw)
            lane.ship_base = self._watch(c.submit(ship_task, lane.run, base, self.start, key=f"ship-base-{lane.tok}",
                                                  **self._gpu(lane, self._ship_priority(-1), 0)), "ship-base", -1,
                                         lane.rank)

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
            for fut in sorted(done, key=lambda f: (self.watch[f][1], order[self.watch[f][0]], self.watch[f][2])):
                kind, k, r = self.watch.pop(fut)      # stream order
                if fut.status == "cancelled":
                    raise StreamStopped(f"task {kind} of superbatch {k} was cancelled (the scheduler lost it, or the "
                                        f"connection to it was lost); {self._where()}")
                if fut.status == "error":
                    self._failed(kind, k, self._rank(r), fut)
                else:
                    self._completed(kind, k, self._rank(r), fut)
            self._release()

    def _completed(self, kind: str, k: int, lane: Lane, fut: Any) -> None:
        if kind in self.bars and k >= self.start and (kind == "sample" or lane.rank <= 0):
            self.bars[kind].update(1)
        if kind == "plan":
            lane.planned.add(k)
            if k == self.start:
                self._open_window(lane)
            if k + 1 in lane.deferred:
                self._prepare_chain(lane, k + 1)
        elif kind == "ship-base":
            lane.base_info = fut.result()
        elif kind == "ship":
            lane.shipped_ok.add(k)
            self._submit_trains(lane)
        elif kind == "train":
            self._trained(lane, k, fut.result())

    def _failed(self, kind: str, k: int, lane: Lane, fut: Any) -> None:
        from ...operators.stream.ship import ShipVerifyError

        exc = fut.exception()
        what = f"{kind}-{self.refs[k].key}" if k >= 0 else kind
        if self.gpus > 1:
            what += f" (GPU worker {lane.rank}, {lane.gpu_addr})"
        if kind == "ship" and isinstance(exc, ShipVerifyError) and k not in lane.reshipped:
            lane.reshipped.add(k)
            log.warning("superbatch %s failed verification on arrival (%s); shipping it again", self.refs[k].key, exc)
            self._prepare_chain(self._chain_of(lane), k, attempt=1, only=[lane])
            return
        if kind == "ship" and isinstance(exc, ShipVerifyError):
            raise StreamStopped(f"superbatch {self.refs[k].key} failed verification on arrival twice ({exc}); "
                                f"{self._where()}") from exc
        if isinstance(exc, GpuStateLost):
            raise StreamStopped(f"{exc}; {self._where()}") from exc
        if isinstance(exc, DiskflowError):
            raise exc
        raise StreamStopped(f"task {what} failed: {type(exc).__name__}: {exc}; {self._where()}") from exc

    def _open_window(self, lane: Lane) -> None:
        """Submit the preparation of the window's other superbatches (of one lane).

        Held back until the first superbatch's plan is done: until then the CPU workers are on
        the stream's critical path (samples, counts, tiers, the first plan), and a sample of a
        later superbatch that happens to be ready while one of those waits on the scheduler
        would delay the first ``train`` by its whole duration. The window is full long before
        the first superbatch has trained.
        """
        for k in range(self.start + 1, min(self.start + self.cfg.window, self.n)):
            if k not in lane.prepared:
                self._prepare_chain(lane, k)    # k = start + 1 now, the rest each when its previous plan is done

    def _trained(self, lane: Lane, k: int, out: dict[str, Any]) -> None:
        """Lane's train k is done; once every lane's is, superbatch k is trained (`_all_trained`)."""
        lane.f["train"].pop(k, None)
        lane.trained[k] = out
        if all(k in other.trained for other in self.lanes):
            self._all_trained(k, [other.trained.pop(k) for other in self.lanes])

    def _all_trained(self, k: int, outs: list[dict[str, Any]]) -> None:
        self.trained += 1
        cks = [o.pop("checkpoint", None) for o in outs]
        out = outs[0]
        if self.gpus > 1:
            crcs = {o.get("model_crc") for o in outs}
            if len(crcs) > 1:
                raise StreamStopped(f"the GPU workers' models differ after superbatch {self.refs[k].key} (weights "
                                    f"crc32 {sorted(str(c) for c in crcs)}): their data-parallel steps diverged; "
                                    f"{self._where()}")
            if None not in crcs:      # (a data-only run has no weights to compare)
                self.models_checked += 1
            out = {**out, "bytes": sum(int(o.get("bytes") or 0) for o in outs),
                   "held_bytes": sum(int(o.get("held_bytes") or 0) for o in outs),
                   "losses": interleave([o["losses"] for o in outs]),
                   "sizes": interleave([o["sizes"] for o in outs]), "seeds": sum(o["seeds"] for o in outs),
                   "seconds": max(o["seconds"] for o in outs)}
            seen = sum(out["sizes"])
            out["loss"] = sum(v * n for v, n in zip(out["losses"], out["sizes"])) / seen if seen else None
            out["seeds_per_s"] = out["seeds"] / out["seconds"] if out["seconds"] > 0 else None
        record = self._epoch_record(k, outs)
        if record is not None:
            self.records.append(record)
            if self.on_epoch is not None:
                self.on_epoch(record)
        if cks[0] is not None:
            self._write_checkpoint(self._merge_checkpoints(cks, k))
        self.timeline.append(self._timeline_entry(k, out, outs))
        self.last_usage = out.get("usage", {})
        b = self.bars.get("train")
        if b is not None and out.get("loss") is not None:
            b.set_postfix(loss=f"{out['loss']:.4f}", seeds_s=f"{out.get('seeds_per_s') or 0:,.0f}", refresh=False)
        if self.on_superbatch is not None:
            self.on_superbatch({k2: v for k2, v in out.items() if k2 not in ("record", "epoch_tally")})
        if k + self.cfg.window < self.n:
            self._prepare(k + self.cfg.window)

    def _epoch_record(self, k: int, outs: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The run's record of the epoch superbatch k ends (None: it ends none); the lanes' merged."""
        if outs[0].get("record") is None:
            return None
        if self.gpus == 1:
            return outs[0]["record"]
        epoch = self.refs[k].epoch
        ks = [j for j, r in enumerate(self.refs) if r.epoch == epoch]
        shares = [[lane.refs[j].num_batches for j in ks] for lane in self.lanes]
        return merge_epoch([o["record"] for o in outs], [o["epoch_tally"] for o in outs], shares)

    def _merge_checkpoints(self, cks: list[dict[str, Any]], k: int) -> dict[str, Any]:
        """One checkpoint of every lane's state after superbatch k: lane 0's model, optimizer and RNG (the same
        on every lane), each lane's open epoch and CPU tier (``cpu_ids.npy``, ``cpu_ids-R.npy``; a shared
        tier: the one its plan of k leaves, ``cpu_ids.npy``), the run's merged records."""
        if self.gpus == 1:
            return cks[0]
        state = dict(cks[0]["state"])
        state["lanes"] = [{"partial": ck["state"].get("partial"), "records": ck["state"].get("records", [])}
                          for ck in cks]
        state["stream_records"] = list(self.records)
        if self.planner is not None:      # fetched ahead (`_prepare_chain`): done long before k trained
            ids = self.final_ids.pop(k).result(timeout=self.cfg.group_timeout_s)
            return {"state": state, "arrays": {"cpu_ids.npy": np.asarray(ids, np.int64)}}
        arrays = {"cpu_ids.npy": cks[0]["arrays"]["cpu_ids.npy"]}
        for r, ck in enumerate(cks[1:], start=1):
            arrays[f"cpu_ids-{r}.npy"] = ck["arrays"]["cpu_ids.npy"]
        return {"state": state, "arrays": arrays}

    def _timeline_entry(self, k: int, out: dict[str, Any], outs: list[dict[str, Any]]) -> dict[str, Any]:
        r = self.refs[k]

        def phases(o: dict[str, Any]) -> dict[str, Any]:
            return {name: {"start": t["t0"] - self.t_start, "end": t["t1"] - self.t_start, "worker": t["worker"]}
                    for name, t in o["timing"].items()}

        ph = phases(out)
        entry = {"key": r.key, "index": k, "epoch": r.epoch, "batches": r.num_batches, "phases": ph,
                 "prepared": ph["pack"]["end"], "shipped": ph["ship"]["end"], "trained": ph["train"]["end"],
                 "loss": out.get("loss"), "seeds_per_s": out.get("seeds_per_s"), "bytes": out.get("bytes"),
                 "held_bytes": out.get("held_bytes"), "loader": out.get("loader"),
                 "figures": out.get("pack", {}).get("figures", {}), "plan": out.get("pack", {}).get("plan", {})}
        if self.gpus > 1:
            entry["lanes"] = [{"batches": lane.refs[k].num_batches, "phases": phases(o), "bytes": o.get("bytes"),
                               "loader": o.get("loader"),
                               "model_crc": o.get("model_crc"), "losses": o.get("losses"),
                               "figures": o.get("pack", {}).get("figures", {}), "plan": o.get("pack", {}).get("plan", {})}
                              for lane, o in zip(self.lanes, outs)]
            entry["trained"] = max(e["phases"]["train"]["end"] for e in entry["lanes"])
            entry["bytes"] = sum(int(o.get("bytes") or 0) for o in outs)
        return entry

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
        from ...operators.train.checkpoint import save_checkpoint

        st = ck["state"]
        self.last_checkpoint = save_checkpoint(self.ckpt_root, int(st["epoch"]), int(st["batch"]), st, ck["arrays"])

    def _load_resume(self) -> int:
        """The stream position of the latest checkpoint, with each lane's state and CPU tier set from it."""
        from ...operators.train.checkpoint import latest_checkpoint, load_checkpoint
        from ...operators.train.config import check_model_identity

        latest = latest_checkpoint(self.ckpt_root)
        if latest is None:
            return 0
        ck = load_checkpoint(latest)
        st = ck.state
        check_model_identity(st, self.cfg.train, latest)
        if st.get("fingerprint") != self.fingerprint or "stream_index" not in st:
            raise ConfigError("resume", f"the checkpoint {latest} was made by another run (other options, dataset, "
                                        "pipeline or number of GPU workers); use the same options, or start a new "
                                        "run without resume")
        saved = len(st.get("lanes") or [None])
        if saved != self.gpus:
            raise ConfigError("gpus", f"the checkpoint {latest} was trained on {saved} GPU worker(s), this run has "
                                      f"{self.gpus}; resume with the same number")
        self.records = list(st.get("stream_records", st.get("records")) or [])
        self.last_checkpoint = latest
        self.resumed_from = str(latest)
        if self.planner is not None:
            ids = ck.array("cpu_ids.npy")
            self.planner.start_ids = None if ids is None else np.array(ids)
        for lane in self.lanes:
            name = "cpu_ids.npy" if lane.rank == 0 else f"cpu_ids-{lane.rank}.npy"
            ids = ck.array(name) if self.planner is None else None
            lane.start_ids = None if ids is None else np.array(ids)
            if self.gpus == 1:
                lane.resume_state = st
            else:
                own = st["lanes"][lane.rank]
                lane.resume_state = {**st, "partial": own["partial"], "records": own["records"]}
                lane.resume_state.pop("lanes", None)
                lane.resume_state.pop("stream_records", None)
        return int(st["stream_index"])

    def _open_bars(self) -> None:
        total = self.n - self.start
        disable = None if self.progress else True
        self.bars = {name: bar(total=total, desc=f"{name:<6}", unit="sb", disable=disable) for name in PHASES}

    def _abort(self) -> None:
        """Stop everything this run submitted; free the GPU workers' scratch where they are still there."""
        # Releasing the futures is the cancellation: the scheduler forgets what no client wants (running
        # tasks finish and their results are dropped). `client.cancel` would recurse into dependents this
        # driver already released, which the scheduler asserts against.
        self.f["sample"].clear()
        self.final_ids.clear()
        for lane in self._holders():
            for d in lane.f.values():
                d.clear()
            lane.tiers = lane.ship_base = lane.header = None
        self.watch.clear()
        with contextlib.suppress(Exception):
            if self.client.status == "running":
                table = self._workers()
                futs = [self.client.submit(finish_task, lane.run, key=f"finish-{self.tok}-abort-g{lane.rank}",
                                           pure=False, **self._gpu(lane, -self.n, 0))
                        for lane in self.lanes if lane.gpu_addr in table]
                for fut in futs:
                    with contextlib.suppress(Exception):
                        fut.result(timeout=30)

    # ------------------------------------------------------------------ the report
    def _report(self, wall0: float, summary: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
        return stream_report(self, wall0, summary, usage)
