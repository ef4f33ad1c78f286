"""Streamed training: one superbatch at a time, the model, optimizer and CPU tier carried across them.

`StreamTrainer` is what the GPU worker holds for a streamed run. Each call of `train` takes
the next staged superbatch directory (a one-superbatch packed dataset), continues the
`PackedLoader` into it (`PackedLoader.follow`: same CPU tier, same GPU tier, same buffers) and
runs `operators.train.train_epoch` over its batches — the training math of every pipeline. The
model is built after the same ``torch.manual_seed`` as `operators.trainer.train_packed`, the
batches arrive in the same order with bit-exact features, and nothing else draws from torch's
RNG between superbatches, so the per-batch losses and the final weights equal the offline
(prepare-then-train) run's with the same seed. At an epoch's last superbatch the epoch's record
is closed (val/test evaluated on the store when the worker can read it), in
`train_packed`'s format.

`checkpoint` returns what resuming needs: model, optimizer, RNG, records, the position (the
next superbatch) and the CPU tier's node ids there — the tier's rows are the store's rows of
those ids, so a resumed run re-reads them instead of saving them.
"""
from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..formats.checksum import crc32
from ..formats.errors import ConfigError, InputError
from ..formats.samples import Buffer
from ..prepare.sample import NeighborSampler
from ..train.batches import TEST_STREAM, VAL_STREAM, InMemoryLoader
from ..train.loader import PackedLoader
from ..train.loop import TrainConfig, deterministic, evaluate, train_epoch
from ..train.models import build_model
from ..train.trainer import StoreFeatures

_STAGES = ("load", "assemble", "graph", "gather", "train")


@dataclass(frozen=True)
class StreamTrainConfig:
    """The model and trainer options of a streamed run (`train_packed`'s, with the round's shape)."""

    model: str = "sage"
    hidden: int = 128
    num_layers: int | None = None
    lr: float = 3e-3
    dropout: float = 0.2
    heads: int = 4
    seed: int = 0
    eval_every: int = 1
    epochs: int = 1
    fanouts: tuple[int, ...] = (10, 10, 10)
    batch_size: int = 1024
    cpu_memory: int | None = None
    gpu_memory: int | None = None
    queue_depth: int = 2
    check_crc: bool = True
    threads: int | None = None
    store: str | None = None

    def train_config(self) -> TrainConfig:
        return TrainConfig(model=self.model, hidden=self.hidden, num_layers=self.num_layers, fanouts=tuple(self.fanouts),
                           batch_size=self.batch_size, epochs=self.epochs, lr=self.lr, dropout=self.dropout,
                           heads=self.heads, seed=self.seed, eval_every=self.eval_every)


def _num(x: float | None) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


class _Sizes:
    """The loader as `train_epoch` sees it, recording every batch's seed count (for the epoch's mean)."""

    def __init__(self, loader: PackedLoader) -> None:
        self.loader = loader
        self.sizes: list[int] = []

    @property
    def stage_s(self) -> dict[str, float]:
        return self.loader.stage_s

    def __iter__(self) -> Any:
        for batch in self.loader:
            self.sizes.append(int(batch.batch_size))
            yield batch


