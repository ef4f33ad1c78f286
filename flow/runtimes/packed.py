"""What the packed pipelines (belady, diskgnn, ginex) share: prepare a packed dataset, then train on it.

`run_packed(pipeline, store, run_dir, **options)` is what `diskflow.Pipeline.run` does for
the packed loader: it prepares into ``run_dir/packed`` (or ``packed=``) with the pipeline's
policies, sizing the staging reserve from the trainer's own in-flight count, and trains with
the pipelined trainer (`operators.train.trainer`). `train_and_report` is the training half, also
behind ``diskflow train PACKED``: it shows progress bars and writes ``report.json`` and
``curves.png`` into the run directory.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...operators.formats.store import Store
from ...operators.options import CPU_SHARE, DEVICE, QUEUE_DEPTH
from ...operators.prepare.task import NODE, Task
from ...operators.prepare.typedsample import as_fanouts
from ...operators.train.config import TrainConfig
from ..options import byte_budget as budget
from ..options import history_options
from ..prepare.config import PrepareConfig
from ..progress import bar
from ..rundir import plot_curves, write_report

__all__ = ["budget", "packed_budgets", "run_packed", "train_and_report"]


def train_and_report(packed: str | os.PathLike[str], run_dir: str | os.PathLike[str], *, progress: bool = True,
                     on_epoch: Callable[[dict[str, Any]], None] | None = None,
                     on_batch: Callable[[int], Any] | None = None, on_start: Callable[[int, int], Any] | None = None,
                     extra: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    """`operators.trainer.train_packed` with a progress bar per epoch; writes report.json and curves.png.

    Args:
        packed: the packed dataset.
        run_dir: an existing run directory.
        progress: show a bar per epoch (on a terminal).
        on_epoch: called with each epoch's record.
        on_batch, on_start: called as the bars are (`train_packed`'s hooks): with the batches just
            trained, and with each epoch's index and batch count as it starts (e.g. to time them).
        extra: more report keys (e.g. the prepare step's figures).
        options: `train_packed`'s keyword arguments.
    """
    from ...operators.train.trainer import (
        train_packed,  # torch: imported only when training (not by `prepare`)
    )

    state: dict[str, Any] = {"bar": None}

    def close() -> None:
        if state["bar"] is not None:
            state["bar"].close()
            state["bar"] = None

    def start(epoch: int, batches: int) -> None:
        close()
        state["bar"] = bar(total=batches, desc=f"{Path(packed).name} epoch {epoch + 1}", unit="batch",
                           disable=None if progress else True)
        if on_start is not None:
            on_start(epoch, batches)

    def tick(n: int) -> None:
        if state["bar"] is not None:
            state["bar"].update(n)
        if on_batch is not None:
            on_batch(n)

    def epoch_done(record: dict[str, Any]) -> None:
        close()
        if on_epoch is not None:
            on_epoch(record)

    try:
        report = train_packed(packed, run_dir, on_epoch=epoch_done, on_batch=tick, on_start=start, **options)
    finally:
        close()
    report.update(extra or {})
    write_report(run_dir, report)
    plot_curves(run_dir, report)
    return report


def packed_budgets(store: Store, cpu_memory: int | str | None, gpu_memory: int | str | None,
                   disk_budget: int | str | None, fanouts: Sequence[int], batch_size: int,
                   queue_depth: int = QUEUE_DEPTH, sequential: bool = False, device: str = DEVICE,
                   task: Task = NODE, staging_piece: int | str | None = None) -> dict[str, Any]:
    """What `prepare` must be given so the trainer later fits `cpu_memory` with this queue depth.

    `cpu_memory` is the trainer's whole host budget for features (bytes, ``"2GiB"`` or
    ``"10%"`` of the feature bytes): CPU tier + staging buffers + the loader's I/O buffers.
    `prepare` sizes the staging from the largest sampled batch and reserves it and the I/O
    buffers out of the budget (naming the smallest budget that works when it cannot); the CPU
    tier gets the rest. Without `cpu_memory`: 10% of the features for the CPU tier plus the
    staging and I/O buffers for the worst-case batch of these fanouts (of `task`'s seeds: a link batch starts
    from its pairs' endpoints), in node rows and, where the store has them, in edge rows.

    Returns:
        ``cpu_memory`` (the trainer's whole budget, which prepare is given too),
        ``io_reserve`` (the I/O buffers prepare reserves), ``staging_batches`` (staging
        buffers), ``staging_piece`` (the cap on one buffer's row bytes: `staging_piece`, bytes or a size,
        else `tiers.STAGING_PIECE_BYTES`), ``gpu_memory`` and ``disk_budget`` in bytes.
    """
    from ...operators.prepare.tiers import STAGING_PIECE_BYTES, check_staging_piece, staging_piece_bytes
    from ...operators.train.memory import io_buffer_bytes
    from ...operators.trainbuffers import staging_count

    reserve = io_buffer_bytes()
    staging = staging_count(device, queue_depth, sequential)
    piece = STAGING_PIECE_BYTES if staging_piece is None else check_staging_piece(staging_piece)
    # the tables the batches read: node rows and, where the store has them, edge rows (each its own loader)
    tables = [store.features] + ([store.edge_features] if store.edge_features is not None else [])
    features = store.budget_bytes
    cpu = budget(cpu_memory, "cpu_memory", features)
    if cpu is None:     # the largest batch is known only after sampling: reserve its worst case
        rows, edges = task.max_seeds(batch_size), 0
        for f in fanouts:       # every node so far expanded at full fanout: a bound on the hop's edges
            grow = store.num_nodes if f < 0 else int(f)
            rows, edges = min(store.num_nodes, rows * (1 + grow)), min(store.num_edges, edges + rows * grow)
        cpu = sum(staging * staging_piece_bytes(min(edges if t is store.edge_features else rows, t.num_rows),
                                                t.row_bytes, len(t.shards), piece) + reserve
                  for t in tables) + int(features * CPU_SHARE)
    return {"cpu_memory": cpu, "io_reserve": reserve, "staging_batches": staging, "staging_piece": piece,
            "gpu_memory": budget(gpu_memory, "gpu_memory", features) or 0,
            "disk_budget": budget(disk_budget, "disk_budget", features)}


def run_packed(pipeline: Any, store: str | os.PathLike[str], run_dir: str | os.PathLike[str], *,
               packed: str | os.PathLike[str] | None = None, model: str = TrainConfig.model,
               hidden: int = TrainConfig.hidden, num_layers: int | None = TrainConfig.num_layers,
               fanouts: Sequence[int] = TrainConfig.fanouts, batch_size: int = TrainConfig.batch_size,
               epochs: int = TrainConfig.epochs, lr: float = TrainConfig.lr, weight_decay: float = TrainConfig.weight_decay,
               clip_grad: float | None = TrainConfig.clip_grad, dropout: float = TrainConfig.dropout,
               heads: int = TrainConfig.heads, seed: int = TrainConfig.seed, device: str = DEVICE,
               eval_every: int = TrainConfig.eval_every, threads: int | None = TrainConfig.threads,
               progress: bool = True, on_epoch: Callable[[dict[str, Any]], None] | None = None,
               on_batch: Callable[[int], Any] | None = None, on_start: Callable[[int, int], Any] | None = None,
               cpu_memory: int | str | None = None, gpu_memory: int | str = PrepareConfig.gpu_memory,
               disk_budget: int | str | None = PrepareConfig.disk_budget,
               superbatch_size: int = PrepareConfig.superbatch_size, queue_depth: int = QUEUE_DEPTH,
               sequential: bool = False, check_crc: bool = True, resume: bool = False,
               force: bool = False, readahead: int | None = None, batches: str | None = None,
               partitions: int | None = None, parts_per_group: int | None = None, group_by: str | None = None,
               history_select: str | None = None,
               history_memory: int | str | None = None, history_staleness: int | None = None,
               history_prune: str | None = None, history_ramp: float | None = None,
               history_cooldown: float | None = None, task: str = TrainConfig.task,
               neg_ratio: float = TrainConfig.neg_ratio, neg_sampling: str = TrainConfig.neg_sampling,
               hits_k: int = TrainConfig.hits_k, rows: str | None = None,
               staging_piece: int | str | None = None) -> dict[str, Any]:
    """Prepare `store` with `pipeline`'s policies into ``run_dir/packed`` (or `packed`) and train on it;
    write report.json.

    Budgets are bytes, ``"2GiB"`` or a share of the feature bytes (``"10%"``). `cpu_memory`
    is the trainer's whole host budget for features: CPU tier + staging of the batches in
    flight + I/O buffers; by default 10% of the features for the CPU tier plus the staging
    of the worst-case batch for these fanouts (whatever the real batches leave unused
    goes to the CPU tier).
    Other options, the hooks `on_epoch`, `on_batch` and `on_start` among them, are the in-memory pipeline's
    (same seed: same batches, same samples) and
    the trainer's (`queue_depth`, `sequential`, `check_crc`, `resume`); `readahead`, `batches`
    (``"shuffled"`` or ``"partition"``; default: the pipeline's) and `partitions` (parts of the
    partition; default eight per batch) are prepare's, and so are `history_memory` (bytes,
    or a share of the features, of a historical embedding cache of width `hidden` planned into the
    samples), `history_staleness`, `history_prune`, `history_ramp` and `history_cooldown` (None: the
    pipeline's rule; `operators.prepare.history`). `task`, `neg_ratio` and `neg_sampling` are the round's (a
    link task samples the store's training edges and their negatives), `hits_k` the evaluation's. `rows`: how
    the rows are held in the tiers and packed segments (None: the pipeline's, exact unless it says;
    `operators.formats.rowcodec.ENCODINGS`). `staging_piece`: the most row bytes one staging buffer carries
    (bytes or ``"8MiB"``; None: `tiers.STAGING_PIECE_BYTES`); a smaller cap leaves more of `cpu_memory` to
    the CPU tier.
    """
    st = Store(store)
    rdir = Path(run_dir)
    out = Path(packed) if packed is not None else rdir / "packed"
    # the training options, checked before preparing (the trainer builds its config from the packed round)
    TrainConfig(model=model, hidden=hidden, num_layers=num_layers, fanouts=as_fanouts(fanouts), batch_size=batch_size,
                epochs=epochs, lr=lr, weight_decay=weight_decay, clip_grad=clip_grad, dropout=dropout, heads=heads,
                seed=seed, eval_every=eval_every, threads=threads, task=task, neg_ratio=neg_ratio,
                neg_sampling=neg_sampling, hits_k=hits_k)
    if isinstance(queue_depth, bool) or not isinstance(queue_depth, int) or queue_depth < 1:
        raise ConfigError("queue_depth", f"expected an integer >= 1, got {queue_depth!r}")
    dev = "cuda" if str(device).startswith("cuda") else "cpu"
    budgets = packed_budgets(st, cpu_memory, gpu_memory, disk_budget, fanouts, batch_size, queue_depth, sequential,
                             device=dev, task=Task(task, neg_ratio, neg_sampling), staging_piece=staging_piece)
    cpu, gpu = budgets["cpu_memory"], budgets["gpu_memory"]
    options = {"fanouts": as_fanouts(fanouts), "batch_size": batch_size, "superbatch_size": superbatch_size,
               "epochs": epochs, "seed": seed, "device": dev, "gpu_memory": gpu,
               "staging_batches": budgets["staging_batches"], "io_reserve": budgets["io_reserve"],
               "staging_piece": budgets["staging_piece"],
               "disk_budget": budgets["disk_budget"], "task": task, "neg_ratio": neg_ratio,
               "neg_sampling": neg_sampling}
    given = {"readahead": readahead, "batches": batches, "partitions": partitions, "parts_per_group": parts_per_group,
             "group_by": group_by, "history_select": history_select, "rows": rows}
    options.update({k: v for k, v in given.items() if v is not None})     # the rest: the pipeline's or prepare's
    options.update(history_options(history_memory, hidden, st.feature_bytes, pipeline, staleness=history_staleness,
                                   prune=history_prune, ramp=history_ramp, cooldown=history_cooldown))
    result = pipeline.prepare(st.path, out, force=force, quiet=not progress, cpu_memory=budgets["cpu_memory"],
                              **options)
    report = train_and_report(
        out, rdir, progress=progress, on_epoch=on_epoch, on_batch=on_batch, on_start=on_start,
        extra={"pipeline": pipeline.name, "definition": pipeline.describe(), "prepare": {"path": str(out), "skipped": result.skipped,
                                             "seconds": result.seconds, "phases": result.phases,
                                             "figures": result.figures}},
        model=model, hidden=hidden, num_layers=num_layers, lr=lr, weight_decay=weight_decay, clip_grad=clip_grad,
        dropout=dropout, heads=heads, seed=seed,
        device=device, eval_every=eval_every, cpu_memory=cpu, gpu_memory=gpu if dev == "cuda" else None,
        queue_depth=queue_depth, sequential=sequential, check_crc=check_crc, resume=resume, store=st.path,
        threads=threads, hits_k=hits_k)
    return report
