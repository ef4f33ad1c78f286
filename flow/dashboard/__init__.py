"""diskflow on the Dask dashboard: a run watched while it runs, through Dask's own means (docs/design.md,
"Watching a run").

- `spans`: every preparation phase and every superbatch of a streamed run runs in a Dask span named
  after it (``prepare/sample``, ``stream/superbatch-12``), so Dask's "Fine Performance Metrics" page
  breaks a run down by them.
- `publish`: what the tasks report, on the worker: diskflow's measures through
  ``distributed.metrics.context_meter`` (bytes and rows, never seconds: Dask times the tasks itself),
  and one small event per superbatch and stage (``worker.log_event``, topic ``diskflow``).
- `state`: the scheduler's side, the events folded into the figures of the page (`Snapshot`); the same
  figures from a finished run's report.json.
- `figures`: the page's Bokeh figures, for the live page and for `diskflow report`.
- `page`: the scheduler plugin that serves ``/diskflow`` (the page) and ``/diskflow/data.json``.
- `links`: the page's address printed beside the dashboard's, or why there is none.
- `floor`: the GPU worker's scratch disk read bandwidth, measured as a run starts.
"""

__all__: list[str] = []
