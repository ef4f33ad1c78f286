"""Minibatches shaped like PyG's `NeighborLoader`: seed batches, sampling seeds, and `Data` assembly.

Every pipeline cuts the training seeds and derives per-batch sampling seeds with the
functions here, so the in-memory reference and an out-of-core pipeline see the very same
samples and can be compared loss for loss. A sample holds ids only; features join at
assembly (`to_data`), as in PyG, where a sampler returns ids and the loader adds `x`/`y`.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch_geometric.data import Data

from ...errors import ConfigError
from ..prepare.seeds import TEST_STREAM, TRAIN_STREAM, VAL_STREAM, BatchOrder, batch_seed, seed_batches
from ..prepare.task import BatchSeeds, SeedSource, attach_labels

__all__ = ["TEST_STREAM", "TRAIN_STREAM", "VAL_STREAM", "InMemoryLoader", "Sample", "Sampler", "SeedSource",
           "batch_data", "batch_seed", "epoch_batches", "seed_batches", "timed_data", "to_data"]

class Sample(Protocol):
    """What a sampler returns for one batch (see `operators.sample.SampledBatch`)."""

    n_id: np.ndarray               # int64 global node ids, the batch's seeds first
    edge_index: np.ndarray         # int64 [2, E] local positions into n_id, source -> target
    batch_size: int

    @property
    def num_sampled_nodes(self) -> Sequence[int]: ...   # read-only: a list or a tuple will do

    @property
    def num_sampled_edges(self) -> Sequence[int]: ...


class Sampler(Protocol):
    def sample(self, seeds: np.ndarray, seed: int) -> Sample: ...


def _ids(values: Any) -> torch.Tensor:
    return torch.from_numpy(np.array(values, dtype=np.int64))     # a copy: the samples may be read-only maps


def batch_data(sample: Sample, x: torch.Tensor, y: torch.Tensor, edge_attr: torch.Tensor | None = None,
               edge_ids: bool = True) -> Data:
    """A `Data` batch from a sample and its already-gathered rows (`x[i]`, `y[i]` belong to `n_id[i]`).

    The fields are exactly NeighborLoader's for a homogeneous graph: `x, edge_index, y,
    n_id, batch_size, num_sampled_nodes, num_sampled_edges`; the first `batch_size` rows
    are the seeds, the ones loss and accuracy are computed on. A sample that carries a history
    plan (``sample.history``) adds its four index tensors (`train.history.FIELDS`). A sample with
    its edges' ids (``sample.e_id``) adds `e_id` unless `edge_ids` is False (a graph without edge
    features: the sampler reports them anyway), and `edge_attr` (their features, aligned with
    `edge_index`) where given. A link task's sample adds LinkNeighborLoader's `edge_label_index`
    (the scored pairs, local) and `edge_label`.
    """
    data = Data(x=x, edge_index=_ids(sample.edge_index), y=y, n_id=_ids(sample.n_id),
                batch_size=int(sample.batch_size),
                num_sampled_nodes=[int(n) for n in sample.num_sampled_nodes],
                num_sampled_edges=[int(n) for n in sample.num_sampled_edges])
    e_id = getattr(sample, "e_id", None)
    if e_id is not None and edge_ids:
        data.e_id = _ids(e_id)
    if edge_attr is not None:
        data.edge_attr = edge_attr
    label_index = getattr(sample, "edge_label_index", None)
    if label_index is not None:
        data.edge_label_index = _ids(label_index)
        data.edge_label = torch.from_numpy(np.array(sample.edge_label, dtype=np.float32))  # type: ignore[attr-defined]
    plan = getattr(sample, "history", None)
    if plan is not None:          # a history plan: hist_prune, hist_prune_slot, hist_push, hist_push_slot
        from .history import FIELDS

        for name, values in zip(FIELDS, plan):
            data[name] = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
    return data


def to_data(sample: Sample, x: torch.Tensor, y: torch.Tensor, edge_features: Any = None) -> Data:
    """Join a sample with the full feature matrix `x` and labels `y` held in memory.

    `batch.x == x[n_id]` and `batch.y == y[n_id]` (one vectorised gather each, on the
    device the tensors live on); with `edge_features` (the store's, in its CSC edge order),
    `batch.edge_attr == edge_features[e_id]`.
    """
    n_id = torch.from_numpy(np.ascontiguousarray(sample.n_id, dtype=np.int64))
    rows = n_id.to(x.device)
    edge_attr = None
    e_id = getattr(sample, "e_id", None)
    if edge_features is not None and e_id is not None:
        edge_attr = edge_features.index_select(0, _ids(e_id).to(edge_features.device))
    return batch_data(sample, x.index_select(0, rows), y.index_select(0, rows.to(y.device)), edge_attr,
                      edge_ids=edge_features is not None or bool(getattr(sample, "typed", False)))


def timed_data(samples: Iterator[Sample], x: torch.Tensor, y: torch.Tensor,
               stage_s: dict[str, float], edge_features: Any = None) -> Iterator[Data]:
    """`to_data` of each sample `samples` yields, timing both halves into `stage_s`: ``sample``
    (drawing the next sample: sampling it, or reading it) and ``gather`` (features, labels, `Data`)."""
    while True:
        t0 = time.perf_counter()
        sample = next(samples, None)
        if sample is None:
            return
        t1 = time.perf_counter()
        data = to_data(sample, x, y, edge_features)
        t2 = time.perf_counter()
        stage_s["sample"] += t1 - t0
        stage_s["gather"] += t2 - t1
        yield data


def epoch_batches(seeds: np.ndarray, batch_size: int, epoch: int, seed: int, shuffle: bool = True,
                  order: BatchOrder | None = None, stream: int = TRAIN_STREAM) -> list[tuple[np.ndarray, int]]:
    """An epoch's batches as (seed ids, sampling seed) pairs: what every loader that samples draws, so that
    they all train on the very same samples."""
    batches = seed_batches(seeds, batch_size, epoch, seed, shuffle=shuffle, order=order)
    return [(ids, batch_seed(seed, epoch, i, stream)) for i, ids in enumerate(batches)]


class InMemoryLoader:
    """NeighborLoader-like iterator over `Data` batches, with features and labels in memory.

    Args:
        features: (N, dim) node features.
        labels: (N,) int64 labels.
        sampler: anything with `sample(seeds, seed) -> Sample` (e.g. `operators.sample.NeighborSampler`).
        seeds: the nodes to batch (a split's ids).
        batch_size: seeds per batch.
        shuffle: reshuffle the seeds every epoch (training); keep their order otherwise.
        seed: the run's seed; batch order and sampling seeds derive from it and the epoch.
        stream: which seed stream the sampling seeds come from (`TRAIN_STREAM`, ...).
        order: how shuffled seeds are cut (`seeds.BatchOrder`; None: a plain permutation).
        history: a `prepare.history.HistoryPlanner` (needs a `NeighborSampler`): each batch's one-hop
            nodes with a fresh cached embedding are not expanded, and the batch carries its plan for
            `train.history.HistoryCache`. The planner keeps its state from epoch to epoch.
        source: where each epoch's batches come from instead of `seeds` (`prepare.task.SeedSource`: a
            link task's edges and negatives, or a split's evaluation pairs).
        edge_features: the store's edge features (E, D), anything with `index_select` (`StoreFeatures`):
            each batch then carries `edge_attr` (its sampler must give `e_id`).

    `counts` holds the rows gathered and the nodes pruned and pushed in the last iteration.

    After (or during) an iteration `stage_s` holds the seconds spent in each stage of it:
    `sample` (neighbour sampling) and `gather` (feature/label gather and `Data` assembly).
    """

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, sampler: Sampler, seeds: np.ndarray,
                 batch_size: int, shuffle: bool, seed: int, stream: int = TRAIN_STREAM,
                 order: BatchOrder | None = None, history: Any = None, source: SeedSource | None = None,
                 edge_features: Any = None) -> None:
        if batch_size < 1:
            raise ConfigError("batch_size", f"expected an integer >= 1, got {batch_size}")
        self.features = features
        self.labels = labels
        self.sampler = sampler
        self.seeds = np.asarray(seeds, dtype=np.int64)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.stream = stream
        self.order = order
        self.history = history
        self.source = source
        self.edge_features = edge_features
        self._hop1: Any = None
        if history is not None:
            from ..prepare.sample import NeighborSampler

            native: Any = sampler       # the native sampler: its graph arrays and `stop`
            fanouts = list(getattr(native, "fanouts", []))
            if len(fanouts) < 2:
                raise ConfigError("history_memory", "a historical embedding cache needs two or more hops")
            self._hop1 = NeighborSampler(native.indptr, native.indices, fanouts[:1],
                                         num_threads=getattr(native, "num_threads", 1))
        self.epoch = 0
        self.stage_s: dict[str, float] = {"sample": 0.0, "gather": 0.0}
        self.counts: dict[str, int] = {"rows": 0, "pruned": 0, "pushed": 0}

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose batch order and sampling seeds the next iteration uses."""
        self.epoch = epoch

    def __len__(self) -> int:
        if self.source is not None:
            return len(self.source)
        return (int(self.seeds.shape[0]) + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> Iterator[Data]:
        self.stage_s = {"sample": 0.0, "gather": 0.0}
        self.counts = {"rows": 0, "pruned": 0, "pushed": 0}
        if self.source is not None:
            batches = self.source.epoch(self.epoch)
        else:
            batches = [BatchSeeds(ids, sampling_seed) for ids, sampling_seed in
                       epoch_batches(self.seeds, self.batch_size, self.epoch, self.seed, self.shuffle, self.order,
                                     self.stream)]
        samples = (attach_labels(self._sample(b.seeds, b.sampling_seed), b) for b in batches)
        yield from timed_data(samples, self.features, self.labels, self.stage_s, self.edge_features)

    def _sample(self, ids: np.ndarray, seed: int) -> Any:
        if self.history is None:
            s = self.sampler.sample(ids, seed)
        else:
            from ..prepare.history import sample_planned

            first = self._hop1.sample(ids, seed)           # the same one-hop nodes as the full sample's
            step = self.history.step(first.n_id[first.batch_size:])
            s = sample_planned(self.sampler, ids, seed, step)
            self.counts["pruned"] += int(step.pruned.shape[0])
            self.counts["pushed"] += int(step.pushed.shape[0])
        self.counts["rows"] += int(s.n_id.shape[0])
        return s
