"""Offline preprocessing as Dask task graphs: store -> packed dataset (docs/design.md,
"The preparation graph").

Phases, each a Dask graph with named task groups (so the dashboard tells the story):

    sample-e{e}-s{k}   one per superbatch: sample its minibatches with the native sampler
    count-…            access counts per superbatch, tree-reduced (count-merge-…) to round totals
    tiers              GPU tier (hottest rows), CPU tier at round start
    trace-e{e}-s{k}    next uses in superbatch k's window (k and its lookahead k+1), independent
    plan-e{e}-s{k}     chained: plan k starts from plan k-1's cache state, looks ahead into k+1
    plan-save-…        writes plan k's file (the plan stage's cache), off the chain
    search             the segmented disk-cache layout when packing alone exceeds the disk budget
    route-e{e}-s{k}    final address translation + which rows each shard task packs (right
                       after plan k when there is no disk budget, else after the layout search)
    pack-early-e{e}-s{k}  the read-ahead shards' part files begun as superbatch k is routed (a chain
                       beside the plan chain, with the routes), so their writes overlap planning
    pack-r0-p{p}       one per feature shard: read the shard once, write every batch's segment
    index-e{e}-s{k}    the per-superbatch index with segment offsets and checksums

Intermediate results are cached next to the output (``OUT.work/``) under the hash of
the config they depend on, so re-running does no work and changing a budget redoes only
what depends on it (a new disk budget re-lays and re-packs, but does not re-sample or
re-plan). The packed dataset is built in a staging directory and swapped into place with
its manifest written last.
"""
from __future__ import annotations

import contextlib
import os
import resource
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..operators.formats import packed as packed_fmt
from ..operators.formats.errors import ConfigError, DiskFullError, InputError
from ..operators.formats.files import (
    ALIGN,
    MANIFEST,
    atomic_path,
    config_hash,
    drop_thread_buffers,
    format_bytes,
    load_npz,
    raise_if_disk_full,
    read_manifest,
    save_npy,
    staging_dir,
    write_json,
    write_manifest,
)
from ..operators.formats.outputs import OutputKind, check_free_space, check_replaceable, replace_foreign
from ..operators.formats.packed import (
    PACKED_FORMAT,
    PACKED_KIND,
    PACKED_VERSION,
    ROUND_DIR,
    SRC_STORE,
    IndexRecord,
    dcache_name,
    file_crc,
    index_name,
    part_name,
    patch_segments,
    samples_name,
    write_index_file,
)
from ..operators.formats.plan import SRC_MISS, SuperbatchPlan, load_plan, save_plan
from ..operators.formats.samples import read_n_ids
from ..operators.formats.store import Store
from ..operators.prepare.count import Counts, save_counts
from ..operators.prepare.diskcache import build_layout
from ..operators.prepare.history import (
    DEFAULT_PRUNE,
    DEFAULT_STALENESS,
    EMBEDDING_BYTES,
    EMBEDDING_DTYPE,
    HISTORY_SELECTS,
    check_prune,
    history_rows,
    refuse_without_cache,
)
from ..operators.prepare.pack import (
    EarlyPart,
    pack_early,
    pack_shard,
    prepare_targets,
    release_early_maps,
    warm_shard_ids,
    warm_shards,
    write_tier_rows,
)
from ..operators.prepare.partition import PARTITIONERS, default_parts
from ..operators.prepare.plan import release_planner_scratch
from ..operators.prepare.policies import Policy, check_policy, policy_id
from ..operators.prepare.route import route_superbatch, segment_offsets, write_index
from ..operators.prepare.sampler_pool import drop_idle_samplers
from ..operators.prepare.seeds import (
    BATCH_ORDERS,
    GROUPINGS,
    PARTS_PER_GROUP,
    BatchOrder,
    label_shares,
    parts_fingerprint,
)
from ..operators.prepare.superbatch import SuperbatchRef, check_round_config, round_layout
from ..operators.prepare.tiers import staging_buffers
from .allocator import reuse_for_preparation
from .graph import PlanResult, PrepGraph, SampleResult, TierSpec, delayed_submit, partition_task, tier_figures
from .memsplit import SPLIT_PLOT, SPLIT_SHARES, best_split, plot_memory_split, refine_shares, split_point
from .progress import active_client, compute

WORK_FORMAT = "diskflow-prepare-cache"
COUNTS = "counts.npz"                   # the sample stage's access counts over the round (sparse: ids, counts)
PARTS = "parts.npy"                     # the partition stage's file: every node's part, int32
PARTITION_FILE = "partition.npy"        # the same file in a packed dataset cut into partition batches
EARLY = "early"                         # in ``OUT.work``: part files begun while planning (`pack_early`)
WORK_MARKER = ".diskflow-work.json"     # marks ``OUT.work`` as prepare's cache (see `WORK_KIND`)
# ``OUT.work``: prepare's cache; older ones (no marker) are recognised by their entries alone
WORK_KIND = OutputKind("a diskflow prepare cache", markers=(WORK_MARKER,),
                       patterns=("samples-*", "plans-*", "route", EARLY, "layout.pkl", "layout.pkl.tmp", ".*.tmp-*"))


