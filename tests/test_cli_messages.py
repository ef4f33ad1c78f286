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
        diskflow.train(tiny_store, runs_dir=runs, queue_depth=4)
    text = str(e.value)
    assert "\n" not in text and "--" not in text
    assert text.startswith(f"queue_depth: an option of training a packed dataset, and {tiny_store} is a store, not a "
                           f"packed dataset: prepare it first (diskflow.prepare('{tiny_store}', PACKED), then "
                           "diskflow.train(PACKED, queue_depth=...)), or leave queue_depth out")
    with pytest.raises(diskflow.ConfigError) as e:
        diskflow.train(tiny_store, runs_dir=runs, no_such_option=1)
    text = str(e.value)
    assert text.startswith("no_such_option: not an option of the inmemory pipeline, which takes batch_size, ")
    assert not any(hook in text for hook in ("on_batch", "on_epoch", "on_start", "progress"))
    with pytest.raises(diskflow.InputError, match=r": a store, not a packed dataset: prepare it first "
                                                  r"\(diskflow\.prepare\(.*OnlineLoader\("):
        diskflow.PackedLoader(tiny_store)
    assert not runs.exists()


class _Raises:
    """A model factory whose module's forward raises (a user's bug)."""

    def __call__(self, in_channels: int, out_channels: int):
        import torch

        class Broken(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lin = torch.nn.Linear(in_channels, out_channels)

            def forward(self, x, edge_index):
                raise RuntimeError("no forward today")

        return Broken()


SMALL = {"fanouts": (4, 4), "batch_size": 256, "hidden": 8, "threads": 1}


def test_a_model_whose_forward_raises_is_named_once_and_leaves_no_run(tiny_store: Path, tmp_path: Path,
                                                                        one_torch_thread: None) -> None:
    """From Python: `model 'x': forward failed ...`, the model named once; the run directory the call made is gone,
    for a store (with what the pipeline prepared kept only where there is some) and for a packed dataset."""
    import diskflow

    model = diskflow.Model("my-gat2", _Raises())
    runs = tmp_path / "runs"
    with pytest.raises(diskflow.InputError) as e:
        diskflow.train(tiny_store, model, runs_dir=runs, epochs=1, **SMALL)
    text = str(e.value)
    assert text.startswith("model 'my-gat2': forward failed on training batch 0 (x [") and "\n" not in text
    assert text.count("my-gat2") == 1 and text.endswith("RuntimeError: no forward today")
    assert list(runs.iterdir()) == [], "no empty run directory left"

    packed = diskflow.prepare(tiny_store, tmp_path / "packed", cpu_memory="6MiB", fanouts=(4, 4), batch_size=256,
                              superbatch_size=4).path
    with pytest.raises(diskflow.InputError, match=r"^model 'my-gat2': forward failed on training batch 0"):
        diskflow.train(packed, model, runs_dir=runs, hidden=8, threads=1)
    assert list(runs.iterdir()) == []
    mine = tmp_path / "mine"                    # a run directory the caller had stays
    mine.mkdir()
    with pytest.raises(diskflow.InputError):
        diskflow.train(packed, model, run_dir=mine, hidden=8, threads=1)
    assert mine.is_dir()


def test_a_model_files_forward_failing_names_the_file_and_the_model_once(tiny_store: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken_model.py"
    path.write_text("import torch\nimport diskflow\n\n\nclass Net(torch.nn.Module):\n"
                    "    def __init__(self, i, o):\n        super().__init__()\n        self.lin = torch.nn.Linear(i, o)\n\n"
                    "    def forward(self, x, edge_index):\n        raise RuntimeError('no forward today')\n\n\n"
                    "model = diskflow.Model('my-gat2', Net)\n")
    runs = tmp_path / "runs"
    assert main(["run", "inmemory", "--dataset", str(tiny_store), "--model", str(path), "--runs-dir", str(runs),
                 "--fanouts", "4,4", "--batch-size", "256", "--hidden", "8", "--epochs", "1", "--threads", "1",
                 "--no-progress"]) == 2
    line = _one_line(capsys.readouterr().err, "run")
    assert line.startswith(f"diskflow run: error: {path}: model 'my-gat2': forward failed on training batch 0")
    assert line.count("my-gat2") == 1
    assert list(runs.iterdir()) == []


def test_a_command_that_starts_a_cluster_prints_both_links_without_progress_bars(
        tiny_store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--no-progress hides progress bars, not where to watch the run: the dashboard's link and the diskflow page's."""
    assert main(["run", "streaming", "--dataset", str(tiny_store), "--no-progress", "--workers", "0", "--epochs", "1",
                 "--fanouts", "4,4", "--batch-size", "512", "--hidden", "8", "--threads", "1",
                 "--runs-dir", str(tmp_path)]) == 0
    err = capsys.readouterr().err.splitlines()
    dashboard = [line for line in err if line.startswith("Dask dashboard: http")]
    page = [line for line in err if line.startswith("diskflow page:  http")]
    assert len(dashboard) == len(page) == 1, err
    assert page[0].endswith("/diskflow") and dashboard[0].split()[-1].rsplit("/", 1)[0] in page[0]


_NOT_JSON = "not JSON (Expecting property name enclosed in double quotes at character 1)"


@pytest.mark.parametrize(("text", "fault"), [("{bad", _NOT_JSON),
                                             ('["key"]', """expected a JSON object, got '["key"]'""")])
def test_storage_options_that_are_not_a_json_object_say_so(text: str, fault: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["ingest", "s3://bucket/raw", str(tmp_path / "store"), "--storage-options", text])
    assert e.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"diskflow ingest: error: argument --storage-options: " \
                                                         f"--storage-options: {fault}"
    assert not (tmp_path / "store").exists()
