"""GNNDrive (Jiang et al., 2024) as a diskflow pipeline: no preparation, asynchronous extraction.

Sampling runs on the fly over the memory-mapped topology; each batch's feature rows are read by one
of several extractors (the native reader: O_DIRECT, io_uring, many requests in flight) into one
fixed-size host feature buffer, rows already there reused, released slots taken back in
least-recently-used order, and batches handed to training in their order (`operators.train.online`).

    diskflow run gnndrive --dataset STORE [--cpu-memory 10%] [--extractors 4]
"""
from __future__ import annotations

from ..flow.pipeline import Pipeline

__all__ = ["PIPELINE"]

PIPELINE = Pipeline("gnndrive", loader="online", cpu_tier="lru",
                    description="GNNDrive: online sampling, asynchronous direct-I/O extraction into a fixed LRU buffer")
