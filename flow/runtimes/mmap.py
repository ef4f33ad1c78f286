"""The "PyG+" baseline (Ginex §2): features gathered from memory-mapped store shards, through the page cache.

Everything but the feature source is the in-memory pipeline's: the same batches (the same
seed order and sampling seeds, or with ``samples=PACKED`` a packed dataset's stored
samples), the same model and loop (`operators.train`), hence the same losses. Each shard's
feature rows are mapped once (`MappedFeatures`) and a batch is one numpy gather per shard,
so a row that is not in the page cache costs a page fault and a synchronous read. The
topology is memory-mapped too. Run inside a memory limit that counts the page cache
(``diskflow bench compare``), this is out-of-core training without a plan: its speed is the
page cache's hit rate and the disk's random-read latency.

By default the mappings are advised ``MADV_RANDOM`` (``advice="random"``): a fault then
reads the page it needs rather than the device's read-ahead window around it. With
``advice="normal"`` (a plain ``np.memmap``) every miss reads up to ``read_ahead_kb``
(8 MiB on some virtual disks), which under a memory limit evicts what the next fault
needs: on such a disk plain mmap gathers run about 100x slower, so the default is the
stronger baseline.

    diskflow run mmap --dataset STORE [--model sage|gcn|gat|mlp|none] ...
"""
from __future__ import annotations

import inspect
import mmap
import os
from typing import Any

import numpy as np
import torch

from ...errors import ConfigError, InputError
from ...operators.formats.store import Store
from .gathered import gathered_run
from .memory import run as memory_run

__all__ = ["ADVICE", "NAME", "MappedFeatures", "run"]

NAME = "mmap"
ADVICE = {"random": mmap.MADV_RANDOM, "normal": mmap.MADV_NORMAL}


class MappedFeatures:
    """A store's feature shards, each mapped once, gathered as `InMemoryLoader` gathers (`index_select`).

    Args:
        store: the store whose shards to map (read-only).
        advice: ``madvise`` for every mapping: "random" (fault in only the page needed) or
            "normal" (the kernel's read-around, as a plain ``np.memmap``).

    Raises:
        ConfigError: unknown `advice`.
        InputError: a shard file that cannot be opened or is shorter than the manifest says.
    """

    device = torch.device("cpu")

    def __init__(self, store: Store, advice: str = "random") -> None:
        if advice not in ADVICE:
            raise ConfigError("advice", f"expected one of {', '.join(ADVICE)}, got {advice!r}")
        self.store = store
        self.advice = advice
        self.shards = [self._map(p) for p in range(len(store.shards))]

    def __str__(self) -> str:
        return f"mmap ({self.advice})"

    def _map(self, p: int) -> np.ndarray:
        s, st = self.store.shards[p], self.store
        if s.rows == 0:
            return np.zeros((0, st.feature_dim), dtype=st.feature_dtype)
        nbytes = s.rows * st.row_bytes
        try:
            with open(s.path, "rb") as f:
                # the offset is 4096-aligned (store layout), as mmap requires
                m = mmap.mmap(f.fileno(), nbytes, access=mmap.ACCESS_READ, offset=s.offset)
        except (OSError, ValueError) as e:
            raise InputError(s.path, f"cannot map {nbytes:,} feature bytes at offset {s.offset} ({e})") from e
        m.madvise(ADVICE[self.advice])
        return np.frombuffer(m, dtype=st.feature_dtype).reshape(s.rows, st.feature_dim)

    def gather(self, node_ids: np.ndarray) -> np.ndarray:
        """features[node_ids], one vectorised gather per shard touched, through this object's maps."""
        return self.store.gather(node_ids, self.shards)

    def index_select(self, dim: int, index: torch.Tensor) -> torch.Tensor:
        if dim != 0:
            raise ValueError(f"features are gathered by rows (dim 0), not along dim {dim}")
        return torch.from_numpy(self.gather(index.numpy()))


def run(store: str | os.PathLike[str], run_dir: str | os.PathLike[str], *, advice: str = "random",
        **options: Any) -> dict[str, Any]:
    """Train `model` with features read through memory maps of the store; write report.json and curves.png.

    Args:
        store: an ingested store directory (its feature shards are mapped, never loaded).
        run_dir: an existing directory for this run's outputs.
        model: "sage", "gcn", "gat", "mlp", or "none" (the data path only, for timing).
        samples: a packed dataset whose stored round samples are the training batches (see
            `flow.runtimes.gathered.StoredSamplesLoader`); None samples each batch here.
        advice: "random" (default) or "normal", the ``madvise`` of the feature mappings.
        on_batch, on_start: hooks as `operators.trainer.train_packed`'s.
        Other options are the in-memory pipeline's (same seed: same batches, same losses).

    Returns:
        The in-memory pipeline's report (``config.features`` says "mmap (random)" or "mmap
        (normal)"); ``load_s`` covers only the labels and the mappings, and ``stage_s.gather``
        the time spent faulting rows in.
    """
    if advice not in ADVICE:
        raise ConfigError("advice", f"expected one of {', '.join(ADVICE)}, got {advice!r}")
    bound = _MEMORY_RUN.bind(store, run_dir, **options)     # the in-memory run's options, its defaults
    bound.apply_defaults()
    return gathered_run(NAME, features=lambda st: MappedFeatures(st, advice), **bound.arguments)


# `run`'s signature as callers see it (`Pipeline.parameters`): the in-memory run's, `advice` after `samples`
_MEMORY_RUN = inspect.signature(memory_run)
_ADVICE = inspect.Parameter("advice", inspect.Parameter.KEYWORD_ONLY, default="random", annotation="str")
run.__signature__ = _MEMORY_RUN.replace(parameters=[  # type: ignore[attr-defined]
    q for p in _MEMORY_RUN.parameters.values() for q in ((p, _ADVICE) if p.name == "samples" else (p,))])


