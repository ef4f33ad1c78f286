"""The one preparation graph: sample, count, tiers, trace and plan, for both of its sinks.

`diskflow prepare` (sink: a packed dataset on disk, `flow.prepare`) and the streamed run (sink:
bundles shipped to the GPU worker, `flow.stream`) run the same task functions, built into a
Dask graph by the same builder, `PrepGraph`, under the same task keys:

    sample-{key}-{tok}           sample superbatch `key` (native sampler): its Arrow IPC samples
    count-{key}-{tok}            its access counts (sparse, native)
    count-merge-{l}-{i}-{tok}    a pairwise tree of merges: the counts the tiers are chosen from
    tiers-gpu-{tok}              the tiers' sizes and the GPU tier (`policies.choose_gpu_tier`)
    tiers-trace-{tok}            what a trace needs of it: the GPU tier's ids and N (small, so a distributed
                                 scheduler runs traces on any free worker, not beside the counts)
    tiers-{tok}                  the CPU tier's first content beside it (`policies.choose_cpu_tier`)
    trace-{key}-{tok}            superbatch key's window traced (its next uses), beside the chain (a
                                 sink may leave it to the plan task: the stream, when the lookahead's
                                 samples are not submitted yet)
    plan-{key}-{tok}             chained: plan k starts from plan k-1's CPU cache

What differs between the sinks is only what is handed over: prepare's samples and tiers are also
written to its cache (``out_path``) and it counts the whole round before choosing tiers; a stream
counts its first superbatches (``--tier-superbatches``) and keeps everything in memory. Each sink
schedules the nodes its own way through the `Submit` callable it gives the builder: prepare wraps
them in `dask.delayed` and computes a phase at a time; the stream submits futures to its cluster
within a window.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..operators.formats.atomic import atomic_path
from ..operators.formats.samples import read_n_ids
from ..operators.formats.store import Store, open_table
from ..operators.prepare.count import Counts, add_counts, dense_counts, load_counts, superbatch_counts
from ..operators.prepare.history import HistoryStep, history_nodes, history_nodes_by_count, plan_round
from ..operators.prepare.partition import edge_cut, partition_graph, undirected_adjacency
from ..operators.prepare.plan import WindowTrace, plan_superbatch, trace_window
from ..operators.prepare.policies import Policy, choose_cpu_tier, choose_gpu_tier, planned
from ..operators.prepare.samplers import topology_view
from ..operators.prepare.seeds import BatchOrder
from ..operators.prepare.superbatch import (
    SuperbatchRef,
    sample_superbatch,
    sample_superbatch_bytes,
    superbatch_hop1,
)
from ..operators.prepare.task import NODE, Task
from ..operators.prepare.tiers import STAGING_PIECE_BYTES, Sampling, tier_sizes
from ..operators.prepare.typedsample import as_fanouts
from .taskprofile import profiled

__all__ = ["MAX_ROWS_MARGIN", "GpuTier", "PlanResult", "PrepGraph", "SampleResult", "Submit", "TierSpec",
           "Tiers", "TraceTier", "count_task", "cpu_tier_task", "delayed_submit", "gpu_tier_task",
           "history_spec", "history_task", "hop1_task", "partition_task", "plan_task", "sample_task", "stamp",
           "tier_figures", "trace_task", "trace_tier_task"]

MAX_ROWS_MARGIN = 1.10      # staging reserve from a partial count: the largest batch seen, plus 10%

# submit(function, *args, key=task key, k=superbatch index or -1 for the round's own tasks) -> a node
Submit = Callable[..., Any]


# ---------------------------------------------------------------------------- what tasks pass on

def stamp(t0: float) -> dict[str, Any]:
    """When a task ran (wall clock, so machines compare) and on which Dask worker ("local" outside one)."""
    addr = "local"
    if "distributed" in sys.modules:
        from distributed import get_worker

        try:
            addr = str(get_worker().address)
        except ValueError:
            pass
    return {"t0": t0, "t1": time.time(), "worker": addr}


@dataclass
class SampleResult:
    """A sampled superbatch: its samples (Arrow IPC bytes inline, or the file they were written to), its
    summary, and when/where it was made."""

    key: str
    data: np.ndarray | None          # uint8: the samples file's bytes (None: read `path`)
    summary: dict[str, Any]
    timing: dict[str, Any]
    path: str | None = None

    def n_ids(self) -> list[np.ndarray]:
        """Every batch's node ids (zero-copy views of the bytes, or of the file's memory map)."""
        if self.data is None:
            return read_n_ids(self.path)  # type: ignore[arg-type]
        return read_n_ids(f"samples of {self.key}", self.data)

    def __sizeof__(self) -> int:      # what Dask's memory accounting (`dask.sizeof`) counts: the bytes held
        return object.__sizeof__(self) + (0 if self.data is None else self.data.nbytes)


@dataclass
class Tiers:
    """The round's tiers (decided once) and the access counts the planner breaks ties with."""

    gpu_ids: np.ndarray               # sorted node ids of the GPU tier
    cpu_ids: np.ndarray               # the CPU tier where planning starts, per slot (-1: empty)
    frequency: np.ndarray             # int32 or int64 [N]: the counts the tiers were chosen from
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def num_nodes(self) -> int:
        return int(self.frequency.shape[0])

    def __sizeof__(self) -> int:      # `dask.sizeof`: the tiers' arrays
        return object.__sizeof__(self) + self.gpu_ids.nbytes + self.cpu_ids.nbytes + self.frequency.nbytes


