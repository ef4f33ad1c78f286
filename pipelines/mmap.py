"""The "PyG+" baseline (Ginex §2): features gathered from memory-mapped store shards, through the page cache.

Everything but the feature source is the in-memory pipeline's: the same batches (the same
seed order and sampling seeds, or with ``samples=PACKED`` a packed dataset's stored
samples), the same model and loop (`operators.train`), hence the same losses. Each batch's
rows are `Store.gather(n_id)`: numpy fancy indexing into an `np.memmap` of every feature
shard, so a row that is not in the page cache costs a page fault and a synchronous read
of at least one page (plus the kernel's read-around). The topology is memory-mapped too.
Run inside a memory limit that counts the page cache (``diskflow bench compare``), this is
what out-of-core training looks like without a plan: its speed is the page cache's hit
rate and the disk's random-read rate.

    diskflow run mmap --dataset STORE [--model sage|gcn|gat|mlp|none] ...
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from .inmemory import EpochHook, gathered_run

NAME = "mmap"


def run(store: str | os.PathLike[str], run_dir: str | os.PathLike[str], *, model: str = "sage",
        hidden: int = 128, num_layers: int | None = None, fanouts: Sequence[int] = (10, 10, 10),
        batch_size: int = 1024, epochs: int = 3, lr: float = 3e-3, dropout: float = 0.2, heads: int = 4,
        seed: int = 0, device: str = "cpu", eval_every: int = 1, threads: int | None = None,
        samples: str | os.PathLike[str] | None = None, progress: bool = True,
        on_epoch: EpochHook | None = None, on_batch: Callable[[int], Any] | None = None,
        on_start: Callable[[int, int], Any] | None = None) -> dict[str, Any]:
    """Train `model` with features read through memory maps of the store; write report.json and curves.png.

    Args:
        store: an ingested store directory (its feature shards are memory-mapped, never loaded).
        run_dir: an existing directory for this run's outputs.
        model: "sage", "gcn", "gat", "mlp", or "none" (the data path only, for timing).
        samples: a packed dataset whose stored round samples are the training batches (see
            `pipelines.inmemory.StoredSamplesLoader`); None samples each batch here.
        on_batch, on_start: hooks as `operators.trainer.train_packed`'s.
        Other options are the in-memory pipeline's (same seed: same batches, same losses).

    Returns:
        The in-memory pipeline's report; ``load_s`` covers only labels (no features are loaded)
        and ``stage_s.gather`` is the time spent faulting rows in through the page cache.
    """
    options = dict(locals())    # exactly the arguments above
    return gathered_run(NAME, in_ram=False, **options)
