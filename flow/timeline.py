"""A run's timeline as a picture: what each machine did when (a Gantt chart), and the key numbers.

A streamed run (`plot_timeline`): one row per worker, the CPU workers' ``sample``/``plan``/``pack``
tasks and the GPU worker's ``ship``/``train`` tasks, each superbatch's bars labelled with its key,
on the stream's clock (seconds since the first submission). Gaps in the GPU worker's row are the
time it waited.

A job of Dask steps and then training in this process (`JobTimeline`, what `diskflow demo` draws):
one row per Dask worker with its ``synth``/``ingest``/``sample``/``plan``/``pack`` tasks as the
scheduler's task stream recorded them, and a row for the trainer with the time it spent on each
superbatch's batches and on evaluation.
"""
from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..operators.formats.atomic import atomic_path
from ..operators.formats.sizes import format_bytes

__all__ = ["COLORS", "JOB_COLORS", "TIMELINE", "TRAINER", "JobTimeline", "Span", "draw_gantt", "key_numbers",
           "plot_timeline", "task_phase"]

TIMELINE = "timeline.png"
COLORS = {"sample": "#8ecae6", "plan": "#219ebc", "pack": "#023047", "ship": "#ffb703", "train": "#fb8500"}
Span = tuple[str, float, float, str | None]    # (phase, start s, end s, label written inside the bar or None)
JOB_COLORS = {"synth": "#d4a373", "ingest": "#adb5bd", "sample": COLORS["sample"], "plan": COLORS["plan"],
              "pack": COLORS["pack"], "train": COLORS["train"], "eval": "#9d0208"}
TRAINER = "trainer (this process)"
_SUPERBATCH = re.compile(r"(?:^|-)e(\d+)-s(\d+)(?:-|$)")


def key_numbers(report: dict[str, Any]) -> dict[str, Any]:
    """The figures a streamed run is judged by (printed by `diskflow report`, written on the chart)."""
    s = report.get("stream") or {}
    scratch = s.get("scratch") or {}
    epochs = report.get("epochs") or []
    return {
        "superbatches": s.get("superbatches"), "window": s.get("window"), "trained": s.get("trained"),
        "stream_s": s.get("stream_s"), "train_busy_s": s.get("train_busy_s"),
        "gpu_idle_fraction": s.get("gpu_idle_fraction"),
        "scratch_peak_bytes": scratch.get("peak_disk") or scratch.get("peak"), "scratch_quota_bytes": scratch.get("quota"),
        "held_peak_bytes": scratch.get("peak_memory"), "hold_memory_bytes": scratch.get("hold_memory"),
        "final_loss": epochs[-1].get("loss") if epochs else None,
        "test_acc": (report.get("final") or {}).get("test_acc"),
        "gpu_worker": s.get("gpu_worker"), "cpu_workers": len(s.get("cpu_workers") or []),
        "reshipped": s.get("reshipped") or [],
    }


