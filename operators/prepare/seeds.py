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

from ...errors import ConfigError

__all__ = ["BATCH_ORDERS", "GROUPINGS", "PARTS_PER_GROUP", "PART_STREAM", "TEST_STREAM", "TRAIN_STREAM",
           "VAL_STREAM", "BatchOrder", "batch_seed", "label_shares", "load_labels", "load_parts",
           "part_labels", "partition_order", "parts_fingerprint", "seed_batches"]

# Seed streams: training, validation and test batches never share sampling seeds.
TRAIN_STREAM, VAL_STREAM, TEST_STREAM = 0, 1, 2



BATCH_ORDERS = ("shuffled", "partition")
GROUPINGS = ("label", "random")     # how parts are put together in groups (see BatchOrder)
PARTS_PER_GROUP = 20          # OUTRE's 20 parts per macro batch
PART_STREAM = 3               # the order of parts never shares random numbers with the shuffle


@dataclass(frozen=True)
class BatchOrder:
    """How each epoch's training seeds are cut into batches.

    ``"shuffled"``: a seeded permutation of the seeds. ``"partition"`` (OUTRE's partition-based
    batches): the parts of a min-cut partition (`parts`: the path of an int32 .npy giving every
    node's part) are dealt, `group` at a time, into groups in a seeded random order; each group's
    training seeds are shuffled, and the sequence of groups is cut into batches. Batches then
    hold seeds of few parts, whose sampled neighbourhoods overlap: fewer distinct rows per
    batch. Both cover every seed once per epoch, in as many batches.

    How parts meet in a group (`grouping`): ``"random"`` is OUTRE's. ``"label"`` (needs
    `labels`, the path of an .npy of every node's label) deals the parts, ordered by the most
    common label of their training seeds, round-robin into the groups: each group (so each
    batch) holds parts of as many different labels as it can. Min-cut parts of a homophilous
    graph are nearly single-label, so randomly grouped parts give batches whose label mix swings
    from batch to batch, and SGD follows the swing (on our synthetic graphs, accuracy after two
    epochs fell from 0.87 to 0.37; label grouping: 0.79, and within a point after six). Which
    parts share a group is still random within each label, so the locality is the same.
    """

    kind: str = "shuffled"
    parts: str | None = None
    group: int = PARTS_PER_GROUP
    grouping: str = "random"
    labels: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in BATCH_ORDERS:
            raise ConfigError("batches", f"expected one of {', '.join(BATCH_ORDERS)}, got {self.kind!r}")
        if self.kind == "partition" and self.parts is None:
            raise ConfigError("batches", "partition batches need a partition of the graph (its parts file)")
        if self.group < 1:
            raise ConfigError("parts_per_group", f"must be >= 1, got {self.group}")
        if self.grouping not in GROUPINGS:
            raise ConfigError("group_by", f"expected one of {', '.join(GROUPINGS)}, got {self.grouping!r}")
        if self.grouping == "label" and self.kind == "partition" and self.labels is None:
            raise ConfigError("group_by", "grouping parts by label needs the nodes' labels")

    def describe(self) -> dict:
        """What the order depends on, as JSON values (the parts file by its content's fingerprint; the
        labels are the store's, which the callers' keys name already)."""
        if self.kind == "shuffled":
            return {"kind": "shuffled"}
        return {"kind": self.kind, "group": self.group, "parts": parts_fingerprint(self.parts),
                **({"grouping": self.grouping} if self.grouping != "random" else {})}


def seed_batches(seeds: np.ndarray, batch_size: int, epoch: int, seed: int,
                 shuffle: bool = True, order: BatchOrder | None = None) -> list[np.ndarray]:
    """Cut `seeds` into batches of `batch_size` (the last may be smaller), like NeighborLoader.

    The order is fixed by (seed, epoch) and `order` (None: shuffled), so every pipeline and
    every re-run trains on the same batches.
    """
    if batch_size < 1:
        raise ConfigError("batch_size", f"expected an integer >= 1, got {batch_size}")
    ids = np.asarray(seeds, dtype=np.int64)
    if order is not None and order.parts is not None and shuffle:
        parts = load_parts(order.parts)
        if ids.shape[0] and int(ids.max()) >= parts.shape[0]:
            raise ConfigError("partition", f"{order.parts}: {parts.shape[0]:,} nodes' parts, but seed "
                                           f"{int(ids.max()):,} is among the training nodes (a partition of another graph?)")
        labels = None if order.grouping == "random" else np.asarray(load_labels(order.labels)[ids])
        ids = ids[partition_order(parts[ids], order.group, epoch, seed, labels)]
    elif shuffle:
        ids = ids[np.random.default_rng([seed, epoch]).permutation(ids.shape[0])]
    return [ids[i:i + batch_size] for i in range(0, ids.shape[0], batch_size)]


