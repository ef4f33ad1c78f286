"""The training loop the in-memory, memory-mapped and online pipelines share: `gathered_run`.

Every batch is sampled here (or read from a packed dataset's stored samples, `StoredSamplesLoader`)
and its rows gathered from a feature source: the features in RAM (`flow.runtimes.memory`), memory-mapped
store shards (`flow.runtimes.mmap`), or a pipeline's own training loader (`TrainLoader`: the online
pipelines', `flow.runtimes.online`). Training is the one `operators.train.session.TrainSession`, on
the same batches (`operators.train.batches`: same seed order, same sampling seeds), so the pipelines
differ only in where a batch's rows come from. Evaluation is minibatch inference with the training
fanouts over the validation and test seeds, on the same samples every epoch.

Here too: what the loop's batches need before it starts (their order, `batch_order`; the historical
embedding cache's planner, `history_planner`; the stored samples' label prior). Kept apart from
`flow.runtimes.memory`, the in-memory pipeline, because three pipelines run this loop and only one
of them holds its features in RAM.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import resource
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch_geometric.data import Data

from ...errors import ConfigError, InputError
from ...operators.formats.hashing import config_hash
from ...operators.formats.packed import PackedDataset
from ...operators.formats.store import Store
from ...operators.prepare.history import (
    DEFAULT_COOLDOWN,
    DEFAULT_PRUNE,
    DEFAULT_RAMP,
    EMBEDDING_BYTES,
    EMBEDDING_DTYPE,
    HISTORY_SELECTS,
    HistoryPlanner,
    history_nodes,
    history_nodes_by_count,
    history_rows,
    planned_width,
    refuse_without_cache,
    staleness_rule,
)
from ...operators.prepare.partition import default_parts
from ...operators.prepare.round import RoundOptions
from ...operators.prepare.sample import NeighborSampler
from ...operators.prepare.samplers import refuse_typed, store_sampler, train_target
from ...operators.prepare.seeds import BATCH_ORDERS, PARTS_PER_GROUP, BatchOrder, label_shares, load_parts
from ...operators.prepare.superbatch import round_layout, superbatch_hop1
from ...operators.prepare.task import SeedSource, num_seeds
from ...operators.prepare.typedsample import TypedNeighborSampler, as_fanouts, fanouts_json
from ...operators.train.batches import TRAIN_STREAM, InMemoryLoader, timed_data
from ...operators.train.config import DATA_ONLY
from ...operators.train.loop import deterministic
from ...operators.train.session import (
    StoreFeatures,
    TrainConfig,
    TrainSession,
    eval_loaders,
    final_block,
    resolve_device,
    torch_threads,
)
from ..options import history_rule
from ..progress import bar
from ..rundir import plot_curves, write_report

__all__ = ["STAGES", "EpochHook", "StoredSamplesLoader", "TrainLoader", "batch_order", "gathered_run",
           "history_planner", "stored_label_prior"]

STAGES = ("sample", "gather", "train")      # the in-memory loader's stages, and the step
EpochHook = Callable[[dict[str, Any]], None]


def gathered_run(name: str, *, features: Callable[[Store], Any] | None, store: str | os.PathLike[str],
                 run_dir: str | os.PathLike[str],
                 model: str, hidden: int, num_layers: int | None, fanouts: Sequence[int], batch_size: int,
                 epochs: int, lr: float, weight_decay: float, clip_grad: float | None, dropout: float, heads: int,
                 seed: int, device: str, eval_every: int,
                 threads: int | None, samples: str | os.PathLike[str] | None, progress: bool,
                 on_epoch: EpochHook | None, on_batch: Callable[[int], Any] | None,
                 on_start: Callable[[int, int], Any] | None, batches: str = RoundOptions.batches,
                 partition: str | os.PathLike[str] | None = None, partitions: int | None = None,
        parts_per_group: int = RoundOptions.parts_per_group, group_by: str = RoundOptions.group_by,
        history_memory: int | str | None = None,
        history_staleness: int | None = None, history_select: str = RoundOptions.history_select,
        history_prune: str | None = None, history_ramp: float | None = None,
        history_cooldown: float | None = None, train_loader: TrainLoader | None = None,
        task: str = TrainConfig.task, neg_ratio: float = TrainConfig.neg_ratio,
        neg_sampling: str = TrainConfig.neg_sampling, hits_k: int = TrainConfig.hits_k) -> dict[str, Any]:
    """The loop behind `run`: batches gathered from features in RAM, or from another feature source.

    Args:
        name: labels the report and the progress bars.
        features: None to read every feature into RAM (and copy the topology there); else a
            function of the store returning an object with ``index_select(0, n_id)`` and
            ``device`` (as a tensor), e.g. memory-mapped shards; the topology stays mapped.
        train_loader: None (training batches from `InMemoryLoader` over `features`), or a
            `TrainLoader` that makes the training loader itself (the online pipelines': the same
            batches, their rows from elsewhere); `features` then serve evaluation only.
        The other arguments are `run`'s.
    """
    wall0 = time.perf_counter()
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError(run_dir, "run directory does not exist")
    st = Store(store)
    # the training options, checked before anything is partitioned or drawn (the cache's rows and the label
    # prior join them below, once known)
    base = TrainConfig(model=model, hidden=hidden, num_layers=num_layers, fanouts=as_fanouts(fanouts),
                       batch_size=batch_size, epochs=epochs, lr=lr, weight_decay=weight_decay, clip_grad=clip_grad,
                       dropout=dropout, heads=heads, seed=seed, eval_every=eval_every, threads=threads, task=task,
                       neg_ratio=neg_ratio, neg_sampling=neg_sampling, hits_k=hits_k)
    base.train_task.check(st)
    base.train_task.check_batches(batches)
    rule = history_rule(None, history_staleness=history_staleness, history_prune=history_prune,
                        history_ramp=history_ramp, history_cooldown=history_cooldown)   # None: the library's
    staleness: int = rule["history_staleness"]
    prune: str = rule["history_prune"]
    ramp: float = rule["history_ramp"]
    cooldown: float = rule["history_cooldown"]
    if samples is not None and batches != "shuffled":
        raise ConfigError("batches", "the stored samples fix the batches; partition batches come "
                                     "from a packed dataset prepared with batches='partition'")
    order, part_figures = batch_order(st, run_dir, batches, partition, partitions, seed, parts_per_group, group_by,
                                      batch_size=batch_size)
    round_hop1 = functools.partial(_round_hop1, st, batch_size, as_fanouts(fanouts), seed, epochs, order, threads)
    total = epochs * -(-num_seeds(st, base.train_task) // batch_size)
    make_planner, rows = history_planner(st, history_memory, staleness, hidden, samples,
                                         model == DATA_ONLY, history_select, round_hop1, prune, total,
                                         ramp, cooldown)
    prior = label_shares(st.labels[st.split_ids("train")], st.num_classes) if order is not None else \
        stored_label_prior(samples)
    cfg = dataclasses.replace(base, history_rows=rows, label_prior=prior)
    dev = resolve_device(device)
    planner = None if make_planner is None else make_planner()     # draws ahead only once the options are good
    how = _Run(name, features, samples, on_batch, on_start)
    how.order, how.history, how.loader = order, planner, train_loader
    with torch_threads(cfg.threads), deterministic():
        report = _train(st, run_dir, cfg, dev, progress, on_epoch, how)
    report["config"]["batches"] = batches
    if part_figures is not None:
        report["partition"] = part_figures
    if planner is not None:
        report["history"] = {"rows": rows, "staleness": staleness, "prune": prune,
                             **staleness_rule(ramp, cooldown),
                             "bytes": rows * cfg.hidden * EMBEDDING_BYTES,
                             "pruned": sum(e["history"]["pruned"] for e in report["epochs"]),
                             "pushed": sum(e["history"]["pushed"] for e in report["epochs"])}
    if train_loader is not None:
        report.update(train_loader.report())
        report["config"]["features"] = train_loader.features
    elif rows and samples is not None:      # planned with the stored samples
        with PackedDataset(samples) as ds:
            report["history"] = dict(ds.manifest["figures"]["history"])
    report["wall_s"] = time.perf_counter() - wall0
    write_report(run_dir, report)
    if not cfg.data_only:       # a data-only run has no losses or accuracies to plot
        plot_curves(run_dir, report)
    return report


class _Run:
    """What varies between the pipelines built on `gathered_run`, and the caller's hooks."""

    def __init__(self, name: str, features: Callable[[Store], Any] | None,
                 samples: str | os.PathLike[str] | None, on_batch: Callable[[int], Any] | None,
                 on_start: Callable[[int, int], Any] | None) -> None:
        self.name, self.features, self.samples = name, features, samples
        self.on_batch, self.on_start = on_batch, on_start
        self.order: BatchOrder | None = None
        self.history: HistoryPlanner | None = None
        self.loader: TrainLoader | None = None