def _empty_partial() -> dict[str, Any]:
    return {"losses": [], "sizes": [], "correct": 0, "seconds": 0.0, "stage_s": dict.fromkeys(_STAGES, 0.0),
            "bytes_read": 0, "requests": 0}


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
        self.tcfg = cfg.train_config()
        try:
            self.dev = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ConfigError("--device", f"not a torch device: {device!r}") from e
        if self.dev.type == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device", f"{device!r} requested but CUDA is not available on the GPU worker")
        self.fingerprint = fingerprint
        self.resume = resume
        if resume is not None and resume.get("fingerprint") != fingerprint:
            raise ConfigError("--resume", "the checkpoint was made with other options or another dataset; use the "
                                          "same options, or start a new run without --resume")
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        self.loader: PackedLoader | None = None
        self.net: torch.nn.Module | None = None
        self.opt: torch.optim.Optimizer | None = None
        self.records: list[dict[str, Any]] = list(resume["records"]) if resume else []
        self.partial: dict[str, Any] = dict(resume["partial"]) if resume and resume.get("partial") else _empty_partial()
        self.next_index = int(resume["stream_index"]) if resume else 0
        self.position = (int(resume["epoch"]), int(resume["batch"])) if resume else (0, 0)
        self.evals: dict[str, InMemoryLoader] | None = None
        self.eval_note: str | None = None

    # ------------------------------------------------------------------ setup
    def _start(self, sb_dir: Path, held: Mapping[str, Buffer] | None) -> None:
        """The loader over the first staged superbatch, then the model (after the run's seed), or the resumed state."""
        cfg = self.cfg
        loader = PackedLoader(sb_dir, self.dev, cpu_memory=cfg.cpu_memory, queue_depth=cfg.queue_depth,
                              check_crc=cfg.check_crc, gpu_memory=cfg.gpu_memory, held=held)
        first = loader.superbatches[0].first_batch
        if first:     # the stream starts mid-round (resume): the base CPU tier is the tier at `first`
            loader.restore_tier(first, np.array(loader.ds.cpu_init), np.array(loader.ds.cpu_ids))
        self.loader = loader
        torch.manual_seed(self.tcfg.seed)
        self.net = build_model(self.tcfg.model, loader.dim, self.tcfg.hidden, loader.num_classes,
                               int(self.tcfg.num_layers or 1), dropout=self.tcfg.dropout, heads=self.tcfg.heads).to(self.dev)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=self.tcfg.lr)
        if self.resume is not None:
            st = self.resume
            try:
                self.net.load_state_dict(st["model"])
                self.opt.load_state_dict(st["optimizer"])
                torch.set_rng_state(st["rng"])
                if self.dev.type == "cuda" and st.get("cuda_rng"):
                    torch.cuda.set_rng_state_all(st["cuda_rng"])
            except (KeyError, RuntimeError, ValueError) as e:
                raise InputError("checkpoint", f"corrupt checkpoint: cannot restore the training state ({e})") from e

    def _eval_loaders(self) -> dict[str, InMemoryLoader]:
        if self.evals is not None:
            return self.evals
        self.evals = {}
        assert self.loader is not None
        from ..formats.verify import open_store

        try:
            st = open_store(self.loader.ds, self.cfg.store)
        except InputError as e:
            self.eval_note = f"evaluation skipped: the GPU worker cannot read the store ({e})"
            return self.evals
        sampler = NeighborSampler(st.indptr, st.indices, list(self.tcfg.fanouts), num_threads=torch.get_num_threads())
        feats, labels = StoreFeatures(st), torch.from_numpy(self.loader.labels)
        self.evals = {name: InMemoryLoader(feats, labels, sampler, st.split_ids(name), self.tcfg.batch_size,  # type: ignore[arg-type]
                                           False, self.tcfg.seed, stream)
                      for name, stream in (("val", VAL_STREAM), ("test", TEST_STREAM))}
        return self.evals

    # ------------------------------------------------------------------ one superbatch
    def train(self, sb_dir: str | Path, entry: dict[str, Any], held: Mapping[str, Buffer] | None = None
              ) -> dict[str, Any]:
        """Train the staged superbatch `sb_dir` (stream position ``entry["index"]``).

        Args:
            sb_dir: the staged one-superbatch packed dataset.
            held: its index and samples when the GPU worker holds them in memory (`stage_bundle`).
            entry: ``key``, ``index`` (position in the stream), ``epoch``, ``first_batch`` (global),
                ``epoch_batch`` (its first batch within the epoch), ``batches``, ``epoch_end``
                (last superbatch of its epoch).

        Returns:
            ``losses``, ``sizes``, ``seconds``, ``seeds_per_s``, ``loss`` (this superbatch's mean),
            and ``record`` (the finished epoch's record) at an epoch's end.
        """
        if entry["index"] != self.next_index:
            raise InputError(sb_dir, f"superbatch {entry['key']} is stream position {entry['index']}, the trainer "
                                     f"expects {self.next_index}")
        sb_dir = Path(sb_dir)
        with deterministic():
            if self.loader is None:
                self._start(sb_dir, held)
            else:
                self.loader.follow(sb_dir, held)
            loader, net, opt = self.loader, self.net, self.opt
            assert loader is not None and net is not None and opt is not None
            self._check_position(sb_dir, loader, entry)
            loader.set_epoch(int(entry["epoch"]))
            feed = _Sizes(loader)
            io0 = loader.stats()["io"]
            result = train_epoch(net, feed, opt, self.dev)
            io1 = loader.stats()["io"]
            self._check_tier(sb_dir, loader)
            p = self.partial
            p["losses"] += list(result["losses"])
            p["sizes"] += feed.sizes
            p["correct"] += round(result["train_acc"] * result["seeds"]) if result["losses"] else 0
            p["seconds"] += float(result["seconds"])
            for k in _STAGES:
                p["stage_s"][k] = p["stage_s"].get(k, 0.0) + float(result["stage_s"].get(k, 0.0))
            p["bytes_read"] += int(io1["bytes_read"] - io0["bytes_read"])
            p["requests"] += int(io1["requests"] - io0["requests"])
            out: dict[str, Any] = {"key": entry["key"], "index": entry["index"], "losses": list(result["losses"]),
                                   "sizes": list(feed.sizes), "seconds": float(result["seconds"]),
                                   "loss": _num(result["loss"]), "seeds": int(result["seeds"]),
                                   "seeds_per_s": result["seeds"] / result["seconds"] if result["seconds"] > 0 else None}
            self.next_index += 1
            epoch = int(entry["epoch"])
            self.position = (epoch, int(entry["epoch_batch"]) + int(entry["batches"]))
            if entry["epoch_end"]:
                out["record"] = self._close_epoch(epoch)
                self.position = (epoch + 1, 0)
        return out

    def _check_position(self, sb_dir: Path, loader: PackedLoader, entry: dict[str, Any]) -> None:
        sbs = loader.superbatches
        if len(sbs) != 1 or sbs[0].key != entry["key"] or sbs[0].first_batch != entry["first_batch"]:
            raise InputError(sb_dir, f"holds superbatches {[s.key for s in sbs]}, expected {entry['key']} at batch "
                                     f"{entry['first_batch']}")

    def _check_tier(self, sb_dir: Path, loader: PackedLoader) -> None:
        """After the superbatch the carried CPU tier must hold exactly the rows its plan left there."""
        want = loader.ds.manifest.get("stream", {}).get("cpu_ids_crc")
        if want is not None and crc32(np.ascontiguousarray(loader.cpu_ids, np.int64).data) != int(want):
            raise InputError(sb_dir, "the CPU tier after this superbatch differs from the plan's (superbatches "
                                     "trained out of order, or a plan of another run)")

    def _close_epoch(self, epoch: int) -> dict[str, Any]:
        """The finished epoch's record (train_packed's format), evaluated when due."""
        p = self.partial
        seen = sum(p["sizes"])
        total = 0.0
        for value, size in zip(p["losses"], p["sizes"]):      # the same sum, in the same order, as train_epoch's
            total += value * size
        seconds = p["seconds"]
        record: dict[str, Any] = {
            "epoch": epoch + 1,
            "loss": _num(total / seen) if p["losses"] and seen else None,
            "losses": list(p["losses"]),
            "train_acc": _num(p["correct"] / seen) if p["losses"] and seen else None,
            "val_acc": None, "test_acc": None,
            "epoch_s": seconds,
            "seeds_per_s": seen / seconds if seconds > 0 else None,
            "batches_per_s": len(p["sizes"]) / seconds if seconds > 0 else None,
            "bytes_read": int(p["bytes_read"]), "requests": int(p["requests"]),
            "stage_s": {**p["stage_s"], "eval": 0.0},
        }
        if (epoch + 1) % self.tcfg.eval_every == 0 or epoch + 1 == self.tcfg.epochs:
            evals = self._eval_loaders()
            if evals:
                t = time.perf_counter()
                record["val_acc"] = _num(evaluate(self.net, evals["val"], self.dev))    # type: ignore[arg-type]
                record["test_acc"] = _num(evaluate(self.net, evals["test"], self.dev))  # type: ignore[arg-type]
                record["stage_s"]["eval"] = time.perf_counter() - t
        self.records.append(record)
        self.partial = _empty_partial()
        return record

    # ------------------------------------------------------------------ state
    def checkpoint(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """(state, arrays) for `operators.checkpoint.save_checkpoint` at the current position.

        The state is loadable with ``torch.load(weights_only=True)``; the arrays hold the CPU
        tier's node ids (``cpu_ids.npy``) where training continues. Everything is a copy: training
        may go on (the next superbatch) while the checkpoint is still being written.
        """
        assert self.net is not None and self.opt is not None and self.loader is not None
        epoch, batch = self.position
        state = {
            "fingerprint": self.fingerprint, "epoch": epoch, "batch": batch, "stream_index": self.next_index,
            "records": self.records, "partial": self.partial if self.partial["losses"] else None,
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.dev.type == "cuda" else [],
            "model": self.net.state_dict(), "optimizer": self.opt.state_dict(),
        }
        return copy.deepcopy(state), {"cpu_ids.npy": np.array(self.loader.cpu_ids)}

    def model_state(self) -> dict[str, torch.Tensor]:
        """The model's current weights (on the CPU)."""
        assert self.net is not None
        return {k: v.detach().cpu() for k, v in self.net.state_dict().items()}

    def summary(self) -> dict[str, Any]:
        """Loader figures for the run's report: stage clocks, I/O counters, rows per tier, memory plan."""
        if self.loader is None:
            return {}
        s = self.loader.stats()
        return {"stages": s["stages"], "io": s["io"], "tiers": s["tiers"], "memory": dict(self.loader.memory),
                "config": {**asdict(self.cfg), "fanouts": list(self.cfg.fanouts), "device": str(self.dev),
                           "torch_threads": torch.get_num_threads()},
                "eval_note": self.eval_note}

    def release(self) -> None:
        """Close the consumed superbatch's files (so its directory can be deleted) and let go of its
        index and samples held in memory."""
        if self.loader is not None:
            self.loader.close_files()
            self.loader.ds.held.clear()

    def close(self) -> None:
        if self.loader is not None:
            self.loader.close()
            self.loader = None