def partition_order(seed_parts: np.ndarray, group: int, epoch: int, seed: int,
                    seed_labels: np.ndarray | None = None) -> np.ndarray:
    """The permutation of seeds (given each seed's part) that partition batches take: parts dealt
    into groups of `group` in a random order, seeds shuffled within each group. With
    `seed_labels` (each seed's label), the parts are ordered by their most common label (ties
    at random) and dealt round-robin, so every group mixes labels (`BatchOrder`)."""
    rng = np.random.default_rng([seed, epoch, PART_STREAM])
    parts = np.asarray(seed_parts, dtype=np.int64)
    present, inverse = np.unique(parts, return_inverse=True)
    num_parts = int(present.shape[0])
    if seed_labels is None:
        rank = np.empty(num_parts, dtype=np.int64)
        rank[rng.permutation(num_parts)] = np.arange(num_parts)
        groups = rank[inverse] // group
    else:
        num_groups = -(-num_parts // group)
        dealt = np.lexsort((rng.random(num_parts), part_labels(inverse, seed_labels, num_parts)))
        slot = np.empty(num_parts, dtype=np.int64)
        slot[dealt] = np.arange(num_parts) % num_groups          # round-robin over the groups
        groups = rng.permutation(num_groups)[slot][inverse]      # the groups in a random order
    ties = np.asarray(rng.random(size=int(parts.shape[0])))
    return np.lexsort((ties, groups))


def part_labels(part_of_seed: np.ndarray, seed_labels: np.ndarray, num_parts: int) -> np.ndarray:
    """The most common label among each part's seeds (`part_of_seed`: 0..num_parts-1; ties: the
    smaller label), by one sort of (part, label) pairs."""
    _, lab = np.unique(np.asarray(seed_labels), return_inverse=True)
    lab = lab.astype(np.int64).ravel()
    width = int(lab.max()) + 1 if lab.shape[0] else 1
    pairs, counts = np.unique(np.asarray(part_of_seed, dtype=np.int64) * width + lab, return_counts=True)
    part, label = pairs // width, pairs % width
    best = np.lexsort((label, -counts, part))              # per part: the highest count first
    first = np.ones(best.shape[0], dtype=bool)
    first[1:] = part[best][1:] != part[best][:-1]
    out = np.zeros(num_parts, dtype=np.int64)
    out[part[best][first]] = label[best][first]
    return out


def load_parts(path: str | os.PathLike[str]) -> np.ndarray:
    """The partition file (int32 part per node), memory-mapped; the same file is opened once per process."""
    parts = _mapped(path, "a partition file (an int32 .npy of every node's part)")
    if parts.ndim != 1 or parts.dtype != np.int32:
        raise ConfigError("partition", f"{os.fspath(path)}: expected a 1-D int32 array of parts, got "
                                       f"{parts.dtype} {parts.shape}")
    return parts


def _mapped(path: str | os.PathLike[str], what: str) -> np.ndarray:
    """The .npy at `path`, memory-mapped once per process (and again when the file changes); an
    InputError naming it as `what` when it is not an .npy."""
    p = os.fspath(path)
    st = os.stat(p)
    return _open_mapped(p, st.st_mtime_ns, st.st_size, what)


@lru_cache(maxsize=8)
def _open_mapped(path: str, mtime_ns: int, size: int, what: str) -> np.ndarray:
    from ...errors import InputError
    from ..formats.npyio import load_npy

    try:
        return load_npy(path, mmap_mode="r")
    except (OSError, ValueError, EOFError) as e:
        raise InputError(path, f"not {what}: {e}") from e


def label_shares(labels: np.ndarray, num_classes: int) -> tuple[float, ...]:
    """Each label's share of `labels` (labels in 0..num_classes-1): the prior partition batches'
    losses are weighed by (`train.config.TrainConfig.label_prior`)."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.shape[0] and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ConfigError("batches", f"partition batches weigh the losses by the training labels' shares, which "
                                     f"must be in [0, {num_classes}); the training split has labels from "
                                     f"{int(labels.min())} to {int(labels.max())}")
    counts = np.bincount(labels, minlength=num_classes)[:num_classes]
    total = int(counts.sum())
    if total == 0:
        raise ConfigError("batches", "partition batches need training seeds with labels")
    return tuple(float(c) / total for c in counts)


def load_labels(path: str | os.PathLike[str] | None) -> np.ndarray:
    """Every node's label (an .npy), memory-mapped; the same file is opened once per process."""
    from ...errors import InputError

    if path is None:
        raise ConfigError("group_by", "grouping parts by label needs the nodes' labels")
    labels = _mapped(path, "a labels file (an .npy of every node's label)")
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise InputError(path, f"expected a 1-D integer array of labels, got {labels.dtype} {labels.shape}")
    return labels


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
