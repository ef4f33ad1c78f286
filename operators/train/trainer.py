"""The pipelined trainer: train a GNN from a packed dataset (DiskGNN §5.3), with checkpoints and resume.

Four stages as threads joined by bounded queues, batch order preserved (DiskGNN Fig. 7, two
paths: load -> assemble -> train and graph -> train): stages 1-3 are `load.PackedLoader`'s,
stage 4 (forward, backward, step) is `operators.train.train_epoch` in the caller's thread, so
the training math is exactly the in-memory pipeline's. With the same seed, the packed round's
batches are the in-memory pipeline's batches (`operators.superbatch` samples them with
`seed_batches`/`batch_seed`), the model is built after the same `torch.manual_seed`, and the
per-batch losses are identical.

Memory: the budgets are checked before anything is allocated (`load.check_memory`). Each
epoch drains the pipeline, so at an epoch boundary the CPU tier is exactly the plan's state
there; that is when a checkpoint saves it (with model, optimizer, RNG and position). A first
Ctrl-C stops training at the next batch boundary and saves a mid-epoch checkpoint (the
model after exactly that many steps; the CPU tier of the epoch start, which resume
fast-forwards through the epoch's finished batches without training), then raises
KeyboardInterrupt; a second Ctrl-C interrupts at once.
"""
from __future__ import annotations

import contextlib
import math
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

from ..formats.errors import ConfigError, InputError
from ..formats.files import config_hash
from ..prepare.sample import NeighborSampler
from .batches import TEST_STREAM, VAL_STREAM, InMemoryLoader
from .checkpoint import Checkpoint, latest_checkpoint, load_checkpoint, save_checkpoint
from .loader import PackedLoader
from .loop import TrainConfig, deterministic, evaluate, train_epoch
from .models import build_model

CHECKPOINTS = "checkpoints"
DATA_ONLY = "none"      # model name that runs only the data path (timing)
EpochHook = Callable[[dict[str, Any]], None]


class StoreFeatures:
    """The store's features as `InMemoryLoader` gathers them (`index_select`), read via `Store.gather`.

    Evaluation then samples and batches exactly as the in-memory pipeline does (same seed
    streams, same order), without a full in-RAM copy of the features.
    """

    device = torch.device("cpu")

    def __init__(self, store: Any) -> None:
        self.store = store

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        assert dim == 0
        return torch.from_numpy(self.store.gather(index.numpy()))


class _Feed:
    """The loader as `train_epoch` sees it: stops early (cleanly, between batches) when asked to."""

    def __init__(self, loader: PackedLoader, interrupt: threading.Event,
                 on_batch: Callable[[int], Any] | None) -> None:
        self.loader = loader
        self.interrupt = interrupt
        self.on_batch = on_batch
        self.sizes: list[int] = []
        self.stopped = False

    @property
    def stage_s(self) -> dict[str, float]:
        return self.loader.stage_s

    def __iter__(self) -> Iterator[Data]:
        for batch in self.loader:
            if self.interrupt.is_set():
                self.stopped = True
                return
            self.sizes.append(int(batch.batch_size))
            yield batch
            if self.on_batch is not None:
                self.on_batch(1)


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


def _device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError("--device", f"not a torch device: {device!r}") from e
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError("--device", f"expected 'cpu' or 'cuda[:N]', got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", f"{device!r} requested but CUDA is not available on this machine")
    return dev


