"""Planning a historical embedding cache (OUTRE §4.3): which sampled subtrees a fresh cached embedding prunes.

A model of L layers computes, for every node one hop from the seeds, its layer-(L-1) embedding
(the input of the last layer) from that node's subtree of depth L-1. OUTRE keeps those
embeddings for a chosen set of nodes and reuses one for `staleness` - 1 iterations after it
was computed: while it is fresh, the node's subtree need not be sampled, gathered or trained
through. Batches are known ahead (offline sampling, or one at a time online), so the plan is
exact: batch i's one-hop nodes that are cached and were last computed less than `staleness`
batches ago are *pruned* (the sampler does not expand them; `NeighborSampler.sample(stop=)`),
the other cached ones are *pushed* (computed in full, their embedding written to the cache).
With ``staleness=1`` nothing is ever pruned: training is exactly training without the cache.

The bound is OUTRE's fixed one by default. A planner can adapt it (`ramp` r > 0,
`HistoryPlanner.window`): an embedding computed at batch t then stands in for at most
min(staleness, max(1, floor(r * t))) batches, so the embeddings of the nearly untrained model of
the first batches, which the fixed bound lets serve a short round to its end, expire first. Given
the round's length (`total`), it can also end the round exact: its last `cooldown` share of batches
prune nothing. On a 100k-node graph (3 epochs of 40 batches, 4,096 cached nodes, last-hop rule,
staleness 100; docs/benchmarks.md) the fixed bound cost 1.6 points of test accuracy against no
cache, r = 0.5 cost 0.9 and a 15% cool-down 1.2; but under the memory split they read 1.17x and
1.21x fewer bytes than belady instead of the fixed bound's 1.35x, and with partition batches the
fixed bound still scored 1.7 points above shuffled batches without a cache. So neither is the default;
both are options (``history_ramp``, ``history_cooldown``) for a user who would rather pay bytes for accuracy.

What a pruned node loses (`prune`): with ``"subtree"`` (OUTRE's rule) its whole subtree, so in a
model of three or more layers the seeds' lower layers read that node's lower-layer embeddings
computed from its own features alone, an approximation beside the staleness. With ``"last-hop"``
only the subtree's last hop: the node and the nodes only it reached are expanded as usual but at the
last hop (`NeighborSampler.sample(last_hop=True)`), so every lower-layer embedding the seeds read is
exact and a fresh cached row is the only approximation. On the bench graph (8.4M nodes, fanouts
10,10,10, 2 epochs, staleness 100) the subtree rule cost 1.35 points of test accuracy against no cache
and the last-hop rule 0.19, for 8% more bytes read than the subtree rule.

``"thin"`` (the default) is the last-hop rule with one neighbour (`THIN_NEIGHBOURS`) drawn at the last
hop for each node it leaves unexpanded there (`NeighborSampler.sample(thin=)`). The forward pass is the
last-hop rule's: those nodes feed only the served node, whose value the cached row replaces. But the
gradient runs straight through the served node into them (`operators.train.history`), and with no
neighbour drawn their rows are computed as if their neighbours' mean were zero, a signal the model never
sees elsewhere. On a 2M-node graph with a weak feature signal (20 classes, 3-layer GraphSAGE, 10 epochs,
three seeds; docs/benchmarks.md) the last-hop rule scored 1.8 points below in-memory training and the
thin rule 0.1 below (within a point at every seed), at 1.49x fewer bytes than belady instead of 1.60x;
a second neighbour each bought no accuracy for 7% more bytes.

The cached nodes are, as many as the cache's memory holds, the one-hop nodes of the most batches
(`history_nodes_by_count`, offline: the samples are known ahead) or the most connected ones (highest
in-degree, `history_nodes`, what an online loader can know); ties by id. Torch-free: the training side is `operators.train.history`.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ConfigError

__all__ = ["DEFAULT_COOLDOWN", "DEFAULT_PRUNE", "DEFAULT_RAMP", "DEFAULT_STALENESS", "EMBEDDING_BYTES",
           "EMBEDDING_DTYPE", "HISTORY_PRUNES", "HISTORY_SELECTS", "THIN_NEIGHBOURS", "HistoryPlanner",
           "HistoryStep", "attach_plan", "check_prune", "check_rule", "describe_staleness", "history_nodes",
           "history_nodes_by_count", "history_rows", "local_positions", "plan_round", "planned_width",
           "refuse_without_cache", "sample_planned", "served_share", "staleness_rule"]

# Cached embeddings are float16: a stale row's error dwarfs the rounding (2^-11 relative), and the
# memory split then holds twice the embeddings per byte (on the bench graph its choice read 9% fewer bytes).
EMBEDDING_DTYPE = "float16"
EMBEDDING_BYTES = 2
DEFAULT_STALENESS = 100  # OUTRE's staleness threshold
HISTORY_SELECTS = ("accesses", "degree")     # how the cached nodes are chosen (history_nodes_by_count, history_nodes)
HISTORY_PRUNES = ("thin", "last-hop", "subtree")  # what a fresh embedding prunes below its node (see above)
DEFAULT_PRUNE = "thin"
THIN_NEIGHBOURS = 1  # under "thin": neighbours each node the last-hop rule leaves unexpanded draws at the last hop
DEFAULT_RAMP = 0.0   # the adaptive staleness bound's slope (HistoryPlanner.window); 0: OUTRE's fixed bound
DEFAULT_COOLDOWN = 0.0   # the share of a round's last batches that prune nothing (HistoryPlanner)


def check_prune(prune: object, option: str = "history_prune") -> str:
    """`prune` if it names a pruning rule (`HISTORY_PRUNES`), else a ConfigError naming `option`."""
    if prune not in HISTORY_PRUNES:
        raise ConfigError(option, f"expected one of {', '.join(HISTORY_PRUNES)}, got {prune!r}")
    return str(prune)


def check_rule(ramp: float, cooldown: float, prefix: str = "") -> tuple[float, float]:
    """The adaptive staleness bound's slope `ramp` and the cool-down share `cooldown` as floats, else a
    ConfigError naming ``history_ramp`` or ``history_cooldown`` (after `prefix`) and what it takes."""
    for option, value, ok, want in (
            ("history_ramp", ramp, lambda v: 0 <= v < math.inf, "a finite number >= 0 (0: OUTRE's fixed bound)"),
            ("history_cooldown", cooldown, lambda v: 0 <= v <= 1,
             "the share of the round's last batches that prune nothing, in [0, 1]")):
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not ok(float(value)):
            raise ConfigError(prefix + option, f"expected {want}, got {value!r}")
    return float(ramp), float(cooldown)


def refuse_without_cache(staleness: int | None = None, prune: str | None = None, select: str | None = None, *,
                         default_staleness: int = DEFAULT_STALENESS, default_prune: str = DEFAULT_PRUNE,
                         ramp: float | None = None, cooldown: float | None = None) -> None:
    """A ConfigError for a history option given (not None, not its default) where no historical embedding
    cache is: it would change nothing, so the user has most likely forgotten ``history_memory``."""
    for option, value, default in (("history_staleness", staleness, default_staleness),
                                   ("history_select", select, HISTORY_SELECTS[0]),
                                   ("history_prune", prune, default_prune),
                                   ("history_ramp", ramp, DEFAULT_RAMP),
                                   ("history_cooldown", cooldown, DEFAULT_COOLDOWN)):
        if value is not None and value != default:
            raise ConfigError(option, "applies to a historical embedding cache only (history_memory)")


def history_rows(memory: int, dim: int) -> int:
    """Embeddings of width `dim` that `memory` bytes hold."""
    if dim < 1:
        raise ConfigError("hidden", f"the cached embeddings need a width >= 1, got {dim}")
    if memory < 0:
        raise ConfigError("history_memory", f"must be >= 0 bytes, got {memory}")
    return int(memory) // (int(dim) * EMBEDDING_BYTES)


def history_nodes(indptr: np.ndarray, rows: int) -> np.ndarray:
    """The `rows` nodes of highest in-degree (ties: lower id first), sorted by id: the cache's slots."""
    n = int(indptr.shape[0]) - 1
    rows = max(0, min(int(rows), n))
    if rows == 0:
        return np.zeros(0, dtype=np.int64)
    degree = np.diff(np.asarray(indptr, dtype=np.int64))
    top = np.argsort(-degree, kind="stable")[:rows]
    return np.sort(top).astype(np.int64)


