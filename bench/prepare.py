"""`diskflow bench prepare`: offline preprocessing measured side by side in one run, on one graph.

On a synthetic graph whose node features are larger than 4 GiB (by default), with a CPU tier of
10% of the feature bytes, the benchmark measures, in one process and one run:

(a) **prepare next to its I/O floor.** The disk's sequential write (O_DIRECT, then fsync) and read
    (O_DIRECT, `common.sequential_read_bw`) bandwidths are measured on a scratch file, each the median of
    several probes (``--bw-writes``, ``--bw-reads``); the floor is
    feature bytes / read bandwidth + packed bytes / write bandwidth (docs/design.md, "Packing").
    `prepare` runs
    in this process on Dask's threaded scheduler, so ``/proc/self/io`` counts every byte its tasks
    really moved to and from the disk; its time includes fsyncing the packed dataset (writes left
    in the page cache are not done yet). The store is evicted from the page cache first. The same prepare
    then runs on one scheduler thread: the ratio of the two is the worker scaling, printed beside its
    ceiling (sample and plan divided perfectly among the workers, each run's pack phase as measured: the
    pack phase is one pass of the one disk, which more workers do not shorten).
(b) **batched vs naive packing** on the same routes, both single-threaded, page cache dropped:
    `pack_shard` for every shard (one sequential read of each shard, large writes) against
    `naivepack.pack_naive` (DiskGNN's individual packing: a random read per row, the page cache dropped
    before every batch, as when the features are several times the memory). Naive packing is run
    on the first ``--naive-batches`` batches and scaled to the round. Both outputs are checked
    against the packed index's segment checksums.
(c) **Belady vs the static CPU tier** at the same slot count on the same samples: the planned
    misses of the prepared dataset against `plan_static` with the round's hottest rows.
(d) **disk space and read amplification**: the packed-only layout (headline), then `prepare` again
    with a disk budget of ``--disk-fraction`` of the packed bytes (samples and plans reused), which
    the segmented disk cache must meet.

The dataset (``raw/``, ``store/``) is cached in ``--workdir`` and reused by later runs; the packed
outputs are removed at the end unless ``--keep``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import resource
import shutil
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..config import fanouts_option
from ..errors import ConfigError
from ..operators.formats.hashing import config_hash
from ..operators.formats.sizes import format_bytes
from ..operators.prepare.tiers import staging_piece_bytes
from .common import add_graph_arguments, drop_page_cache, print_table, sequential_read_bw

__all__ = ["DEFAULT_NODES", "DEFAULT_WORKDIR", "TARGET_ACCESSES_PER_CPU_S", "TARGET_SCALING", "TEST_FRAC",
           "VAL_FRAC", "add_arguments", "disk_bandwidth", "drop_store", "fsync_tree", "make_dataset",
           "max_batch_rows", "proc_io", "routes_from_packed", "run", "static_plan_misses"]

DEFAULT_NODES = 8_400_000          # x 128 float32 = 4.0 GiB of features
DEFAULT_WORKDIR = Path("bench-data") / "prepare"
VAL_FRAC = TEST_FRAC = 0.002       # unused by prepare; small so the raw nodes stay cheap
_BW_BLOCK = 8 << 20                # bytes per O_DIRECT request of the bandwidth measurement
TARGET_ACCESSES_PER_CPU_S = 5_000_000   # issue 'A cheap CPU box keeps a fast GPU fed'
TARGET_SCALING = 1.7


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `diskflow bench prepare`."""
    add_graph_arguments(p, nodes=DEFAULT_NODES, size_note="4.0 GiB of 128-dim float32 features", train_frac=0.006,
                        train_note="~50 batches of 1024 at the default size; ogbn-papers100M trains on 1.1%%")
    p.add_argument("--seed", type=int, default=0, help="seed of the graph and of the samples")
    p.add_argument("--fanouts", type=fanouts_option(), default=(10, 10, 10), help="per-hop fanouts (default 10,10,10)")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per minibatch (default 1024)")
    p.add_argument("--superbatch-size", type=int, default=8, help="batches per superbatch (default 8)")
    p.add_argument("--epochs", type=int, default=1, help="epochs in the round (default 1)")
    p.add_argument("--cpu-fraction", type=float, default=0.10,
                   help="CPU tier (cache slots) as a fraction of the feature bytes (default 0.10); the staging "
                        "buffers of the batches in flight are reserved on top")
    p.add_argument("--readahead-fraction", type=float, default=0.25,
                   help="feature bytes the preparing process may read into the page cache ahead of packing, "
                        "while sampling and planning keep the CPUs busy, as a fraction of the feature bytes "
                        "(default 0.25; 0 = none, packing then does the whole read)")
    p.add_argument("--disk-fraction", type=float, default=0.5,
                   help="disk budget of the second prepare, as a fraction of the packed-only bytes "
                        "(default 0.5; 0 skips it)")
    p.add_argument("--naive-batches", type=int, default=3,
                   help="batches packed naively, spread over the round and scaled to it by packed rows "
                        "(default 3; 0 = all)")
    p.add_argument("--threads", type=int, default=None, help="threads of the prepare scheduler (default: cores)")
    p.add_argument("--workers", type=int, default=None,
                   help="Dask worker processes generating the dataset (default: one per core; 0 = threads in "
                        "this process)")
    p.add_argument("--bw-bytes", type=int, default=2 << 30,
                   help="bytes written and read back to measure the disk's bandwidth (default 2 GiB)")
    p.add_argument("--bw-reads", type=int, default=3,
                   help="times the scratch file is read back; the floor uses their median (default 3)")
    p.add_argument("--bw-writes", type=int, default=3,
                   help="times the scratch file is written; the floor uses their median (default 3)")
    p.add_argument("--workdir", default=str(DEFAULT_WORKDIR),
                   help=f"where the dataset is cached and the outputs go (default ./{DEFAULT_WORKDIR}; large)")
    p.add_argument("--keep", action="store_true", help="keep the packed outputs (the dataset is always kept)")


