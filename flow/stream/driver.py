"""The driver of a streamed run (`StreamRun`): submits each superbatch's tasks and keeps the window.

`StreamRun` is the schedule: it finds the workers, sets the run up, submits each superbatch's
``train`` to every lane's GPU worker in order, waits for the tasks it watches and answers each
completion, keeping the window of prepared superbatches full. Each other job has a collaborator
of its own in this package: the preparation side of the schedule (`preparation.Preparation`:
samples, plans, packs and ships, the head), where tasks run (`placement.Placement`), the start of
the run (`start`: probes, the process group, the partition), the trained superbatches' results,
epoch records and timeline (`results.StreamResults`), checkpoints and resume (`checkpoints`), the
failures that are retried or stop the run (`failures`), the futures let go (`lanes.release`) and
report.json (`report`).
"""
from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...errors import ConfigError, DiskflowError
from ...operators.formats.hashing import config_hash
from ...operators.formats.rowcodec import make_codec
from ...operators.formats.store import Store, table_locator
from ...operators.prepare.seeds import BatchOrder, parts_fingerprint
from ...operators.prepare.superbatch import lane_layout, round_layout
from ...operators.prepare.task import num_seeds
from ..dashboard.spans import SpannedClient
from ..dashboard.stream import announce_run
from ..graph import PrepGraph, history_spec
from ..plugin import DiskflowPlugin
from ..progress import bar
from .checkpoints import CheckpointWriter, checkpoint_due, epoch_end, load_resume, merge_checkpoints
from .config import PHASES, StreamConfig
from .failures import cancelled, connection_lost, free_scratch, resume_hint, task_failed
from .lanes import EdgeLane, Lane, release
from .placement import Placement
from .preparation import Preparation
from .report import stream_report
from .results import StreamResults
from .start import check_one_host, join_group, make_partition, probe_gpu_workers
from .tasks import finish_task, train_task
from .workers import (
    WorkerTable,
    assign_gpu_workers,
    check_all_gpus,
    check_health,
    check_lanes,
    cpu_workers,
    on_gpu,
    wait_for_gpu_workers,
    worker_resources,
)

__all__ = ["StreamRun", "refuse_shared_edge_rows"]


def refuse_shared_edge_rows(store: Store) -> None:
    """A shared CPU tier plans node rows only: refuse a store whose batches read edge rows too (ConfigError)."""
    if store.edge_features is not None:
        raise ConfigError("cache", "a shared CPU tier holds node rows only; this store's batches read edge "
                                   "rows too (use cache='per-worker')")

# ---------------------------------------------------------------------------- the driver


