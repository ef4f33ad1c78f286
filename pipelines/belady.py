"""The default pipeline: static GPU tier + Belady CPU tier + batched packing + segmented disk cache.

Belady planning minimises the rows read from disk; packing reads those rows as large
sequential segments with no amplification; the segmented, MinHash-ordered disk cache
kicks in only when packing would exceed `--disk-budget`. Neither paper has all three:
DiskGNN's CPU tier is static, Ginex reads its misses row by row.

    diskflow prepare belady --dataset STORE --out PACKED --cpu-memory 10% [--disk-budget 20GiB]
    diskflow run belady --dataset STORE   (prepare into the run directory, then train)
"""
from __future__ import annotations

from ..flow.pipeline import Pipeline

__all__ = ["NAME", "PIPELINE", "prepare", "run"]

PIPELINE = Pipeline("belady", cpu_tier="belady", packing=True, disk_cache=True,
                    description="Belady CPU tier + batched packing + segmented disk cache (default)")
NAME, prepare, run = PIPELINE.name, PIPELINE.prepare, PIPELINE.run