@dataclass
class PlanResult:
    """A superbatch's plan, the CPU cache it leaves for the next one, and its figures."""

    key: str
    batches: list[Any]               # one `formats.plan.BatchPlan` per batch
    final_cache: np.ndarray
    stats: dict[str, Any]
    timing: dict[str, Any] = field(default_factory=dict)

    def __sizeof__(self) -> int:      # `dask.sizeof`: the final cache and the batches' plans
        return object.__sizeof__(self) + self.final_cache.nbytes + sum(sys.getsizeof(b) for b in self.batches)


@dataclass(frozen=True)
class TierSpec:
    """What the tiers task needs besides the counts: the budgets and policies (PrepareConfig's and
    StreamConfig's fields of the same names) and the device the tiers are sized for."""

    gpu_memory: int
    cpu_memory: int
    device: str                       # "cpu" or "cuda"
    staging_batches: int
    io_reserve: int
    gpu_policy: Policy
    cpu_policy: Policy
    pool: int = 1                     # GPU workers pooling their CPU budgets into one shared tier (--cache shared)
    batch_size: int = 0               # what the batches are sampled with, for a refusal to name a smaller
    fanouts: tuple[int, ...] = ()     # one that fits (0, (): none named)
    raise_cpu: bool = False           # cpu_memory is a default: raised to the smallest that works, not refused
    row_bytes: int = 0                # bytes of a row as the tiers hold it (0: the store's; encoded rows: fewer)
    staging_piece: int = STAGING_PIECE_BYTES    # the most row bytes one staging buffer carries


# ---------------------------------------------------------------------------- the task functions

def partition_task(store_path: str, parts: int, method: str, seed: int, threads: int, out_path: str) -> dict[str, Any]:
    """Partition the store's graph into `parts` min-cut parts (`operators.prepare.partition`) and write
    every node's part (int32 .npy) to `out_path`; its figures: seconds, peak memory above the task's
    start (this process's anonymous memory, sampled), edge cut, part sizes."""
    from ..operators.formats.npyio import save_npy
    from .taskprofile import AnonPeak

    t0 = time.perf_counter()
    store = Store(store_path)
    with AnonPeak() as peak:
        xadj, adjncy = undirected_adjacency(*topology_view(store))
        membership = partition_graph(xadj, adjncy, parts, method=method, seed=seed, threads=threads,
                                     scratch=str(Path(out_path).parent))
        cut = edge_cut(xadj, adjncy, membership)
        edges = int(adjncy.shape[0]) // 2
        del xadj, adjncy
    save_npy(out_path, membership)
    sizes = np.bincount(membership, minlength=parts)
    return {"path": out_path, "parts": int(parts), "method": method, "seed": int(seed), "threads": int(threads),
            "seconds": time.perf_counter() - t0, "peak_bytes": int(peak.peak), "edges": edges, "edge_cut": cut,
            "cut_share": cut / edges if edges else 0.0, "min_part": int(sizes.min()), "max_part": int(sizes.max())}