class StreamRun:
    """Drive one streamed run on a connected `distributed.Client` (see `flow.stream`'s docstring).

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
        cfg.round_task.check(self.store)
        self.refs = round_layout(num_seeds(self.store, cfg.round_task), cfg.batch_size, cfg.superbatch_size, cfg.epochs)
        self.client = SpannedClient(client, [r.key for r in self.refs])     # a Dask span per superbatch and phase
        self.n = len(self.refs)
        self.place = Placement(self.client, self.n)
        self.round_batches = sum(r.num_batches for r in self.refs)
        self.tok = f"{uuid.uuid4().int % 10**8:08d}"
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", self.run_dir.name).strip("-.") or "run"
        self.run_id = f"{safe}-{self.tok}"
        self.fingerprint = cfg.fingerprint(config_hash(self.store.manifest))
        self.lanes: list[Lane] = []
        self._make_lanes(cfg.gpus or 1)        # --gpus all (0): remade for every GPU worker once they are found
        self.checkpoints = CheckpointWriter(self.run_dir / "checkpoints")
        self.prep: Preparation      # the superbatches' preparation (made in `run`, once `start` is known)
        self.bars: dict[str, Any] = {}
        self.trained = 0
        self.partition: dict[str, Any] | None = None     # partition batches: the partition's figures
        self.group: dict[str, Any] | None = None          # a data-parallel run's process group

    def _prep_graph(self, refs: list[Any], tok: str) -> PrepGraph:
        cfg = self.cfg
        return PrepGraph(self.store_path, refs, (cfg.batch_size, cfg.fanouts, cfg.seed, cfg.sampler_threads),
                         cfg.cpu_policy, tok, self.place.submit_cpu, None, history_spec(cfg), cfg.round_task)

    def _make_lanes(self, gpus: int) -> None:
        """One lane per GPU worker; the sampling graph; the shared tier's planner (``--cache shared``)."""
        self.gpus = gpus
        self.lanes = [self._lane(r) for r in range(gpus)]
        self.results = StreamResults(self.refs, self.lanes)
        # the graph the superbatches are sampled by (with one GPU worker, its lane's)
        self.graph = self.lanes[0].graph if gpus == 1 else self._prep_graph(self.refs, self.tok)
        # --cache shared: one CPU tier for every GPU worker, one Belady chain over the merged stream (the
        # superbatches in their order), whose plans every lane packs its share of
        self.shared = self.cfg.cache == "shared" and gpus > 1
        self.planner: Lane | None = Lane(-1, self.refs, self.graph, self.tok) if self.shared else None

    def _lane(self, r: int) -> Lane:
        refs = self.refs if self.gpus == 1 else lane_layout(self.refs, self.gpus, r)
        tok = self.tok if self.gpus == 1 else f"{self.tok}-g{r}"
        lane = Lane(r, refs, self._prep_graph(refs, tok), tok, self.run_id if self.gpus == 1 else f"{self.run_id}-g{r}")
        if self.store.edge_features is not None:     # the edge rows the batches read: a chain of their own
            cfg, table = self.cfg, table_locator(self.store_path, "edge_features")
            lane.edges = EdgeLane(table, PrepGraph(table, refs, (0, (), cfg.seed, cfg.sampler_threads), cfg.cpu_policy,
                                                   f"{tok}e", self.place.submit_cpu))
        return lane

    @property
    def gpu_addr(self) -> str:
        return self.lanes[0].gpu_addr

    @property
    def reshipped(self) -> set[int]:
        return set().union(*(lane.reshipped for lane in self.lanes))

    @property
    def cpu_addrs(self) -> list[str]:
        return self.place.cpu_addrs

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
        self.place.cpu_addrs = cpu_workers(table)

    def _where(self) -> str:
        """How far the run got and how to resume it (`failures.resume_hint`), ending every stopped run's message."""
        self.checkpoints.settle()        # name the newest checkpoint that is really on disk
        return resume_hint(self.start + self.trained, self.n, self.checkpoints.last, self.run_dir)

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
                     "epoch_end": epoch_end(self.refs, k)}
            ckpt = checkpoint_due(self.refs, k, self.start, self.cfg.checkpoint_every)
            if lane.empty(k):   # nothing shipped: it waits for the base (its job, tiers) and joins the steps
                entry.update(empty=True, dim=self.store.feature_dim, num_classes=self.store.num_classes,
                             edge_dim=None if self.store.edge_features is None else self.store.edge_features.dim,
                             hetero=self.store.manifest.get("hetero"))
                shipped = lane.ship_base
            else:
                shipped = lane.f["ship"][k]
            lane.f["train"][k] = self.place.watched(self.client.submit(
                train_task, lane.run, shipped, entry, self._train_cfg(lane), lane.device, self.fingerprint,
                lane.resume_state if k == self.start else None, ckpt, key=f"train-{g.key}-{lane.tok}",
                **on_gpu(lane, -k, 1)), "train", k, lane.rank)
            lane.next_train += 1

    def _train_cfg(self, lane: Lane) -> Any:
        """The trainer's options on lane's GPU worker (its rank among the run's GPU workers, the shared tier)."""
        from ...operators.train.shared_tier import shared_tier_path

        if self.gpus == 1:
            return self.cfg.train
        shared = str(shared_tier_path(self.run_id)) if self.shared else None
        return replace(self.cfg.train, world=self.gpus, rank=lane.rank, shared_tier=shared,
                       shared_timeout_s=self.cfg.group_timeout_s)

    # ------------------------------------------------------------------ the run
    def run(self) -> dict[str, Any]:
        wall0 = time.perf_counter()
        c = self.client
        c.register_plugin(DiskflowPlugin())
        self._find_workers()
        if self.shared:
            check_one_host(self.lanes)
            refuse_shared_edge_rows(self.store)
        if self.cfg.batches == "partition":
            self.partition, path = make_partition(c, self.store, self.store_path, self.run_dir, self.cfg, self.resume,
                                                  self.tok, self.place.cpu(-2))
            # a checkpoint resumes only on the parts it was trained with
            self.fingerprint = config_hash({"run": self.fingerprint, "parts": parts_fingerprint(path)})
            self.graph.order = BatchOrder("partition", str(path), self.cfg.parts_per_group, self.cfg.group_by,
                                          str(self.store.path.resolve() / self.store.manifest["labels"]))
        infos = probe_gpu_workers(c, self.lanes, self.tok, self.cfg.device)
        self.gpu_info = infos[0]
        self.floors = [info.get("floor_bps") for info in infos]     # each GPU worker's scratch read floor
        self.device = self.lanes[0].device
        self.start = 0
        self.resumed_from: str | None = None
        resumed = load_resume(self.checkpoints.root, self.cfg, self.fingerprint, self.lanes, self.planner) \
            if self.resume else None
        if resumed is not None:
            self.start, self.results.records = resumed.start, resumed.records
            self.checkpoints.last, self.resumed_from = resumed.path, str(resumed.path)
        if self.start >= self.n:
            self.results.t_start = time.time()
            return self._report(wall0, {}, {})
        for lane in self.lanes:
            lane.next_train = self.start
        self.results.t_start = time.time()      # the stream's clock: from the first submission
        announce_run(c, self.run_id, self.results.t_start, self.n, self.start,
                     [(lane.run, lane.gpu_addr) for lane in self.lanes])
        self.prep = Preparation(self.place, self.cfg, self.refs, self.lanes, self.planner, self.graph, self.store_path,
                                self.tok, self.start, self._submit_trains,
                                0 if self.store.edge_features is None else self.store.edge_features.num_rows,
                                None if self.cfg.rows == "exact" else
                                make_codec(self.cfg.rows, self.store.feature_dim, self.store.feature_dtype))
        self._open_bars()
        try:
            if self.gpus > 1:
                self.group = join_group(c, self.lanes, self.run_id, self.tok, self.cfg.group_timeout_s)
            self.prep.head(self.device)
            self.prep.prepare(self.start)     # the rest of the window once its plan is done
            self._loop()
            self.checkpoints.wait()
            finishes = [c.submit(finish_task, lane.run, key=f"finish-{self.tok}" +
                                 (f"-g{lane.rank}" if self.gpus > 1 else ""), pure=False,
                                 **on_gpu(lane, -self.n, 0)) for lane in self.lanes]
            done = c.gather(finishes)
        except BaseException:
            self._abort()
            raise
        finally:
            for b in self.bars.values():
                b.close()
            self.checkpoints.close()
        self.lane_summaries = [d.get("summary", {}) for d in done]
        return self._report(wall0, done[0].get("summary", {}), done[0].get("usage", {}))

    def _loop(self) -> None:
        """Wait for completions; a lost scheduler connection becomes a clear StreamStopped, not a traceback."""
        from concurrent.futures import CancelledError

        from distributed.comm import CommClosedError

        try:
            self._wait_all()
        except DiskflowError:
            raise
        except (CancelledError, CommClosedError, OSError) as e:
            raise connection_lost(e, self._where) from e

    def _wait_all(self) -> None:
        from distributed import wait

        last_check = 0.0
        prep, watch = self.prep, self.place.watch
        while self.trained < self.n - self.start:
            done = set()
            try:
                if self.place.watch:
                    done, _ = wait(list(self.place.watch), timeout=self.cfg.poll_s, return_when="FIRST_COMPLETED")
                else:
                    time.sleep(self.cfg.poll_s)
            except TimeoutError:
                pass
            if time.monotonic() - last_check > self.cfg.poll_s or not done:
                self.place.cpu_addrs = check_health(self._workers(), self.lanes, self.cpu_addrs, self._where)
                last_check = time.monotonic()
            order = {kind: i for i, kind in enumerate(("tiers", "ship-base", *PHASES))}
            for fut in sorted(done, key=lambda f: (watch[f][1], order[watch[f][0]], watch[f][2])):
                kind, k, r = watch.pop(fut)      # stream order
                if fut.status == "cancelled":
                    raise cancelled(kind, k, self._where)
                if fut.status == "error":
                    lane = prep.rank(r)
                    task_failed(kind, self.refs[k].key, lane, k, fut.exception(), self.gpus, self._where)
                    prep.prepare_chain(prep.chain_of(lane), k, attempt=1, only=[lane])   # shipped once more
                else:
                    self._completed(kind, k, prep.rank(r), fut)
            release(self.lanes, self.planner, prep.samples, self.start, self.trained, self.n)

    def _completed(self, kind: str, k: int, lane: Lane, fut: Any) -> None:
        if kind in self.bars and k >= self.start and (kind == "sample" or lane.rank <= 0):
            self.bars[kind].update(1)
        if kind == "plan":
            self.prep.planned(lane, k)
        elif kind == "ship-base":
            lane.base_info = self._result(fut)
        elif kind == "ship":
            lane.shipped_ok.add(k)
            self._submit_trains(lane)
        elif kind == "train":
            self._trained(lane, k, self._result(fut))

    def _result(self, fut: Any) -> Any:
        """A finished task's result. When it cannot be fetched because the worker holding it has just died (Dask
        then fails the fetch, at times with an error of its own event loops), the run stops as for any lost
        worker (`check_health`'s StreamStopped, once the scheduler has noticed, within `gpu_wait_s`);
        any other failure is raised as it is."""
        try:
            return fut.result()
        except Exception:
            deadline = time.monotonic() + self.cfg.gpu_wait_s
            while True:
                check_health(self._workers(), self.lanes, self.cpu_addrs, self._where)
                if time.monotonic() >= deadline:
                    raise
                time.sleep(min(self.cfg.poll_s, 0.5))

    def _trained(self, lane: Lane, k: int, out: dict[str, Any]) -> None:
        """Lane's train k is done; once every lane's is, superbatch k is trained (`_all_trained`)."""
        lane.f["train"].pop(k, None)
        lane.trained[k] = out
        if all(k in other.trained for other in self.lanes):
            self._all_trained(k, [other.trained.pop(k) for other in self.lanes])

    def _all_trained(self, k: int, outs: list[dict[str, Any]]) -> None:
        """Superbatch k is trained on every lane: its results, epoch record and checkpoint; the next window slot."""
        self.trained += 1
        cks = [o.pop("checkpoint", None) for o in outs]
        out = self.results.merge(k, outs, self._where)
        record = self.results.epoch_record(k, outs)
        if record is not None and self.on_epoch is not None:
            self.on_epoch(record)
        if cks[0] is not None:
            shared_ids = self.prep.final_ids.pop(k) if self.planner is not None else None
            self.checkpoints.write(merge_checkpoints(cks, self.results.records, shared_ids,
                                                     self.cfg.group_timeout_s))
        self.results.add(k, out, outs)
        b = self.bars.get("train")
        if b is not None and out.get("loss") is not None:
            b.set_postfix(loss=f"{out['loss']:.4f}", seeds_s=f"{out.get('seeds_per_s') or 0:,.0f}", refresh=False)
        if self.on_superbatch is not None:
            self.on_superbatch({k2: v for k2, v in out.items() if k2 not in ("record", "epoch_tally")})
        if k + self.cfg.window < self.n:
            self.prep.prepare(k + self.cfg.window)

    def _open_bars(self) -> None:
        total = self.n - self.start
        disable = None if self.progress else True
        self.bars = {name: bar(total=total, desc=f"{name:<6}", unit="sb", disable=disable) for name in PHASES}

    def _abort(self) -> None:
        """Stop everything this run submitted; free the GPU workers' scratch where they are still there."""
        # Releasing the futures is the cancellation: the scheduler forgets what no client wants (running
        # tasks finish and their results are dropped). `client.cancel` would recurse into dependents this
        # driver already released, which the scheduler asserts against.
        self.prep.drop()
        self.place.watch.clear()
        free_scratch(self.client, self._workers, self.lanes, self.tok, lambda lane: on_gpu(lane, -self.n, 0))

    def _report(self, wall0: float, summary: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
        return stream_report(self, wall0, summary, usage)
