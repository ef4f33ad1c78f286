"""The online pipelines (gnndrive, lsmgnn): no preparation, the in-memory pipeline's losses batch for batch,
a buffer report, partition batches, and their options' errors (through `diskflow run` too)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from diskflow.cli import main
from diskflow.flow.pipeline import Pipeline, available_pipelines, load_pipeline
from diskflow.flow.rundir import new_run_dir, read_report
from diskflow.operators.formats.store import Store
from diskflow.operators.train.rowcache import NODE_TABLE_BYTES, PLANNED_SLOT_BYTES, SLOT_TABLE_BYTES
from diskflow.operators.train.rowreader import DEFAULT_GAP_BYTES, MIN_STAGING_BYTES, bounce_bytes
from diskflow.pipelines import inmemory

from diskflow.errors import ConfigError

SETTINGS: dict[str, Any] = {"model": "sage", "hidden": 16, "fanouts": (5, 5), "batch_size": 256, "epochs": 2,
                            "lr": 0.01, "dropout": 0.2, "seed": 3, "threads": 1, "progress": False}
pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore:.*reading it through the page cache:RuntimeWarning")]


@pytest.fixture(scope="module")
def reference(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return inmemory.run(tiny_store, new_run_dir(tmp_path_factory.mktemp("runs"), "ref"), **SETTINGS)


@pytest.mark.parametrize("name", ["gnndrive", "lsmgnn"])
def test_online_pipelines_train_on_the_inmemory_batches_with_a_small_buffer(name: str, tiny_store: Path,
                                                                           tmp_path: Path, reference: dict) -> None:
    assert name in available_pipelines()
    pipeline = load_pipeline(name)
    assert pipeline.loader == "online" and pipeline.cpu_tier == {"gnndrive": "lru", "lsmgnn": "hybrid"}[name]
    st = Store(tiny_store)
    budget = st.num_nodes * NODE_TABLE_BYTES + 2 * (MIN_STAGING_BYTES + bounce_bytes(MIN_STAGING_BYTES)) + \
        3000 * (st.row_bytes + SLOT_TABLE_BYTES + PLANNED_SLOT_BYTES)
    report = pipeline.run(tiny_store, new_run_dir(tmp_path, name), cpu_memory=budget, extractors=2, **SETTINGS)
    assert [e["losses"] for e in report["epochs"]] == [e["losses"] for e in reference["epochs"]]
    assert report["final"]["test_acc"] == reference["final"]["test_acc"]
    online = report["online"]
    assert online["policy"] == pipeline.cpu_tier and online["cpu_memory"] == budget
    assert online["slots"] == 3000 and online["memory"]["total_bytes"] <= budget      # of 4111 rows
    assert online["window"] == (8 if name == "lsmgnn" else 0)
    assert online["read_unit"] in (512, 4096) and online["gap_bytes"] == DEFAULT_GAP_BYTES
    for e in report["epochs"]:
        o = e["online"]
        assert o["rows"] == o["hits"] + o["misses"] and o["misses"] > 0 and o["first_batch_s"] > 0
        assert set(e["stage_s"]) >= {"sample", "plan", "slots", "extract", "gather", "wait", "train"}
    assert read_report(report["run_dir"]) == json.loads(json.dumps(report))
    assert "prepare" not in report       # nothing was prepared


def test_online_partition_batches_match_the_inmemory_ones(tiny_store: Path, tmp_path: Path) -> None:
    opts = {**SETTINGS, "epochs": 1, "batches": "partition", "partitions": 8, "parts_per_group": 2}
    ref = inmemory.run(tiny_store, new_run_dir(tmp_path, "ref"), **opts)
    ours = load_pipeline("gnndrive").run(tiny_store, new_run_dir(tmp_path, "g"), partition=ref["partition"]["path"],
                                         **{k: v for k, v in opts.items() if k != "partitions"})
    assert ours["epochs"][0]["losses"] == ref["epochs"][0]["losses"]


def test_online_options_are_checked(tiny_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lsm = load_pipeline("lsmgnn")
    with pytest.raises(ConfigError, match="^window: the hybrid policy"):
        lsm.run(tiny_store, new_run_dir(tmp_path, "w"), window=0, **SETTINGS)
    with pytest.raises(ConfigError, match="^extractors"):
        lsm.run(tiny_store, new_run_dir(tmp_path, "e"), extractors=0, **SETTINGS)
    with pytest.raises(ConfigError, match="Pipeline.cpu_tier: the online loader's buffer evicts by one of lru, hybrid"):
        Pipeline("x", loader="online", cpu_tier="static")
    with pytest.raises(ConfigError, match="Pipeline.history_memory"):
        Pipeline("x", loader="online", history_memory="5%")
    runs = tmp_path / "runs"
    code = main(["run", "gnndrive", "--dataset", str(tiny_store), "--runs-dir", str(runs), "--history-memory", "5%"])
    assert code == 2 and "--history-memory: pipeline 'gnndrive' does not take this option" in capsys.readouterr().err
    code = main(["run", "gnndrive", "--dataset", str(tiny_store), "--runs-dir", str(runs), "--cpu-memory", "64KiB"])
    assert code == 2 and "--cpu-memory: 64.00 KiB does not hold the feature buffer's tables" in capsys.readouterr().err
    assert not runs.exists() or not any(runs.iterdir())      # no empty run directory left behind
    code = main(["run", "lsmgnn", "--dataset", str(tiny_store), "--runs-dir", str(runs), "--epochs", "1",
                 "--fanouts", "5,5", "--batch-size", "256", "--hidden", "16", "--no-progress", "--extractors", "2",
                 "--window", "3", "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "feature buffer (hybrid)" in out and "hit rate" in out
