"""`diskflow bench sampler`: the native neighbor sampler against the vectorised numpy reference.

All sample the same batches of seeds (one shuffled pass over the nodes, like a training epoch)
on the same graph, in one run; the figure that matters is the ratio of sampled edges per second.
`speedup` is against `numpy_sample` as specified (np.unique dedup); the table also shows numpy
with its faster `np.minimum.at` dedup, so the margin over the best numpy we know is on record.
The graph is either generated (CSC with power-law-ish in-degrees and uniform sources) or an
ingested store's topology (`--dataset`).
"""
from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..flow.options import parse_fanouts
from ..operators.prepare.sample import NeighborSampler, SampledBatch, numpy_sample
from .common import print_table

__all__ = ["PARETO_SHAPE", "add_arguments", "generate_graph", "run"]

# Pareto shape of the generated in-degrees: 2 gives a heavy tail with a finite mean.
PARETO_SHAPE = 2.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Options of `diskflow bench sampler`."""
    p.add_argument("--nodes", type=int, default=1_000_000, help="generated graph: nodes (default 1,000,000)")
    p.add_argument("--avg-degree", type=float, default=15.0, help="generated graph: mean in-degree (default 15)")
    p.add_argument("--fanouts", default="10,15,20", help="comma-separated fanouts per hop, -1 = all (default 10,15,20)")
    p.add_argument("--batch-size", type=int, default=1024, help="seeds per batch (default 1024)")
    p.add_argument("--batches", type=int, default=50, help="batches sampled by the native sampler (default 50)")
    p.add_argument("--numpy-batches", type=int, default=5, help="batches sampled by numpy (default 5)")
    p.add_argument("--threads", type=int, default=None, help="native sampler threads (default: all cores)")
    p.add_argument("--seed", type=int, default=0, help="random seed (graph, seed order, draws)")
    p.add_argument("--dataset", metavar="STORE", default=None,
                   help="sample an ingested store's topology instead of a generated graph")


def generate_graph(num_nodes: int, avg_degree: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A random CSC graph: Pareto-distributed in-degrees with the given mean, uniform sources.

    Returns:
        (indptr int64 [N+1], indices int32 [E]); vectorised, a few seconds for 1M nodes.
    """
    rng = np.random.default_rng(seed)
    weight = rng.pareto(PARETO_SHAPE, num_nodes) + 1.0
    deg = np.minimum(np.floor(weight * (avg_degree / weight.mean()) + rng.random(num_nodes)),
                     max(num_nodes - 1, 0)).astype(np.int64)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(deg, out=indptr[1:])
    index_dtype = np.int32 if num_nodes < 2**31 else np.int64
    indices = rng.integers(0, num_nodes, size=int(indptr[-1]), dtype=index_dtype)
    return indptr, indices


def _check_positive(option: str, value: int) -> None:
    if value < 1:
        raise ConfigError(option, f"{value} must be >= 1")


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Sample the same seed batches natively and with numpy; print the table; return the figures."""
    fanouts = list(parse_fanouts(args.fanouts, "--fanouts"))
    for option, value in (("--batch-size", args.batch_size), ("--batches", args.batches),
                          ("--numpy-batches", args.numpy_batches)):
        _check_positive(option, value)
    threads = args.threads if args.threads is not None else (os.cpu_count() or 1)
    _check_positive("--threads", threads)

    t0 = time.perf_counter()
    if args.dataset:
        from ..operators.formats.store import Store

        store = Store(args.dataset)
        indptr, indices = store.indptr, store.indices
        pool = store.split_ids("train")
        source = f"store {args.dataset}"
    else:
        _check_positive("--nodes", args.nodes)
        indptr, indices = generate_graph(args.nodes, args.avg_degree, args.seed)
        pool = np.arange(args.nodes, dtype=np.int64)
        source = "generated"
    num_nodes, num_edges = int(indptr.shape[0] - 1), int(indices.shape[0])
    if pool.size == 0:
        pool = np.arange(num_nodes, dtype=np.int64)
    print(f"graph ({source}): {num_nodes:,} nodes, {num_edges:,} edges, {indices.dtype} indices, "
          f"ready in {time.perf_counter() - t0:.1f}s; fanouts {fanouts}, batch {args.batch_size}, "
          f"{threads} threads")

    rng = np.random.default_rng(args.seed + 1)
    order = rng.permutation(pool)
    n_batches = max(args.batches, args.numpy_batches)
    batches = [order[(i * args.batch_size) % order.size:][:args.batch_size] for i in range(n_batches)]

    sampler = NeighborSampler(indptr, indices, fanouts, num_threads=threads)
    sampler.sample(batches[0], seed=args.seed)  # warm-up: scratch allocation, page cache
    native_edges = 0
    t0 = time.perf_counter()
    for i in range(args.batches):
        native_edges += int(sampler.sample(batches[i], seed=args.seed + i).edge_index.shape[1])
    native_s = time.perf_counter() - t0

    def timed_numpy(dedup: str) -> tuple[int, float]:
        edges = 0
        t0 = time.perf_counter()
        for i in range(args.numpy_batches):
            b: SampledBatch = numpy_sample(indptr, indices, batches[i], fanouts, rng, dedup=dedup)
            edges += int(b.edge_index.shape[1])
        return edges, time.perf_counter() - t0

    numpy_edges, numpy_s = timed_numpy("unique")
    fast_edges, fast_s = timed_numpy("minimum-at")

    native_rate = native_edges / native_s
    numpy_rate = numpy_edges / numpy_s
    fast_rate = fast_edges / fast_s
    speedup = native_rate / numpy_rate
    print_table(
        f"neighbor sampling, {num_nodes:,} nodes, fanouts {fanouts}, batch {args.batch_size} "
        "(speedup: native edges/s over this row's)",
        [
            {"sampler": f"native ({threads} threads)", "batches": args.batches, "sampled edges": native_edges,
             "seconds": native_s, "edges/s": native_rate, "speedup": 1.0},
            {"sampler": "numpy (np.unique dedup)", "batches": args.numpy_batches, "sampled edges": numpy_edges,
             "seconds": numpy_s, "edges/s": numpy_rate, "speedup": speedup},
            {"sampler": "numpy (np.minimum.at dedup)", "batches": args.numpy_batches, "sampled edges": fast_edges,
             "seconds": fast_s, "edges/s": fast_rate, "speedup": native_rate / fast_rate},
        ],
        ["sampler", "batches", "sampled edges", "seconds", "edges/s", "speedup"],
    )
    return {
        "speedup": speedup,
        "speedup_vs_numpy_minimum_at": native_rate / fast_rate,
        "native_edges_per_s": native_rate,
        "numpy_edges_per_s": numpy_rate,
        "numpy_minimum_at_edges_per_s": fast_rate,
        "nodes": num_nodes,
        "edges": num_edges,
        "fanouts": fanouts,
        "batch_size": args.batch_size,
        "threads": threads,
    }
