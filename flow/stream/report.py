"""The report of a streamed run: where the time went (per phase and worker), the GPU's idle share, scratch use."""
from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from ...operators.formats.rowcodec import rows_block
from ...operators.train.record import final_block

__all__ = ["stream_report"]


def stream_report(run: Any, wall0: float, summary: dict[str, Any], usage: dict[str, Any]) -> dict[str, Any]:
    """report.json of a finished streamed run (`StreamRun`): figures, timeline (`run.results`), trainer summary."""
    wall = time.perf_counter() - wall0
    tl = run.results.timeline
    train_busy = sum(e["phases"]["train"]["end"] - e["phases"]["train"]["start"] for e in tl)
    end = max((e["trained"] for e in tl), default=0.0)
    tcfg = run.cfg.train
    lanes = getattr(run, "lanes", [])
    base_info = lanes[0].base_info if lanes else {}
    base_meta = base_info.get("meta", {}) if base_info else {}
    seen = run.results.last_usage or {}
    scratch = {**seen, **usage}
    for k in ("peak", "peak_disk", "peak_staged"):
        scratch[k] = max(int(usage.get(k) or 0), int(seen.get(k) or 0))
    report: dict[str, Any] = {
        "pipeline": "streaming",
        "title": f"streaming: {tcfg.model}, fanouts {list(run.cfg.fanouts)}, window {run.cfg.window}",
        "config": {**replace(run.cfg, train=None).describe(), "fanouts": list(run.cfg.fanouts),
                   "train": tcfg.as_json(), "device": getattr(run, "device", None)},
        "dataset": {"store": run.store_path, "nodes": run.store.num_nodes, "dim": run.store.feature_dim,
                    "dtype": str(run.store.feature_dtype), "num_classes": run.store.num_classes,
                    "batches": run.round_batches, "superbatches": run.n,
                    "feature_bytes": run.store.feature_bytes,
                    **({"edge_dim": run.store.edge_features.dim} if run.store.edge_features is not None else {}),
                    **({"rows": rows_block(run.prep.codec)} if getattr(run, "prep", None) is not None
                       and run.prep.codec is not None else {})},
        "epochs": run.results.records,
        "final": final_block(run.results.records),
        "stage_s": {k: sum(r["stage_s"].get(k, 0.0) for r in run.results.records)
                    for k in ("load", "assemble", "graph", "gather", "train", "eval")},
        "stream": {
            "run": run.run_id, "window": run.cfg.window, "superbatches": run.n, "start_index": run.start,
            "trained": run.trained, "gpu_worker": getattr(run, "gpu_addr", None),
            "cpu_workers": getattr(run, "cpu_addrs", []), "gpu_info": getattr(run, "gpu_info", {}),
            "stage": run.cfg.stage, "reshipped": [run.refs[k].key for k in sorted(run.reshipped)],
            "stream_s": end, "train_busy_s": train_busy,
            "gpu_idle_fraction": (1.0 - train_busy / end) if end > 0 else None,
            "tiers": base_meta.get("tiers", {}), "scratch": scratch,
            **({"edge_tiers": base_meta["edge_tiers"]} if "edge_tiers" in base_meta else {}),
            "floor_bps": [f if f is not None and math.isfinite(f) else None for f in getattr(run, "floors", [])],
            **_gpu_workers(run, end),
        },
        **({"partition": run.partition} if getattr(run, "partition", None) is not None else {}),
        "timeline": tl,
        "trainer": summary,
        "checkpoint": str(run.checkpoints.last) if run.checkpoints.last else None,
        "resumed_from": getattr(run, "resumed_from", None),
        "run_dir": str(run.run_dir),
        "wall_s": wall,
    }
    return report


def _gpu_workers(run: Any, end: float) -> dict[str, Any]:
    """Per GPU worker: its address, its share of the trains' busy time, its tiers and bytes (a data-parallel
    run; one worker: its own fields above say it all)."""
    lanes = getattr(run, "lanes", [])
    if len(lanes) <= 1:
        return {"gpus": 1}
    busy = [0.0] * len(lanes)
    nbytes = [0] * len(lanes)
    for e in run.results.timeline:
        for r, ln in enumerate(e.get("lanes", [])):
            t = ln["phases"]["train"]
            busy[r] += t["end"] - t["start"]
            nbytes[r] += int(ln.get("bytes") or 0)
    summaries = getattr(run, "lane_summaries", [{}] * len(lanes))
    return {"gpus": len(lanes), "cache": run.cfg.cache, "group": run.group,
            "gpu_workers": [lane.gpu_addr for lane in lanes],
            "gpu_idle_fraction_per_worker": [(1.0 - b / end) if end > 0 else None for b in busy],
            "models_equal": (run.results.models_checked == run.trained and run.trained > 0)
            if run.cfg.train.model != "none" else None,
            "models_checked": run.results.models_checked,
            "lanes": [{"rank": lane.rank, "address": lane.gpu_addr, "batches": lane.round_batches,
                       "train_busy_s": busy[r], "shipped_bytes": nbytes[r],
                       "tiers": (lane.base_info.get("meta", {}) or {}).get("tiers", {}),
                       "io": (summaries[r] or {}).get("io", {}) if r < len(summaries) else {}}
                      for r, lane in enumerate(lanes)]}
