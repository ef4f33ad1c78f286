"""The streamed pipeline: belady's layout prepared on CPU workers, superbatch by superbatch, while the GPU
worker(s) train the ones already shipped (`flow.runtimes.stream`).

    diskflow run streaming --dataset STORE [--scheduler ADDR] [--gpus N] ...
"""
from __future__ import annotations

from ..flow.pipeline import Pipeline

__all__ = ["NAME", "PIPELINE", "run"]

PIPELINE = Pipeline("streaming", loader="stream", description="belady's layout prepared on CPU workers while the GPU worker trains")
NAME, run = PIPELINE.name, PIPELINE.run
