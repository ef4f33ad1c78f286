"""DiskGNN (the paper): static GPU and CPU tiers by access frequency + batched packing + segmented disk cache.

    diskflow prepare diskgnn --dataset STORE --out PACKED --cpu-memory 10% [--disk-budget 20GiB]
    diskflow run diskgnn --dataset STORE
"""
from __future__ import annotations

from ..flow.prepare import preparer
from ._packed import runner

NAME = "diskgnn"
prepare = preparer(NAME, cpu_policy="static", packing=True)
run = runner(NAME, prepare)