def history_nodes_by_count(hop1: list[list[np.ndarray]], num_nodes: int, rows: int) -> np.ndarray:
    """The `rows` nodes that are one-hop nodes of the most batches of the round (`hop1[k][j]`: batch j
    of superbatch k; ties: lower id first), sorted by id. Offline the planner knows these counts
    exactly: a node cached for every batch it is in after the first prunes a subtree each time,
    which in-degree, the online choice, only estimates."""
    rows = max(0, min(int(rows), int(num_nodes)))
    batches = [np.asarray(h, dtype=np.int64) for sb in hop1 for h in sb]
    if rows == 0 or not batches:
        return np.zeros(0, dtype=np.int64)
    counts = np.bincount(np.concatenate(batches), minlength=int(num_nodes))
    top = np.argsort(-counts, kind="stable")[:rows]
    return np.sort(top).astype(np.int64)


@dataclass
class HistoryStep:
    """One batch's plan: the one-hop nodes pruned (a fresh embedding stands in) and pushed (computed, then
    cached), as node ids and as cache slots (positions in the planner's `nodes`); `last_hop` and `thin`:
    the pruning rule (``"subtree"``: False and 0; ``"last-hop"``: True and 0; ``"thin"``: True and
    `THIN_NEIGHBOURS`, the neighbours each node left unexpanded at the last hop draws there)."""

    pruned: np.ndarray
    pruned_slots: np.ndarray
    pushed: np.ndarray
    pushed_slots: np.ndarray
    last_hop: bool = True
    thin: int = 0


