"""Minibatches shaped like PyG's `NeighborLoader`: seed batches, sampling seeds, and `Data` assembly.

Every pipeline cuts the training seeds and derives per-batch sampling seeds with the
functions here, so the in-memory reference and an out-of-core pipeline see the very same
samples and can be compared loss for loss. A sample holds ids only; features join at
assembly (`to_data`), as in PyG, where a sampler returns ids and the loader adds `x`/`y`.
"""
from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Protocol

import numpy as np
import torch
from torch_geometric.data import Data

from ..formats.errors import ConfigError
from ..prepare.seeds import TEST_STREAM, TRAIN_STREAM, VAL_STREAM, BatchOrder, batch_seed, seed_batches

__all__ = [
    "TEST_STREAM",
    "TRAIN_STREAM",
    "VAL_STREAM",
    "InMemoryLoader",
    "Sample",
    "Sampler",
    "batch_data",
    "batch_seed",
    "seed_batches",
    "to_data",
]

class Sample(Protocol):
    """What a sampler returns for one batch (see `operators.sample.SampledBatch`)."""

    n_id: np.ndarray               # int64 global node ids, the batch's seeds first
    edge_index: np.ndarray         # int64 [2, E] local positions into n_id, source -> target
    num_sampled_nodes: Sequence[int]
    num_sampled_edges: Sequence[int]
    batch_size: int


class Sampler(Protocol):
    def sample(self, seeds: np.ndarray, seed: int) -> Sample: ...


def batch_data(sample: Sample, x: torch.Tensor, y: torch.Tensor) -> Data:
    """A `Data` batch from a sample and its already-gathered rows (`x[i]`, `y[i]` belong to `n_id[i]`).

    The fields are exactly NeighborLoader's for a homogeneous graph: `x, edge_index, y,
    n_id, batch_size, num_sampled_nodes, num_sampled_edges`; the first `batch_size` rows
    are the seeds, the ones loss and accuracy are computed on.
    """
    return Data(x=x, edge_index=torch.from_numpy(np.ascontiguousarray(sample.edge_index, dtype=np.int64)),
                y=y, n_id=torch.from_numpy(np.ascontiguousarray(sample.n_id, dtype=np.int64)),
                batch_size=int(sample.batch_size),
                num_sampled_nodes=[int(n) for n in sample.num_sampled_nodes],
                num_sampled_edges=[int(n) for n in sample.num_sampled_edges])


def to_data(sample: Sample, x: torch.Tensor, y: torch.Tensor) -> Data:
    """Join a sample with the full feature matrix `x` and labels `y` held in memory.

    `batch.x == x[n_id]` and `batch.y == y[n_id]` (one vectorised gather each, on the
    device the tensors live on).
    """
    n_id = torch.from_numpy(np.ascontiguousarray(sample.n_id, dtype=np.int64))
    rows = n_id.to(x.device)
    return batch_data(sample, x.index_select(0, rows), y.index_select(0, rows.to(y.device)))


def timed_data(samples: Iterator[Sample], x: torch.Tensor, y: torch.Tensor,
               stage_s: dict[str, float]) -> Iterator[Data]:
    """`to_data` of each sample `samples` yields, timing both halves into `stage_s`: ``sample``
    (drawing the next sample: sampling it, or reading it) and ``gather`` (features, labels, `Data`)."""
    while True:
        t0 = time.perf_counter()
        sample = next(samples, None)
        if sample is None:
            return
        t1 = time.perf_counter()
        data = to_data(sample, x, y)
        t2 = time.perf_counter()
        stage_s["sample"] += t1 - t0
        stage_s["gather"] += t2 - t1
        yield data


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

    After (or during) an iteration `stage_s` holds the seconds spent in each stage of it:
    `sample` (neighbour sampling) and `gather` (feature/label gather and `Data` assembly).
    """

    def __init__(self, features: torch.Tensor, labels: torch.Tensor, sampler: Sampler, seeds: np.ndarray,
                 batch_size: int, shuffle: bool, seed: int, stream: int = TRAIN_STREAM,
                 order: BatchOrder | None = None) -> None:
        if batch_size < 1:
            raise ConfigError("--batch-size", f"expected an integer >= 1, got {batch_size}")
        self.features = features
        self.labels = labels
        self.sampler = sampler
        self.seeds = np.asarray(seeds, dtype=np.int64)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.stream = stream
        self.order = order
        self.epoch = 0
        self.stage_s: dict[str, float] = {"sample": 0.0, "gather": 0.0}

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose batch order and sampling seeds the next iteration uses."""
        self.epoch = epoch

    def __len__(self) -> int:
        return (int(self.seeds.shape[0]) + self.batch_size - 1) // self.batch_size

    def __iter__(self) -> Iterator[Data]:
        self.stage_s = {"sample": 0.0, "gather": 0.0}
        batches = seed_batches(self.seeds, self.batch_size, self.epoch, self.seed, shuffle=self.shuffle,
                               order=self.order)
        samples = (self.sampler.sample(ids, batch_seed(self.seed, self.epoch, i, self.stream))
                   for i, ids in enumerate(batches))
        yield from timed_data(samples, self.features, self.labels, self.stage_s)
