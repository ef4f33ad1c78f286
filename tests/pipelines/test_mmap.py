"""The mmap ("PyG+") baseline and the stored-samples switch of the gathered pipelines: same losses as
inmemory (online or on a packed dataset's samples), features never loaded, data-only runs, hooks, errors."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
import torch
from diskflow.flow.pipeline import available_pipelines, load_pipeline
from diskflow.flow.rundir import new_run_dir, read_report
from diskflow.flow.runtimes.gathered import StoredSamplesLoader
from diskflow.flow.runtimes.mmap import MappedFeatures
from diskflow.operators.formats.store import Store
from diskflow.operators.train.session import TrainConfig
from diskflow.pipelines import belady, inmemory, mmap

from diskflow.errors import ConfigError, InputError

SETTINGS: dict[str, Any] = {"model": "sage", "hidden": 16, "fanouts": (5, 5), "batch_size": 256, "epochs": 2,
                            "lr": 0.01, "dropout": 0.2, "seed": 3, "threads": 1, "progress": False}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def packed(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A belady packed dataset of the same round (its samples are what `samples=` reads)."""
    out = tmp_path_factory.mktemp("packed") / "belady"
    with dask.config.set(scheduler="sync"):
        belady.prepare(tiny_store, out, fanouts=SETTINGS["fanouts"], batch_size=SETTINGS["batch_size"],
                       superbatch_size=3, epochs=2, seed=SETTINGS["seed"], cpu_memory=1 << 30, quiet=True)
    return out


