"""Messages a user meets following the README, the user guide and ``--help``: each mistake ends in one line that
names the input, the fault and what to run instead (exit status 2 on the command line), and the help says what
the guide says."""
from __future__ import annotations

from pathlib import Path

import pytest
from diskflow.cli import main


def test_run_help_says_a_pipeline_file_defines_a_pipeline(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "a .py file that defines a diskflow.Pipeline" in text
    assert "run(store" not in text


def _one_line(err: str, command: str) -> str:
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith(f"diskflow {command}: error: "), err
    return err.strip()


def test_train_given_a_store_says_what_to_run(tiny_store: Path, tiny_raw: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`diskflow train STORE`: which kind of directory it got, and the commands that take it; nothing internal."""
    runs = tmp_path / "runs"
    assert main(["train", str(tiny_store), "--runs-dir", str(runs), "--no-progress"]) == 2
    captured = capsys.readouterr()
    line = _one_line(captured.err, "train")
    assert f"{tiny_store}: a store, not a packed dataset" in line
    assert f"`diskflow prepare belady --dataset {tiny_store} --out PACKED`, then `diskflow train PACKED`" in line
    assert f"`diskflow run inmemory --dataset {tiny_store}`" in line
    assert not any(word in line for word in ("check_crc", "on_batch", "on_epoch", "not an option"))
    assert "run directory" not in captured.out and not runs.exists()        # refused before a run directory
    assert main(["train", str(tiny_raw), "--runs-dir", str(runs)]) == 2
    line = _one_line(capsys.readouterr().err, "train")
    assert f"{tiny_raw}: a raw dataset, not a packed dataset: ingest it (`diskflow ingest {tiny_raw} STORE`)" in line
    assert main(["train", str(tmp_path / "nothing"), "--runs-dir", str(runs)]) == 2
    line = _one_line(capsys.readouterr().err, "train")
    assert "nothing: not a packed dataset (no such directory; make one with `diskflow prepare belady" in line


def test_the_api_given_a_store_names_fields_and_what_to_call(tiny_store: Path, tmp_path: Path) -> None:
    """From Python a store trains (the inmemory pipeline by default); a packed dataset's option says the store is not
    one and how to make one, in the API's names; an unknown option lists the options, not the hooks."""
    import diskflow

    runs = tmp_path / "runs"
    with pytest.raises(diskflow.ConfigError) as e:
        diskflow.train(tiny_store, runs_dir=runs, check_crc=False)
    text = str(e.value)
    assert "\n" not in text and "--" not in text
    assert text.startswith(f"check_crc: an option of training a packed dataset, and {tiny_store} is a store, not a "
                           f"packed dataset: prepare it first (diskflow.prepare('{tiny_store}', PACKED), then "
                           "diskflow.train(PACKED, check_crc=...)), or leave check_crc out")
    with pytest.raises(diskflow.ConfigError) as e:
        diskflow.train(tiny_store, runs_dir=runs, no_such_option=1)
    text = str(e.value)
    assert text.startswith("no_such_option: not an option of the inmemory pipeline, which takes batch_size, ")
    assert not any(hook in text for hook in ("on_batch", "on_epoch", "on_start", "progress"))
    with pytest.raises(diskflow.InputError, match=r": a store, not a packed dataset: prepare it first "
                                                  r"\(diskflow\.prepare\(.*OnlineLoader\("):
        diskflow.PackedLoader(tiny_store)
    assert not runs.exists()