class HistoryPlanner:
    """Batch by batch, in training order: which of a batch's one-hop nodes are pruned and which pushed.

    Args:
        nodes: the cached nodes, sorted unique ids (`history_nodes`); slot s holds ``nodes[s]``.
        staleness: an embedding computed at batch i stands in at batches i+1 .. i+staleness-1 (>= 1).
        prune: what a pruned node loses, one of `HISTORY_PRUNES`: ``"thin"``, ``"last-hop"`` or
            ``"subtree"`` (the module's docstring).
        ramp: the adaptive bound's slope (`window`; 0: the fixed bound).
        total: the round's training batches; cooldown: the share of them, last, that prune nothing
            (needs `total`).
    """

    def __init__(self, nodes: np.ndarray, staleness: int, prune: str = DEFAULT_PRUNE, ramp: float = DEFAULT_RAMP,
                 total: int | None = None, cooldown: float = DEFAULT_COOLDOWN) -> None:
        if staleness < 1:
            raise ConfigError("history_staleness", f"must be >= 1 (1: never reuse), got {staleness}")
        ramp, cooldown = check_rule(ramp, cooldown)
        self.ramp = ramp
        # the round's last batches prune nothing: the model ends on exact embeddings, as evaluation sees them
        self.exact_from = None if total is None else int(total) - math.ceil(cooldown * int(total))
        self.nodes = np.asarray(nodes, dtype=np.int64)
        if self.nodes.ndim != 1 or np.any(np.diff(self.nodes) <= 0):
            raise ValueError("history nodes must be sorted and unique")
        self.staleness = int(staleness)
        prune = check_prune(prune)
        self.last_hop = prune != "subtree"
        self.thin = THIN_NEIGHBOURS if prune == "thin" else 0
        self.last = np.full(self.nodes.shape[0], np.iinfo(np.int64).min // 2, dtype=np.int64)
        self.batch = 0

    def window(self, computed: np.ndarray) -> np.ndarray | int:
        """For how many batches embeddings computed at batches `computed` stand in, counting the one that
        computed them: `staleness`, or with a ramp r > 0 at most ``max(1, floor(r * computed))`` of them
        (the adaptive bound: early embeddings, from a fast-changing model, expire soonest)."""
        if self.ramp <= 0:
            return self.staleness
        age = np.floor(self.ramp * np.maximum(computed, 0)).astype(np.int64)
        return np.minimum(self.staleness, np.maximum(1, age))

    def step(self, hop1: np.ndarray) -> HistoryStep:
        """The plan of the next batch, given its one-hop nodes (unique ids)."""
        ids = np.asarray(hop1, dtype=np.int64)
        pos = np.searchsorted(self.nodes, ids)
        hit = pos < self.nodes.shape[0]
        hit[hit] = self.nodes[pos[hit]] == ids[hit]
        ids, slots = ids[hit], pos[hit]
        fresh = self.batch - self.last[slots] < self.window(self.last[slots])
        if self.exact_from is not None and self.batch >= self.exact_from:
            fresh[:] = False
        pushed_slots = slots[~fresh]
        self.last[pushed_slots] = self.batch
        self.batch += 1
        return HistoryStep(ids[fresh], slots[fresh], ids[~fresh], pushed_slots, self.last_hop, self.thin)


def attach_plan(sample: object, step: HistoryStep) -> None:
    """Set ``sample.history``: the local positions and slots of `step`'s pruned and pushed nodes in a
    sample drawn with ``stop=step.pruned`` (they are among its one-hop nodes)."""
    n_id = sample.n_id  # type: ignore[attr-defined]
    bs, n1 = int(sample.num_sampled_nodes[0]), int(sample.num_sampled_nodes[1])  # type: ignore[attr-defined]
    sample.history = (local_positions(n_id, bs, bs + n1, step.pruned), step.pruned_slots,  # type: ignore[attr-defined]
                      local_positions(n_id, bs, bs + n1, step.pushed), step.pushed_slots)


def sample_planned(sampler: Any, seeds: np.ndarray, seed: int, step: HistoryStep) -> Any:
    """Sample a batch with `step`'s pruned nodes stopped by its rule (a `NeighborSampler`), its plan attached."""
    s = sampler.sample(seeds, seed, stop=step.pruned, last_hop=step.last_hop, thin=step.thin)
    attach_plan(s, step)
    return s


def planned_width(where: object, planned: dict, hidden: int) -> int:
    """The rows of a round planned for a cache of ``planned["dim"]``-wide embeddings, checked against the
    model's `hidden` channels (`where` names the round in the error)."""
    if int(planned["dim"]) != hidden:
        raise ConfigError("hidden", f"{where} was planned for a historical embedding cache of width "
                                    f"{planned['dim']}; train with hidden={planned['dim']} (got {hidden})")
    return int(planned["rows"])


def plan_round(hop1: list[list[np.ndarray]], nodes: np.ndarray, staleness: int,
               prune: str = DEFAULT_PRUNE, ramp: float = DEFAULT_RAMP,
               cooldown: float = DEFAULT_COOLDOWN) -> list[list[HistoryStep]]:
    """The plan of a whole round: `hop1[k][j]` are the one-hop nodes of batch j of superbatch k, in
    training order; the steps come back in the same shape."""
    planner = HistoryPlanner(nodes, staleness, prune, ramp, total=sum(len(b) for b in hop1), cooldown=cooldown)
    return [[planner.step(h) for h in batches] for batches in hop1]


def local_positions(n_id: np.ndarray, start: int, stop: int, ids: np.ndarray) -> np.ndarray:
    """Positions in `n_id` of `ids`, all of which lie in ``n_id[start:stop]`` (a hop's nodes)."""
    part = np.asarray(n_id[start:stop], dtype=np.int64)
    order = np.argsort(part, kind="stable")
    at = np.searchsorted(part, ids, sorter=order)
    found = order[np.minimum(at, max(part.shape[0] - 1, 0))] if part.shape[0] else np.zeros(0, dtype=np.int64)
    if ids.shape[0] and (part.shape[0] == 0 or not np.array_equal(part[found], ids)):
        raise ValueError("history ids are not among the hop's nodes")
    return (found + start).astype(np.int64)


def staleness_rule(ramp: float = DEFAULT_RAMP, cooldown: float = DEFAULT_COOLDOWN) -> dict[str, float]:
    """The adaptive staleness bound (`ramp`) and cool-down (`cooldown`) where they differ from the fixed
    bound, as JSON values: what cached plans and reports name beside the staleness (empty: OUTRE's fixed
    bound alone)."""
    ramp, cooldown = check_rule(ramp, cooldown)
    return {**({"ramp": ramp} if ramp else {}), **({"cooldown": cooldown} if cooldown else {})}


def served_share(history: dict[str, Any]) -> float:
    """The share of the cached nodes' appearances in training batches that a stored embedding served
    (pruned) rather than a fresh computation (pushed), from a report's or a plan's ``history`` figures:
    what a user trades for the bytes the pruned subtrees save."""
    pruned, pushed = int(history.get("pruned") or 0), int(history.get("pushed") or 0)
    return pruned / (pruned + pushed) if pruned + pushed else 0.0


def describe_staleness(history: dict[str, Any]) -> str:
    """The staleness bound of a report's ``history`` figures, in words (with the adaptive bound and the
    cool-down where the plan had them)."""
    text = str(history.get("staleness"))
    if history.get("ramp"):
        text += f" at most, {history['ramp']:g} x the model's age in batches when computed"
    if history.get("cooldown"):
        text += f", the round's last {history['cooldown']:.0%} exact"
    return text