@dataclass(frozen=True)
class PrepareConfig:
    """Everything that shapes a packed dataset (budgets in bytes)."""

    pipeline: str = "belady"
    cpu_policy: Policy = "belady"       # "belady" (planned), "static" (most frequent rows) or a function
    gpu_policy: Policy = "hottest"      # "hottest" or a function (operators.prepare.policies)
    packing: bool = True                # False: misses are read row by row from the store (Ginex)
    disk_cache: bool = True             # False: a disk budget that packing exceeds is an error, not a disk cache
    fanouts: tuple[int, ...] = (10, 10, 10)
    batch_size: int = 1024
    superbatch_size: int = 64
    epochs: int = 1
    seed: int = 0
    gpu_memory: int = 0
    cpu_memory: int = 0
    disk_budget: int | None = None      # None: no limit on packed bytes
    device: str = "cpu"
    staging_batches: int = staging_buffers(2)    # staging buffers the pipelined trainer cycles at queue depth 2
    io_reserve: int = 0                 # the trainer's other I/O buffers, reserved out of cpu_memory too
    minhash_k: int = 2
    sampler_threads: int = 1
    readahead: int = 1 << 30            # feature bytes read into the page cache while sampling/planning
    batches: str = "shuffled"           # "shuffled" or "partition" (OUTRE: batches from groups of min-cut parts)
    partitions: int | None = None       # parts of the partition; None: one per 128 training nodes
    parts_per_group: int = PARTS_PER_GROUP     # parts whose training nodes are shuffled together
    group_by: str = "label"             # how parts meet in a group: "label" (mixed labels) or "random" (OUTRE's)
    partitioner: str = "kaminpar"       # "kaminpar" or "metis" (operators.prepare.partition)
    partition_threads: int = 1          # the partitioner's threads (1: the same parts on every run)
    history_memory: int = 0             # bytes of a historical embedding cache planned into the samples (0: none)
    history_dim: int = 128              # its embedding width: the model's hidden channels
    history_staleness: int = DEFAULT_STALENESS      # batches a cached embedding stays usable
    history_select: str = "accesses"    # its nodes: the round's most frequent one-hop nodes, or "degree"
    history_prune: str = DEFAULT_PRUNE  # what a fresh embedding prunes below its node: "last-hop" or "subtree"
    history_split: bool = False         # choose history_memory out of cpu_memory (`flow.memsplit`): fewest disk bytes

    def validate(self) -> None:
        check_round_config(self.batch_size, self.superbatch_size, self.epochs, self.fanouts)
        check_policy(self.cpu_policy, "cpu", "cpu_policy")
        check_policy(self.gpu_policy, "gpu", "gpu_policy")
        if self.device not in ("cpu", "cuda"):
            raise ConfigError("--device", f"expected cpu or cuda, got {self.device!r}")
        if self.device == "cpu" and self.gpu_memory > 0:
            raise ConfigError("--gpu-memory", f"a GPU tier of {self.gpu_memory:,} bytes was asked for on a CPU-only "
                                              "run (--device cpu); use --gpu-memory 0 or train with --device cuda")
        if self.gpu_memory < 0 or self.cpu_memory < 0:
            raise ConfigError("--gpu-memory/--cpu-memory", "budgets must be >= 0")
        if self.staging_batches < 1:
            raise ConfigError("--staging-batches", f"must be >= 1, got {self.staging_batches}")
        if not self.packing and self.disk_budget is not None:
            raise ConfigError("--disk-budget", f"the {self.pipeline} pipeline packs nothing, so a disk budget does not apply")
        if self.disk_budget is not None and self.disk_budget <= 0:
            raise ConfigError("--disk-budget", f"must be > 0, got {self.disk_budget}")
        if self.minhash_k < 1:
            raise ConfigError("--minhash-k", f"must be >= 1, got {self.minhash_k}")
        if self.readahead < 0:
            raise ConfigError("--readahead", f"must be >= 0 bytes, got {self.readahead}")
        if self.sampler_threads < 1:
            raise ConfigError("--sampler-threads", f"must be >= 1, got {self.sampler_threads}")
        if self.batches not in BATCH_ORDERS:
            raise ConfigError("--batches", f"expected one of {', '.join(BATCH_ORDERS)}, got {self.batches!r}")
        if self.partitioner not in PARTITIONERS:
            raise ConfigError("--partitioner", f"expected one of {', '.join(PARTITIONERS)}, got {self.partitioner!r}")
        if self.partitions is not None and self.partitions < 2:
            raise ConfigError("--partitions", f"must be >= 2, got {self.partitions}")
        if self.parts_per_group < 1:
            raise ConfigError("--parts-per-group", f"must be >= 1, got {self.parts_per_group}")
        if self.partition_threads < 1:
            raise ConfigError("--partition-threads", f"must be >= 1, got {self.partition_threads}")
        if self.group_by not in GROUPINGS:
            raise ConfigError("--group-by", f"expected one of {', '.join(GROUPINGS)}, got {self.group_by!r}")
        if self.batches == "shuffled":
            for option, value, default in (("--partitions", self.partitions, None),
                                           ("--parts-per-group", self.parts_per_group, PARTS_PER_GROUP),
                                           ("--group-by", self.group_by, "label"),
                                           ("--partitioner", self.partitioner, "kaminpar"),
                                           ("--partition-threads", self.partition_threads, 1)):
                if value != default:
                    raise ConfigError(option, "applies to partition batches only (--batches partition)")
        if self.history_split:
            if self.history_memory:
                raise ConfigError("--history-memory", "auto chooses the embedding cache's bytes; give auto or a size, not both")
            if self.cpu_memory <= 0:
                raise ConfigError("--history-memory", "auto splits --cpu-memory between the caches; give a CPU budget")
        if self.history_memory < 0:
            raise ConfigError("--history-memory", f"must be >= 0 bytes, got {self.history_memory}")
        if self.history_select not in HISTORY_SELECTS:
            raise ConfigError("--history-select", f"expected one of {', '.join(HISTORY_SELECTS)}, "
                                                  f"got {self.history_select!r}")
        check_prune(self.history_prune)
        if not (self.history_memory or self.history_split):
            refuse_without_cache(self.history_staleness, self.history_prune, self.history_select)
        if self.history_staleness < 1:
            raise ConfigError("--history-staleness", f"must be >= 1 (1: never reused), got {self.history_staleness}")
        if (self.history_memory or self.history_split) and len(self.fanouts) < 2:
            raise ConfigError("--history-memory", "a historical embedding cache needs two or more hops")
        if self.history_memory and self.history_rows == 0:
            raise ConfigError("--history-memory", f"{self.history_memory:,} bytes hold no embedding of "
                                                  f"{self.history_dim} {EMBEDDING_DTYPE} values")

    @property
    def history_rows(self) -> int:
        """Embeddings the historical cache holds (0: no cache)."""
        return history_rows(self.history_memory, self.history_dim) if self.history_memory else 0

    def describe(self) -> dict[str, Any]:
        """The config as JSON values (a policy function by its `policy_id`): what a manifest records."""
        return {**asdict(self), "cpu_policy": policy_id(self.cpu_policy), "gpu_policy": policy_id(self.gpu_policy),
                "fanouts": list(self.fanouts)}

    def num_partitions(self, store: Store) -> int:
        """The parts of the partition (`operators.prepare.partition.default_parts`)."""
        return default_parts(int(store.manifest.get("split_counts", {}).get("train", 0)), store.num_nodes,
                             self.partitions)

    # The config subsets each cached stage depends on.
    def partition_key(self, store_hash: str, parts: int) -> str:
        return config_hash({"store": store_hash, "parts": parts, "partitioner": self.partitioner, "seed": self.seed,
                            "threads": self.partition_threads})

    def sample_key(self, store_hash: str, partition_key: str | None = None) -> str:
        order: dict[str, Any] = {} if self.batches == "shuffled" else \
            {"batches": self.batches, "partition": partition_key, "group": self.parts_per_group,
             **({"grouping": self.group_by} if self.group_by != "random" else {})}
        if self.history_rows:
            order["history"] = {"rows": self.history_rows, "dim": self.history_dim,
                                "staleness": self.history_staleness,
                                **({"select": self.history_select} if self.history_select != "degree" else {}),
                                **({"prune": self.history_prune} if self.history_prune != "subtree" else {})}
        return config_hash({"store": store_hash, "fanouts": list(self.fanouts), "batch_size": self.batch_size,
                            "superbatch_size": self.superbatch_size, "epochs": self.epochs, "seed": self.seed,
                            "counts": COUNTS, **order})

    def plan_key(self, sample_key: str) -> str:
        policies = {"cpu_policy": policy_id(self.cpu_policy)} if self.gpu_policy == "hottest" else \
            {"cpu_policy": policy_id(self.cpu_policy), "gpu_policy": policy_id(self.gpu_policy)}
        return config_hash({"samples": sample_key, **policies, "gpu": self.gpu_memory,
                            "cpu": self.cpu_memory, "device": self.device, "staging": self.staging_batches,
                            "io": self.io_reserve})

    def pack_key(self, plan_key: str) -> str:
        return config_hash({"plans": plan_key, "packing": self.packing, "disk": self.disk_budget,
                            **({} if self.disk_cache else {"disk_cache": False}),
                            **({"split": [*SPLIT_SHARES, "refined"], "dim": self.history_dim, "staleness": self.history_staleness,
                                "select": self.history_select,
                                **({"prune": self.history_prune} if self.history_prune != "subtree" else {})}
                               if self.history_split else {}),
                            "k": self.minhash_k, "version": PACKED_VERSION, "layout": 2})


