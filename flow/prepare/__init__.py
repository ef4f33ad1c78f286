"""Offline preprocessing as Dask task graphs: store -> packed dataset (docs/design.md,
"The preparation graph").

Phases, each a Dask graph with named task groups (so the dashboard tells the story):

    partition          partition batches: the graph cut into min-cut parts, once per round
    hop1-e{e}-s{k}     a historical embedding cache: every batch's one-hop nodes, drawn first
    history-plan       which cached embedding serves which batch, planned over the whole round
    sample-e{e}-s{k}   one per superbatch: sample its minibatches with the native sampler
    count-…            access counts per superbatch, tree-reduced (count-merge-…) to round totals
    tiers-gpu, tiers-trace, tiers   the GPU tier (hottest rows), the CPU tier at round start
    tiers-figures      the tiers' figures for the report
    trace-e{e}-s{k}    next uses in superbatch k's window (k and its lookahead k+1), independent
    trace-done-e{e}-s{k}  a completion token per trace, chaining the traces in window order
    plan-e{e}-s{k}     chained: plan k starts from plan k-1's cache state, looks ahead into k+1
    plan-save-…        writes plan k's file (the plan stage's cache), off the chain
    search             the segmented disk-cache layout when packing alone exceeds the disk budget
    route-e{e}-s{k}    final address translation + which rows each shard task packs (right
                       after plan k when there is no disk budget, else after the layout search)
    pack-early-e{e}-s{k}  the read-ahead shards' part files begun as superbatch k is routed (a chain
                       beside the plan chain, with the routes), so their writes overlap planning
    pack-r0-p{p}       one per feature shard: read the shard once, write every batch's segment
    index-e{e}-s{k}    the per-superbatch index with segment offsets and checksums
    edge-samples-e{e}-s{k}  a store with edge features: each superbatch's sampled edge ids as rows of
                       the edge table, whose count, tiers, plan and pack tasks follow (`edges`)

Intermediate results are cached next to the output (``OUT.work/``) under the hash of
the config they depend on, so re-running does no work and changing a budget redoes only
what depends on it (a new disk budget re-lays and re-packs, but does not re-sample or
re-plan). The packed dataset is built in a staging directory and swapped into place with
its manifest written last.

The modules: `config` (PrepareConfig, PrepareResult), `cache` (the stage cache ``OUT.work`` and its keys),
`phases` (the graphs of the phases), `tasks` (the phases' own tasks); this one runs the phases in order.
"""
from __future__ import annotations

import contextlib
import os
import resource
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from ...errors import DiskFullError
from ...operators.formats.atomic import raise_if_disk_full
from ...operators.formats.hashing import config_hash
from ...operators.formats.outputs import check_replaceable, replace_foreign
from ...operators.formats.packed import PACKED_KIND
from ...operators.formats.store import Store
from ...operators.formats.storecheck import store_checks
from ...operators.formats.threadbuffers import drop_thread_buffers
from ...operators.prepare.plan import release_planner_scratch
from ...operators.prepare.sampler_pool import drop_idle_samplers
from ...operators.prepare.samplers import check_store_fanouts, refuse_typed, train_target
from ...operators.prepare.seeds import label_shares, parts_fingerprint
from ...operators.prepare.superbatch import round_layout
from ...operators.prepare.task import num_seeds
from ..allocator import reuse_for_preparation
from ..dashboard.spans import command as span_command
from ..progress import active_client
from .cache import (
    WORK_KIND,
    WORK_MARKER,
    check_outputs,
    clean_work,
    link_partitions,
    mark_work,
    pack_key,
    partition_key,
    plan_key,
    sample_key,
)
from .config import PrepareConfig, PrepareResult

__all__ = ["WORK_MARKER", "PrepareConfig", "PrepareResult", "check_outputs", "link_partitions", "prepare"]


def prepare(store_path: str | os.PathLike[str], out: str | os.PathLike[str], cfg: PrepareConfig, *,
            force: bool = False, quiet: bool = False) -> PrepareResult:
    """Turn a store into a packed dataset for `cfg`, running each phase as a Dask graph.

    Runs on whatever scheduler is active (the CLI opens a LocalCluster or connects to
    `--scheduler`; tests use the synchronous scheduler). Re-running with the same inputs
    and config does no work.

    `force` redoes the work even when `out` is up to date, and lets `out` and its cache
    ``out.work`` replace directories that are not a packed dataset / a prepare cache (which
    are refused otherwise). A full disk, whether the free-space check sees it coming (once
    the packed bytes are known, before packing) or a write meets ENOSPC, raises one
    `DiskFullError`; nothing that looks finished is left behind (no manifest is written, the
    staging directory and unfinished cache stages are removed).
    """
    t_start = time.perf_counter()
    cfg.validate()
    store = Store(store_path, check_crc=cfg.check_crc)
    if store.hetero is not None:
        refuse_typed(cfg.history_memory or cfg.history_split, cfg.task != "node")
        train_target(store.hetero, store.path)
    check_store_fanouts(store, cfg.fanouts)
    # the store's files but its row shards and link arrays (topology, labels, splits): the packed dataset is
    # made of them, so they are checked whole before the work starts; the node and edge feature shards are
    # checked as the pack passes read them, the link arrays as a link task reads its seeds
    for rel in store.checks.files:
        if not rel.startswith(("features/", "edge_features/", "link/")):
            store.checks.check_file(rel, "prepare")
    out = Path(out)
    store_hash = config_hash(store.manifest)
    part_key = partition_key(cfg, store_hash, cfg.num_partitions(store)) if cfg.batches == "partition" else None
    s_key = sample_key(cfg, store_hash, part_key)
    p_key = plan_key(cfg, s_key)
    k_key = pack_key(cfg, p_key)
    existing = check_replaceable(out, force, PACKED_KIND)
    if existing and not force and existing.get("config_hash") == k_key:
        return PrepareResult(out, True, time.perf_counter() - t_start, dict(existing.get("figures", {})))
    work = Path(str(out) + ".work")
    replace_foreign(work, force, WORK_KIND)
    created = not work.exists()
    try:
        work.mkdir(parents=True, exist_ok=True)
        mark_work(work, out.name)
        with reuse_for_preparation(), span_command("prepare"), store_checks(cfg.check_crc):  # tasks may run here
            try:
                return _build(store, out, work, cfg, (store_hash, s_key, p_key, k_key), quiet, t_start)
            finally:
                _let_kept_state_go()
    except BaseException as e:
        clean_work(work, created)
        if not (isinstance(e, DiskFullError) and e.path == os.fspath(out)):
            raise_if_disk_full(e, work)     # what failed was writing the cache (samples, plans, routes)
        raise


