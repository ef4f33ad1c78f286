"""One training session, the one every pipeline trains with: each caller only chooses its loader.

`TrainSession` seeds torch, builds the model and its optimiser, trains over any iterable of
`Data` batches (`loop.train_epoch` is the one per-batch step), keeps the open epoch's tally
across any number of loaders (a superbatch each, or the rest of an interrupted epoch), closes
it into the epoch's record (evaluated when due), and saves and restores model, optimiser and
RNG for checkpoints. The in-memory, packed and streamed trainers differ only in the loader and
in what they checkpoint besides, so with the same seed and samples they give the same losses
because they run these same lines, not copies of them.
"""
from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

from ...errors import ConfigError, InputError
from ..prepare.samplers import store_sampler
from ..prepare.task import SeedSource
from .batches import TEST_STREAM, VAL_STREAM, InMemoryLoader
from .config import DATA_ONLY, MODELS, TrainConfig, check_model_identity
from .history import HistoryCache
from .loop import evaluate, evaluate_link, train_epoch
from .models import build_model, spec_of
from .optim import Stepper
from .record import EpochTally, final_block, num
from .steps import Accumulate, StepGroups

__all__ = ["DATA_ONLY", "MODELS", "EpochTally", "StoreFeatures", "TrainConfig", "TrainSession", "eval_loaders",
           "final_block", "num", "resolve_device", "store_eval_loaders", "torch_threads"]

EvalLoaders = Mapping[str, Iterable[Data]]


def resolve_device(device: str | torch.device) -> torch.device:
    """`device` as a torch device: "cpu" or "cuda[:N]", CUDA only where this machine has it.

    Raises:
        ConfigError: (``device``) not a torch device, another kind, or CUDA unavailable here.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ConfigError("device", f"not a torch device: {device!r}") from e
    if dev.type not in ("cpu", "cuda"):
        raise ConfigError("device", f"expected 'cpu' or 'cuda[:N]', got {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device", f"{device!r} requested but CUDA is not available on this machine")
    return dev


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with torch's intra-op threads set to `threads` (None: unchanged), then restore them."""
    old = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# ---------------------------------------------------------------------------- evaluation loaders

class StoreFeatures:
    """The store's features as `InMemoryLoader` gathers them (`index_select`), read via `Store.gather`.

    Evaluation then samples and batches exactly as the in-memory pipeline does (same seed
    streams, same order), without a full in-RAM copy of the features.
    """

    device = torch.device("cpu")

    def __init__(self, store: Any, edges: bool = False) -> None:
        self.store = store
        self.edges = edges          # the store's edge features (by edge id) rather than its node features
        self._maps: list[np.ndarray] | None = None     # the shards' memory maps, made once: mapping a shard
                                                       # afresh per gather cost ~100x the gather itself

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        if dim != 0:
            raise ValueError(f"StoreFeatures gathers rows only (dim 0), got dim {dim}")
        table = self.store.edge_features if self.edges else self.store
        if self._maps is None:
            self._maps = [table.shard_array(p) for p in range(len(table.shards))]
        return torch.from_numpy(table.gather(index.numpy(), self._maps))


def eval_loaders(cfg: TrainConfig, features: Any, labels: torch.Tensor, sampler: Any,
                 split_ids: Callable[[str], np.ndarray], store: Any = None,
                 edge_features: Any = None) -> dict[str, InMemoryLoader]:
    """The validation and test loaders: the seeds of each split in order, sampled on their own seed streams; a
    link task's (which needs the `store`): each split's positive edges with their fixed negatives.
    `edge_features`: the store's edge features, where its batches carry them."""
    if cfg.link:
        empty = np.zeros(0, dtype=np.int64)
        return {name: InMemoryLoader(features, labels, sampler, empty, cfg.batch_size, False, cfg.seed, stream,
                                     source=SeedSource(store, cfg.batch_size, cfg.seed, cfg.train_task, split=name,
                                                       stream=stream, evaluate=True),
                                     edge_features=edge_features)
                for name, stream in (("val", VAL_STREAM), ("test", TEST_STREAM))}
    return {name: InMemoryLoader(features, labels, sampler, split_ids(name), cfg.batch_size, False, cfg.seed, stream,
                                 edge_features=edge_features)
            for name, stream in (("val", VAL_STREAM), ("test", TEST_STREAM))}


def store_eval_loaders(cfg: TrainConfig, store: Any, labels: np.ndarray) -> dict[str, InMemoryLoader]:
    """`eval_loaders` over a store's memory maps: what a trainer without the features in RAM evaluates on."""
    sampler = store_sampler(store, cfg.fanouts, num_threads=torch.get_num_threads())
    edges = getattr(store, "edge_features", None)
    return eval_loaders(cfg, StoreFeatures(store), torch.from_numpy(labels), sampler, store.split_ids, store,
                        StoreFeatures(store, edges=True) if edges is not None else None)