def hop1_task(store_path: str, ref: SuperbatchRef, batch_size: int, fanouts: Sequence[int], seed: int,
              threads: int | None, order: BatchOrder | None = None, task: Task = NODE) -> list[np.ndarray]:
    """The one-hop nodes of every batch of superbatch `ref` (what the history plan reads)."""
    return superbatch_hop1(store_path, ref, batch_size, as_fanouts(fanouts), seed, threads, order, task)


def history_spec(cfg: Any) -> tuple[int, int, str, str, float, float] | None:
    """`PrepGraph`'s ``history`` from a config with the ``history_*`` fields (`PrepareConfig`, `StreamConfig`):
    (rows, staleness, select, prune, ramp, cooldown), or None without a cache."""
    if not cfg.history_rows:
        return None
    return (cfg.history_rows, cfg.history_staleness, cfg.history_select, cfg.history_prune, cfg.history_ramp,
            cfg.history_cooldown)


def history_task(store_path: str, keys: Sequence[str], rows: int, staleness: int, select: str, prune: str,
                 ramp: float, cooldown: float, *hop1: list[np.ndarray]) -> dict[str, list[HistoryStep]]:
    """The historical embedding cache's plan of the whole round (`operators.prepare.history`), by
    superbatch key, its nodes chosen by `select` (``"accesses"``: one-hop counts of the round;
    ``"degree"``), pruning by the rule `prune`, its bound adapted by `ramp` and the round's last `cooldown`
    share of batches exact: serial, but a few vector operations per batch."""
    store = Store(store_path)
    nodes = history_nodes_by_count(list(hop1), store.num_nodes, rows) if select == "accesses" else \
        history_nodes(np.asarray(store.indptr), rows)
    return dict(zip(keys, plan_round(list(hop1), nodes, staleness, prune, ramp, cooldown)))


def sample_task(store_path: str, ref: SuperbatchRef, batch_size: int, fanouts: Sequence[int], seed: int,
                threads: int | None, out_path: str | None = None, order: BatchOrder | None = None,
                history: dict[str, list[HistoryStep]] | None = None, task: Task = NODE) -> SampleResult:
    """Sample superbatch `ref` (its batches cut by `order`, None: shuffled; pruned where `history`, the
    round's history plan, says); with `out_path`, write its samples file there (never creating the
    directory: a task outliving its failed run must not resurrect it) and hand on the path."""
    t0 = time.time()
    steps = None if history is None else history[ref.key]
    if out_path is None:
        data, summary = sample_superbatch_bytes(store_path, ref, batch_size, as_fanouts(fanouts), seed, threads, order, steps,
                                                task)
        return SampleResult(ref.key, np.frombuffer(data, np.uint8), summary, stamp(t0))
    summary = sample_superbatch(store_path, out_path, ref, batch_size, as_fanouts(fanouts), seed, threads, order, steps,
                                parents=False, task=task)
    return SampleResult(ref.key, None, summary, stamp(t0), path=out_path)


def count_task(sample: SampleResult, num_nodes: int) -> Counts:
    """One superbatch's access counts (`count.superbatch_counts`: dense or sparse)."""
    return superbatch_counts(sample.n_ids(), num_nodes)


@dataclass
class GpuTier:
    """The GPU tier, the counts it was chosen from and the tiers' sizes: the first half of the tiers, all a
    window's trace needs, so the first trace runs while the CPU tier's first content is chosen."""

    gpu_ids: np.ndarray
    frequency: np.ndarray
    cpu_rows: int
    figures: dict[str, Any] = field(default_factory=dict)

    def __sizeof__(self) -> int:      # `dask.sizeof`
        return object.__sizeof__(self) + self.gpu_ids.nbytes + self.frequency.nbytes