@pytest.fixture(scope="module")
def reference(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return inmemory.run(tiny_store, new_run_dir(tmp_path_factory.mktemp("runs"), "ref"), **SETTINGS)


def test_mmap_never_loads_the_features_and_matches_inmemory(tiny_store: Path, tmp_path: Path, reference: dict,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: Store) -> np.ndarray:
        raise AssertionError("the mmap pipeline loaded every feature into RAM")

    monkeypatch.setattr(Store, "read_features", refuse)
    report = mmap.run(tiny_store, new_run_dir(tmp_path, "mmap"), **SETTINGS)
    assert report["pipeline"] == "mmap" and report["config"]["features"] == "mmap (random)"
    assert read_report(report["run_dir"]) == json.loads(json.dumps(report))
    assert [e["losses"] for e in report["epochs"]] == [e["losses"] for e in reference["epochs"]]
    assert report["final"]["test_acc"] == reference["final"]["test_acc"]
    assert all(e["stage_s"]["gather"] > 0 for e in report["epochs"])
    with pytest.raises(AssertionError, match="loaded every feature"):   # and inmemory does load them
        inmemory.run(tiny_store, new_run_dir(tmp_path, "inmemory"), **SETTINGS)


def test_plain_mmap_advice_gives_the_same_losses(tiny_store: Path, tmp_path: Path, reference: dict) -> None:
    report = mmap.run(tiny_store, new_run_dir(tmp_path, "normal"), advice="normal",
                      **dict(SETTINGS, epochs=1))
    assert report["config"]["features"] == "mmap (normal)"
    assert report["epochs"][0]["losses"] == reference["epochs"][0]["losses"]
    with pytest.raises(ConfigError, match="^advice: expected one of random, normal, got 'willneed'"):
        mmap.run(tiny_store, tmp_path, advice="willneed")


@pytest.mark.parametrize("pipeline", [inmemory, mmap], ids=["inmemory", "mmap"])
def test_stored_samples_give_the_online_losses(pipeline: Any, tiny_store: Path, packed: Path, tmp_path: Path,
                                               reference: dict) -> None:
    report = pipeline.run(tiny_store, new_run_dir(tmp_path, "stored"), samples=packed, **SETTINGS)
    assert report["config"]["samples"] == str(packed)
    assert [e["losses"] for e in report["epochs"]] == [e["losses"] for e in reference["epochs"]]
    assert report["final"]["test_acc"] == reference["final"]["test_acc"]


def test_stored_samples_loader_gathers_features_of_n_id(tiny_store: Path, packed: Path) -> None:
    st = Store(tiny_store)
    full = st.read_features()
    labels = torch.from_numpy(np.asarray(st.labels, dtype=np.int64))
    cfg = TrainConfig(fanouts=SETTINGS["fanouts"], batch_size=SETTINGS["batch_size"], seed=SETTINGS["seed"],
                      epochs=2)
    loader = StoredSamplesLoader(MappedFeatures(st), labels, packed, st, cfg)
    train = st.split_ids("train")
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        batches = list(loader)
        assert len(batches) == len(loader) == -(-train.shape[0] // SETTINGS["batch_size"])
        seeds = np.concatenate([b.n_id[:b.batch_size].numpy() for b in batches])
        assert np.array_equal(np.sort(seeds), train)                  # every training seed once per epoch
        for b in batches:
            assert torch.equal(b.x, torch.from_numpy(full[b.n_id.numpy()]))
            assert torch.equal(b.y, labels[b.n_id])
    assert loader.stage_s["sample"] > 0 and loader.stage_s["gather"] > 0


def test_mapped_features_gather_rows_only(tiny_store: Path) -> None:
    """`index_select` along dim 0 is the store's gather; any other dim is refused (also under ``python -O``)."""
    st = Store(tiny_store)
    feats = MappedFeatures(st)
    ids = torch.tensor([5, 0, 5], dtype=torch.int64)
    assert feats.index_select(0, ids).numpy().tobytes() == st.gather(ids.numpy()).tobytes()
    with pytest.raises(ValueError, match="along dim 1"):
        feats.index_select(1, ids)


@pytest.mark.parametrize("pipeline", [inmemory, mmap], ids=["inmemory", "mmap"])
def test_data_only_run_builds_every_batch_and_calls_the_hooks(pipeline: Any, tiny_store: Path, packed: Path,
                                                              tmp_path: Path) -> None:
    started: list[tuple[int, int]] = []
    ticks: list[int] = []
    report = pipeline.run(tiny_store, new_run_dir(tmp_path, "none"), samples=packed,
                          on_start=lambda e, n: started.append((e, n)), on_batch=ticks.append,
                          **dict(SETTINGS, model="none"))
    batches = -(-Store(tiny_store).split_ids("train").shape[0] // SETTINGS["batch_size"])
    assert started == [(0, batches), (1, batches)] and ticks == [1] * (2 * batches)
    assert report["config"]["model"] == "none"
    for e in report["epochs"]:
        assert e["losses"] == [] and e["loss"] is None and e["val_acc"] is None and e["test_acc"] is None
        assert e["epoch_s"] > 0 and e["stage_s"]["train"] == 0 and e["stage_s"]["gather"] > 0


def test_a_hook_can_stop_a_run_early(tiny_store: Path, packed: Path, tmp_path: Path) -> None:
    class Enough(Exception):
        pass

    def stop(n: int) -> None:
        raise Enough

    with pytest.raises(Enough):
        mmap.run(tiny_store, tmp_path, samples=packed, on_batch=stop, **SETTINGS)
    assert not (tmp_path / "report.json").exists()


def test_samples_that_do_not_match_the_run_are_refused(tiny_store: Path, packed: Path, tmp_path: Path,
                                                       tiny_raw: Path) -> None:
    with pytest.raises(ConfigError, match=r"^samples: .* fanouts \[5, 5\].*this run has fanouts \[4, 4\]"):
        mmap.run(tiny_store, tmp_path, samples=packed, **dict(SETTINGS, fanouts=(4, 4)))
    with pytest.raises(ConfigError, match="^samples: .*seed 3.*seed 4"):
        inmemory.run(tiny_store, tmp_path, samples=packed, **dict(SETTINGS, seed=4))
    with pytest.raises(ConfigError, match="^epochs: 3 epochs asked for, the samples .* hold 2"):
        mmap.run(tiny_store, tmp_path, samples=packed, **dict(SETTINGS, epochs=3))
    with pytest.raises(InputError, match="not a finished packed dataset"):
        mmap.run(tiny_store, tmp_path, samples=tmp_path, **SETTINGS)
    other = tmp_path / "other-store"
    from diskflow.flow.ingest import run_ingest
    with dask.config.set(scheduler="sync"):
        run_ingest(tiny_raw, other, shard_rows=777)
    with pytest.raises(InputError, match="prepared from another store"):
        mmap.run(other, tmp_path, samples=packed, **SETTINGS)
    assert not (tmp_path / "report.json").exists()


def test_mmap_is_a_pipeline_diskflow_run_finds() -> None:
    assert "mmap" in available_pipelines()
    assert load_pipeline("mmap") is mmap.PIPELINE and load_pipeline("pipelines/mmap.py") is mmap.PIPELINE
