"""`diskflow bench pyg`: PyG's own `NodeLoader` over diskflow's remote backend, against the same loader
over memory-mapped features and over features in RAM, side by side in one run.

The three variants are one loader: PyG's `NodeLoader` over a ``(feature_store, graph_store)`` pair with
`diskflow.pyg.NeighborSampler`, the same `GraphStore` (its topology loaded into RAM), the same training
nodes, shuffle and sampler seeds, so every variant yields the very same batches (checked: a checksum
of every measured batch's ``x``). Only where ``x``'s rows come from differs:

* ``remote``: `diskflow.pyg.FeatureStore`: the native direct-I/O reader (O_DIRECT, many reads in
  flight) behind a row cache of the feature budget (``--feature-budget``, default 10% of the feature
  bytes);
* ``mmap``: what a PyG user does today: each feature shard ``np.load(..., mmap_mode="r")`` and the
  batch's rows indexed out of it (page faults, the page cache);
* ``inmemory``: every feature in RAM (the reference).

How it is measured (docs/design.md, "How it is measured"):

* **Out of core.** Each variant runs in its own process (``python -m diskflow.bench.pyg --child
  SPEC``); ``remote`` and ``mmap`` each in a memory cgroup whose limit counts the page cache
  (`bench.cgroup`), the same limit for both: an allowance for the process itself plus the feature
  budget. The allowance is measured unless given (``--allowance``): a probe process runs the same
  loader over features of zeros (torch and PyG imported, the topology and labels in RAM, the
  sampler's and the batches' memory) in a cgroup that only counts, and the most its cgroup is charged
  while it builds batches, plus 25%, rounded up to 16 MiB, is the allowance. (Not its peak RSS, as
  bench compare takes: that counts the shared libraries' pages, which the page cache holds for every
  process and the cgroup is not charged for; on the default graph it made the allowance 256 MiB larger,
  2.6 times the budget, all of it room for mmap's page cache.) So the row cache has the budget, and mmap has the
  budget and whatever the allowance's margin leaves for page cache. ``inmemory`` runs without a limit.
* **Cold start.** Each child evicts the store's files from the page cache
  (``posix_fadvise(DONTNEED)`` per file, `common.drop_page_cache`) before it opens them, and again
  once the topology and labels are in its RAM (no variant keeps their page cache).
* **Steady state.** ``--warmup`` batches run first, unmeasured (the row cache and the page cache
  fill); the next ``--batches`` are timed (``next()`` of the loader: sampling, feature fetch, the
  batch's assembly) and their true disk traffic is ``read_bytes`` of ``/proc/self/io`` (O_DIRECT
  reads and page faults that reach the disk count; page-cache hits do not). Read amplification is
  that over the bytes of the rows the batches ask for. ``--repeats R`` (default 3) runs every variant R
  times, interleaved, and keeps each variant's fastest run: the disk's speed moves from run to run here.

The figures: ``batches_per_s`` and ``disk_read_bytes`` of each variant, ``remote_over_mmap`` (the
ratio of batches per second; the target is >= 3), ``remote_over_inmemory``, the parameters (with the
disk's read-ahead window: a page fault of mmap reads that much around the page while the kernel sees
the window used), and per variant the details (rows, bytes asked for, amplification, memory peaks and
cgroup charge, the row cache's counters). The default graph is the other benches' (`bench.prepare`'s
8.4M nodes x 128 float32: 4 GiB of features, 10 times the budget), synthesised into ``--workdir`` once
(a few minutes on a 2-core machine; a run then takes about eight), and ``--dataset`` takes an ingested
store instead.

What bounds each variant: ``remote`` reads the batch's missed rows, so its time follows the rows a
batch asks for and the disk's random-read rate; ``mmap`` faults pages in with the read-ahead window
around them, and where a batch touches every window of the file (fanouts 10,10 from 1024 seeds touch
~79k rows of the default graph's 8.4M) it reads about the whole feature file per batch, so its time
follows the feature bytes and the disk's bandwidth. The ratio therefore grows with the graph (the
figures by graph size are in docs/results/pyg.json).
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..config import fanouts_option
from ..errors import ConfigError, DiskflowError
from ..flow.options import DEFAULT_SHARE, byte_budget, fit_default
from ..operators.formats.sizes import format_bytes, parse_bytes
from .child import child_failure, launch_child, read_child_spec, refuse, write_child_out
from .common import add_graph_arguments, drop_page_cache, print_table, read_ahead_kb
from .harness import peak_rss
from .prepare import DEFAULT_NODES  # 8.4M x 128 float32 = 4.0 GiB of features, as the other benches

__all__ = ["ALLOWANCE_MARGIN", "DEFAULT_WORKDIR", "LIMITED", "TARGETS", "VARIANTS", "add_arguments",
           "allowance_for", "run"]

VARIANTS = ("remote", "mmap", "inmemory")
LIMITED = ("remote", "mmap")             # run in the memory cgroup; inmemory is the unlimited reference
DEFAULT_WORKDIR = Path("bench-data") / "pyg"
ALLOWANCE_MARGIN = 0.25                  # on top of the probe's peak RSS
_ROUND = 16 << 20                        # the allowance is rounded up to this
TARGETS = {"remote_over_mmap": (">=", 3.0)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `diskflow bench pyg`."""
    p.add_argument("--dataset", metavar="STORE", help="an ingested store to use instead of the synthetic graph")
    add_graph_arguments(p, nodes=DEFAULT_NODES, size_note="4.0 GiB of 128-dim float32 features", train_frac=0.05,
                        train_note="~97 batches of 1024")
    p.add_argument("--workers", type=int, default=0,
                   help="Dask worker processes generating the dataset (default 0: threads)")
    p.add_argument("--seed", type=int, default=0, help="seed of the graph, the shuffle and the sampler")
    p.add_argument("--fanouts", type=fanouts_option(), default=(10, 10), help="per-hop fanouts (default 10,10)")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (default 1024)")
    p.add_argument("--warmup", type=int, default=3, help="unmeasured batches first (default 3)")
    p.add_argument("--batches", type=int, default=10, help="measured batches (default 10)")
    p.add_argument("--feature-budget", default=DEFAULT_SHARE,
                   help="host memory for features, bytes or a share of the feature bytes (default 10%%, or the "
                        "smallest that works where that is more): the row cache's budget, and with the allowance "
                        "the cgroup limit of remote and mmap")
    p.add_argument("--allowance", default=None,
                   help="memory for the process itself inside the cgroup (default: measured by a probe)")
    p.add_argument("--repeats", type=int, default=3,
                   help="run every variant this many times, interleaved, and keep each one's fastest (default 3: "
                        "on a shared machine the disk's speed moves from run to run)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one run may take (default 1800)")
    p.add_argument("--no-cgroup", action="store_true",
                   help="run without memory cgroups (no limits: the figures are then not out of core; "
                        "the table says so)")
    p.add_argument("--workdir", default=str(DEFAULT_WORKDIR),
                   help=f"where the synthetic graph and the runs go (default ./{DEFAULT_WORKDIR})")