# ---------------------------------------------------------------------------- disk and process I/O

def proc_io() -> dict[str, int]:
    """This process's I/O counters from ``/proc/self/io`` (all threads; empty dict if unavailable)."""
    try:
        with open("/proc/self/io") as f:
            return {k: int(v) for k, v in (line.split(":") for line in f)}
    except OSError:
        return {}


def _io_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int | None]:
    """Bytes that really came from / went to the block device between two `proc_io` readings."""
    if not before or not after:
        return {"disk_read_bytes": None, "disk_write_bytes": None}
    written = after["write_bytes"] - before["write_bytes"]
    written -= after.get("cancelled_write_bytes", 0) - before.get("cancelled_write_bytes", 0)
    return {"disk_read_bytes": after["read_bytes"] - before["read_bytes"], "disk_write_bytes": written}


def disk_bandwidth(directory: Path, nbytes: int, reads: int = 3, writes: int = 3
                   ) -> tuple[float, float, list[float], list[float]]:
    """(sequential read, sequential write) bandwidth in bytes/s of the disk holding `directory`, then every
    read's and every write's.

    Writes `nbytes` of random data with O_DIRECT (buffered + fsync where O_DIRECT is refused) and fsyncs,
    `writes` times over, then reads the file back `reads` times with `sequential_read_bw`, evicting it
    before each; each bandwidth is the median of its probes (this disk's speed varies from one probe to
    the next, writes as much as reads). The file is removed afterwards.
    """
    path = directory / "bw-scratch.bin"
    block = min(_BW_BLOCK, -(-max(nbytes, 1) // 4096) * 4096)
    buf = mmap.mmap(-1, block)        # page-aligned, as O_DIRECT requires
    buf.write(os.urandom(block))
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        write_bws = []
        for _ in range(max(1, writes)):
            try:
                fd = os.open(path, flags | getattr(os, "O_DIRECT", 0), 0o644)
            except OSError:
                fd = os.open(path, flags, 0o644)
            try:
                done = 0
                t0 = time.perf_counter()
                while done < nbytes:
                    done += os.pwritev(fd, [buf], done)
                os.fsync(fd)
                write_bws.append(done / (time.perf_counter() - t0))
            finally:
                os.close(fd)
        read_bws = []
        for _ in range(max(1, reads)):
            drop_page_cache(path)
            read_bws.append(sequential_read_bw(path, block=block))
    finally:
        buf.close()
        path.unlink(missing_ok=True)
    return float(np.median(read_bws)), float(np.median(write_bws)), read_bws, write_bws


def drop_store(store: Any) -> None:
    """Evict every file of a store (feature shards and topology) from the page cache."""
    for path in sorted(p for p in Path(store.path).rglob("*") if p.is_file()):
        drop_page_cache(path)


def fsync_tree(root: Path) -> float:
    """fsync every file under `root` (so written data is on the disk); return the seconds it took."""
    t0 = time.perf_counter()
    for path in sorted(root.rglob("*")):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    return time.perf_counter() - t0


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (all threads)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


@contextlib.contextmanager
def _timed_io() -> Iterator[dict[str, Any]]:
    """Measure wall time and /proc/self/io deltas of a block."""
    out: dict[str, Any] = {"load_avg": os.getloadavg()[0]}
    io0, cpu0, t0 = proc_io(), _cpu_seconds(), time.perf_counter()
    yield out
    out["seconds"] = time.perf_counter() - t0
    out["cpu_s"] = _cpu_seconds() - cpu0
    out.update(_io_delta(io0, proc_io()))


# ---------------------------------------------------------------------------- dataset

def make_dataset(args: argparse.Namespace, work: Path) -> Path:
    """The synthetic graph's store in `work` (synthesised and ingested once, reused afterwards)."""
    import dask

    from ..flow.cluster import dask_client
    from ..flow.ingest import run_ingest
    from ..flow.synth import run_synth
    from ..operators.ingest.synth import SynthConfig

    cfg = SynthConfig(num_nodes=args.nodes, feature_dim=args.dim, dtype=args.dtype, avg_degree=args.avg_degree,
                      train_frac=args.train_frac, val_frac=VAL_FRAC, test_frac=TEST_FRAC, seed=args.seed,
                      part_nodes=args.part_nodes)
    cluster = (contextlib.nullcontext() if args.workers == 0 else dask_client(n_workers=args.workers))
    with cluster, dask.config.set(scheduler="threads"):
        raw = run_synth(cfg, work / "raw")
        run_ingest(raw, work / "store")
    return work / "store"


def max_batch_rows(store: Any, prep_cfg: Any, work: Path) -> int:
    """The largest minibatch's node count in the round (what prepare's staging reserve is sized by).

    Sampled once with the same operator and seeds `prepare` uses, and cached in `work` under the
    hash of the store and the sampling config, so the CPU budget can be the tier plus exactly that
    reserve.
    """
    from ..flow.prepare.cache import sample_key
    from ..operators.prepare.superbatch import round_layout, sample_superbatch

    key = sample_key(prep_cfg, config_hash(store.manifest))
    cache = work / f"max-batch-rows-{key[:16]}.json"
    if cache.is_file():
        return int(json.loads(cache.read_text())["max_batch_rows"])
    refs = round_layout(store.split_ids("train").shape[0], prep_cfg.batch_size, prep_cfg.superbatch_size,
                        prep_cfg.epochs)
    scratch = work / "calibration.arrow"
    best = 0
    try:
        for r in refs:
            s = sample_superbatch(str(store.path), str(scratch), r, prep_cfg.batch_size, list(prep_cfg.fanouts),
                                  prep_cfg.seed, prep_cfg.sampler_threads)
            best = max(best, int(s["max_nodes"]))
    finally:
        scratch.unlink(missing_ok=True)
    cache.write_text(json.dumps({"max_batch_rows": best}))
    return best


# ---------------------------------------------------------------------------- routes, static tier

def routes_from_packed(packed: Path, store: Any, out_dir: Path, select: np.ndarray | None = None
                       ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Routing files of a packed-only dataset, rebuilt from its samples and index.

    The plan's misses are the index's packed rows (src 2), numbered in n_id order as the
    planner numbers them; `route_superbatch` then yields the same packed order, which is checked
    against the index. With `select` (sorted global batch indices), only those batches are
    routed, renumbered 0..k-1 in one routing file (a sample of the round for naive packing).

    Returns:
        (route paths, seg_rows [n, P], segment CRCs from the index [n, P]) of the routed batches.
    """
    from ..operators.formats.packed import SRC_DCACHE, SRC_PACKED, PackedDataset
    from ..operators.formats.plan import BatchPlan
    from ..operators.formats.samples import read_n_ids
    from ..operators.prepare.route import RouteFile, route_superbatch

    def route(key: str, first: int, epoch: int, n_ids: list[np.ndarray], records: list[Any]) -> str:
        plans = []
        for rec in records:
            if (rec.src == SRC_DCACHE).any():
                raise ValueError(f"{packed}: batch {rec.batch} reads a disk cache; the routes are rebuilt "
                                 "from the packed-only layout")
            miss = rec.src == SRC_PACKED
            idx = rec.idx.copy()
            idx[miss] = np.arange(int(miss.sum()))
            plans.append(BatchPlan(rec.src, idx, rec.insert_pos, rec.insert_slot))
        path = out_dir / f"{key}.npz"
        route_superbatch(key, n_ids, plans, None, first, store.shard_rows, len(store.shards), path, epoch=epoch)
        rf = RouteFile(path)
        try:
            same = np.array_equal(rf.get("idx"), np.concatenate([r.idx for r in records])) and \
                np.array_equal(rf.seg_rows, np.stack([r.seg_rows for r in records]))
        finally:
            rf.close()
        if not same:
            raise AssertionError(f"rebuilt routes of {key} disagree with the packed index")
        return str(path)

    out_dir.mkdir(parents=True, exist_ok=True)
    paths: list[str] = []
    picked_ids: list[np.ndarray] = []
    picked: list[Any] = []
    with PackedDataset(packed) as ds:
        for sb in ds.superbatches:
            records = ds.index(sb.key)
            n_ids = read_n_ids(ds.round_dir / f"samples/{sb.key}.arrow")
            if select is None:
                paths.append(route(sb.key, sb.first_batch, sb.epoch, n_ids, records))
                picked.extend(records)
                continue
            for j in np.flatnonzero(np.isin(np.arange(sb.first_batch, sb.first_batch + sb.batches), select)):
                picked_ids.append(n_ids[j])
                picked.append(records[j])
    if select is not None:
        paths = [route("sample", 0, 0, picked_ids, picked)]
    seg_rows = np.stack([r.seg_rows for r in picked]).astype(np.int64)
    crcs = np.stack([r.seg_crc for r in picked]).astype(np.int64)
    return paths, seg_rows, crcs


def static_plan_misses(packed: Path, num_nodes: int, cpu_rows: int) -> dict[str, int]:
    """Plan DiskGNN's static CPU tier (the round's hottest rows, `cpu_rows` slots) over a packed
    dataset's samples, with its GPU tier; return the access counts."""
    from ..operators.formats.packed import PackedDataset
    from ..operators.formats.samples import read_n_ids
    from ..operators.prepare.count import count_superbatch, dense_counts, merge_counts
    from ..operators.prepare.plan import plan_static, static_tier

    with PackedDataset(packed) as ds:
        paths = [ds.round_dir / f"samples/{sb.key}.arrow" for sb in ds.superbatches]
        gpu_ids = np.sort(np.asarray(ds.gpu_ids))
    freq = dense_counts(merge_counts(*(count_superbatch(p) for p in paths)), num_nodes)
    cpu = static_tier(freq, cpu_rows, gpu_ids)
    cpu = np.concatenate([cpu, np.full(cpu_rows - cpu.shape[0], -1, np.int64)])
    hits = misses = gpu_hits = 0
    for p in paths:
        plan = plan_static(read_n_ids(p), cpu, gpu_ids)
        hits, misses, gpu_hits = hits + plan.hits, misses + plan.misses, gpu_hits + plan.gpu_hits
    return {"cpu_hits": hits, "misses": misses, "gpu_hits": gpu_hits}


# ---------------------------------------------------------------------------- the measurements

def _measure_prepare(store: Any, out: Path, cfg: Any, threads: int, fresh: bool) -> dict[str, Any]:
    """Run `prepare` in this process (threaded scheduler, `threads` workers), store evicted first; fsync
    its output. Its tasks are profiled (`flow.taskprofile`): thread CPU and wall seconds per task group.
    The store's checksums are checked as it reads unless ``cfg.check_crc`` is False."""
    import dask

    from ..flow.prepare import prepare
    from ..flow.taskprofile import profile_tasks
    from ..operators.formats.storecheck import store_checks

    if fresh:
        shutil.rmtree(Path(str(out) + ".work"), ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    drop_store(store)
    with _timed_io() as m, dask.config.set(scheduler="threads", num_workers=threads), profile_tasks() as prof, \
            store_checks(cfg.check_crc):
        t0 = time.perf_counter()
        result = prepare(store.path, out, cfg, force=True, quiet=True)
        m["call_s"] = time.perf_counter() - t0
        m["sync_s"] = fsync_tree(out)
    return {"result": result, "tasks": prof.table(), "timeline": prof.timeline(t0), **m}


def _measure_batched(store: Any, route_paths: list[str], offsets: np.ndarray, out_dir: Path) -> dict[str, Any]:
    from ..operators.formats.packed import part_name
    from ..operators.prepare.pack import pack_shard

    out_dir.mkdir(parents=True, exist_ok=True)
    drop_store(store)
    with _timed_io() as m:
        packs = [pack_shard(store.path, p, route_paths, offsets, out_dir / part_name(p)) for p in range(len(store.shards))]
        m["sync_s"] = fsync_tree(out_dir)
    m["crc"] = np.stack([x["crc"] for x in packs], axis=1)
    m["bytes_read"] = int(sum(x["bytes_read"] for x in packs))
    m["bytes_written"] = int(sum(x["bytes_written"] for x in packs))
    return m


def _measure_naive(store: Any, route_paths: list[str], offsets: np.ndarray, out_dir: Path) -> dict[str, Any]:
    from .naivepack import pack_naive

    out_dir.mkdir(parents=True, exist_ok=True)
    drop_store(store)
    with _timed_io() as m:
        r = pack_naive(store.path, route_paths, offsets, out_dir, drop_cache=True, drop_every_batch=True)
        m["sync_s"] = fsync_tree(out_dir)
    m.update(crc=r["crc"], bytes_read=int(r["bytes_read"]), bytes_written=int(r["bytes_written"]))
    return m


def _scaling_ceilings(cpu_phases_1: float, pack_1: float, pack_n: float, threads: int, accesses: int
                      ) -> dict[str, float]:
    """The most the prepare could scale from one worker to `threads`, its pack phase as measured on each.

    ``ceiling``: the CPU-bound phases (sample + plan, ``cpu_phases_1`` seconds on one worker) divided
    perfectly among the workers, no serial chain. ``ceiling_at_target``: the same, had the whole prepare
    (pack included, all of it counted as divisible) cost ``TARGET_ACCESSES_PER_CPU_S``: with less CPU to
    divide, the disk-bound pack phase weighs more, so the two targets pull against each other.
    """
    def ceiling(front_1: float) -> float:
        return (front_1 + pack_1) / max(1e-9, front_1 / threads + pack_n)
    return {"ceiling": ceiling(cpu_phases_1), "ceiling_at_target": ceiling(accesses / TARGET_ACCESSES_PER_CPU_S)}


def _check_args(args: argparse.Namespace) -> None:
    for option, value in (("--nodes", args.nodes), ("--dim", args.dim), ("--batch-size", args.batch_size),
                          ("--superbatch-size", args.superbatch_size), ("--epochs", args.epochs),
                          ("--bw-bytes", args.bw_bytes), ("--bw-reads", args.bw_reads),
                          ("--bw-writes", args.bw_writes)):
        if value < 1:
            raise ConfigError(option, f"must be >= 1, got {value}")
    if not 0 < args.cpu_fraction < 1:
        raise ConfigError("--cpu-fraction", f"must be in (0, 1), got {args.cpu_fraction}")
    if not 0 <= args.readahead_fraction <= 1:
        raise ConfigError("--readahead-fraction", f"must be in [0, 1], got {args.readahead_fraction}")
    if not 0 <= args.disk_fraction:
        raise ConfigError("--disk-fraction", f"must be >= 0, got {args.disk_fraction}")
    if args.naive_batches < 0:
        raise ConfigError("--naive-batches", f"must be >= 0, got {args.naive_batches}")
    if args.threads is not None and args.threads < 1:
        raise ConfigError("--threads", f"must be >= 1, got {args.threads}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build (or reuse) the dataset, then measure (a)-(d); print the tables and return the figures."""
    from ..api import prepare_options
    from ..flow.pipeline import load_pipeline
    from ..operators.formats.store import Store
    from ..operators.prepare.route import segment_offsets

    _check_args(args)
    work = Path(args.workdir).absolute()
    work.mkdir(parents=True, exist_ok=True)
    threads = args.threads or os.cpu_count() or 1
    t_setup = time.perf_counter()
    store = Store(make_dataset(args, work))
    feature_bytes = store.num_nodes * store.row_bytes
    belady = load_pipeline("belady")
    round_opts = {"fanouts": tuple(args.fanouts), "batch_size": args.batch_size,
                  "superbatch_size": args.superbatch_size, "epochs": args.epochs, "seed": args.seed}
    base = belady.prepare_config(**prepare_options(belady, store, **round_opts))
    staging = base.staging_batches * staging_piece_bytes(max_batch_rows(store, base, work), store.row_bytes,
                                                         len(store.shards))
    tier_bytes = int(args.cpu_fraction * feature_bytes)
    options = prepare_options(belady, store, cpu_memory=tier_bytes + staging,
                              readahead=int(args.readahead_fraction * feature_bytes), **round_opts)
    # the CPU budget is the tier and the staging buffers alone, so the tier is --cpu-fraction of the features:
    # no I/O buffers are reserved out of it
    cfg = belady.prepare_config(**{**options, "io_reserve": 0})
    setup_s = time.perf_counter() - t_setup

    read_bw, write_bw, read_bws, write_bws = disk_bandwidth(work, args.bw_bytes, args.bw_reads, args.bw_writes)
    out = work / "packed"
    scratch = work / "scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        # (a) prepare, packed only, next to its floor
        head = _measure_prepare(store, out, cfg, threads, fresh=True)
        res = head["result"]
        fig = res.figures
        prepare_s = head["seconds"]
        packed_bytes = int(fig["packed_bytes"])
        floor_read_s = feature_bytes / read_bw
        floor_write_s = packed_bytes / write_bw
        floor_s = floor_read_s + floor_write_s
        io_floor_s = ((head["disk_read_bytes"] or 0) / read_bw + (head["disk_write_bytes"] or 0) / write_bw)

        # the store's checksums: the same prepare with its reads unchecked, then checked again (alternated,
        # so that a drift of the shared machine is seen); on costs min(checked runs) / the unchecked run
        unchecked = _measure_prepare(store, out, replace(cfg, check_crc=False), threads, fresh=True)
        checked = _measure_prepare(store, out, cfg, threads, fresh=True)
        crc_on = [prepare_s, checked["seconds"]]
        store_crc = {"on_s": crc_on, "off_s": unchecked["seconds"],
                     "on_over_off": min(crc_on) / unchecked["seconds"]}

        # the same prepare with one scheduler thread: how the graph scales with Dask workers
        single = _measure_prepare(store, out, cfg, 1, fresh=True) if threads > 1 else None

        # (c) the static tier at the same slot count, on the same samples
        static = static_plan_misses(out, store.num_nodes, int(fig["cpu_rows"]))

        # (b) batched vs naive packing on the same routes
        routes, seg_rows, index_crc = routes_from_packed(out, store, scratch / "routes")
        offsets, _ = segment_offsets(seg_rows, store.row_bytes)
        batched = _measure_batched(store, routes, offsets, scratch / "batched")
        if not np.array_equal(batched["crc"], index_crc):
            raise AssertionError("batched packing wrote segments whose CRCs differ from the packed index")
        shutil.rmtree(scratch / "batched", ignore_errors=True)
        n = seg_rows.shape[0]
        k = n if args.naive_batches == 0 else min(args.naive_batches, n)
        select = np.unique((2 * np.arange(k) + 1) * n // (2 * k))   # the middle batch of k equal strata
        kroutes, kseg, kcrc = routes_from_packed(out, store, scratch / "routes-naive", select=select)
        koffsets, _ = segment_offsets(kseg, store.row_bytes)
        naive = _measure_naive(store, kroutes, koffsets, scratch / "naive")
        if not np.array_equal(naive["crc"], kcrc):
            raise AssertionError("naive packing wrote segments whose CRCs differ from the packed index")
        k = int(select.shape[0])
        naive_rows = int(kseg.sum())
        naive_round_s = naive["seconds"] * int(seg_rows.sum()) / max(1, naive_rows)   # one random read per row
        shutil.rmtree(scratch, ignore_errors=True)

        # (d) a tight disk budget: the segmented disk cache (samples and plans reused)
        budgeted: dict[str, Any] = {}
        if args.disk_fraction > 0:
            budget = int(args.disk_fraction * packed_bytes)
            try:
                b = _measure_prepare(store, out, replace(cfg, disk_budget=budget), threads, fresh=False)
                bf = b["result"].figures
                budgeted = {"disk_budget_bytes": budget, "disk_used_bytes": int(bf["disk_used_bytes"]),
                            "packed_bytes": int(bf["packed_bytes"]), "dcache_bytes": int(bf["dcache_bytes"]),
                            "segment_size": bf.get("segment_size"), "read_amplification": bf["read_amplification"],
                            "prepare_s": b["seconds"], "phases": b["result"].phases}
            except ConfigError as e:
                budgeted = {"disk_budget_bytes": budget, "error": str(e)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(Path(str(out) + ".work"), ignore_errors=True)

    accesses = int(fig["accesses"])
    scaling: dict[str, Any] = {}
    if single is not None:
        one = single["result"]
        scaling = {"threads": [1, threads], "prepare_s": [single["seconds"], prepare_s],
                   "worker_scaling": single["seconds"] / prepare_s,
                   "phases": {k: [one.phases[k], res.phases[k]] for k in res.phases},
                   "phase_scaling": {k: one.phases[k] / res.phases[k] for k in res.phases if res.phases[k] > 0},
                   "cpu_s": [single["cpu_s"], head["cpu_s"]],
                   "plan_chain_s": [one.chain_s, res.chain_s],
                   # the CPU-bound phases alone: what more workers can speed up (packing is the disk's)
                   "cpu_phases_s": [sum(r.phases.get(k, 0.0) for k in ("sample", "plan")) for r in (one, res)]}
        scaling["cpu_phases_scaling"] = scaling["cpu_phases_s"][0] / max(1e-9, scaling["cpu_phases_s"][1])
        scaling.update(_scaling_ceilings(scaling["cpu_phases_s"][0], one.phases.get("pack", 0.0),
                                         res.phases.get("pack", 0.0), threads, accesses))
    belady_miss_bytes = int(fig["plan_miss_bytes"])
    static_miss_bytes = static["misses"] * store.row_bytes
    figures: dict[str, Any] = {
        "prepare_s": prepare_s, "floor_s": floor_s, "prepare_over_floor": prepare_s / floor_s,
        "accesses_per_cpu_s": accesses / head["cpu_s"] if head["cpu_s"] > 0 else None,
        "worker_scaling": scaling.get("worker_scaling"), "scaling": scaling,
        "serial_chain_s": res.chain_s, "serial_chain_share": res.chain_s / prepare_s,
        "phase_cpu_s": dict(res.phase_cpu), "tasks": head["tasks"], "timeline": head["timeline"],
        "seq_read_bws": read_bws, "seq_write_bws": write_bws,
        "batched_over_naive": naive_round_s / batched["seconds"],
        "belady_miss_bytes": belady_miss_bytes, "static_miss_bytes": static_miss_bytes,
        "disk_used_bytes": budgeted.get("disk_used_bytes", int(fig["disk_used_bytes"])),
        "disk_budget_bytes": budgeted.get("disk_budget_bytes"),
        "read_amplification": fig["read_amplification"],
        "seq_read_bw": read_bw, "seq_write_bw": write_bw,
        "feature_bytes": feature_bytes, "packed_bytes": packed_bytes, "num_nodes": store.num_nodes,
        "num_shards": len(store.shards), "batches": int(fig["batches"]), "accesses": accesses,
        "cpu_rows": int(fig["cpu_rows"]), "cpu_memory": cfg.cpu_memory, "readahead_bytes": cfg.readahead, "staging_bytes": int(fig["staging_bytes"]),
        "floor_read_s": floor_read_s, "floor_write_s": floor_write_s, "io_floor_s": io_floor_s,
        "prepare_call_s": head["call_s"], "prepare_sync_s": head["sync_s"], "phases": dict(res.phases),
        "prepare_cpu_s": head["cpu_s"], "load_avg": head["load_avg"], "batched_cpu_s": batched["cpu_s"],
        "prepare_disk_read_bytes": head["disk_read_bytes"], "prepare_disk_write_bytes": head["disk_write_bytes"],
        "raw_bytes_read": fig.get("raw_bytes_read"), "packed_only_disk_used_bytes": int(fig["disk_used_bytes"]),
        "batched_s": batched["seconds"], "batched_disk_read_bytes": batched["disk_read_bytes"],
        "naive_s": naive["seconds"], "naive_batches": k, "naive_batch_ids": select.tolist(),
        "naive_rows": naive_rows, "packed_rows": int(seg_rows.sum()), "naive_round_s": naive_round_s,
        "naive_us_per_row": 1e6 * naive["seconds"] / max(1, naive_rows),
        "naive_disk_read_bytes": naive["disk_read_bytes"], "naive_rows_bytes": naive["bytes_read"],
        "belady": {"cpu_hits": int(fig["cpu_hits"]), "misses": int(fig["misses"]), "inserts": int(fig["inserts"])},
        "static": static, "budgeted": budgeted, "threads": threads, "setup_s": setup_s,
        "store_crc": store_crc,
    }
    _print(figures, args, store)
    return figures


# ---------------------------------------------------------------------------- tables

def _bytes(n: float | None) -> str:
    return "-" if n is None else format_bytes(n)


def _print(f: dict[str, Any], args: argparse.Namespace, store: Any) -> None:
    bw_r, bw_w = f["seq_read_bw"], f["seq_write_bw"]
    ph = f["phases"]
    title = (f"prepare of {f['num_nodes']:,} nodes x {args.dim} {args.dtype} ({_bytes(f['feature_bytes'])} of features, "
             f"{f['num_shards']} shards), {f['batches']} batches of {args.batch_size}, fanouts "
             f"{','.join(map(str, args.fanouts))}, superbatch {args.superbatch_size}, CPU tier "
             f"{args.cpu_fraction:.0%} of the features ({f['cpu_rows']:,} rows) + {_bytes(f['staging_bytes'])} "
             f"staging; read-ahead {_bytes(f['readahead_bytes'])} ({args.readahead_fraction:.0%} of the features: "
             f"shards read into the page cache while sampling and planning); threaded scheduler, {f['threads']} "
             f"threads, in this process")
    print_table(title + "\n(a) prepare next to its I/O floor", [
        {"what": "disk sequential read", "seconds": "", "bytes": _bytes(args.bw_bytes), "rate": _bytes(bw_r) + "/s",
         "note": "O_DIRECT, 8 MiB requests; median of " + ", ".join(_bytes(b) + "/s" for b in f["seq_read_bws"])},
        {"what": "disk sequential write", "seconds": "", "bytes": _bytes(args.bw_bytes), "rate": _bytes(bw_w) + "/s",
         "note": "O_DIRECT, then fsync; median of " + ", ".join(_bytes(b) + "/s" for b in f["seq_write_bws"])},
        {"what": "floor: read features", "seconds": f["floor_read_s"], "bytes": _bytes(f["feature_bytes"]),
         "rate": _bytes(bw_r) + "/s", "note": "at the read bandwidth"},
        {"what": "floor: write packed", "seconds": f["floor_write_s"], "bytes": _bytes(f["packed_bytes"]),
         "rate": _bytes(bw_w) + "/s", "note": "at the write bandwidth"},
        {"what": "floor", "seconds": f["floor_s"], "bytes": "", "rate": "", "note": ""},
        {"what": "prepare (incl. fsync)", "seconds": f["prepare_s"], "bytes": "", "rate": "",
         "note": f"{f['prepare_over_floor']:.2f}x the floor"},
        *({"what": f"  phase {name}", "seconds": sec, "bytes": "", "rate": "",
           "note": f"{f['phase_cpu_s'].get(name, 0):.2f} CPU s"} for name, sec in ph.items()),
        {"what": "  fsync of the output", "seconds": f["prepare_sync_s"], "bytes": "", "rate": "", "note": ""},
        {"what": "  CPU time", "seconds": f["prepare_cpu_s"], "bytes": "", "rate": "",
         "note": f"all threads: {f['accesses_per_cpu_s'] or 0:,.0f} feature accesses per CPU second"},
        {"what": "  serial plan chain", "seconds": f["serial_chain_s"], "bytes": "", "rate": "",
         "note": f"{f['serial_chain_share']:.0%} of the wall time"},
        {"what": "  disk read", "seconds": "", "bytes": _bytes(f["prepare_disk_read_bytes"]), "rate": "",
         "note": "/proc/self/io"},
        {"what": "  disk write", "seconds": "", "bytes": _bytes(f["prepare_disk_write_bytes"]), "rate": "",
         "note": "/proc/self/io"},
    ], ["what", "seconds", "bytes", "rate", "note"])
    crc = f["store_crc"]
    print(f"store checksums: prepare {' / '.join(f'{s:.2f}' for s in crc['on_s'])} s with the store's reads checked, "
          f"{crc['off_s']:.2f} s unchecked (--no-crc): checked costs {crc['on_over_off'] - 1:+.1%} "
          "(best checked run over the unchecked one)")
    print(f"machine load average {f['load_avg']:.1f} at the start (2 cores, shared). "
          f"Pack tasks read {_bytes(f['raw_bytes_read'])} of shards; every byte /proc/self/io counted, moved at "
          f"those bandwidths, takes {f['io_floor_s']:.1f} s (samples, plans, routes, tier rows included).")

    print_table("where the CPU goes: prepare's tasks by group (thread CPU of the task itself; helper threads, "
                "e.g. a pack task's writer, count in the process CPU above only)",
                [{"group": t["group"], "tasks": t["tasks"], "CPU s": t["cpu_s"], "wall s": t["wall_s"],
                  "accesses/CPU s": f["accesses"] / t["cpu_s"] if t["cpu_s"] > 0 else "-"} for t in f["tasks"]],
                ["group", "tasks", "CPU s", "wall s", "accesses/CPU s"])
    sc = f["scaling"]
    if sc:
        print_table(f"scaling with Dask workers: the same prepare on 1 and {sc['threads'][1]} scheduler threads "
                    "(store evicted before each)", [
                        {"phase": name, "1 worker s": a, f"{sc['threads'][1]} workers s": b,
                         "ratio": sc["phase_scaling"].get(name, "-")} for name, (a, b) in sc["phases"].items()
                    ] + [{"phase": "prepare", "1 worker s": sc["prepare_s"][0], f"{sc['threads'][1]} workers s":
                          sc["prepare_s"][1], "ratio": sc["worker_scaling"]},
                         {"phase": "sample + plan (CPU-bound)", "1 worker s": sc["cpu_phases_s"][0],
                          f"{sc['threads'][1]} workers s": sc["cpu_phases_s"][1], "ratio": sc["cpu_phases_scaling"]},
                         {"phase": "serial plan chain", "1 worker s": sc["plan_chain_s"][0],
                          f"{sc['threads'][1]} workers s": sc["plan_chain_s"][1], "ratio": "-"}],
                    ["phase", "1 worker s", f"{sc['threads'][1]} workers s", "ratio"])
        print("The pack phase is one pass of the disk on either count of workers: the whole prepare scales only as "
              "far as its CPU-bound phases shorten. Each task's span and thread: the JSON's `timeline`.")
        print(f"Ceiling, with the pack phases as measured: {sc['ceiling']:.2f}x had sample + plan divided perfectly "
              f"among the workers; {sc['ceiling_at_target']:.2f}x had the whole prepare also cost "
              f"{TARGET_ACCESSES_PER_CPU_S:,} accesses per CPU second (less CPU to divide beside the same disk pass).")
    scaled = f"{f['worker_scaling']:.2f}x" if f["worker_scaling"] else "not measured (one core)"
    print(f"targets (issue 'A cheap CPU box keeps a fast GPU fed'): prepare <= 1.5x the floor: "
          f"{f['prepare_over_floor']:.2f}x; >= {TARGET_ACCESSES_PER_CPU_S:,} accesses per CPU second: "
          f"{f['accesses_per_cpu_s'] or 0:,.0f}; worker scaling >= {TARGET_SCALING}x: {scaled}")

    n, k = f["batches"], f["naive_batches"]
    print_table("(b) packing the same routes, one thread each, page cache dropped (naive: before every batch)", [
        {"packing": "batched (pack_shard per shard)", "batches run": n, "rows": f["packed_rows"],
         "seconds": f["batched_s"], "round s": f["batched_s"], "disk read": _bytes(f["batched_disk_read_bytes"]),
         "ratio": 1.0},
        {"packing": "naive (pack_naive, a read per row)", "batches run": k, "rows": f["naive_rows"],
         "seconds": f["naive_s"], "round s": f["naive_round_s"], "disk read": _bytes(f["naive_disk_read_bytes"]),
         "ratio": f["batched_over_naive"]},
    ], ["packing", "batches run", "rows", "seconds", "round s", "disk read", "ratio"])
    if k < n:
        print(f"naive packing ran on {k} of the {n} batches, spread over the round ({f['naive_batch_ids']}), "
              f"{f['naive_rows']:,} of {f['packed_rows']:,} packed rows; its round time is scaled by packed rows "
              "(one random read per row)")

    b, s = f["belady"], f["static"]
    print_table(f"(c) CPU tier at equal budget ({f['cpu_rows']:,} slots), same {f['accesses']:,} accesses", [
        {"CPU tier": "Belady (chained, planned)", "CPU hits": b["cpu_hits"], "misses": b["misses"],
         "miss bytes": _bytes(f["belady_miss_bytes"]), "vs static": f["belady_miss_bytes"] / max(1, f["static_miss_bytes"])},
        {"CPU tier": "static (hottest rows)", "CPU hits": s["cpu_hits"], "misses": s["misses"],
         "miss bytes": _bytes(f["static_miss_bytes"]), "vs static": 1.0},
    ], ["CPU tier", "CPU hits", "misses", "miss bytes", "vs static"])

    bud = f["budgeted"]
    rows = [{"layout": "packed only", "disk budget": "none", "disk used": _bytes(f["packed_only_disk_used_bytes"]),
             "segment size": "-", "read amplification": f["read_amplification"], "prepare s": f["prepare_s"]}]
    if bud:
        rows.append({"layout": f"disk budget {args.disk_fraction:g} x packed",
                     "disk budget": _bytes(bud["disk_budget_bytes"]),
                     "disk used": _bytes(bud.get("disk_used_bytes")), "segment size": bud.get("segment_size", "-"),
                     "read amplification": bud.get("read_amplification", "-"),
                     "prepare s": bud.get("prepare_s", "failed")})
    print_table("(d) disk space and read amplification (pages read / useful bytes)", rows,
                ["layout", "disk budget", "disk used", "segment size", "read amplification", "prepare s"])
    if "error" in bud:
        print(f"the budgeted prepare failed: {bud['error']}")
