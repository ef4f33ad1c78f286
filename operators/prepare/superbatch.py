"""Offline sampling of a round: epochs -> shuffled minibatches -> superbatches -> sample files.

A round is E epochs. Epoch e's training seeds (nodes, or a link task's edges and their negatives)
are shuffled and cut into minibatches by `task.epoch_seeds` and sampled with their
`seeds.batch_seed`, exactly as the in-memory trainer does, so an out-of-core run sees the very
same samples. Superbatch k of epoch e
holds batches [k*S, (k+1)*S); each is sampled by one task into one Arrow IPC file.
Sampling memory-maps the topology and never touches the feature shards.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ...errors import ConfigError
from ..formats.samples import id_type, record_batch, samples_bytes, write_samples
from .history import HistoryStep, sample_planned
from .sampler_pool import leased_sampler
from .seeds import BatchOrder
from .task import NODE, Task, attach_labels, epoch_seeds

__all__ = ["SuperbatchRef", "check_round_config", "lane_layout", "round_layout", "sample_superbatch",
           "sample_superbatch_bytes", "sample_superbatch_records", "superbatch_hop1"]


@dataclass(frozen=True)
class SuperbatchRef:
    """Where superbatch k of epoch e sits in the round (global batch indices are epoch-major)."""

    epoch: int
    index: int                 # superbatch index within the epoch
    first_batch: int           # batch index within the epoch
    num_batches: int
    round_first_batch: int     # global batch index within the round

    @property
    def key(self) -> str:
        return f"e{self.epoch}-s{self.index:05d}"

    @property
    def filename(self) -> str:
        return f"{self.key}.arrow"


def check_round_config(batch_size: int, superbatch_size: int, epochs: int, fanouts: Sequence[int]) -> None:
    """Reject configs that cannot describe a round, naming the option."""
    if batch_size < 1:
        raise ConfigError("batch_size", f"must be >= 1, got {batch_size}")
    if superbatch_size < 1:
        raise ConfigError("superbatch_size", f"must be >= 1 batch, got {superbatch_size}")
    if epochs < 1:
        raise ConfigError("epochs", f"must be >= 1, got {epochs}")
    if len(fanouts) == 0:
        raise ConfigError("fanouts", "must name at least one hop (e.g. 10,10,10)")
    if any(int(f) < -1 for f in fanouts):
        raise ConfigError("fanouts", f"each fanout must be >= -1 (-1 = all neighbours), got {list(fanouts)}")


def round_layout(num_train: int, batch_size: int, superbatch_size: int, epochs: int) -> list[SuperbatchRef]:
    """All superbatches of a round of `num_train` seeds an epoch (`task.num_seeds`), in training order."""
    if num_train == 0:
        raise ConfigError("store", "the store has no training seeds (split 'train' is empty)")
    per_epoch = -(-num_train // batch_size)
    refs = []
    for e in range(epochs):
        for k, first in enumerate(range(0, per_epoch, superbatch_size)):
            n = min(superbatch_size, per_epoch - first)
            refs.append(SuperbatchRef(e, k, first, n, e * per_epoch + first))
    return refs


def lane_layout(refs: Sequence[SuperbatchRef], lanes: int, lane: int) -> list[SuperbatchRef]:
    """Lane `lane`'s share of a round split over `lanes` data-parallel GPU workers: of each superbatch,
    the batches at positions ``lane, lane + lanes, ...`` (one per optimizer step), numbered as a round of
    their own (contiguous within each epoch and over the round), so the lane is packed, shipped and
    trained exactly as a one-worker stream. A superbatch of fewer batches than lanes leaves the last
    lanes an empty share (``num_batches == 0``)."""
    if lanes < 1 or not 0 <= lane < lanes:
        raise ValueError(f"lane {lane} of {lanes}")
    out: list[SuperbatchRef] = []
    epoch, first, total = -1, 0, 0
    for r in refs:
        if r.epoch != epoch:
            epoch, first = r.epoch, 0
        n = len(range(lane, r.num_batches, lanes))
        out.append(SuperbatchRef(r.epoch, r.index, first, n, total))
        first += n
        total += n
    return out


def sample_superbatch(store_path: str | os.PathLike[str], out_path: str | os.PathLike[str], ref: SuperbatchRef,
                      batch_size: int, fanouts: Sequence[int], seed: int, num_threads: int | None = None,
                      order: BatchOrder | None = None, history: Sequence[HistoryStep] | None = None,
                      parents: bool = True, task: Task = NODE) -> dict:
    """Sample every minibatch of one superbatch and write them to `out_path` (Arrow IPC, past the page cache
    where the file system allows: `formats.samples.write_samples`; `parents=False`: never create its
    directory). `order`, `history`: see `sample_superbatch_records`.

    Returns a small summary: batches, accesses (sum of n_id lengths), the largest batch's
    node count, and sampled edges.
    """
    records, metadata, summary = sample_superbatch_records(store_path, ref, batch_size, fanouts, seed, num_threads,
                                                           order, history, task)
    write_samples(out_path, records, metadata, parents=parents)
    return {**summary, "path": str(Path(out_path))}


def sample_superbatch_bytes(store_path: str | os.PathLike[str], ref: SuperbatchRef, batch_size: int,
                            fanouts: Sequence[int], seed: int, num_threads: int | None = None,
                            order: BatchOrder | None = None, history: Sequence[HistoryStep] | None = None,
                            task: Task = NODE) -> tuple[pa.Buffer, dict]:
    """`sample_superbatch` without the file: the samples file's bytes (built in memory) and the summary."""
    records, metadata, summary = sample_superbatch_records(store_path, ref, batch_size, fanouts, seed, num_threads,
                                                           order, history, task)
    return samples_bytes(records, metadata), summary


