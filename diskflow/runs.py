"""Run directories and what is written into them: reports, the timeline, the per-epoch lines.

A run directory (``runs/<time>-<pipeline>-<model>``) holds ``report.json``, ``curves.png``, checkpoints
and, for streamed runs and the demo, ``timeline.png``; `diskflow train`, `run`, `report` and `demo`
make and read them through these functions, and so can a script:

    from diskflow.runs import key_numbers, read_report

    print(key_numbers(read_report("runs/20261128-101500-streaming-sage")))
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .errors import DiskflowError
from .flow import rundir as _rundir
from .flow import timeline as _timeline
from .flow.memsplit import SPLIT_PLOT
from .flow.memsplit import describe_split as _describe_split
from .flow.timeline import TIMELINE, JobTimeline
from .operators.formats.atomic import write_json
from .operators.prepare import history as _history

__all__ = [
    "PAGE",
    "REPORT",
    "RUN_INFO",
    "SPLIT_PLOT",
    "TIMELINE",
    "JobTimeline",
    "check_run_output",
    "describe_online",
    "describe_split",
    "describe_staleness",
    "draw_page",
    "final_line",
    "fmt",
    "has_checkpoints",
    "key_numbers",
    "new_run_dir",
    "no_run_left",
    "plot_timeline",
    "print_epoch",
    "read_report",
    "served_share",
    "unfinished_run",
    "use_run_dir",
    "write_run_info",
]

REPORT = _rundir.REPORT         # the run's report, written when it finishes
PAGE = "dashboard.html"         # `draw_page`'s default file in a run directory
RUN_INFO = _rundir.RUN_INFO     # written first by `diskflow train`: which packed dataset the run trains


def new_run_dir(root: str | os.PathLike[str] = "runs", name: str = "run") -> Path:
    """A fresh directory ``root/YYYYmmdd-HHMMSS-name`` (``-2``, ``-3``... when taken), so runs never overwrite
    each other and sort by time."""
    return _rundir.new_run_dir(root, name)


def use_run_dir(path: str | os.PathLike[str], force: bool = False) -> Path:
    """The run directory the user named: created when missing, reused when it is one already; a directory
    holding anything else is refused (with `force`: emptied), so training never mixes into a user's folder."""
    return _rundir.use_run_dir(path, force)


def check_run_output(path: str | os.PathLike[str], force: bool) -> None:
    """Refuse `path` unless it is missing, empty or a run directory (with `force`: delete what it holds), for
    writers that fill a directory with a report and a timeline in place, before they start."""
    from .operators.formats.outputs import replace_foreign

    replace_foreign(path, force, _rundir.RUN_KIND)


def read_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A finished run's report, given its run directory or the ``report.json`` itself.

    Raises:
        InputError: no report (the run did not finish), or one that does not parse.
    """
    return _rundir.read_report(path)


def write_run_info(run_dir: str | os.PathLike[str], packed: str | os.PathLike[str], model: str) -> None:
    """Record which packed dataset and model `run_dir` trains, before training starts, so that
    `unfinished_run` finds the run again to resume it."""
    write_json(Path(run_dir) / RUN_INFO, {"packed": str(packed), "model": model})


def unfinished_run(runs_dir: str | os.PathLike[str], packed: str | os.PathLike[str]) -> Path | None:
    """The newest run directory under `runs_dir` that trains `packed` (`write_run_info`) and has no report yet:
    the run ``diskflow train --resume`` continues; None when there is none."""
    root = Path(runs_dir)
    if not root.is_dir():
        return None
    for d in sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: d.name, reverse=True):
        info = d / RUN_INFO
        if info.is_file() and not (d / REPORT).exists():
            try:
                if json.loads(info.read_text()).get("packed") == str(packed):
                    return d
            except (OSError, json.JSONDecodeError):
                continue
    return None


@contextlib.contextmanager
def no_run_left(run_dir: Path, made: bool, prepares: bool) -> Iterator[None]:
    """Within: a run that fails before its first checkpoint leaves behind no run directory its caller `made`
    (the commands' and `diskflow.train`'s one rule). Training a packed dataset (`diskflow train`) removes it
    whole after a `DiskflowError` (a refused option, a faulty model), else only when it is empty; a pipeline
    that `prepares` into it (`diskflow run`) only when it is empty, keeping what was prepared. A directory the
    caller had, or one holding a checkpoint to resume from, stays."""
    try:
        yield
    except BaseException as e:
        if made and not has_checkpoints(run_dir):
            if isinstance(e, DiskflowError) and not prepares:
                shutil.rmtree(run_dir, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    run_dir.rmdir()         # only when empty
        raise


def has_checkpoints(run_dir: str | os.PathLike[str]) -> bool:
    """Whether the trainer has checkpointed into `run_dir` (then a failed run is kept, to be resumed)."""
    from .operators.train.trainer import CHECKPOINTS

    return (Path(run_dir) / CHECKPOINTS).exists()


def fmt(x: Any, spec: str = ".4f") -> str:
    """A report figure for a table, formatted by `spec`; ``-`` when absent (None)."""
    return _rundir.fmt(x, spec)


def final_line(final: dict[str, Any]) -> str:
    """A report's `final` block in one line: test accuracy, or a link task's MRR, ROC-AUC and Hits@K."""
    return _rundir.final_line(final)


print_epoch: Callable[[dict[str, Any]], None] = _rundir.print_epoch
"""One line per finished epoch (loss, accuracies, time, throughput, bytes read), as the commands print it;
pass it as a trainer's ``on_epoch``."""


def key_numbers(report: dict[str, Any]) -> dict[str, Any]:
    """A streamed run's key figures from its report: superbatches trained, stream time, GPU idle fraction,
    workers, scratch peak, final loss and accuracy (what `diskflow report` prints)."""
    return _timeline.key_numbers(report)


def plot_timeline(run_dir: str | os.PathLike[str], report: dict[str, Any],
                  path: str | os.PathLike[str] | None = None) -> Path | None:
    """Draw a streamed run's timeline (each worker's tasks, the GPU workers' superbatches) as a PNG at `path`
    (default ``run_dir/timeline.png``); its path, None when the report has no timeline."""
    return _timeline.plot_timeline(run_dir, report, path)


def draw_page(report: dict[str, Any], path: str | os.PathLike[str], title: str = "diskflow") -> Path:
    """Draw a streamed run's diskflow page (the figures the scheduler's ``/diskflow`` showed while it ran: stage
    lanes, the preparation's lead, tier hit rates, disk bytes/s against the floor, GPU idle share) from its
    report, as one standalone HTML file at `path`."""
    from .flow.dashboard.figures import save_html
    from .flow.dashboard.state import from_report

    save_html(from_report(report), path, title)
    return Path(path)


def describe_split(split: dict[str, Any]) -> str:
    """One line on a prepared memory split (``--history-memory auto``): the share given to embeddings and the
    disk bytes it saves against none."""
    return _describe_split(split)


def describe_staleness(history: dict[str, Any]) -> str:
    """A report's historical embedding cache's staleness bound, in words (with the adaptive bound and the
    cool-down where its plan had them)."""
    return _history.describe_staleness(history)


def served_share(history: dict[str, Any]) -> float:
    """The share of the cached nodes' appearances in training batches that a stored embedding served rather
    than a fresh computation, from a report's ``history``: what the bytes the cache saves are bought with."""
    return _history.served_share(history)


def describe_online(report: dict[str, Any]) -> str:
    """One line on an online pipeline's run (gnndrive, lsmgnn): its feature buffer's policy, size and hit rate."""
    from .flow.runtimes.online import describe_online as describe

    return describe(report)