def _check_args(args: argparse.Namespace) -> None:
    for option, value in (("--batch-size", args.batch_size), ("--batches", args.batches),
                          ("--repeats", args.repeats)):
        if value < 1:
            raise ConfigError(option, f"must be >= 1, got {value}")
    if args.warmup < 0:
        raise ConfigError("--warmup", f"must be >= 0, got {args.warmup}")


def _dataset(args: argparse.Namespace, work: Path) -> Any:
    """The store: --dataset, else the synthetic graph (made in `work` once, reused afterwards)."""
    from ..operators.formats.store import Store
    from .prepare import make_dataset

    if args.dataset:
        return Store(args.dataset)
    return Store(make_dataset(args, work))


def allowance_for(peak_rss: int) -> int:
    """The cgroup's allowance for the process itself: the probe's peak RSS plus `ALLOWANCE_MARGIN`, rounded up
    to 16 MiB."""
    return int(math.ceil(peak_rss * (1 + ALLOWANCE_MARGIN) / _ROUND) * _ROUND)


# ---------------------------------------------------------------------------- the variants' feature stores

def _feature_store(variant: str, store: Any, budget: int) -> Any:
    """The variant's `FeatureStore` over `store` (see the module docstring); ``probe``: features of zeros."""
    from ..pyg import FeatureStore, StoreFeatureStore

    class MappedFeatures(StoreFeatureStore):
        """x indexed out of the shards memory-mapped by ``np.load(mmap_mode="r")`` (the page cache)."""

        def __init__(self, store: Any) -> None:
            super().__init__(store)
            self.shards = [np.load(s.path, mmap_mode="r") for s in self.store.shards]

        def gather(self, ids: np.ndarray) -> np.ndarray:
            return self.store.gather(ids, self.shards)

    class ResidentFeatures(StoreFeatureStore):
        """x held in RAM."""

        def __init__(self, store: Any) -> None:
            super().__init__(store)
            self.x = self.store.read_features()

        def gather(self, ids: np.ndarray) -> np.ndarray:
            return np.take(self.x, ids, axis=0)

    class ZeroFeatures(StoreFeatureStore):
        """x of zeros, written (so the probe's RSS counts the batches' matrices)."""

        def gather(self, ids: np.ndarray) -> np.ndarray:
            return np.full((ids.shape[0], self.store.feature_dim), 0, self.store.feature_dtype)

    if variant == "remote":
        return FeatureStore(store, cache_memory=budget)
    return {"mmap": MappedFeatures, "inmemory": ResidentFeatures, "probe": ZeroFeatures}[variant](store)


