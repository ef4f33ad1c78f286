"""`diskflow bench link`: link prediction on a graph whose links follow communities and features, so that
structure matters: in-memory, belady and an online pipeline (gnndrive) on the same samples, and a features-only
MLP on the same edges, side by side in one run.

The graph is `diskflow.synth`'s with ``--homophily`` of its edges inside their source's community (its features
carry the community as a weak signal), ingested undirected with a seeded link split (``--link-split``: the
validation and test shares of the edges, 100 fixed negatives each) whose training edges are split once more,
as PyG's ``disjoint_train_ratio`` does: the ``--disjoint-train-ratio`` share are the supervision edges an epoch
trains on, held out of message passing; the rest are the graph the samples are drawn from. The graph is large
while the edges trained and evaluated on are few: at the defaults 4M nodes x 256 float32 (3.8 GiB of features,
the size of `bench compare`'s) and about 59k supervision edges, 600 validation and 1,100 test edges. A link
batch of 512 edges starts from up to 2,048 endpoints (each edge's two and a negative pair's) and samples up to
about 94k rows with fanouts 10,5, so the trainer's staging is its cap (4 x 32 MiB) and the 10% budget (390 MiB)
leaves a CPU tier of two thirds of it; a smaller table would leave little more than the staging.

belady is prepared for the link task with the feature budget (``--feature-budget``, 10% of the feature bytes);
inmemory and the MLP train on belady's stored samples, so the losses of belady and inmemory must be identical;
gnndrive samples its batches online. As in `bench compare`, each run is a child process of its own (``python -m
diskflow.bench.link --child SPEC``), belady's and gnndrive's each in a memory cgroup that counts the page cache,
limited to the feature budget plus an allowance for the process itself, per kind of run (data path, model): the
peak RSS of inmemory's child of that kind less the features it holds, plus 25%, plus the assembled batches the
trainer holds beyond one and the largest epoch's sample files (read into the page cache before the epoch). The
store's and the packed dataset's files are evicted from the page cache before every run, each epoch's sample
files are read before its clock starts, disk bytes are ``read_bytes`` of ``/proc/self/io`` over the epochs, and
after the last batch of a model run the child leaves its cgroup to evaluate (evaluation is no part of the
measured epochs). Each pipeline makes a data-path run (``model="none"``) and a model run (GraphSAGE; the MLP for
the baseline); the data paths of inmemory and belady run ``--repeats`` times, interleaved, and the fastest of
each is kept (the disk's speed and the CPUs' drift by tens of percent within minutes on a shared machine).

Targets (`TARGETS`): GraphSAGE's test MRR above the MLP's (the margin), belady's data path at most 1.0x
inmemory's, belady's read amplification at most 1.05. Read amplification is disk bytes over the bytes the plan
sends to disk (belady's plan; gnndrive's: over its own misses). The floor of a data path is its disk bytes at
the disk's sequential read bandwidth, probed as `bench compare` probes it (O_DIRECT over the store's shards), the
median of three probes before the runs and three after.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from ..config import argparse_type, fanouts_option, parse_float, parse_shares
from ..errors import ConfigError, DiskflowError, InputError
from ..operators.options import CPU_SHARE, QUEUE_DEPTH
from ..operators.trainbuffers import assembled_batches
from .child import child_failure, launch_child, read_child_spec, refuse, write_child_out
from .common import drop_trees, print_table
from .harness import (
    ALLOWANCE_MARGIN,
    allowance,
    peak_rss,
    reset_peak_rss,
    samples_files,
    seq_read_bw,
    useful_bytes,
    warm_files,
)

__all__ = ["CHILD", "DEFAULT_WORKDIR", "PIPELINES", "TARGETS", "add_arguments", "child_main", "run"]

CHILD = "diskflow.bench.link"
DEFAULT_WORKDIR = Path("bench-data") / "link"
PIPELINES = ("inmemory", "belady", "gnndrive", "mlp")   # mlp: inmemory with the features-only model
# name -> (operator, bound); read_amplification is belady's
TARGETS = {"sage_over_mlp_mrr": (">", 0.0), "belady_over_inmemory_data": ("<=", 1.0),
           "read_amplification": ("<=", 1.05)}
FEATURE_SHARE = f"{CPU_SHARE:.0%}"
NODES = 4_000_000
DIM = 256
FANOUTS = (10, 5)
BATCH_SIZE = 512
HOMOPHILY = 0.9
LINK_SPLIT = (0.00001, 0.00002)
DISJOINT_TRAIN_RATIO = 0.001
NEGATIVES = 100
BW_BYTES = 512 << 20
BW_PROBES = 3
REPEATS = 3


def _shares(shares: tuple[float, ...]) -> str:
    return ",".join(f"{s:.12f}".rstrip("0").rstrip(".") for s in shares)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `diskflow bench link`."""
    p.add_argument("--workdir", default=str(DEFAULT_WORKDIR), help=f"work directory (default {DEFAULT_WORKDIR})")
    p.add_argument("--nodes", type=int, default=NODES, help=f"nodes of the synthetic graph (default {NODES})")
    p.add_argument("--dim", type=int, default=DIM, help=f"feature dimension, float32 (default {DIM})")
    p.add_argument("--homophily", type=float, default=HOMOPHILY, metavar="H",
                   help=f"share of the edges inside their source's community (default {HOMOPHILY:g})")
    p.add_argument("--link-split", type=argparse_type("--link-split", parse_shares), default=LINK_SPLIT,
                   metavar="VAL,TEST", help=f"validation and test shares of the edges, each positive ranked against "
                                            f"{NEGATIVES} fixed negatives (default {_shares(LINK_SPLIT)})")
    p.add_argument("--disjoint-train-ratio", type=argparse_type("--disjoint-train-ratio", parse_float),
                   default=DISJOINT_TRAIN_RATIO, metavar="R",
                   help=f"share of the training edges held out of message passing: the supervision edges an epoch "
                        f"trains on (default {DISJOINT_TRAIN_RATIO:g})")
    p.add_argument("--epochs", type=int, default=2, help="training epochs (default 2)")
    p.add_argument("--fanouts", type=fanouts_option(), default=FANOUTS,
                   help=f"per-hop fanouts (default {','.join(map(str, FANOUTS))})")
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE,
                   help=f"training edges per minibatch (default {BATCH_SIZE})")
    p.add_argument("--hidden", type=int, default=64, help="hidden width of the models (default 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the graph, the samples and the models (default 0)")
    p.add_argument("--feature-budget", default=FEATURE_SHARE,
                   help="host memory for features of the out-of-core pipelines, bytes or a share of the feature "
                        "bytes (default %(default)s)")
    p.add_argument("--online", default="gnndrive", help="the online pipeline compared (default gnndrive)")
    p.add_argument("--repeats", type=int, default=REPEATS,
                   help=f"data-path runs of inmemory and belady, interleaved; the fastest of each is kept "
                        f"(default {REPEATS})")
    p.add_argument("--threads", type=int, default=None, help="torch threads per child (default torch's)")
    p.add_argument("--bw-bytes", type=int, default=BW_BYTES,
                   help=f"bytes of each probe of the disk's sequential read bandwidth (default {BW_BYTES})")
    p.add_argument("--no-cgroup", action="store_true", help="run the children without memory limits")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per child process (default 1800)")


