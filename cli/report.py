"""`diskflow report RUN`: a streamed run's timeline as a PNG (what each machine did when), its key numbers, and the
diskflow page's figures drawn from report.json (`flow.dashboard`: stage lanes, preparation's lead, tier hit rates,
disk bytes/s against the floor, GPU idle share) as one standalone HTML file."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import InputError
from ..runs import PAGE, TIMELINE, draw_page, key_numbers, plot_timeline, read_report
from ..sizes import format_bytes

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="draw a streamed run's timeline (PNG) and print its key numbers",
                       description="Read RUN/report.json and draw RUN/timeline.png: a Gantt chart of the CPU "
                                   "workers' sample/plan/pack tasks and the GPU worker's ship/train tasks, with the "
                                   "stream's time, GPU idle fraction and scratch peak; and RUN/dashboard.html, the "
                                   "figures the scheduler's /diskflow page showed while the run ran.")
    p.add_argument("run", metavar="RUN", help="run directory (holding report.json)")
    p.add_argument("--out", default=None, metavar="PNG", help=f"where to draw (default RUN/{TIMELINE})")
    p.add_argument("--page", default=None, metavar="HTML",
                   help=f"where to draw the diskflow page's figures (default RUN/{PAGE})")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    report = read_report(args.run)
    if not report.get("timeline"):
        raise InputError(args.run, "the report has no timeline (only `diskflow run streaming` records one)")
    path = plot_timeline(args.run, report, args.out)
    k = key_numbers(report)
    idle = k["gpu_idle_fraction"]
    print(f"superbatches trained   {k['trained']} of {k['superbatches']} (window {k['window']})")
    print(f"stream time            {k['stream_s']:.2f} s, GPU busy {k['train_busy_s']:.2f} s, "
          f"idle {idle * 100 if idle is not None else float('nan'):.1f}%")
    stream = report.get("stream") or {}
    if stream.get("gpus", 1) > 1:
        idles = stream.get("gpu_idle_fraction_per_worker") or []
        print(f"GPU workers            {stream['gpus']}, data-parallel ({stream.get('cache')} CPU tier"
              f"{'s' if stream.get('cache') != 'shared' else ''}), models equal after every superbatch: "
              f"{_yes_no(stream.get('models_equal'))}")
        for addr, x in zip(stream.get("gpu_workers") or [], idles):
            print(f"  {addr:<20} idle {x * 100 if x is not None else float('nan'):.1f}%")
        print(f"workers                {k['cpu_workers']} CPU")
    else:
        print(f"workers                GPU {k['gpu_worker']}, {k['cpu_workers']} CPU")
    peak, quota = k["scratch_peak_bytes"], k["scratch_quota_bytes"]
    print(f"scratch peak           {format_bytes(peak) if peak else '-'}"
          f"{' of quota ' + format_bytes(quota) if quota else ' (no quota)'}")
    if k["hold_memory_bytes"] is not None:
        print(f"held in memory         index and samples, peak {format_bytes(k['held_peak_bytes'] or 0)} "
              f"of {format_bytes(k['hold_memory_bytes'])}")
    if k["final_loss"] is not None:
        print(f"final loss             {k['final_loss']:.4f}   test acc "
              f"{format(k['test_acc'], '.4f') if k['test_acc'] is not None else '-'}")
    if k["reshipped"]:
        print(f"shipped twice          {', '.join(k['reshipped'])}")
    print(f"timeline: {path}")
    page = Path(args.page) if args.page else Path(args.run) / PAGE
    draw_page(report, page, title=f"diskflow: {Path(args.run).name}")
    print(f"page:     {page} (the /diskflow page's figures)")
    return 0


def _yes_no(value: bool | None) -> str:
    """yes / no, or "-" where nothing was compared (a data-only run has no model)."""
    return "-" if value is None else "yes" if value else "no"