def _num(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _tiers(rows: dict[str, int]) -> dict[str, Any]:
    total = sum(rows.values())
    return {"rows": rows, "total": total, "rates": {k: (v / total if total else None) for k, v in rows.items()}}


def _peak_rss() -> dict[str, int]:
    import psutil

    return {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "rss_bytes": int(psutil.Process().memory_info().rss)}


def train_packed(packed: str | os.PathLike[str], run_dir: str | os.PathLike[str], *, model: str = "sage",
                 hidden: int = 128, num_layers: int | None = None, lr: float = 3e-3, dropout: float = 0.2,
                 heads: int = 4, seed: int | None = None, device: str = "cpu", eval_every: int = 1,
                 cpu_memory: int | None = None, gpu_memory: int | None = None, queue_depth: int = 2,
                 sequential: bool = False, check_crc: bool = True, resume: bool = False,
                 store: str | os.PathLike[str] | None = None, threads: int | None = None,
                 on_epoch: EpochHook | None = None, on_batch: Callable[[int], Any] | None = None,
                 on_start: Callable[[int, int], Any] | None = None, evaluate: bool = True) -> dict[str, Any]:
    """Train on a packed dataset with the four-stage pipeline; checkpoint every epoch into `run_dir`.

    Args:
        packed: a finished packed dataset (`diskflow prepare`); its round fixes the epochs,
            batches and samples (fanouts, batch size, sampling seed).
        run_dir: an existing directory; checkpoints go to ``run_dir/checkpoints``.
        model: "sage", "gcn", "gat", "mlp", or "none" (the data path only, for timing).
        hidden, num_layers, lr, dropout, heads: as the in-memory pipeline (`TrainConfig`).
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
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError("--threads", f"expected an integer >= 1, got {threads!r}")
    dev = _device(device)
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    loader = PackedLoader(packed, dev, cpu_memory=cpu_memory, queue_depth=queue_depth, pipelined=not sequential,
                          check_crc=check_crc, store=store, gpu_memory=gpu_memory)
    try:
        with deterministic(), deferred_interrupt() as interrupt:
            report = _Run(loader, run_dir, dev, model, hidden, num_layers, lr, dropout, heads, seed, eval_every,
                          resume, store, interrupt, on_epoch, on_batch, on_start,
                          evaluate).train(time.perf_counter() - t0)
    finally:
        loader.close()
        torch.set_num_threads(old_threads)
    report["config"].update(threads=threads, cpu_memory=cpu_memory, gpu_memory=gpu_memory, queue_depth=queue_depth,
                            sequential=bool(sequential), check_crc=bool(check_crc))
    report["wall_s"] = time.perf_counter() - wall0
    return report


class _Run:
    """One training run over a loader: model, optimizer, evaluation, checkpoints, records."""

    def __init__(self, loader: PackedLoader, run_dir: Path, dev: torch.device, model: str, hidden: int,
                 num_layers: int | None, lr: float, dropout: float, heads: int, seed: int | None, eval_every: int,
                 resume: bool, store: str | os.PathLike[str] | None, interrupt: threading.Event,
                 on_epoch: EpochHook | None, on_batch: Callable[[int], Any] | None,
                 on_start: Callable[[int, int], Any] | None, evaluate: bool = True) -> None:
        self.loader = loader
        self.evaluate = evaluate
        self.run_dir = run_dir
        self.dev = dev
        self.interrupt = interrupt
        self.on_epoch, self.on_batch, self.on_start = on_epoch, on_batch, on_start
        man = loader.ds.manifest
        rc = man.get("config", {})
        self.data_only = model == DATA_ONLY
        try:
            self.cfg = TrainConfig(model="sage" if self.data_only else model, hidden=hidden, num_layers=num_layers,
                                   fanouts=tuple(rc["fanouts"]), batch_size=int(rc["batch_size"]),
                                   epochs=int(man["round"]["epochs"]), lr=lr, dropout=dropout, heads=heads,
                                   seed=int(rc["seed"]) if seed is None else seed, eval_every=eval_every)
        except (KeyError, TypeError) as e:
            raise InputError(loader.path / "manifest.json", f"malformed round config ({e})") from e
        self.model_name = model
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
                            "model": self.model_name, **{k: v for k, v in asdict(self.cfg).items() if k != "model"}})

    def _eval_loaders(self) -> dict[str, InMemoryLoader]:
        st = self.store
        if st is None:
            return {}
        sampler = NeighborSampler(st.indptr, st.indices, list(self.cfg.fanouts), num_threads=torch.get_num_threads())
        feats, labels = StoreFeatures(st), torch.from_numpy(self.loader.labels)
        return {name: InMemoryLoader(feats, labels, sampler, st.split_ids(name), self.cfg.batch_size,  # type: ignore[arg-type]
                                     False, self.cfg.seed, stream)
                for name, stream in (("val", VAL_STREAM), ("test", TEST_STREAM))}

    def _save(self, epoch: int, batch: int, net: torch.nn.Module | None, opt: torch.optim.Optimizer | None,
              records: list[dict[str, Any]], partial: dict[str, Any] | None, tier: str) -> Path:
        """Checkpoint at (epoch, batch). tier: "current" (the loader's tier, at an epoch boundary),
        "epoch-start" (the tier saved with this epoch's first checkpoint, linked), or "none"."""
        state: dict[str, Any] = {
            "fingerprint": self._fingerprint(), "epoch": epoch, "batch": batch, "records": records,
            "partial": partial, "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.dev.type == "cuda" else [],
            "model": net.state_dict() if net is not None else {},
            "optimizer": opt.state_dict() if opt is not None else {},
        }
        arrays: dict[str, np.ndarray | Path] = {}
        if tier == "current":
            position, rows, ids = self.loader.tier_state()
            first, _ = self.loader.epoch_range(epoch)
            assert position == first, (position, first)
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
        cfg, loader, dev = self.cfg, self.loader, self.dev
        torch.manual_seed(cfg.seed)
        net: torch.nn.Module | None = None
        opt: torch.optim.Optimizer | None = None
        if not self.data_only:
            net = build_model(cfg.model, loader.dim, cfg.hidden, loader.num_classes, int(cfg.num_layers or 1),
                              dropout=cfg.dropout, heads=cfg.heads).to(dev)
            opt = torch.optim.Adam(net.parameters(), lr=cfg.lr)
        evals = self._eval_loaders() if self.evaluate else {}
        records: list[dict[str, Any]] = []
        start_epoch, start_batch, partial = 0, 0, None
        if self.resume and not self.data_only:
            latest = latest_checkpoint(self.ckpt_root)
            if latest is not None:
                ck = load_checkpoint(latest)
                start_epoch, start_batch, partial, records = self._restore(ck, net, opt)
                self._tier_ckpt = (ck.epoch, ck.path)
        stats0 = loader.stats()
        for epoch in range(start_epoch, cfg.epochs):
            first, end = loader.epoch_range(epoch)
            loader.set_epoch(epoch, start=start_batch)
            if self.on_start is not None:
                self.on_start(epoch, end - first - start_batch)
            feed = _Feed(loader, self.interrupt, self.on_batch)
            before = loader.stats()
            if net is None or opt is None:
                result = self._data_only(feed)
            else:
                result = train_epoch(net, feed, opt, dev)
            record = self._record(epoch, result, feed, partial, before)
            if feed.stopped:                        # Ctrl-C: save where we are, then stop
                if net is not None:
                    self._save(epoch, start_batch + len(feed.sizes), net, opt, records, record["partial"],
                               "epoch-start")
                raise KeyboardInterrupt
            record.pop("partial")
            start_batch, partial = 0, None
            if evals and ((epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs):
                t = time.perf_counter()
                record["val_acc"] = _num(evaluate(net, evals["val"], dev)) if net is not None else None
                record["test_acc"] = _num(evaluate(net, evals["test"], dev)) if net is not None else None
                record["stage_s"]["eval"] = time.perf_counter() - t
            records.append(record)
            if net is not None:
                self._save(epoch + 1, 0, net, opt, records, None, "none" if epoch + 1 == cfg.epochs else "current")
            if self.on_epoch is not None:
                self.on_epoch(record)
            if self.interrupt.is_set() and epoch + 1 < cfg.epochs:   # after the last epoch: just finish
                raise KeyboardInterrupt
        return self._report(records, load_s, stats0)

    def _restore(self, ck: Checkpoint, net: torch.nn.Module | None, opt: torch.optim.Optimizer | None
                 ) -> tuple[int, int, dict[str, Any] | None, list[dict[str, Any]]]:
        st = ck.state
        if st.get("fingerprint") != self._fingerprint():
            raise ConfigError("--resume", f"the checkpoint {ck.path} was made with other options or another packed "
                                          "dataset; use the same options, or start a new run without --resume")
        try:
            if net is not None:
                net.load_state_dict(st["model"])
            if opt is not None:
                opt.load_state_dict(st["optimizer"])
            torch.set_rng_state(st["rng"])
            if self.dev.type == "cuda" and st.get("cuda_rng"):
                torch.cuda.set_rng_state_all(st["cuda_rng"])
        except (KeyError, RuntimeError, ValueError) as e:
            raise InputError(ck.path, f"corrupt checkpoint: cannot restore the training state ({e})") from e
        epoch, batch = ck.epoch, ck.batch
        if epoch >= self.cfg.epochs and batch == 0:
            return epoch, 0, None, list(st["records"])
        rows, ids = ck.array("cpu_rows.npy"), ck.array("cpu_ids.npy")
        first, _ = self.loader.epoch_range(epoch)
        if rows is None:
            if epoch != 0:
                raise InputError(ck.path, f"corrupt checkpoint: no CPU tier saved for epoch {epoch}")
            self.loader.restore_tier(0)
        else:
            self.loader.restore_tier(first, np.asarray(rows), np.asarray(ids))
        self.resumed_from = str(ck.path)
        return epoch, batch, st.get("partial"), list(st["records"])

    def _data_only(self, feed: _Feed) -> dict[str, Any]:
        start = time.perf_counter()
        seen = batches = 0
        for batch in feed:
            seen += int(batch.batch_size)
            batches += 1
        return {"loss": math.nan, "losses": [], "train_acc": math.nan, "seeds": seen, "batches": batches,
                "seconds": time.perf_counter() - start, "stage_s": dict(feed.stage_s)}

    def _record(self, epoch: int, result: dict[str, Any], feed: _Feed, partial: dict[str, Any] | None,
                before: dict[str, Any]) -> dict[str, Any]:
        """One epoch's record; a resumed epoch's first part (`partial`) is merged in batch order."""
        losses = list(result["losses"])
        sizes = list(feed.sizes)
        correct = round(result["train_acc"] * result["seeds"]) if result["losses"] else 0
        seconds = result["seconds"]
        stage = {k: float(result["stage_s"].get(k, 0.0)) for k in ("load", "assemble", "graph", "gather", "train")}
        if partial is not None:
            losses = list(partial["losses"]) + losses
            sizes = list(partial["sizes"]) + sizes
            correct += int(partial["correct"])
            seconds += float(partial["seconds"])
            stage = {k: v + float(partial["stage_s"].get(k, 0.0)) for k, v in stage.items()}
        seen = sum(sizes)
        total = 0.0
        for value, size in zip(losses, sizes):      # the same sum, in the same order, as train_epoch's
            total += value * size
        after = self.loader.stats()
        io = {k: after["io"][k] - before["io"][k] for k in ("bytes_read", "requests")}
        return {
            "epoch": epoch + 1,
            "loss": _num(total / seen) if losses and seen else None,
            "losses": losses,
            "train_acc": _num(correct / seen) if losses and seen else None,
            "val_acc": None, "test_acc": None,
            "epoch_s": seconds,
            "seeds_per_s": seen / seconds if seconds > 0 else None,
            "batches_per_s": len(sizes) / seconds if seconds > 0 else None,
            "bytes_read": int(io["bytes_read"]), "requests": int(io["requests"]),
            "stage_s": {**stage, "eval": 0.0},
            "partial": {"losses": losses, "sizes": sizes, "correct": correct, "seconds": seconds, "stage_s": stage},
        }

    def _report(self, records: list[dict[str, Any]], load_s: float, stats0: dict[str, Any]) -> dict[str, Any]:
        cfg, loader = self.cfg, self.loader
        man = loader.ds.manifest
        stats = loader.stats()
        clocks = stats["stages"]
        for k, v in clocks.items():
            clocks[k] = {m: v[m] - stats0["stages"][k][m] for m in v}
        clocks["train"]["busy_s"] = sum(r["stage_s"]["train"] + r["stage_s"]["gather"] for r in records)
        io = {k: (v - stats0["io"].get(k, 0) if isinstance(v, (int, float)) else v) for k, v in stats["io"].items()}
        io["read_amplification"] = io["bytes_read"] / io["useful_bytes"] if io.get("useful_bytes") else None
        evaluated = [r for r in records if r["val_acc"] is not None]
        best = max(evaluated, key=lambda r: r["val_acc"], default=None)
        last = evaluated[-1] if evaluated else None
        st = self.store
        splits = {name: int(st.split_ids(name).shape[0]) for name in ("train", "val", "test")} if st else None
        return {
            "pipeline": str(man.get("pipeline", "packed")),
            "title": f"{man.get('pipeline', 'packed')} (packed): {self.model_name}, fanouts {list(cfg.fanouts)}",
            "config": {**asdict(cfg), "model": self.model_name, "fanouts": list(cfg.fanouts), "device": str(self.dev),
                       "torch_threads": torch.get_num_threads(), "packed": str(loader.path)},
            "dataset": {"packed": str(loader.path), "store": str(st.path) if st else None,
                        "nodes": loader.ds.num_nodes, "dim": loader.dim, "dtype": str(loader.dtype),
                        "num_classes": loader.num_classes, "batches": loader.num_batches,
                        "feature_bytes": loader.ds.num_nodes * loader.row_bytes, "splits": splits,
                        "note": self.store_note},
            "load_s": load_s,
            "epochs": records,
            "final": {
                "test_acc": last["test_acc"] if last else None,
                "best_val_acc": best["val_acc"] if best else None,
                "best_epoch": best["epoch"] if best else None,
                "test_acc_at_best_val": best["test_acc"] if best else None,
                "train_s": sum(r["epoch_s"] for r in records),
                "epoch_s_mean": sum(r["epoch_s"] for r in records) / len(records) if records else None,
            },
            "stage_s": {k: sum(r["stage_s"][k] for r in records)
                        for k in ("load", "assemble", "graph", "gather", "train", "eval")},
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
