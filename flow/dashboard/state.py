"""The diskflow page's figures: the workers' events folded on the scheduler, or a finished run's report.json.

Both sources become the same records, one per GPU worker (lane) and superbatch: when it was packed and
shipped, when its ``train`` task ran (``t0``, ``t1``, seconds since the run started), its stages' busy
seconds, the bytes it read from packed files and the rows each tier served. `summarize` turns them into
the page's figures (a JSON-able dict), so the live page and `diskflow report` draw the same thing:

- per lane, the last `RECENT` superbatches with their stage lanes (load, assemble, graph, train);
- the preparation's lead: for each superbatch, how long before the trainer was free of the previous one
  it was shipped (negative: the trainer waited), and how many superbatches were packed ahead of it;
- tier hit rates; disk bytes per second next to the floor measured as the run started;
- each GPU worker's idle share: 1 - its train tasks' busy time / the time since the run started (at
  the end, report.json's ``gpu_idle_fraction``).
"""
from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MAX_RUNS", "RECENT", "STAGES", "TIERS", "LiveRuns", "from_report", "summarize"]

RECENT = 8                  # superbatches per lane the stage lanes show
STAGES = ("load", "assemble", "graph", "train")
TIERS = ("gpu", "cpu", "packed", "dcache", "store")
MAX_RUNS = 4                # runs a scheduler remembers (the page shows the latest)


def _num(x: Any) -> float | None:
    """A finite float, or None (JSON has no nan)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


class LiveRuns:
    """The scheduler's side: events of topic ``diskflow`` (`flow.dashboard.publish`) folded per run and lane.

    Events of a run arrive from the driver (``run``: its id, clock, superbatches, lanes), the GPU
    workers (``floor``, ``shipped``, ``trained``) and the CPU workers (``packed``); a lane is a GPU
    worker's job (``job``), named in the ``run`` event. Cheap: a dict update per event.
    """

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        self.floors: dict[str, float] = {}          # GPU worker address -> bytes/s
        self.jobs: dict[str, tuple[str, int]] = {}  # job -> (run, rank)
        self.events = 0

    def add(self, msg: Mapping[str, Any]) -> None:
        """Fold one event (unknown kinds and malformed events are ignored: the page never fails a run)."""
        if not isinstance(msg, Mapping):
            return
        self.events += 1
        kind = msg.get("kind")
        if kind == "run":
            self._start(msg)
        elif kind == "floor":
            bps = _num(msg.get("bps"))
            if bps is not None:
                self.floors[str(msg.get("worker"))] = bps
        elif kind in ("packed", "shipped", "trained"):
            job = str(msg.get("job"))
            run_rank = self.jobs.get(job)
            if run_rank is None:            # a run whose start the scheduler missed: one lane per job
                self._start({"run": job, "t_start": msg.get("t", time.time()), "lanes": [{"job": job, "rank": 0}]})
                run_rank = self.jobs[job]
            run, rank = run_rank
            lane = self.runs[run]["lanes"][rank]
            rec = lane["records"].setdefault(int(msg.get("index", -1)), {"index": int(msg.get("index", -1))})
            self._fold(self.runs[run], lane, rec, kind, msg)

    def _start(self, msg: Mapping[str, Any]) -> None:
        run = str(msg.get("run"))
        lanes: dict[int, dict[str, Any]] = {int(ln.get("rank", i)): {"rank": int(ln.get("rank", i)), "job": str(ln.get("job")),
                                         "worker": str(ln.get("worker", "")), "records": {}}
                 for i, ln in enumerate(msg.get("lanes") or [])}
        self.runs[run] = {"run": run, "t_start": float(msg.get("t_start") or time.time()),
                          "superbatches": int(msg.get("superbatches") or 0), "start": int(msg.get("start") or 0),
                          "lanes": lanes, "done": False}
        for lane in lanes.values():
            self.jobs[lane["job"]] = (run, lane["rank"])
        while len(self.runs) > MAX_RUNS:
            old = next(iter(self.runs))
            for job in [j for j, (r, _) in self.jobs.items() if r == old]:
                del self.jobs[job]
            del self.runs[old]

    @staticmethod
    def _fold(run: dict[str, Any], lane: dict[str, Any], rec: dict[str, Any], kind: str, msg: Mapping[str, Any]) -> None:
        t0 = run["t_start"]
        if kind == "packed":
            rec.update(key=msg.get("key"), t_pack=float(msg["t"]) - t0,
                       store_read_bytes=int(msg.get("store_read_bytes") or 0))
        elif kind == "shipped":
            rec.update(t_ship=float(msg["t"]) - t0, written_bytes=int(msg.get("written_bytes") or 0))
        else:
            lane["worker"] = str(msg.get("worker", lane["worker"]))
            rec.update(key=msg.get("key"), t0=float(msg["t0"]) - t0, t1=float(msg["t1"]) - t0,
                       stages=dict(msg.get("stages") or {}), rows=dict(msg.get("rows") or {}),
                       bytes_read=int(msg.get("bytes_read") or 0), read_s=float(msg.get("read_s") or 0.0),
                       batches=int(msg.get("batches") or 0))

    def latest(self) -> str | None:
        """The run the page shows: the one that started last."""
        return next(reversed(self.runs), None)

    def snapshot(self, run: str | None = None) -> dict[str, Any]:
        """The page's figures of `run` (default: the latest), `summarize`d."""
        run = run or self.latest()
        if run is None or run not in self.runs:     # (an unknown run: an empty page, not an error)
            return summarize(None, [], 0, now=None)
        r = self.runs[run]
        lanes = [{"rank": ln["rank"], "worker": ln["worker"], "floor_bps": self.floors.get(ln["worker"]),
                  "records": sorted(ln["records"].values(), key=lambda x: x["index"])}
                 for _, ln in sorted(r["lanes"].items())]
        return summarize(run, lanes, r["superbatches"], now=time.time() - r["t_start"], start=r["start"])


