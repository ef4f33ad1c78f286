"""The pipelined trainer: train a GNN from a packed dataset (DiskGNN §5.3), with checkpoints and resume.

Four stages as threads joined by bounded queues, batch order preserved (DiskGNN Fig. 7, two
paths: load -> assemble -> train and graph -> train): stages 1-3 are `load.PackedLoader`'s,
stage 4 (forward, backward, step) is the `session.TrainSession` every pipeline trains with, in
the caller's thread, so the training math is the in-memory pipeline's by construction. With the
same seed, the packed round's batches are the in-memory pipeline's batches (`prepare.superbatch`
samples them with `seed_batches`/`batch_seed`), and the per-batch losses are identical.

Memory: the budgets are checked before anything is allocated (`memory.check_memory`). Each
epoch drains the pipeline, so at an epoch boundary the CPU tier is exactly the plan's state
there; that is when a checkpoint saves it (with model, optimizer, RNG and position). A first
Ctrl-C stops training at the next batch boundary and saves a mid-epoch checkpoint (the
model after exactly that many steps; the CPU tier of the epoch start, which resume
fast-forwards through the epoch's finished batches without training), then raises
KeyboardInterrupt; a second Ctrl-C interrupts at once.
"""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError, InputError
from ..formats.hashing import config_hash
from ..formats.rowcodec import rows_block
from ..prepare.history import planned_width
from ..prepare.samplers import train_target
from ..prepare.typedsample import as_fanouts, fanouts_json
from .checkpoint import Checkpoint, latest_checkpoint, load_checkpoint, save_checkpoint
from .config import DATA_ONLY, TrainConfig, check_model_identity
from .loader import PackedLoader
from .loop import deterministic
from .session import TrainSession, final_block, resolve_device, store_eval_loaders, torch_threads

__all__ = ["CHECKPOINTS", "DATA_ONLY", "STAGES", "deferred_interrupt", "train_packed"]

CHECKPOINTS = "checkpoints"
STAGES = ("load", "assemble", "graph", "gather", "train")     # the packed loader's stages, and the step
EpochHook = Callable[[dict[str, Any]], None]


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[threading.Event]:
    """While active, a first SIGINT only sets the yielded flag (checked between batches); a second raises."""
    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum: int, frame: Any) -> None:
        if flag.is_set():
            raise KeyboardInterrupt
        flag.set()

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, old)


def _tiers(rows: dict[str, int]) -> dict[str, Any]:
    total = sum(rows.values())
    return {"rows": rows, "total": total, "rates": {k: (v / total if total else None) for k, v in rows.items()}}


def _peak_rss() -> dict[str, int]:
    import psutil

    # The kernel's high-water mark adds up its per-CPU RSS counters approximately, /proc exactly:
    # the two can differ by a few pages either way, so the peak is at least the current RSS read here.
    rss = int(psutil.Process().memory_info().rss)
    return {"peak_rss_bytes": max(rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024), "rss_bytes": rss}


