"""Batch order and sampling seeds shared by every pipeline (torch-free, so Dask workers that
only sample or plan need not import torch).

The in-memory reference and every out-of-core pipeline cut the training seeds and derive
per-batch sampling seeds with these two functions, so they see the very same samples and
can be compared loss for loss.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..formats.errors import ConfigError

# Seed streams: training, validation and test batches never share sampling seeds.
TRAIN_STREAM, VAL_STREAM, TEST_STREAM = 0, 1, 2



BATCH_ORDERS = ("shuffled", "partition")
PARTS_PER_GROUP = 20          # OUTRE's 20 parts per macro batch
PART_STREAM = 3               # the order of parts never shares random numbers with the shuffle


@dataclass(frozen=True)
class BatchOrder:
    """How each epoch's training seeds are cut into batches.

    ``"shuffled"``: a seeded permutation of the seeds. ``"partition"`` (OUTRE's partition-based
    batches): the parts of a min-cut partition (`parts`: the path of an int32 .npy giving every
    node's part) are put in a seeded random order and taken `group` at a time; each group's
    training seeds are shuffled, and the sequence of groups is cut into batches. Batches then
    hold seeds of few parts, whose sampled neighbourhoods overlap: fewer distinct rows per
    batch. Both cover every seed once per epoch, in as many batches.
    """

    kind: str = "shuffled"
    parts: str | None = None
    group: int = PARTS_PER_GROUP

    def __post_init__(self) -> None:
        if self.kind not in BATCH_ORDERS:
            raise ConfigError("--batches", f"expected one of {', '.join(BATCH_ORDERS)}, got {self.kind!r}")
        if self.kind == "partition" and self.parts is None:
            raise ConfigError("--batches", "partition batches need a partition of the graph (its parts file)")
        if self.group < 1:
            raise ConfigError("--parts-per-group", f"must be >= 1, got {self.group}")

    def describe(self) -> dict:
        """What the order depends on, as JSON values (the parts file by its content's fingerprint)."""
        if self.kind == "shuffled":
            return {"kind": "shuffled"}
        return {"kind": self.kind, "group": self.group, "parts": parts_fingerprint(self.parts)}


def seed_batches(seeds: np.ndarray, batch_size: int, epoch: int, seed: int,
                 shuffle: bool = True, order: BatchOrder | None = None) -> list[np.ndarray]:
    """Cut `seeds` into batches of `batch_size` (the last may be smaller), like NeighborLoader.

    The order is fixed by (seed, epoch) and `order` (None: shuffled), so every pipeline and
    every re-run trains on the same batches.
    """
    if batch_size < 1:
        raise ConfigError("--batch-size", f"expected an integer >= 1, got {batch_size}")
    ids = np.asarray(seeds, dtype=np.int64)
    if order is not None and order.parts is not None and shuffle:
        parts = load_parts(order.parts)
        if ids.shape[0] and int(ids.max()) >= parts.shape[0]:
            raise ConfigError("--partition", f"{order.parts}: {parts.shape[0]:,} nodes' parts, but seed "
                                             f"{int(ids.max()):,} is among the training nodes (a partition of another graph?)")
        ids = ids[partition_order(parts[ids], order.group, epoch, seed)]
    elif shuffle:
        ids = ids[np.random.default_rng([seed, epoch]).permutation(ids.shape[0])]
    return [ids[i:i + batch_size] for i in range(0, ids.shape[0], batch_size)]


def partition_order(seed_parts: np.ndarray, group: int, epoch: int, seed: int) -> np.ndarray:
    """The permutation of seeds (given each seed's part) that partition batches take: parts in a
    random order, `group` parts at a time, seeds shuffled within each group."""
    rng = np.random.default_rng([seed, epoch, PART_STREAM])
    parts = np.asarray(seed_parts, dtype=np.int64)
    present, inverse = np.unique(parts, return_inverse=True)
    rank = np.empty(present.shape[0], dtype=np.int64)
    rank[rng.permutation(present.shape[0])] = np.arange(present.shape[0])
    groups = rank[inverse] // group
    ties = np.asarray(rng.random(size=int(parts.shape[0])))
    return np.lexsort((ties, groups))


def load_parts(path: str | os.PathLike[str]) -> np.ndarray:
    """The partition file (int32 part per node), memory-mapped; the same file is opened once per process."""
    p = os.fspath(path)
    st = os.stat(p)
    return _load_parts(p, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=4)
def _load_parts(path: str, mtime_ns: int, size: int) -> np.ndarray:
    from ..formats.errors import InputError
    from ..formats.files import load_npy

    try:
        parts = load_npy(path, mmap_mode="r")
    except (OSError, ValueError, EOFError) as e:
        raise InputError(path, f"not a partition file (an int32 .npy of every node's part): {e}") from e
    if parts.ndim != 1 or parts.dtype != np.int32:
        raise ConfigError("--partition", f"{path}: expected a 1-D int32 array of parts, got {parts.dtype} {parts.shape}")
    return parts


def parts_fingerprint(path: str | os.PathLike[str] | None) -> str | None:
    """A content hash of a parts file (what batch orders, and so cached samples, depend on)."""
    if path is None:
        return None
    import hashlib

    return hashlib.blake2b(np.ascontiguousarray(load_parts(path)).tobytes(), digest_size=8).hexdigest()


def batch_seed(seed: int, epoch: int, index: int, stream: int = TRAIN_STREAM) -> int:
    """The sampling seed of batch `index` of `epoch` (a 63-bit integer, fixed by its arguments)."""
    state = np.random.SeedSequence([seed, stream, epoch, index]).generate_state(1, dtype=np.uint64)[0]
    return int(state >> np.uint64(1))
