"""diskflow: out-of-core GNN training as a Dask dataflow.

The public names: `Pipeline` (a pipeline definition: how batches are drawn, the sampler and
fanouts, the GPU and CPU tier policies, packing, the disk cache, the loader), `load_pipeline`
(a built-in one by name, or the one a ``.py`` file defines), `TierPolicy` (the signature of a
tier policy function) and the errors every command raises (`DiskflowError`, `ConfigError`,
`InputError`).

The distribution maps the repository's folders into this package:
`diskflow.flow` (framework, CLI), `diskflow.operators` (stages as plain functions),
`diskflow.native` (C++ kernels), `diskflow.pipelines` (pipeline definitions) and
`diskflow.bench` (side-by-side benchmarks).
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["ConfigError", "DiskflowError", "InputError", "Model", "Pipeline", "TierPolicy", "load_model",
           "load_pipeline"]

_PUBLIC = {"Pipeline": "diskflow.flow.pipeline", "load_pipeline": "diskflow.flow.pipeline",
           "TierPolicy": "diskflow.operators.prepare.policies", "DiskflowError": "diskflow.operators.formats.errors",
           "ConfigError": "diskflow.operators.formats.errors", "InputError": "diskflow.operators.formats.errors",
           "Model": "diskflow.operators.train.modeldef", "load_model": "diskflow.operators.train.modeldef"}


def __getattr__(name: str) -> Any:
    """The public names, imported on first use (``import diskflow`` alone stays light)."""
    if name not in _PUBLIC:
        raise AttributeError(f"module 'diskflow' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_PUBLIC[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
