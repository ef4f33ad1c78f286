"""Ginex: a Belady CPU tier planned per superbatch, no packing — misses are read row by row at train time.

The packed dataset holds the plan (index files with src STORE, idx = node id) and the tier
blocks; the trainer reads every miss from the store's feature shards.

    diskflow prepare ginex --dataset STORE --out PACKED --cpu-memory 10%
    diskflow run ginex --dataset STORE
"""
from __future__ import annotations

from ..flow.prepare import preparer
from ._packed import runner

NAME = "ginex"
prepare = preparer(NAME, cpu_policy="belady", packing=False)
run = runner(NAME, prepare)
