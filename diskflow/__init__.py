"""diskflow: out-of-core GNN training as a Dask dataflow.

The distribution maps the repository's folders into this package:
`diskflow.flow` (framework, CLI), `diskflow.operators` (stages as plain functions),
`diskflow.native` (C++ kernels), `diskflow.pipelines` (pipeline definitions) and
`diskflow.bench` (side-by-side benchmarks).
"""
from __future__ import annotations

__version__ = "0.1.0"
