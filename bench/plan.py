"""`diskflow bench plan`: the Belady CPU-cache planner's speed, and its misses next to the static tier.

A skewed (Zipf) access trace shaped like a training round (batches of unique ids) is planned
three ways at the same CPU-cache capacity: Belady per superbatch, chained, with the next
superbatch as lookahead and a prefilled start (what the pipeline runs); Belady with the whole
round as lookahead (the optimum of the model); and DiskGNN's static hottest-rows tier. The
planner runs on one core; its rate counts the superbatch accesses planned per second of wall time
(the Python wrapping included).
"""
from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from ..errors import ConfigError
from ..operators.prepare.plan import initial_fill, plan_belady, plan_static, static_tier
from .common import print_table

__all__ = ["add_arguments", "run", "zipf_trace"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Trace shape, cache size and superbatch size."""
    parser.add_argument("--batches", type=int, default=200, help="batches in the round (default 200)")
    parser.add_argument("--batch-size", type=int, default=50_000, help="unique accesses per batch (default 50000)")
    parser.add_argument("--nodes", type=int, default=2_000_000, help="node count (default 2000000)")
    parser.add_argument("--skew", type=float, default=0.9, help="Zipf exponent of node popularity (default 0.9)")
    parser.add_argument("--capacity", type=float, default=0.10,
                        help="CPU-cache slots as a fraction of the nodes (default 0.10)")
    parser.add_argument("--gpu", type=float, default=0.0,
                        help="GPU tier (the hottest nodes) as a fraction of the nodes (default 0)")
    parser.add_argument("--superbatch", type=int, default=20, help="batches per superbatch (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="trace seed (default 0)")


def zipf_trace(batches: int, batch_size: int, nodes: int, skew: float, seed: int) -> list[np.ndarray]:
    """Batches of `batch_size` unique node ids with Zipf popularity, hot nodes scattered over the ids.

    Ids are drawn with replacement from the popularity distribution and the first `batch_size`
    distinct ones kept, in draw order.
    """
    if batch_size > nodes:
        raise ConfigError("--batch-size", f"{batch_size} unique ids per batch need at least as many nodes")
    rng = np.random.default_rng(seed)
    cdf = np.cumsum(1.0 / np.arange(1, nodes + 1, dtype=np.float64) ** skew)
    cdf /= cdf[-1]
    rename = rng.permutation(nodes).astype(np.int64)
    out = []
    for _ in range(batches):
        draws = 2 * batch_size
        while True:
            ids = np.minimum(np.searchsorted(cdf, rng.random(draws)), nodes - 1)
            _, first = np.unique(ids, return_index=True)
            if first.shape[0] >= batch_size:
                break
            draws *= 2
        out.append(rename[ids[np.sort(first)[:batch_size]]])
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Plan the trace with chained Belady, full-lookahead Belady and the static tier; print and return figures."""
    for option, value in (("--batches", args.batches), ("--batch-size", args.batch_size),
                          ("--nodes", args.nodes), ("--superbatch", args.superbatch)):
        if value < 1:
            raise ConfigError(option, f"expected an integer >= 1, got {value}")
    if not 0 <= args.capacity <= 1 or not 0 <= args.gpu <= 1:
        raise ConfigError("--capacity/--gpu", "expected fractions in [0, 1]")
    t0 = time.perf_counter()
    trace = zipf_trace(args.batches, args.batch_size, args.nodes, args.skew, args.seed)
    gen_s = time.perf_counter() - t0
    freq = np.bincount(np.concatenate(trace), minlength=args.nodes).astype(np.int64)
    gpu = np.sort(static_tier(freq, int(args.gpu * args.nodes), np.zeros(0, dtype=np.int64)))
    capacity = int(args.capacity * args.nodes)
    accesses = sum(b.shape[0] for b in trace)
    size = args.superbatch

    # Chained Belady, as the pipeline plans: superbatch k with superbatch k+1 as lookahead.
    state = initial_fill(trace[:2 * size], capacity, freq, gpu)
    chained = {"misses": 0, "hits": 0, "gpu_hits": 0, "inserts": 0, "wall": 0.0, "cpu": 0.0}
    for k in range(0, len(trace), size):
        w0, c0 = time.perf_counter(), time.thread_time()
        plan = plan_belady(trace[k:k + size], trace[k + size:k + 2 * size], capacity, state, gpu, freq)
        chained["wall"] += time.perf_counter() - w0
        chained["cpu"] += time.thread_time() - c0
        state = plan.final_cache
        for key in ("misses", "hits", "gpu_hits", "inserts"):
            chained[key] += getattr(plan, key)

    # Full lookahead: the whole round in one plan (the model's optimum).
    fill = initial_fill(trace, capacity, freq, gpu)
    w0, c0 = time.perf_counter(), time.thread_time()
    full = plan_belady(trace, [], capacity, fill, gpu, freq)
    full_s, full_cpu = time.perf_counter() - w0, time.thread_time() - c0

    w0, c0 = time.perf_counter(), time.thread_time()
    static = plan_static(trace, static_tier(freq, capacity, gpu), gpu)
    static_s, static_cpu = time.perf_counter() - w0, time.thread_time() - c0

    rows = [
        {"planner": f"belady, superbatch {size} + lookahead", "misses": chained["misses"],
         "miss %": 100.0 * chained["misses"] / accesses, "inserts": chained["inserts"],
         "plan s": chained["wall"], "accesses/s": accesses / chained["wall"],
         "per CPU s": accesses / chained["cpu"]},
        {"planner": "belady, whole round (optimum)", "misses": full.misses,
         "miss %": 100.0 * full.misses / accesses, "inserts": full.inserts,
         "plan s": full_s, "accesses/s": accesses / full_s, "per CPU s": accesses / full_cpu},
        {"planner": "static hottest rows (DiskGNN)", "misses": static.misses,
         "miss %": 100.0 * static.misses / accesses, "inserts": 0,
         "plan s": static_s, "accesses/s": accesses / static_s, "per CPU s": accesses / static_cpu},
    ]
    print(f"trace: {args.batches} batches x {args.batch_size:,} unique ids over {args.nodes:,} nodes "
          f"(Zipf {args.skew}), {accesses:,} accesses, made in {gen_s:.1f} s; CPU cache {capacity:,} slots, "
          f"GPU tier {gpu.shape[0]:,} nodes ({chained['gpu_hits']:,} GPU hits)")
    print_table("CPU-cache planners at the same capacity (one core)", rows,
                ["planner", "misses", "miss %", "inserts", "plan s", "accesses/s", "per CPU s"])
    print("accesses/s: per second of wall time; per CPU s: per second of this thread's CPU time "
          "(the same on an idle core; lower wall rates mean other processes took the core)")
    return {
        "accesses": accesses, "batches": args.batches, "batch_size": args.batch_size, "nodes": args.nodes,
        "skew": args.skew, "capacity": capacity, "gpu_nodes": int(gpu.shape[0]), "superbatch": size,
        "belady_accesses_per_s": accesses / chained["wall"],
        "belady_cpu_accesses_per_s": accesses / chained["cpu"],
        "belady_plan_s": chained["wall"],
        "belady_misses": chained["misses"], "belady_hits": chained["hits"], "belady_inserts": chained["inserts"],
        "belady_full_misses": full.misses, "belady_full_accesses_per_s": accesses / full_s,
        "static_misses": static.misses, "static_hits": static.hits, "gpu_hits": chained["gpu_hits"],
        "miss_ratio_belady": chained["misses"] / accesses, "miss_ratio_static": static.misses / accesses,
    }
