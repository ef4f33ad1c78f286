"""What diskflow's tasks publish on a worker: Dask fine performance metrics and the page's events.

Measures go through ``distributed.metrics.context_meter``: inside a task, Dask files each under the
task's span and prefix, so the "Fine Performance Metrics" page breaks every span down by them. Only
quantities Dask does not measure are reported (bytes and rows); a task's seconds are Dask's own
(``thread-cpu``, ``thread-noncpu``), so timing a task again would count it twice.

Events (``worker.log_event``, topic `TOPIC`) carry the figures of one superbatch at a time to the
scheduler, where the diskflow page folds them (`flow.dashboard.state`). A worker's ``log_event`` from
a task thread only queues the message for its event loop: it never waits on the network, and a task
sends one per superbatch, after the superbatch, so nothing here runs per batch or on the training
thread's critical path. Outside a worker (a local run) both are no-ops.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["BYTES", "PACKED_READ", "ROWS", "STORE_READ", "TIER_LABELS", "TOPIC", "WRITTEN", "Metered",
           "measure", "measure_rows", "publish", "stage_delta"]

TOPIC = "diskflow"

# The measures' labels, as the Fine Performance Metrics page lists them (activity), and their units.
STORE_READ = "store-read"           # feature bytes a task read from the store
PACKED_READ = "packed-read"         # bytes the trainer read from packed files (direct I/O)
WRITTEN = "written"                 # bytes a task wrote (a shipped superbatch staged on scratch)
TIER_LABELS = {"gpu": "rows-gpu-tier", "cpu": "rows-cpu-tier", "packed": "rows-packed",
               "dcache": "rows-disk-cache", "store": "rows-store"}
BYTES, ROWS = "bytes", "rows"


def measure(label: str, value: float, unit: str) -> None:
    """Report `value` `unit` of `label` for the running task (Dask's context meter; nothing outside a task)."""
    if value:
        from distributed.metrics import context_meter

        context_meter.digest_metric(label, float(value), unit)


def measure_rows(rows: Mapping[str, int]) -> None:
    """Rows served per tier (``gpu``, ``cpu``, ``packed``, ``dcache``, ``store``) by the running task."""
    for tier, n in rows.items():
        measure(TIER_LABELS.get(tier, f"rows-{tier}"), n, ROWS)


def publish(kind: str, **fields: Any) -> None:
    """Send one event of `kind` to the scheduler (msgpack-able fields); a no-op outside a Dask worker."""
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:
        return
    worker.log_event(TOPIC, {"kind": kind, "worker": str(worker.address), "t": time.time(), **fields})


def stage_delta(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> dict[str, Any]:
    """One superbatch's share of a loader's cumulative figures (`PackedLoader.stats`): stage busy seconds,
    bytes read and requests, rows per tier. `before` None: the loader was new (everything is this one's)."""
    def get(d: Mapping[str, Any] | None, *path: str) -> float:
        for p in path:
            if not isinstance(d, Mapping):
                return 0.0
            d = d.get(p)
        return float(d or 0.0) if not isinstance(d, Mapping) else 0.0

    stages = {k: get(after, "stages", k, "busy_s") - get(before, "stages", k, "busy_s") for k in after.get("stages", {})}
    rows = {k: int(get(after, "tiers", "rows", k) - get(before, "tiers", "rows", k))
            for k in after.get("tiers", {}).get("rows", {})}
    return {"stages": stages, "rows": rows,
            "bytes_read": int(get(after, "io", "bytes_read") - get(before, "io", "bytes_read")),
            "read_s": get(after, "io", "seconds") - get(before, "io", "seconds")}


class Metered:
    """A preparation task (`flow.graph.delayed_submit`) that reports the bytes its result says it read and
    wrote (``bytes_read``: the store's feature bytes; ``bytes_written`` and ``target_bytes_written``: packed
    and tier files) as Dask measures. Picklable; the function's own result is returned unchanged."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.fn(*args, **kwargs)
        if isinstance(out, Mapping) and "distributed" in sys.modules:
            measure(STORE_READ, float(out.get("bytes_read") or 0), BYTES)
            measure(WRITTEN, float(out.get("bytes_written") or 0) + float(out.get("target_bytes_written") or 0),
                    BYTES)
        return out
