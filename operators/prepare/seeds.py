"""Batch order and sampling seeds shared by every pipeline (torch-free, so Dask workers that
only sample or plan need not import torch).

The in-memory reference and every out-of-core pipeline cut the training seeds and derive
per-batch sampling seeds with these two functions, so they see the very same samples and
can be compared loss for loss.
"""
from __future__ import annotations

import numpy as np

from ..formats.errors import ConfigError

# Seed streams: training, validation and test batches never share sampling seeds.
TRAIN_STREAM, VAL_STREAM, TEST_STREAM = 0, 1, 2



def seed_batches(seeds: np.ndarray, batch_size: int, epoch: int, seed: int,
                 shuffle: bool = True) -> list[np.ndarray]:
    """Cut `seeds` into batches of `batch_size` (the last may be smaller), like NeighborLoader.

    The order is a permutation fixed by (seed, epoch), so every pipeline and every re-run
    trains on the same batches.
    """
    if batch_size < 1:
        raise ConfigError("--batch-size", f"expected an integer >= 1, got {batch_size}")
    ids = np.asarray(seeds, dtype=np.int64)
    if shuffle:
        ids = ids[np.random.default_rng([seed, epoch]).permutation(ids.shape[0])]
    return [ids[i:i + batch_size] for i in range(0, ids.shape[0], batch_size)]


def batch_seed(seed: int, epoch: int, index: int, stream: int = TRAIN_STREAM) -> int:
    """The sampling seed of batch `index` of `epoch` (a 63-bit integer, fixed by its arguments)."""
    state = np.random.SeedSequence([seed, stream, epoch, index]).generate_state(1, dtype=np.uint64)[0]
    return int(state >> np.uint64(1))
