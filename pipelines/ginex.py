"""Ginex: a Belady CPU tier planned per superbatch, no packing — misses are read row by row at train time.

The packed dataset holds the plan (index files with src STORE, idx = node id) and the tier
blocks; the trainer reads every miss from the store's feature shards.

    diskflow prepare ginex --dataset STORE --out PACKED --cpu-memory 10%
    diskflow run ginex --dataset STORE
"""
from __future__ import annotations

from ..flow.pipeline import Pipeline

__all__ = ["NAME", "PIPELINE", "prepare", "run"]

PIPELINE = Pipeline("ginex", cpu_tier="belady", packing=False, disk_cache=False,
                    description="Ginex: Belady CPU tier, misses read row by row with O_DIRECT")
NAME, prepare, run = PIPELINE.name, PIPELINE.prepare, PIPELINE.run
