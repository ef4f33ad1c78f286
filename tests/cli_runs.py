"""Runs of the `diskflow` command line inside the test process, and the figures tests compare between runs."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import dask
import pytest
from diskflow.cli import main


def losses(report: dict[str, Any]) -> list[float]:
    """Every batch's loss of a run, epoch after epoch."""
    return [x for r in report["epochs"] for x in r["losses"]]


def cli_report(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Run `diskflow ARGV` (it must succeed) and return the report.json its last line names."""
    rc = main(argv)
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    report = Path(printed.out.strip().splitlines()[-1].removeprefix("report: "))
    return dict(json.loads(report.read_text()))


def only_run_report(runs: Path) -> dict[str, Any]:
    """The report.json of the one run directory under `runs`."""
    (run_dir,) = runs.iterdir()
    return dict(json.loads((run_dir / "report.json").read_text()))



def user_model_fixtures(file_name: str, text: str, settings: list[str]) -> tuple[Any, Any]:
    """The module fixtures of a test of a user's model file: ``model_file``, `text` written as `file_name` in a
    fresh folder, and ``reference``, the report of `diskflow run inmemory` on ``tiny_store`` with that model and
    `settings` (what the file's other runs compare their losses with), on Dask's synchronous scheduler."""

    @pytest.fixture(scope="module", name="model_file")
    def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
        path = tmp_path_factory.mktemp("mine") / file_name
        path.write_text(text)
        return path

    @pytest.fixture(scope="module", name="reference")
    def reference(model_file: Path, tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
        runs = tmp_path_factory.mktemp("ref")
        with dask.config.set(scheduler="sync"):
            rc = main(["run", "inmemory", "--dataset", str(tiny_store), "--model", str(model_file),
                       "--runs-dir", str(runs), *settings])
        assert rc == 0
        return only_run_report(runs)

    return model_file, reference


def two_gpu_workers_and_one(store: Path, model_file: Path, run_dir: Path, settings: list[str],
                            stream: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any],
                                                                                            dict[str, Any]]:
    """The reports of `diskflow run streaming --gpus 2` (worker processes, the model by its file's path) and of one
    in-process GPU worker that steps on two batches at a time, with the user's model of `model_file`; the two
    workers' models must have stayed equal and their losses those of the one worker (within float-sum order)."""
    from diskflow.pipelines import streaming

    two = cli_report(["run", "streaming", "--dataset", str(store), "--model", str(model_file), "--gpus", "2",
                      "--workers", "1", "--device", "cpu", "--superbatch-size", str(stream["superbatch_size"]),
                      "--runs-dir", str(run_dir), *settings], capsys)
    assert two["stream"]["gpus"] == 2 and two["stream"]["models_equal"]
    one = streaming.run(store, run_dir / "one", model=str(model_file), workers=1, processes=False,
                        batches_per_step=2, **stream)
    assert losses(two) == pytest.approx(losses(one), rel=1e-5, abs=1e-6)
    return two, one
