"""OUTRE (Sheng et al.): partition-based batches, a historical embedding cache and a static feature cache,
no packing — every feature the caches miss is read row by row at train time.

Batches come from groups of min-cut parts (`--batches partition`; parts of different labels grouped
together, the loss weighed by the split's label shares), the most connected nodes' inputs to the
last layer are cached and reused for up to `history_staleness` batches (their subtrees are then
neither sampled nor read: the paper's rule, ``history_prune="subtree"``, under which the seeds'
lower layers see such a node's features alone), and the CPU tier holds the most accessed rows for the whole round. As in
the paper, the two caches split one memory budget automatically (``--history-memory auto``, the
default: the share of ``--cpu-memory`` whose plan reads the fewest bytes, `flow.memsplit`); a size
given to ``--history-memory`` fixes the embedding cache beside the CPU budget instead.

    diskflow prepare outre --dataset STORE --out PACKED --cpu-memory 10% [--hidden 128]
    diskflow run outre --dataset STORE
"""
from __future__ import annotations

from ..flow.pipeline import Pipeline

__all__ = ["NAME", "PIPELINE", "prepare", "run"]

PIPELINE = Pipeline("outre", batches="partition", cpu_tier="static", packing=False, disk_cache=False,
                    history_memory="auto", history_staleness=100, history_prune="subtree",
                    description="OUTRE: partition batches + historical embeddings + static CPU tier, rows read one by one")
NAME, prepare, run = PIPELINE.name, PIPELINE.prepare, PIPELINE.run
