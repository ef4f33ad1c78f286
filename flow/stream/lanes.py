"""The lanes of a streamed run: one per GPU worker, each a stream of its own share of every superbatch.

A run on N GPU workers is data-parallel (`diskflow run streaming --gpus N`): of each superbatch,
worker r trains the batches at positions ``r, r + N, ...`` (`superbatch.lane_layout`), one per
optimizer step, the gradients averaged over the workers (`operators.train.steps.DataParallel`).
Each worker's share is prepared as a one-worker stream of its own (a `Lane`): its samples (a
``select`` task over the superbatch's samples), its tiers (counted over its own share), its Belady
chain over its own access stream (`--cache per-worker`: each worker its own CPU tier), its
packed bundles shipped to it alone. With one GPU worker the single lane is the stream itself (no
``select`` tasks; the keys are the one-worker run's).

A store with edge features gives each lane a second chain (`EdgeLane`): the edge rows its batches read
(their ``e_id``), counted, tiered and Belady-planned as the node rows are, over the edge table, and packed
into each superbatch's bundle beside them.

`merge_epoch` turns the lanes' records of an epoch into the run's: every batch's loss in the
round's order, the loss and training accuracy over all the seeds, the I/O of all the workers.
`release` drops the futures the lanes hold once no later submission needs them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...operators.prepare.superbatch import SuperbatchRef
from ...operators.train.record import num

__all__ = ["KINDS", "EdgeLane", "Lane", "interleave", "merge_epoch", "release"]

KINDS = ("select", "plan", "trace", "ship", "train")


@dataclass
class EdgeLane:
    """A lane's chain of its edge rows: the edge table it reads (`formats.store.table_locator`), its graph over
    that table, its tiers and header, and per superbatch its edge-row samples and plan."""

    table: str
    graph: Any
    f: dict[str, dict[int, Any]] = field(default_factory=lambda: {"sample": {}, "plan": {}})
    tiers: Any = None
    header: Any = None
    split: Any = None                   # the lane's budgets split between node and edge rows (`tasks.EdgeSplit`)
    start_ids: Any = None               # a resumed run's edge-row CPU tier


@dataclass
class Lane:
    """What the driver holds for one GPU worker's share of the stream (see the module docstring)."""

    rank: int
    refs: list[SuperbatchRef]          # this lane's share of each superbatch (the round's refs with one lane)
    graph: Any                         # its `flow.graph.PrepGraph`
    tok: str                           # ends its task keys
    run: str = ""                      # its job on its GPU worker (scratch directory, trainer)
    gpu_addr: str = ""
    device: str = "cpu"                # where its GPU worker trains
    f: dict[str, dict[int, Any]] = field(default_factory=lambda: {k: {} for k in KINDS})
    shipped_ok: set[int] = field(default_factory=set)
    prepared: set[int] = field(default_factory=set)
    planned: set[int] = field(default_factory=set)
    deferred: set[int] = field(default_factory=set)
    reshipped: set[int] = field(default_factory=set)
    trained: dict[int, dict[str, Any]] = field(default_factory=dict)     # k -> train result, until merged
    next_train: int = 0
    tiers: Any = None
    header: Any = None
    ship_base: Any = None
    base_info: dict[str, Any] = field(default_factory=dict)
    resume_state: dict[str, Any] | None = None
    start_ids: Any = None
    edges: EdgeLane | None = None      # its edge rows' chain (a store with edge features)

    @property
    def round_batches(self) -> int:
        return sum(r.num_batches for r in self.refs)

    def empty(self, k: int) -> bool:
        """Whether superbatch k holds no batch for this lane (fewer batches than GPU workers)."""
        return self.refs[k].num_batches == 0

    def next_share(self, k: int, n: int) -> int:
        """The next superbatch after k whose plan chains on plan k (this lane has a share of it), or `n`."""
        j = k + 1
        while j < n and self.empty(j):
            j += 1
        return j

    def prev_plan(self, k: int, start: int) -> Any:
        """The plan this lane's plan k chains on: its latest non-empty share's before k (None: the first)."""
        for j in range(k - 1, start - 1, -1):
            if not self.empty(j):
                return self.f["plan"][j]
        return None


def interleave(parts: Sequence[Sequence[Any]]) -> list[Any]:
    """Lane r's items at positions r, r + N, ... of one superbatch: the superbatch's order back."""
    out: list[Any] = []
    for i in range(max((len(p) for p in parts), default=0)):
        out += [p[i] for p in parts if i < len(p)]
    return out