def gpu_tier_task(counts: Counts | str, first: Sequence[SampleResult], store_path: str, spec: TierSpec,
                  max_rows: int | None, whole_round: bool) -> GpuTier:
    """The tiers' sizes and the GPU tier (hottest rows or the user's policy); `cpu_tier_task` completes the tiers.

    Args:
        counts: the merged counts the tiers are chosen from (`count.Counts`: dense, or (ids, counts)), or an
            ``.npz`` holding them (`count.save_counts`: a prepare cache's, read where the task runs).
        first: the first superbatches' samples (their largest batch sizes the staging when `max_rows` is None).
        max_rows: the largest batch of the round (staging is sized by it); None: the largest in
            `first`, plus `MAX_ROWS_MARGIN`.
        whole_round: `counts` cover the whole round, so no tier holds more rows than it reads.
    """
    store = open_table(store_path)
    if isinstance(counts, str):
        counts = load_counts(counts)
    freq = dense_counts(counts, store.num_nodes)
    margin = 1.0
    if max_rows is None:
        seen = max(int(s.summary["max_nodes"]) for s in first)
        margin = MAX_ROWS_MARGIN
        max_rows = min(store.num_nodes, math.ceil(seen * margin))
    read = int(np.count_nonzero(freq)) if whole_round else store.num_nodes
    sampling = Sampling(spec.batch_size, tuple(spec.fanouts), store.num_nodes, margin) if spec.batch_size else None
    sizes = tier_sizes(spec.gpu_memory, spec.cpu_memory, spec.row_bytes or store.row_bytes, read, spec.device, max_rows,
                       spec.staging_batches, len(store.shards), spec.io_reserve, sampling=sampling,
                       raise_cpu=spec.raise_cpu, piece=spec.staging_piece)
    if spec.pool > 1:       # one shared tier of every worker's share (each keeps its own staging and buffers)
        sizes = dataclasses.replace(sizes, cpu_rows=min(read - sizes.gpu_rows, sizes.cpu_rows * spec.pool))
    figures = {"gpu_rows": sizes.gpu_rows, "cpu_rows": sizes.cpu_rows, "staging_bytes": sizes.staging_bytes,
               "max_batch_rows_reserved": max_rows, "cpu_memory": sizes.cpu_budget}
    return GpuTier(choose_gpu_tier(spec.gpu_policy, freq, sizes.gpu_rows), freq, sizes.cpu_rows, figures)


@dataclass
class TraceTier:
    """What a window's trace needs of the tiers: the GPU tier's ids and the number of nodes. A task's result
    of its own, small: a distributed scheduler places a task beside its largest inputs, and a trace that took
    the GPU tier (or the tiers) took their frequency array too, so every trace queued on the worker holding
    it, between the links of the plan chain, while the other workers waited."""

    gpu_ids: np.ndarray
    num_nodes: int

    def __sizeof__(self) -> int:      # `dask.sizeof`
        return object.__sizeof__(self) + self.gpu_ids.nbytes


def trace_tier_task(gpu: GpuTier) -> TraceTier:
    """The GPU tier's ids and N, for the traces (`TraceTier`)."""
    return TraceTier(gpu.gpu_ids, int(gpu.frequency.shape[0]))


def cpu_tier_task(gpu: GpuTier, first: Sequence[SampleResult], spec: TierSpec, start_cpu_ids: np.ndarray | None = None,
                  out_path: str | None = None) -> Tiers:
    """The CPU tier's first content beside the GPU tier: the tiers.

    Args:
        gpu: `gpu_tier_task`'s result.
        first: the first superbatches' samples (a planned CPU tier is filled from them).
        start_cpu_ids: a resumed stream's CPU tier (checked, no policy run).
        out_path: also write ``gpu_ids``/``cpu_ids`` there (``.npz``, prepare's cache).
    """
    cpu_ids = choose_cpu_tier(spec.cpu_policy, gpu.frequency, gpu.cpu_rows, gpu.gpu_ids,
                              lambda: [b for s in first[:2] for b in s.n_ids()], cpu_slots=start_cpu_ids)
    if out_path is not None:
        with atomic_path(out_path, parents=False) as tmp, open(tmp, "wb") as f:
            np.savez(f, gpu_ids=gpu.gpu_ids, cpu_ids=cpu_ids)
    return Tiers(gpu.gpu_ids, cpu_ids, gpu.frequency, dict(gpu.figures))


