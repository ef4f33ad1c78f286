"""LSM-GNN's cache (Ha et al., 2024) on one worker as a diskflow pipeline: no preparation, a lookahead window.

Batches are sampled a window ahead; the host feature buffer evicts by LSM-GNN's hybrid policy (a
candidate with no next use in the window first, then one used beyond the threshold, then one used
within it; within a level the lowest in-degree), and the extractors read the next batches' misses
while this one trains (`operators.train.online`). The multi-GPU shared cache is the "many GPU
workers" work, not this pipeline's.

    diskflow run lsmgnn --dataset STORE [--cpu-memory 10%] [--window 8]
"""
from __future__ import annotations

from ..flow.pipeline import Pipeline

__all__ = ["PIPELINE"]

PIPELINE = Pipeline("lsmgnn", loader="online", cpu_tier="hybrid",
                    description="LSM-GNN's cache: online sampling, a lookahead window, hybrid eviction, prefetched misses")
