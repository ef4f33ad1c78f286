"""A user's own pipeline, as the README shows it: one `.py` file that imports only `diskflow`'s public names and
defines a `diskflow.Pipeline` with its own CPU tier policy, taken by `diskflow prepare`, `diskflow train` and
`diskflow run` (`diskflow bench compare --pipelines FILE.py` is checked with the other pipelines in
tests/bench/test_bench_compare.py)."""
from __future__ import annotations

import json
from pathlib import Path

import dask
import numpy as np
import pytest
from diskflow.cli import main
from user_pipeline import USER_PIPELINE

import diskflow

SMALL = ["--fanouts", "4,4", "--batch-size", "256", "--superbatch-size", "4", "--epochs", "2"]


@pytest.fixture(scope="module")
def user_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mine") / "every_other.py"
    path.write_text(USER_PIPELINE)
    return path


@pytest.fixture(autouse=True)
def _threads():
    with dask.config.set(scheduler="threads"):
        yield


def test_the_readme_shows_this_file() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert USER_PIPELINE in readme


def test_the_file_defines_a_public_pipeline(user_file: Path) -> None:
    p = diskflow.load_pipeline(user_file)
    assert isinstance(p, diskflow.Pipeline) and p.name == "every-other" and p.loader == "packed"
    assert p.describe()["cpu_tier"].startswith("every_other.every_other_hot_row#")   # file stem, function, code hash
    with pytest.raises(diskflow.ConfigError, match="Pipeline.loader"):
        diskflow.Pipeline("bad", loader="disk")
    with pytest.raises(diskflow.ConfigError, match="cpu_tier: expected one of belady, static or a function"):
        diskflow.Pipeline("bad", cpu_tier="lru")
    with pytest.raises(diskflow.ConfigError, match="fanouts: hop 1: -2 must be >= 0"):
        diskflow.Pipeline("bad", fanouts=(5, -2))
    with pytest.raises(diskflow.ConfigError, match="fanouts: expected a sequence of integers"):
        diskflow.Pipeline("bad", fanouts="10,10")
    with pytest.raises(diskflow.ConfigError, match="Pipeline.loader: tier policies and packing"):
        diskflow.Pipeline("bad", loader="memory", cpu_tier="static")
    assert diskflow.Pipeline("ok", fanouts=[3, 2]).fanouts == (3, 2)


def test_prepare_then_train_uses_the_users_tier(user_file: Path, tiny_store: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "packed"
    rc = main(["prepare", str(user_file), "--dataset", str(tiny_store), "--out", str(out), "--cpu-memory", "8MiB",
               "--workers", "1", *SMALL])
    printed = capsys.readouterr()
    assert rc == 0, printed.err
    assert "prepared every-other" in printed.out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["pipeline"] == "every-other" and manifest["config"]["cpu_policy"].startswith("every_other.every_other_hot_row#")
    # the CPU tier is exactly what the function returns for the round's access counts (laid out in node order)
    from diskflow.operators.formats.packed import PackedDataset

    with PackedDataset(out) as ds:
        cpu, gpu = np.asarray(ds.cpu_ids), np.asarray(ds.gpu_ids)
        n_ids = [np.asarray(s.n_id) for sb in ds.superbatches for s in ds.samples(sb.key)]
        counts = np.bincount(np.concatenate(n_ids), minlength=ds.num_nodes).astype(np.int64)
    policy = diskflow.load_pipeline(user_file).cpu_tier
    expected = policy(counts, cpu.shape[0], gpu)
    assert expected.shape[0] > 0 and np.array_equal(cpu[cpu >= 0], np.sort(expected))
    assert np.all(cpu[expected.shape[0]:] == -1)        # the rest of the tier's slots stay empty
    rc = main(["train", str(out), "--runs-dir", str(tmp_path / "runs"), "--hidden", "8",
               "--threads", "1", "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    assert "epoch   2" in capsys.readouterr().out


def test_run_trains_with_it(user_file: Path, tiny_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["run", str(user_file), "--dataset", str(tiny_store), "--runs-dir", str(tmp_path), "--epochs", "1",
               "--fanouts", "4,4", "--hidden", "8", "--threads", "1", "--no-progress"])
    out = capsys.readouterr().out
    assert rc == 0
    report = json.loads(Path(out.strip().splitlines()[-1].removeprefix("report: ")).read_text())
    assert report["pipeline"] == "every-other" and report["definition"]["cpu_tier"].startswith("every_other.every_other_hot_row#")
