"""`diskflow demo`: synthesise a graph, ingest it with Dask, train in memory, and print what happened.

Sized to finish in under a minute on a quiet 2-core machine (about two with `make demo`'s
set-up from scratch). Every step is the real one
(the same functions `diskflow synth`, `diskflow ingest` and `diskflow run inmemory` call).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from ...operators.formats.files import format_bytes
from ..options import fanouts_option, positive_int


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="synth -> ingest -> train in memory, end to end (under a minute on 2 cores)",
                       description="Make a synthetic graph, ingest it as a Dask graph (watch the dashboard link), "
                                   "train GraphSAGE in memory and an MLP baseline on the same features, and print "
                                   "accuracy, timings and where the report is.")
    p.add_argument("--workdir", default="diskflow-demo", help="where the dataset, store and runs go (default: %(default)s)")
    p.add_argument("--nodes", type=positive_int("--nodes"), default=100_000, help="synthetic graph size (default: %(default)s)")
    p.add_argument("--dim", type=positive_int("--dim"), default=64, help="feature dimension (default: %(default)s)")
    p.add_argument("--classes", type=positive_int("--classes"), default=8, help="number of classes (default: %(default)s)")
    p.add_argument("--epochs", type=positive_int("--epochs"), default=3, help="training epochs (default: %(default)s)")
    p.add_argument("--fanouts", type=fanouts_option("--fanouts"), default=(10, 10),
                   help="neighbours sampled per hop, comma-separated (default: 10,10)")
    p.add_argument("--batch-size", type=positive_int("--batch-size"), default=1024, help="seeds per batch (default: %(default)s)")
    p.add_argument("--model", choices=("sage", "gcn", "gat"), default="sage", help="GNN model (default: %(default)s)")
    p.add_argument("--hidden", type=positive_int("--hidden"), default=64, help="hidden channels (default: %(default)s)")
    p.add_argument("--workers", type=positive_int("--workers"), default=None, help="Dask worker processes (default: one per core)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ...operators.ingest.synth import SynthConfig
    from ...pipelines import inmemory
    from ..cluster import dask_client
    from ..ingest import run_ingest
    from ..rundir import new_run_dir
    from ..synth import run_synth

    work = Path(args.workdir)
    t0 = time.perf_counter()
    cfg = SynthConfig(num_nodes=args.nodes, feature_dim=args.dim, num_classes=args.classes, seed=args.seed)
    print(f"[1/3] synth + [2/3] ingest: {args.nodes:,} nodes, {args.dim}-dim features -> {work}")
    with dask_client(n_workers=args.workers):
        t = time.perf_counter()
        raw = run_synth(cfg, work / "raw")
        synth_s = time.perf_counter() - t
        t = time.perf_counter()
        ingested = run_ingest(raw, work / "store")
        ingest_s = time.perf_counter() - t
    print(f"      synth {synth_s:.1f}s, ingest {ingest_s:.1f}s "
          f"({ingested.num_nodes:,} nodes, {ingested.num_edges:,} edges, {format_bytes(ingested.input_bytes)} read)")

    common = {"fanouts": tuple(args.fanouts), "batch_size": args.batch_size, "epochs": args.epochs,
              "seed": args.seed, "hidden": args.hidden}
    print(f"[3/3] train in memory: {args.model} vs MLP, {args.epochs} epochs, fanouts {','.join(map(str, args.fanouts))}")
    gnn_dir = new_run_dir(work / "runs", f"inmemory-{args.model}")
    gnn = inmemory.run(ingested.path, gnn_dir, model=args.model, **common)
    mlp_dir = new_run_dir(work / "runs", "inmemory-mlp")
    mlp = inmemory.run(ingested.path, mlp_dir, model="mlp", **common)

    chance = 1.0 / max(1, gnn["dataset"]["num_classes"])
    print()
    print(f"{'model':<8}{'test acc':>10}{'best val':>10}{'epoch s':>10}")
    for name, rep in ((args.model, gnn), ("mlp", mlp)):
        ep = rep["epochs"][-1]
        print(f"{name:<8}{rep['final']['test_acc']:>10.4f}{rep['final']['best_val_acc']:>10.4f}{ep['epoch_s']:>10.2f}")
    print(f"chance = {chance:.4f}; GNN over MLP: {gnn['final']['test_acc'] - mlp['final']['test_acc']:+.4f}")
    stages = gnn["epochs"][-1]["stage_s"]
    print("last GNN epoch stage times: " + ", ".join(f"{k} {v:.2f}s" for k, v in stages.items()))
    print(f"reports: {gnn_dir / 'report.json'} and {mlp_dir / 'report.json'}")
    print(f"total {time.perf_counter() - t0:.1f}s")
    return 0
