"""`diskflow prepare PIPELINE --dataset STORE --out PACKED`: offline preprocessing on a Dask cluster."""
from __future__ import annotations

import argparse

from .. import load_pipeline
from ..config import GROUPINGS, PREPARE_DEFAULTS, fanouts_option
from ..runs import SPLIT_PLOT, describe_split, describe_staleness
from ..sizes import byte_budget, format_bytes
from .options import (
    add_history_arguments,
    add_rows_argument,
    add_task_arguments,
    add_tls_arguments,
    integer,
    parse_batches,
    positive_int,
)

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "prepare", help="sample, plan and pack a store into a packed dataset (Dask graph)",
        description="Offline preprocessing: sample every minibatch of the round, count accesses, choose the GPU "
                    "tier, plan the CPU tier per superbatch (Belady or static), lay out a segmented disk cache when "
                    "packing exceeds --disk-budget, and pack every remaining read into page-aligned per-batch "
                    "segments with one sequential pass over the features. Re-running with the same inputs and "
                    "options does nothing; changing an option redoes only what depends on it. Once the packed bytes "
                    "are known (after planning) they are checked against the free space of PACKED's filesystem "
                    "and printed (pack: ...), with that free space, before the pack tasks run.")
    p.add_argument("pipeline", metavar="PIPELINE",
                   help="belady (default policy: Belady CPU tier + packing + disk cache), diskgnn (static tiers + "
                        "packing + disk cache), ginex (Belady CPU tier, no packing), or the path of a .py file "
                        "that defines a diskflow.Pipeline with the packed loader")
    p.add_argument("--dataset", required=True, metavar="STORE", help="an ingested store (from `diskflow ingest`)")
    p.add_argument("--out", required=True, metavar="PACKED",
                   help="packed dataset directory to create (its cache goes to PACKED.work); an existing PACKED or "
                        "PACKED.work that is not a packed dataset / prepare cache is refused unless --force")
    d = PREPARE_DEFAULTS    # the defaults, from the one place they are set
    # values are converted here and checked by the library (`diskflow.api.prepare_options`), whose errors name
    # the field and print as its flag; --workers alone is the command's own (0 would mean one per core)
    p.add_argument("--gpu-memory", default=d["gpu_memory"], metavar="SIZE",
                   help="bytes for the static GPU tier, e.g. 2GiB (default %(default)s; needs --device cuda)")
    p.add_argument("--cpu-memory", default=d["cpu_memory"], metavar="SIZE",
                   help="host memory for features on the training machine (CPU tier + staging of in-flight "
                        "batches), as bytes (4GiB) or a share of the feature bytes (10%%; default %(default)s)")
    p.add_argument("--disk-budget", default=d["disk_budget"], metavar="SIZE",
                   help="most disk space for packed data (e.g. 20GiB); beyond it the segmented disk cache is used "
                        "(default: no limit)")
    p.add_argument("--readahead", default=d["readahead"], metavar="SIZE",
                   help="feature bytes read into this machine's page cache while sampling and planning keep the "
                        "CPUs busy, so that part of the packing pass overlaps them; bytes or a share of the "
                        "features (25%%); 0 turns it off (default %(default)s)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=d["device"],
                   help="the training device (default: %(default)s)")
    p.add_argument("--fanouts", type=fanouts_option("--fanouts"), default=d["fanouts"],
                   help="neighbours sampled per hop (default: the pipeline's, 10,10,10 for the built-in ones)")
    p.add_argument("--batch-size", type=integer("--batch-size"), default=d["batch_size"],
                   help="seeds per minibatch (default %(default)s)")
    p.add_argument("--superbatch-size", type=integer("--superbatch-size"), default=d["superbatch_size"], metavar="S",
                   help="minibatches per superbatch: the unit of sampling tasks and of Belady planning (default "
                        "%(default)s)")
    p.add_argument("--epochs", type=integer("--epochs"), default=d["epochs"],
                   help="epochs in the round (default %(default)s)")
    p.add_argument("--seed", type=integer("--seed"), default=d["seed"], help="seed of batch order and sampling (default %(default)s)")
    p.add_argument("--queue-depth", type=integer("--queue-depth"), default=d["queue_depth"],
                   help="the trainer's queue depth: the batches it keeps in flight (2q+5) and its I/O buffers are "
                        "reserved out of --cpu-memory (default %(default)s, as `diskflow train`)")
    p.add_argument("--staging-piece", default=d["staging_piece"], metavar="SIZE",
                   help="the most disk-row bytes one of the trainer's staging buffers carries (a batch's misses "
                        "larger than it load in several pieces); a smaller one leaves more of --cpu-memory to the "
                        "CPU tier, at more, shorter reads per batch (default 32MiB)")
    p.add_argument("--batches", type=lambda t: parse_batches("--batches", t), default=d["batches"],
                   help="shuffled ('random'; the pipeline's default) or partition: batches from groups of min-cut parts (OUTRE)")
    p.add_argument("--partitions", type=integer("--partitions"), default=d["partitions"],
                   help="partition batches: parts of the graph (default eight per batch: one per batch-size/8 "
                        "training nodes)")
    p.add_argument("--parts-per-group", type=integer("--parts-per-group"), default=d["parts_per_group"],
                   help="partition batches: parts whose training nodes are shuffled together (default %(default)s)")
    p.add_argument("--group-by", choices=GROUPINGS, default=d["group_by"],
                   help="partition batches: how parts meet in a group, label (parts of different majority labels "
                        "together) or random (OUTRE's) (default %(default)s)")
    p.add_argument("--partitioner", choices=("kaminpar", "metis"), default=d["partitioner"],
                   help="partition batches: the partitioner (default %(default)s)")
    p.add_argument("--partition-threads", type=integer("--partition-threads"), default=d["partition_threads"],
                   help="partition batches: the partitioner's threads (default %(default)s: the same parts every run)")
    add_history_arguments(p, d)
    p.add_argument("--hidden", type=integer("--hidden"), default=d["hidden"],
                   help="the model's hidden channels, the width of the cached embeddings (default %(default)s)")
    add_task_arguments(p, d["neg_ratio"], d["neg_sampling"])
    add_rows_argument(p)
    p.add_argument("--minhash-k", type=integer("--minhash-k"), default=d["minhash_k"],
                   help="MinHash functions (default %(default)s)")
    p.add_argument("--no-crc", dest="check_crc", action="store_false",
                   help="skip the check of the store's bytes against its checksums as they are read")
    p.add_argument("--force", action="store_true",
                   help="redo even when PACKED is up to date, and replace PACKED and PACKED.work even when they hold "
                        "something else (deleting it)")
    p.add_argument("--workers", type=positive_int("--workers"), default=None, help="embedded cluster workers")
    p.add_argument("--scheduler", default=None, metavar="ADDR", help="use a running Dask scheduler (tcp://host:8786)")
    add_tls_arguments(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from ..api import prepare
    from ..cluster import check_tls
    from ..datasets import Store, warn_unchecked

    check_tls(args.scheduler, args.tls_ca_file, args.tls_cert, args.tls_key)   # first: before the store is read
    warn_unchecked(args.dataset)
    options = {k: getattr(args, k) for k in PREPARE_DEFAULTS}
    cluster = {"scheduler": args.scheduler, "workers": args.workers, "tls_ca_file": args.tls_ca_file,
               "tls_cert": args.tls_cert, "tls_key": args.tls_key}
    if cluster["scheduler"] is None and cluster["workers"] is None:
        cluster["workers"] = 0          # the command's own embedded cluster (the dashboard), not local threads
    r = prepare(args.dataset, args.out, args.pipeline, force=args.force, quiet=False, **cluster, **options)
    pipeline = load_pipeline(args.pipeline)
    store = Store(args.dataset)
    given = byte_budget(args.cpu_memory, "--cpu-memory", store.budget_bytes) or 0
    f = r.figures
    cpu_memory = int(f.get("cpu_memory", given))       # more than given: the default, raised to what works
    if r.skipped:
        print(f"{r.path}: up to date (same store and options; --force redoes it)")
        return 0
    print(f"prepared {pipeline.name}: {store.path} -> {r.path} in {r.seconds:.1f}s "
          f"({', '.join(f'{k} {v:.1f}s' for k, v in r.phases.items())})")
    acc = max(1, int(f["accesses"]))
    rows = [
        ("batches", f"{f['batches']:,}"),
        ("feature accesses", f"{f['accesses']:,}"),
        ("GPU tier", f"{f['gpu_rows']:,} rows, {f['gpu_hits'] / acc:.1%} of accesses"),
        ("CPU tier", (f"{f['cpu_rows']:,} rows ({format_bytes(f['cpu_rows'] * f['row_bytes'])}), "
                      f"{f['cpu_hits'] / acc:.1%} of accesses, {f['inserts']:,} inserts")),
        ("--cpu-memory", (f"{format_bytes(cpu_memory)}{' (the default, raised)' if cpu_memory > given else ''}: CPU tier "
                                    f"{format_bytes(f['cpu_rows'] * f['row_bytes'])} + staged misses "
                                    f"{format_bytes(f['staging_bytes'])} + I/O buffers "
                                    f"{format_bytes(f['io_buffer_bytes'])}"
                                    + (f" + embedding cache {format_bytes(f['memory_split']['chosen']['history_bytes'])}"
                                       if f.get("memory_split") else ""))),
        ("assembled batches", (f"up to {f['max_batch_rows']:,} rows = {format_bytes(f['max_batch_rows'] * f['row_bytes'])}"
                               f" each, {'on the device' if args.device == 'cuda' else 'in the training process'}")),
        ("disk reads (misses)", f"{f['misses']:,} rows = {format_bytes(f['plan_miss_bytes'])} ({f['misses'] / acc:.1%})"),
        ("disk used", format_bytes(f.get("disk_used_bytes", 0)) + (
            f" of {format_bytes(f['disk_budget_bytes'])} budget" if f.get("disk_budget_bytes") else "")),
    ]
    enc = f.get("rows")
    if enc is not None:         # encoded rows: every row the tiers hold and the segments pack is this size
        rows.insert(1, ("rows", (f"{enc['encoding']}: {enc['row_bytes']} B a row against {enc['exact_row_bytes']} B "
                                 f"exact ({enc['ratio']:.2f}x fewer bytes), decoded as each batch is assembled")))
    if f.get("segment_size"):
        rows.append(("disk cache", f"segments of {f['segment_size']} batches, {f.get('dcache_rows', 0):,} row reads"))
    if f.get("early_rows") and f.get("packed_rows"):
        rows.append(("packed while planning", (f"{f['early_rows']:,} rows ({f['early_rows'] / f['packed_rows']:.1%} "
                                               "of the packed rows: the read-ahead shards' part files)")))
    if f.get("read_amplification") is not None:
        rows.append(("read amplification", f"{f['read_amplification']:.3f}"))
    e = f.get("edges")
    if e is not None:           # the edge rows, planned and packed beside the node rows (the figures above)
        eacc = max(1, int(e["accesses"]))
        rows.append(("edge rows", (
            f"{e['accesses']:,} reads of {e['row_bytes']} B ({e['read_share']:.1%} of the read bytes): GPU tier "
            f"{e['gpu_rows']:,} rows, CPU tier {e['cpu_rows']:,} rows, {(e['gpu_hits'] + e['cpu_hits']) / eacc:.1%} "
            f"of reads; {e['misses']:,} from disk ({format_bytes(e['plan_miss_bytes'])}), "
            f"{format_bytes(e.get('disk_used_bytes', 0))} packed; {format_bytes(e['cpu_memory'])} of the "
            f"--cpu-memory")))
    part = f.get("partition")
    if part is not None:
        rows.insert(1, ("batch order", (f"partition: {part['parts']:,} {part['method']} parts, edge cut {part['cut_share']:.1%}, "
                                    f"{part['seconds']:.1f}s, peak memory {format_bytes(part['peak_bytes'])}"
                                    + (" (cached)" if part.get("cached") else ""))))
    hist = f.get("history")
    if hist is not None:
        rows.append(("history cache", (f"{hist['rows']:,} embeddings of {hist['dim']} ({format_bytes(hist['bytes'])}), "
                                       f"staleness {describe_staleness(hist)}, {hist.get('prune', 'subtree')} rule: "
                                       f"{hist['pruned']:,} subtrees pruned, "
                                       f"{hist['pushed']:,} embeddings pushed")))
    split = f.get("memory_split")
    if split is not None:
        rows.append(("memory split", f"{describe_split(split)} (curve: {r.path / SPLIT_PLOT})"))
    for k, v in rows:
        print(f"  {k:<22}{v}")
    return 0
