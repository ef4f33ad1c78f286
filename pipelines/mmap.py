"""PyG+ as a pipeline: features gathered through memory maps of the store's shards and the page cache
(`flow.runtimes.mmap`), what a PyG user does today with a numpy memmap.

    diskflow run mmap --dataset STORE [--model sage|gcn|gat|mlp|none] ...
"""
from __future__ import annotations

from ..flow.pipeline import Pipeline

__all__ = ["NAME", "PIPELINE", "run"]

PIPELINE = Pipeline("mmap", loader="mmap", description="PyG+: features gathered through memory maps and the page cache")
NAME, run = PIPELINE.name, PIPELINE.run
