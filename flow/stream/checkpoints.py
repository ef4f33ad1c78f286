"""A streamed run's checkpoints: written in the background, merged over the lanes, read back on resume.

The driver (`driver.StreamRun`) decides when a checkpoint is due and gathers the trains' states;
what a checkpoint holds and how it is written and read is here, apart from the scheduling, so the
format of a stream's checkpoint reads in one place:

* `checkpoint_due`: whether a checkpoint follows a superbatch (`epoch_end`: whether it ends its epoch).
* `CheckpointWriter`: one background thread writes the checkpoints in order, so the driver goes on
  submitting while one is written and synced; it knows the newest one on disk (what a stopped
  run names for ``--resume``).
* `merge_checkpoints`: one checkpoint of every lane's state after a superbatch (data parallel).
* `load_resume`: the stream position of the latest checkpoint, with each lane's trainer state and
  CPU tier ids set from it, after checking it belongs to this run.

A streamed checkpoint saves only the CPU tier's ids: its rows are the store's rows of those ids,
re-read on resume, so a checkpoint does not carry the tier across the network.
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError
from ...operators.formats.packed import EDGE_IDS
from ...operators.prepare.superbatch import SuperbatchRef
from .lanes import Lane

__all__ = ["CheckpointWriter", "Resumed", "checkpoint_due", "epoch_end", "load_resume", "merge_checkpoints"]


def epoch_end(refs: Sequence[SuperbatchRef], k: int) -> bool:
    """Whether superbatch k is its epoch's last (or the round's)."""
    return k + 1 >= len(refs) or refs[k + 1].epoch != refs[k].epoch


def checkpoint_due(refs: Sequence[SuperbatchRef], k: int, start: int, every: int) -> bool:
    """Whether a checkpoint is written after superbatch k of a run that started at `start`: every `every`
    superbatches (``--checkpoint-every``), each epoch's last, the end."""
    return epoch_end(refs, k) or (k - start + 1) % every == 0


class CheckpointWriter:
    """Writes a run's checkpoints under `root`, in order, on one background thread (started on first use).

    A failed write surfaces at the next `write` after it finished, or at `wait`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.last: Path | None = None           # the newest checkpoint on disk (or the one resumed from)
        self._thread: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def write(self, ck: dict[str, Any]) -> None:
        """Queue `ck` (``{"state": ..., "arrays": ...}``) for writing; raise a finished write's error."""
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="diskflow-checkpoint")
        self._pending.append(self._thread.submit(self._save, ck))
        while self._pending and self._pending[0].done():
            self._pending.pop(0).result()

    def wait(self) -> None:
        """Wait until the checkpoints being written are on disk (a failed write raises)."""
        while self._pending:
            self._pending.pop(0).result()

    def settle(self) -> None:
        """Wait for the writes in flight without raising, so that `last` names the newest one really on disk."""
        for fut in self._pending:
            with contextlib.suppress(Exception):
                fut.result()

    def close(self) -> None:
        """Stop the writer thread once its writes are done."""
        if self._thread is not None:
            self._thread.shutdown(wait=True)

    def _save(self, ck: dict[str, Any]) -> None:
        from ...operators.train.checkpoint import save_checkpoint

        st = ck["state"]
        self.last = save_checkpoint(self.root, int(st["epoch"]), int(st["batch"]), st, ck["arrays"])


def merge_checkpoints(cks: list[dict[str, Any]], records: Sequence[dict[str, Any]], shared_ids: Any,
                      timeout: float) -> dict[str, Any]:
    """One checkpoint of every lane's state after a superbatch, from each lane's train (`cks`, by rank).

    Lane 0's model, optimizer and RNG (the same on every lane), each lane's open epoch and CPU tier
    (``cpu_ids.npy``, ``cpu_ids-R.npy``; a shared tier: the one its plan of the superbatch leaves,
    ``cpu_ids.npy``, from the future `shared_ids`), the run's merged `records`. One lane: its own.
    """
    if len(cks) == 1:
        return cks[0]
    state = dict(cks[0]["state"])
    state["lanes"] = [{"partial": ck["state"].get("partial"), "records": ck["state"].get("records", [])}
                      for ck in cks]
    state["stream_records"] = list(records)
    if shared_ids is not None:      # fetched ahead (`StreamRun._prepare_chain`): done long before k trained
        ids = shared_ids.result(timeout=timeout)
        return {"state": state, "arrays": {"cpu_ids.npy": np.asarray(ids, np.int64)}}
    arrays = dict(cks[0]["arrays"])
    for r, ck in enumerate(cks[1:], start=1):       # cpu_ids.npy -> cpu_ids-R.npy (edge_cpu_ids.npy alike)
        arrays.update({f"{name.removesuffix('.npy')}-{r}.npy": a for name, a in ck["arrays"].items()})
    return {"state": state, "arrays": arrays}


@dataclass
class Resumed:
    """Where a resumed run starts: the stream position, the run's epoch records so far, the checkpoint."""

    start: int
    records: list[dict[str, Any]]
    path: Path


def load_resume(root: Path, cfg: Any, fingerprint: str, lanes: Sequence[Lane], planner: Lane | None
                ) -> Resumed | None:
    """The latest checkpoint under `root` (None: there is none), with each lane's trainer state and CPU tier
    ids (or the shared tier's planner's) set from it.

    Raises:
        ConfigError: the checkpoint was made by another run (another model, options, dataset,
            pipeline or number of GPU workers).
    """
    from ...operators.train.checkpoint import latest_checkpoint, load_checkpoint
    from ...operators.train.config import check_model_identity

    latest = latest_checkpoint(root)
    if latest is None:
        return None
    ck = load_checkpoint(latest)
    st = ck.state
    check_model_identity(st, cfg.train, latest)
    if st.get("fingerprint") != fingerprint or "stream_index" not in st:
        raise ConfigError("resume", f"the checkpoint {latest} was made by another run (other options, dataset, "
                                    "pipeline or number of GPU workers); use the same options, or start a new "
                                    "run without resume")
    gpus = len(lanes)
    saved = len(st.get("lanes") or [None])
    if saved != gpus:
        raise ConfigError("gpus", f"the checkpoint {latest} was trained on {saved} GPU worker(s), this run has "
                                  f"{gpus}; resume with the same number")
    records = list(st.get("stream_records", st.get("records")) or [])
    if planner is not None:
        ids = ck.array("cpu_ids.npy")
        planner.start_ids = None if ids is None else np.array(ids)
    for lane in lanes:
        suffix = "" if lane.rank == 0 else f"-{lane.rank}"
        ids = ck.array(f"cpu_ids{suffix}.npy") if planner is None else None
        lane.start_ids = None if ids is None else np.array(ids)
        if lane.edges is not None:      # the edge rows' CPU tier there (`StreamTrainer.checkpoint`)
            ids = ck.array(f"{EDGE_IDS.removesuffix('.npy')}{suffix}.npy")
            lane.edges.start_ids = None if ids is None else np.array(ids)
        if gpus == 1:
            lane.resume_state = st
        else:
            own = st["lanes"][lane.rank]
            lane.resume_state = {**st, "partial": own["partial"], "records": own["records"]}
            lane.resume_state.pop("lanes", None)
            lane.resume_state.pop("stream_records", None)
    return Resumed(int(st["stream_index"]), records, latest)