def sample_superbatch_records(store_path: str | os.PathLike[str], ref: SuperbatchRef, batch_size: int,
                              fanouts: Sequence[int], seed: int, num_threads: int | None = None,
                              order: BatchOrder | None = None, history: Sequence[HistoryStep] | None = None,
                              task: Task = NODE) -> tuple[list[pa.RecordBatch], dict[str, Any], dict[str, Any]]:
    """The superbatch's samples as record batches (one per minibatch), the samples file's metadata and the
    summary. `order`: how the epoch's seeds become batches (None: shuffled). `history`: one `HistoryStep`
    per batch (`operators.prepare.history`): its pruned nodes are not expanded, and each record carries
    the plan. `task`: a link task's batches start from their scored pairs' endpoints and carry the pairs.
    A store with edge features, or a typed store (whose edge ids tell the edge types), keeps each batch's
    sampled edge ids (``e_id``)."""
    with leased_sampler(store_path, fanouts, num_threads) as pooled:
        store, sampler = pooled.store, pooled.sampler
        span = range(ref.first_batch, ref.first_batch + ref.num_batches)
        batches = epoch_seeds(pooled, batch_size, ref.epoch, seed, task, order, only=span)
        records, accesses, max_nodes, edges = [], 0, 0, 0
        ids = id_type(store.num_nodes)
        keep_edges = getattr(store, "edge_features", None) is not None or getattr(store, "hetero", None) is not None
        edge_ids = id_type(store.num_edges) if keep_edges else None
        narrow = ids == pa.int32()      # sampled as int32, as the file stores them: no conversion pass
        pruned = pushed = 0
        for j, b in zip(span, batches):
            if history is None:
                s = sampler.sample(b.seeds, b.sampling_seed, narrow=narrow)
            else:
                step = history[j - ref.first_batch]
                s = sample_planned(sampler, b.seeds, b.sampling_seed, step)
                pruned, pushed = pruned + int(step.pruned.shape[0]), pushed + int(step.pushed.shape[0])
            records.append(record_batch(j, attach_labels(s, b), ids, edge_ids))
            n = int(s.n_id.shape[0])
            accesses += n
            max_nodes = max(max_nodes, n)
            edges += int(s.edge_index.shape[1])
    metadata = {"epoch": ref.epoch, "superbatch": ref.index, "seed": seed,
                "fanouts": ",".join(map(str, fanouts)), "batch_size": batch_size}
    summary: dict[str, Any] = {"key": ref.key, "batches": ref.num_batches, "accesses": accesses,
                               "max_nodes": max_nodes, "edges": edges}
    if history is not None:
        summary.update(pruned=pruned, pushed=pushed)
    return records, metadata, summary


def superbatch_hop1(store_path: str | os.PathLike[str], ref: SuperbatchRef, batch_size: int, fanouts: Sequence[int],
                    seed: int, num_threads: int | None = None, order: BatchOrder | None = None,
                    task: Task = NODE) -> list[np.ndarray]:
    """The one-hop nodes of every batch of superbatch `ref`, as the full sample would draw them (draws
    are a function of (seed, hop, node)): what a history plan needs before the batches are sampled."""
    with leased_sampler(store_path, list(fanouts)[:1], num_threads) as pooled:
        span = range(ref.first_batch, ref.first_batch + ref.num_batches)
        out = []
        for b in epoch_seeds(pooled, batch_size, ref.epoch, seed, task, order, only=span):
            s = pooled.sampler.sample(b.seeds, b.sampling_seed)
            out.append(np.asarray(s.n_id[s.batch_size:], dtype=np.int64))
        return out
