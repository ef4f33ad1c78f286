"""The diskflow page's Bokeh figures, drawn from a snapshot (`flow.dashboard.state.summarize`).

`Page` builds the figures once and `update` refreshes their data sources in place: the live page
calls it every second on the scheduler's event loop, `diskflow report` once, from report.json, and
saves the same layout as a standalone HTML file (`save_html`). One row per GPU worker in the stage
lanes and the idle share; the other figures draw one line or bar per worker.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from .state import STAGES, TIERS

__all__ = ["LANE_COLORS", "MB", "STAGE_COLORS", "WIDTH", "Page", "headline", "save_html"]

STAGE_COLORS = {"load": "#1f77b4", "assemble": "#ff7f0e", "graph": "#2ca02c", "train": "#d62728"}
LANE_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
WIDTH = 640
MB = 1e6


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:,.1f} {unit}" if unit != "B" else f"{n:,.0f} B"
        n /= 1024
    return f"{n:,.1f} TiB"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def headline(snap: Mapping[str, Any]) -> str:
    """The page's summary line (HTML): run, progress, tiers, disk against its floor, idle share, lead."""
    if not snap.get("run"):
        return ("<b>diskflow</b>: no streamed run yet. Start one with <code>diskflow run streaming "
                "--scheduler ADDR</code>; this page fills as its GPU workers train.")
    t = snap["totals"]
    lanes = snap["lanes"]
    idle = ", ".join(f"GPU {ln['rank']} {_pct(ln['idle_share'])}" for ln in lanes)
    disk = [ln["disk_bps"] for ln in lanes if ln["disk_bps"]]
    floor = snap.get("floor_bps")
    disk_txt = _fmt_bytes(sum(disk) / len(disk)) + "/s" if disk else "n/a"
    floor_txt = f" (floor {_fmt_bytes(floor)}/s)" if floor else ""
    hits = ", ".join(f"{k} {_pct(v)}" for k, v in t["hit_rates"].items() if v)
    ahead = ", ".join(str(ln["ahead"]) for ln in lanes)
    return (f"<b>{snap['run']}</b>: {snap['trained']} of {snap['superbatches']} superbatches trained, "
            f"{t['batches']:,} batches; rows served: {hits or 'n/a'}; read {_fmt_bytes(t['bytes_read'])} of packed "
            f"files at {disk_txt}{floor_txt}; GPU idle: {idle or 'n/a'}; packed ahead: {ahead or 'n/a'} superbatches")