def _let_kept_state_go() -> None:
    """Let go of what the prepare's tasks kept for the next task of their thread or process: the sampler
    pools (`sampler_pool`), the threads' buffers (`thread_buffer`) and the Belady planner's scratch
    (`release_planner_scratch`), hundreds of MB each on a graph of millions of nodes; this process's and,
    where it ran on a Dask cluster, every worker's (what a running task holds stays its own). A cluster
    that is going away has nothing left to free."""
    _drop_kept_state()
    client = active_client()
    if client is not None:
        with contextlib.suppress(OSError, TimeoutError):
            client.run(_drop_kept_state, on_error="ignore")


def _drop_kept_state() -> None:
    """Empty this process's sampler pool, its threads' kept buffers and the planner's scratch."""
    drop_idle_samplers()
    drop_thread_buffers()
    release_planner_scratch()



def _build(store: Store, out: Path, work: Path, cfg: PrepareConfig, keys: tuple[str, str, str, str], quiet: bool,
           t_start: float) -> PrepareResult:
    """The phases of `prepare` (sample, plan, pack) once `out` and its cache `work` may be written."""
    # the phases' graphs (and Dask) are imported when they run: PrepareConfig's defaults stay light
    from .edges import edge_round, pack_edges
    from .phases import Run, pack_phase, partition_phase, plan_phase, read_ahead, sample_phase, split_phase

    store_hash, s_key, p_key, k_key = keys
    # A per-run token ends every task key: a re-run on the same client never meets a cancelled
    # task of an earlier run under the same name (dashboard groups are unchanged: key_split
    # stops at the numeric token).
    cfg.round_task.check(store)
    run = Run(store, out, work, cfg, round_layout(num_seeds(store, cfg.round_task), cfg.batch_size,
                                                   cfg.superbatch_size, cfg.epochs),
               f"{uuid.uuid4().int % 10**8:08d}", quiet)
    phases: dict[str, float] = {}
    cpu: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        t, c = time.perf_counter(), _process_cpu()
        yield
        phases[name], cpu[name] = time.perf_counter() - t, _process_cpu() - c

    if cfg.batches == "partition":
        with phase("partition"):
            run.order = partition_phase(run, store_hash)
        # the samples follow the parts the partition stage holds, by content (a partition on several
        # threads, redone, may differ), not the config that made them
        run.parts_key = parts_fingerprint(run.order.parts)
        # the losses' label prior, checked before the expensive phases
        run.label_prior = list(label_shares(store.labels[store.split_ids("train")], store.num_classes))
    if cfg.history_split:
        with phase("split"):
            split_phase(run, store_hash)
    if run.parts_key is not None or cfg.history_split:
        s_key = sample_key(run.cfg, store_hash, run.parts_key)
        p_key = plan_key(run.cfg, s_key)
    with phase("sample"):
        sdir, summaries, counts = sample_phase(run, s_key)
    edges = None
    if store.edge_features is not None:
        with phase("edge_samples"):     # the edge rows' own round, and their part of the budgets
            edges = edge_round(run, s_key, sdir, summaries)
    # While tiers and plans keep the CPUs busy the disk is idle: read the first shards ahead
    # (page cache of this machine, up to cfg.readahead) so part of the packing pass overlaps.
    with read_ahead(store, cfg):
        with phase("plan"):
            pdir, planned_round, early_routes = plan_phase(run, p_key, sdir, summaries, counts=counts)
        del counts
        edge_figures = None
        if edges is not None:
            with phase("edges"):
                edge_figures = pack_edges(run, edges, (p_key, k_key))
        with phase("pack"):
            figures = pack_phase(run, (store_hash, k_key), sdir, summaries, pdir, planned_round, early_routes)
        if edges is not None and edge_figures is not None:
            figures["edges"] = {**edge_figures, "read_share": edges.share}
    chain_s = float(sum(float(p.get("chain_s", 0.0)) for p in planned_round["plans"]))
    return PrepareResult(out, False, time.perf_counter() - t_start, figures, phases, cpu, chain_s)


def _process_cpu() -> float:
    """User + system CPU seconds of this process so far (every thread: the threaded scheduler's tasks too)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime
