"""What a streamed run's trained superbatches came to: the lanes' results merged, the epoch records, the
timeline.

Each ``train`` task returns a small dict (losses, sizes, seconds, bytes, the phases' timing, the
pack's figures; an epoch's record where the superbatch ends one). `StreamResults` turns the
lanes' dicts of one superbatch into the run's: one result as a single GPU worker would give it
(data parallel: the losses back in the superbatch's order, bytes summed, the slowest lane's
seconds), the run's epoch record (`lanes.merge_epoch`), and one timeline entry, whose fields are
report.json's ``timeline`` and what `flow.timeline.plot_timeline` draws. It also checks that the
data-parallel lanes' models are still equal. The driver (`driver.StreamRun`) calls `add` once per
superbatch, in stream order; the report (`report.stream_report`) reads the figures kept here.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ...operators.prepare.superbatch import SuperbatchRef
from .config import StreamStopped
from .lanes import Lane, interleave, merge_epoch

__all__ = ["StreamResults"]


class StreamResults:
    """The run's figures from its trained superbatches, in stream order (see the module docstring).

    Args:
        refs: the round's superbatches.
        lanes: the run's lanes (one per GPU worker).
    """

    def __init__(self, refs: Sequence[SuperbatchRef], lanes: Sequence[Lane]) -> None:
        self.refs = refs
        self.lanes = lanes
        self.timeline: list[dict[str, Any]] = []
        self.records: list[dict[str, Any]] = []          # the run's epoch records (set from a checkpoint on resume)
        self.models_checked = 0         # superbatches after which every lane's weights were compared
        self.last_usage: dict[str, Any] = {}             # the GPU worker's scratch use after the latest train
        self.t_start = 0.0              # the stream's clock: timeline times are seconds since it

    def merge(self, k: int, outs: list[dict[str, Any]], where: Callable[[], str]) -> dict[str, Any]:
        """The run's result of superbatch k from its lanes' (`outs`, by rank; one lane: its own).

        Raises:
            StreamStopped: the lanes' models differ (their data-parallel steps diverged), ending
                with `where()`.
        """
        out = outs[0]
        if len(outs) == 1:
            return out
        crcs = {o.get("model_crc") for o in outs}
        if len(crcs) > 1:
            raise StreamStopped(f"the GPU workers' models differ after superbatch {self.refs[k].key} (weights "
                                f"crc32 {sorted(str(c) for c in crcs)}): their data-parallel steps diverged; "
                                f"{where()}")
        if None not in crcs:      # (a data-only run has no weights to compare)
            self.models_checked += 1
        out = {**out, "bytes": sum(int(o.get("bytes") or 0) for o in outs),
               "held_bytes": sum(int(o.get("held_bytes") or 0) for o in outs),
               "losses": interleave([o["losses"] for o in outs]),
               "sizes": interleave([o["sizes"] for o in outs]), "seeds": sum(o["seeds"] for o in outs),
               "seconds": max(o["seconds"] for o in outs)}
        seen = sum(out["sizes"])
        out["loss"] = sum(v * n for v, n in zip(out["losses"], out["sizes"])) / seen if seen else None
        out["seeds_per_s"] = out["seeds"] / out["seconds"] if out["seconds"] > 0 else None
        return out

    def epoch_record(self, k: int, outs: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The run's record of the epoch superbatch k ends (None: it ends none), kept in `records`; the lanes'
        merged."""
        if outs[0].get("record") is None:
            return None
        if len(outs) == 1:
            record = outs[0]["record"]
        else:
            epoch = self.refs[k].epoch
            ks = [j for j, r in enumerate(self.refs) if r.epoch == epoch]
            shares = [[lane.refs[j].num_batches for j in ks] for lane in self.lanes]
            record = merge_epoch([o["record"] for o in outs], [o["epoch_tally"] for o in outs], shares)
        self.records.append(record)
        return record

    def add(self, k: int, out: dict[str, Any], outs: list[dict[str, Any]]) -> None:
        """Superbatch k's timeline entry, from its merged result `out` and the lanes' `outs`."""
        self.timeline.append(self._entry(k, out, outs))
        self.last_usage = out.get("usage", {})

    def _phases(self, o: dict[str, Any]) -> dict[str, Any]:
        return {name: {"start": t["t0"] - self.t_start, "end": t["t1"] - self.t_start, "worker": t["worker"]}
                for name, t in o["timing"].items()}

    def _entry(self, k: int, out: dict[str, Any], outs: list[dict[str, Any]]) -> dict[str, Any]:
        r = self.refs[k]
        ph = self._phases(out)
        entry = {"key": r.key, "index": k, "epoch": r.epoch, "batches": r.num_batches, "phases": ph,
                 "prepared": ph["pack"]["end"], "shipped": ph["ship"]["end"], "trained": ph["train"]["end"],
                 "loss": out.get("loss"), "seeds_per_s": out.get("seeds_per_s"), "bytes": out.get("bytes"),
                 "held_bytes": out.get("held_bytes"), "loader": out.get("loader"),
                 "figures": out.get("pack", {}).get("figures", {}), "plan": out.get("pack", {}).get("plan", {})}
        if len(outs) > 1:
            entry["lanes"] = [{"batches": lane.refs[k].num_batches, "phases": self._phases(o), "bytes": o.get("bytes"),
                               "loader": o.get("loader"),
                               "model_crc": o.get("model_crc"), "losses": o.get("losses"),
                               "figures": o.get("pack", {}).get("figures", {}), "plan": o.get("pack", {}).get("plan", {})}
                              for lane, o in zip(self.lanes, outs)]
            entry["trained"] = max(e["phases"]["train"]["end"] for e in entry["lanes"])
            entry["bytes"] = sum(int(o.get("bytes") or 0) for o in outs)
        return entry
