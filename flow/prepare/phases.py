"""The phases of `flow.prepare.prepare`, each one Dask graph with named task groups (the module docstring of
`flow.prepare` lists them): partition (partition batches), the memory split's search (``history_split``),
sample, plan and pack. Each finished phase is a stage of the cache (`flow.prepare.cache`), so a re-run
skips it; the pack phase writes the packed dataset into a staging directory and swaps it into place with
its manifest last.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError, Setting
from ...native.constants import ALIGN
from ...operators.formats import packed as packed_fmt
from ...operators.formats.atomic import staging_dir
from ...operators.formats.manifest import write_manifest
from ...operators.formats.npyio import load_npz, save_npy
from ...operators.formats.outputs import check_free_space, free_space
from ...operators.formats.packed import (
    PACKED_FORMAT,
    PACKED_VERSION,
    ROUND_DIR,
    dcache_name,
    file_crc,
    index_name,
    part_name,
    samples_name,
)
from ...operators.formats.rowcodec import RowCodec, make_codec, rows_block
from ...operators.formats.sizes import format_bytes
from ...operators.formats.store import Store
from ...operators.prepare.count import Counts, save_counts
from ...operators.prepare.history import EMBEDDING_BYTES, staleness_rule
from ...operators.prepare.pack import (
    EarlyPart,
    pack_early,
    pack_shard,
    prepare_targets,
    warm_shard_ids,
    warm_shards,
    write_tier_rows,
)
from ...operators.prepare.policies import policy_id
from ...operators.prepare.route import segment_offsets
from ...operators.prepare.seeds import BatchOrder
from ...operators.prepare.superbatch import SuperbatchRef
from ...operators.prepare.typedsample import as_fanouts
from ..graph import (
    PrepGraph,
    SampleResult,
    TierSpec,
    delayed_submit,
    history_spec,
    partition_task,
    tier_figures,
)
from ..memsplit import SPLIT_PLOT, SPLIT_SHARES, best_split, plot_memory_split, refine_shares, split_point
from ..options import note_raised
from ..progress import compute
from .cache import (
    COUNTS,
    EARLY,
    PARTS,
    CachedStage,
    drop_stale_stages,
    partition_key,
    plan_key,
    remove_orphans,
    sample_key,
    stage_dir,
)
from .config import PrepareConfig
from .tasks import completed, index_task, route_task, save_plan_task, search_task, store_index_task

__all__ = ["HINT_RATIO", "PARTITION_FILE", "Run", "pack_phase", "partition_phase", "plan_phase", "read_ahead",
           "sample_phase", "split_phase"]

PARTITION_FILE = "partition.npy"        # the partition file (the cache's `PARTS`) in a packed dataset cut into partition batches
HINT_RATIO = 4.0        # packed bytes above this many times the feature bytes: the pack line names the disk budget

log = logging.getLogger(__name__)


@dataclass
class Run:
    """What the phases of one `prepare` share: the inputs, the cache, the round and the task-key token."""

    store: Store
    out: Path
    work: Path
    cfg: PrepareConfig
    refs: list[SuperbatchRef]
    tok: str
    quiet: bool
    order: BatchOrder | None = None     # set by the partition phase for partition batches
    partition: dict[str, Any] | None = None     # its figures (seconds, peak memory, edge cut)
    split: dict[str, Any] | None = None         # the memory split's curve and choice (history_split)
    keep_stale: bool = False                    # keep other configs' cached stages (while the split is searched)
    parts_key: str | None = None                # the partition's content fingerprint (partition batches)
    label_prior: list[float] | None = None      # the training labels' shares (partition batches weigh losses by them)
    early: dict[int, EarlyPart] = field(default_factory=dict)   # part files begun while planning, by shard
    budget: tuple[int, int, int | None] | None = None   # this table's (GPU, CPU, disk) bytes where the budgets
                                                        # are split between node and edge rows (`edges`)
    nested: dict[str, tuple[Path, dict[str, Any]]] = field(default_factory=dict)   # packed tables to move in, by name
    store_record: dict[str, Any] | None = None  # the manifest's ``store`` (default: this run's store and hash)

    @property
    def gpu_memory(self) -> int:
        """This table's GPU budget (the config's unless split)."""
        return self.cfg.gpu_memory if self.budget is None else self.budget[0]

    @property
    def cpu_memory(self) -> int:
        """This table's CPU budget: its tiers, staging and I/O buffers (the config's unless split)."""
        return self.cfg.cpu_memory if self.budget is None else self.budget[1]

    @cached_property
    def codec(self) -> RowCodec | None:
        """How this table's rows are held out of the model (`cfg.rows`): None for exact rows (and for the edge
        rows, which stay exact)."""
        if self.cfg.rows == "exact" or self.store.table_of is not None:
            return None
        return make_codec(self.cfg.rows, self.store.feature_dim, self.store.feature_dtype)

    @property
    def row_bytes(self) -> int:
        """Bytes of one row as the tiers, the packed segments and the loader hold it (encoded, or the store's)."""
        return self.store.row_bytes if self.codec is None else self.codec.row_bytes

    @property
    def row_layout(self) -> tuple[np.dtype, int]:
        """(dtype, width) of the rows the packed dataset holds: the store's, or encoded rows as raw bytes."""
        if self.codec is None:
            return self.store.feature_dtype, self.store.feature_dim
        return np.dtype(np.uint8), self.codec.row_bytes

    @property
    def disk_budget(self) -> int | None:
        """This table's disk budget (None: no limit; the config's unless split)."""
        return self.cfg.disk_budget if self.budget is None else self.budget[2]

    def show(self) -> bool | None:
        """`compute`'s `disable` for a phase's progress bar."""
        return self.quiet or None


def _check_room(out: Path, nbytes: int) -> None:
    """Fail before packing when the packed dataset's filesystem cannot hold its `nbytes`.

    Names `out` (the staging directory beside it is on the same filesystem).
    """
    check_free_space({out: nbytes})


def _announce_pack(run: Run, nbytes: int, early: int) -> None:
    """Log (INFO) the packed bytes (segments and disk cache) about to be written, before the pack tasks run:
    against the features, the free space of the packed dataset's filesystem and, where they are over
    `HINT_RATIO` times the features, the disk budget that would bound them (none given, a disk cache kept).
    `early`: the bytes of them the read-ahead shards' part files already took while planning."""
    cfg, features = run.cfg, max(1, run.store.feature_bytes)
    ratio = nbytes / features
    hint = cfg.disk_cache and cfg.disk_budget is None and ratio > HINT_RATIO
    edges = run.store.table_of is not None
    log.info("pack: %s %s (%s bytes) of packed %ssegments (%.1fx the %s of %sfeatures%s) to %s, %s free there"
             + ("; %s SIZE bounds it (the segmented disk cache)" if hint else ""),
             "writing" if early else "about to write", format_bytes(nbytes), f"{nbytes:,}", "edge-row " if edges else "",
             ratio, format_bytes(features), "edge " if edges else "",
             f"; {format_bytes(early)} of them written while planning" if early else "",
             "the packed dataset's edges/" if edges else run.out, format_bytes(free_space(run.out)),
             *((Setting("disk_budget"),) if hint else ()))


def _graph(run: Run) -> PrepGraph:
    """The preparation graph's builder for this run (`flow.graph`), its nodes as `dask.delayed`."""
    cfg = run.cfg
    return PrepGraph(str(run.store.path), run.refs, (cfg.batch_size, cfg.fanouts, cfg.seed, cfg.sampler_threads),
                     cfg.cpu_policy, run.tok, delayed_submit, run.order, history_spec(cfg), cfg.round_task)


def partition_phase(run: Run, store_hash: str) -> BatchOrder:
    """Partition the graph into min-cut parts (cached), one Dask task: the batch order over its parts file."""
    cfg = run.cfg
    parts = cfg.num_partitions(run.store)
    stage = CachedStage(run.work, "partition", partition_key(cfg, store_hash, parts))
    manifest = stage.cached()
    if manifest is None:
        pdir = stage.start()
        task = delayed_submit(partition_task, str(run.store.path), parts, cfg.partitioner, cfg.seed,
                              cfg.partition_threads, str(pdir / PARTS), key=f"partition-{run.tok}")
        (figures,) = compute([task], desc="partition", disable=run.show())
        manifest = stage.finish({"figures": {k: v for k, v in figures.items() if k != "path"}})
        run.partition = {**manifest["figures"], "cached": False}
    else:
        run.partition = {**manifest["figures"], "cached": True}
    run.partition["parts_per_group"] = cfg.parts_per_group
    run.partition["group_by"] = cfg.group_by
    return BatchOrder("partition", str(stage.path / PARTS), cfg.parts_per_group, cfg.group_by,
                      str(run.store.path / run.store.manifest["labels"]))


def split_phase(run: Run, store_hash: str) -> None:
    """Choose the memory split (`flow.memsplit`): the caches share what the CPU tier holds without an
    embedding cache (the CPU budget less staging and I/O buffers); for every candidate share of it
    given to embeddings, sample and plan the round, count the rows the plan reads from disk, and set
    ``run.cfg`` to the split that reads the fewest (``run.split``: the curve and the choice). The
    chosen candidate's samples and plans stay cached for the phases that follow."""
    from .edges import edge_round, edge_stage_dir  # (edges builds on this module's phases)

    cfg = run.cfg
    part_key = run.parts_key
    rb = run.row_bytes
    row_cost = cfg.history_dim * EMBEDDING_BYTES
    most = run.store.num_nodes * row_cost          # an embedding for every node: more is never used
    curve: list[dict[str, Any]] = []
    configs: dict[float, PrepareConfig] = {}
    stages: dict[float, tuple[str, str]] = {}
    best: dict[str, Any] | None = None
    shared = 0
    tok = run.tok
    # staleness 1 (or a cool-down of the whole round) never reuses an embedding, so no share but 0 can read less
    shares = SPLIT_SHARES[:1] if cfg.history_staleness == 1 or cfg.history_cooldown >= 1 else SPLIT_SHARES

    def evaluate(i: int, share: float) -> None:
        nonlocal shared, best
        hist = min(int(shared * share), most) // row_cost * row_cost
        if share and (hist == 0 or any(p["history_bytes"] == hist for p in curve)):
            return                      # no embedding fits, or the same cache as another share
        cand = replace(cfg, history_split=False, history_memory=hist, cpu_memory=cfg.cpu_memory - hist)
        run.cfg, run.tok = cand, f"{tok}s{i}"     # each candidate's tasks under keys of their own
        s_key = sample_key(cand, store_hash, part_key)
        p_key = plan_key(cand, s_key)
        sdir, summaries, counts = sample_phase(run, s_key)
        if run.store.edge_features is not None:     # the node rows plan within their part of the budgets
            edge_round(run, s_key, sdir, summaries)
        _, planned, _ = plan_phase(run, p_key, sdir, summaries, routes=False, counts=counts)
        cpu_bytes = int(planned["tiers"]["cpu_rows"]) * rb
        if not share:
            shared = cpu_bytes
        point = split_point(share, shared, hist, min(cand.history_rows, run.store.num_nodes),
                            sum(int(x["accesses"]) for x in summaries),
                            sum(int(x["misses"]) for x in planned["plans"]), rb,
                            sum(int(x.get("pruned", 0)) for x in summaries), cpu_bytes)
        curve.append(point)
        configs[share], stages[share] = cand, (s_key, p_key)
        # keep the cached stages of the best candidate so far only: each holds a whole round
        if best is None or best_split([best, point]) is point:
            beaten, best = (None if best is None else stages[best["share"]]), point
        else:
            beaten = stages[share]
        if beaten is not None:
            shutil.rmtree(stage_dir(run.work, "samples", beaten[0]), ignore_errors=True)
            shutil.rmtree(stage_dir(run.work, "plans", beaten[1]), ignore_errors=True)
            shutil.rmtree(edge_stage_dir(run, beaten[0]), ignore_errors=True)

    run.keep_stale = True
    try:
        for i, share in enumerate(shares):
            evaluate(i, share)
        if len(shares) > 1:             # then between the grid's best and its neighbours
            for j, share in enumerate(refine_shares(curve)):
                evaluate(len(shares) + j, share)
    finally:
        run.keep_stale, run.tok = False, tok
    chosen = best_split(curve)
    run.cfg = configs[chosen["share"]]
    s_key, p_key = stages[chosen["share"]]
    drop_stale_stages(run.work, "samples", stage_dir(run.work, "samples", s_key))
    drop_stale_stages(run.work, "plans", stage_dir(run.work, "plans", p_key))
    run.split = {"budget": shared, "staleness": cfg.history_staleness, "prune": cfg.history_prune,
                 **staleness_rule(cfg.history_ramp, cfg.history_cooldown), "dim": cfg.history_dim, "row_bytes": rb,
                 "curve": curve, "chosen": chosen}


def sample_phase(run: Run, s_key: str) -> tuple[Path, list[dict[str, Any]], Counts | None]:
    """Sample every superbatch and count its accesses (cached): the samples' directory, their summaries and,
    when sampled now, the round's counts (in memory for the tiers: None where the stage was cached)."""
    stage = CachedStage(run.work, "samples", s_key)
    manifest = stage.cached()
    total = None
    if manifest is None:
        sdir = stage.start()
        g = _graph(run)
        samples = [g.sample(k, str(sdir / r.filename)) for k, r in enumerate(run.refs)]
        # One graph: superbatch k is counted as soon as it is sampled, while later ones sample.
        *results, total = compute([*samples, g.counts(list(enumerate(samples)))], desc="sample", disable=run.show())
        save_counts(sdir / COUNTS, total, parents=False)
        manifest = stage.finish({"summaries": [r.summary for r in results]}, drop_stale=not run.keep_stale)
    return stage.path, manifest["summaries"], total


def plan_phase(run: Run, p_key: str, sdir: Path, summaries: list[dict[str, Any]], routes: bool = True,
                counts: Counts | None = None) -> tuple[Path, dict[str, Any], list[dict] | None]:
    """Choose the tiers and plan every superbatch (cached): the plans' directory, their manifest (tiers and
    per-superbatch figures) and, when every miss is packed (and `routes`), the routes computed alongside
    the plans. `counts`: the round's counts when the sample phase has them in memory (else its file is read)."""
    store, cfg, tok = run.store, run.cfg, run.tok
    stage = CachedStage(run.work, "plans", p_key)
    manifest = stage.cached()
    if manifest is not None:
        return stage.path, manifest, None
    # the plan files alone hold a source byte and an int64 slot per access
    check_free_space({run.work: sum(int(s["accesses"]) for s in summaries) * (1 + 8)})
    pdir = stage.start()
    # The sample stage's files, as the graph's sample results (the stage may come from an earlier run).
    samples = [SampleResult(r.key, None, s, {}, path=str(sdir / r.filename)) for r, s in zip(run.refs, summaries)]
    g = _graph(run)
    table = store.table_of is not None      # edge rows: no batch size or fanouts bound them
    spec = TierSpec(run.gpu_memory, run.cpu_memory, cfg.device, cfg.staging_batches,
                    cfg.io_reserve, cfg.gpu_policy, cfg.cpu_policy,
                    batch_size=0 if table else cfg.batch_size, fanouts=() if table else as_fanouts(cfg.fanouts),
                    raise_cpu=cfg.cpu_memory_default, row_bytes=run.row_bytes, staging_piece=cfg.staging_piece)
    tiers = g.tiers(str(sdir / COUNTS) if counts is None else counts, samples[:2], spec, max_rows=max(int(s["max_nodes"]) for s in summaries), whole_round=True,
                    out_path=str(pdir / "tiers.npz"))
    # The chain simulates the cache; each window is traced by its own task beforehand, so the
    # traces run on the other cores while the chain advances.
    # A chain of their own, in window order (each waits for the previous one's completion token): the
    # windows the first plans need are traced first, during the CPU tier's fill.
    traces: list[Any] = []
    trace_done: Any = None
    for k in range(len(run.refs)):
        traces.append(g.trace(k, samples[k], samples[k + 1] if k + 1 < len(samples) else None, tiers,
                              after=trace_done))
        trace_done = None if traces[-1] is None else \
            delayed_submit(completed, traces[-1], key=f"trace-done-{run.refs[k].key}-{tok}")
    plans: list[Any] = []
    for k in range(len(run.refs)):
        ahead = samples[k + 1] if k + 1 < len(samples) else None
        # Plan k also waits for trace k + 1, so plan k + 1 never waits for its trace behind the route and
        # save tasks; not plan 0, which would then wait for two traces (the others run beside it).
        plans.append(g.plan(k, plans[-1] if plans else None, samples[k], ahead, tiers, traces[k],
                            traces[k + 1] if 0 < k < len(traces) - 1 else None))
    # Packing every miss (no disk budget, so no disk-cache layout to wait for): route each
    # superbatch as soon as it is planned, while the chain plans the next one.
    # The read-ahead shards are in the page cache already: their part files are begun superbatch by
    # superbatch as the routes come (`pack_early`), so their writes overlap the chain instead of the
    # pack phase; the last superbatch is left to the pack phase, which the chain's end would only delay.
    # The work beside the chain is then a second chain: every trace, then for each superbatch its
    # route, its early writes and its plan file. Side work thus becomes ready a piece at a time, so
    # a worker freed by plan k takes plan k + 1 (its trace long done) instead of side work Dask's
    # ordering would queue ahead of it. The last route waits for its plan alone: once the chain
    # ends, it runs beside whatever of the second chain is left.
    (run.work / "route").mkdir(exist_ok=True)
    shutil.rmtree(run.work / EARLY, ignore_errors=True)
    packing_now = routes and cfg.packing and cfg.disk_budget is None
    # (encoded rows are packed from a shard encoded once, in the pack pass: no early segments of its map)
    warm = warm_shard_ids(store, cfg.readahead) if packing_now and len(run.refs) > 1 and run.codec is None else []
    route_tasks: list[Any] = []
    save_tasks: list[Any] = []
    early: Any = None
    side: Any = trace_done if packing_now else None      # the last trace, so every trace comes first
    last = len(run.refs) - 1
    for k, (r, s, plan) in enumerate(zip(run.refs, samples, plans)):
        route = None
        if packing_now:
            route = delayed_submit(route_task, r, s.path, str(pdir / f"{r.key}.npz"), None, store.shard_rows,
                                   len(store.shards), str(run.work / "route" / f"{r.key}.npz"), plan,
                                   after=side if k < last else None, key=f"route-{r.key}-{tok}")
            route_tasks.append(route)
            side = route
            if warm and k < last:
                side = early = delayed_submit(pack_early, str(store.path), warm, route, str(run.work / EARLY), early,
                                              final=k == last - 1, check_crc=run.cfg.check_crc,
                                              key=f"pack-early-{r.key}-{tok}")
        save_tasks.append(delayed_submit(save_plan_task, plan, str(pdir / f"{r.key}.npz"),
                                         after=side if packing_now else None, key=f"plan-save-{r.key}-{tok}"))
        if packing_now:
            side = save_tasks[-1]
    # the tiers' figures, not the tiers: their arrays stay on the workers
    figures = delayed_submit(tier_figures, tiers, key=f"tiers-figures-{tok}")
    heads = [figures] if early is None else [figures, early]
    done = compute([*heads, *save_tasks, *route_tasks], desc="plan", disable=run.show())
    chosen, run.early = done[0], (done[1] if early is not None else {})
    stats, early_routes = done[len(heads):len(heads) + len(save_tasks)], done[len(heads) + len(save_tasks):] or None
    tier_fig = {k: chosen[k] for k in ("gpu_rows", "cpu_rows", "staging_bytes", "cpu_memory")}
    return pdir, stage.finish({"tiers": tier_fig, "plans": stats}, drop_stale=not run.keep_stale), early_routes


def pack_phase(run: Run, keys: tuple[str, str], sdir: Path, summaries: list[dict[str, Any]], pdir: Path,
                planned_round: dict[str, Any], early_routes: list[dict] | None) -> dict[str, Any]:
    """Layout, route, pack and index into a staging directory, then swap it into place as the packed
    dataset (its manifest last); the dataset's figures."""
    store, cfg = run.store, run.cfg
    store_hash, k_key = keys
    plan_stats, tiers = planned_round["plans"], planned_round["tiers"]
    rb, num_batches = run.row_bytes, sum(r.num_batches for r in run.refs)
    miss_rows = int(np.concatenate([np.asarray(s["batch_misses"], np.int64) for s in plan_stats]).sum())
    max_batch_rows = max(int(s["max_nodes"]) for s in summaries)
    figures: dict[str, Any] = {
        "batches": num_batches, "accesses": int(sum(int(s["accesses"]) for s in summaries)),
        "gpu_rows": tiers["gpu_rows"], "cpu_rows": tiers["cpu_rows"], "staging_bytes": tiers["staging_bytes"],
        "cpu_memory": int(tiers.get("cpu_memory", run.cpu_memory)),    # more than cfg's: a default raised
        "io_buffer_bytes": cfg.io_reserve, "max_batch_rows": max_batch_rows,
        "gpu_hits": int(sum(int(s["gpu_hits"]) for s in plan_stats)),
        "cpu_hits": int(sum(int(s["hits"]) for s in plan_stats)),
        "misses": miss_rows, "inserts": int(sum(int(s["inserts"]) for s in plan_stats)),
        "plan_miss_bytes": miss_rows * rb, "row_bytes": rb,
        **({"rows": rows_block(run.codec)} if run.codec is not None else {}),
        "disk_budget_bytes": run.disk_budget,
        "batch_order": cfg.batches,
        **({"memory_split": run.split} if run.split is not None else {}),
        **({"partition": run.partition} if run.partition is not None else {}),
        **({"label_prior": run.label_prior} if run.label_prior is not None else {}),
        **({"history": {"rows": min(cfg.history_rows, store.num_nodes), "dim": cfg.history_dim, "staleness": cfg.history_staleness,
                        "bytes": min(cfg.history_rows, store.num_nodes) * cfg.history_dim * EMBEDDING_BYTES,
                        "select": cfg.history_select, "prune": cfg.history_prune,
                        **staleness_rule(cfg.history_ramp, cfg.history_cooldown),
                        "pruned": int(sum(int(s.get("pruned", 0)) for s in summaries)),
                        "pushed": int(sum(int(s.get("pushed", 0)) for s in summaries))}} if cfg.history_rows else {}),
    }
    if figures["cpu_memory"] > run.cpu_memory:
        note_raised("cpu_memory", cfg.cpu_memory, figures["cpu_memory"], detail=" (an empty CPU tier)")
    # what the packed dataset holds besides its packed segments: labels, both tiers (ids and
    # rows), and an index of at least a source byte and an int32 address per access
    base_bytes = (store.num_nodes * 8 + (tiers["gpu_rows"] + tiers["cpu_rows"]) * (rb + 8) + 4 * ALIGN
                  + figures["accesses"] * 5)
    if early_routes is not None:    # packing everything: the routes already give the exact packed bytes
        _check_room(run.out, base_bytes + int(segment_offsets(
            np.concatenate([np.asarray(x["seg_rows"], np.int64) for x in early_routes]), rb)[1].sum()))
    else:
        _check_room(run.out, base_bytes)
    sample_paths = [str(sdir / r.filename) for r in run.refs]
    plan_paths = [str(pdir / f"{r.key}.npz") for r in run.refs]
    layout_path: str | None = None
    with staging_dir(run.out) as stage:
        rnd = stage / ROUND_DIR
        (rnd / "index").mkdir(parents=True)
        (rnd / "samples").mkdir(parents=True)
        for r, path in zip(run.refs, sample_paths):
            os.link(path, rnd / samples_name(r.key))
        if store.table_of is None:
            _labels_into(store, stage / "labels.npy")                             # y = labels[n_id] at train time
        if run.split is not None:
            plot_memory_split(stage / SPLIT_PLOT, run.split)
        if run.order is not None and run.order.parts is not None:     # the partition the batches were cut by
            os.link(run.order.parts, stage / PARTITION_FILE)
        saved = load_npz(pdir / "tiers.npz")
        gpu_ids, cpu_ids = saved["gpu_ids"], saved["cpu_ids"]
        if not cfg.packing:
            parts, dcache = _index_store_reads(run, stage, sample_paths, plan_paths, gpu_ids, cpu_ids, figures)
        else:
            parts, dcache, layout_path = _pack_misses(run, stage, sample_paths, plan_paths, gpu_ids, cpu_ids, figures,
                                                      early_routes, base_bytes, miss_rows)
        manifest = {
            "format": PACKED_FORMAT, "version": PACKED_VERSION, "pipeline": cfg.pipeline,
            "config": {**cfg.describe(), "history_split": run.split is not None}, "config_hash": k_key,
            "store": run.store_record or {"path": str(store.path.resolve()), "manifest_hash": store_hash},
            "dtype": run.row_layout[0].name, "dim": run.row_layout[1], "row_bytes": rb,
            **({"rows": run.codec.to_manifest()} if run.codec is not None else {}),
            "num_nodes": store.num_nodes, "num_shards": len(store.shards), "shard_rows": store.shard_rows,
            "num_classes": store.num_classes, "labels": None if store.table_of is not None else "labels.npy",
            **({"hetero": store.manifest["hetero"]} if store.manifest.get("hetero") else {}),
            "tiers": {"gpu_rows": int(gpu_ids.shape[0]), "cpu_rows": int(cpu_ids.shape[0]),
                      "cpu_policy": policy_id(cfg.cpu_policy), "gpu_policy": policy_id(cfg.gpu_policy)},
            "round": {"epochs": cfg.epochs, "batches": num_batches, "max_batch_rows": max_batch_rows,
                      "superbatches": [{"key": r.key, "epoch": r.epoch, "index": r.index, "batches": r.num_batches,
                                        "first_batch": r.round_first_batch} for r in run.refs]},
            "files": {"parts": parts, "dcache": dcache},
            "figures": figures,
        }
        for name, (table_dir, entry) in run.nested.items():     # packed tables of their own (edge rows)
            os.rename(table_dir, stage / name)
            manifest[name] = {"path": name, **entry}
        remove_orphans(stage)
        write_manifest(stage, manifest)
    if layout_path is not None:
        Path(layout_path).unlink(missing_ok=True)
    return figures


def _labels_into(store: Store, path: Path) -> None:
    """The store's labels as the packed dataset's ``labels.npy``: a hard link to the store's file when it is
    already int64 (the store's format) on the same filesystem, else a copy. Both are files written once and
    never changed, and the link spares writing N x 8 bytes on the way to the pack phase."""
    src = store.path / store.manifest["labels"]
    try:
        if np.load(src, mmap_mode="r").dtype == np.int64:
            os.link(src, path)
            return
    except (OSError, ValueError):
        pass
    save_npy(path, np.asarray(store.labels, dtype=np.int64))


def _index_store_reads(run: Run, stage: Path, sample_paths: list[str], plan_paths: list[str], gpu_ids: np.ndarray,
                       cpu_ids: np.ndarray, figures: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """No packing (Ginex): index every miss as a read of its store row, write the tiers' rows; the part
    files (empty) and disk-cache files (none) of the manifest."""
    store, tok, P = run.store, run.tok, len(run.store.shards)
    rnd = stage / ROUND_DIR
    tasks = [delayed_submit(store_index_task, r, sp, pp, P, str(rnd / index_name(r.key)), key=f"index-{r.key}-{tok}")
             for r, sp, pp in zip(run.refs, sample_paths, plan_paths)]
    compute(tasks, desc="index", disable=run.show())
    tier_t, _ = prepare_targets(stage, gpu_ids, cpu_ids, [], store.feature_dtype, store.feature_dim)
    compute([delayed_submit(write_tier_rows, str(store.path), p, tier_t, check_crc=run.cfg.check_crc,
                            key=f"pack-r0-p{p}-{tok}")
             for p in range(P)], desc="tiers", disable=run.show())
    for p in range(P):     # no packed segments: empty part files keep the layout uniform
        (rnd / part_name(p)).touch()
    figures.update(packed_bytes=0, dcache_bytes=0, disk_used_bytes=0, read_amplification=None)
    return [{"path": f"{ROUND_DIR}/{part_name(p)}", "bytes": 0} for p in range(P)], []


def _pack_misses(run: Run, stage: Path, sample_paths: list[str], plan_paths: list[str], gpu_ids: np.ndarray,
                 cpu_ids: np.ndarray, figures: dict[str, Any], early_routes: list[dict] | None, base_bytes: int,
                 miss_rows: int) -> tuple[list[dict], list[dict], str | None]:
    """Packing: the disk-cache layout when the disk budget needs one, the routes, one sequential pass over
    each shard writing packed segments, tier rows and disk-cache rows, and the index; the part files and
    disk-cache files of the manifest, and the layout file to remove once the dataset is in place."""
    store, cfg, work, tok = run.store, run.cfg, run.work, run.tok
    P, rb, rnd = len(store.shards), run.row_bytes, stage / ROUND_DIR
    num_batches = sum(r.num_batches for r in run.refs)
    pad_per_batch = P * (packed_fmt.ALIGN - 1)
    layout_path: str | None = None
    disk_budget = run.disk_budget
    if cfg.disk_cache and disk_budget is not None and miss_rows * rb + num_batches * pad_per_batch > disk_budget:
        layout_path = str(work / "layout.pkl")
        (search,) = compute([delayed_submit(search_task, sample_paths, plan_paths, rb, disk_budget, pad_per_batch,
                                            cfg.minhash_k, cfg.seed, store.shard_rows, layout_path,
                                            key=f"search-{tok}")], desc="search", disable=True)
        if search["segment_size"] is None:   # the exact packed bytes fit: no disk cache
            layout_path = None
        else:
            figures["segment_size"] = search["segment_size"]
    (work / "route").mkdir(exist_ok=True)
    routes = early_routes if early_routes is not None and layout_path is None else \
        compute([delayed_submit(route_task, r, sp, pp, layout_path, store.shard_rows, P,
                                str(work / "route" / f"{r.key}.npz"), key=f"route-{r.key}-{tok}")
                 for r, sp, pp in zip(run.refs, sample_paths, plan_paths)], desc="route", disable=run.show())
    seg_rows = np.concatenate([np.asarray(x["seg_rows"], np.int64) for x in routes])
    offsets, part_bytes = segment_offsets(seg_rows, rb)
    if not cfg.disk_cache and disk_budget is not None and int(part_bytes.sum()) > disk_budget:
        raise ConfigError("disk_budget", (
            f"packing every miss takes {format_bytes(int(part_bytes.sum()))} of disk, more than "
            f"{format_bytes(disk_budget)}, and the {cfg.pipeline} pipeline keeps no disk cache "
            "(disk_cache=False); raise disk_budget or leave it out"))
    cache_nodes: list[np.ndarray] = []
    if layout_path is not None:
        import pickle
        with open(layout_path, "rb") as f:
            layout = pickle.load(f)
        cache_nodes = [] if layout.segment_size is None else list(layout.cache_nodes)
    cache_bytes = int(sum(packed_fmt.padded(len(n) * rb) for n in cache_nodes))
    _check_room(run.out, base_bytes + int(part_bytes.sum()) + cache_bytes)
    early = run.early if routes is early_routes else {}      # begun while planning, on the same routes
    _announce_pack(run, int(part_bytes.sum()) + cache_bytes, sum(int(e.position) for e in early.values()))
    tier_t, cache_t = prepare_targets(stage, gpu_ids, cpu_ids, cache_nodes, *run.row_layout)
    route_paths = [x["path"] for x in routes]
    packs = compute([delayed_submit(pack_shard, str(store.path), p, route_paths, offsets[:, p], str(rnd / part_name(p)),
                                    dcache_targets=cache_t, tier_targets=tier_t, early=early.get(p),
                                    check_crc=run.cfg.check_crc, codec=run.codec, key=f"pack-r0-p{p}-{tok}")
                     for p in range(P)], desc="pack", disable=run.show())
    crc = np.stack([np.asarray(x["crc"]) for x in packs], axis=1)
    compute([delayed_submit(index_task, x, offsets[x["first_batch"]:x["first_batch"] + x["batches"]],
                            crc[x["first_batch"]:x["first_batch"] + x["batches"]],
                            str(rnd / index_name(x["key"])), key=f"index-{x['key']}-{tok}")
             for x in routes], desc="index", disable=run.show())
    parts: list[dict[str, Any]] = [{"path": f"{ROUND_DIR}/{part_name(p)}", "bytes": int(part_bytes[p])}
                                   for p in range(P)]
    dcache: list[dict[str, Any]] = [{"path": f"{ROUND_DIR}/{dcache_name(g)}", "rows": len(n),
                                     "crc": file_crc(rnd / dcache_name(g), 0, len(n) * rb)}
                                    for g, n in enumerate(cache_nodes)]
    packed_bytes = int(sum(p["bytes"] for p in parts))
    dcache_bytes = int(sum(packed_fmt.padded(d["rows"] * rb) for d in dcache))
    figures.update(packed_bytes=packed_bytes, dcache_bytes=dcache_bytes,
                   packed_rows=int(seg_rows.sum()), dcache_rows=int(sum(int(x["dcache_rows"]) for x in routes)),
                   raw_bytes_read=int(sum(int(x["bytes_read"]) for x in packs)),
                   packed_bytes_written=int(sum(int(x["bytes_written"]) for x in packs)))
    figures["disk_used_bytes"] = packed_bytes + dcache_bytes
    figures["read_amplification"] = _read_amplification(stage, routes, offsets, seg_rows, rb)
    shutil.rmtree(work / "route", ignore_errors=True)
    shutil.rmtree(work / EARLY, ignore_errors=True)
    figures["early_rows"] = int(sum(e.rows for e in early.values()))
    return parts, dcache, layout_path


@contextlib.contextmanager
def read_ahead(store: Store, cfg: PrepareConfig) -> Iterator[None]:
    """Warm the first shards (`warm_shards`) on a background thread while the block runs; stop it after."""
    if not cfg.packing or cfg.readahead <= 0:
        yield
        return
    stop = threading.Event()
    warm = threading.Thread(target=warm_shards, args=(str(store.path), cfg.readahead, stop),
                            name="diskflow-readahead", daemon=True)
    warm.start()
    try:
        yield
    finally:
        stop.set()
        warm.join()


def _read_amplification(stage: Path, routes: Sequence[dict], offsets: np.ndarray, seg_rows: np.ndarray,
                        row_bytes: int) -> float:
    """Pages a loader reads over useful bytes: padded packed segments + page-merged disk-cache rows.

    Only superbatches with disk-cache reads have their index read back (the packed segments' share comes
    from `seg_rows`): a round without a disk cache has nothing to read back after packing."""
    from ...operators.formats.packedindex import read_index_file
    from ...operators.prepare.reorder import pages_touched

    useful = int(seg_rows.sum()) * row_bytes
    pages = int(packed_fmt.padded(seg_rows * row_bytes).sum())
    dc_batches: list[np.ndarray] = []
    for x in routes:
        if not int(x.get("dcache_rows", 1)):   # no disk-cache reads: its index adds nothing
            continue
        for rec in read_index_file(stage / ROUND_DIR / index_name(x["key"])):
            rows = rec.idx[rec.src == packed_fmt.SRC_DCACHE]
            if rows.size:
                useful += rows.size * row_bytes
                dc_batches.append(rows)
    if dc_batches:
        pages += pages_touched(dc_batches, row_bytes) * packed_fmt.ALIGN
    return pages / useful if useful else 1.0