def _dataset(args: argparse.Namespace, work: Path) -> Any:
    import dask

    from ..api import synth
    from ..flow.ingest import run_ingest
    from ..operators.formats.store import Store

    raw, store = work / "raw", work / "store"
    config = (f"config-{args.nodes}-{args.dim}-{args.seed}-h{args.homophily:g}-s{_shares(args.link_split)}"
              f"-d{args.disjoint_train_ratio:g}")
    if not (store / "manifest.json").is_file() or not (work / config).is_file():
        shutil.rmtree(store, ignore_errors=True)
        for f in work.glob("config-*"):
            f.unlink()
        with dask.config.set(scheduler="threads"):
            synth(raw, nodes=args.nodes, dim=args.dim, seed=args.seed, homophily=args.homophily, force=True)
            run_ingest(raw, store, link_split=tuple(args.link_split), disjoint_train_ratio=args.disjoint_train_ratio,
                       link_negatives=NEGATIVES, to_undirected=True, force=True)
        shutil.rmtree(raw, ignore_errors=True)
        (work / config).write_text("")
    return Store(store)


def _read_bw(store: Any, nbytes: int, probes: int = BW_PROBES) -> list[float]:
    """`probes` probes of the disk's sequential read bandwidth (bytes/s), as `bench compare` probes it: O_DIRECT
    over the store's shards, up to `nbytes` a probe, each shard evicted from the page cache before it is read."""
    return [seq_read_bw(store, nbytes)[0] for _ in range(max(1, probes))]


