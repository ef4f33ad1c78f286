"""Edge-feature rows in the preparation: counted, tiered, planned and packed like node rows, in the same budgets.

A store with edge features gives every sampled batch two tables to read: node rows at its ``n_id`` and
edge rows at its ``e_id``. Once the round is sampled, the edge reads are a round of their own
(`operators.prepare.edgerows`): a samples file per superbatch whose ids are the ``e_id``, over a store
whose rows are the edge features (`Store.edge_table`, its manifest written to ``OUT.work/edges/store``
for the workers). The plan and pack phases then run on it unchanged, into a packed dataset of its own
that the node dataset holds as ``edges/`` (moved in before the node manifest is written).

The GPU and CPU budgets are split between the two tables by their share of the round's read bytes
(accesses x row bytes), so that neither starves; each table's tiers, staging and I/O buffers fit its
share, and the loader checks each against it. The stages are cached under ``OUT.work/edges`` with keys
derived from the node stages' (the shares follow from the samples).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...operators.formats.hashing import config_hash
from ...operators.formats.manifest import write_manifest
from ...operators.formats.packed import EDGE_ROWS
from ...operators.formats.sizes import format_bytes
from ...operators.formats.store import Store
from ...operators.prepare.count import Counts, save_counts
from ...operators.prepare.edgerows import edge_samples
from ...operators.prepare.round import RoundOptions
from ...operators.prepare.tiers import staging_piece_bytes
from ..graph import PrepGraph, SampleResult, delayed_submit
from ..progress import compute
from .cache import COUNTS, CachedStage, stage_dir
from .phases import Run, pack_phase, plan_phase

__all__ = ["EDGES", "Budget", "EdgeRound", "edge_round", "edge_samples_task", "edge_stage_dir", "pack_edges",
           "split_budgets"]

EDGES = EDGE_ROWS   # the edge rows' packed dataset inside a packed dataset, and their stages in ``OUT.work``

Budget = tuple[int, int, "int | None"]      # a table's (GPU, CPU, disk) bytes


@dataclass
class EdgeRound:
    """The edge rows' round once sampled: its run (over the edge table), samples and counts, and its share."""

    run: Run
    sdir: Path
    summaries: list[dict[str, Any]]
    counts: Counts | None
    share: float            # of the round's read bytes: the edge table's part of the GPU and CPU budgets


def edge_samples_task(sample_path: str, out_path: str, num_rows: int, key: str) -> SampleResult:
    """Superbatch `key`'s edge-row samples file (`edgerows.edge_samples`), as the sample phase's result."""
    summary = edge_samples(sample_path, out_path, num_rows, key)
    return SampleResult(key, None, summary, {}, path=out_path)


def edge_round(run: Run, s_key: str, sdir: Path, summaries: list[dict[str, Any]]) -> EdgeRound | None:
    """The edge rows' round of `run` (None when the store has no edge features): the edge-row samples of
    every superbatch and their counts (cached), and the share of the budgets their reads take."""
    store, cfg = run.store, run.cfg
    if store.edge_features is None:
        return None
    ework = run.work / EDGES
    ework.mkdir(exist_ok=True)
    table = store.edge_table()
    write_manifest(ework / "store", table.manifest, durable=False)
    estore = Store(ework / "store")
    tok = f"{run.tok}1"
    stage = CachedStage(ework, "samples", _samples_key(s_key))
    manifest, counts = stage.cached(), None
    if manifest is None:
        edir = stage.start()
        g = PrepGraph(str(estore.path), run.refs, (0, (), cfg.seed, cfg.sampler_threads), cfg.cpu_policy, tok,
                      delayed_submit)
        derived = [delayed_submit(edge_samples_task, str(sdir / r.filename), str(edir / r.filename),
                                  estore.num_nodes, r.key, key=f"edge-samples-{r.key}-{tok}") for r in run.refs]
        *results, counts = compute([*derived, g.counts(list(enumerate(derived)))], desc="edge rows",
                                   disable=run.show())
        save_counts(edir / COUNTS, counts, parents=False)
        manifest = stage.finish({"summaries": [r.summary for r in results]})
    esummaries = manifest["summaries"]
    edge_bytes = sum(int(s["accesses"]) for s in esummaries) * estore.row_bytes
    node_bytes = sum(int(s["accesses"]) for s in summaries) * run.row_bytes     # (encoded rows: their bytes)
    share = edge_bytes / (edge_bytes + node_bytes) if edge_bytes else 0.0
    node_budget, edge_budget = split_budgets(cfg, share, (store, summaries), (estore, esummaries))
    run.budget = node_budget
    erun = Run(estore, ework / "packed", ework, replace(cfg, readahead=0, history_memory=0, rows="exact"), run.refs,
               tok, run.quiet,
               budget=edge_budget,
               store_record={"path": str(store.path.resolve()), "manifest_hash": config_hash(store.manifest),
                             "table": "edge_features"})
    return EdgeRound(erun, stage.path, esummaries, counts, share)