class TrainLoader(Protocol):
    """What makes a pipeline's own training loader for `gathered_run` (the online pipelines)."""

    stages: tuple[str, ...]     # the loader's `stage_s` keys (the session adds ``train``)
    features: str               # where rows come from, for the report's config

    def make(self, st: Store, labels: torch.Tensor, sampler: NeighborSampler | TypedNeighborSampler, seeds: np.ndarray, cfg: TrainConfig,
             order: BatchOrder | None) -> Any:
        """The training loader: `set_epoch`, `len`, iterating `Data`, `stage_s`, `counts`."""

    def epoch_record(self, loader: Any) -> dict[str, Any]:
        """What the report's epoch record adds after an epoch of `loader`."""

    def report(self) -> dict[str, Any]:
        """What the report adds after the run (e.g. the loader's memory)."""


def _round_hop1(st: Store, batch_size: int, fanouts: tuple[int, ...], seed: int, epochs: int,
                order: BatchOrder | None, threads: int | None) -> list[list[np.ndarray]]:
    """Every training batch's one-hop nodes, epoch by epoch, as the full samples will draw them (the same
    function `diskflow prepare`'s ``hop1`` tasks run)."""
    refs = round_layout(int(st.split_ids("train").shape[0]), batch_size, 64, epochs)
    return [superbatch_hop1(st.path, r, batch_size, fanouts, seed, threads, order) for r in refs]


