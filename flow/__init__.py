"""The framework: what composes the operators into runs.

`flow` builds and runs the Dask graphs over `operators` (ingest, synthetic graphs, the preparation
graph and its phases, the streamed run), chooses the memory split between the feature and embedding
caches, and holds the runtimes that train each kind of loader, the pipeline definition and the
options the library shares, the cluster (its roles, worker plugin, TLS checks and allocator
settings), the dashboard page, run directories, reports, timelines and progress bars. It knows GNN
training as far as a run does (which pipeline, which model by name, which caches) and leaves the
arithmetic to `operators`, which never imports it. The command line is `diskflow.cli`, above the
public API (docs/design.md, "The packages").
"""

__all__: list[str] = []