def _samples_key(s_key: str) -> str:
    """The edge-row samples stage's key, from the node samples' (`s_key`)."""
    return config_hash({"samples": s_key, "table": "edge_features"})


def edge_stage_dir(run: Run, s_key: str) -> Path:
    """Where the edge-row samples of the node samples `s_key` are cached (a memory split drops a beaten
    candidate's)."""
    return stage_dir(run.work / EDGES, "samples", _samples_key(s_key))


def _fixed_bytes(cfg: RoundOptions, table: Store, summaries: list[dict[str, Any]]) -> int:
    """A table's loader buffers, whatever its tiers: staging for its largest batch and the I/O buffers."""
    rows = max((int(s["max_nodes"]) for s in summaries), default=0)
    return cfg.staging_batches * staging_piece_bytes(rows, table.row_bytes, len(table.shards),
                                                     cfg.staging_piece) + cfg.io_reserve


def split_budgets(cfg: RoundOptions, share: float, nodes: tuple[Store, list[dict[str, Any]]],
                  edges: tuple[Store, list[dict[str, Any]]]) -> tuple[Budget, Budget]:
    """The (GPU, CPU, disk) bytes of the node rows and of the edge rows out of `cfg`'s budgets (a prepare's
    or a streamed run's; the disk budget, and a default CPU budget, only a prepare's).

    Each table's loader needs its own staging and I/O buffers; what the CPU budget leaves after both is
    split by `share` (the edge rows' part of the round's read bytes), and so are the GPU and disk budgets.
    A CPU budget that cannot hold both tables' buffers is refused naming each (a default is raised to it).
    """
    need_n, need_e = _fixed_bytes(cfg, *nodes), _fixed_bytes(cfg, *edges)
    rest = cfg.cpu_memory - need_n - need_e
    disk_budget: int | None = getattr(cfg, "disk_budget", None)
    if rest < 0 and not getattr(cfg, "cpu_memory_default", False):
        need = need_n + need_e
        raise ConfigError("cpu_memory", (
            f"{format_bytes(cfg.cpu_memory)} cannot hold the staging and I/O buffers of the node rows "
            f"({format_bytes(need_n)}) and of the edge rows ({format_bytes(need_e)}) the batches read; the smallest "
            f"budget that works is {format_bytes(need)} ({need:,} bytes, with empty CPU tiers)"))
    rest = max(0, rest)
    cpu_e = need_e + int(rest * share)
    gpu_e = int(cfg.gpu_memory * share)
    disk_e = disk_n = None
    if disk_budget is not None:
        disk_e = int(disk_budget * share)
        disk_n = disk_budget - disk_e
    edge = (gpu_e, cpu_e, disk_e)
    node = (cfg.gpu_memory - gpu_e, max(need_n, cfg.cpu_memory - cpu_e), disk_n)
    return node, edge


def pack_edges(run: Run, edges: EdgeRound, keys: tuple[str, str]) -> dict[str, Any]:
    """Plan and pack the edge rows (`plan_phase`, `pack_phase` on the edge table) and have `run`'s pack phase
    move their packed dataset in as ``edges/``; their figures. `keys`: the node round's plan and pack keys."""
    p_key, k_key = (config_hash({"key": k, "table": "edge_features"}) for k in keys)
    erun = edges.run
    pdir, planned, early = plan_phase(erun, p_key, edges.sdir, edges.summaries, counts=edges.counts)
    edges.counts = None
    figures = pack_phase(erun, (erun.store_record["manifest_hash"] if erun.store_record else "", k_key), edges.sdir,
                         edges.summaries, pdir, planned, early)
    table = erun.store
    gpu, cpu, disk = erun.budget or (0, 0, None)
    run.nested[EDGES] = (erun.out, {"dtype": table.feature_dtype.name, "dim": table.feature_dim,
                                    "row_bytes": table.row_bytes, "rows": table.num_nodes,
                                    "read_share": edges.share, "gpu_memory": gpu,
                                    "cpu_memory": max(cpu, int(figures.get("cpu_memory", cpu))),
                                    "disk_budget": disk})
    return figures
