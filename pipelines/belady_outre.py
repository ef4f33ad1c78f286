"""belady with OUTRE's two ways of needing fewer bytes: partition-based batches and a historical
embedding cache, planned offline, on top of the Belady CPU tier, packing and the segmented disk cache.

Pruned subtrees are never sampled, planned or packed. A fresh embedding prunes the last hop of its
node's subtree but one neighbour per node there (``history_prune="thin"``), so the seeds' lower
layers are exact, the cached rows are the only approximation of the forward pass, and the gradient
through them sees rows computed from a neighbour; ``--history-prune last-hop`` drops that neighbour
(fewer bytes, less accuracy on hard graphs) and ``--history-prune subtree`` prunes all of it as
OUTRE does. The embedding cache and the Belady CPU tier
split ``--cpu-memory`` automatically (``--history-memory auto``, the default: the split whose plan
reads the fewest bytes, `flow.memsplit`); a size given to ``--history-memory`` fixes the embedding
cache beside the CPU budget instead.

    diskflow prepare belady_outre --dataset STORE --out PACKED --cpu-memory 10% [--hidden 128]
    diskflow run belady_outre --dataset STORE
"""
from __future__ import annotations

from ..flow.pipeline import Pipeline

__all__ = ["NAME", "PIPELINE", "prepare", "run"]

PIPELINE = Pipeline("belady_outre", batches="partition", history_memory="auto", history_staleness=100,
                    description="belady + OUTRE's partition batches and historical embeddings, planned offline")
NAME, prepare, run = PIPELINE.name, PIPELINE.prepare, PIPELINE.run