class Page:
    """The figures and their sources; `layout` is what a document shows."""

    def __init__(self) -> None:
        import bokeh.models
        from bokeh.layouts import column, row
        from bokeh.plotting import figure

        models: Any = bokeh.models      # (its names are made at import: untyped here)
        ColumnDataSource, Div, FactorRange, HoverTool, Range1d, Span = (
            models.ColumnDataSource, models.Div, models.FactorRange, models.HoverTool, models.Range1d, models.Span)

        self.lanes_y, self.tier_x, self.idle_y = FactorRange(), FactorRange(), FactorRange()
        self.head = Div(text=headline({}), width=2 * WIDTH)
        self.lanes_src = ColumnDataSource({"y": [], "left": [], "right": [], "color": [], "alpha": [], "key": [], "busy": []})
        self.lanes_fig = figure(title="Stage lanes, last superbatches (shade: the stage's busy share)",
                                y_range=self.lanes_y, width=2 * WIDTH, height=220, x_axis_label="seconds since start",
                                tools="pan,wheel_zoom,box_zoom,reset,save", name="diskflow-lanes")
        self.lanes_fig.hbar(y="y", left="left", right="right", height=0.8, color="color", fill_alpha="alpha",
                            line_color="white", source=self.lanes_src)
        self.lanes_fig.add_tools(HoverTool(tooltips=[("superbatch", "@key"), ("busy", "@busy{0.000} s")]))

        self.lead_src = ColumnDataSource({"xs": [], "ys": [], "color": [], "label": []})
        self.ahead_src = ColumnDataSource({"x": [], "y": [], "color": [], "label": []})
        self.lead_fig = figure(title="Preparation's lead: shipped this long before the trainer was free (s)",
                               width=WIDTH, height=260, x_axis_label="superbatch", name="diskflow-lead")
        self.lead_fig.multi_line(xs="xs", ys="ys", color="color", legend_field="label", line_width=2,
                                 source=self.lead_src)
        self.lead_fig.scatter(x="x", y="y", color="color", size=6, source=self.ahead_src)
        self.lead_fig.add_layout(Span(location=0, dimension="width", line_dash="dashed", line_color="gray"))
        self.lead_fig.add_tools(HoverTool(tooltips=[("superbatch", "@x"), ("lead", "@y{0.00} s"), ("", "@label")]))

        self.tier_src = ColumnDataSource({"x": [], "top": [], "color": [], "rows": []})
        self.tier_fig = figure(title="Tier hit rates (share of rows served)", x_range=self.tier_x,
                               y_range=Range1d(start=0, end=1),
                               width=WIDTH, height=260, name="diskflow-tiers")
        self.tier_fig.vbar(x="x", top="top", width=0.8, color="color", source=self.tier_src)
        self.tier_fig.add_tools(HoverTool(tooltips=[("", "@x"), ("share", "@top{0.0%}"), ("rows", "@rows{0,0}")]))

        self.disk_src = ColumnDataSource({"xs": [], "ys": [], "color": [], "label": []})
        self.disk_fig = figure(title="Packed reads, MB/s per superbatch, vs the disk's floor (dashed)",
                               width=WIDTH, height=260, x_axis_label="superbatch", y_axis_type="log",
                               name="diskflow-disk")
        self.disk_fig.multi_line(xs="xs", ys="ys", color="color", legend_field="label", line_width=2,
                                 source=self.disk_src)
        self.floor_src = ColumnDataSource({"x": [], "y": []})
        self.disk_fig.line(x="x", y="y", line_dash="dashed", line_color="black", legend_label="floor",
                           source=self.floor_src)

        self.idle_src = ColumnDataSource({"y": [], "right": [], "color": [], "text": []})
        self.idle_fig = figure(title="GPU workers' idle share", y_range=self.idle_y,
                               x_range=Range1d(start=0, end=1),
                               width=WIDTH, height=260, name="diskflow-idle")
        self.idle_fig.hbar(y="y", right="right", left=0, height=0.6, color="color", source=self.idle_src)
        self.idle_fig.add_tools(HoverTool(tooltips=[("", "@y"), ("idle", "@right{0.0%}"), ("", "@text")]))
        for fig in (self.lead_fig, self.disk_fig):
            fig.legend.location = "top_left"
            fig.legend.label_text_font_size = "8pt"

        self.layout = column(self.head, self.lanes_fig, row(self.lead_fig, self.tier_fig),
                             row(self.disk_fig, self.idle_fig), name="diskflow-page")

    def update(self, snap: Mapping[str, Any]) -> None:
        """Refresh every figure from a snapshot (`state.summarize`)."""
        self.head.text = headline(snap)
        lanes = snap.get("lanes") or []
        color = {ln["rank"]: LANE_COLORS[ln["rank"] % len(LANE_COLORS)] for ln in lanes}
        label = {ln["rank"]: f"GPU {ln['rank']}" for ln in lanes}

        y, left, right, col, alpha, key, busy = [], [], [], [], [], [], []
        factors = []
        for ln in lanes:
            for s in STAGES:
                factors.append(f"GPU {ln['rank']} {s}")
            for r in ln["recent"]:
                span = max(r["t1"] - r["t0"], 1e-9)
                for s in STAGES:
                    y.append(f"GPU {ln['rank']} {s}")
                    left.append(r["t0"])
                    right.append(r["t1"])
                    col.append(STAGE_COLORS[s])
                    alpha.append(0.15 + 0.85 * min(1.0, r["stages"].get(s, 0.0) / span))
                    key.append(str(r["key"]))
                    busy.append(r["stages"].get(s, 0.0))
        self.lanes_y.factors = list(reversed(factors))
        self.lanes_src.data = {"y": y, "left": left, "right": right, "color": col, "alpha": alpha, "key": key, "busy": busy}

        self.lead_src.data = {
            "xs": [[r["index"] for r in ln["superbatches"] if r["lead_s"] is not None] for ln in lanes],
            "ys": [[r["lead_s"] for r in ln["superbatches"] if r["lead_s"] is not None] for ln in lanes],
            "color": [color[ln["rank"]] for ln in lanes], "label": [label[ln["rank"]] for ln in lanes]}
        pts = [(r["index"], r["lead_s"], color[ln["rank"]], f"{r['ahead']} packed ahead")
               for ln in lanes for r in ln["superbatches"] if r["lead_s"] is not None]
        self.ahead_src.data = {"x": [p[0] for p in pts], "y": [p[1] for p in pts], "color": [p[2] for p in pts],
                                   "label": [p[3] for p in pts]}

        bars = [((t, label[ln["rank"]]), ln["hit_rates"][t] or 0.0, color[ln["rank"]], ln["rows"][t])
                for t in TIERS for ln in lanes if any(x["rows"][t] for x in lanes)]
        self.tier_x.factors = [b[0] for b in bars]
        self.tier_src.data = {"x": [b[0] for b in bars], "top": [b[1] for b in bars], "color": [b[2] for b in bars],
                                  "rows": [b[3] for b in bars]}

        self.disk_src.data = {"xs": [[r["index"] for r in ln["superbatches"]] for ln in lanes],
                                  "ys": [[r["disk_bps"] / MB for r in ln["superbatches"]] for ln in lanes],
                                  "color": [color[ln["rank"]] for ln in lanes], "label": [label[ln["rank"]] for ln in lanes]}
        floor = snap.get("floor_bps")
        xs = [r["index"] for ln in lanes for r in ln["superbatches"]]
        self.floor_src.data = {"x": [min(xs), max(xs)], "y": [floor / MB] * 2} if floor and xs else {"x": [], "y": []}

        self.idle_y.factors = [label[ln["rank"]] for ln in reversed(lanes)]
        self.idle_src.data = {"y": [label[ln["rank"]] for ln in lanes],
                                  "right": [ln["idle_share"] or 0.0 for ln in lanes],
                                  "color": [color[ln["rank"]] for ln in lanes],
                                  "text": [f"{ln['trained']} superbatches, {ln['batches']} batches, {ln['worker']}"
                                        for ln in lanes]}


def save_html(snap: Mapping[str, Any], path: str | os.PathLike[str], title: str = "diskflow") -> None:
    """The page's figures of `snap` as one standalone HTML file (Bokeh's JavaScript inline: opens offline)."""
    from bokeh.embed import file_html
    from bokeh.resources import INLINE

    page = Page()
    page.update(snap)
    with open(path, "w", encoding="utf-8") as f:
        f.write(file_html(page.layout, INLINE, title))
