"""The in-memory reference pipeline end to end: accuracy (GraphSAGE vs MLP), determinism, report, CLI."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from diskflow.cli import main
from diskflow.flow.pipeline import available_pipelines, load_pipeline
from diskflow.flow.rundir import new_run_dir, read_report
from diskflow.pipelines import inmemory

from diskflow.errors import ConfigError, InputError

# Small and quick, but the same settings for both models, so the gap is the graph's doing.
pytestmark = pytest.mark.plots      # the curves are drawn
SETTINGS = {"hidden": 32, "fanouts": (5, 5), "batch_size": 256, "epochs": 3, "lr": 0.01, "dropout": 0.2,
            "seed": 0, "threads": 1, "progress": False}
MARGIN = 0.20  # absolute test-accuracy gain of GraphSAGE over the MLP (measured: about 0.32; edges flipped: 0.12)


@pytest.fixture(scope="module")
def reports(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    root = tmp_path_factory.mktemp("runs")
    return {m: inmemory.run(tiny_store, new_run_dir(root, m), model=m, **SETTINGS) for m in ("sage", "mlp")}


def test_sage_beats_mlp_on_the_same_features(reports: dict[str, dict]) -> None:
    sage, mlp = reports["sage"]["final"], reports["mlp"]["final"]
    chance = 1 / reports["sage"]["dataset"]["num_classes"]
    assert sage["test_acc"] > chance + 0.5  # measured: about 0.81, chance 0.2
    assert sage["test_acc"] - mlp["test_acc"] >= MARGIN, (sage, mlp)
    assert sage["best_val_acc"] - mlp["best_val_acc"] >= MARGIN, (sage, mlp)


@pytest.mark.parametrize("model", ["sage", "mlp"])
def test_loss_decreases(reports: dict[str, dict], model: str) -> None:
    losses = [e["loss"] for e in reports[model]["epochs"]]
    assert losses[-1] < losses[0] - 0.1, losses


def test_report_has_config_dataset_epochs_final(reports: dict[str, dict], tiny_store: Path) -> None:
    report = reports["sage"]
    run_dir = Path(report["run_dir"])
    assert (run_dir / "curves.png").stat().st_size > 1000
    on_disk = read_report(run_dir)
    assert on_disk == json.loads(json.dumps(report))  # what is returned is what was written

    cfg = report["config"]
    assert cfg["model"] == "sage" and cfg["fanouts"] == [5, 5] and cfg["num_layers"] == 2 and cfg["seed"] == 0
    ds = report["dataset"]
    assert (ds["nodes"], ds["dim"], ds["num_classes"]) == (4111, 47, 5)
    assert ds["feature_bytes"] == 4111 * 47 * 4 and ds["edges"] > 0
    assert sum(ds["splits"].values()) <= 4111 and ds["splits"]["train"] > 0

    assert [e["epoch"] for e in report["epochs"]] == [1, 2, 3]
    batches = -(-ds["splits"]["train"] // SETTINGS["batch_size"])
    for e in report["epochs"]:
        assert len(e["losses"]) == batches
        assert set(e["stage_s"]) == {"sample", "gather", "train", "eval"}
        assert all(v > 0 for v in e["stage_s"].values())
        assert e["epoch_s"] >= e["stage_s"]["train"]
        assert all(0 <= e[k] <= 1 for k in ("train_acc", "val_acc", "test_acc"))
    final = report["final"]
    best = max(report["epochs"], key=lambda e: e["val_acc"])
    assert final["best_val_acc"] == best["val_acc"] and final["test_acc_at_best_val"] == best["test_acc"]
    assert final["test_acc"] == report["epochs"][-1]["test_acc"]
    assert report["stage_s"]["train"] == pytest.approx(sum(e["stage_s"]["train"] for e in report["epochs"]))
    assert report["peak_rss_bytes"] > ds["feature_bytes"] and report["wall_s"] > 0


def test_same_seed_gives_same_losses_and_another_seed_does_not(reports: dict[str, dict], tiny_store: Path,
                                                               tmp_path: Path) -> None:
    one = dict(SETTINGS, epochs=1, eval_every=1)
    again = inmemory.run(tiny_store, new_run_dir(tmp_path, "again"), model="sage", **one)
    other = inmemory.run(tiny_store, new_run_dir(tmp_path, "other"), model="sage", **dict(one, seed=1))
    first = reports["sage"]["epochs"][0]
    assert again["epochs"][0]["losses"] == first["losses"]
    assert again["epochs"][0]["val_acc"] == first["val_acc"]
    assert other["epochs"][0]["losses"] != first["losses"]


def test_eval_every_skips_evaluation_but_not_the_last_epoch(tiny_store: Path, tmp_path: Path) -> None:
    report = inmemory.run(tiny_store, tmp_path, model="mlp", **dict(SETTINGS, epochs=2, eval_every=5))
    assert report["epochs"][0]["val_acc"] is None and report["epochs"][0]["stage_s"]["eval"] == 0
    assert report["epochs"][1]["val_acc"] is not None
    assert report["final"]["best_val_acc"] == report["epochs"][1]["val_acc"]


def test_bad_options_and_inputs_raise_clear_errors(tiny_store: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^model"):
        inmemory.run(tiny_store, tmp_path, model="gin")
    with pytest.raises(ConfigError, match="^device"):
        inmemory.run(tiny_store, tmp_path, device="tpu")
    with pytest.raises(InputError, match="not a diskflow store"):
        inmemory.run(tmp_path, tmp_path)
    assert not (tmp_path / "report.json").exists()


# ------------------------------------------------------------------ pipelines and run directories

def test_pipelines_are_found_by_name_or_path(tmp_path: Path) -> None:
    assert "inmemory" in available_pipelines()
    assert load_pipeline("inmemory") is inmemory.PIPELINE
    assert load_pipeline(inmemory.__file__) is inmemory.PIPELINE
    assert load_pipeline("pipelines/inmemory.py") is inmemory.PIPELINE  # docs/design.md, "Pipelines as data"
    with pytest.raises(ConfigError, match=r"^pipeline: unknown pipeline 'nope'; available: .*inmemory"):
        load_pipeline("nope")
    (tmp_path / "norun.py").write_text("def run(store, run_dir):\n    return {}\n")
    with pytest.raises(ConfigError, match="defines no diskflow.Pipeline objects at module level"):
        load_pipeline(tmp_path / "norun.py")
    (tmp_path / "two.py").write_text("import diskflow\na = diskflow.Pipeline('a')\nb = diskflow.Pipeline('b')\n")
    with pytest.raises(ConfigError, match="defines 2 diskflow.Pipeline objects"):
        load_pipeline(tmp_path / "two.py")
    (tmp_path / "broken.py").write_text("import no_such_module_here\n")
    with pytest.raises(InputError, match="broken.py: failed to import"):
        load_pipeline(tmp_path / "broken.py")


def test_run_dirs_are_unique_and_unfinished_runs_have_no_report(tmp_path: Path) -> None:
    a, b = new_run_dir(tmp_path, "x y/z"), new_run_dir(tmp_path, "x y/z")
    assert a != b and a.is_dir() and b.is_dir() and a.parent == b.parent == tmp_path
    assert "/" not in a.name[len("YYYYmmdd-HHMMSS-"):]
    with pytest.raises(InputError, match="did not finish"):
        read_report(a)


# ------------------------------------------------------------------ CLI

def test_cli_run_prints_epochs_stages_and_report(tiny_store: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", "inmemory", "--dataset", str(tiny_store), "--epochs", "2", "--fanouts", "5,5",
               "--hidden", "16", "--batch-size", "512", "--threads", "1", "--runs-dir", str(tmp_path),
               "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "epoch   1  loss" in out and "epoch   2  loss" in out
    assert "stage times" in out and "sample" in out and "train" in out
    report_path = Path(out.strip().splitlines()[-1].removeprefix("report: "))
    report = read_report(report_path)
    assert report["config"]["hidden"] == 16 and report["config"]["fanouts"] == [5, 5]
    assert report_path.parent.parent == tmp_path and report_path.parent.name.endswith("inmemory-sage")



@pytest.mark.parametrize("flags, message", [
    (["--fanouts", "a,b"], "--fanouts: expected comma-separated integers >= -1, got 'a,b'"),
    (["--fanouts", "5,-3"], "--fanouts: expected comma-separated integers >= -1, got '5,-3'"),
    (["--epochs", "0"], "--epochs: expected an integer >= 1, got 0"),
    (["--batch-size", "many"], "--batch-size: expected an integer, got 'many'"),
    (["--lr", "fast"], "--lr: expected a number, got 'fast'"),
    (["--model", "gin"], "--model: unknown model 'gin'"),
])
def test_cli_bad_flag_exits_2_naming_it(tiny_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        flags: list[str], message: str) -> None:
    rc = main(["run", "inmemory", "--dataset", str(tiny_store), "--runs-dir", str(tmp_path), *flags])
    err = capsys.readouterr().err
    assert rc == 2 and f"diskflow run: error: {message}" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no run directory left behind


def test_cli_unknown_pipeline_or_store_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "nope", "--dataset", str(tmp_path), "--runs-dir", str(tmp_path)]) == 2
    assert "unknown pipeline 'nope'; available:" in capsys.readouterr().err
    assert main(["run", "inmemory", "--dataset", str(tmp_path / "missing"), "--runs-dir", str(tmp_path)]) == 2
    assert "not a diskflow store" in capsys.readouterr().err