def train_packed(packed: str | os.PathLike[str], run_dir: str | os.PathLike[str], *, model: str = TrainConfig.model,
                 hidden: int = TrainConfig.hidden, num_layers: int | None = TrainConfig.num_layers,
                 lr: float = TrainConfig.lr, weight_decay: float = TrainConfig.weight_decay,
                 clip_grad: float | None = TrainConfig.clip_grad, dropout: float = TrainConfig.dropout,
                 heads: int = TrainConfig.heads, seed: int | None = None, device: str = "cpu", eval_every: int = TrainConfig.eval_every,
                 cpu_memory: int | None = None, gpu_memory: int | None = None, queue_depth: int = 2,
                 sequential: bool = False, check_crc: bool = True, resume: bool = False,
                 store: str | os.PathLike[str] | None = None, threads: int | None = TrainConfig.threads,
                 on_epoch: EpochHook | None = None, on_batch: Callable[[int], Any] | None = None,
                 on_start: Callable[[int, int], Any] | None = None, evaluate: bool = True,
                 hits_k: int = TrainConfig.hits_k, task: str | None = None) -> dict[str, Any]:
    """Train on a packed dataset with the four-stage pipeline; checkpoint every epoch into `run_dir`.

    Args:
        packed: a finished packed dataset (`diskflow prepare`); its round fixes the epochs,
            batches and samples (fanouts, batch size, sampling seed).
        run_dir: an existing directory; checkpoints go to ``run_dir/checkpoints``.
        model: "sage", "gcn", "gat", "mlp", or "none" (the data path only, for timing).
        hidden, num_layers, lr, weight_decay, clip_grad, dropout, heads: as the in-memory pipeline
            (`TrainConfig`); a `diskflow.Model` may bring its own optimizer and scheduler.
        seed: model-initialisation seed (default: the round's sampling seed, which makes the
            run comparable loss for loss with ``inmemory`` at that seed).
        device: "cpu" or "cuda[:N]".
        eval_every: evaluate val/test every this many epochs (and after the last one).
        cpu_memory, gpu_memory: budgets in bytes, checked before training (None: unchecked).
        queue_depth: capacity of each queue between stages.
        sequential: run the stages one after another (no overlap; DiskGNN Table 5's baseline).
        check_crc: check every packed segment's crc32.
        resume: continue from the latest checkpoint in `run_dir` (none: start from scratch).
        store: the store, for evaluation and the Ginex layout (default: the manifest's path);
            when unreachable, accuracies are None.
        threads: torch intra-op threads (default: torch's setting).
        on_epoch: called with each epoch's record when it is complete.
        on_batch: called with 1 after each trained batch (progress bars).
        on_start: called with (epoch index, batches in it) before each epoch.
        evaluate: False skips val/test evaluation altogether (accuracies None). Evaluation samples
            and gathers from the store through its memory maps, random reads whose cost grows with
            the store; a benchmark that times only the training epochs of a store far larger than
            memory turns it off.
        hits_k: a link round's evaluation reports Hits@`hits_k` (the round's task is its own: a link
            round's batches are scored on their pairs).
        task: the task the caller expects the round to be prepared for (None: whatever it is); another is
            refused, naming the round's.

    Returns:
        The report: inmemory's keys (`config`, `dataset`, `epochs`, `final`, `stage_s`,
        `load_s`, `peak_rss_bytes`, `wall_s`) plus `stages` (busy / starved / blocked seconds
        of load, assemble, graph, train), `queues`, `io` (reader counters), `tiers` (rows per
        source and hit rates), `memory` (the budget plan, RSS), `checkpoint`, `resumed_from`.
    """
    wall0 = time.perf_counter()
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(run_dir, "run directory does not exist")
    dev = resolve_device(device)
    t0 = time.perf_counter()
    loader = PackedLoader(packed, dev, cpu_memory=cpu_memory, queue_depth=queue_depth, pipelined=not sequential,
                          check_crc=check_crc, store=store, gpu_memory=gpu_memory)
    try:
        cfg = _round_config(loader, model=model, hidden=hidden, num_layers=num_layers, lr=lr,
                            weight_decay=weight_decay, clip_grad=clip_grad, dropout=dropout, heads=heads, seed=seed,
                            eval_every=eval_every, threads=threads, hits_k=hits_k)
        if task is not None and task != cfg.task:
            raise ConfigError("task", f"{loader.path} was prepared for the {cfg.task} task, not {task}: prepare it "
                                      f"again with task={task!r}")
        with torch_threads(cfg.threads), deterministic(), deferred_interrupt() as interrupt:
            report = _Run(loader, cfg, run_dir, dev, resume, store, interrupt, on_epoch, on_batch, on_start,
                          evaluate).train(time.perf_counter() - t0)
    finally:
        loader.close()
    report["config"].update(threads=threads, cpu_memory=cpu_memory, gpu_memory=gpu_memory, queue_depth=queue_depth,
                            sequential=bool(sequential), check_crc=bool(check_crc))
    history = loader.ds.manifest.get("figures", {}).get("history")
    if history:
        report["history"] = dict(history)
    report["wall_s"] = time.perf_counter() - wall0
    return report


def _round_config(loader: PackedLoader, seed: int | None, **options: Any) -> TrainConfig:
    """The run's `TrainConfig`: the caller's options, with fanouts, batch size, epochs (and by default the
    seed) of the packed round."""
    man = loader.ds.manifest
    rc = man.get("config", {})
    try:
        fanouts, batch_size = as_fanouts(rc["fanouts"]), int(rc["batch_size"])
        epochs, seed = int(man["round"]["epochs"]), int(rc["seed"]) if seed is None else seed
    except (KeyError, TypeError) as e:
        raise InputError(loader.path / "manifest.json", f"malformed round config ({e})") from e
    history = man.get("figures", {}).get("history")
    if history and options.get("model", TrainConfig.model) != DATA_ONLY:
        # the round was sampled for a historical embedding cache: the model gets its table
        options["history_rows"] = planned_width(loader.path, history, options.get("hidden", TrainConfig.hidden))
    prior = man.get("figures", {}).get("label_prior")
    if prior is not None:       # partition batches: the losses weigh each batch's labels as in the split
        options["label_prior"] = tuple(float(p) for p in prior)
    # the task the round was sampled for (a link round's batches are scored on their pairs)
    options.update({k: rc[k] for k in ("task", "neg_ratio", "neg_sampling") if k in rc})
    return TrainConfig(**options, fanouts=fanouts, batch_size=batch_size, epochs=epochs, seed=seed)