def _ratio(a: Any, b: Any) -> float | None:
    return float(a) / float(b) if a is not None and b else None


def _met(value: Any, op: str, bound: float) -> bool | None:
    if value is None:
        return None
    return bool(value > bound) if op == ">" else bool(value <= bound)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Synthesise and ingest the graph, prepare belady, run every pipeline in its own child; the figures."""
    import dask

    from ..flow.pipeline import load_pipeline
    from ..flow.runtimes.packed import budget as parse_budget
    from .cgroup import current_procs, find_hierarchy, unavailable_reason

    hierarchy = None
    if not args.no_cgroup:
        hierarchy = find_hierarchy()
        why = unavailable_reason(hierarchy)
        if why is not None:
            raise ConfigError("--no-cgroup", f"memory cgroups are unavailable: {why}; pass --no-cgroup")
    work = Path(args.workdir).absolute()
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    store = _dataset(args, work)
    budget = parse_budget(args.feature_budget, "--feature-budget", store.feature_bytes)
    if budget is None or budget <= 0:
        raise ConfigError("--feature-budget", f"must be > 0, got {args.feature_budget!r}")
    packed = work / "packed" / "belady"
    packed.parent.mkdir(parents=True, exist_ok=True)
    with dask.config.set(scheduler="threads"):
        prep = load_pipeline("belady").prepare(store.path, packed, cpu_memory=budget, fanouts=tuple(args.fanouts),
                                               batch_size=args.batch_size, epochs=args.epochs, seed=args.seed,
                                               task="link", quiet=True)
    setup_s = time.perf_counter() - t0
    pf = prep.figures
    max_rows = int(pf["max_batch_rows"])
    fit = {"staging_bytes": pf.get("staging_bytes"), "io_buffer_bytes": pf.get("io_buffer_bytes"),
           "cpu_tier_bytes": int(pf.get("cpu_rows") or 0) * store.row_bytes,
           "assembled_batches": assembled_batches(QUEUE_DEPTH), "assembled_batch_bytes": max_rows * store.row_bytes}
    probes = _read_bw(store, args.bw_bytes)      # the disk's speed drifts: probed before the runs and after
    epoch_files = samples_files(packed)
    warm = {str(e): [str(p) for p in files] for e, files in epoch_files.items()}
    epoch_sample_bytes = max(sum(p.stat().st_size for p in files) for files in epoch_files.values())
    runs_dir = work / "runs"
    home = current_procs(hierarchy) if hierarchy is not None else None
    shared = {"store": str(store.path), "packed": str(packed), "fanouts": list(args.fanouts),
              "batch_size": args.batch_size, "epochs": args.epochs, "hidden": args.hidden, "seed": args.seed,
              "threads": args.threads, "cpu_memory": budget, "drop": [str(store.path), str(packed.parent)],
              "home_procs": str(home) if home is not None else None}
    names = {"inmemory": "inmemory", "belady": "belady", args.online: args.online, "mlp": "inmemory"}
    held = (fit["assembled_batches"] - 1) * fit["assembled_batch_bytes"] + epoch_sample_bytes
    limits: dict[str, int | None] = {"data": None, "model": None}
    allowances: dict[str, int | None] = {"data": None, "model": None}
    children: dict[str, dict[str, Any]] = {name: {"data": [], "model": None} for name in names}

    def launch(name: str, kind: str, model: str, tag: str) -> dict[str, Any]:
        pipeline = names[name]
        spec = {**shared, "name": name, "pipeline": pipeline,
                "warm": warm if name != args.online else {str(e): [] for e in range(args.epochs)},
                "runs": [{"kind": kind, "model": model, "run_dir": str(runs_dir / tag)}]}
        lim = None if pipeline == "inmemory" or args.no_cgroup else limits[kind]
        print(f"running {tag} ...", flush=True)
        r, out, refused = launch_child(CHILD, runs_dir, tag, spec, lim, args.timeout)
        done = ((out or {}).get("runs") or {}).get(kind) or {}
        done.update(limit_bytes=r.limit_bytes, cgroup_peak_bytes=r.cgroup_peak_bytes, wall_s=r.wall_s)
        if r.returncode != 0:
            done["error"] = child_failure(r, lim, args.timeout, refused)
            print(f"  {tag} failed: {done['error']}", flush=True)
        if name == "inmemory" and limits[kind] is None:
            peak = done.get("peak_rss_bytes") or 0
            if not peak:
                raise InputError(runs_dir, f"inmemory's child failed ({done.get('error')})")
            # the process without the features it holds; the assembled batches beyond inmemory's one and an
            # epoch's sample files (in the page cache) besides
            allowances[kind] = allowance(max(peak - store.feature_bytes, 0), held)
            limits[kind] = int(allowances[kind] or 0) + budget
        return done

    # the data paths: inmemory's and belady's interleaved, --repeats times each (the disk's and the CPUs' speeds
    # drift on a shared machine), the online pipeline's once; then the model runs
    for repeat in range(max(1, args.repeats)):
        for name in ("inmemory", "belady"):
            tag = f"{name}-data" + (f"-{repeat + 1}" if args.repeats > 1 else "")
            children[name]["data"].append(launch(name, "data", "none", tag))
    children[args.online]["data"].append(launch(args.online, "data", "none", f"{args.online}-data"))
    for name in names:
        children[name]["model"] = launch(name, "model", "mlp" if name == "mlp" else "sage", f"{name}-model")
    probes += _read_bw(store, args.bw_bytes)
    seq_bw = statistics.median(probes)
    drop_trees([store.path, packed.parent])
    useful = int(useful_bytes(packed).sum())
    pipelines = {name: _figures(children[name], args.epochs, useful if name == "belady" else None, seq_bw)
                 for name in names}

    def get(n: str, k: str) -> Any:
        return pipelines.get(n, {}).get(k)

    sage, mlp = get("inmemory", "test_mrr"), get("mlp", "test_mrr")
    bl, il = get("belady", "losses"), get("inmemory", "losses")
    margin = None if sage is None or mlp is None else sage - mlp
    data_ratio = _ratio(get("belady", "data_s_per_epoch"), get("inmemory", "data_s_per_epoch"))
    amplification = get("belady", "read_amplification")
    values = {"sage_over_mlp_mrr": margin, "belady_over_inmemory_data": data_ratio,
              "read_amplification": amplification}
    targets = {k: {"value": values[k], "op": op, "bound": bound, "met": _met(values[k], op, bound)}
               for k, (op, bound) in TARGETS.items()}
    accesses = int(pf.get("accesses") or 0)
    counts = (store.manifest.get("link") or {}).get("counts") or {}
    figures: dict[str, Any] = {
        "pipelines": pipelines,
        "sage_over_mlp_mrr": margin,
        "belady_sage_over_mlp_mrr": None if get("belady", "test_mrr") is None or mlp is None
        else get("belady", "test_mrr") - mlp,
        "belady_over_inmemory_data": data_ratio,
        "read_amplification": amplification,
        "targets": targets,
        "targets_met": all(t["met"] for t in targets.values()),
        "ratios": {
            "belady_data_vs_disk_floor": _ratio(get("belady", "data_s_per_epoch"), get("belady", "disk_floor_s")),
            "belady_floor_over_inmemory_data": _ratio(get("belady", "disk_floor_s"),
                                                      get("inmemory", "data_s_per_epoch")),
            f"{args.online}_over_belady_data": _ratio(get(args.online, "data_s_per_epoch"),
                                                      get("belady", "data_s_per_epoch")),
            f"{args.online}_data_vs_disk_floor": _ratio(get(args.online, "data_s_per_epoch"),
                                                        get(args.online, "disk_floor_s")),
            "belady_model_vs_inmemory": _ratio(get("belady", "model_s_per_epoch"),
                                               get("inmemory", "model_s_per_epoch")),
        },
        "losses_identical": None if bl is None or il is None else bl == il,
        "floor": {"seq_read_bw": seq_bw, "seq_read_bws": probes, "seq_read_bytes": args.bw_bytes,
                  "useful_bytes": useful, "plan_miss_bytes": pf.get("plan_miss_bytes")},
        "baseline": {"data_path": "inmemory", "mrr": "mlp"},
        "plan": {"batches": pf.get("batches"), "accesses": accesses, "cpu_hits": pf.get("cpu_hits"),
                 "misses": pf.get("misses"),
                 "hit_rate": None if not accesses else int(pf.get("cpu_hits") or 0) / accesses,
                 "cpu_rows": pf.get("cpu_rows"), "max_batch_rows": pf.get("max_batch_rows"),
                 "packed_bytes": pf.get("packed_bytes")},
        "budget_split": fit, "feature_bytes": store.feature_bytes, "feature_budget_bytes": budget,
        "cgroup_limit_bytes": None if args.no_cgroup else limits, "allowance_bytes": allowances,
        "allowance_margin": ALLOWANCE_MARGIN,
        "epoch_sample_bytes": epoch_sample_bytes, "no_cgroup": bool(args.no_cgroup), "setup_s": setup_s,
        "cores": os.cpu_count(),
        "config": {"nodes": args.nodes, "dim": args.dim, "homophily": args.homophily,
                   "link_split": list(args.link_split), "disjoint_train_ratio": args.disjoint_train_ratio,
                   "negatives": NEGATIVES, "epochs": args.epochs, "fanouts": list(args.fanouts),
                   "batch_size": args.batch_size, "hidden": args.hidden, "seed": args.seed, "online": args.online,
                   "threads": args.threads},
        "dataset": {"store": str(store.path), "nodes": store.num_nodes, "edges": store.num_edges,
                    "dim": store.feature_dim, "dtype": str(store.feature_dtype), "link_edges": counts},
    }
    shutil.rmtree(runs_dir, ignore_errors=True)
    rows = [{"pipeline": n, **{k: p.get(k) for k in ("test_auc", "test_mrr", "test_hits50", "data_s_per_epoch",
                                                    "disk_floor_s", "disk_bytes", "read_amplification",
                                                    "model_s_per_epoch")}}
            for n, p in pipelines.items()]
    print_table("link prediction", rows, ["pipeline", "test_auc", "test_mrr", "test_hits50", "data_s_per_epoch",
                                          "disk_floor_s", "disk_bytes", "read_amplification", "model_s_per_epoch"])
    for k, t in targets.items():
        value = "n/a" if t["value"] is None else f"{t['value']:.4g}"
        print(f"{k}: {value} (target {t['op']} {t['bound']:g}: {'met' if t['met'] else 'not met'})")
    print(f"losses identical (belady, inmemory): {figures['losses_identical']}; belady's data path at "
          f"{_fmt(figures['ratios']['belady_data_vs_disk_floor'])}x its disk floor "
          f"({seq_bw / 2**20:,.0f} MiB/s), the floor alone "
          f"{_fmt(figures['ratios']['belady_floor_over_inmemory_data'])}x inmemory's data path")
    return figures


def _fmt(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3g}"


def _data_figures(data: dict[str, Any], epochs: int) -> dict[str, Any] | None:
    """One data-path run's seconds per epoch and disk bytes (None: it did not finish)."""
    deps = data.get("epochs") or []
    if len(deps) != epochs:
        return None
    rep = data.get("report") or {}
    busy = ((rep.get("stages") or {}).get("load") or {}).get("busy_s")
    ds = rep.get("dataset") or {}
    return {"seconds": sum(e["seconds"] for e in deps) / epochs, "epochs": [e["seconds"] for e in deps],
            "disk_bytes": int(sum(e["read_bytes"] for e in deps)),
            "loader_read_bw": (rep.get("io") or {}).get("bytes_read", 0) / busy if busy else None,   # packed
            "online": [e["online"] for e in (rep.get("epochs") or []) if "online" in e],
            "row_bytes": ds["feature_bytes"] // ds["nodes"] if ds.get("nodes") else 0,
            "cgroup_limit_bytes": data.get("limit_bytes")}


