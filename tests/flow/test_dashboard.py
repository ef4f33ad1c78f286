"""The diskflow page on the scheduler's dashboard: a short streamed run on an embedded cluster, watched over HTTP
while it trains (``/diskflow``, ``/diskflow/data.json`` with Dask's fine performance metrics), its figures moving
and agreeing with report.json at the end; the same figures drawn from report.json; headless Chromium rendering
the page with no console error; and the link printed, or the page said absent. (A data-parallel run's lanes:
test_many_gpu_workers.py, on a `diskflow scheduler`.)"""
from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

distributed = pytest.importorskip("distributed")

from chromium import Chromium
from diskflow.bench.pageload import find_browser
from diskflow.flow.dashboard import links, state
from diskflow.flow.dashboard.figures import save_html
from diskflow.flow.dashboard.spans import phase_name, stream_tags
from diskflow.flow.roles import stream_client
from diskflow.flow.rundir import new_run_dir
from diskflow.pipelines import streaming

SETTINGS: dict[str, Any] = {"model": "sage", "hidden": 16, "fanouts": (5, 5), "batch_size": 256, "epochs": 1,
                            "lr": 0.01, "seed": 1, "threads": 1, "superbatch_size": 2, "device": "cpu",
                            "cpu_memory": 4_500_000, "window": 2, "progress": False}
SCREENSHOT_AT = 3       # superbatches trained when the browser opens the page

pytestmark = [pytest.mark.usefixtures("one_torch_thread")]


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200, url
        return bytes(r.read())


def _data(base: str) -> dict[str, Any]:
    return json.loads(_get(f"{base}/diskflow/data.json"))


