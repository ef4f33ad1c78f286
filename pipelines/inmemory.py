"""The in-memory pipeline: every feature in RAM, sample and gather per batch, train.

This is the accuracy reference and the speed ceiling for the out-of-core pipelines: they
train the same model with the same loop (`operators.train`) on the same batches
(`operators.batches`: same seed order, same sampling seeds), and differ only in where a
batch's rows come from. Evaluation is minibatch inference with the training fanouts over
the validation and test seeds, on the same samples every epoch.

    diskflow run inmemory --dataset STORE [--model sage|gcn|gat|mlp] ...
"""
from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

from ..flow.progress import bar
from ..flow.rundir import plot_curves, write_report
from ..operators.batches import TEST_STREAM, TRAIN_STREAM, VAL_STREAM, InMemoryLoader
from ..operators.errors import ConfigError, InputError
from ..operators.models import build_model
from ..operators.sample import NeighborSampler
from ..operators.store import Store
from ..operators.train import TrainConfig, deterministic, evaluate, train_epoch

NAME = "inmemory"


def run(store: str | os.PathLike[str], run_dir: str | os.PathLike[str], *, model: str = "sage",
        hidden: int = 128, num_layers: int | None = None, fanouts: Sequence[int] = (10, 10, 10),
        batch_size: int = 1024, epochs: int = 3, lr: float = 3e-3, dropout: float = 0.2, heads: int = 4,
        seed: int = 0, device: str = "cpu", eval_every: int = 1, threads: int | None = None,
        progress: bool = True, on_epoch: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train `model` on a store held in RAM; write `report.json` and `curves.png` into `run_dir`.

    Args:
        store: an ingested store directory.
        run_dir: an existing directory for this run's outputs (see `flow.rundir.new_run_dir`).
        model: "sage", "gcn", "gat" or "mlp" (the same features, no graph).
        hidden, num_layers, dropout, heads: model shape (`num_layers` defaults to `len(fanouts)`).
        fanouts: neighbours sampled per hop (-1: all).
        batch_size, epochs, lr, seed: training; with the same seed two runs give the same losses.
        device: "cpu" or a CUDA device; features stay in host RAM, batches are copied over.
        eval_every: evaluate val/test every this many epochs (and always after the last one).
        threads: torch and sampler threads (default: torch's own setting).
        progress: show a progress bar per epoch (on a terminal).
        on_epoch: called with each epoch's record as soon as it is complete.

    Returns:
        The report (also written to `run_dir/report.json`): `config`, `dataset`, `epochs`
        (per epoch: loss, per-batch losses, accuracies, `epoch_s` and `stage_s`), `final`
        (last and best-validation accuracies, training seconds), `stage_s` (summed over
        epochs), `load_s`, `peak_rss_bytes` (of this process, lifetime), `wall_s`.
    """
    wall0 = time.perf_counter()
    cfg = TrainConfig(model=model, hidden=hidden, num_layers=num_layers, fanouts=tuple(fanouts),
                      batch_size=batch_size, epochs=epochs, lr=lr, dropout=dropout, heads=heads, seed=seed,
                      eval_every=eval_every)
    dev = _device(device)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ConfigError("--threads", f"expected an integer >= 1, got {threads!r}")
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(run_dir, "run directory does not exist")

    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with deterministic():
            report = _train(Store(store), run_dir, cfg, dev, threads, progress, on_epoch)
    finally:
        torch.set_num_threads(old_threads)
    report["wall_s"] = time.perf_counter() - wall0
    write_report(run_dir, report)
    plot_curves(run_dir, report)
    return report


def _train(st: Store, run_dir: Path, cfg: TrainConfig, dev: torch.device, threads: int | None, progress: bool,
           on_epoch: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
    t0 = time.perf_counter()
    features = torch.from_numpy(st.read_features())
    labels = torch.from_numpy(np.asarray(st.labels, dtype=np.int64))
    indptr, indices = np.array(st.indptr), np.array(st.indices)  # RAM copies of the CSC
    load_s = time.perf_counter() - t0
    splits = {name: st.split_ids(name) for name in ("train", "val", "test")}
    _check_labels(st, labels, splits)

    sampler = NeighborSampler(indptr, indices, list(cfg.fanouts), num_threads=threads)
    loaders = {
        "train": InMemoryLoader(features, labels, sampler, splits["train"], cfg.batch_size, True, cfg.seed,
                                TRAIN_STREAM),
        "val": InMemoryLoader(features, labels, sampler, splits["val"], cfg.batch_size, False, cfg.seed,
                              VAL_STREAM),
        "test": InMemoryLoader(features, labels, sampler, splits["test"], cfg.batch_size, False, cfg.seed,
                               TEST_STREAM),
    }
    torch.manual_seed(cfg.seed)
    net = build_model(cfg.model, st.feature_dim, cfg.hidden, st.num_classes, int(cfg.num_layers or 1),
                      dropout=cfg.dropout, heads=cfg.heads).to(dev)
    optimizer = torch.optim.Adam(net.parameters(), lr=cfg.lr)

    records: list[dict[str, Any]] = []
    for epoch in range(cfg.epochs):
        loaders["train"].set_epoch(epoch)
        with bar(total=len(loaders["train"]), desc=f"{NAME} {cfg.model} epoch {epoch + 1}/{cfg.epochs}",
                 unit="batch", disable=None if progress else True) as b:
            result = train_epoch(net, _Ticking(loaders["train"], b.update), optimizer, dev)
        record: dict[str, Any] = {
            "epoch": epoch + 1, "loss": _num(result["loss"]), "losses": result["losses"],
            "train_acc": _num(result["train_acc"]), "val_acc": None, "test_acc": None,
            "epoch_s": result["seconds"],
            "stage_s": {"sample": result["stage_s"].get("sample", 0.0),
                        "gather": result["stage_s"].get("gather", 0.0),
                        "train": result["stage_s"]["train"], "eval": 0.0},
        }
        if (epoch + 1) % cfg.eval_every == 0 or epoch + 1 == cfg.epochs:
            t_eval = time.perf_counter()
            record["val_acc"] = _num(evaluate(net, loaders["val"], dev))
            record["test_acc"] = _num(evaluate(net, loaders["test"], dev))
            record["stage_s"]["eval"] = time.perf_counter() - t_eval
        records.append(record)
        if on_epoch is not None:
            on_epoch(record)

    return {
        "pipeline": NAME,
        "title": f"{NAME}: {cfg.model}, fanouts {list(cfg.fanouts)}",
        "config": {**asdict(cfg), "fanouts": list(cfg.fanouts), "device": str(dev),
                   "threads": threads, "torch_threads": torch.get_num_threads()},
        "dataset": {"store": str(st.path), "nodes": st.num_nodes, "edges": st.num_edges,
                    "dim": st.feature_dim, "dtype": str(st.feature_dtype), "feature_bytes": st.feature_bytes,
                    "num_classes": st.num_classes,
                    "splits": {name: int(ids.shape[0]) for name, ids in splits.items()}},
        "load_s": load_s,
        "epochs": records,
        "final": _final(records),
        "stage_s": {k: sum(r["stage_s"][k] for r in records) for k in ("sample", "gather", "train", "eval")},
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "run_dir": str(run_dir),
    }


class _Ticking:
    """A loader that calls `tick(1)` after each batch it yields, keeping the loader's `stage_s`."""

    def __init__(self, loader: InMemoryLoader, tick: Callable[[int], Any]) -> None:
        self.loader = loader
        self.tick = tick

    @property
    def stage_s(self) -> dict[str, float]:
        return self.loader.stage_s

    def __iter__(self) -> Iterator[Data]:
        for batch in self.loader:
            yield batch
            self.tick(1)


def _device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError("--device", f"not a torch device: {device!r}") from e
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device", f"{device!r} requested but CUDA is not available on this machine")
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError("--device", f"expected 'cpu' or 'cuda[:N]', got {device!r}")
    return dev


def _check_labels(st: Store, labels: torch.Tensor, splits: dict[str, np.ndarray]) -> None:
    if splits["train"].size == 0:
        raise InputError(st.path / st.manifest["splits"], "no training nodes (split 'train' is empty)")
    for name, ids in splits.items():
        y = labels[torch.from_numpy(ids)]
        bad = (y < 0) | (y >= st.num_classes)
        if bool(bad.any()):
            node = int(ids[int(torch.nonzero(bad)[0, 0])])
            raise InputError(st.path / st.manifest["labels"],
                             f"node {node} of split {name!r} has label {int(labels[node])}, "
                             f"expected 0..{st.num_classes - 1}")


def _num(x: float) -> float | None:
    """A float for the report; None for NaN (e.g. accuracy of an empty split)."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _final(records: list[dict[str, Any]]) -> dict[str, Any]:
    evaluated = [r for r in records if r["val_acc"] is not None]
    best = max(evaluated, key=lambda r: r["val_acc"], default=None)  # first epoch wins ties
    last = evaluated[-1] if evaluated else None
    return {
        "test_acc": last["test_acc"] if last else None,
        "best_val_acc": best["val_acc"] if best else None,
        "best_epoch": best["epoch"] if best else None,
        "test_acc_at_best_val": best["test_acc"] if best else None,
        "train_s": sum(r["epoch_s"] for r in records),
        "epoch_s_mean": sum(r["epoch_s"] for r in records) / len(records) if records else None,
    }
