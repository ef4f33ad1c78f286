"""`diskflow bench link`: link prediction on a graph whose links follow communities and features, so that
structure matters: in-memory, belady and an online pipeline (gnndrive) on the same samples, and a features-only
MLP on the same edges, side by side in one run.

The graph is `diskflow.synth`'s (its edges follow communities, its features carry a class signal), ingested with
a link split (5% validation, 10% test edges, 100 negatives each, undirected). belady is prepared for the link task
with the feature budget (``--feature-budget``, 10% of the feature bytes); inmemory and the MLP train on belady's
stored samples, so the losses of belady and inmemory must be identical; gnndrive samples its batches online.
As in `bench compare`, each pipeline runs in a child process of its own (``python -m diskflow.bench.link --child
SPEC``), belady and gnndrive each in a memory cgroup that counts the page cache, limited to the feature budget plus
an allowance (the peak RSS of inmemory's child, which holds every feature, plus 25%); the store's and the
packed dataset's files are evicted from the page cache before every run, each epoch's sample files are read
before its clock starts, and disk bytes are ``read_bytes`` of ``/proc/self/io`` over the epochs. Each pipeline
makes a data-path run (``model="none"``) and a model run (GraphSAGE; the MLP for the baseline). Read
amplification is disk bytes over the bytes belady's plan sends to disk (gnndrive's: over its own misses).
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ..config import fanouts_option
from ..errors import ConfigError, DiskflowError, InputError
from ..operators.options import CPU_SHARE
from .child import child_failure, launch_child, read_child_spec, refuse, write_child_out
from .common import drop_trees, print_table
from .harness import allowance, peak_rss, reset_peak_rss, samples_files, useful_bytes, warm_files

__all__ = ["CHILD", "DEFAULT_WORKDIR", "PIPELINES", "TARGETS", "add_arguments", "child_main", "run"]

CHILD = "diskflow.bench.link"
DEFAULT_WORKDIR = Path("bench-data") / "link"
PIPELINES = ("inmemory", "belady", "gnndrive", "mlp")   # mlp: inmemory with the features-only model
TARGETS = {"sage_over_mlp_mrr": (">", 0.0), "belady_over_inmemory_data": ("<=", 1.0),
           "read_amplification": ("<=", 1.05)}
FEATURE_SHARE = f"{CPU_SHARE:.0%}"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `diskflow bench link`."""
    p.add_argument("--workdir", default=str(DEFAULT_WORKDIR), help=f"work directory (default {DEFAULT_WORKDIR})")
    p.add_argument("--nodes", type=int, default=200_000, help="nodes of the synthetic graph (default 200000)")
    p.add_argument("--dim", type=int, default=64, help="feature dimension (default 64)")
    p.add_argument("--epochs", type=int, default=2, help="training epochs (default 2)")
    p.add_argument("--fanouts", type=fanouts_option(), default=(10, 5), help="per-hop fanouts (default 10,5)")
    p.add_argument("--batch-size", type=int, default=512, help="training edges per minibatch (default 512)")
    p.add_argument("--hidden", type=int, default=64, help="hidden width of the models (default 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of the graph, the samples and the models (default 0)")
    p.add_argument("--feature-budget", default=FEATURE_SHARE,
                   help=f"host memory for features of the out-of-core pipelines (default {FEATURE_SHARE})")
    p.add_argument("--online", default="gnndrive", help="the online pipeline compared (default gnndrive)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per child (default torch's)")
    p.add_argument("--no-cgroup", action="store_true", help="run the children without memory limits")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per child process (default 1800)")