def from_report(report: Mapping[str, Any]) -> dict[str, Any]:
    """The page's figures of a finished streamed run, from its report.json (`flow.stream.report`)."""
    stream = report.get("stream") or {}
    timeline = report.get("timeline") or []
    floors = stream.get("floor_bps") or []
    gpus = int(stream.get("gpus") or 1)
    workers = stream.get("gpu_workers") or [stream.get("gpu_worker")]
    lanes: list[dict[str, Any]] = [{"rank": r, "worker": workers[r] if r < len(workers) else "",
                                    "floor_bps": floors[r] if r < len(floors) else None, "records": []}
                                   for r in range(gpus)]
    for e in timeline:
        parts = e.get("lanes") if gpus > 1 else [e]
        for r, part in enumerate(parts or []):
            ph = part.get("phases", {})
            if "train" not in ph:
                continue
            loader = part.get("loader") or {}
            lanes[r]["records"].append({
                "index": int(e["index"]), "key": e.get("key"), "t_pack": ph.get("pack", {}).get("end"),
                "t_ship": ph.get("ship", {}).get("end"), "t0": ph["train"]["start"], "t1": ph["train"]["end"],
                "stages": loader.get("stages", {}), "rows": loader.get("rows", {}),
                "bytes_read": int(loader.get("bytes_read") or 0), "read_s": float(loader.get("read_s") or 0.0),
                "batches": int(part.get("batches") or 0),
                "store_read_bytes": int((part.get("figures") or {}).get("store_read_bytes") or 0),
                "written_bytes": int(part.get("bytes") or 0)})
    return summarize(str(stream.get("run") or report.get("run_dir") or ""), lanes,
                     int(stream.get("superbatches") or len(timeline)), now=None,
                     start=int(stream.get("start_index") or 0))


def summarize(run: str | None, lanes: Sequence[Mapping[str, Any]], superbatches: int, *, now: float | None,
              start: int = 0) -> dict[str, Any]:
    """The page's figures from per-lane superbatch records (see the module docstring)."""
    out_lanes: list[dict[str, Any]] = []
    # the run's clock ends at its last trained superbatch, on any GPU worker (report.json's ``stream_s``)
    end = max((r["t1"] for lane in lanes for r in lane["records"] if "t1" in r), default=0.0)
    for lane in lanes:
        recs = list(lane["records"])
        trained = [r for r in recs if "t1" in r]
        rows = {t: sum(int(r.get("rows", {}).get(t, 0)) for r in trained) for t in TIERS}
        total_rows = sum(rows.values())
        busy = sum(r["t1"] - r["t0"] for r in trained)
        bytes_read = sum(r.get("bytes_read", 0) for r in trained)
        read_s = sum(r.get("read_s", 0.0) for r in trained)
        recent = []
        prev_end: float | None = None
        packed_at = sorted((r["t_pack"], r["index"]) for r in recs if r.get("t_pack") is not None)
        for r in trained:
            ready = r.get("t_ship")
            # how long before the trainer was free (the previous superbatch trained) this one was on its disk
            lead = (prev_end - ready) if prev_end is not None and ready is not None else None
            prev_end = r["t1"]
            ahead = sum(1 for t, j in packed_at if j > r["index"] and t <= r["t1"])
            span = max(r["t1"] - r["t0"], 1e-9)
            recent.append({"index": r["index"], "key": r.get("key"), "t0": r["t0"], "t1": r["t1"],
                           "stages": {s: float(r.get("stages", {}).get(s, 0.0)) for s in STAGES},
                           "batches": r.get("batches", 0), "bytes_read": r.get("bytes_read", 0),
                           "disk_bps": r.get("bytes_read", 0) / span, "lead_s": lead, "ahead": ahead})
        packed = [r for r in recs if r.get("t_pack") is not None]
        out_lanes.append({
            "rank": lane["rank"], "worker": lane.get("worker", ""), "floor_bps": _num(lane.get("floor_bps")),
            "trained": len(trained), "packed": len(packed),
            "ahead": len([r for r in packed if "t1" not in r]),
            "batches": sum(r.get("batches", 0) for r in trained),
            "bytes_read": bytes_read, "read_s": read_s,
            "store_read_bytes": sum(int(r.get("store_read_bytes") or 0) for r in recs),
            "written_bytes": sum(int(r.get("written_bytes") or 0) for r in recs),
            "rows": rows, "hit_rates": {t: (rows[t] / total_rows if total_rows else None) for t in TIERS},
            "busy_s": busy, "idle_share": (1.0 - busy / end) if end > 0 else None,
            "disk_bps": bytes_read / busy if busy > 0 else None,
            "superbatches": recent, "recent": recent[-RECENT:]})
    rows = {t: sum(ln["rows"][t] for ln in out_lanes) for t in TIERS}
    total = sum(rows.values())
    floors = [ln["floor_bps"] for ln in out_lanes if ln["floor_bps"] is not None]
    done = min((int(ln["trained"]) for ln in out_lanes), default=0)
    return {"run": run, "now": now, "superbatches": superbatches, "start": start, "trained": done,
            "lanes": out_lanes, "floor_bps": min(floors) if floors else None,
            "totals": {"batches": sum(ln["batches"] for ln in out_lanes),
                       "bytes_read": sum(ln["bytes_read"] for ln in out_lanes),
                       "store_read_bytes": sum(ln["store_read_bytes"] for ln in out_lanes),
                       "written_bytes": sum(ln["written_bytes"] for ln in out_lanes),
                       "rows": rows, "hit_rates": {t: (rows[t] / total if total else None) for t in TIERS}}}