def _figures(child: dict[str, Any], epochs: int, useful: int | None, seq_bw: float) -> dict[str, Any]:
    """A pipeline's figures: its fastest data-path run's (over the repeats) and its model run's."""
    runs = [d for d in (_data_figures(x, epochs) for x in child["data"]) if d is not None]
    best = min(runs, key=lambda d: d["seconds"]) if runs else None
    model = child["model"] or {}
    final = (model.get("report") or {}).get("final") or {}
    meps = model.get("epochs") or []
    disk = None if best is None else best["disk_bytes"]
    if useful is None and best is not None and best["online"]:
        useful = sum(e["misses"] for e in best["online"]) * best["row_bytes"]
    losses = [e["losses"] for e in ((model.get("report") or {}).get("epochs") or []) if "losses" in e]
    data_s = None if best is None else best["seconds"]
    # the floor of a pipeline that reads its rows from disk (inmemory's few bytes are no feature rows)
    floor = disk / epochs / seq_bw if disk is not None and useful and seq_bw > 0 else None
    every = [*child["data"], model]
    last = ((model.get("report") or {}).get("epochs") or [{}])[-1]
    errors = [x["error"] for x in every if x.get("error")]
    return {"test_auc": final.get("test_auc"), "test_mrr": final.get("test_mrr"), "test_hits50": final.get("test_hits"),
            "hits_k": final.get("hits_k"), "val_mrr": final.get("best_val_mrr"),
            "data_s_per_epoch": data_s, "data_s_epochs": None if best is None else best["epochs"],
            "data_s_repeats": [d["seconds"] for d in runs],
            "disk_bytes": disk, "disk_bytes_per_epoch": None if disk is None else disk // epochs,
            "useful_bytes": useful, "read_amplification": disk / useful if disk is not None and useful else None,
            "disk_floor_s": floor, "data_vs_disk_floor": _ratio(data_s, floor),
            "loader_read_bw": None if best is None else best["loader_read_bw"],
            "model_s_per_epoch": sum(e["seconds"] for e in meps) / len(meps) if len(meps) == epochs else None,
            "model_disk_bytes": int(sum(e["read_bytes"] for e in meps)) if len(meps) == epochs else None,
            "eval_s": (last.get("stage_s") or {}).get("eval"),      # validation and test, outside the epochs
            "losses": losses or None,
            "peak_rss_bytes": {"data": max((x.get("peak_rss_bytes") or 0 for x in child["data"]), default=None),
                               "model": model.get("peak_rss_bytes")},
            "cgroup_limit_bytes": {"data": None if best is None else best["cgroup_limit_bytes"],
                                   "model": model.get("limit_bytes")},
            "cgroup_peak_bytes": {"data": max((x.get("cgroup_peak_bytes") or 0 for x in child["data"]), default=None),
                                  "model": model.get("cgroup_peak_bytes")},
            "wall_s": sum(x.get("wall_s") or 0 for x in every), "error": "; ".join(errors) or None}


