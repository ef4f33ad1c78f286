"""Streamed training: one superbatch at a time, the model, optimizer and CPU tier carried across them.

`StreamTrainer` is what the GPU worker holds for a streamed run. Each call of `train` takes
the next staged superbatch directory (a one-superbatch packed dataset), continues the
`PackedLoader` into it (`PackedLoader.follow`: same CPU tier, same GPU tier, same buffers) and
trains over its batches with the run's `operators.train.session.TrainSession` — the session
every pipeline trains with, its open epoch carried across superbatches. The batches arrive in
the same order with bit-exact features, and nothing else draws from torch's RNG between
superbatches, so the per-batch losses and the final weights equal the offline
(prepare-then-train) run's with the same seed. At an epoch's last superbatch the session closes
the epoch's record (val/test evaluated on the store when the worker can read it), in
`train_packed`'s format.

`checkpoint` returns what resuming needs: model, optimizer, RNG, records, the position (the
next superbatch) and the CPU tier's node ids there — the tier's rows are the store's rows of
those ids, so a resumed run re-reads them instead of saving them.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError, InputError
from ..formats.checksum import crc32
from ..formats.hetero import HeteroLayout
from ..formats.packed import EDGE_IDS, EDGE_ROWS
from ..formats.samples import Buffer
from ..options import QUEUE_DEPTH
from ..prepare.samplers import train_target
from ..train.config import TrainConfig
from ..train.loader import PackedLoader
from ..train.loop import deterministic
from ..train.session import TrainSession, num, resolve_device, store_eval_loaders
from ..train.steps import DataParallel
from ..train.trainer import STAGES

__all__ = ["StreamTrainConfig", "StreamTrainer"]


@dataclass(frozen=True)
class StreamTrainConfig(TrainConfig):
    """`TrainConfig` (model, training and round shape) plus the options of the loader the GPU worker
    carries across superbatches (`PackedLoader`'s budgets, queue depth, checksums) and the store it
    evaluates on."""

    cpu_memory: int | None = None
    gpu_memory: int | None = None
    queue_depth: int = QUEUE_DEPTH
    check_crc: bool = True
    store: str | None = None
    world: int = 1          # GPU workers training the run data-parallel (`train.steps.DataParallel`)
    rank: int = 0           # this worker's place among them (rank 0 evaluates)
    shared_tier: str | None = None      # --cache shared: the file of the CPU tier the GPU workers share
    shared_timeout_s: float = 600.0     # how long a batch waits for its turn at that tier


class StreamTrainer:
    """Train a streamed round superbatch by superbatch on one device.

    Args:
        cfg: model and trainer options.
        device: "cpu" or "cuda[:N]".
        fingerprint: identifies the run's options (checked against a resumed checkpoint).
        resume: a checkpoint's state (`checkpoint()`'s first item, loaded), or None.
    """

    def __init__(self, cfg: StreamTrainConfig, device: str, fingerprint: str, resume: dict[str, Any] | None = None
                 ) -> None:
        self.cfg = cfg
        self.dev = resolve_device(device)
        self.fingerprint = fingerprint
        self.resume = resume
        if resume is not None and resume.get("fingerprint") != fingerprint:
            raise ConfigError("resume", "the checkpoint was made with other options or another dataset; use the "
                                        "same options, or start a new run without resume")
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        self.loader: PackedLoader | None = None
        self.session: TrainSession | None = None
        self.shared: Any = None           # the shared CPU tier (--cache shared)
        self.base_dir: str | None = None  # the staged base bundle (its tiers), set by the train task
        self.next_index = int(resume["stream_index"]) if resume else 0
        self.position = (int(resume["epoch"]), int(resume["batch"])) if resume else (0, 0)
        self.eval_note: str | None = None

    @property
    def records(self) -> list[dict[str, Any]]:
        """The closed epochs' records, a resumed checkpoint's included."""
        if self.session is not None:
            return self.session.records
        return list(self.resume["records"]) if self.resume else []

    # ------------------------------------------------------------------ setup
    def _start(self, sb_dir: Path, held: Mapping[str, Buffer] | None) -> tuple[PackedLoader, TrainSession]:
        """The loader over the first staged superbatch, then the session (seeded), or the resumed state."""
        cfg = self.cfg
        cpu_memory = cfg.cpu_memory
        if cfg.shared_tier is not None:
            from ..formats.manifest import read_manifest
            from ..train.shared_tier import SharedTier

            m = read_manifest(sb_dir) or {}
            self.shared = SharedTier(cfg.shared_tier, int(m["tiers"]["cpu_rows"]), int(m["dim"]), np.dtype(m["dtype"]),
                                     cfg.rank, cfg.shared_timeout_s)
            if cpu_memory is not None:    # the workers pool their budgets into the one tier
                cpu_memory *= cfg.world
        loader = PackedLoader(sb_dir, self.dev, cpu_memory=cpu_memory, queue_depth=cfg.queue_depth,
                              check_crc=cfg.check_crc, gpu_memory=cfg.gpu_memory, held=held, shared=self.shared)
        first = loader.superbatches[0].first_batch
        if first:     # the stream starts mid-round (resume): the base CPU tier is the tier at `first`
            rows = None if self.shared is not None and cfg.rank > 0 else np.array(loader.ds.cpu_init)
            loader.restore_tier(first, rows, np.array(loader.ds.cpu_ids))
            if loader.edges is not None:     # the edge rows' tier at `first` (a shared tier holds no edge rows)
                edges = loader.edges
                edges.restore_tier(first, np.array(edges.ds.cpu_init), np.array(edges.ds.cpu_ids))
        self.loader = loader
        # (a data-parallel rank whose first superbatches held nothing of its own has a session already)
        return loader, self.session or self._new_session(loader.dim, loader.num_classes,
                                                         loader.edges.dim if loader.edges is not None else None,
                                                         train_target(loader.hetero, loader.ds.path))

    def _new_session(self, dim: int, num_classes: int, edge_dim: int | None = None,
                     hetero: tuple[Any, str] | None = None) -> TrainSession:
        """The session (seeded; the resumed state loaded), a data-parallel rank's with its steps; `edge_dim`: the
        width of the edge rows the batches carry (None: none)."""
        cfg = self.cfg
        steps = DataParallel(cfg.world, cfg.rank) if cfg.world > 1 else None
        self.session = TrainSession(cfg, self.dev, dim, num_classes, stages=STAGES, throughput=True,
                                    evals=self._eval_loaders if cfg.rank == 0 else None, steps=steps,
                                    edge_dim=edge_dim, hetero=hetero)
        if self.resume is not None:
            self.session.load_state_dict(self.resume)
        return self.session

    def _started(self) -> tuple[PackedLoader, TrainSession]:
        if self.loader is None or self.session is None:
            raise RuntimeError("the stream trainer has not trained a superbatch yet")
        return self.loader, self.session

    def _eval_loaders(self) -> dict[str, Any]:
        """The val/test loaders over the store, or none (noted) when the GPU worker cannot read it."""
        from ..formats.verify import open_store

        loader, _ = self._started()
        try:
            st = open_store(loader.ds, self.cfg.store)
        except InputError as e:
            self.eval_note = f"evaluation skipped: the GPU worker cannot read the store ({e})"
            return {}
        return store_eval_loaders(self.cfg, st, loader.labels)

    # ------------------------------------------------------------------ one superbatch
    def train(self, sb_dir: str | Path | None, entry: dict[str, Any], held: Mapping[str, Buffer] | None = None
              ) -> dict[str, Any]:
        """Train the staged superbatch `sb_dir` (stream position ``entry["index"]``).

        Args:
            sb_dir: the staged one-superbatch packed dataset; None: this data-parallel rank has no
                batch of this superbatch (it still takes part in the superbatch's steps).
            held: its index and samples when the GPU worker holds them in memory (`stage_bundle`).
            entry: ``key``, ``index`` (position in the stream), ``epoch``, ``first_batch`` (global),
                ``epoch_batch`` (its first batch within the epoch), ``batches``, ``epoch_end``
                (last superbatch of its epoch).

        Returns:
            ``losses``, ``sizes``, ``seconds``, ``seeds_per_s``, ``loss`` (this superbatch's mean),
            and ``record`` (the finished epoch's record) at an epoch's end.
        """
        if entry["index"] != self.next_index:
            raise InputError(sb_dir or f"superbatch {entry['key']}",
                             f"superbatch {entry['key']} is stream position {entry['index']}, the trainer "
                             f"expects {self.next_index}")
        pass_batches = entry.get("pass_batches")
        with deterministic():
            if sb_dir is None:        # an empty share: the steps go on, with this rank's gradient zero
                typed = entry.get("hetero")      # a typed store's layout: the model is built the same on every rank
                session = self.session or self._new_session(
                    int(entry["dim"]), int(entry["num_classes"]), entry.get("edge_dim"),
                    train_target(HeteroLayout(typed), "the stream's entry") if typed else None)
                result = session.train([], pass_batches=pass_batches)
            else:
                sb_dir = Path(sb_dir)
                if self.loader is None or self.session is None:
                    loader, session = self._start(sb_dir, held)
                else:
                    loader, session = self.loader, self.session
                    loader.follow(sb_dir, held)
                self._check_position(sb_dir, loader, entry)
                loader.set_epoch(int(entry["epoch"]))
                io0 = loader.stats()["io"]
                result = session.train(loader, pass_batches=pass_batches)
                io1 = loader.stats()["io"]
                self._check_tier(sb_dir, loader)
                session.count(io1["bytes_read"] - io0["bytes_read"], io1["requests"] - io0["requests"])
            out: dict[str, Any] = {"key": entry["key"], "index": entry["index"], "losses": list(result["losses"]),
                                   "sizes": list(result["sizes"]), "seconds": float(result["seconds"]),
                                   "loss": num(result["loss"]), "seeds": int(result["seeds"]),
                                   "correct": int(result.get("correct", 0)),
                                   "seeds_per_s": result["seeds"] / result["seconds"] if result["seconds"] > 0 else None}
            if self.cfg.world > 1:
                out["model_crc"] = self.model_crc()
            self.next_index += 1
            epoch = int(entry["epoch"])
            self.position = (epoch, int(entry["epoch_batch"]) + int(entry["batches"]))
            if entry["epoch_end"]:
                out["epoch_tally"] = session.tally.state()
                out["record"] = session.close_epoch(epoch)
                self.position = (epoch + 1, 0)
        return out

    def model_crc(self) -> int | None:
        """A checksum of the model's weights, bit for bit (data-parallel ranks compare theirs after
        every superbatch); None without a model."""
        if self.session is None or self.session.model is None:
            return None
        flat = torch.cat([v.detach().reshape(-1).float().cpu() for v in self.session.model.state_dict().values()])
        return crc32(flat.numpy().tobytes())
    def _check_position(self, sb_dir: Path, loader: PackedLoader, entry: dict[str, Any]) -> None:
        sbs = loader.superbatches
        if len(sbs) != 1 or sbs[0].key != entry["key"] or sbs[0].first_batch != entry["first_batch"]:
            raise InputError(sb_dir, f"holds superbatches {[s.key for s in sbs]}, expected {entry['key']} at batch "
                                     f"{entry['first_batch']}")

    def _check_tier(self, sb_dir: Path, loader: PackedLoader) -> None:
        """After the superbatch the carried CPU tier must hold exactly the rows its plan left there."""
        for table in (loader, loader.edges):
            if table is None:
                continue
            want = table.ds.manifest.get("stream", {}).get("cpu_ids_crc")
            if want is not None and crc32(np.ascontiguousarray(table.cpu_ids, np.int64).data) != int(want):
                what = "CPU tier" if table is loader else "edge rows' CPU tier"
                raise InputError(sb_dir, f"the {what} after this superbatch differs from the plan's (superbatches "
                                         "trained out of order, or a plan of another run)")

    # ------------------------------------------------------------------ state
    def checkpoint(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(state, arrays) for `operators.checkpoint.save_checkpoint` at the current position.

        The state is loadable with ``torch.load(weights_only=True)``; the arrays hold the CPU
        tier's node ids (``cpu_ids.npy``) where training continues, and the edge rows' tier's edge ids
        (``edge_cpu_ids.npy``) where the batches carry edge rows. Everything is a copy: training may go on
        (the next superbatch) while the checkpoint is still being written.
        """
        if self.session is None:
            raise RuntimeError("the stream trainer has not trained a superbatch yet")
        epoch, batch = self.position
        state = {"fingerprint": self.fingerprint, "epoch": epoch, "batch": batch, "stream_index": self.next_index,
                 **self.session.state_dict()}
        # a rank that has not loaded a superbatch yet still holds the tier it started with (the base's)
        arrays: dict[str, np.ndarray] = {}
        if self.loader is not None:
            arrays["cpu_ids.npy"] = np.array(self.loader.cpu_ids)
            if self.loader.edges is not None:
                arrays[EDGE_IDS] = np.array(self.loader.edges.cpu_ids)
        elif self.base_dir is not None:
            arrays["cpu_ids.npy"] = np.load(Path(self.base_dir) / "cpu_ids.npy")
            edge_ids = Path(self.base_dir) / EDGE_ROWS / "cpu_ids.npy"
            if edge_ids.is_file():
                arrays[EDGE_IDS] = np.load(edge_ids)
        else:
            raise RuntimeError("the stream trainer has no CPU tier yet (no superbatch, no base)")
        return copy.deepcopy(state), arrays

    def model_state(self) -> dict[str, torch.Tensor]:
        """The model's current weights (on the CPU)."""
        _, session = self._started()
        if session.model is None:
            raise RuntimeError("a data-only stream (model 'none') has no weights")
        return {k: v.detach().cpu() for k, v in session.model.state_dict().items()}

    def summary(self) -> dict[str, Any]:
        """Loader figures for the run's report: stage clocks, I/O counters, rows per tier, memory plan."""
        if self.loader is None:
            return {}
        s = self.loader.stats()
        edges = s.get("edges")      # the edge rows' loader: its own tiers and reads
        return {"stages": s["stages"], "io": s["io"], "tiers": s["tiers"], "memory": dict(self.loader.memory),
                **({"edges": {"io": edges["io"], "tiers": edges["tiers"]}} if edges is not None else {}),
                "config": {**self.cfg.as_json(), "device": str(self.dev),
                           "optimizer": self.session.describe() if self.session is not None else None,
                           "torch_threads": torch.get_num_threads()},
                "eval_note": self.eval_note}

    def release(self) -> None:
        """Close the consumed superbatch's files (so its directory can be deleted) and let go of its
        index and samples held in memory."""
        if self.loader is not None:
            self.loader.close_files()
            self.loader.ds.held.clear()
            if self.loader.edges is not None:
                self.loader.edges.ds.held.clear()

    def close(self) -> None:
        if self.loader is not None:
            self.loader.close()
            self.loader = None
        if self.shared is not None:     # every rank removes the file (mappings outlive it): none is left behind
            self.shared.close(unlink=True)   # when rank 0 is the one that died
            self.shared = None

