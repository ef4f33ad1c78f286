"""Nothing of the user's is replaced without --force (docs/design.md, "Outputs: nothing replaced,
nothing half-written"): every command that writes a
directory refuses one that is not its own kind of output, in one line naming it and what is there,
and leaves it as it was; with --force it is replaced by a valid output.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import dask
import numpy as np
import pytest
from diskflow.cli import main
from diskflow.flow.prepare import WORK_MARKER, PrepareConfig, prepare

PREPARE = ["--fanouts", "4,3", "--batch-size", "64", "--superbatch-size", "4", "--cpu-memory", "16MiB",
           "--workers", "1", "--readahead", "0"]


@pytest.fixture(scope="module")
def packed(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    with dask.config.set(scheduler="sync"):
        return prepare(tiny_store, tmp_path_factory.mktemp("packed") / "p",
                       PrepareConfig(fanouts=(4, 3), batch_size=64, superbatch_size=4, cpu_memory=16 << 20),
                       quiet=True).path


@pytest.fixture(scope="module")
def npy_inputs(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    d = tmp_path_factory.mktemp("npy")
    rng = np.random.default_rng(0)
    np.save(d / "x.npy", rng.random((50, 3), dtype=np.float32))
    np.save(d / "e.npy", rng.integers(0, 50, (2, 200)))
    return ["--features", str(d / "x.npy"), "--edge-index", str(d / "e.npy")]


def _fmt(fmt: str) -> Callable[[Path], bool]:
    return lambda out: json.loads((out / "manifest.json").read_text())["format"] == fmt


# command name -> (argv for an output directory OUT, where the foreign directory is, is OUT valid?)
def _cases(tiny_raw: Path, tiny_store: Path, packed: Path, npy: list[str]) -> dict[str, tuple]:
    return {
        "synth": (lambda o: ["synth", str(o), "--nodes", "300", "--dim", "4", "--part-nodes", "300", "--workers", "1"],
                  lambda o: o, _fmt("diskflow-raw")),
        "import": (lambda o: ["import", "npy", str(o), *npy], lambda o: o, _fmt("diskflow-raw")),
        "ingest": (lambda o: ["ingest", str(tiny_raw), str(o), "--workers", "1"], lambda o: o, _fmt("diskflow-store")),
        "prepare": (lambda o: ["prepare", "belady", "--dataset", str(tiny_store), "--out", str(o), *PREPARE],
                    lambda o: o, _fmt("diskflow-packed")),
        "prepare-work": (lambda o: ["prepare", "belady", "--dataset", str(tiny_store), "--out", str(o), *PREPARE],
                         lambda o: Path(f"{o}.work"),
                         lambda o: _fmt("diskflow-packed")(o) and (Path(f"{o}.work") / WORK_MARKER).is_file()),
        "train": (lambda o: ["train", str(packed), "--run-dir", str(o), "--model", "mlp", "--no-progress"],
                  lambda o: o, lambda o: (o / "report.json").is_file()),
    }


CASES = ("synth", "import", "ingest", "prepare", "prepare-work", "train")


@pytest.mark.parametrize("case", CASES)
def test_a_foreign_directory_is_refused_then_replaced_with_force(
        case: str, tiny_raw: Path, tiny_store: Path, packed: Path, npy_inputs: list[str], tmp_path: Path,
        capfd: pytest.CaptureFixture) -> None:
    argv, foreign_of, valid = _cases(tiny_raw, tiny_store, packed, npy_inputs)[case]
    out = tmp_path / "out"
    foreign = foreign_of(out)
    foreign.mkdir()
    (foreign / "x").write_text("hi")

    assert main(argv(out)) == 2
    err = capfd.readouterr().err
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith(("Dask dashboard:", "diskflow page:"))]
    command = argv(out)[0]
    assert len(lines) == 1 and lines[0].startswith(f"diskflow {command}: error: {foreign}: holds 1 entry (x), not a "
                                                   "diskflow "), err
    assert "refusing to replace it" in lines[0] and "--force" in lines[0]
    assert (foreign / "x").read_text() == "hi", "what was there is untouched"
    assert "Dask dashboard" not in err, "refused before a cluster starts"

    assert main([*argv(out), "--force"]) == 0
    capfd.readouterr()
    assert not (foreign / "x").exists(), "replaced"
    assert valid(out)


@pytest.mark.parametrize("case", ("ingest", "prepare", "synth"))
def test_another_kind_of_diskflow_output_is_refused_by_its_name(
        case: str, tiny_raw: Path, tiny_store: Path, packed: Path, npy_inputs: list[str], tmp_path: Path,
        capfd: pytest.CaptureFixture) -> None:
    argv, _, _ = _cases(tiny_raw, tiny_store, packed, npy_inputs)[case]
    other = tiny_raw if case != "synth" else tiny_store      # a raw dataset is not a store or a packed dataset
    assert main(argv(other)) == 2
    err = capfd.readouterr().err
    assert f"{other}: is a diskflow {'store' if case == 'synth' else 'raw dataset'}, not a diskflow" in err
    assert json.loads((other / "manifest.json").read_text())["format"].startswith("diskflow-")


def test_a_file_is_refused(tiny_raw: Path, tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    f = tmp_path / "notes.txt"
    f.write_text("mine")
    assert main(["ingest", str(tiny_raw), str(f), "--workers", "1"]) == 2
    assert f"{f}: is a file, not a diskflow store; refusing" in capfd.readouterr().err
    assert f.read_text() == "mine"


def test_run_makes_a_fresh_run_directory_and_names_a_bad_runs_dir(tiny_store: Path, tmp_path: Path,
                                                                  capfd: pytest.CaptureFixture) -> None:
    from diskflow.flow.rundir import new_run_dir

    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "x").write_text("hi")
    d = new_run_dir(runs, "inmemory-sage")    # what `diskflow run` uses: always a new directory inside
    assert d.parent == runs and not any(d.iterdir()) and (runs / "x").read_text() == "hi"
    f = tmp_path / "afile"
    f.write_text("mine")
    assert main(["run", "inmemory", "--dataset", str(tiny_store), "--runs-dir", str(f), "--epochs", "1"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"diskflow run: error: {f}: cannot hold run directories")
    assert f.read_text() == "mine"