def history_planner(st: Store, memory: int | str | None, staleness: int, hidden: int,
                    samples: str | os.PathLike[str] | None, data_only: bool = False, select: str = "degree",
                    round_hop1: Callable[[], list[list[np.ndarray]]] | None = None, prune: str = DEFAULT_PRUNE,
                    total: int | None = None, ramp: float = DEFAULT_RAMP,
                    cooldown: float = DEFAULT_COOLDOWN) -> tuple[Callable[[], HistoryPlanner] | None, int]:
    """What makes the historical embedding cache's planner, and its rows, for `memory` bytes (None and 0:
    no cache), its nodes chosen by `select` (``"accesses"``: the round's most frequent one-hop nodes,
    from `round_hop1`, as `diskflow prepare` chooses them; ``"degree"``). The planner is made when
    called (drawing the round's one-hop nodes first for ``"accesses"``). With stored `samples`, their
    round's plan decides: no planner here, the rows it was planned for. `staleness`, `prune`, `ramp` and
    `cooldown`: the rule, checked by `flow.options.history_rule`; `total`: the round's training batches (the
    planner's cool-down counts back from it)."""
    from ..options import byte_budget

    if memory == "auto":
        raise ConfigError("history_memory", "auto splits the CPU budget of a packed pipeline between its feature "
                                            "cache and the embedding cache; this pipeline has no feature cache: "
                                            "give a size (e.g. 5%)")
    if select not in HISTORY_SELECTS:
        raise ConfigError("history_select", f"expected one of {', '.join(HISTORY_SELECTS)}, got {select!r}")
    nbytes = byte_budget(memory, "history_memory", st.feature_bytes) or 0
    if samples is not None:
        with PackedDataset(samples) as ds:
            planned = ds.manifest.get("figures", {}).get("history")
        if planned is None:
            if nbytes:
                raise ConfigError("history_memory", f"the stored samples of {samples} were planned without a "
                                                    "history cache (prepare them with history_memory)")
            return None, 0
        if nbytes:
            raise ConfigError("history_memory", f"the stored samples of {samples} fix the history cache "
                                                f"({planned['rows']:,} embeddings); drop history_memory")
        return None, int(planned["rows"]) if data_only else planned_width(samples, planned, hidden)
    if nbytes == 0:
        refuse_without_cache(staleness, prune, ramp=ramp, cooldown=cooldown)
        return None, 0
    if st.hetero is not None:
        refuse_typed(True, False)
    rows = history_rows(nbytes, hidden)
    if rows == 0:
        raise ConfigError("history_memory", f"{nbytes:,} bytes hold no embedding of {hidden} {EMBEDDING_DTYPE} values")

    def make() -> HistoryPlanner:
        if select == "accesses" and round_hop1 is not None:
            return HistoryPlanner(history_nodes_by_count(round_hop1(), st.num_nodes, rows), staleness, prune,
                                  ramp, total, cooldown)
        return HistoryPlanner(history_nodes(np.asarray(st.indptr), rows), staleness, prune, ramp, total, cooldown)

    return make, min(rows, st.num_nodes)


