"""The in-memory pipeline: every feature in RAM, sample and gather per batch, train.

This is the accuracy reference and the speed ceiling for the out-of-core pipelines: they
train with the same session (`operators.train.session.TrainSession`) on the same batches
(`operators.train.batches`: same seed order, same sampling seeds), and differ only in the
loader, that is where a batch's rows come from.

With ``samples=PACKED`` the training batches are instead the stored samples of a packed
dataset's round (`gathered.StoredSamplesLoader`), the very samples the packed pipelines train on,
so a benchmark compares every pipeline on one set of samples with sampling out of the
data path. ``model="none"`` runs the data path only (batches built, nothing trained), as
the packed trainer does. The run itself is `gathered.gathered_run`, which ``flow.runtimes.mmap``
and ``flow.runtimes.online`` run too with their own feature sources.

    diskflow run inmemory --dataset STORE [--model sage|gcn|gat|mlp] ...
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from ...operators.options import DEVICE
from ...operators.prepare.round import RoundOptions
from ...operators.train.session import TrainConfig
from .gathered import EpochHook, gathered_run

__all__ = ["NAME", "run"]

NAME = "inmemory"


def run(store: str | os.PathLike[str], run_dir: str | os.PathLike[str], *, model: str = TrainConfig.model,
        hidden: int = TrainConfig.hidden, num_layers: int | None = TrainConfig.num_layers,
        fanouts: Sequence[int] = TrainConfig.fanouts, batch_size: int = TrainConfig.batch_size,
        epochs: int = TrainConfig.epochs, lr: float = TrainConfig.lr,
        weight_decay: float = TrainConfig.weight_decay, clip_grad: float | None = TrainConfig.clip_grad,
        dropout: float = TrainConfig.dropout, heads: int = TrainConfig.heads, seed: int = TrainConfig.seed,
        device: str = DEVICE,
        eval_every: int = TrainConfig.eval_every, threads: int | None = TrainConfig.threads,
        samples: str | os.PathLike[str] | None = None, progress: bool = True,
        on_epoch: EpochHook | None = None, on_batch: Callable[[int], Any] | None = None,
        on_start: Callable[[int, int], Any] | None = None, batches: str = RoundOptions.batches,
        partition: str | os.PathLike[str] | None = None, partitions: int | None = None,
        parts_per_group: int = RoundOptions.parts_per_group, group_by: str = RoundOptions.group_by,
        history_memory: int | str | None = None,
        history_staleness: int | None = None, history_select: str = RoundOptions.history_select,
        history_prune: str | None = None, history_ramp: float | None = None,
        history_cooldown: float | None = None, task: str = TrainConfig.task,
        neg_ratio: float = TrainConfig.neg_ratio, neg_sampling: str = TrainConfig.neg_sampling,
        hits_k: int = TrainConfig.hits_k) -> dict[str, Any]:
    """Train `model` on a store held in RAM; write `report.json` and `curves.png` into `run_dir`.

    Args:
        store: an ingested store directory.
        run_dir: an existing directory for this run's outputs (see `flow.rundir.new_run_dir`).
        model: "sage", "gcn", "gat", "mlp" (the same features, no graph), or "none" (the data
            path only: batches are built and dropped, for timing).
        hidden, num_layers, dropout, heads: model shape (`num_layers` defaults to `len(fanouts)`).
        fanouts: neighbours sampled per hop (-1: all).
        batch_size, epochs, lr, seed: training; with the same seed two runs give the same losses.
        weight_decay, clip_grad: the optimizer's weight decay and the gradients' clipping norm
            (`TrainConfig`); a `diskflow.Model` may bring its own optimizer and scheduler.
        device: "cpu" or a CUDA device; features stay in host RAM, batches are copied over.
        eval_every: evaluate val/test every this many epochs (and always after the last one).
        threads: torch and sampler threads (default: torch's own setting).
        samples: a packed dataset whose stored round samples are the training batches (its
            fanouts, batch size and seed must be these; it must hold `epochs` epochs), instead
            of sampling each batch here. Evaluation samples online either way.
        progress: show a progress bar per epoch (on a terminal).
        on_epoch: called with each epoch's record (a dict: ``epoch``, ``loss``, ``losses``, ``train_acc``,
            ``val_acc``, ``test_acc``, ``lr``, ``epoch_s``, ``stage_s``) as soon as it is complete.
        on_batch: called with 1 after each trained batch (as `operators.trainer.train_packed`).
        on_start: called with (epoch index, batches in it) before each epoch.
        batches: ``"shuffled"`` or ``"partition"`` (`operators.prepare.seeds.BatchOrder`).
        partition: for partition batches, the parts file to cut them by (a packed dataset's
            ``partition.npy``: the same batches as its round); None partitions the graph here
            (KaMinPar, one thread) into `partitions` parts (default eight per batch, `default_parts`),
            saved as ``run_dir/partition.npy``.
        parts_per_group: partition batches: parts whose training nodes are shuffled together.
        group_by: partition batches: how parts meet in a group, ``"label"`` (parts of different
            majority labels together) or ``"random"`` (OUTRE's); `operators.prepare.seeds.BatchOrder`.
        history_memory: bytes (``"64MiB"``, or a share of the feature bytes such as ``"5%"``) of a
            historical embedding cache (OUTRE §4.3; `operators.prepare.history`): the most connected
            nodes' inputs to the last layer, reused for `history_staleness` - 1 batches after they
            are computed, their subtrees not sampled or gathered meanwhile (None or 0: no cache).
        history_staleness: batches a cached embedding stays usable, counting the one that computed
            it (1: never reused, training as without the cache).
        history_select: the cached nodes: ``"accesses"`` (the round's most frequent one-hop nodes,
            counted by drawing every batch's one-hop nodes first, as `diskflow prepare` does: the
            same plan as a packed round's) or ``"degree"`` (the highest in-degree: nothing drawn
            ahead).
        history_prune: what a fresh cached embedding prunes below its node, ``"thin"`` (the last hop,
            but one neighbour per node there), ``"last-hop"`` (the lower layers stay exact) or
            ``"subtree"`` (OUTRE's rule; `operators.prepare.history`).
        history_ramp: the adaptive staleness bound's slope r: an embedding computed at batch t
            stands in for at most max(1, r * t) batches (0: the fixed bound).
        history_cooldown: the share of the round's last batches that prune nothing (0: none).
        task: ``"node"`` (classify the training nodes) or ``"link"`` (score the store's training edges
            against negative pairs; evaluation reports ROC-AUC, MRR and Hits@`hits_k` of each split's edges
            ranked against their fixed negatives). The store needs an edge split (`diskflow ingest --link-split`).
        neg_ratio, neg_sampling: a link batch's negative pairs per positive, and how their ends are drawn
            (``"uniform"`` or ``"degree"``).

    Returns:
        The report (also written to `run_dir/report.json`): `config`, `dataset`, `epochs`
        (per epoch: loss, per-batch losses, accuracies, `epoch_s` and `stage_s`), `final`
        (last and best-validation accuracies, training seconds), `stage_s` (summed over
        epochs), `load_s`, `peak_rss_bytes` (of this process, lifetime), `wall_s`.
    """
    options = dict(locals())    # exactly the arguments above
    return gathered_run(NAME, features=None, **options)
