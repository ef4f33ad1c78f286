"""DiskGNN (the paper): static GPU and CPU tiers by access frequency + batched packing + segmented disk cache.

    diskflow prepare diskgnn --dataset STORE --out PACKED --cpu-memory 10% [--disk-budget 20GiB]
    diskflow run diskgnn --dataset STORE
"""
from __future__ import annotations

from ..flow.pipeline import Pipeline

__all__ = ["NAME", "PIPELINE", "prepare", "run"]

PIPELINE = Pipeline("diskgnn", cpu_tier="static", packing=True, disk_cache=True,
                    description="DiskGNN: static tiers by access counts + batched packing + segmented disk cache")
NAME, prepare, run = PIPELINE.name, PIPELINE.prepare, PIPELINE.run
