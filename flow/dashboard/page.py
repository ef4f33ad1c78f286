"""diskflow's scheduler plugin: the ``/diskflow`` page on the scheduler's dashboard, and its data.

`DashboardPlugin` is a ``distributed.SchedulerPlugin``. On the scheduler it

- folds every event of topic ``diskflow`` (`flow.dashboard.publish`) into `state.LiveRuns`, through the
  plugin hook ``log_event``: what the workers publish, never a file of the run;
- adds a Bokeh application at ``/diskflow`` to the scheduler's HTTP server (its own Bokeh server app
  beside Dask's, on the same port), whose figures (`flow.dashboard.figures`) refresh every second from
  that state, on the scheduler's event loop, far from any training thread;
- serves ``/diskflow/data.json`` (``?run=ID``: a given run's): the page's figures and the fine performance metrics of diskflow's
  spans (``{"page": ..., "fine_metrics": {"spans": {tag: {activity: {unit: value}}}, "totals": ...}}``),
  for scripts and tests;
- records the page's path in the scheduler's metadata (``diskflow/page``), which is how a client knows
  the page is there (`flow.dashboard.links`).

It comes with every embedded cluster diskflow starts and with `diskflow scheduler` (a ``--preload`` of
`flow.dashboard.preload`); a scheduler started without it runs every command, without the page.
"""
from __future__ import annotations

import json
import logging
import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado import web

from .links import METADATA, page_link
from .publish import TOPIC
from .state import LiveRuns

__all__ = ["DATA_ROUTE", "PLUGIN", "REFRESH_MS", "ROUTE", "SPAN_ROOTS", "DashboardPlugin", "DataHandler",
           "fine_metrics"]

log = logging.getLogger(__name__)

PLUGIN = "diskflow-dashboard"
ROUTE = "/diskflow"
DATA_ROUTE = "/diskflow/data.json"
REFRESH_MS = 1000
SPAN_ROOTS = ("prepare/", "stream/", "ingest/", "synth")


class DashboardPlugin(SchedulerPlugin):
    """Adds the ``/diskflow`` page and ``/diskflow/data.json`` to the scheduler it is registered on."""

    name = PLUGIN
    idempotent = True

    def __init__(self, announce: bool = False) -> None:
        self.announce = announce        # print the page's address once it is served (`diskflow scheduler`)
        self.runs = LiveRuns()
        self.scheduler: Any = None
        self.app: Any = None
        self._cache: dict[str | None, tuple[Any, float, dict[str, Any]]] = {}     # run -> (key, when, data)

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        if getattr(scheduler, "http_application", None) is None:
            return
        try:
            self._serve(scheduler)
        except ImportError as e:        # no bokeh: the JSON route only
            log.warning("the diskflow page needs bokeh (%s); serving %s only", e, DATA_ROUTE)
        scheduler.set_metadata(keys=METADATA, value=ROUTE)
        if self.announce:
            from distributed.comm import get_address_host
            from distributed.utils import format_dashboard_link

            link = format_dashboard_link(get_address_host(scheduler.address), scheduler.http_server.port)
            print(f"diskflow page at: {page_link(link, ROUTE)}", flush=True)

    async def close(self) -> None:
        if self.app is not None and self.scheduler is not None:
            apps = self.scheduler.http_application.applications
            if self.app in apps:
                apps.remove(self.app)
            self.app.stop()
            self.app = None

    def log_event(self, topic: str, msg: Any) -> None:
        if topic == TOPIC:
            self.runs.add(msg)

    # ------------------------------------------------------------------ HTTP
    def _serve(self, scheduler: Any) -> None:
        from tornado.ioloop import IOLoop

        scheduler.http_application.add_handlers(r".*", [(DATA_ROUTE, DataHandler, {"plugin": self})])
        from distributed.dashboard.core import BokehApplication

        self.app = BokehApplication({ROUTE: self._document}, scheduler, prefix="/")
        scheduler.http_application.add_application(self.app)
        self.app.initialize(IOLoop.current())
        self.app.start()

    def _document(self, scheduler: Any, extra: dict[str, Any], doc: Any) -> None:
        """One browser's page: the figures, refreshed from the folded events every `REFRESH_MS`."""
        from .figures import Page

        page = Page()
        page.update(self.runs.snapshot())
        seen = [self.runs.events]

        def refresh() -> None:      # only when an event came in: an idle page sends the browser nothing
            if self.runs.events != seen[0]:
                seen[0] = self.runs.events
                page.update(self.runs.snapshot())

        doc.title = "diskflow"
        doc.add_root(page.layout)
        doc.add_periodic_callback(refresh, REFRESH_MS)

    def data(self, run: str | None = None) -> dict[str, Any]:
        """What ``/diskflow/data.json[?run=ID]`` returns: the page's figures (of run ID, default the latest), the
        runs it knows, and the spans' fine performance metrics. Computed at most once per `REFRESH_MS` (for as
        many pollers as there are): it runs on the scheduler's event loop, which dispatches the run's tasks."""
        now = time.monotonic()
        key = (run, self.runs.events)
        cached = self._cache.get(run)
        if cached is None or (cached[0] != key and now - cached[1] >= REFRESH_MS / 1000) \
                or now - cached[1] >= 2 * REFRESH_MS / 1000:
            cached = self._cache[run] = (key, now, {
                "page": self.runs.snapshot(run), "runs": list(self.runs.runs), "events": self.runs.events,
                "fine_metrics": fine_metrics(self.scheduler)})
        return cached[2]


def fine_metrics(scheduler: Any) -> dict[str, Any]:
    """The fine performance metrics of diskflow's spans (Dask's, as its page shows them), by span tag, and
    their totals: ``{tag: {activity: {unit: value}}}``, tasks' execution only."""
    ext = getattr(scheduler, "extensions", {}).get("spans") if scheduler is not None else None
    if ext is None:
        return {"spans": {}, "totals": {}}

    def fold(metrics: dict[Any, float]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for key, value in metrics.items():
            if isinstance(key, tuple) and len(key) == 4 and key[0] == "execute":
                _, _, activity, unit = key
                out.setdefault(str(activity), {})
                out[str(activity)][str(unit)] = out[str(activity)].get(str(unit), 0.0) + float(value)
        return out

    tags = [t for t in ext.spans_search_by_tag if str(t).startswith(SPAN_ROOTS)]
    spans = {str(t): fold(ext.merge_by_tags(t).cumulative_worker_metrics) for t in sorted(tags)}
    roots = [sp for sp in ext.root_spans if sp.name and str(sp.name[0]).startswith(SPAN_ROOTS)]
    totals = fold(_merged(roots)) if roots else {}
    return {"spans": spans, "totals": totals}


def _merged(spans: list[Any]) -> dict[Any, float]:
    from distributed.spans import Span

    return Span.merge(*spans).cumulative_worker_metrics


class DataHandler(web.RequestHandler):
    """``GET /diskflow/data.json``: `DashboardPlugin.data` as JSON."""

    def initialize(self, plugin: DashboardPlugin) -> None:
        self.plugin = plugin

    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.write(json.dumps(self.plugin.data(self.get_argument("run", None)), default=str))