@dataclass
class PrepareResult:
    """What `prepare` did and the headline figures of the packed dataset."""

    path: Path
    skipped: bool
    seconds: float
    figures: dict[str, Any] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)       # wall seconds per phase
    phase_cpu: dict[str, float] = field(default_factory=dict)    # CPU seconds of this process per phase
    chain_s: float = 0.0                # the serial plan chain: the plan tasks' seconds, one after the other


def _stage_dir(work: Path, name: str, key: str) -> Path:
    return work / f"{name}-{key[:16]}"


def _drop_stale(work: Path, name: str, keep: Path) -> None:
    """Remove cached results of a stage computed for another config."""
    for d in work.glob(f"{name}-*"):
        if d != keep and d.is_dir():
            shutil.rmtree(d, ignore_errors=True)


def _written_manifest(stage: Path) -> dict[str, Any]:
    """A cache stage's manifest just written, read back (as a later run reads it: JSON values only)."""
    manifest = read_manifest(stage)
    if manifest is None:
        raise InputError(stage / MANIFEST, "missing right after it was written (removed by another process?)")
    return manifest


def _remove_orphans(root: Path) -> None:
    """Delete temp files of tasks killed mid-write (their retries wrote the real files under other names)."""
    for p in list(root.rglob(".*.tmp-*")):
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


# ---------------------------------------------------------------------------- tasks (thin wrappers)

def _done(result: Any) -> None:
    """A task's completion without its result: what a task that must only come after it waits on, so no
    data moves to it (on a cluster this runs where `result` is)."""


def _save_plan_task(plan: PlanResult, out_path: str, after: Any = None) -> dict:
    """Write one plan file (the plan stage's cache) and return its figures. `after`: a task's result this one
    waits for (ordering only)."""
    save_plan(out_path, SuperbatchPlan(plan.batches, plan.final_cache, plan.stats["hits"], plan.stats["misses"],
                                       plan.stats["gpu_hits"]), parents=False)
    misses = np.array([b.misses for b in plan.batches], dtype=np.int64)
    chain_s = plan.timing["plan"]["t1"] - plan.timing["plan"]["t0"]    # this superbatch's link of the serial chain
    return {"path": out_path, **plan.stats, "batch_misses": misses, "chain_s": chain_s}


