"""Streaming: belady's data layout, prepared on CPU workers while a dedicated GPU worker trains (DiskGNN §3).

The round is never packed as a whole. Superbatch by superbatch, CPU workers sample, plan
(Belady, chained across the stream exactly as offline) and pack; the GPU worker stages each
superbatch on its local scratch disk and trains it while the next ones are prepared, at most
`window` superbatches ahead. Every epoch gets fresh samples without the GPU waiting for a
whole preprocessing pass, and the model equals belady's (prepare-then-train) with the same seed.

    diskflow run streaming --dataset STORE --epochs 3                      (embedded cluster)
    diskflow run streaming --dataset STORE --scheduler tcp://HOST:8786     (split machines)

The two-machine recipe, on the CPU box: ``diskflow scheduler`` and ``diskflow worker
tcp://HOST:8786`` (one or more); on the GPU box: ``diskflow worker tcp://HOST:8786 --gpu
--scratch /nvme/diskflow --quota 50GiB``; then ``diskflow run streaming ... --scheduler
tcp://HOST:8786`` from anywhere that can read the store.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...operators.formats.store import Store
from ...operators.options import QUEUE_DEPTH
from ...operators.prepare.history import EMBEDDING_DTYPE, history_rows
from ...operators.prepare.seeds import label_shares
from ...operators.prepare.task import Task
from ...operators.prepare.typedsample import as_fanouts
from ...operators.train.config import TrainConfig
from ..options import history_options, history_rule
from ..roles import stream_client, tls_security
from ..rundir import plot_curves, write_report
from ..stream import StreamConfig, StreamRun
from ..stream.driver import refuse_shared_edge_rows
from ..timeline import plot_timeline
from .packed import packed_budgets

__all__ = ["NAME", "run"]

NAME = "streaming"


def _local(store: str | os.PathLike[str]) -> str:
    """The store's path: a path or a ``file://`` URL (CPU workers memory-map it, so it must be a filesystem)."""
    text = os.fspath(store)
    if text.startswith("file://"):
        return text[len("file://"):]
    if "://" in text:
        raise ConfigError("store", f"{text!r}: CPU workers memory-map the store, so give a path (or a file:// URL) "
                                   "on a filesystem they share; stage takes any fsspec URL for the packed data")
    return text