def _fmt(v: Any, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def plot_timeline(run_dir: str | os.PathLike[str], report: dict[str, Any], path: str | os.PathLike[str] | None = None
                  ) -> Path | None:
    """Draw the report's timeline to `run_dir/timeline.png` (or `path`); None when it has none."""
    tl = report.get("timeline") or []
    if not tl:
        return None
    stream = report.get("stream") or {}
    gpus = set(stream.get("gpu_workers") or [stream.get("gpu_worker")])
    workers: dict[str, list[Span]] = {}
    for e in tl:
        for lane in e.get("lanes") or [e]:          # a data-parallel run: every GPU worker's share
            for phase, p in lane["phases"].items():
                workers.setdefault(p["worker"], []).append((phase, p["start"], p["end"], _superbatch_label(e["key"])
                                                            if phase in ("train", "pack") else None))
    order = sorted(workers, key=lambda w: (w in gpus, w))
    k = key_numbers(report)
    title = (f"{report.get('title', 'streaming')}\n"
             f"{k['trained']} superbatches in {_fmt(k['stream_s'], '.1f')} s, GPU busy "
             f"{_fmt(k['train_busy_s'], '.1f')} s, idle {_fmt((k['gpu_idle_fraction'] or 0) * 100, '.0f')}%, "
             f"window {k['window']}, scratch peak "
             f"{format_bytes(k['scratch_peak_bytes']) if k['scratch_peak_bytes'] else '-'}"
             f"{' of ' + format_bytes(k['scratch_quota_bytes']) if k['scratch_quota_bytes'] else ''}, "
             f"final loss {_fmt(k['final_loss'], '.4f')}")
    return draw_gantt([(f"GPU {w}" if w in gpus else f"CPU {w}", workers[w]) for w in order], COLORS, title,
                      "seconds since the first submission (bars: epoch.superbatch)",
                      Path(path) if path is not None else Path(run_dir) / TIMELINE,
                      end=max(x["trained"] for x in tl))


def _superbatch_label(key: str) -> str:
    """``e0-s00003`` -> ``e0.3``: a superbatch's epoch and index, short enough for a bar."""
    e, s_ = key.split("-")
    return f"{e}.{int(s_[1:])}"


def draw_gantt(rows: Sequence[tuple[str, Sequence[Span]]], colors: dict[str, str], title: str, xlabel: str,
               out: Path, end: float | None = None) -> Path:
    """One row of bars per worker, bottom to top as `rows` lists them: each span ``(phase, start, end,
    label)`` in its phase's colour, its label written inside when the bar is wide enough; ``ship`` spans
    on a thin lane above the row (they run beside ``train`` there). The x axis runs to `end` (default:
    the last span's end). Written as a PNG to `out` (atomically)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    end = end if end is not None else max((s[2] for _, spans in rows for s in spans), default=1.0)
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.55 * len(rows)))
    try:
        for row, (_, spans) in enumerate(rows):
            for phase, start, stop, label in spans:
                # ship runs beside train on the GPU worker: a thin lane above it, so neither hides the other
                y, h = (row + 0.36, 0.22) if phase == "ship" else (row, 0.6)
                ax.barh(y, max(stop - start, 1e-3), left=start, height=h, color=colors.get(phase, "grey"),
                        edgecolor="white", linewidth=0.4)
                if label and stop - start > 0.035 * end:
                    ax.text((start + stop) / 2, row, label, ha="center", va="center", fontsize=6, color="white")
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([name for name, _ in rows], fontsize=8)
        ax.set_ylim(-0.6, len(rows) - 0.2)
        ax.set_xlim(0, end * 1.01)
        ax.set_xlabel(xlabel)
        ax.legend(handles=[Patch(color=c, label=k) for k, c in colors.items()], loc="upper left",
                  bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
        ax.set_title(title, fontsize=9)
        fig.tight_layout()
        with atomic_path(out) as tmp:
            fig.savefig(tmp, format="png", dpi=110)
    finally:
        plt.close(fig)
    return out


def task_phase(key: str) -> str:
    """The phase of a Dask task of `diskflow synth`, `ingest` or `prepare`, by its key's first words:
    ``synth``, ``ingest``, ``sample`` (sampling, and the embedding cache's hop-1 pass), ``pack``
    (routing rows to part files, writing them, the index) or ``plan`` (counts, tiers, traces, plans)."""
    if key.startswith(("synth-", "ingest-")):
        return key.split("-", 1)[0]
    if key.startswith(("sample-", "hop1-", "history-")):
        return "sample"
    if key.startswith(("pack-", "route-", "index-")):
        return "pack"
    return "plan"


class JobTimeline:
    """The spans of a job whose first steps run on a Dask cluster and whose training runs here.

    ``with timeline.tasks(client): ...`` records every task the cluster computes inside the block
    (`distributed.get_task_stream`: its worker, start and end); ``train_and_report(...,
    **timeline.trainer_hooks(superbatch_size))`` times the trainer's superbatches (from one
    superbatch's last batch to the next's) and its evaluations; `plot` draws them on one clock
    (the workers and this process share the machine's wall clock).
    """

    def __init__(self) -> None:
        self.rows: dict[str, list[Span]] = {}       # row name -> spans, in wall-clock seconds

    def add(self, row: str, phase: str, start: float, end: float, label: str | None = None) -> None:
        """One span of `row` (wall-clock seconds, `time.time`)."""
        self.rows.setdefault(row, []).append((phase, start, end, label))

    def add_tasks(self, records: Iterable[dict[str, Any]]) -> None:
        """The compute spans of `distributed.get_task_stream` records, one row per worker."""
        for r in records:
            key = r["key"] if isinstance(r["key"], str) else str(r["key"])
            m = _SUPERBATCH.search(key)
            label = f"e{int(m.group(1))}.{int(m.group(2))}" if m else None
            for ss in r.get("startstops") or ():
                if ss.get("action") == "compute":
                    self.add(f"worker {r['worker']}", task_phase(key), ss["start"], ss["stop"], label)

    @contextlib.contextmanager
    def tasks(self, client: Any) -> Iterator[None]:
        """Record the tasks `client`'s cluster computes while the block runs."""
        from distributed import get_task_stream

        with get_task_stream(client) as stream:
            yield
        self.add_tasks(stream.data)

    def trainer_hooks(self, superbatch_size: int, on_epoch: Callable[[dict[str, Any]], Any] | None = None
                      ) -> dict[str, Any]:
        """``on_start``, ``on_batch`` and ``on_epoch`` for `flow.runtimes.packed.train_and_report` that time
        each superbatch of `superbatch_size` batches (``train``: from the previous superbatch's last
        batch, or the epoch's start, to its own last batch) and each evaluation (``eval``: the epoch
        record's ``stage_s``, ending as the record arrives) on the trainer's row; `on_epoch` is called after."""
        state: dict[str, Any] = {"epoch": 0, "done": 0, "mark": time.time(), "last": time.time()}

        def start(epoch: int, batches: int) -> None:
            now = time.time()
            state.update(epoch=epoch, done=0, mark=now, last=now)

        def batch(n: int) -> None:
            before = state["done"]
            state["done"], state["last"] = before + n, time.time()
            if state["done"] // superbatch_size > before // superbatch_size:     # a superbatch ends
                self._trained(state, before // superbatch_size)

        def epoch_done(record: dict[str, Any]) -> None:
            if state["done"] % superbatch_size:                                  # the epoch's last, short one
                self._trained(state, state["done"] // superbatch_size)
            now = time.time()
            ev = float((record.get("stage_s") or {}).get("eval") or 0.0)
            if ev > 0:
                self.add(TRAINER, "eval", now - ev, now)
            if on_epoch is not None:
                on_epoch(record)

        return {"on_start": start, "on_batch": batch, "on_epoch": epoch_done}

    def _trained(self, state: dict[str, Any], index: int) -> None:
        self.add(TRAINER, "train", state["mark"], state["last"], f"e{state['epoch']}.{index}")
        state["mark"] = state["last"]

    def plot(self, out: str | os.PathLike[str], title: str) -> Path | None:
        """Draw the workers' rows (bottom) and the trainer's (top) to `out`, seconds since the first
        span; None when nothing was recorded."""
        if not self.rows:
            return None
        t0 = min(s[1] for spans in self.rows.values() for s in spans)
        order = sorted(self.rows, key=lambda r: (r == TRAINER, r))
        rows = [(name, [(p, a - t0, b - t0, lab) for p, a, b, lab in self.rows[name]]) for name in order]
        return draw_gantt(rows, JOB_COLORS, title, "seconds since the first task (bars: epoch.superbatch)", Path(out))
