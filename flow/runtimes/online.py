"""The online loader of `diskflow.Pipeline` (``loader="online"``): train with no preparation.

Batches are sampled on the fly over the memory-mapped topology (the very batches of the in-memory
pipeline and of a prepared round: same seed order, same sampling seeds), and their feature rows
are extracted by asynchronous direct-I/O readers into one fixed-size host feature buffer (a planned
row cache: `operators.train.online`, `operators.train.rowcache`). The pipeline's ``cpu_tier`` is the
cache's policy: ``"lru"`` (GNNDrive's standby list; the ``gnndrive`` pipeline) or ``"hybrid"``
(LSM-GNN's levels over a lookahead window, then in-degree; the ``lsmgnn`` pipeline). Training is
the one session every pipeline trains with (`flow.runtimes.gathered.gathered_run`), so the losses
equal the in-memory pipeline's.

    diskflow run gnndrive --dataset STORE [--cpu-memory 10%] [--extractors 4]
    diskflow run lsmgnn --dataset STORE [--cpu-memory 10%] [--window 8]
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...errors import ConfigError
from ...operators.formats.sizes import format_bytes
from ...operators.formats.store import Store
from ...operators.options import CPU_SHARE
from ...operators.prepare.sample import NeighborSampler
from ...operators.prepare.seeds import PARTS_PER_GROUP, BatchOrder
from ...operators.prepare.task import SeedSource
from ...operators.prepare.tiers import batch_rows_bound
from ...operators.prepare.typedsample import TypedNeighborSampler
from ...operators.train.cachepolicy import policy_for
from ...operators.train.config import ONLINE_TIERS
from ...operators.train.online import DEFAULT_EXTRACTORS, DEFAULT_WINDOW, OnlineLoader, buffer_slots
from ...operators.train.rowcache import NODE_TABLE_BYTES, PLANNED_SLOT_BYTES, SLOT_TABLE_BYTES, RowCache
from ...operators.train.rowreader import MAX_STAGING_BYTES, bounce_bytes, staging_bytes_for
from ...operators.train.session import StoreFeatures, TrainConfig
from ..options import byte_budget
from .gathered import EpochHook, gathered_run

if TYPE_CHECKING:
    from ..pipeline import Pipeline

__all__ = ["default_budget", "describe_online", "online_loader", "run_online"]


def default_budget(st: Store, batch_size: int, fanouts: Sequence[int], extractors: int) -> int:
    """`CPU_SHARE` (10%) of the features, or enough for one worst-case batch beside the tables when that is more."""
    rows = batch_rows_bound(batch_size, fanouts, st.num_nodes)
    one_batch = rows * (st.row_bytes + SLOT_TABLE_BYTES + PLANNED_SLOT_BYTES) + st.num_nodes * NODE_TABLE_BYTES + \
        extractors * (MAX_STAGING_BYTES + bounce_bytes(MAX_STAGING_BYTES))
    return max(int(st.feature_bytes * CPU_SHARE), one_batch)


def online_loader(st: Store, labels: torch.Tensor, sampler: NeighborSampler | TypedNeighborSampler, seeds: np.ndarray, *, batch_size: int,
                  seed: int, fanouts: Sequence[int], policy: str = "lru", budget: int | str | None = None,
                  extractors: int = DEFAULT_EXTRACTORS, window: int | None = None,
                  order: BatchOrder | None = None, source: SeedSource | None = None) -> tuple[OnlineLoader, int]:
    """The online loader of `seeds` and its feature buffer's bytes: `budget` (bytes or a share of the features;
    default 10% of them, or one worst-case batch when that is more) holds the buffer, its tables and staging.

    Raises:
        ConfigError: a bad policy, reader count, window or budget, naming the option.
    """
    if policy not in ONLINE_TIERS:
        raise ConfigError("cpu_tier", f"the online loader's buffer evicts by one of {', '.join(ONLINE_TIERS)}, "
                                      f"got {policy!r}")
    if isinstance(extractors, bool) or not isinstance(extractors, int) or extractors < 1:
        raise ConfigError("extractors", f"expected an integer >= 1, got {extractors!r}")
    if window is None:
        window = DEFAULT_WINDOW if policy == "hybrid" else 0
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ConfigError("window", f"expected an integer >= 0, got {window!r}")
    if policy == "hybrid" and window < 1:
        raise ConfigError("window", "the hybrid policy evicts by the next uses in a lookahead window: give >= 1")
    nbytes = byte_budget(budget, "cpu_memory", st.feature_bytes)
    if nbytes is None:
        nbytes = default_budget(st, batch_size, fanouts, extractors)
    staging = staging_bytes_for(nbytes, extractors)
    slots = min(buffer_slots(nbytes, st.num_nodes, st.row_bytes, extractors, staging), st.num_nodes)
    buf = RowCache(st.num_nodes, slots, st.feature_dim, st.feature_dtype,
                   policy_for(policy, st, threshold=max(1, window // 8), allowed=ONLINE_TIERS), planned=True)
    loader = OnlineLoader(st, buf, labels, sampler, seeds, batch_size, seed, order=order, extractors=extractors,
                          window=window, staging_bytes=staging, source=source)
    return loader, nbytes


class _OnlineTraining:
    """`gathered_run`'s `TrainLoader` for the online loader: makes the buffer and the loader, reports them."""

    stages: tuple[str, ...] = ("sample", "plan", "slots", "extract", "gather", "wait")

    def __init__(self, policy: str, budget: int | str | None, extractors: int, window: int) -> None:
        self.policy, self.budget, self.extractors, self.window = policy, budget, extractors, window
        self.features = f"online ({policy}): O_DIRECT reads into a fixed feature buffer"
        self.loader: OnlineLoader | None = None
        self.nbytes = 0
        self.read: dict[str, int] = {}      # the unit rows are read in and the gap read through

    def make(self, st: Store, labels: torch.Tensor, sampler: NeighborSampler | TypedNeighborSampler, seeds: np.ndarray, cfg: TrainConfig,
             order: BatchOrder | None) -> OnlineLoader:
        self.loader, self.nbytes = online_loader(st, labels, sampler, seeds, batch_size=cfg.batch_size, seed=cfg.seed,
                                                 fanouts=cfg.fanouts, policy=self.policy, budget=self.budget,
                                                 extractors=self.extractors, window=self.window, order=order,
                                                 source=SeedSource(st, cfg.batch_size, cfg.seed, cfg.train_task)
                                                 if cfg.link else None)
        self.read = {"read_unit": self.loader.readers[0].unit, "gap_bytes": self.loader.readers[0].reader.gap_bytes}
        return self.loader

    def epoch_record(self, loader: Any) -> dict[str, Any]:
        c = loader.counts
        return {"rows_gathered": c["rows"],
                "online": {**c, "hit_rate": c["hits"] / c["rows"] if c["rows"] else math.nan,
                           "first_batch_s": loader.first_batch_s}}

    def report(self) -> dict[str, Any]:
        assert self.loader is not None
        buf = self.loader.buffer
        return {"online": {"policy": self.policy, "extractors": self.extractors, "window": self.window,
                           "threshold": getattr(buf.policy, "threshold", None),
                           "cpu_memory": self.nbytes, "slots": buf.slots, "memory": self.loader.memory(),
                           **self.read,
                           "topology_bytes": self.loader.store.topology_nbytes()}}