def run(store: str | os.PathLike[str], run_dir: str | os.PathLike[str], *, scheduler: str | None = None,
        window: int = StreamConfig.window, workers: int | None = None, scratch: str | None = None,
        quota: int | str | None = None, hold_memory: int | str | None = None, stage: str | None = StreamConfig.stage,
        model: str = TrainConfig.model, hidden: int = TrainConfig.hidden, num_layers: int | None = TrainConfig.num_layers,
        fanouts: Sequence[int] = TrainConfig.fanouts, batch_size: int = TrainConfig.batch_size,
        epochs: int = TrainConfig.epochs, lr: float = TrainConfig.lr, weight_decay: float = TrainConfig.weight_decay,
        clip_grad: float | None = TrainConfig.clip_grad, dropout: float = TrainConfig.dropout,
        heads: int = TrainConfig.heads, seed: int = TrainConfig.seed, device: str | None = StreamConfig.device,
        eval_every: int = TrainConfig.eval_every, threads: int | None = TrainConfig.threads, progress: bool = True,
        on_epoch: Callable[[dict[str, Any]], None] | None = None,
        on_superbatch: Callable[[dict[str, Any]], None] | None = None,
        cpu_memory: int | str | None = None, gpu_memory: int | str = StreamConfig.gpu_memory,
        superbatch_size: int = StreamConfig.superbatch_size, tier_superbatches: int = StreamConfig.tier_superbatches,
        checkpoint_every: int = StreamConfig.checkpoint_every, queue_depth: int = QUEUE_DEPTH, check_crc: bool = True,
        resume: bool = False, processes: bool = True, gpu_wait: float = StreamConfig.gpu_wait_s,
        batches: str = StreamConfig.batches, partitions: int | None = StreamConfig.partitions,
        parts_per_group: int = StreamConfig.parts_per_group, group_by: str = StreamConfig.group_by,
        history_memory: int | str | None = None, history_staleness: int | None = None,
        history_select: str = StreamConfig.history_select, history_prune: str | None = None,
        history_ramp: float | None = None, history_cooldown: float | None = None, gpus: int = StreamConfig.gpus,
        cache: str = StreamConfig.cache, batches_per_step: int = TrainConfig.batches_per_step,
        tls_ca_file: str | None = None, tls_cert: str | None = None, tls_key: str | None = None,
        task: str = TrainConfig.task, neg_ratio: float = TrainConfig.neg_ratio,
        neg_sampling: str = TrainConfig.neg_sampling, hits_k: int = TrainConfig.hits_k,
        rows: str = StreamConfig.rows, staging_piece: int | str | None = None) -> dict[str, Any]:
    """Stream-train `store`: preprocessing on CPU workers, training on the GPU worker; write report.json.

    Args:
        store: the ingested store (CPU workers read it at this path; the GPU worker evaluates
            on it when it can read it too).
        run_dir: the run directory (checkpoints, report.json, curves.png, timeline.png).
        scheduler: ``tcp://HOST:PORT`` of a running Dask scheduler; None: an embedded LocalCluster
            of `workers` CPU workers and one GPU-resource worker (scratch `scratch`, default
            ``run_dir/scratch``).
        window: superbatches staged on the GPU worker (and prepared ahead of training) at most.
        workers: CPU workers of the embedded cluster (default: the cores but one).
        scratch, quota: the embedded GPU worker's scratch directory and its byte quota.
        hold_memory: the embedded GPU worker's memory for staged index and samples, which skip
            the scratch disk while they fit (default `flow.plugin.HOLD_MEMORY`; 0: all on disk).
        stage: an fsspec URL both sides can reach (a shared filesystem): bundles go through it
            instead of through Dask.
        device: where the GPU worker trains (default: its own setting, CUDA when it has it).
        superbatch_size: batches per superbatch (the unit that is packed, shipped, trained).
            Every superbatch costs the GPU worker a fixed share (its tasks, transfer and
            verification, a loader that drains and refills), which larger ones amortize (Ginex
            §3.5: larger is better up to the disk they take); the first one is prepared before
            anything trains, so smaller ones start sooner.
        tier_superbatches: superbatches whose access counts decide the GPU tier and the planner's
            tie-break (the first two are needed by the first plan anyway).
        checkpoint_every: superbatches between checkpoints (and at every epoch's end).
        resume: continue from the latest checkpoint in `run_dir`.
        processes: embedded cluster workers as processes (False: threads of this process).
        gpu_wait: seconds to wait for a GPU-resource worker to join.
        batches, partitions, parts_per_group, group_by: how seeds become batches, as `diskflow
            prepare`'s (partition batches: one partition task on a CPU worker writes
            ``run_dir/partition.npy``, which the CPU workers read, and the losses weigh each
            batch's labels as the training split's, `TrainConfig.label_prior`).
        history_memory, history_staleness, history_select, history_prune, history_ramp, history_cooldown: a
            historical embedding cache of `hidden`-wide embeddings, planned into the samples as `diskflow
            prepare` plans it (a size: bytes or a share of the features; the memory split of ``"auto"``
            plans whole rounds, so the stream takes a size).
        gpus: GPU workers training data-parallel (the embedded cluster starts this many; 0: every worker
            with the ``GPU`` resource when the run starts, one on the embedded cluster): of each
            superbatch, worker r trains the batches at positions r, r + gpus, ..., one per optimizer
            step, the gradients averaged with ``torch.distributed`` (gloo on the CPU, NCCL on CUDA), so
            the model equals a one-worker run with ``batches_per_step=gpus`` (`flow.stream.lanes`).
        cache: the GPU workers' CPU tiers: ``"per-worker"`` (each its own, `cpu_memory` each, planned by
            Belady over its own share's accesses) or ``"shared"`` (GPU workers on one machine: one tier in
            shared memory of their pooled `cpu_memory`, planned by Belady over the merged stream, which
            the workers follow by taking turns at it, `operators.train.shared_tier`).
        batches_per_step: consecutive batches of a superbatch whose mean gradient makes one step.
        rows: how the node rows are held in the tiers and bundles: ``"exact"``, or an encoding
            (`operators.formats.rowcodec.ENCODINGS`), decoded as each batch is assembled on the GPU worker.
        staging_piece: the most row bytes one of the GPU worker's staging buffers carries (bytes or ``"8MiB"``;
            None: `tiers.STAGING_PIECE_BYTES`).
        tls_ca_file, tls_cert, tls_key: a ``tls://`` scheduler's security (Dask's
            ``distributed.comm.tls`` config is used when not given).
        Other options are belady's (budgets as bytes, ``"2GiB"`` or ``"10%"`` of the features).
    """
    from ...operators.stream.train import StreamTrainConfig

    st = Store(_local(store))
    if history_memory == "auto":
        raise ConfigError("history_memory", "the memory split plans the whole round once per candidate; the "
                                            "stream loader takes a size (e.g. 5%)")
    rule = history_rule(None, history_staleness=history_staleness, history_prune=history_prune,
                        history_ramp=history_ramp, history_cooldown=history_cooldown)   # None: the library's
    hist = history_options(history_memory, hidden, st.feature_bytes, staleness=history_staleness,
                           prune=history_prune, ramp=history_ramp, cooldown=history_cooldown)
    memory = hist["history_memory"]
    embeddings = history_rows(memory, hidden) if isinstance(memory, int) and memory else 0
    if hist["history_memory"] and embeddings == 0:
        raise ConfigError("history_memory", f"{hist['history_memory']:,} bytes hold no embedding of {hidden} "
                                            f"{EMBEDDING_DTYPE} values")
    rdir = Path(run_dir)
    rdir.mkdir(parents=True, exist_ok=True)
    if isinstance(queue_depth, bool) or not isinstance(queue_depth, int) or queue_depth < 1:
        raise ConfigError("queue_depth", f"expected an integer >= 1, got {queue_depth!r}")
    budgets = packed_budgets(st, cpu_memory, gpu_memory, None, fanouts, batch_size, queue_depth,
                             device=device or "cpu", task=Task(task, neg_ratio, neg_sampling),
                             staging_piece=staging_piece)
    gpu = budgets["gpu_memory"]
    on_gpu = device is not None and str(device).startswith("cuda")
    train = StreamTrainConfig(model=model, hidden=hidden, num_layers=num_layers, lr=lr, weight_decay=weight_decay,
                              clip_grad=clip_grad, dropout=dropout, heads=heads,
                              seed=seed, eval_every=eval_every, epochs=epochs, fanouts=as_fanouts(fanouts),
                              batch_size=batch_size, cpu_memory=budgets["cpu_memory"],
                              gpu_memory=gpu if on_gpu else None, queue_depth=queue_depth, check_crc=check_crc,
                              threads=threads, store=str(st.path.resolve()),
                              label_prior=label_shares(st.labels[st.split_ids("train")], st.num_classes)
                              if batches == "partition" else None, history_rows=min(embeddings, st.num_nodes),
                              batches_per_step=batches_per_step, task=task, neg_ratio=neg_ratio,
                              neg_sampling=neg_sampling, hits_k=hits_k)
    cfg = StreamConfig(train=train, fanouts=as_fanouts(fanouts), batch_size=batch_size, superbatch_size=superbatch_size,
                       epochs=epochs, seed=seed, sampler_threads=threads or 1, gpu_memory=gpu,
                       cpu_memory=budgets["cpu_memory"], staging_batches=budgets["staging_batches"],
                       io_reserve=budgets["io_reserve"], staging_piece=budgets["staging_piece"],
                       tier_superbatches=tier_superbatches, window=window, stage=stage,
                       checkpoint_every=checkpoint_every, device=device, gpu_wait_s=gpu_wait, batches=batches,
                       partitions=partitions, parts_per_group=parts_per_group, group_by=group_by,
                       history_rows=embeddings, history_select=history_select, **rule, gpus=gpus, cache=cache,
                       task=task, neg_ratio=neg_ratio, neg_sampling=neg_sampling, rows=rows)
    cfg.validate()
    if gpus == 0 and not scheduler:
        gpus = 1                # --gpus all on the embedded cluster: the one GPU worker it starts
    if gpus > 1 and batches_per_step > 1:
        raise ConfigError("batches_per_step", "with gpus=N each GPU worker takes one batch per step; the step "
                                              "already holds N batches")
    scratch_dir = scratch if scratch is not None or scheduler else str(rdir / "scratch")
    if gpus > 1 and not scheduler and not processes:
        raise ConfigError("gpus", "data-parallel GPU workers each need a process of their own (processes=True)")
    if cache == "shared" and gpus > 1:
        refuse_shared_edge_rows(st)         # before any cluster starts (a remote one with gpus=0: at the run)
    security = tls_security(tls_ca_file, tls_cert, tls_key, scheduler)
    with stream_client(scheduler, cpu_workers=workers, scratch=scratch_dir, quota=quota, device=device,
                       processes=processes, hold_memory=hold_memory, gpu_workers=gpus,
                       security=security) as client:
        report = StreamRun(client, st.path, rdir, cfg, resume=resume, progress=progress, on_epoch=on_epoch,
                           on_superbatch=on_superbatch).run()
    write_report(rdir, report)
    plot_curves(rdir, report)
    plot_timeline(rdir, report)
    return report


