"""The streamed run's timeline as a picture: what each machine did when (a Gantt chart), and the key numbers.

One row per worker: the CPU workers' ``sample``/``plan``/``pack`` tasks and the GPU worker's
``ship``/``train`` tasks, each superbatch's bars labelled with its key, on the stream's clock
(seconds since the first submission). Gaps in the GPU worker's row are the time it waited.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..operators.formats.files import atomic_path, format_bytes

TIMELINE = "timeline.png"
COLORS = {"sample": "#8ecae6", "plan": "#219ebc", "pack": "#023047", "ship": "#ffb703", "train": "#fb8500"}


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
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    stream = report.get("stream") or {}
    gpus = set(stream.get("gpu_workers") or [stream.get("gpu_worker")])
    workers: dict[str, list[tuple[str, float, float, str]]] = {}
    for e in tl:
        for lane in e.get("lanes") or [e]:          # a data-parallel run: every GPU worker's share
            for phase, p in lane["phases"].items():
                workers.setdefault(p["worker"], []).append((phase, p["start"], p["end"], e["key"]))
    order = sorted(workers, key=lambda w: (w in gpus, w))
    end = max(x["trained"] for x in tl)
    fig, ax = plt.subplots(figsize=(12, 1.6 + 0.55 * len(order)))
    try:
        for row, w in enumerate(order):
            for phase, start, stop, key in workers[w]:
                # ship runs beside train on the GPU worker: a thin lane above it, so neither hides the other
                y, h = (row + 0.36, 0.22) if phase == "ship" else (row, 0.6)
                ax.barh(y, max(stop - start, 1e-3), left=start, height=h, color=COLORS.get(phase, "grey"),
                        edgecolor="white", linewidth=0.4)
                if phase in ("train", "pack") and stop - start > 0.035 * end:
                    e, s_ = key.split("-")
                    ax.text((start + stop) / 2, row, f"{e}.{int(s_[1:])}", ha="center", va="center", fontsize=6,
                            color="white")
        ax.set_yticks(range(len(order)))
        ax.set_yticklabels([f"GPU {w}" if w in gpus else f"CPU {w}" for w in order], fontsize=8)
        ax.set_ylim(-0.6, len(order) - 0.2)
        ax.set_xlim(0, end * 1.01)
        ax.set_xlabel("seconds since the first submission (bars: epoch.superbatch)")
        ax.legend(handles=[Patch(color=c, label=k) for k, c in COLORS.items()], loc="upper left",
                  bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
        k = key_numbers(report)
        ax.set_title(f"{report.get('title', 'streaming')}\n"
                     f"{k['trained']} superbatches in {_fmt(k['stream_s'], '.1f')} s, GPU busy "
                     f"{_fmt(k['train_busy_s'], '.1f')} s, idle {_fmt((k['gpu_idle_fraction'] or 0) * 100, '.0f')}%, "
                     f"window {k['window']}, scratch peak "
                     f"{format_bytes(k['scratch_peak_bytes']) if k['scratch_peak_bytes'] else '-'}"
                     f"{' of ' + format_bytes(k['scratch_quota_bytes']) if k['scratch_quota_bytes'] else ''}, "
                     f"final loss {_fmt(k['final_loss'], '.4f')}", fontsize=9)
        fig.tight_layout()
        out = Path(path) if path is not None else Path(run_dir) / TIMELINE
        with atomic_path(out) as tmp:
            fig.savefig(tmp, format="png", dpi=110)
    finally:
        plt.close(fig)
    return out
