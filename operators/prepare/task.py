"""What a round trains on: node labels, or links (seed edges and their negatives), cut into batches.

Every loader (the in-memory reference, a prepared round, a stream, the online loaders) asks this
module for an epoch's batches, so a link task, like a node task, trains on the very same samples
everywhere. A batch is a `BatchSeeds`: the nodes the neighbour sample starts from and its sampling
seed, and for a link task the edges it is scored on.

A link batch is shaped as PyG's `LinkNeighborLoader` shapes one (``disjoint=False``, binary negative
sampling): ``batch_size`` supervision edges of the epoch's seeded shuffle, then ``round(neg_ratio *
batch_size)`` negative pairs whose two ends are drawn at random (uniformly, or in proportion to a
node's in-degree in the message-passing graph); the sample starts from the sorted distinct
endpoints, and ``edge_label_index`` holds each pair's positions among them, positives first, with
``edge_label`` 1 for a positive and 0 for a negative. The negatives are drawn when the round is
sampled, from a seed stream of their own, so their neighbourhoods are sampled, counted, planned and
packed like every other read.

Evaluation ranks each validation or test edge against the store's fixed negatives of that edge
(``link/val_neg.npy``: K destinations per positive, drawn at ingest), as OGB's link benchmarks do: an
evaluation batch's ``edge_label_index`` holds its `eval_positives` positives, then each positive's K
negative pairs (its source with each negative destination), so the batch's scores split into the
positives' and a [positives, K] block.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ConfigError, InputError
from .seeds import TRAIN_STREAM, BatchOrder, batch_seed, seed_batches

__all__ = ["LINK_STREAM", "NEG_SAMPLINGS", "NODE", "TASKS", "BatchSeeds", "SeedSource", "Task", "attach_labels",
           "epoch_seeds",
           "eval_link_batches",
           "eval_positives", "link_batches", "num_seeds", "sorted_endpoints"]

TASKS = ("node", "link")
NEG_SAMPLINGS = ("uniform", "degree")
LINK_STREAM = 4         # the negatives' random numbers, apart from the shuffle's and the parts'


@dataclass(frozen=True)
class Task:
    """What is trained: ``"node"`` (classification of the seed nodes) or ``"link"`` (scores of seed edges).

    Attributes:
        kind: one of `TASKS`.
        neg_ratio: a link batch's negative pairs per positive edge (PyG's ``NegativeSampling.amount``).
        neg_sampling: how a negative pair's ends are drawn: ``"uniform"`` over the nodes, or ``"degree"``
            (in proportion to a node's in-degree in the message-passing graph).
    """

    kind: str = "node"
    neg_ratio: float = 1.0
    neg_sampling: str = "uniform"

    def __post_init__(self) -> None:
        if self.kind not in TASKS:
            raise ConfigError("task", f"expected one of {', '.join(TASKS)}, got {self.kind!r}")
        ratio = self.neg_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not np.isfinite(ratio) or ratio < 0:
            raise ConfigError("neg_ratio", f"expected a number of negatives per positive >= 0, got {ratio!r}")
        if self.neg_sampling not in NEG_SAMPLINGS:
            raise ConfigError("neg_sampling", f"expected one of {', '.join(NEG_SAMPLINGS)}, got {self.neg_sampling!r}")

    @property
    def link(self) -> bool:
        return self.kind == "link"

    def max_seeds(self, batch_size: int) -> int:
        """The most nodes a batch's sample starts from: its seed nodes, or a link batch's positive and negative
        pairs' endpoints (a bound for budgets sized before sampling)."""
        if not self.link:
            return batch_size
        return 2 * (batch_size + round(self.neg_ratio * batch_size))

    def describe(self) -> dict[str, Any]:
        """The task as JSON values (what samples depend on)."""
        if not self.link:
            return {"kind": "node"}
        return {"kind": "link", "neg_ratio": float(self.neg_ratio), "neg_sampling": self.neg_sampling}

    def check(self, store: Any, order: BatchOrder | None = None) -> None:
        """Refuse a link task on a store without an edge split, or with batches cut from graph parts.

        Raises:
            InputError: (naming the store) a link task on a store with no edge split.
            ConfigError: (``batches``) partition batches for a link task.
        """
        if not self.link:
            return
        if not getattr(store, "has_link", False):
            raise InputError(getattr(store, "path", "store"),
                             "a link task needs an edge split, and this store has none: ingest with --link-split "
                             "VAL,TEST (a seeded random split) or with a split column in the raw edges")
        if order is not None:
            self.check_batches(order.kind)

    def check_batches(self, batches: str) -> None:
        """Refuse partition batches (`batches`: the batch order's kind) for a link task.

        Raises:
            ConfigError: (``batches``) partition batches deal nodes by graph part, and a link task's seeds are edges.
        """
        if self.link and batches == "partition":
            raise ConfigError("batches", "partition batches deal a split's nodes by graph part; a link task's seeds "
                                         "are edges: use shuffled batches")


NODE = Task()


@dataclass
class BatchSeeds:
    """One batch before sampling: where its neighbour sample starts, with which seed, and what it is scored on.

    Attributes:
        seeds: int64 distinct node ids the sample starts from (the first rows of its ``n_id``).
        sampling_seed: the neighbour sample's seed.
        label_index: (link) int64 [2, L] positions in `seeds` of each scored pair, positives first.
        label: (link) float32 [L]: 1 for a positive edge, 0 for a negative pair.
    """

    seeds: np.ndarray
    sampling_seed: int
    label_index: np.ndarray | None = None
    label: np.ndarray | None = None


def num_seeds(store: Any, task: Task, split: str = "train") -> int:
    """How many seeds a split has: its nodes (node task) or its supervision edges (link task)."""
    if task.link:
        return int(store.link_edges(split).shape[1])
    return int(store.split_ids(split).shape[0])


def sorted_endpoints(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct endpoints of the pairs (`src[i]`, `dst[i]`), ascending, and each pair's positions
    among them as [2, L]: PyG's ``edge_label_index`` of a link batch (``disjoint=False``)."""
    ends = np.concatenate([np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)])
    nodes, inverse = np.unique(ends, return_inverse=True)
    return nodes, inverse.reshape(2, -1).astype(np.int64)


_CDFS: dict[int, tuple[Any, np.ndarray]] = {}     # id(indptr) -> (indptr, its in-degrees' running sum)


def _degree_cdf(indptr: Any) -> np.ndarray:
    """The running sum of in-degrees of the graph whose CSC pointer is `indptr`, built once per process."""
    held = _CDFS.get(id(indptr))
    if held is None or held[0] is not indptr:
        _CDFS.clear()
        held = (indptr, np.asarray(indptr, dtype=np.int64)[1:] - int(indptr[0]))
        _CDFS[id(indptr)] = held
    return held[1]


def _draw(rng: np.random.Generator, n: int, num_nodes: int, task: Task, indptr: Any) -> np.ndarray:
    """`n` node ids drawn with replacement: uniformly, or in proportion to in-degree."""
    if task.neg_sampling == "uniform":
        return rng.integers(0, num_nodes, size=n, dtype=np.int64)
    cdf = _degree_cdf(indptr)
    total = int(cdf[-1]) if cdf.shape[0] else 0
    if total == 0:
        raise ConfigError("neg_sampling", "degree-weighted negatives need a graph with edges")
    return np.searchsorted(cdf, rng.integers(0, total, size=n, dtype=np.int64), side="right").astype(np.int64)


def link_batches(edges: np.ndarray, batch_size: int, epoch: int, seed: int, task: Task, num_nodes: int,
                 indptr: Any = None, shuffle: bool = True, stream: int = TRAIN_STREAM,
                 only: range | None = None) -> list[BatchSeeds]:
    """An epoch's link batches over the supervision `edges` ([2, P]): a seeded shuffle cut into batches of
    `batch_size` edges, each with its negative pairs (`Task`), drawn from (seed, stream, epoch, batch).

    `indptr`: the message-passing graph's CSC pointer (degree-weighted negatives need it). `only`: the
    batches wanted (a superbatch's); None: all of them. A batch is the same whichever others are drawn.
    """
    if batch_size < 1:
        raise ConfigError("batch_size", f"expected an integer >= 1, got {batch_size}")
    edges = np.asarray(edges, dtype=np.int64)
    total = int(edges.shape[1])
    order = np.random.default_rng([seed, epoch]).permutation(total) if shuffle else np.arange(total)
    out = []
    for i in only if only is not None else range(-(-total // batch_size)):
        start = i * batch_size
        pos = edges[:, order[start:start + batch_size]]
        count = round(task.neg_ratio * pos.shape[1])
        rng = np.random.default_rng([seed, LINK_STREAM, stream, epoch, i])
        neg_src = _draw(rng, count, num_nodes, task, indptr)
        neg_dst = _draw(rng, count, num_nodes, task, indptr)
        nodes, index = sorted_endpoints(np.concatenate([pos[0], neg_src]), np.concatenate([pos[1], neg_dst]))
        label = np.concatenate([np.ones(pos.shape[1], np.float32), np.zeros(count, np.float32)])
        out.append(BatchSeeds(nodes, batch_seed(seed, epoch, i, stream), index, label))
    return out


def eval_positives(batch_size: int, negatives: int) -> int:
    """Positives per evaluation batch: as many as keep its pairs' endpoints near `batch_size` nodes."""
    return max(1, batch_size // (2 + negatives))


def eval_link_batches(edges: np.ndarray, negatives: np.ndarray, batch_size: int, seed: int,
                      stream: int) -> list[BatchSeeds]:
    """The evaluation batches of a split's positive `edges` ([2, P]) and their fixed `negatives` ([P, K]
    destinations), in order: each batch's pairs are its positives, then every positive's K negatives
    (its source with each negative destination), positive by positive."""
    edges = np.asarray(edges, dtype=np.int64)
    negatives = np.asarray(negatives, dtype=np.int64)
    if negatives.ndim != 2 or negatives.shape[0] != edges.shape[1]:
        raise InputError("link negatives", f"expected one row of negatives per positive edge ({edges.shape[1]}), "
                                           f"got an array of shape {tuple(negatives.shape)}")
    k = int(negatives.shape[1])
    per = eval_positives(batch_size, k)
    out = []
    for i, start in enumerate(range(0, int(edges.shape[1]), per)):
        pos = edges[:, start:start + per]
        neg = negatives[start:start + per]
        src = np.concatenate([pos[0], np.repeat(pos[0], k)])
        dst = np.concatenate([pos[1], neg.reshape(-1)])
        nodes, index = sorted_endpoints(src, dst)
        label = np.concatenate([np.ones(pos.shape[1], np.float32), np.zeros(neg.size, np.float32)])
        out.append(BatchSeeds(nodes, batch_seed(seed, 0, i, stream), index, label))
    return out


def epoch_seeds(store: Any, batch_size: int, epoch: int, seed: int, task: Task = NODE, order: BatchOrder | None = None,
                shuffle: bool = True, stream: int = TRAIN_STREAM, split: str = "train",
                only: range | None = None) -> list[BatchSeeds]:
    """An epoch's batches of `split` as every loader draws them: the split's nodes cut by `order` (node
    task; `seeds.seed_batches`), or its supervision edges with their negatives (link task; `link_batches`).

    `store`: a `Store`, or anything with its ``split_ids``, ``link_edges``, ``num_nodes`` and ``indptr``.
    `only`: the batches wanted (a superbatch's); None: the whole epoch.
    """
    if task.link:
        return link_batches(store.link_edges(split), batch_size, epoch, seed, task, int(store.num_nodes),
                            indptr=store.indptr if task.neg_sampling == "degree" else None, shuffle=shuffle,
                            stream=stream, only=only)
    batches = seed_batches(store.split_ids(split), batch_size, epoch, seed, shuffle=shuffle, order=order)
    wanted = only if only is not None else range(len(batches))
    return [BatchSeeds(batches[i], batch_seed(seed, epoch, i, stream)) for i in wanted]


def attach_labels(sample: Any, batch: BatchSeeds) -> Any:
    """`sample` (of `batch`'s seeds) with a link batch's scored pairs attached (``edge_label_index``, ``edge_label``),
    as the samples file and `Data` assembly read them; a node batch's sample unchanged."""
    if batch.label_index is not None:
        sample.edge_label_index = batch.label_index
        sample.edge_label = batch.label
    return sample


class SeedSource:
    """The batches of one split, epoch by epoch, as every loader draws them: training batches
    (`epoch_seeds`), or with `evaluate` the split's evaluation batches in order (a node task's seeds, unshuffled,
    or a link task's positives with their fixed negatives, `eval_link_batches`).

    `store`: a `Store` (or anything with its ``split_ids``, ``link_edges``, ``link_negatives``, ``num_nodes``
    and ``indptr``).
    """

    def __init__(self, store: Any, batch_size: int, seed: int, task: Task = NODE, order: BatchOrder | None = None,
                 split: str = "train", stream: int = TRAIN_STREAM, evaluate: bool = False) -> None:
        self.store, self.batch_size, self.seed, self.task = store, batch_size, seed, task
        self.order, self.split, self.stream, self.evaluate = order, split, stream, evaluate
        self._eval: list[BatchSeeds] | None = None

    def __len__(self) -> int:
        if self.evaluate and self.task.link:
            return len(self.epoch(0))
        return int(-(-num_seeds(self.store, self.task, self.split) // self.batch_size))

    def epoch(self, epoch: int) -> list[BatchSeeds]:
        """Epoch `epoch`'s batches (an evaluation's are the same every epoch)."""
        if not self.evaluate:
            return epoch_seeds(self.store, self.batch_size, epoch, self.seed, self.task, self.order,
                               stream=self.stream, split=self.split)
        if not self.task.link:
            return epoch_seeds(self.store, self.batch_size, 0, self.seed, self.task, shuffle=False,
                               stream=self.stream, split=self.split)
        if self._eval is None:
            self._eval = eval_link_batches(self.store.link_edges(self.split), self.store.link_negatives(self.split),
                                           self.batch_size, self.seed, self.stream)
        return self._eval