def trace_task(sample: SampleResult, lookahead: SampleResult | None, tiers: Tiers | TraceTier,
               after: Any = None) -> WindowTrace:
    """Trace superbatch k's window (k and its lookahead k + 1): independent of the chain (it needs the GPU
    tier alone). `after`: an ordering edge only (the previous window's trace)."""
    return trace_window(sample.n_ids(), [] if lookahead is None else lookahead.n_ids(), tiers.gpu_ids,
                        tiers.num_nodes)


def tier_figures(tiers: Tiers) -> dict[str, Any]:
    """The tiers' figures alone (what a driver gathers, not the tiers' arrays)."""
    return dict(tiers.figures)


def plan_task(prev: PlanResult | None, sample: SampleResult, lookahead: SampleResult | None, tiers: Tiers,
              policy: Policy, trace: WindowTrace | None = None, after: Any = None) -> PlanResult:
    """Plan one superbatch from the previous plan's final cache (the tiers' CPU ids for the first).

    `after` is only an ordering edge: the next window's trace, so that it is done before this link of
    the chain and the next link never waits for it behind tasks off the chain.

    The chain only plans: writing, routing and packing the plan are tasks of their own, off the chain.
    """
    t0 = time.time()
    belady = planned(policy)
    ahead = lookahead.n_ids() if belady and trace is None and lookahead is not None else []
    plan = plan_superbatch(sample.n_ids(), ahead, tiers.gpu_ids, tiers.cpu_ids, tiers.frequency,
                           None if prev is None else prev.final_cache, belady, trace)
    stats = {"hits": plan.hits, "misses": plan.misses, "gpu_hits": plan.gpu_hits, "inserts": plan.inserts}
    return PlanResult(sample.key, plan.batches, plan.final_cache, stats, {"sample": sample.timing, "plan": stamp(t0)})


# ---------------------------------------------------------------------------- the builder