class _Feed:
    """The loader as `train_epoch` sees it: `on_batch(1)` after each batch; stops (cleanly, between
    batches) once `stop` is set. Its `stage_s` is the loader's. A loader that lends its batches'
    buffers (`PackedLoader.release`) gets each batch back once the step that used it is done:
    `train_epoch` asks for the next batch only after the last one's step."""

    def __init__(self, loader: Iterable[Data], on_batch: Callable[[int], Any] | None,
                 stop: threading.Event | None) -> None:
        self.loader = loader
        self.on_batch = on_batch
        self.stop = stop
        self.stopped = False

    @property
    def stage_s(self) -> dict[str, float]:
        return dict(getattr(self.loader, "stage_s", {}))

    def __iter__(self) -> Iterator[Data]:
        release = getattr(self.loader, "release", None)
        for batch in self.loader:
            if self.stop is not None and self.stop.is_set():
                self.stopped = True
                return
            yield batch
            if release is not None:
                release(batch)
            if self.on_batch is not None:
                self.on_batch(1)


def _data_pass(feed: _Feed) -> dict[str, Any]:
    """The data path only (model "none"): every batch built, nothing trained; `train_epoch`'s result keys."""
    start = time.perf_counter()
    sizes = [int(batch.batch_size) for batch in feed]
    return {"loss": math.nan, "losses": [], "sizes": sizes, "train_acc": math.nan, "correct": 0,
            "seeds": sum(sizes), "batches": len(sizes), "seconds": time.perf_counter() - start,
            "stage_s": {**feed.stage_s, "train": 0.0}}


# ---------------------------------------------------------------------------- the session