def _misses_of(sample_path: str, plan_path: str) -> list[np.ndarray]:
    plan = load_plan(plan_path)
    return [n[b.src == SRC_MISS] for n, b in zip(read_n_ids(sample_path), plan.batches)]


def _search_task(sample_paths: list[str], plan_paths: list[str], row_bytes: int, disk_budget: int,
                 pad_per_batch: int, k: int, seed: int, shard_rows: int, out_path: str) -> dict:
    """The segmented disk-cache layout (DiskGNN §5.1) for the whole round.

    Only needed when packing every miss exceeds the budget. The caller decides that from a
    padding bound; the exact packed bytes (each (batch, shard) segment padded to 4096) are
    checked here first, so a round whose packed rows fit is not segmented (segment_size None,
    no layout file written).
    """
    import pickle

    misses = [m for s, p in zip(sample_paths, plan_paths) for m in _misses_of(s, p)]
    exact = sum(int(packed_fmt.padded(np.bincount(m // shard_rows) * row_bytes).sum()) for m in misses)
    if exact <= disk_budget:
        return {"segment_size": None, "disk_bytes": exact, "segments": 0}
    layout = build_layout(misses, row_bytes, disk_budget, pad_bytes_per_batch=pad_per_batch, k=k, seed=seed)
    with atomic_path(out_path, parents=False) as tmp, open(tmp, "wb") as f:
        pickle.dump(layout, f, protocol=pickle.HIGHEST_PROTOCOL)
    return {"segment_size": layout.segment_size, "disk_bytes": int(layout.disk_bytes),
            "segments": len(layout.cache_nodes)}


def _route_task(ref: SuperbatchRef, sample_path: str, plan_path: str, layout_path: str | None,
                shard_rows: int, num_shards: int, out_path: str, planned: SuperbatchPlan | None = None,
                after: Any = None) -> dict:
    """Route one superbatch: its plan from the plan task (`planned`, same graph) or from its file. Its index is
    written now too (beside the routing file, ``.index.arrow``), completed by `_index_task` after packing:
    in the plan phase the route tasks run beside the serial chain, on CPUs it leaves idle. `after`: a
    task's result this one waits for (ordering only)."""
    import pickle

    layout = None
    if layout_path is not None:
        with open(layout_path, "rb") as f:
            layout = pickle.load(f)
    plan = planned if planned is not None else load_plan(plan_path)
    return route_superbatch(ref.key, read_n_ids(sample_path), plan.batches, layout, ref.round_first_batch,
                            shard_rows, num_shards, out_path, epoch=ref.epoch, parents=False,
                            index_path=str(Path(out_path).with_suffix(".index.arrow")))


def _store_index_task(ref: SuperbatchRef, sample_path: str, plan_path: str, num_shards: int, out_path: str) -> dict:
    """Ginex-style index: every miss is read from the store row by row (src STORE, idx = node id)."""
    plan = load_plan(plan_path)
    records = []
    zeros = np.zeros(num_shards, np.int64)
    for j, (n_id, b) in enumerate(zip(read_n_ids(sample_path), plan.batches)):
        src = b.src.astype(np.uint8).copy()
        idx = b.idx.astype(np.int64).copy()
        miss = src == SRC_MISS
        src[miss] = SRC_STORE
        idx[miss] = n_id[miss]
        records.append(IndexRecord(ref.round_first_batch + j, ref.epoch, src, idx, b.insert_pos, b.insert_slot,
                                   zeros, zeros, zeros.astype(np.uint32), -1))
    write_index_file(out_path, records, {"key": ref.key})
    return {"key": ref.key, "store_rows": int(sum(int((r.src == SRC_STORE).sum()) for r in records))}


def _index_task(route: dict, offsets: np.ndarray, crc: np.ndarray, out_path: str) -> str:
    """Complete a routed superbatch's index with its segments' offsets and checksums and move it into place
    (or, for a route without one, write it from the routing file)."""
    if "index_path" not in route:
        write_index(route["key"], route["path"], offsets, crc, out_path)
        return out_path
    patch_segments(route["index_path"], route["index_at"], offsets, crc)
    os.replace(route["index_path"], out_path)
    return out_path


# ---------------------------------------------------------------------------- the driver

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
    store = Store(store_path)
    out = Path(out)
    store_hash = config_hash(store.manifest)
    part_key = cfg.partition_key(store_hash, cfg.num_partitions(store)) if cfg.batches == "partition" else None
    s_key = cfg.sample_key(store_hash, part_key)
    p_key = cfg.plan_key(s_key)
    k_key = cfg.pack_key(p_key)
    existing = check_replaceable(out, force, PACKED_KIND)
    if existing and not force and existing.get("config_hash") == k_key:
        return PrepareResult(out, True, time.perf_counter() - t_start, dict(existing.get("figures", {})))
    work = Path(str(out) + ".work")
    replace_foreign(work, force, WORK_KIND)
    created = not work.exists()
    try:
        work.mkdir(parents=True, exist_ok=True)
        if not (work / WORK_MARKER).exists():
            write_json(work / WORK_MARKER, {"format": WORK_FORMAT, "packed": out.name}, durable=False)
        with reuse_for_preparation():     # where the tasks run in this process (a threaded scheduler)
            try:
                return _build(store, out, work, cfg, (store_hash, s_key, p_key, k_key), quiet, t_start)
            finally:
                _let_kept_state_go()
    except BaseException as e:
        _clean_work(work, created)
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


def link_partitions(src_work: str | os.PathLike[str], dst_work: str | os.PathLike[str]) -> list[str]:
    """Hard-link the finished partition stages of the prepare cache `src_work` into `dst_work` (a prepare
    cache, made with its marker when missing), so that a prepare of another pipeline over the same store
    with the same partition options finds its partition done (the stage key says which); the stage names
    linked. Partitioning is the slowest step of an OUTRE round (minutes on the benchmarks' graph), and its
    result depends on the store and those options alone. Copies where the two are on different filesystems."""
    src, dst = Path(src_work), Path(dst_work)
    linked: list[str] = []
    for stage in sorted(src.glob("partition-*")):
        if not (stage / MANIFEST).is_file() or (dst / stage.name).exists():
            continue
        dst.mkdir(parents=True, exist_ok=True)
        if not (dst / WORK_MARKER).exists():
            write_json(dst / WORK_MARKER, {"format": WORK_FORMAT, "packed": dst.name.removesuffix(".work")},
                       durable=False)
        with atomic_path(dst / stage.name, durable=False) as tmp:
            shutil.copytree(stage, tmp, copy_function=_link_or_copy)
        linked.append(stage.name)
    return linked


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def check_outputs(out: str | os.PathLike[str], force: bool) -> None:
    """Refuse (before any work, e.g. before a cluster starts) an `out` or ``out.work`` that holds
    something other than a packed dataset / prepare cache, unless `force`."""
    check_replaceable(out, force, PACKED_KIND)
    check_replaceable(str(out) + ".work", force, WORK_KIND)


def _clean_work(work: Path, created: bool) -> None:
    """After a failed run: remove the cache stages it left unfinished (no manifest), and the
    whole cache directory when this run created it and nothing finished is left in it."""
    for d in [*work.glob("samples-*"), *work.glob("plans-*"), *work.glob("partition-*")]:
        if d.is_dir() and not (d / MANIFEST).exists():
            shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(work / "route", ignore_errors=True)
    shutil.rmtree(work / EARLY, ignore_errors=True)        # part files begun while planning: gigabytes, never reused
    release_early_maps(work / EARLY)                        # and the shards' maps they kept in this process
    (work / "layout.pkl").unlink(missing_ok=True)
    if work.is_dir():
        _remove_orphans(work)
    if created and work.is_dir() and all(e.name == WORK_MARKER or e.name.startswith(".") for e in work.iterdir()):
        shutil.rmtree(work, ignore_errors=True)


def _check_room(out: Path, nbytes: int) -> None:
    """Fail before packing when the packed dataset's filesystem cannot hold its `nbytes`.

    Names `out` (the staging directory beside it is on the same filesystem).
    """
    check_free_space({out: nbytes})


@dataclass
class _Run:
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

    def show(self) -> bool | None:
        """`compute`'s `disable` for a phase's progress bar."""
        return self.quiet or None


class _CachedStage:
    """One cached stage of prepare's work directory, ``WORK/{name}-{key[:16]}``, finished by a manifest
    holding its key: a finished stage with the same key is reused; anything else there is redone."""

    def __init__(self, work: Path, name: str, key: str) -> None:
        self.work, self.name, self.key = work, name, key
        self.path = _stage_dir(work, name, key)

    def cached(self) -> dict[str, Any] | None:
        """The manifest of this stage if it finished for this key, else None."""
        manifest = read_manifest(self.path)
        return manifest if manifest is not None and manifest.get("key") == self.key else None

    def start(self) -> Path:
        """An empty directory for the stage (whatever an earlier, unfinished run left there removed)."""
        shutil.rmtree(self.path, ignore_errors=True)
        self.path.mkdir(parents=True)
        return self.path

    def finish(self, content: dict[str, Any], drop_stale: bool = True) -> dict[str, Any]:
        """Write the manifest (the stage is done), drop this stage's results for other keys (unless told
        not to); the manifest."""
        write_manifest(self.path, {"key": self.key, **content})
        manifest = _written_manifest(self.path)
        if drop_stale:
            _drop_stale(self.work, self.name, self.path)
        return manifest


def _build(store: Store, out: Path, work: Path, cfg: PrepareConfig, keys: tuple[str, str, str, str], quiet: bool,
           t_start: float) -> PrepareResult:
    """The phases of `prepare` (sample, plan, pack) once `out` and its cache `work` may be written."""
    store_hash, s_key, p_key, k_key = keys
    # A per-run token ends every task key: a re-run on the same client never meets a cancelled
    # task of an earlier run under the same name (dashboard groups are unchanged: key_split
    # stops at the numeric token).
    run = _Run(store, out, work, cfg, round_layout(store.split_ids("train").shape[0], cfg.batch_size,
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
            run.order = _partition_phase(run, store_hash)
        # the samples follow the parts the partition stage holds, by content (a partition on several
        # threads, redone, may differ), not the config that made them
        run.parts_key = parts_fingerprint(run.order.parts)
        # the losses' label prior, checked before the expensive phases
        run.label_prior = list(label_shares(store.labels[store.split_ids("train")], store.num_classes))
    if cfg.history_split:
        with phase("split"):
            _split_phase(run, store_hash)
    if run.parts_key is not None or cfg.history_split:
        s_key = run.cfg.sample_key(store_hash, run.parts_key)
        p_key = run.cfg.plan_key(s_key)
    with phase("sample"):
        sdir, summaries, counts = _sample_phase(run, s_key)
    # While tiers and plans keep the CPUs busy the disk is idle: read the first shards ahead
    # (page cache of this machine, up to cfg.readahead) so part of the packing pass overlaps.
    with _read_ahead(store, cfg):
        with phase("plan"):
            pdir, planned_round, early_routes = _plan_phase(run, p_key, sdir, summaries, counts=counts)
        del counts
        with phase("pack"):
            figures = _pack_phase(run, (store_hash, k_key), sdir, summaries, pdir, planned_round, early_routes)
    chain_s = float(sum(float(p.get("chain_s", 0.0)) for p in planned_round["plans"]))
    return PrepareResult(out, False, time.perf_counter() - t_start, figures, phases, cpu, chain_s)


def _process_cpu() -> float:
    """User + system CPU seconds of this process so far (every thread: the threaded scheduler's tasks too)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _graph(run: _Run) -> PrepGraph:
    """The preparation graph's builder for this run (`flow.graph`), its nodes as `dask.delayed`."""
    cfg = run.cfg
    return PrepGraph(str(run.store.path), run.refs, (cfg.batch_size, cfg.fanouts, cfg.seed, cfg.sampler_threads),
                     cfg.cpu_policy, run.tok, delayed_submit, run.order,
                     (cfg.history_rows, cfg.history_staleness, cfg.history_select, cfg.history_prune)
                     if cfg.history_rows else None)


def _partition_phase(run: _Run, store_hash: str) -> BatchOrder:
    """Partition the graph into min-cut parts (cached), one Dask task: the batch order over its parts file."""
    cfg = run.cfg
    parts = cfg.num_partitions(run.store)
    stage = _CachedStage(run.work, "partition", cfg.partition_key(store_hash, parts))
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


def _split_phase(run: _Run, store_hash: str) -> None:
    """Choose the memory split (`flow.memsplit`): the caches share what the CPU tier holds without an
    embedding cache (the CPU budget less staging and I/O buffers); for every candidate share of it
    given to embeddings, sample and plan the round, count the rows the plan reads from disk, and set
    ``run.cfg`` to the split that reads the fewest (``run.split``: the curve and the choice). The
    chosen candidate's samples and plans stay cached for the phases that follow."""
    cfg = run.cfg
    part_key = run.parts_key
    rb = run.store.row_bytes
    row_cost = cfg.history_dim * EMBEDDING_BYTES
    most = run.store.num_nodes * row_cost          # an embedding for every node: more is never used
    curve: list[dict[str, Any]] = []
    configs: dict[float, PrepareConfig] = {}
    stages: dict[float, tuple[str, str]] = {}
    best: dict[str, Any] | None = None
    shared = 0
    tok = run.tok
    # staleness 1 never reuses an embedding, so no share but 0 can read less
    shares = SPLIT_SHARES[:1] if cfg.history_staleness == 1 else SPLIT_SHARES

    def evaluate(i: int, share: float) -> None:
        nonlocal shared, best
        hist = min(int(shared * share), most) // row_cost * row_cost
        if share and (hist == 0 or any(p["history_bytes"] == hist for p in curve)):
            return                      # no embedding fits, or the same cache as another share
        cand = replace(cfg, history_split=False, history_memory=hist, cpu_memory=cfg.cpu_memory - hist)
        run.cfg, run.tok = cand, f"{tok}s{i}"     # each candidate's tasks under keys of their own
        s_key = cand.sample_key(store_hash, part_key)
        p_key = cand.plan_key(s_key)
        sdir, summaries, counts = _sample_phase(run, s_key)
        _, planned, _ = _plan_phase(run, p_key, sdir, summaries, routes=False, counts=counts)
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
            shutil.rmtree(_stage_dir(run.work, "samples", beaten[0]), ignore_errors=True)
            shutil.rmtree(_stage_dir(run.work, "plans", beaten[1]), ignore_errors=True)

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
    _drop_stale(run.work, "samples", _stage_dir(run.work, "samples", s_key))
    _drop_stale(run.work, "plans", _stage_dir(run.work, "plans", p_key))
    run.split = {"budget": shared, "staleness": cfg.history_staleness, "prune": cfg.history_prune,
                 "dim": cfg.history_dim, "row_bytes": rb,
                 "curve": curve, "chosen": chosen}


def _sample_phase(run: _Run, s_key: str) -> tuple[Path, list[dict[str, Any]], Counts | None]:
    """Sample every superbatch and count its accesses (cached): the samples' directory, their summaries and,
    when sampled now, the round's counts (in memory for the tiers: None where the stage was cached)."""
    stage = _CachedStage(run.work, "samples", s_key)
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


def _plan_phase(run: _Run, p_key: str, sdir: Path, summaries: list[dict[str, Any]], routes: bool = True,
                counts: Counts | None = None) -> tuple[Path, dict[str, Any], list[dict] | None]:
    """Choose the tiers and plan every superbatch (cached): the plans' directory, their manifest (tiers and
    per-superbatch figures) and, when every miss is packed (and `routes`), the routes computed alongside
    the plans. `counts`: the round's counts when the sample phase has them in memory (else its file is read)."""
    store, cfg, tok = run.store, run.cfg, run.tok
    stage = _CachedStage(run.work, "plans", p_key)
    manifest = stage.cached()
    if manifest is not None:
        return stage.path, manifest, None
    # the plan files alone hold a source byte and an int64 slot per access
    check_free_space({run.work: sum(int(s["accesses"]) for s in summaries) * (1 + 8)})
    pdir = stage.start()
    # The sample stage's files, as the graph's sample results (the stage may come from an earlier run).
    samples = [SampleResult(r.key, None, s, {}, path=str(sdir / r.filename)) for r, s in zip(run.refs, summaries)]
    g = _graph(run)
    spec = TierSpec(cfg.gpu_memory, cfg.cpu_memory, cfg.device, cfg.staging_batches, cfg.io_reserve, cfg.gpu_policy,
                    cfg.cpu_policy)
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
            delayed_submit(_done, traces[-1], key=f"trace-done-{run.refs[k].key}-{tok}")
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
    warm = warm_shard_ids(store, cfg.readahead) if packing_now and len(run.refs) > 1 else []
    route_tasks: list[Any] = []
    save_tasks: list[Any] = []
    early: Any = None
    side: Any = trace_done if packing_now else None      # the last trace, so every trace comes first
    last = len(run.refs) - 1
    for k, (r, s, plan) in enumerate(zip(run.refs, samples, plans)):
        route = None
        if packing_now:
            route = delayed_submit(_route_task, r, s.path, str(pdir / f"{r.key}.npz"), None, store.shard_rows,
                                   len(store.shards), str(run.work / "route" / f"{r.key}.npz"), plan,
                                   after=side if k < last else None, key=f"route-{r.key}-{tok}")
            route_tasks.append(route)
            side = route
            if warm and k < last:
                side = early = delayed_submit(pack_early, str(store.path), warm, route, str(run.work / EARLY), early,
                                              final=k == last - 1, key=f"pack-early-{r.key}-{tok}")
        save_tasks.append(delayed_submit(_save_plan_task, plan, str(pdir / f"{r.key}.npz"),
                                         after=side if packing_now else None, key=f"plan-save-{r.key}-{tok}"))
        if packing_now:
            side = save_tasks[-1]
    # the tiers' figures, not the tiers: their arrays stay on the workers
    figures = delayed_submit(tier_figures, tiers, key=f"tiers-figures-{tok}")
    heads = [figures] if early is None else [figures, early]
    done = compute([*heads, *save_tasks, *route_tasks], desc="plan", disable=run.show())
    chosen, run.early = done[0], (done[1] if early is not None else {})
    stats, early_routes = done[len(heads):len(heads) + len(save_tasks)], done[len(heads) + len(save_tasks):] or None
    tier_fig = {k: chosen[k] for k in ("gpu_rows", "cpu_rows", "staging_bytes")}
    return pdir, stage.finish({"tiers": tier_fig, "plans": stats}, drop_stale=not run.keep_stale), early_routes


def _pack_phase(run: _Run, keys: tuple[str, str], sdir: Path, summaries: list[dict[str, Any]], pdir: Path,
                planned_round: dict[str, Any], early_routes: list[dict] | None) -> dict[str, Any]:
    """Layout, route, pack and index into a staging directory, then swap it into place as the packed
    dataset (its manifest last); the dataset's figures."""
    store, cfg = run.store, run.cfg
    store_hash, k_key = keys
    plan_stats, tiers = planned_round["plans"], planned_round["tiers"]
    rb, num_batches = store.row_bytes, sum(r.num_batches for r in run.refs)
    miss_rows = int(np.concatenate([np.asarray(s["batch_misses"], np.int64) for s in plan_stats]).sum())
    max_batch_rows = max(int(s["max_nodes"]) for s in summaries)
    figures: dict[str, Any] = {
        "batches": num_batches, "accesses": int(sum(int(s["accesses"]) for s in summaries)),
        "gpu_rows": tiers["gpu_rows"], "cpu_rows": tiers["cpu_rows"], "staging_bytes": tiers["staging_bytes"],
        "io_buffer_bytes": cfg.io_reserve, "max_batch_rows": max_batch_rows,
        "gpu_hits": int(sum(int(s["gpu_hits"]) for s in plan_stats)),
        "cpu_hits": int(sum(int(s["hits"]) for s in plan_stats)),
        "misses": miss_rows, "inserts": int(sum(int(s["inserts"]) for s in plan_stats)),
        "plan_miss_bytes": miss_rows * rb, "row_bytes": rb,
        "disk_budget_bytes": cfg.disk_budget,
        "batch_order": cfg.batches,
        **({"memory_split": run.split} if run.split is not None else {}),
        **({"partition": run.partition} if run.partition is not None else {}),
        **({"label_prior": run.label_prior} if run.label_prior is not None else {}),
        **({"history": {"rows": min(cfg.history_rows, store.num_nodes), "dim": cfg.history_dim, "staleness": cfg.history_staleness,
                        "bytes": min(cfg.history_rows, store.num_nodes) * cfg.history_dim * EMBEDDING_BYTES,
                        "select": cfg.history_select, "prune": cfg.history_prune,
                        "pruned": int(sum(int(s.get("pruned", 0)) for s in summaries)),
                        "pushed": int(sum(int(s.get("pushed", 0)) for s in summaries))}} if cfg.history_rows else {}),
    }
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
        _labels_into(store, stage / "labels.npy")                                 # y = labels[n_id] at train time
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
            "store": {"path": str(store.path.resolve()), "manifest_hash": store_hash},
            "dtype": store.feature_dtype.name, "dim": store.feature_dim, "row_bytes": rb,
            "num_nodes": store.num_nodes, "num_shards": len(store.shards), "shard_rows": store.shard_rows,
            "num_classes": store.num_classes, "labels": "labels.npy",
            "tiers": {"gpu_rows": int(gpu_ids.shape[0]), "cpu_rows": int(cpu_ids.shape[0]),
                      "cpu_policy": policy_id(cfg.cpu_policy), "gpu_policy": policy_id(cfg.gpu_policy)},
            "round": {"epochs": cfg.epochs, "batches": num_batches, "max_batch_rows": max_batch_rows,
                      "superbatches": [{"key": r.key, "epoch": r.epoch, "index": r.index, "batches": r.num_batches,
                                        "first_batch": r.round_first_batch} for r in run.refs]},
            "files": {"parts": parts, "dcache": dcache},
            "figures": figures,
        }
        _remove_orphans(stage)
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


def _index_store_reads(run: _Run, stage: Path, sample_paths: list[str], plan_paths: list[str], gpu_ids: np.ndarray,
                       cpu_ids: np.ndarray, figures: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """No packing (Ginex): index every miss as a read of its store row, write the tiers' rows; the part
    files (empty) and disk-cache files (none) of the manifest."""
    store, tok, P = run.store, run.tok, len(run.store.shards)
    rnd = stage / ROUND_DIR
    tasks = [delayed_submit(_store_index_task, r, sp, pp, P, str(rnd / index_name(r.key)), key=f"index-{r.key}-{tok}")
             for r, sp, pp in zip(run.refs, sample_paths, plan_paths)]
    compute(tasks, desc="index", disable=run.show())
    tier_t, _ = prepare_targets(stage, gpu_ids, cpu_ids, [], store.feature_dtype, store.feature_dim)
    compute([delayed_submit(write_tier_rows, str(store.path), p, tier_t, key=f"pack-r0-p{p}-{tok}")
             for p in range(P)], desc="tiers", disable=run.show())
    for p in range(P):     # no packed segments: empty part files keep the layout uniform
        (rnd / part_name(p)).touch()
    figures.update(packed_bytes=0, dcache_bytes=0, disk_used_bytes=0, read_amplification=None)
    return [{"path": f"{ROUND_DIR}/{part_name(p)}", "bytes": 0} for p in range(P)], []


def _pack_misses(run: _Run, stage: Path, sample_paths: list[str], plan_paths: list[str], gpu_ids: np.ndarray,
                 cpu_ids: np.ndarray, figures: dict[str, Any], early_routes: list[dict] | None, base_bytes: int,
                 miss_rows: int) -> tuple[list[dict], list[dict], str | None]:
    """Packing: the disk-cache layout when the disk budget needs one, the routes, one sequential pass over
    each shard writing packed segments, tier rows and disk-cache rows, and the index; the part files and
    disk-cache files of the manifest, and the layout file to remove once the dataset is in place."""
    store, cfg, work, tok = run.store, run.cfg, run.work, run.tok
    P, rb, rnd = len(store.shards), store.row_bytes, stage / ROUND_DIR
    num_batches = sum(r.num_batches for r in run.refs)
    pad_per_batch = P * (packed_fmt.ALIGN - 1)
    layout_path: str | None = None
    if cfg.disk_cache and cfg.disk_budget is not None and miss_rows * rb + num_batches * pad_per_batch > cfg.disk_budget:
        layout_path = str(work / "layout.pkl")
        (search,) = compute([delayed_submit(_search_task, sample_paths, plan_paths, rb, cfg.disk_budget, pad_per_batch,
                                            cfg.minhash_k, cfg.seed, store.shard_rows, layout_path,
                                            key=f"search-{tok}")], desc="search", disable=True)
        if search["segment_size"] is None:   # the exact packed bytes fit: no disk cache
            layout_path = None
        else:
            figures["segment_size"] = search["segment_size"]
    (work / "route").mkdir(exist_ok=True)
    routes = early_routes if early_routes is not None and layout_path is None else \
        compute([delayed_submit(_route_task, r, sp, pp, layout_path, store.shard_rows, P,
                                str(work / "route" / f"{r.key}.npz"), key=f"route-{r.key}-{tok}")
                 for r, sp, pp in zip(run.refs, sample_paths, plan_paths)], desc="route", disable=run.show())
    seg_rows = np.concatenate([np.asarray(x["seg_rows"], np.int64) for x in routes])
    offsets, part_bytes = segment_offsets(seg_rows, rb)
    if not cfg.disk_cache and cfg.disk_budget is not None and int(part_bytes.sum()) > cfg.disk_budget:
        raise ConfigError("--disk-budget", (
            f"packing every miss takes {format_bytes(int(part_bytes.sum()))} of disk, more than "
            f"{format_bytes(cfg.disk_budget)}, and the {cfg.pipeline} pipeline keeps no disk cache "
            "(disk_cache=False); raise --disk-budget or leave it out"))
    cache_nodes: list[np.ndarray] = []
    if layout_path is not None:
        import pickle
        with open(layout_path, "rb") as f:
            layout = pickle.load(f)
        cache_nodes = [] if layout.segment_size is None else list(layout.cache_nodes)
    _check_room(run.out, base_bytes + int(part_bytes.sum()) + int(sum(packed_fmt.padded(len(n) * rb) for n in cache_nodes)))
    tier_t, cache_t = prepare_targets(stage, gpu_ids, cpu_ids, cache_nodes, store.feature_dtype, store.feature_dim)
    route_paths = [x["path"] for x in routes]
    early = run.early if routes is early_routes else {}      # begun while planning, on the same routes
    packs = compute([delayed_submit(pack_shard, str(store.path), p, route_paths, offsets[:, p], str(rnd / part_name(p)),
                                    dcache_targets=cache_t, tier_targets=tier_t, early=early.get(p),
                                    key=f"pack-r0-p{p}-{tok}")
                     for p in range(P)], desc="pack", disable=run.show())
    crc = np.stack([np.asarray(x["crc"]) for x in packs], axis=1)
    compute([delayed_submit(_index_task, x, offsets[x["first_batch"]:x["first_batch"] + x["batches"]],
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
def _read_ahead(store: Store, cfg: PrepareConfig) -> Iterator[None]:
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
    from ..operators.formats.packed import read_index_file
    from ..operators.prepare.reorder import pages_touched

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