def _dataset(args: argparse.Namespace, work: Path) -> Any:
    import dask

    from ..api import synth
    from ..flow.ingest import run_ingest
    from ..operators.formats.store import Store

    raw, store = work / "raw", work / "store"
    if not (store / "manifest.json").is_file() or not (work / f"config-{args.nodes}-{args.dim}-{args.seed}").is_file():
        shutil.rmtree(store, ignore_errors=True)
        for f in work.glob("config-*"):
            f.unlink()
        with dask.config.set(scheduler="threads"):
            synth(raw, nodes=args.nodes, dim=args.dim, seed=args.seed, force=True)
            run_ingest(raw, store, link_split=(0.05, 0.1), link_negatives=100, to_undirected=True, force=True)
        shutil.rmtree(raw, ignore_errors=True)
        (work / f"config-{args.nodes}-{args.dim}-{args.seed}").write_text("")
    return Store(store)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Synthesise and ingest the graph, prepare belady, run every pipeline in its own child; the figures."""
    import dask

    from ..flow.pipeline import load_pipeline
    from ..flow.runtimes.packed import budget as parse_budget
    from .cgroup import find_hierarchy, unavailable_reason

    if not args.no_cgroup:
        why = unavailable_reason(find_hierarchy())
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
    warm = {str(e): [str(p) for p in files] for e, files in samples_files(packed).items()}
    runs_dir = work / "runs"
    shared = {"store": str(store.path), "packed": str(packed), "fanouts": list(args.fanouts),
              "batch_size": args.batch_size, "epochs": args.epochs, "hidden": args.hidden, "seed": args.seed,
              "threads": args.threads, "cpu_memory": budget, "drop": [str(store.path), str(packed.parent)]}
    names = {"inmemory": "inmemory", "belady": "belady", args.online: args.online, "mlp": "inmemory"}
    children: dict[str, dict[str, Any]] = {}
    limit = None
    for name, pipeline in names.items():
        runs = [{"kind": "data", "model": "none"}, {"kind": "model", "model": "sage"}] if name != "mlp" else \
            [{"kind": "model", "model": "mlp"}]
        spec = {**shared, "name": name, "pipeline": pipeline,
                "warm": warm if name != args.online else {str(e): [] for e in range(args.epochs)},
                "runs": [{**r, "run_dir": str(runs_dir / f"{name}-{r['kind']}")} for r in runs]}
        lim = None if pipeline == "inmemory" or args.no_cgroup else limit
        print(f"running {name} ...", flush=True)
        r, out, refused = launch_child(CHILD, runs_dir, name, spec, lim, args.timeout)
        done = out if out is not None else {"runs": {}}
        done.update(limit_bytes=r.limit_bytes, cgroup_peak_bytes=r.cgroup_peak_bytes, wall_s=r.wall_s)
        if r.returncode != 0:
            done["error"] = child_failure(r, lim, args.timeout, refused)
            print(f"  {name} failed: {done['error']}", flush=True)
        children[name] = done
        if name == "inmemory":
            peak = max((x.get("peak_rss_bytes") or 0) for x in done["runs"].values()) if done["runs"] else 0
            if not peak:
                raise InputError(runs_dir, f"inmemory's child failed ({done.get('error')})")
            limit = allowance(peak, 0) + budget
    drop_trees([store.path, packed.parent])
    useful = int(useful_bytes(packed).sum())
    pipelines = {name: _figures(children[name], args.epochs, useful if name == "belady" else None)
                 for name in names}

    def get(n: str, k: str) -> Any:
        return pipelines.get(n, {}).get(k)

    sage, mlp = get("inmemory", "test_mrr"), get("mlp", "test_mrr")
    bd, idata = get("belady", "data_s_per_epoch"), get("inmemory", "data_s_per_epoch")
    bl, il = get("belady", "losses"), get("inmemory", "losses")
    figures: dict[str, Any] = {
        "pipelines": pipelines,
        "sage_over_mlp_mrr": None if sage is None or mlp is None else sage - mlp,
        "belady_sage_over_mlp_mrr": None if get("belady", "test_mrr") is None or mlp is None
        else get("belady", "test_mrr") - mlp,
        "belady_over_inmemory_data": bd / idata if bd is not None and idata else None,
        "losses_identical": None if bl is None or il is None else bl == il,
        "targets": {k: list(v) for k, v in TARGETS.items()},
        "floor": {"useful_bytes": useful, "plan_miss_bytes": prep.figures.get("plan_miss_bytes")},
        "baseline": {"data_path": "inmemory", "mrr": "mlp"},
        "feature_bytes": store.feature_bytes, "feature_budget_bytes": budget, "cgroup_limit_bytes": limit,
        "no_cgroup": bool(args.no_cgroup), "setup_s": setup_s, "cores": os.cpu_count(),
        "config": {"nodes": args.nodes, "dim": args.dim, "epochs": args.epochs, "fanouts": list(args.fanouts),
                   "batch_size": args.batch_size, "hidden": args.hidden, "seed": args.seed, "online": args.online},
        "dataset": {"store": str(store.path), "nodes": store.num_nodes, "edges": store.num_edges,
                    "dim": store.feature_dim},
    }
    shutil.rmtree(runs_dir, ignore_errors=True)
    rows = [{"pipeline": n, **{k: p.get(k) for k in ("test_auc", "test_mrr", "test_hits50", "data_s_per_epoch",
                                                    "disk_bytes", "read_amplification")}}
            for n, p in pipelines.items()]
    print_table("link prediction", rows, ["pipeline", "test_auc", "test_mrr", "test_hits50", "data_s_per_epoch",
                                          "disk_bytes", "read_amplification"])
    print(f"sage over mlp MRR: {figures['sage_over_mlp_mrr']}; belady / inmemory data path: "
          f"{figures['belady_over_inmemory_data']}; losses identical: {figures['losses_identical']}")
    return figures


def _figures(child: dict[str, Any], epochs: int, useful: int | None) -> dict[str, Any]:
    runs = child.get("runs", {})
    data, model = runs.get("data") or {}, runs.get("model") or {}
    final = (model.get("report") or {}).get("final") or {}
    deps = data.get("epochs") or []
    disk = int(sum(e["read_bytes"] for e in deps)) if len(deps) == epochs else None
    online = [e["online"] for e in ((data.get("report") or {}).get("epochs") or []) if "online" in e]
    ds = (data.get("report") or {}).get("dataset") or {}
    row_bytes = ds["feature_bytes"] // ds["nodes"] if ds.get("nodes") else 0
    if useful is None and online:
        useful = sum(e["misses"] for e in online) * row_bytes
    losses = [e["losses"] for e in ((model.get("report") or {}).get("epochs") or []) if "losses" in e]
    return {"test_auc": final.get("test_auc"), "test_mrr": final.get("test_mrr"), "test_hits50": final.get("test_hits"),
            "hits_k": final.get("hits_k"),
            "data_s_per_epoch": sum(e["seconds"] for e in deps) / len(deps) if len(deps) == epochs else None,
            "disk_bytes": disk, "useful_bytes": useful,
            "read_amplification": disk / useful if disk is not None and useful else None,
            "losses": losses or None, "cgroup_limit_bytes": child.get("limit_bytes"),
            "cgroup_peak_bytes": child.get("cgroup_peak_bytes"), "error": child.get("error")}


# ---------------------------------------------------------------------------- the child process

def child_main(argv: list[str]) -> int:
    """Entry of a child process: ``--child SPEC``; writes its figures to the spec's ``out``."""
    spec = read_child_spec(argv, CHILD)
    if spec is None:
        return 2
    try:
        result: dict[str, Any] = {"runs": {}}
        for r in spec["runs"]:
            drop_trees([Path(p) for p in spec["drop"]])
            result["runs"][r["kind"]] = _train(spec, r)
            write_child_out(spec, result)
        return 0
    except DiskflowError as e:
        return refuse(spec, e)


def _train(spec: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    from .prepare import proc_io

    st: dict[str, Any] = {"epochs": [], "count": 0, "n": 0, "epoch": 0}

    def on_start(epoch: int, batches: int) -> None:
        warm_files(spec["warm"].get(str(epoch), []))
        st.update(epoch=epoch, n=batches, count=0, io0=proc_io(), t0=time.perf_counter())

    def on_batch(_: int) -> None:
        st["count"] += 1
        if st["count"] == st["n"]:
            io = proc_io()
            st["epochs"].append({"epoch": st["epoch"], "seconds": time.perf_counter() - st["t0"],
                                 "read_bytes": io["read_bytes"] - st["io0"]["read_bytes"]})

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
    return {"epochs": st["epochs"], "peak_rss_bytes": peak_rss(), "report": report}


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
