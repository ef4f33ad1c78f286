"""An epoch's record and a report's `final` block: the open epoch's tally (`EpochTally`), the record it
closes into, and the block that sums the records up. No torch, so the driver of a streamed run
(`flow/`) writes its report without importing the model code."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["EpochTally", "final_block", "num"]


def num(x: float | None) -> float | None:
    """A float for a report; None for None or NaN (e.g. the accuracy of an empty split)."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def final_block(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The report's `final` block: last and best-validation accuracies (first epoch wins ties), seconds; for a
    link task (records with ``val_mrr``), its figures: the last and the best-validation MRR, and the last
    ROC-AUC and Hits@K."""
    if any("val_mrr" in r for r in records):
        return _link_final(records)
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


def _link_final(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    evaluated = [r for r in records if r.get("val_mrr") is not None]
    best = max(evaluated, key=lambda r: r["val_mrr"], default=None)
    last = evaluated[-1] if evaluated else None
    return {
        "test_mrr": last["test_mrr"] if last else None,
        "test_auc": last["test_auc"] if last else None,
        "test_hits": last["test_hits"] if last else None,
        "hits_k": last["hits_k"] if last else None,
        "best_val_mrr": best["val_mrr"] if best else None,
        "best_epoch": best["epoch"] if best else None,
        "test_mrr_at_best_val": best["test_mrr"] if best else None,
        "test_acc": None,
        "train_s": sum(r["epoch_s"] for r in records),
        "epoch_s_mean": sum(r["epoch_s"] for r in records) / len(records) if records else None,
    }


@dataclass
class EpochTally:
    """What an epoch has trained so far, over one loader or several (superbatches, a resumed epoch).

    Its `state()` is what a mid-epoch checkpoint saves (plain lists and numbers), so a resumed
    epoch's record covers the whole epoch.
    """

    stages: tuple[str, ...]
    losses: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    correct: int = 0
    seconds: float = 0.0
    stage_s: dict[str, float] = field(default_factory=dict)
    bytes_read: int = 0
    requests: int = 0

    def __post_init__(self) -> None:
        self.stage_s = {k: float(self.stage_s.get(k, 0.0)) for k in self.stages}

    def add(self, result: Mapping[str, Any]) -> None:
        """Add a part's result (`loop.train_epoch`'s, or a data-only pass's)."""
        self.losses += list(result["losses"])
        self.sizes += list(result["sizes"])
        self.correct += int(result["correct"])
        self.seconds += float(result["seconds"])
        for k in self.stages:
            self.stage_s[k] += float(result["stage_s"].get(k, 0.0))

    def state(self) -> dict[str, Any]:
        return {"losses": list(self.losses), "sizes": list(self.sizes), "correct": self.correct,
                "seconds": self.seconds, "stage_s": dict(self.stage_s), "bytes_read": self.bytes_read,
                "requests": self.requests}

    def record(self, epoch: int, throughput: bool = False) -> dict[str, Any]:
        """The record of epoch `epoch` (0-based), accuracies None (the session evaluates).

        `loss` is the mean over seeds summed as `loop.train_epoch` sums it, batch by batch in
        order, over all the parts: an epoch trained in parts has its one-loader value, bit for bit.
        `throughput` adds `seeds_per_s`, `batches_per_s` and the I/O counters.
        """
        seen = sum(self.sizes)
        total = 0.0
        for value, size in zip(self.losses, self.sizes):
            total += value * size
        trained = bool(self.losses) and seen > 0
        record: dict[str, Any] = {
            "epoch": epoch + 1,
            "loss": num(total / seen) if trained else None,
            "losses": list(self.losses),
            "train_acc": num(self.correct / seen) if trained else None,
            "val_acc": None, "test_acc": None,
            "epoch_s": self.seconds,
        }
        if throughput:
            record.update(seeds_per_s=seen / self.seconds if self.seconds > 0 else None,
                          batches_per_s=len(self.sizes) / self.seconds if self.seconds > 0 else None,
                          bytes_read=int(self.bytes_read), requests=int(self.requests))
        record["stage_s"] = {**self.stage_s, "eval": 0.0}
        return record

    @classmethod
    def from_state(cls, stages: tuple[str, ...], state: Mapping[str, Any] | None) -> EpochTally:
        """The tally a checkpoint saved (None: an empty one); counters missing from older ones are 0."""
        if not state:
            return cls(stages)
        return cls(stages, losses=list(state["losses"]), sizes=[int(s) for s in state["sizes"]],
                   correct=int(state["correct"]), seconds=float(state["seconds"]), stage_s=dict(state["stage_s"]),
                   bytes_read=int(state.get("bytes_read", 0)), requests=int(state.get("requests", 0)))