def stored_label_prior(samples: str | os.PathLike[str] | None) -> tuple[float, ...] | None:
    """The label prior a packed round's losses are weighed by (its partition batches'), or None."""
    if samples is None:
        return None
    with PackedDataset(samples) as ds:
        prior = ds.manifest.get("figures", {}).get("label_prior")
    return None if prior is None else tuple(float(p) for p in prior)


def batch_order(st: Store, run_dir: Path, batches: str, partition: str | os.PathLike[str] | None,
                partitions: int | None, seed: int, group: int = PARTS_PER_GROUP, group_by: str = "label", *,
                batch_size: int) -> tuple[BatchOrder | None, dict[str, Any] | None]:
    """The training batches' order for `batches` and, for partition batches, the partition's figures
    (partitioning the graph into ``run_dir/partition.npy`` when no `partition` file is given)."""
    if batches not in BATCH_ORDERS:
        raise ConfigError("batches", f"expected one of {', '.join(BATCH_ORDERS)}, got {batches!r}")
    if batches == "shuffled":
        for option, value in (("partition", partition), ("partitions", partitions)):
            if value is not None:
                raise ConfigError(option, "applies to partition batches only (batches='partition')")
        if group != PARTS_PER_GROUP:
            raise ConfigError("parts_per_group", "applies to partition batches only (batches='partition')")
        if group_by != "label":
            raise ConfigError("group_by", "applies to partition batches only (batches='partition')")
        return None, None
    if partition is not None:
        if partitions is not None:
            raise ConfigError("partitions", "give either a partition file or a number of parts, not both")
        path = Path(partition)
        if not path.is_file():
            raise InputError(path, "no such partition file (a packed dataset's partition.npy)")
        figures: dict[str, Any] = {"path": str(path)}
    else:
        from ..graph import partition_task

        parts = default_parts(st.split_ids("train").shape[0], st.num_nodes, partitions, batch_size)
        figures = partition_task(str(st.path), parts, "kaminpar", seed, 1, str(run_dir / "partition.npy"))
    order = BatchOrder("partition", figures["path"], group, group_by, str(st.path / st.manifest["labels"]))
    figures["group_by"] = group_by
    assert order.parts is not None             # partition batches: the partition's path
    if load_parts(order.parts).shape[0] != st.num_nodes:
        raise ConfigError("partition", f"{order.parts} gives the parts of {load_parts(order.parts).shape[0]:,} "
                                       f"nodes, the store has {st.num_nodes:,}")
    return order, figures