class PrepGraph:
    """Builds the nodes of the preparation graph for one round (see the module docstring).

    Args:
        store_path: the store (a path every worker can read), or one of its row tables whose reads are planned
            (`formats.store.table_locator`: the edge rows of a streamed run).
        refs: the round's superbatches (`superbatch.round_layout`).
        sampling: (batch_size, fanouts, seed, sampler_threads).
        cpu_policy: the CPU tier's policy (a planned one chains plans through their caches; `trace`
            gives each window a task of its own).
        tok: the run's token, ending every task key (a re-run on the same client never meets a
            cancelled task of an earlier run under the same name).
        submit: how the sink schedules a node (`Submit`).
        order: how each epoch's seeds become batches (None: shuffled; `partition_task` gives the parts).
        history: (rows, staleness, select, prune, ramp, cooldown) of a historical embedding cache to plan the
            samples' pruning for (select: how its nodes are chosen, `history_task`; prune: the pruning rule;
            ramp, cooldown: the adaptive bound and the exact end, `HistoryPlanner`).
        task: what the batches are drawn for (a link task: seed edges and their negatives).
    """

    def __init__(self, store_path: str, refs: Sequence[SuperbatchRef], sampling: tuple[int, Sequence[int], int, int],
                 cpu_policy: Policy, tok: str, submit: Submit, order: BatchOrder | None = None,
                 history: tuple[int, int, str, str, float, float] | None = None, task: Task = NODE) -> None:
        self.store_path, self.refs, self.tok, self.submit = store_path, list(refs), tok, submit
        self.task = task
        self.batch_size, self.fanouts, self.seed, self.threads = sampling
        self.order = order
        self.history = history          # (rows, staleness, select, prune, ramp, cooldown) of a history cache, or None
        self._history_plan: Any = None
        self.cpu_policy = cpu_policy
        self.num_nodes = open_table(store_path).num_nodes
        self._tiers: tuple[Any, Any] | None = None       # the last tiers node built here and its GPU-tier node

    def sample(self, k: int, out_path: str | None = None) -> Any:
        r = self.refs[k]
        return self.submit(sample_task, self.store_path, r, self.batch_size, as_fanouts(self.fanouts), self.seed,
                           self.threads, out_path, self.order, self.history_plan(), self.task,
                           key=f"sample-{r.key}-{self.tok}", k=k)

    def history_plan(self) -> Any:
        """The node of the round's history plan (one-hop tasks per superbatch, then one planning task), built
        once; None without a history cache."""
        if self.history is None:
            return None
        if self._history_plan is None:
            hop1 = [self.submit(hop1_task, self.store_path, r, self.batch_size, as_fanouts(self.fanouts), self.seed,
                                self.threads, self.order, self.task, key=f"hop1-{r.key}-{self.tok}", k=k)
                    for k, r in enumerate(self.refs)]
            self._history_plan = self.submit(history_task, self.store_path, [r.key for r in self.refs],
                                             *self.history, *hop1,
                                             key=f"history-plan-{self.tok}", k=0)
        return self._history_plan

    def counts(self, samples: Sequence[tuple[int, Any]]) -> Any:
        """Count each (k, sample node) and merge the counts by a pairwise tree; the node of the total."""
        parts = [self.submit(count_task, s, self.num_nodes, key=f"count-{self.refs[k].key}-{self.tok}", k=-1)
                 for k, s in samples]
        level = 0
        while len(parts) > 1:
            parts = [self.submit(add_counts, *parts[i:i + 2], key=f"count-merge-{level}-{i // 2}-{self.tok}", k=-1)
                     if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
            level += 1
        return parts[0]

    def tiers(self, total: Any, first: Sequence[Any], spec: TierSpec, *, max_rows: int | None, whole_round: bool,
              start_cpu_ids: np.ndarray | None = None, out_path: str | None = None) -> Any:
        gpu = self.submit(gpu_tier_task, total, list(first), self.store_path, spec, max_rows, whole_round,
                          key=f"tiers-gpu-{self.tok}", k=-1)
        tiers = self.submit(cpu_tier_task, gpu, list(first), spec, start_cpu_ids, out_path, key=f"tiers-{self.tok}", k=-1)
        self._tiers = (tiers, self.submit(trace_tier_task, gpu, key=f"tiers-trace-{self.tok}", k=-1))
        return tiers

    def trace(self, k: int, sample: Any, lookahead: Any, tiers: Any, after: Any = None) -> Any:
        """Trace k's window (k and its lookahead), for a planned policy (None otherwise): a task of its
        own that needs no earlier plan, so the sink submits it ahead of the chain and it runs on
        another worker while the chain advances. `after`: a node to finish first (the previous
        window's trace, for traces submitted as a chain)."""
        if not planned(self.cpu_policy):
            return None
        # The first window's trace needs only the GPU tier: it runs beside the CPU tier's fill, the two
        # tasks the first plan waits for. Later windows wait for the whole tiers, never delaying the fill,
        # unless they form a chain (`after`): then one trace at a time is ready, and they all need only
        # the GPU tier, so the traces the first plans wait for are done during the fill.
        own = self._tiers is not None and self._tiers[0] is tiers
        gpu = self._tiers[1] if self._tiers is not None and own and (k == 0 or after is not None) else tiers
        return self.submit(trace_task, sample, lookahead, gpu, after, key=f"trace-{self.refs[k].key}-{self.tok}", k=k)

    def plan(self, k: int, prev: Any, sample: Any, lookahead: Any, tiers: Any, trace: Any = None,
             after: Any = None) -> Any:
        """Plan k, chained on `prev` (plan k-1's node, None for the first), over k's window trace (`trace`'s
        node; None: the plan task traces the window itself); `after`: a node to finish first (the next
        window's trace)."""
        return self.submit(plan_task, prev, sample, lookahead, tiers, self.cpu_policy, trace, after,
                           key=f"plan-{self.refs[k].key}-{self.tok}", k=k)


def delayed_submit(fn: Callable[..., Any], *args: Any, key: str, k: int = -1, **kwargs: Any) -> Any:
    """`Submit` for a graph computed as a whole (`dask.delayed`, any scheduler); profiled while a
    `flow.taskprofile.profile_tasks` block runs; the bytes it reads and writes reported to Dask
    (`flow.dashboard.publish.Metered`)."""
    import dask

    from .dashboard.publish import Metered

    return dask.delayed(Metered(profiled(fn, key)), pure=False)(*args, dask_key_name=key, **kwargs)