@pytest.fixture(scope="module")
def watched(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A streamed run on an embedded cluster, polled over HTTP after every superbatch (and, where Chromium is
    installed, opened in it once), then the page's data once the workers' last metrics have arrived.

    The page learns of a trained superbatch from the GPU worker's event and of its measures from the worker's
    heartbeat, neither of which the run waits for; so each poll waits (`_wait_for`) until the page shows what
    the run had done when the callback ran: superbatch k trained and its packed bytes measured. What it shows
    then, and the packed bytes each superbatch's trainer read (``out["loader"]``), are what the tests check."""
    tmp = tmp_path_factory.mktemp("dash")
    polls: list[dict[str, Any]] = []
    read: list[int] = []        # packed bytes each superbatch's trainer read, as the driver got them
    shots: dict[str, Any] = {}
    browser = find_browser()
    with stream_client(None, cpu_workers=1, scratch=str(tmp / "scratch"), device="cpu", processes=False,
                       quiet=True) as client:
        _dashboard, page = links.client_links(client)
        assert page is not None and page.endswith("/diskflow")
        base = page.rsplit("/diskflow", 1)[0]

        def poll(out: dict[str, Any]) -> None:
            k = len(polls)
            assert out["index"] == k, (out["index"], k)
            read.append(int(out["loader"]["bytes_read"]))
            want = sum(read)
            polls.append(_wait_for(client, base, f"superbatch {k} trained and {want} packed bytes measured",
                                   lambda d: d["page"]["trained"] >= k + 1 and _packed(d) >= want))
            if len(polls) == 1:
                shots["html"] = _get(page).decode()
            if len(polls) == SCREENSHOT_AT and browser is not None:
                with Chromium(browser, tmp / "chromium") as chrome:
                    shots.update(chrome.render(page, tmp / "page.png", wait_for=_plots_drawn))

        rep = streaming.run(tiny_store, new_run_dir(tmp, "watched"), scheduler=client.scheduler.address,
                            on_superbatch=poll, **SETTINGS)
        final = _settled(client, base, rep)
        if browser is not None:     # Dask's own page, broken down by diskflow's spans and measures
            with Chromium(browser, tmp / "chromium-fpm") as chrome:
                shots["fpm"] = chrome.render(f"{base}/individual-fine-performance-metrics", tmp / "fpm.png",
                                             wait_for=_fpm_by_span, timeout=60)
    return {"report": rep, "polls": polls, "read": read, "final": final, "shots": shots, "browser": browser,
            "tmp": tmp}


WAIT_S = 60.0       # a guard against a hang: what a poll waits for comes within a heartbeat and a page refresh


async def _heartbeat(dask_worker: Any) -> None:
    """A worker's heartbeat, now: it sends the scheduler the fine performance metrics measured since the last."""
    await dask_worker.heartbeat()


def _packed(data: dict[str, Any]) -> int:
    """The packed bytes the page's fine performance metrics hold."""
    return int(data["fine_metrics"]["totals"].get("packed-read", {}).get("bytes", 0))


def _wait_for(client: Any, base: str, what: str, ready: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """The page's data once `ready` holds for it. Every worker sends its heartbeat before each look, so the
    metrics it measured are on the scheduler, and the page's data (computed at most once a second) shows them
    within about two seconds; an `AssertionError` naming `what` if it never does within `WAIT_S`."""
    deadline = time.monotonic() + WAIT_S
    while True:
        client.run(_heartbeat)
        data = _data(base)
        if ready(data):
            return data
        assert time.monotonic() < deadline, \
            f"the page never showed {what} within {WAIT_S:.0f} s: it shows {data['page']['trained']} " \
            f"superbatches trained and {_packed(data)} packed bytes measured"
        time.sleep(0.1)


def _settled(client: Any, base: str, rep: dict[str, Any]) -> dict[str, Any]:
    """The page's data once it holds the whole run: every superbatch trained, and in the fine performance metrics
    every packed byte the trainer read (the run is over, so one heartbeat of each worker carries them all)."""
    trained, want = rep["stream"]["trained"], rep["trainer"]["io"]["bytes_read"]
    return _wait_for(client, base, f"the run's {trained} superbatches trained and {want} packed bytes measured",
                     lambda d: d["page"]["trained"] >= trained and _packed(d) >= want)


# a JavaScript expression: true once every Bokeh figure of the page has a view with a drawn canvas
_plots_drawn = """(() => { if (!(window.Bokeh && Bokeh.index && Bokeh.index.roots)) return false;
  const all = []; const walk = v => { all.push(v); for (const c of (v.child_views || [])) walk(c); };
  [...Bokeh.index.roots].forEach(walk);
  const plots = all.filter(v => v.model && v.model.type === "Figure");
  const lanes = Bokeh.documents[0].get_model_by_name("diskflow-lanes");
  return plots.length === 5 && plots.every(p => p.canvas_view && p.canvas_view.bbox.width > 0)
    && lanes.renderers[0].data_source.data.y.length > 0; })()"""


# a JavaScript expression driving Dask's Fine Performance Metrics page as a user would: once its selectors offer
# diskflow's units and spans, show bytes for the span stream/train, then for prepare/pack; the value is what the
# execution pie showed for each ({activity: bytes}), false until both have been seen
_fpm_by_span = """(() => { if (!(window.Bokeh && Bokeh.documents && Bokeh.documents.length)) return false;
  const models = [...Bokeh.documents[0].all_models];
  const unit = models.find(m => m.type === "Select" && m.title === "Unit selection");
  const tags = models.find(m => m.type === "MultiChoice" && String(m.title).startsWith("Filter by span tag"));
  if (!unit || !tags) return false;
  const shown = {};
  for (const m of models) if (m.type === "ColumnDataSource" && m.data.activity)
    m.data.activity.forEach((a, i) => { shown[String(a)] = m.data.value[i]; });
  const s = window.__fpm || (window.__fpm = {step: 0});
  if (s.step === 0 && unit.options.includes("bytes") && tags.options.includes("stream/train")
      && tags.options.includes("prepare/pack")) {
    s.units = [...unit.options]; s.tags = [...tags.options];
    unit.value = "bytes"; tags.value = ["stream/train"]; s.step = 1;
  } else if (s.step === 1 && "packed-read" in shown) {
    s.train = shown; tags.value = ["prepare/pack"]; s.step = 2;
  } else if (s.step === 2 && "store-read" in shown && !("packed-read" in shown)) {
    s.pack = shown; s.step = 3;
  }
  return s.step === 3 && JSON.stringify(s); })()"""


def test_the_page_moves_while_it_trains(watched: dict[str, Any]) -> None:
    """Poll k (waited for until the page showed superbatch k trained) saw k + 1 or more trained, and no more than
    the run could have trained by then: k + window (superbatch k + window is prepared only after k's callback)."""
    polls = [p["page"] for p in watched["polls"]]
    total, window = watched["report"]["stream"]["superbatches"], SETTINGS["window"]
    assert len(polls) == total == 5 > window
    trained = [p["trained"] for p in polls]
    assert trained == sorted(trained), trained
    assert all(k + 1 <= t <= min(k + window, total) for k, t in enumerate(trained)), trained
    # packed bytes read as the page said then: at least superbatches 0..k's, at most 0..k + window - 1's
    cum = [sum(watched["read"][:k + 1]) for k in range(total)]
    assert cum[-1] == watched["report"]["trainer"]["io"]["bytes_read"], cum
    read = [p["totals"]["bytes_read"] for p in polls]
    assert read == sorted(read), read
    assert all(cum[k] <= r <= cum[min(k + window, total) - 1] for k, r in enumerate(read)), (read, cum)
    assert read[0] < read[-1] == cum[-1], read
    assert all(p["lanes"][0]["recent"] for p in polls)
    assert "bokeh" in watched["shots"]["html"].lower()


def test_the_page_agrees_with_report_json(watched: dict[str, Any]) -> None:
    rep, page = watched["report"], watched["final"]["page"]
    tr = rep["trainer"]
    assert page["trained"] == rep["stream"]["trained"] == 5
    assert page["totals"]["bytes_read"] == tr["io"]["bytes_read"] > 0
    assert page["totals"]["rows"] == {t: tr["tiers"]["rows"].get(t, 0) for t in state.TIERS}
    assert page["totals"]["rows"]["packed"] > 0, "out of core: packed reads"
    assert page["totals"]["batches"] == sum(len(e["losses"]) for e in rep["epochs"])
    lane = page["lanes"][0]
    assert lane["idle_share"] == pytest.approx(rep["stream"]["gpu_idle_fraction"], abs=1e-6)
    assert lane["floor_bps"] and lane["floor_bps"] > 0
    assert [r["key"] for r in lane["recent"]] == [e["key"] for e in rep["timeline"]][-state.RECENT:]
    # the same figures from report.json (`diskflow report`)
    again = state.from_report(rep)
    for k in ("trained", "superbatches"):
        assert again[k] == page[k]
    assert again["totals"] == {**page["totals"]}
    assert again["lanes"][0]["idle_share"] == pytest.approx(lane["idle_share"], abs=1e-6)


def test_fine_metrics_break_the_run_down_by_span(watched: dict[str, Any]) -> None:
    rep, fm = watched["report"], watched["final"]["fine_metrics"]
    spans = fm["spans"]
    assert {"prepare/sample", "prepare/plan", "prepare/pack", "stream/ship", "stream/train"} <= set(spans)
    assert {f"stream/superbatch-{k}" for k in range(5)} <= set(spans)
    totals = fm["totals"]
    assert totals["packed-read"]["bytes"] == rep["trainer"]["io"]["bytes_read"]
    rows = rep["trainer"]["tiers"]["rows"]
    assert totals["rows-packed"]["rows"] == rows["packed"]
    assert totals.get("rows-cpu-tier", {}).get("rows", 0) == rows["cpu"]
    assert totals["store-read"]["bytes"] > 0 and totals["written"]["bytes"] > 0
    assert spans["stream/train"]["packed-read"]["bytes"] == totals["packed-read"]["bytes"]
    assert "store-read" in spans["prepare/pack"] and "packed-read" not in spans["prepare/pack"]
    # what Dask times itself is not timed twice: no diskflow measure is in seconds
    assert not any("seconds" in units for label, units in totals.items() if label.startswith(("rows-", "packed-")))
    # the fine performance metrics move while it trains: poll k (waited for until they held superbatches 0..k's
    # packed bytes) saw no more than superbatches 0..k + window - 1 read
    polled = [_packed(p) for p in watched["polls"]]
    n, window = len(polled), SETTINGS["window"]
    cum = [sum(watched["read"][:k + 1]) for k in range(n)]
    assert polled == sorted(polled), polled
    assert all(cum[k] <= b <= cum[min(k + window, n) - 1] for k, b in enumerate(polled)), (polled, cum)
    assert 0 < polled[0] < polled[-1] == totals["packed-read"]["bytes"], polled


def test_chromium_renders_the_page_during_the_run(watched: dict[str, Any]) -> None:
    if watched["browser"] is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium); .ci/run installs it")
    shots = watched["shots"]
    assert shots["ready"], f"the page's plots did not render: {shots['errors']}"
    assert shots["errors"] == [], shots["errors"]
    png = Path(shots["png"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_dasks_fine_performance_metrics_page_breaks_the_run_down(watched: dict[str, Any]) -> None:
    """Dask's own page, driven in the browser: its unit and span selectors offer diskflow's measures and spans,
    and filtered to a span it shows that span's bytes, the trainer's packed reads equal to report.json's."""
    if watched["browser"] is None:
        pytest.skip("no Chromium here (Debian: apt-get install chromium); .ci/run installs it")
    fpm = watched["shots"]["fpm"]
    assert fpm["ready"], f"Dask's fine performance metrics page never showed both spans: {fpm['errors']}"
    assert fpm["errors"] == [], fpm["errors"]
    seen = json.loads(fpm["value"])
    assert {"bytes", "rows"} <= set(seen["units"])
    assert {"prepare/sample", "prepare/plan", "stream/train", "stream/superbatch-0"} <= set(seen["tags"])
    assert seen["train"]["packed-read"] == watched["report"]["trainer"]["io"]["bytes_read"]
    spans = watched["final"]["fine_metrics"]["spans"]
    assert seen["pack"]["store-read"] == spans["prepare/pack"]["store-read"]["bytes"] > 0


def test_report_draws_the_same_figures(watched: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "dashboard.html"
    save_html(state.from_report(watched["report"]), out)
    html = out.read_text()
    assert "diskflow-lanes" in html and "diskflow-idle" in html and "Bokeh" in html


def test_span_names() -> None:
    index = {"e0-s00002": 2}
    assert stream_tags("plan-e0-s00002-1234", index) == ("stream/superbatch-2", "prepare/plan")
    assert stream_tags("train-e0-s00002-1234-g1", index) == ("stream/superbatch-2", "stream/train")
    assert stream_tags("ship-base-1234", index) == ("stream/setup", "stream/base")
    assert stream_tags("count-e0-s00002-1234", index) == ("stream/setup", "prepare/count")
    assert phase_name("ingest: scan") == "ingest/scan"
    from diskflow.flow.dashboard.spans import command

    with command("prepare"):
        assert phase_name("sample") == "prepare/sample"


def test_a_scheduler_without_the_plugin_says_the_page_is_absent(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from distributed import Client, LocalCluster

    log = logging.getLogger("diskflow.test")
    with LocalCluster(n_workers=0, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client, \
            caplog.at_level(logging.INFO, logger="diskflow.test"):
        links.log_links(client, log)
        dashboard, page = links.remote_links(cluster.scheduler.address)
    assert "Dask dashboard: http" in caplog.text and f"diskflow page:  {links.ABSENT}" in caplog.text
    assert dashboard is not None and page is None
