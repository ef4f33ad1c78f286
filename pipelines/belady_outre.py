"""belady with OUTRE's two ways of needing fewer bytes: partition-based batches and a historical
embedding cache, planned offline, on top of the Belady CPU tier, packing and the segmented disk cache.

Pruned subtrees are never sampled, planned or packed; the embedding cache takes 5% of the feature
bytes (``--history-memory`` sets it) beside the CPU budget.

    diskflow prepare belady_outre --dataset STORE --out PACKED --cpu-memory 10% [--hidden 128]
    diskflow run belady_outre --dataset STORE
"""
from __future__ import annotations

from ..flow.pipeline import Pipeline

PIPELINE = Pipeline("belady_outre", batches="partition", history_memory="5%", history_staleness=100,
                    description="belady + OUTRE's partition batches and historical embeddings, planned offline")
NAME, prepare, run = PIPELINE.name, PIPELINE.prepare, PIPELINE.run