class _Run:
    """One packed run: a `TrainSession` over the packed loader, checkpoints (with the CPU tier) and the report."""

    def __init__(self, loader: PackedLoader, cfg: TrainConfig, run_dir: Path, dev: torch.device, resume: bool,
                 store: str | os.PathLike[str] | None, interrupt: threading.Event, on_epoch: EpochHook | None,
                 on_batch: Callable[[int], Any] | None, on_start: Callable[[int, int], Any] | None,
                 evaluate: bool = True) -> None:
        self.loader, self.cfg, self.dev = loader, cfg, dev
        self.evaluate = evaluate
        self.run_dir = run_dir
        self.interrupt = interrupt
        self.on_epoch, self.on_batch, self.on_start = on_epoch, on_batch, on_start
        self.resume = resume
        self.ckpt_root = run_dir / CHECKPOINTS
        self.store_note: str | None = None
        self._tier_ckpt: tuple[int, Path] | None = None     # (epoch, checkpoint holding that epoch's start tier)
        self.resumed_from: str | None = None
        self.store = None
        try:
            self.store = loader.store
        except InputError as e:
            if store is not None:
                raise
            self.store_note = f"evaluation skipped: {e}"
        if not evaluate:
            self.store_note = "evaluation skipped: turned off (evaluate=False)"

    # ------------------------------------------------------------------ pieces
    def _fingerprint(self) -> str:
        m = self.loader.ds.manifest
        return config_hash({"packed": m.get("config_hash"), "store": m.get("store", {}).get("manifest_hash"),
                            **self.cfg.resumable()})

    def _eval_loaders(self) -> dict[str, Any]:
        if self.store is None:
            return {}
        return store_eval_loaders(self.cfg, self.store, self.loader.labels)

    def _save(self, session: TrainSession, epoch: int, batch: int, tier: str) -> Path:
        """Checkpoint at (epoch, batch). tier: "current" (the loader's tier, at an epoch boundary),
        "epoch-start" (the tier saved with this epoch's first checkpoint, linked), or "none"."""
        state: dict[str, Any] = {"fingerprint": self._fingerprint(), "epoch": epoch, "batch": batch,
                                 **session.state_dict()}
        arrays: dict[str, np.ndarray | Path] = {}
        if tier == "current":
            position, rows, ids = self.loader.tier_state()
            first, _ = self.loader.epoch_range(epoch)
            if position != first:
                raise RuntimeError(f"the CPU tier stands before batch {position}, not at epoch {epoch}'s first "
                                   f"batch {first}: the epoch was not drained")
            arrays = {"cpu_rows.npy": rows, "cpu_ids.npy": ids}
        elif tier == "epoch-start" and self._tier_ckpt is not None and self._tier_ckpt[0] == epoch:
            for name in ("cpu_rows.npy", "cpu_ids.npy"):
                if (self._tier_ckpt[1] / name).is_file():
                    arrays[name] = self._tier_ckpt[1] / name
        path = save_checkpoint(self.ckpt_root, epoch, batch, state, arrays)
        self._tier_ckpt = (epoch, path)
        return path

    # ------------------------------------------------------------------ the loop
    def train(self, load_s: float) -> dict[str, Any]:
        cfg, loader = self.cfg, self.loader
        session = TrainSession(cfg, self.dev, loader.dim, loader.num_classes, stages=STAGES, throughput=True,
                               evals=self._eval_loaders if self.evaluate else None,
                               edge_dim=loader.edges.dim if loader.edges is not None else None,
                               hetero=train_target(loader.hetero, loader.ds.path))
        start_epoch, start_batch = 0, 0
        if self.resume and not cfg.data_only:
            latest = latest_checkpoint(self.ckpt_root)
            if latest is not None:
                ck = load_checkpoint(latest)
                start_epoch, start_batch = self._restore(ck, session)
                self._tier_ckpt = (ck.epoch, ck.path)
        stats0 = loader.stats()
        for epoch in range(start_epoch, cfg.epochs):
            first, end = loader.epoch_range(epoch)
            loader.set_epoch(epoch, start=start_batch)
            if self.on_start is not None:
                self.on_start(epoch, end - first - start_batch)
            before = loader.stats()["io"]
            part = session.train(loader, self.on_batch, self.interrupt)
            after = loader.stats()["io"]
            session.count(after["bytes_read"] - before["bytes_read"], after["requests"] - before["requests"])
            if part["stopped"]:                     # Ctrl-C: save where we are (the open epoch too), then stop
                if session.model is not None:
                    self._save(session, epoch, start_batch + len(part["sizes"]), "epoch-start")
                raise KeyboardInterrupt
            start_batch = 0
            record = session.close_epoch(epoch)
            if session.model is not None:
                self._save(session, epoch + 1, 0, "none" if epoch + 1 == cfg.epochs else "current")
            if self.on_epoch is not None:
                self.on_epoch(record)
            if self.interrupt.is_set() and epoch + 1 < cfg.epochs:   # after the last epoch: just finish
                raise KeyboardInterrupt
        return self._report(session.records, load_s, stats0, session.describe())

    def _restore(self, ck: Checkpoint, session: TrainSession) -> tuple[int, int]:
        """Model, optimiser, RNG, records and open epoch from `ck`, and the CPU tier where it stopped."""
        st = ck.state
        check_model_identity(st, self.cfg, ck.path)
        if st.get("fingerprint") != self._fingerprint():
            raise ConfigError("resume", f"the checkpoint {ck.path} was made with other options or another packed "
                                        "dataset; use the same options, or start a new run without resume")
        session.load_state_dict(st, ck.path)
        epoch, batch = ck.epoch, ck.batch
        if epoch >= self.cfg.epochs and batch == 0:
            return epoch, 0
        rows, ids = ck.array("cpu_rows.npy"), ck.array("cpu_ids.npy")
        first, _ = self.loader.epoch_range(epoch)
        if rows is None:
            if epoch != 0:
                raise InputError(ck.path, f"corrupt checkpoint: no CPU tier saved for epoch {epoch}")
            self.loader.restore_tier(0)
        else:
            self.loader.restore_tier(first, np.asarray(rows), np.asarray(ids))
        self.resumed_from = str(ck.path)
        return epoch, batch

    def _report(self, records: list[dict[str, Any]], load_s: float, stats0: dict[str, Any],
                optimizer: dict[str, Any] | None) -> dict[str, Any]:
        cfg, loader = self.cfg, self.loader
        man = loader.ds.manifest
        stats = loader.stats()
        clocks = stats["stages"]
        for k, v in clocks.items():
            clocks[k] = {m: v[m] - stats0["stages"][k][m] for m in v}
        clocks["train"]["busy_s"] = sum(r["stage_s"]["train"] + r["stage_s"]["gather"] for r in records)
        io = {k: (v - stats0["io"].get(k, 0) if isinstance(v, (int, float)) else v) for k, v in stats["io"].items()}
        io["read_amplification"] = io["bytes_read"] / io["useful_bytes"] if io.get("useful_bytes") else None
        st = self.store
        splits = {name: int(st.split_ids(name).shape[0]) for name in ("train", "val", "test")} if st else None
        return {
            "pipeline": str(man.get("pipeline", "packed")),
            "title": f"{man.get('pipeline', 'packed')} (packed): {cfg.model}, fanouts {fanouts_json(cfg.fanouts)}",
            "config": {**cfg.as_json(), "device": str(self.dev), "optimizer": optimizer,
                       "torch_threads": torch.get_num_threads(), "packed": str(loader.path)},
            "dataset": {"packed": str(loader.path), "store": str(st.path) if st else None,
                        "nodes": loader.ds.num_nodes, "dim": loader.dim,
                        "dtype": str(loader.dtype if loader.codec is None else loader.codec.dtype),
                        "num_classes": loader.num_classes, "batches": loader.num_batches,
                        "feature_bytes": loader.ds.num_nodes * (loader.row_bytes if loader.codec is None
                                                                else loader.codec.exact_row_bytes), "splits": splits,
                        **({"rows": rows_block(loader.codec)} if loader.codec is not None else {}),
                        **({"edge_dim": loader.edges.dim, "edge_feature_bytes": loader.edges.ds.num_nodes
                            * loader.edges.row_bytes} if loader.edges is not None else {}),
                        "note": self.store_note},
            "load_s": load_s,
            "epochs": records,
            "final": final_block(records),
            "stage_s": {k: sum(r["stage_s"][k] for r in records) for k in (*STAGES, "eval")},
            "stages": clocks,
            "queues": {
                "depth": loader.queue_depth if loader.pipelined else 0,
                "load->assemble": {"producer_blocked_s": clocks["load"]["blocked_s"],
                                   "consumer_starved_s": clocks["assemble"]["starved_s"]},
                "assemble->train": {"producer_blocked_s": clocks["assemble"]["blocked_s"]},
                "graph->train": {"producer_blocked_s": clocks["graph"]["blocked_s"]},
                "train_starved_s": clocks["train"]["starved_s"],
            },
            "io": io,
            "tiers": _tiers({k: stats["tiers"]["rows"][k] - stats0["tiers"]["rows"][k] for k in stats["tiers"]["rows"]}),
            "memory": {**loader.memory, **_peak_rss()},
            **_peak_rss(),
            "checkpoint": str(latest_checkpoint(self.ckpt_root)) if latest_checkpoint(self.ckpt_root) else None,
            "resumed_from": self.resumed_from,
            "run_dir": str(self.run_dir),
        }
