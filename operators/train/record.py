"""The numbers an epoch's record and a report's `final` block are made of; no torch, so the driver
of a streamed run (`flow/`) writes its report without importing the model code."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def num(x: float | None) -> float | None:
    """A float for a report; None for None or NaN (e.g. the accuracy of an empty split)."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def final_block(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The report's `final` block: last and best-validation accuracies (first epoch wins ties), seconds."""
    evaluated = [r for r in records if r["val_acc"] is not None]
    best = max(evaluated, key=lambda r: r["val_acc"], default=None)
    last = evaluated[-1] if evaluated else None
    return {
        "test_acc": last["test_acc"] if last else None,
        "best_val_acc": best["val_acc"] if best else None,
        "best_epoch": best["epoch"] if best else None,
        "test_acc_at_best_val": best["test_acc"] if best else None,
        "train_s": sum(r["epoch_s"] for r in records),
        "epoch_s_mean": sum(r["epoch_s"] for r in records) / len(records) if records else None,
    }
