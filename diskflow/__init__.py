"""diskflow: out-of-core GNN training as a Dask dataflow.

The public names:
- the data side: `Pipeline` (a pipeline definition: how batches are drawn, the sampler and
  fanouts, the GPU and CPU tier policies, packing, the disk cache, the loader), `load_pipeline`
  (a built-in one by name, or the one a ``.py`` file defines), `TierPolicy` (the signature of a
  tier policy function);
- the compute side: `Model` (a model factory, with an optional loss) and `load_model`;
- the steps, as the commands of the same names run them (`diskflow.api`): `synth`, `ingest`,
  `prepare`, `train`, and the loaders for a loop of one's own, `PackedLoader` and `OnlineLoader`;
- `diskflow.pyg`: a store as PyG's remote backend (`FeatureStore`, `GraphStore`, a sampler);
- the errors every command raises (`DiskflowError`, `ConfigError`, `InputError`);
- the modules the command line uses beside these: `diskflow.config` (options' defaults and values),
  `diskflow.sizes`, `diskflow.datasets` (importers, stores, verify), `diskflow.runs` (run
  directories, reports, the timeline), `diskflow.cluster` (client, roles, TLS), `diskflow.errors`.

The distribution maps the repository's folders into this package: `diskflow.cli` (the command
line, over the public names only), `diskflow.flow` (framework), `diskflow.operators` (stages as
plain functions), `diskflow.native` (C++ kernels), `diskflow.pipelines` (pipeline definitions)
and `diskflow.bench` (side-by-side benchmarks).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any

__version__ = "0.1.0"
__all__ = ["ConfigError", "DiskflowError", "InputError", "Model", "OnlineLoader", "PackedLoader", "Pipeline",
           "TierPolicy", "ingest", "load_model", "load_pipeline", "prepare", "synth", "train"]


def __getattr__(name: str) -> Any:
    """The public names, imported on first use (``import diskflow`` alone stays light)."""
    if name == "pyg":
        import diskflow.pyg

        return diskflow.pyg
    home = _home(name)
    if home is None:
        raise AttributeError(f"module 'diskflow' has no attribute {name!r}")
    value = getattr(home, name)
    globals()[name] = value
    return value


def _home(name: str) -> ModuleType | None:
    """The module that defines the public name `name`, imported now; None for a name that is not one."""
    if name in ("Pipeline", "load_pipeline"):
        from .flow import pipeline
        return pipeline
    if name == "TierPolicy":
        from .operators.prepare import policies
        return policies
    if name in ("DiskflowError", "ConfigError", "InputError"):
        from . import errors
        return errors
    if name == "Model":
        from .operators.train import modeldef
        return modeldef
    if name == "load_model":
        from .operators.train import catalog
        return catalog
    if name in ("OnlineLoader", "PackedLoader", "ingest", "prepare", "synth", "train"):
        from . import api
        return api
    return None


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