def merge_epoch(records: Sequence[dict[str, Any]], tallies: Sequence[dict[str, Any]],
                shares: Sequence[Sequence[int]]) -> dict[str, Any]:
    """The run's record of an epoch from its lanes' (`records`, lane 0's evaluated; `tallies`, their open
    epochs' `EpochTally.state` at its end; `shares[r]`, lane r's batches in each superbatch of the epoch)."""
    losses: list[float] = []
    sizes: list[int] = []
    at = [0] * len(tallies)
    for sb in zip(*shares):
        parts_l, parts_s = [], []
        for r, n in enumerate(sb):
            parts_l.append(tallies[r]["losses"][at[r]:at[r] + n])
            parts_s.append(tallies[r]["sizes"][at[r]:at[r] + n])
            at[r] += n
        losses += interleave(parts_l)
        sizes += interleave(parts_s)
    seen = sum(sizes)
    total = 0.0
    for value, size in zip(losses, sizes):
        total += value * size
    correct = sum(int(t["correct"]) for t in tallies)
    seconds = max(float(r.get("epoch_s") or 0.0) for r in records)
    out = {**records[0], "losses": losses, "loss": num(total / seen) if losses and seen else None,
           "train_acc": num(correct / seen) if losses and seen else None, "epoch_s": seconds}
    if "seeds_per_s" in records[0]:
        out.update(seeds_per_s=seen / seconds if seconds > 0 else None,
                   batches_per_s=len(sizes) / seconds if seconds > 0 else None,
                   bytes_read=sum(int(r.get("bytes_read") or 0) for r in records),
                   requests=sum(int(r.get("requests") or 0) for r in records))
    out["lanes"] = [{"loss": r.get("loss"), "epoch_s": r.get("epoch_s"), "bytes_read": r.get("bytes_read")}
                    for r in records]
    return out


def release(lanes: Sequence[Lane], planner: Lane | None, samples: dict[int, Any], start: int, trained: int,
            n: int) -> None:
    """Drop the futures no later submission needs (a pending task keeps its inputs on the workers itself):
    of the lanes', the shared tier's `planner`'s and the superbatches' `samples`, once `trained` superbatches
    from `start` of the round's `n` are trained.

    Sample k feeds plan k-1 (lookahead), plan k and pack k (through each lane's select k); plan k
    feeds plan k+1 and pack k (and, of a shared tier, the checkpoint after superbatch k); a pack
    can be submitted again until its ship succeeded; ship k feeds train k (a train's own future is
    dropped once its result is handled).
    """
    upto = start + trained

    def plan_done(chain: Lane, shares: Sequence[Lane], k: int) -> bool:
        """Plan k of `chain` (whose plans `shares` pack) is needed by no later submission."""
        return (all(k in lane.shipped_ok for lane in shares) and (chain is not planner or k < upto)
                and all(j in chain.prepared or j >= n for j in range(k + 1, chain.next_share(k, n) + 1)))

    def sample_done(lane: Lane, planned: set[int], k: int) -> bool:
        """Lane's samples of superbatch k (its select, its edge-row samples) are needed by no later submission."""
        return (k < start and k not in lane.prepared) or (
            k in lane.prepared and k in lane.shipped_ok and (k - 1 < start or k - 1 in planned))

    for chain in [planner] if planner is not None else lanes:
        shares = lanes if chain is planner else [chain]
        f = chain.f
        for k in [k for k in f["plan"] if plan_done(chain, shares, k)]:
            del f["plan"][k]
        for k in [k for k in f["trace"] if k in f["plan"] or k < start]:   # its plan holds it now
            del f["trace"][k]
    for lane in lanes:
        f = lane.f
        planned = (planner if planner is not None else lane).planned
        for k in [k for k in f["select"] if sample_done(lane, planned, k)]:
            del f["select"][k]
        for k in [k for k in f["ship"] if k in f["train"] or k < lane.next_train]:
            del f["ship"][k]
        if lane.edges is not None:      # the edge rows' samples and plans: as the lane's own select and plan
            e = lane.edges.f
            for k in [k for k in e["plan"] if plan_done(lane, [lane], k)]:
                del e["plan"][k]
            for k in [k for k in e["sample"] if sample_done(lane, planned, k)]:
                del e["sample"][k]
    for k in [k for k in samples if all(
            (k < start and k not in lane.prepared) or (k in lane.prepared and k in lane.shipped_ok)
            for lane in [*lanes, *([planner] if planner is not None else [])])]:
        del samples[k]
