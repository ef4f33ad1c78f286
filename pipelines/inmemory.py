"""The in-memory pipeline: every feature in RAM, sample and gather per batch, train.

The accuracy reference and the speed ceiling for the out-of-core pipelines: the same session, the same
batches, only the loader differs (`flow.runtimes.memory`).

    diskflow run inmemory --dataset STORE [--model sage|gcn|gat|mlp|FILE.py] ...
"""
from __future__ import annotations

from ..flow.pipeline import Pipeline

__all__ = ["NAME", "PIPELINE", "run"]

PIPELINE = Pipeline("inmemory", loader="memory", description="every feature in RAM: the accuracy reference and speed ceiling")
NAME, run = PIPELINE.name, PIPELINE.run