# ---------------------------------------------------------------------------- runs in child processes

def _launch(spec: dict[str, Any], work: Path, limit: int | None, timeout: float) -> dict[str, Any]:
    """Run one child (`_child_main`) with `spec` in a cgroup of `limit` bytes (None: none); its figures."""
    r, out, refused = launch_child("diskflow.bench.pyg", work / "runs", f"pyg-{spec['variant']}-{spec['repeat']}",
                                   spec, limit, timeout)
    result: dict[str, Any] = out if out is not None else {}
    result.update(returncode=r.returncode, wall_s=r.wall_s, process_read_bytes=r.read_bytes,
                  cgroup_peak_bytes=r.cgroup_peak_bytes, oom_kills=r.oom_kills, limit_bytes=limit)
    if r.returncode != 0 or out is None:
        result["error"] = child_failure(r, limit, timeout, refused)
    return result


def _drop_store(store: Any) -> None:
    """Evict every file of the store from the page cache."""
    for p in sorted(Path(store.path).rglob("*")):
        if p.is_file():
            drop_page_cache(p)


def _charge_reader(in_cgroup: bool) -> Any:
    """A function returning the bytes this process's memory cgroup is charged now (anonymous memory and page
    cache), or None where the process runs in no cgroup of its own."""
    from .cgroup import current_procs, find_hierarchy

    h = find_hierarchy() if in_cgroup else None
    procs = current_procs(h) if h is not None else None
    if h is None or procs is None:
        return lambda: None
    usage = procs.parent / ("memory.usage_in_bytes" if h.version == 1 else "memory.current")

    def read() -> int | None:
        try:
            return int(usage.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
    return read


def _child_main(argv: list[str]) -> int:
    """Entry of a child process: ``--child SPEC`` (see `_launch`); writes its figures to the spec's ``out``.
    Settings it refuses (a `DiskflowError`) end it with their one-line reason (`child.refuse`)."""
    spec = read_child_spec(argv, "diskflow.bench.pyg")
    if spec is None:
        return 2
    try:
        write_child_out(spec, _measure(spec))
    except DiskflowError as e:
        return refuse(spec, e)
    return 0


def _measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One variant: the loader's warm-up batches, then the measured ones (time, disk bytes, x checksum)."""
    import torch
    from torch_geometric.loader import NodeLoader

    from ..operators.formats.store import Store
    from ..pyg import GraphStore, NeighborSampler
    from .prepare import proc_io

    store = Store(spec["store"])
    _drop_store(store)          # a cold start: the features, and the files loaded next
    graph = GraphStore(store, in_memory=True)
    features = _feature_store(spec["variant"], store, int(spec["budget"]))
    sampler = NeighborSampler(graph, num_neighbors=spec["fanouts"], seed=int(spec["seed"]))
    _drop_store(store)          # the topology and labels are in RAM now: no variant keeps their page cache
    charged = _charge_reader(bool(spec.get("in_cgroup")))
    most = 0
    torch.manual_seed(int(spec["seed"]))
    loader = NodeLoader((features, graph), node_sampler=sampler, input_nodes=graph.split_ids("train"),
                        batch_size=int(spec["batch_size"]), shuffle=True)

    def batches() -> Any:
        while True:         # epochs follow one another when a round has fewer batches than asked for
            yield from loader

    it = batches()
    for _ in range(int(spec["warmup"])):
        next(it)
        most = max(most, charged() or 0)
    io0 = proc_io()
    seconds, rows, checksum = 0.0, 0, 0.0
    for _ in range(int(spec["batches"])):
        t0 = time.perf_counter()
        batch = next(it)
        seconds += time.perf_counter() - t0
        rows += int(batch.n_id.numel())
        checksum += float(batch.x.double().sum())
        most = max(most, charged() or 0)
    io1 = proc_io()
    read = io1.get("read_bytes", 0) - io0.get("read_bytes", 0) if io0 and io1 else None
    asked = rows * store.row_bytes
    out: dict[str, Any] = {
        "variant": spec["variant"], "batches": int(spec["batches"]), "seconds": seconds,
        "batches_per_s": int(spec["batches"]) / seconds, "rows": rows, "rows_per_batch": rows / int(spec["batches"]),
        "requested_bytes": asked, "disk_read_bytes": read,
        "read_amplification": None if read is None or not asked else read / asked,
        "x_checksum": checksum, "peak_rss_bytes": peak_rss(), "charged_bytes": most if spec.get("in_cgroup") else None}
    if spec["variant"] == "remote":
        out["cache"] = {**features.cache.memory(), **features.cache.counters(), "slots": features.cache.slots}
    return out


# ---------------------------------------------------------------------------- the run

def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the probe and every variant; print the table; return the figures."""
    from .cgroup import unavailable_reason

    _check_args(args)
    work = Path(args.workdir).absolute()
    work.mkdir(parents=True, exist_ok=True)
    store = _dataset(args, work)
    budget = byte_budget(args.feature_budget, "--feature-budget", store.feature_bytes) or 0
    from ..pyg import RowCache

    budget = fit_default(args.feature_budget, budget, RowCache.smallest_budget(store), "feature_budget")
    slots = RowCache.layout(store, budget)[0]
    if slots < 1:
        least = RowCache.smallest_budget(store)
        raise ConfigError("--feature-budget", f"{format_bytes(budget)} does not hold the row cache's node table and "
                                              f"read buffers and one row; the smallest budget that works is "
                                              f"{least:,} bytes ({format_bytes(least)})")
    train = int(store.split_ids("train").shape[0])
    if train == 0:
        raise ConfigError("--dataset", f"{store.path} has no training nodes to draw batches from")
    no_cgroup = args.no_cgroup
    if not no_cgroup and (why := unavailable_reason()) is not None:
        raise ConfigError("--no-cgroup", f"memory cgroups are unavailable: {why}; pass --no-cgroup to run "
                                         "without memory limits (the table then says so)")
    spec = {"store": str(store.path), "fanouts": list(args.fanouts), "batch_size": args.batch_size,
            "warmup": args.warmup, "batches": args.batches, "seed": args.seed, "budget": budget}
    probe = None
    if args.allowance is not None:
        allowance = parse_bytes(args.allowance, "--allowance")
    else:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")      # a cgroup that only counts
        probe = _launch({**spec, "variant": "probe", "repeat": 0, "in_cgroup": not no_cgroup}, work,
                        None if no_cgroup else ram, args.timeout)
        if "error" in probe:
            raise ConfigError("--allowance", f"the probe run failed ({probe['error']}); give --allowance")
        allowance = allowance_for(int(probe["charged_bytes"] if probe.get("charged_bytes") else probe["peak_rss_bytes"]))
    limit = None if no_cgroup else allowance + budget
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    for r in range(args.repeats):
        for v in VARIANTS:
            cap = limit if v in LIMITED else None
            runs[v].append(_launch({**spec, "variant": v, "repeat": r, "in_cgroup": cap is not None}, work, cap,
                                   args.timeout))
    best = {v: _fastest(rs) for v, rs in runs.items()}
    figures = _figures(args, store, budget, slots, allowance, limit, probe, best, runs)
    _print(figures)
    return figures


def _fastest(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest run that finished (or the first failed one, when none did)."""
    done = [r for r in runs if "error" not in r]
    return max(done, key=lambda r: r["batches_per_s"]) if done else runs[0]


def _figures(args: argparse.Namespace, store: Any, budget: int, slots: int, allowance: int, limit: int | None,
             probe: dict[str, Any] | None, best: dict[str, dict[str, Any]],
             runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    def get(v: str, key: str) -> Any:
        return best[v].get(key)

    bps = {v: get(v, "batches_per_s") for v in VARIANTS}
    checks = [get(v, "x_checksum") for v in VARIANTS]
    ratio = (bps["remote"] / bps["mmap"]) if bps["remote"] and bps["mmap"] else None
    vs_ram = (bps["remote"] / bps["inmemory"]) if bps["remote"] and bps["inmemory"] else None
    return {
        "params": {"store": str(store.path), "nodes": store.num_nodes, "edges": store.num_edges,
                   "dim": store.feature_dim, "dtype": str(store.feature_dtype), "row_bytes": store.row_bytes,
                   "feature_bytes": store.feature_bytes, "feature_budget": args.feature_budget,
                   "budget_bytes": budget, "cache_slots": slots, "fanouts": list(args.fanouts),
                   "batch_size": args.batch_size, "warmup": args.warmup, "batches": args.batches,
                   "seed": args.seed, "repeats": args.repeats, "train_nodes": int(store.split_ids("train").shape[0]),
                   "allowance_bytes": allowance, "allowance_measured": probe is not None,
                   "probe_peak_rss_bytes": None if probe is None else probe.get("peak_rss_bytes"),
                   "probe_charged_bytes": None if probe is None else probe.get("charged_bytes"),
                   "limit_bytes": limit, "cgroup": limit is not None,
                   "read_ahead_kb": read_ahead_kb(store.shards[0].path)},
        "batches_per_s": bps,
        "disk_read_bytes": {v: get(v, "disk_read_bytes") for v in VARIANTS},
        "remote_over_mmap": ratio,
        "remote_over_inmemory": vs_ram,
        "same_batches": None not in checks and len(set(checks)) == 1,
        "targets": {k: {"op": op, "value": value, "got": ratio, "met": ratio is not None and ratio >= value}
                    for k, (op, value) in TARGETS.items()},
        "variants": best,
        "runs": {v: [r.get("batches_per_s") for r in rs] for v, rs in runs.items()},
    }


def _print(f: dict[str, Any]) -> None:
    p = f["params"]
    rows = []
    for v in VARIANTS:
        r = f["variants"][v]
        rows.append({"variant": v, "batches/s": r.get("batches_per_s") or float("nan"),
                     "rows/batch": r.get("rows_per_batch") or float("nan"),
                     "disk MB/batch": (r["disk_read_bytes"] / r["batches"] / 1e6) if r.get("disk_read_bytes") is not None
                     and r.get("batches") else float("nan"),
                     "amplif.": r.get("read_amplification") or 0.0,
                     "limit": format_bytes(r["limit_bytes"]) if r.get("limit_bytes") else "none",
                     "cgroup peak": format_bytes(r["cgroup_peak_bytes"]) if r.get("cgroup_peak_bytes") else "-",
                     "error": r.get("error", "")})
    limit = (f"cgroup limit {format_bytes(p['limit_bytes'])} = allowance {format_bytes(p['allowance_bytes'])} + "
             f"budget {format_bytes(p['budget_bytes'])}" if p["cgroup"] else "NO memory cgroup (--no-cgroup): not out of core")
    print_table(f"PyG NodeLoader, {p['nodes']:,} nodes x {p['dim']} {p['dtype']} ({format_bytes(p['feature_bytes'])} of "
                f"features), fanouts {','.join(map(str, p['fanouts']))}, batches of {p['batch_size']}: {p['batches']} "
                f"measured after {p['warmup']}; {limit}", rows,
                ["variant", "batches/s", "rows/batch", "disk MB/batch", "amplif.", "limit", "cgroup peak", "error"])
    ratio = f["remote_over_mmap"]
    t = f["targets"]["remote_over_mmap"]
    print(f"remote / mmap batches per second: {ratio:.2f}x (target >= {t['value']:g}: "
          f"{'met' if t['met'] else 'NOT met'}); remote / inmemory: {f['remote_over_inmemory']:.2f}x; "
          f"same batches in every variant: {'yes' if f['same_batches'] else 'NO'}"
          if ratio is not None and f["remote_over_inmemory"] is not None else "a variant failed: no ratio")


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