class StoredSamplesLoader:
    """The training batches of a packed dataset's round: its stored samples, features joined by `to_data`.

    Takes `InMemoryLoader`'s place for training, with the same `set_epoch`, `len` and `stage_s`
    (``sample``: reading the stored sample, ``gather``: features, labels and `Data`). The
    dataset must have been prepared from `store` with `cfg`'s fanouts, batch size and seed,
    so its batches are the ones `InMemoryLoader` would sample, and hold `cfg.epochs` epochs.

    Raises:
        InputError: not a packed dataset, or prepared from another store.
        ConfigError: sampled with other fanouts, batch size or seed (``samples``), or too few
            epochs (``epochs``).
    """

    def __init__(self, features: Any, labels: torch.Tensor, packed: str | os.PathLike[str], store: Store,
                 cfg: TrainConfig, edge_features: Any = None) -> None:
        self.features, self.labels, self.edge_features = features, labels, edge_features
        self.typed = getattr(store, "hetero", None) is not None
        self.ds = PackedDataset(packed)
        man = self.ds.manifest
        if man.get("store", {}).get("manifest_hash") != config_hash(store.manifest):
            raise InputError(self.ds.path / "manifest.json", f"prepared from another store than {store.path}")
        rc = man.get("config", {})
        stored = rc.get("fanouts", [])
        theirs = (stored if isinstance(stored, dict) else list(stored), rc.get("batch_size"), rc.get("seed"))
        ours = (fanouts_json(cfg.fanouts), cfg.batch_size, cfg.seed)
        if theirs != ours:
            raise ConfigError("samples", f"{self.ds.path} was sampled with fanouts {theirs[0]}, batch "
                                         f"size {theirs[1]}, seed {theirs[2]}; this run has fanouts "
                                         f"{ours[0]}, batch size {ours[1]}, seed {ours[2]}")
        sampled = (rc.get("task", "node"), rc.get("neg_ratio", cfg.neg_ratio), rc.get("neg_sampling", cfg.neg_sampling))
        if sampled != (cfg.task, cfg.neg_ratio, cfg.neg_sampling):
            raise ConfigError("task", f"{self.ds.path} was sampled for task {sampled[0]!r} (negatives {sampled[1]:g} "
                                      f"per positive, {sampled[2]}); this run trains task {cfg.task!r} "
                                      f"({cfg.neg_ratio:g}, {cfg.neg_sampling})")
        held = int(man["round"]["epochs"])
        if cfg.epochs > held:
            raise ConfigError("epochs", f"{cfg.epochs} epochs asked for, the samples in {self.ds.path} "
                                        f"hold {held}")
        self.epoch = 0
        self.stage_s: dict[str, float] = {"sample": 0.0, "gather": 0.0}

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose stored batches the next iteration yields."""
        self.epoch = epoch

    def _superbatches(self) -> list[Any]:
        return sorted((s for s in self.ds.superbatches if s.epoch == self.epoch), key=lambda s: s.first_batch)

    def __len__(self) -> int:
        return sum(s.batches for s in self._superbatches())

    def __iter__(self) -> Iterator[Data]:
        self.stage_s = {"sample": 0.0, "gather": 0.0}
        yield from timed_data(self._samples(), self.features, self.labels, self.stage_s, self.edge_features)

    def _samples(self) -> Iterator[Any]:
        for sb in self._superbatches():
            for sample in self.ds.samples(sb.key):
                sample.n_id = np.array(sample.n_id)    # mapped from the samples file; torch wants its own
                sample.typed = self.typed
                yield sample


def _train(st: Store, run_dir: Path, cfg: TrainConfig, dev: torch.device, progress: bool,
           on_epoch: EpochHook | None, how: _Run) -> dict[str, Any]:
    t0 = time.perf_counter()
    if st.hetero is not None:
        refuse_typed(False, cfg.link)
    typed = train_target(st.hetero, st.path)     # a typed store's seeds' type, before anything is read
    features: Any
    if how.features is None:
        features = torch.from_numpy(st.read_features())
    else:
        features = how.features(st)
    edge_table = st.edge_features
    edge_features: Any = None
    if edge_table is not None:      # the edge features as the node features are held: in RAM, or read through
        edge_features = torch.from_numpy(edge_table.read_all()) if how.features is None \
            else StoreFeatures(st, edges=True)
    labels = torch.from_numpy(np.asarray(st.labels, dtype=np.int64))
    load_s = time.perf_counter() - t0
    splits = {name: st.split_ids(name) for name in ("train", "val", "test")}
    if not cfg.link:
        _check_labels(st, labels, splits)

    sampler = store_sampler(st, cfg.fanouts, num_threads=cfg.threads, in_ram=how.features is None)
    source = SeedSource(st, cfg.batch_size, cfg.seed, cfg.train_task) if cfg.link else None
    train: Any
    if how.loader is not None:
        train = how.loader.make(st, labels, sampler, splits["train"], cfg, how.order)
    elif how.samples is None:
        train = InMemoryLoader(features, labels, sampler, splits["train"], cfg.batch_size, True, cfg.seed,
                               TRAIN_STREAM, order=how.order, history=how.history, source=source,
                               edge_features=edge_features)
    else:
        train = StoredSamplesLoader(features, labels, how.samples, st, cfg, edge_features)
    evals = eval_loaders(cfg, features, labels, sampler, splits.__getitem__, st, edge_features)
    stages = STAGES if how.loader is None else (*how.loader.stages, "train")
    session = TrainSession(cfg, dev, st.feature_dim, st.num_classes, stages=stages, evals=lambda: evals,
                           edge_dim=edge_table.dim if edge_table is not None else None,
                           hetero=typed)

    for epoch in range(cfg.epochs):
        train.set_epoch(epoch)
        if how.on_start is not None:
            how.on_start(epoch, len(train))
        with bar(total=len(train), desc=f"{how.name} {cfg.model} epoch {epoch + 1}/{cfg.epochs}",
                 unit="batch", disable=None if progress else True) as b:
            session.train(train, on_batch=_ticks(b.update, how.on_batch))
        record = session.close_epoch(epoch)
        counts = getattr(train, "counts", None)
        if counts is not None:
            record["rows_gathered"] = counts["rows"]
            if how.history is not None:
                record["history"] = {"pruned": counts["pruned"], "pushed": counts["pushed"]}
        if how.loader is not None:
            record.update(how.loader.epoch_record(train))
        if on_epoch is not None:
            on_epoch(record)

    if how.loader is not None:
        train.close()
    records = session.records
    return {
        "pipeline": how.name,
        "title": f"{how.name}: {cfg.model}, fanouts {fanouts_json(cfg.fanouts)}",
        "config": {**cfg.as_json(), "device": str(dev), "optimizer": session.describe(),
                   "threads": cfg.threads, "torch_threads": torch.get_num_threads(),
                   "samples": None if how.samples is None else str(how.samples),
                   "features": "ram" if how.features is None else str(features)},
        "dataset": {"store": str(st.path), "nodes": st.num_nodes, "edges": st.num_edges,
                    "dim": st.feature_dim, "dtype": str(st.feature_dtype), "feature_bytes": st.feature_bytes,
                    "num_classes": st.num_classes,
                    "splits": {name: int(ids.shape[0]) for name, ids in splits.items()},
                    **({"edge_dim": edge_table.dim} if edge_table is not None else {}),
                    **({"link": {name: int(st.link_edges(name).shape[1]) for name in ("train", "val", "test")}}
                       if cfg.link else {})},
        "load_s": load_s,
        "epochs": records,
        "final": final_block(records),
        "stage_s": {k: sum(r["stage_s"][k] for r in records) for k in (*stages, "eval")},
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "run_dir": str(run_dir),
    }


def _ticks(tick: Callable[[int], Any], on_batch: Callable[[int], Any] | None) -> Callable[[int], None]:
    """One per-batch callback: the progress bar's `tick`, then the caller's `on_batch`."""
    def both(n: int) -> None:
        tick(n)
        if on_batch is not None:
            on_batch(n)
    return both


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