# ---------------------------------------------------------------------------- the child process

def child_main(argv: list[str]) -> int:
    """Entry of a child process: ``--child SPEC``; writes its figures to the spec's ``out``."""
    spec = read_child_spec(argv, CHILD)
    if spec is None:
        return 2
    try:
        mine = None
        if spec.get("home_procs"):
            from .cgroup import current_procs, find_hierarchy

            hierarchy = find_hierarchy()
            mine = current_procs(hierarchy) if hierarchy is not None else None    # this child's cgroup
        result: dict[str, Any] = {"runs": {}}
        for r in spec["runs"]:
            if mine is not None:        # back into it after a model run's evaluation outside
                mine.write_text(str(os.getpid()))
            drop_trees([Path(p) for p in spec["drop"]])
            result["runs"][r["kind"]] = _train(spec, r)
            write_child_out(spec, result)
        return 0
    except DiskflowError as e:
        return refuse(spec, e)


def _train(spec: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """One run, timing each epoch and its /proc/self/io from inside. After the last batch of a model run the
    process goes back to its parent's cgroup (where it has one) before the trainer evaluates."""
    from .prepare import proc_io

    st: dict[str, Any] = {"epochs": [], "count": 0, "n": 0, "epoch": 0, "train_peak_rss_bytes": None}

    def on_start(epoch: int, batches: int) -> None:
        warm_files(spec["warm"].get(str(epoch), []))
        st.update(epoch=epoch, n=batches, count=0, io0=proc_io(), t0=time.perf_counter())

    def on_batch(_: int) -> None:
        st["count"] += 1
        if st["count"] == st["n"]:
            io = proc_io()
            st["epochs"].append({"epoch": st["epoch"], "seconds": time.perf_counter() - st["t0"],
                                 "read_bytes": io["read_bytes"] - st["io0"]["read_bytes"]})
            if st["epoch"] == spec["epochs"] - 1:
                st["train_peak_rss_bytes"] = peak_rss()
                if spec.get("home_procs") and run["model"] != "none":     # evaluate outside the cgroup
                    Path(spec["home_procs"]).write_text(str(os.getpid()))

    run_dir = Path(run["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    reset_peak_rss()
    common = {"model": run["model"], "hidden": spec["hidden"], "seed": spec["seed"], "eval_every": spec["epochs"],
              "threads": spec["threads"], "on_batch": on_batch, "on_start": on_start}
    if spec["pipeline"] == "belady":
        from ..operators.train.trainer import train_packed

        report = train_packed(spec["packed"], run_dir, cpu_memory=spec["cpu_memory"], store=spec["store"],
                              task="link", **common)
    elif spec["pipeline"] == "inmemory":
        from ..flow.runtimes import memory

        report = memory.run(spec["store"], run_dir, fanouts=spec["fanouts"], batch_size=spec["batch_size"],
                            epochs=spec["epochs"], samples=spec["packed"], progress=False, task="link", **common)
    else:
        from ..flow.pipeline import load_pipeline

        report = load_pipeline(spec["pipeline"]).run(
            spec["store"], run_dir, fanouts=spec["fanouts"], batch_size=spec["batch_size"], epochs=spec["epochs"],
            cpu_memory=spec["cpu_memory"], progress=False, task="link", **common)
    return {"epochs": st["epochs"], "peak_rss_bytes": peak_rss(), "train_peak_rss_bytes": st["train_peak_rss_bytes"],
            "report": report}


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
