"""Partition batches weigh each batch's loss by the training split's label shares (`TrainConfig.label_prior`):
a batch whose labels are in the split's proportions gets the plain mean cross-entropy; a skewed one counts
each label as the split does. The in-memory and packed pipelines take the same prior, so their partition
batches still give the same losses."""
from __future__ import annotations

from pathlib import Path

import dask
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from diskflow.flow.prepare import PrepareConfig, prepare
from diskflow.flow.rundir import new_run_dir
from diskflow.operators.formats.store import Store
from diskflow.operators.prepare.seeds import label_shares
from diskflow.operators.train.config import TrainConfig
from diskflow.operators.train.loop import prior_weighted_loss

from diskflow.errors import ConfigError


def test_a_batch_in_the_splits_proportions_gets_the_plain_mean() -> None:
    torch.manual_seed(0)
    logits = torch.randn(12, 3)
    target = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2])
    prior = torch.tensor([0.5, 1 / 3, 1 / 6], dtype=torch.float64)
    torch.testing.assert_close(prior_weighted_loss(logits, target, prior), F.cross_entropy(logits, target))


def test_a_skewed_batch_counts_each_label_as_the_split_does() -> None:
    torch.manual_seed(1)
    logits = torch.randn(10, 4, requires_grad=True)
    target = torch.tensor([0, 0, 0, 0, 0, 0, 0, 1, 3, 3])           # label 2 absent, label 0 over-represented
    prior = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=torch.float64)
    per = F.cross_entropy(logits, target, reduction="none")
    want = (per[target == 0].mean() + per[target == 1].mean() + per[target == 3].mean()) / 3
    got = prior_weighted_loss(logits, target, prior)
    torch.testing.assert_close(got, want)
    got.backward()                                                   # differentiable like the plain loss
    assert logits.grad is not None and torch.isfinite(logits.grad).all()


def test_label_shares_and_bad_priors() -> None:
    assert label_shares(np.array([0, 0, 1, 3]), 4) == (0.5, 0.25, 0.0, 0.25)
    assert TrainConfig(label_prior=[1, 3]).label_prior == (1.0, 3.0)
    for bad in ([], [-1.0, 2.0], [0.0, 0.0], [float("nan")]):
        with pytest.raises(ConfigError, match="label_prior"):
            TrainConfig(label_prior=bad)
    with pytest.raises(ConfigError, match="^batches"):
        label_shares(np.zeros(0, dtype=np.int64), 3)
    with pytest.raises(ConfigError, match="from -1 to 1"):
        label_shares(np.array([-1, 0, 1]), 2)                 # an unlabeled training node


@pytest.mark.usefixtures("sync_dask")
def test_partition_batches_carry_the_prior_and_shuffled_ones_do_not(tiny_store: Path, tmp_path: Path,
                                                                     one_torch_thread) -> None:
    from diskflow.operators.train.trainer import train_packed
    from diskflow.pipelines import inmemory

    store = Store(tiny_store)
    prior = list(label_shares(store.labels[store.split_ids("train")], store.num_classes))
    base = {"fanouts": (4, 4), "batch_size": 150, "superbatch_size": 3, "epochs": 1, "seed": 2}
    with dask.config.set(scheduler="sync"):
        part = prepare(tiny_store, tmp_path / "part", PrepareConfig(**base, cpu_memory=4 << 20, batches="partition",
                                                                    partitions=10, parts_per_group=2), quiet=True)
        plain = prepare(tiny_store, tmp_path / "plain", PrepareConfig(**base, cpu_memory=4 << 20), quiet=True)
    assert part.figures["label_prior"] == pytest.approx(prior) and "label_prior" not in plain.figures
    model = {"model": "sage", "hidden": 8, "seed": 2, "eval_every": 1}
    packed = train_packed(part.path, new_run_dir(tmp_path, "packed"), threads=1, **model)
    assert packed["config"]["label_prior"] == pytest.approx(prior)
    common = {"fanouts": base["fanouts"], "batch_size": base["batch_size"], "epochs": 1, "progress": False,
              "threads": 1, **model}
    mem = inmemory.run(tiny_store, new_run_dir(tmp_path, "mem"), batches="partition",
                       partition=part.path / "partition.npy", parts_per_group=2, **common)
    assert mem["config"]["label_prior"] == pytest.approx(prior)
    assert [e["losses"] for e in mem["epochs"]] == [e["losses"] for e in packed["epochs"]]
    stored = inmemory.run(tiny_store, new_run_dir(tmp_path, "stored"), samples=part.path, **common)
    assert [e["losses"] for e in stored["epochs"]] == [e["losses"] for e in packed["epochs"]]
    shuffled = train_packed(plain.path, new_run_dir(tmp_path, "shuffled"), threads=1, **model)
    assert shuffled["config"].get("label_prior") is None