def run_online(pipeline: Pipeline, store: str | os.PathLike[str], run_dir: str | os.PathLike[str], *,
               model: str = TrainConfig.model, hidden: int = TrainConfig.hidden,
               num_layers: int | None = TrainConfig.num_layers, fanouts: Sequence[int] = TrainConfig.fanouts,
               batch_size: int = TrainConfig.batch_size, epochs: int = TrainConfig.epochs, lr: float = TrainConfig.lr,
               weight_decay: float = TrainConfig.weight_decay, clip_grad: float | None = TrainConfig.clip_grad,
               dropout: float = TrainConfig.dropout, heads: int = TrainConfig.heads, seed: int = TrainConfig.seed,
               device: str = "cpu", eval_every: int = TrainConfig.eval_every,
               threads: int | None = TrainConfig.threads, cpu_memory: int | str | None = None,
               extractors: int = DEFAULT_EXTRACTORS, window: int | None = None, progress: bool = True,
               on_epoch: EpochHook | None = None, on_batch: Callable[[int], Any] | None = None,
               on_start: Callable[[int, int], Any] | None = None, batches: str = "shuffled",
               partition: str | os.PathLike[str] | None = None, partitions: int | None = None,
               parts_per_group: int = PARTS_PER_GROUP, group_by: str = "label", task: str = TrainConfig.task, neg_ratio: float = TrainConfig.neg_ratio,
               neg_sampling: str = TrainConfig.neg_sampling, hits_k: int = TrainConfig.hits_k) -> dict[str, Any]:
    """Train `model` with `pipeline`'s online loader; write report.json and curves.png into `run_dir`.

    Args:
        pipeline: a `Pipeline` with ``loader="online"`` (its ``cpu_tier``: ``"lru"`` or ``"hybrid"``).
        store: an ingested store (its feature shards are read with O_DIRECT, never mapped).
        run_dir: an existing directory for this run's outputs.
        cpu_memory: host bytes of the feature buffer with its tables and staging (``"410MiB"``, or a
            share of the feature bytes such as ``"10%"``); default 10% of the features, or one
            worst-case batch (every hop at full fanout) when that is more. The buffer must hold a
            batch's distinct rows.
        extractors: batches read at once, each by its own reader (io_uring, 64 requests in flight).
        window: batches sampled ahead of the one whose slots are planned: the hybrid policy's lookahead
            (default 8); with ``"lru"`` default 0 (batches are still sampled `extractors` ahead).
        Other options are the in-memory pipeline's (same seed: same batches, same losses).

    Returns:
        The in-memory pipeline's report, plus ``online`` (policy, buffer slots, fixed memory, the unit rows
        are read in and the gap read through) and, per
        epoch, ``online`` (rows, hits, misses, evictions, rows and bytes read, time to the first batch).
    """
    if pipeline.loader != "online":
        raise ConfigError("pipeline", f"the {pipeline.name} pipeline has the {pipeline.loader} loader, not online")
    if window is None:
        window = DEFAULT_WINDOW if pipeline.cpu_tier == "hybrid" else 0
    training = _OnlineTraining(str(pipeline.cpu_tier), cpu_memory, extractors, window)
    options = dict(locals())
    for name in ("pipeline", "cpu_memory", "extractors", "window", "training"):
        del options[name]
    report = gathered_run(pipeline.name, features=StoreFeatures, samples=None, train_loader=training, **options)
    return report


def describe_online(report: dict[str, Any]) -> str:
    """One line on an online run's buffer: its policy, size and hit rate."""
    o = report.get("online") or {}
    mem = o.get("memory", {})
    epochs = [e["online"] for e in report.get("epochs", []) if "online" in e]
    hits = sum(e["hits"] for e in epochs)
    rows = sum(e["rows"] for e in epochs)
    rate = f"{hits / rows:.1%}" if rows else "n/a"
    return (f"feature buffer ({o.get('policy')}): {o.get('slots', 0):,} rows, {format_bytes(mem.get('total_bytes', 0))} "
            f"fixed (rows {format_bytes(mem.get('buffer_bytes', 0))}, tables {format_bytes(mem.get('table_bytes', 0))}, "
            f"staging {format_bytes(mem.get('staging_bytes', 0))}); hit rate {rate}"
            + (f"; rows read in {o['read_unit']}-byte units through gaps of {format_bytes(o['gap_bytes'])}"
               if o.get("read_unit") else ""))
