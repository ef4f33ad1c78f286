"""Run directories: one folder per run, holding its `report.json` (written last) and plots.

A run directory is finished when `report.json` exists; like a manifest, it is written
atomically, so a crashed run never leaves a report that looks complete. `new_run_dir`
always makes a fresh directory; a directory the user names (`diskflow train --run-dir`)
must be empty, missing or a run directory already (`RUN_KIND`), unless ``--force``.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..operators.formats.atomic import atomic_path, write_json
from ..operators.formats.outputs import OutputKind, replace_foreign

__all__ = ["CURVES", "REPORT", "RUN_INFO", "RUN_KIND", "final_line", "fmt", "new_run_dir", "plot_curves", "print_epoch",
           "read_report", "use_run_dir", "write_report"]

REPORT = "report.json"
CURVES = "curves.png"
RUN_INFO = "train.json"     # written first by `diskflow train`: which PACKED the run trains
# A run directory: what `diskflow train`/`run` write into one (checkpoints, the report, `run`'s packed data).
RUN_KIND = OutputKind("a diskflow run directory", markers=(RUN_INFO, REPORT, "checkpoints", "packed/manifest.json"))


def new_run_dir(root: str | os.PathLike[str] = "runs", name: str = "run") -> Path:
    """Create and return a fresh directory `root/YYYYmmdd-HHMMSS-name` (with `-2`, `-3`... if taken)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.") or "run"
    base = Path(root) / f"{time.strftime('%Y%m%d-%H%M%S')}-{safe}"
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(base.parent, f"cannot hold run directories ({e.strerror or e})") from e
    for n in range(1, 10_000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise InputError(base.parent, f"could not create a unique run directory for {safe!r}")


def use_run_dir(path: str | os.PathLike[str], force: bool = False) -> Path:
    """The run directory the user named: created when missing, reused when it is one already.

    A directory holding anything else is refused (`outputs.check_replaceable`), or with
    `force` deleted and made anew, so training never mixes its files into a user's folder.
    """
    run_dir = Path(path)
    replace_foreign(run_dir, force, RUN_KIND)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(run_dir, f"cannot create the run directory ({e.strerror or e})") from e
    return run_dir


def write_report(run_dir: str | os.PathLike[str], report: dict[str, Any]) -> Path:
    """Write `run_dir/report.json` atomically and return its path."""
    path = Path(run_dir) / REPORT
    write_json(path, report)
    return path


def read_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a report, given the run directory or the `report.json` itself."""
    p = Path(path)
    if p.is_dir():
        p = p / REPORT
    try:
        return json.loads(p.read_text())
    except FileNotFoundError as e:
        raise InputError(p, "no report (the run did not finish)") from e
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(p, f"unreadable report ({e})") from e


def plot_curves(run_dir: str | os.PathLike[str], report: dict[str, Any]) -> Path | None:
    """Plot the per-epoch curves of a report to `run_dir/curves.png`; None when it has no epochs.

    Left: `loss` per epoch, and the per-batch `losses` when present. Right: every
    `*_acc` series (missing values, e.g. epochs without evaluation, are skipped).
    """
    epochs = report.get("epochs") or []
    if not epochs:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    try:
        per_batch = [(e["epoch"], e.get("losses") or []) for e in epochs]
        if any(losses for _, losses in per_batch):
            xs: list[float] = []
            ys: list[float] = []
            for epoch, losses in per_batch:
                xs += [epoch - 1 + (i + 1) / len(losses) for i in range(len(losses))]
                ys += losses
            ax_loss.plot(xs, ys, lw=0.8, alpha=0.5, label="per batch")
        ax_loss.plot([e["epoch"] for e in epochs], [e["loss"] for e in epochs], "o-", label="epoch mean")
        ax_loss.set_xlabel("epoch")
        ax_loss.set_ylabel("loss")
        ax_loss.legend()
        keys = sorted({k for e in epochs for k in e if k.endswith("_acc")})
        for key in keys:
            pts = [(e["epoch"], e[key]) for e in epochs if isinstance(e.get(key), (int, float))]
            if pts:
                ax_acc.plot(*zip(*pts), "o-", label=key)
        ax_acc.set_xlabel("epoch")
        for ax in (ax_loss, ax_acc):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax_acc.set_ylabel("accuracy")
        if keys:
            ax_acc.legend()
        title = report.get("title") or report.get("config", {}).get("pipeline")
        if title:
            fig.suptitle(str(title))
        fig.tight_layout()
        path = Path(run_dir) / CURVES
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
    finally:
        plt.close(fig)
    return path


def fmt(x: Any, spec: str = ".4f") -> str:
    """A report figure for a table: ``-`` when absent."""
    return "-" if x is None else format(x, spec)


def final_line(final: dict[str, Any]) -> str:
    """The report's `final` block in one line: test accuracy, or a link task's MRR, ROC-AUC and Hits@K."""
    if "test_mrr" in final:
        return (f"final test mrr {fmt(final.get('test_mrr'))}  auc {fmt(final.get('test_auc'))}  "
                f"hits@{final.get('hits_k')} {fmt(final.get('test_hits'))}  best val mrr {fmt(final.get('best_val_mrr'))}  "
                f"test mrr at best val {fmt(final.get('test_mrr_at_best_val'))}")
    return (f"final test acc {fmt(final.get('test_acc'))}  best val {fmt(final.get('best_val_acc'))}  "
            f"test at best val {fmt(final.get('test_acc_at_best_val'))}")


def print_epoch(record: dict[str, Any]) -> None:
    """One line per finished epoch, as `diskflow run` and `diskflow train` print them (throughput and bytes
    read when the record has them)."""
    if "val_mrr" in record or record.get("hits_k") is not None:      # a link task's figures
        k = record.get("hits_k")
        scores = (f"val mrr {fmt(record.get('val_mrr'))} auc {fmt(record.get('val_auc'))}  "
                  f"test mrr {fmt(record.get('test_mrr'))} auc {fmt(record.get('test_auc'))} "
                  f"hits@{k} {fmt(record.get('test_hits'))}")
    else:
        scores = f"val {fmt(record.get('val_acc'))}  test {fmt(record.get('test_acc'))}"
    line = (f"epoch {record['epoch']:>3}  loss {fmt(record.get('loss'))}  train {fmt(record.get('train_acc'))}  "
            f"{scores}  {fmt(record.get('epoch_s'), '.2f')} s")
    if record.get("seeds_per_s") is not None:
        line += f"  {fmt(record['seeds_per_s'], ',.0f')} seeds/s"
    if record.get("bytes_read") is not None:
        from ..operators.formats.sizes import format_bytes

        line += f"  {format_bytes(record['bytes_read'])} read"
    print(line, flush=True)
