"""The driver of a streamed run (`StreamRun`): submits each superbatch's tasks, keeps the window, checkpoints."""
from __future__ import annotations

import contextlib
import os
import re
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ...operators.formats.errors import ConfigError, DiskflowError
from ...operators.formats.files import config_hash
from ...operators.formats.store import Store
from ...operators.prepare.partition import default_parts
from ...operators.prepare.policies import policy_id
from ...operators.prepare.seeds import BatchOrder, parts_fingerprint
from ...operators.prepare.superbatch import round_layout
from ..graph import PrepGraph, TierSpec, partition_task
from ..plugin import GPU, DiskflowPlugin, GpuStateLost
from ..progress import bar
from .config import PARTITION_FILE, PHASES, StreamConfig, StreamStopped
from .report import stream_report
from .tasks import (
    finish_task,
    header_task,
    pack_base_task,
    pack_task,
    probe_task,
    ship_task,
    train_task,
    worker_table,
)

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
        self.graph = PrepGraph(self.store_path, self.refs, (cfg.batch_size, cfg.fanouts, cfg.seed, cfg.sampler_threads),
                               cfg.cpu_policy, self.tok, self._submit_cpu, None,
                               (cfg.history_rows, cfg.history_staleness, cfg.history_select)
                               if cfg.history_rows else None)
        self.ckpt_root = self.run_dir / "checkpoints"
        # futures per phase and superbatch, and what each watched future is
        self.f: dict[str, dict[int, Any]] = {k: {} for k in ("sample", "trace", "plan", "ship", "train")}
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
        self.partition: dict[str, Any] | None = None     # partition batches: the partition's figures

    # ------------------------------------------------------------------ cluster
    def _workers(self) -> dict[str, dict[str, float]]:
        try:
            return self.client.run_on_scheduler(worker_table)
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

    def _submit_cpu(self, fn: Any, *args: Any, key: str, k: int) -> Any:
        """The preparation graph's `Submit` (`flow.graph`): a future on the CPU workers, in stream order."""
        return self.client.submit(fn, *args, key=key, **self._cpu(k))

    def _sample(self, k: int) -> Any:
        if k >= self.n:
            return None
        if k not in self.f["sample"]:
            self.f["sample"][k] = self._watch(self.graph.sample(k), "sample", k)
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
            self.f["plan"][k] = self._watch(self.graph.plan(k, prev, self._sample(k), self._sample(k + 1), self.tiers,
                                                            self.f["trace"].get(k)), "plan", k)
            self._trace_ahead(k + 1)
        pack = self._watch(c.submit(
            pack_task, self.store_path, r, self._sample(k), self.f["plan"][k], self.header, k, self.cfg.stage,
            self.run_id, key=f"pack-{r.key}{suffix}-{self.tok}", **self._cpu(k)), "pack", k)
        self.f["ship"][k] = self._watch(c.submit(
            ship_task, self.run_id, pack, self.start, self.ship_base, key=f"ship-{r.key}{suffix}-{self.tok}",
            **self._gpu(self._ship_priority(k), 0)), "ship", k)
        self.prepared.add(k)

    def _trace_ahead(self, k: int) -> None:
        """Trace superbatch k's window now, while plan k-1 runs, if its samples are already submitted.

        Submitting a sample early for it would put that sample ahead of a pack the GPU worker waits
        for (see `_prepare`); a plan whose window was not traced ahead traces it itself.
        """
        if k >= self.n or k in self.f["trace"] or k in self.f["plan"]:
            return
        if k in self.f["sample"] and (k + 1 >= self.n or k + 1 in self.f["sample"]):
            trace = self.graph.trace(k, self.f["sample"][k], self._sample(k + 1), self.tiers)
            if trace is not None:
                self.f["trace"][k] = trace

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
        for k in [k for k in f["trace"] if k in f["plan"] or k < self.start]:   # its plan holds it now
            del f["trace"][k]
        for k in [k for k in f["ship"] if k in f["train"] or k < self.next_train]:
            del f["ship"][k]

    # ------------------------------------------------------------------ the run
    def run(self) -> dict[str, Any]:
        wall0 = time.perf_counter()
        c = self.client
        c.register_plugin(DiskflowPlugin())
        self._find_workers()
        if self.cfg.batches == "partition":
            self._partition()
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

    def _partition(self) -> None:
        """Partition batches: the graph's min-cut parts, computed once by a task on a CPU worker into the run
        directory (the CPU workers' sample tasks read it there, so it must be on a filesystem they share
        with the driver, as the store is); a resumed run keeps the parts it started with."""
        cfg = self.cfg
        path = (self.run_dir / PARTITION_FILE).resolve()
        if self.resume and path.is_file():
            self.partition = {"path": str(path), "cached": True}
        else:
            parts = default_parts(int(self.store.split_ids("train").shape[0]), self.store.num_nodes, cfg.partitions)
            fut = self.client.submit(partition_task, self.store_path, parts, "kaminpar", cfg.seed, 1, str(path),
                                     key=f"partition-{self.tok}", pure=False, **self._cpu(-2))
            self.partition = {**fut.result(), "cached": False}
        self.partition["group_by"] = cfg.group_by
        # a checkpoint resumes only on the parts it was trained with
        self.fingerprint = config_hash({"run": self.fingerprint, "parts": parts_fingerprint(path)})
        self.graph.order = BatchOrder("partition", str(path), cfg.parts_per_group, cfg.group_by,
                                      str(self.store.path.resolve() / self.store.manifest["labels"]))

    def _submit_head(self, start_ids: np.ndarray | None) -> None:
        """Counts over the tier superbatches, the tiers, and the base bundle (pack-base, ship-base)."""
        c = self.client
        per_epoch0 = sum(1 for r in self.refs if r.epoch == 0)
        t = min(self.cfg.tier_superbatches, per_epoch0)
        firsts = [self._sample(k) for k in range(max(t, 2 if self.n > 1 else 1))]
        kw = self._cpu(-1)
        cfg = self.cfg
        device = "cuda" if self.device.startswith("cuda") else "cpu"
        spec = TierSpec(cfg.gpu_memory, cfg.cpu_memory, device, cfg.staging_batches, cfg.io_reserve, cfg.gpu_policy,
                        cfg.cpu_policy)
        total = self.graph.counts([(k, firsts[k]) for k in range(t)])
        self.tiers = self._watch(self.graph.tiers(total, firsts, spec, max_rows=None, whole_round=False,
                                                  start_cpu_ids=start_ids), "tiers", -1)
        config = {"fanouts": list(cfg.fanouts), "batch_size": cfg.batch_size, "superbatch_size": cfg.superbatch_size,
                  "epochs": cfg.epochs, "seed": cfg.seed, "cpu_policy": policy_id(cfg.cpu_policy),
                  "gpu_memory": cfg.gpu_memory, "cpu_memory": cfg.cpu_memory, "device": self.device,
                  "staging_batches": cfg.staging_batches, "tier_superbatches": cfg.tier_superbatches}
        self.header = c.submit(header_task, self.store_path, self.tiers, config, self.round_batches, cfg.epochs,
                               key=f"header-{self.tok}", **kw)
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
        from ...operators.stream.ship import ShipVerifyError

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
        from ...operators.train.checkpoint import save_checkpoint

        st = ck["state"]
        self.last_checkpoint = save_checkpoint(self.ckpt_root, int(st["epoch"]), int(st["batch"]), st, ck["arrays"])

    def _load_resume(self) -> tuple[int, dict[str, Any] | None, np.ndarray | None]:
        from ...operators.train.checkpoint import latest_checkpoint, load_checkpoint

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
        self.tiers = self.ship_base = self.header = None
        with contextlib.suppress(Exception):
            if self.client.status == "running" and self.gpu_addr in self._workers():
                self.client.submit(finish_task, self.run_id, key=f"finish-{self.tok}", pure=False,
                                   **self._gpu(-self.n, 0)).result(timeout=30)

    # ------------------------------------------------------------------ the report
    def _report(self, wall0: float, summary: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
        return stream_report(self, wall0, summary, usage)