class TrainSession:
    """Model, optimiser and RNG of one run, and the epoch it is training.

    Args:
        cfg: the training options (`cfg.threads` is the caller's to apply: `torch_threads`).
        device: "cpu" or "cuda[:N]" (checked by `resolve_device`).
        dim, num_classes: the features' width and the number of classes.
        stages: the loader's stage names the epoch records keep in `stage_s` (with `train` and
            `eval`), e.g. ``("sample", "gather", "train")``.
        throughput: records also carry `seeds_per_s`, `batches_per_s` and the I/O counters
            `bytes_read` and `requests` (which the caller adds with `count`).
        evals: called once, at the first evaluation due, for the ``val`` and ``test`` loaders;
            None or an empty mapping: no evaluation (accuracies None).
        steps: how batches become optimizer steps (a data-parallel rank's `steps.DataParallel`);
            None: ``cfg.batches_per_step`` batches of one process per step.
        hetero: a typed graph's (layout, target type) (`heterobatch.train_target`): the model is built
            heterogeneous (`models.build_model`); None: a homogeneous graph.

    The model is built right after ``torch.manual_seed(cfg.seed)``, so sessions built with the
    same seed start from the same weights whatever the pipeline.
    """

    def __init__(self, cfg: TrainConfig, device: str | torch.device, dim: int, num_classes: int, *,
                 stages: Sequence[str], throughput: bool = False,
                 evals: Callable[[], EvalLoaders] | None = None, steps: StepGroups | None = None,
                 edge_dim: int | None = None, hetero: tuple[Any, str] | None = None) -> None:
        self.cfg = cfg
        self.steps = steps if steps is not None else \
            (Accumulate(cfg.batches_per_step) if cfg.batches_per_step > 1 else None)
        self.device = resolve_device(device)
        self.stages = tuple(stages)
        self.throughput = throughput
        self._evals_factory = evals
        self._evals: EvalLoaders | None = None
        self.records: list[dict[str, Any]] = []       # the closed epochs' records, in order
        self.tally = EpochTally(self.stages)           # the open epoch
        torch.manual_seed(cfg.seed)
        self.model: torch.nn.Module | None = None
        self.stepper: Stepper | None = None
        if not cfg.data_only:
            model = build_model(cfg.model, dim, cfg.hidden, cfg.hidden if cfg.link else num_classes,
                                int(cfg.num_layers or 1), dropout=cfg.dropout, heads=cfg.heads, edge_dim=edge_dim,
                                link=cfg.link, hetero=hetero)
            if cfg.history_rows > 0:
                HistoryCache.attach(model, cfg.history_rows)
            self.model = model.to(self.device)
            self.stepper = Stepper(self.model, spec_of(self.model), cfg)
        self._prior = None if cfg.label_prior is None else \
            torch.tensor(cfg.label_prior, dtype=torch.float64, device=self.device)

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        """The model's optimizer (None: model "none")."""
        return self.stepper.optimizer if self.stepper is not None else None

    def describe(self) -> dict[str, Any] | None:
        """The optimizer, scheduler and clipping as the report's ``optimizer`` block (None: model "none")."""
        return self.stepper.describe() if self.stepper is not None else None

    # ------------------------------------------------------------------ training
    def train(self, loader: Iterable[Data], on_batch: Callable[[int], Any] | None = None,
              stop: threading.Event | None = None, pass_batches: int | None = None) -> dict[str, Any]:
        """Train over every batch of `loader` (model "none": only draw them), adding to the open epoch.

        Args:
            loader: yields `Data` batches; its `stage_s` (if any) is added to the epoch's.
            on_batch: called with 1 after each batch.
            stop: when set, training stops before the next batch.
            pass_batches: the pass's batches over all ranks (data-parallel steps need it).

        Returns:
            `loop.train_epoch`'s result for this part, with ``stopped``: whether `stop` cut it short.
        """
        feed = _Feed(loader, on_batch, stop)
        if self.model is None or self.stepper is None:
            result = _data_pass(feed)
        else:
            result = train_epoch(self.model, feed, self.stepper, self.device, self._prior, self.steps, pass_batches)
        self.tally.add(result)
        return {**result, "stopped": feed.stopped}

    def count(self, bytes_read: int, requests: int) -> None:
        """Add the loader's I/O of the part just trained to the open epoch (`throughput` records)."""
        self.tally.bytes_read += int(bytes_read)
        self.tally.requests += int(requests)

    def close_epoch(self, epoch: int) -> dict[str, Any]:
        """The record of epoch `epoch` (0-based) from the open tally, evaluated when due; appended to
        `records`, and the tally starts over. The record's ``lr`` is the learning rate at the epoch's end;
        a per-epoch schedule steps after it."""
        record = self.tally.record(epoch, self.throughput)
        if self.stepper is not None:
            record["lr"] = self.stepper.lr
        if self.cfg.due(epoch):
            self._evaluate(record)
        if self.stepper is not None:
            self.stepper.end_epoch(record["loss"])
        self.records.append(record)
        self.tally = EpochTally(self.stages)
        return record

    def _evaluate(self, record: dict[str, Any]) -> None:
        if self.model is None:
            return
        if self._evals is None:
            self._evals = self._evals_factory() if self._evals_factory is not None else {}
        if not self._evals:
            return
        t = time.perf_counter()
        if self.cfg.link:
            record["hits_k"] = self.cfg.hits_k
            for split in ("val", "test"):
                figures = evaluate_link(self.model, self._evals[split], self.device, self.cfg.hits_k)
                record.update({f"{split}_{name}": num(value) for name, value in figures.items()})
        else:
            record["val_acc"] = num(evaluate(self.model, self._evals["val"], self.device))
            record["test_acc"] = num(evaluate(self.model, self._evals["test"], self.device))
        record["stage_s"]["eval"] = time.perf_counter() - t

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """What resuming needs besides the data: model, optimiser and its learning-rate scheduler, RNG (CPU,
        and CUDA when training there), the closed epochs' `records` and the open epoch (`partial`, None when
        empty).

        The tensors are the live ones (as `torch.nn.Module.state_dict`'s): copy them to keep a snapshot.
        """
        return {
            "model_identity": self._identity(),
            "records": list(self.records),
            "partial": self.tally.state() if self.tally.losses else None,
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if self.device.type == "cuda" else [],
            "model": self.model.state_dict() if self.model is not None else {},
            **(self.stepper.state_dict() if self.stepper is not None else {"optimizer": {}, "scheduler": {}}),
        }

    def _identity(self) -> dict[str, str] | None:
        """The model's name (its `Model`'s) and the hash of its code, as the checkpoint records them."""
        if self.model is None:
            return None
        spec = spec_of(self.model)
        ident = self.cfg.model_identity()
        return {**ident, "name": spec.name} if spec is not None else ident

    def load_state_dict(self, state: Mapping[str, Any], source: str | Path = "checkpoint") -> None:
        """Restore what `state_dict` saved; training then continues as if never stopped.

        Raises:
            InputError: (naming `source`) the state does not fit this model or is incomplete.
        """
        check_model_identity(state, self.cfg, source)
        try:
            if self.model is not None:
                self.model.load_state_dict(state["model"])
            if self.stepper is not None:
                self.stepper.load_state_dict(state)
            torch.set_rng_state(state["rng"])
            if self.device.type == "cuda" and state.get("cuda_rng"):
                torch.cuda.set_rng_state_all(state["cuda_rng"])
            records = [dict(r) for r in state["records"]]
            tally = EpochTally.from_state(self.stages, state.get("partial"))
        except (KeyError, RuntimeError, ValueError, TypeError) as e:
            raise InputError(source, f"corrupt checkpoint: cannot restore the training state ({e})") from e
        self.records, self.tally = records, tally
