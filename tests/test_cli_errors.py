"""A `ConfigError` names a config field or API parameter (``cpu_memory``); the command line prints the flag the
running command has for it (``--cpu-memory``), and an option already written as a flag, or one the command has
no flag for, as it is; a positional argument as its metavar."""
from __future__ import annotations

import argparse

import pytest
from diskflow.cli import bench as bench_command
from diskflow.cli import build_parser, main
from diskflow.cli import prepare as prepare_command
from diskflow.cli.main import flag_of

from diskflow.errors import ConfigError, Setting


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[name]


def test_a_field_name_maps_to_the_commands_flag() -> None:
    prepare = _subparser("prepare")
    assert flag_of(prepare, "cpu_memory") == "--cpu-memory"
    assert flag_of(prepare, "history_prune") == "--history-prune"
    assert flag_of(prepare, "--cpu-memory") == "--cpu-memory"        # a flag already
    assert flag_of(prepare, "--scratch/--quota") == "--scratch/--quota"
    assert flag_of(prepare, "resources") == "resources"              # no argument stores it
    assert flag_of(prepare, "pipeline") == "PIPELINE"                # a positional: as its usage line shows it
    assert flag_of(None, "cpu_memory") == "cpu_memory"
    assert flag_of(_subparser("synth"), "feature_format") == "--format"   # by dest, not by spelling
    assert flag_of(prepare, "store") == "--dataset" and flag_of(_subparser("synth"), "train_frac") == "--train"


def _raises(error: ConfigError):
    def run(args: argparse.Namespace) -> int:
        raise error
    return run


@pytest.mark.parametrize(("option", "printed"), [("cpu_memory", "--cpu-memory"), ("--readahead", "--readahead"),
                                                 ("resources", "resources")])
def test_main_prints_the_flag(option: str, printed: str, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(prepare_command, "_run", _raises(ConfigError(option, "too small")))
    assert main(["prepare", "belady", "--dataset", "STORE", "--out", "PACKED"]) == 2
    assert capsys.readouterr().err == f"diskflow prepare: error: {printed}: too small\n"


def test_the_settings_a_fault_names_print_as_flags(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Settings in a fault read as fields from Python and as flags with values on the command line; a choice the
    command has no flag for is left out, and with none left the fault's words for that case stand there."""
    choices = [Setting("queue_depth", 1), Setting("sequential", True), Setting("fanouts", (4, 4), "at most 9 rows")]
    error = ConfigError("cpu_memory", "too small; {choices} would fit", choices=choices, no_choice="nothing")
    assert str(error) == "cpu_memory: too small; queue_depth=1 or sequential=True or fanouts=(4, 4) (at most 9 rows) " \
                         "would fit"
    monkeypatch.setattr(prepare_command, "_run", _raises(error))
    assert main(["prepare", "belady", "--dataset", "STORE", "--out", "PACKED"]) == 2
    assert capsys.readouterr().err == ("diskflow prepare: error: --cpu-memory: too small; --queue-depth 1 or "
                                       "--fanouts 4,4 (at most 9 rows) would fit\n")
    monkeypatch.setattr(prepare_command, "_run", _raises(ConfigError("cpu_memory", "{choices} would fit", choices=[
        Setting("sequential", True)], no_choice="nothing smaller")))
    assert main(["prepare", "belady", "--dataset", "STORE", "--out", "PACKED"]) == 2
    assert capsys.readouterr().err == "diskflow prepare: error: --cpu-memory: nothing smaller would fit\n"


def test_a_nested_command_maps_its_own_flags(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench_command, "_run", _raises(ConfigError("batch_size", "must be >= 1")))
    assert main(["bench", "compare"]) == 2
    assert capsys.readouterr().err == "diskflow bench: error: --batch-size: must be >= 1\n"


def test_the_history_rule_flags_reach_the_run_and_are_checked(tiny_store, tmp_path, one_torch_thread,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """--history-ramp and --history-cooldown: a bad value names its flag before anything runs; good ones
    reach the plan, and the summary says the bound and the exact end."""
    base = ["run", "inmemory", "--dataset", str(tiny_store), "--runs-dir", str(tmp_path), "--epochs", "2",
            "--fanouts", "4,3", "--batch-size", "200", "--hidden", "8", "--threads", "1", "--no-progress"]
    assert main([*base, "--history-memory", "64KiB", "--history-cooldown", "1.5"]) == 2
    assert "--history-cooldown: expected the share of the round's last batches" in capsys.readouterr().err
    assert main([*base, "--history-memory", "64KiB", "--history-ramp", "x"]) == 2
    assert "--history-ramp: expected a number" in capsys.readouterr().err
    assert main([*base, "--history-cooldown", "0.5"]) == 2            # no cache for it to change
    assert "--history-cooldown: applies to a historical embedding cache only" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())                                # nothing left behind
    assert main([*base, "--history-memory", "64KiB", "--history-staleness", "20", "--history-ramp", "0.5",
                 "--history-cooldown", "0.25"]) == 0
    out = capsys.readouterr().out
    assert "staleness 20 at most, 0.5 x the model's age in batches when computed, the round's last 25% exact" in out
    with pytest.raises(SystemExit):
        main(["prepare", "belady_outre", "--dataset", "S", "--out", "P", "--history-ramp", "-1"])
    assert "--history-ramp: expected a finite number >= 0" in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "printed"), [
    (["--batch-size", "0"], "--batch-size: must be >= 1, got 0"),
    (["--epochs", "0"], "--epochs: must be >= 1, got 0"),
    (["--queue-depth", "0"], "--queue-depth: must be >= 1, got 0"),
    (["--hidden", "0"], "--hidden: must be >= 1, got 0"),
    (["--batches", "partition", "--partitions", "1"], "--partitions: must be >= 2, got 1"),
])
def test_prepare_values_are_checked_by_the_library_and_printed_as_their_flag(
        tiny_store, tmp_path, capsys: pytest.CaptureFixture[str], flags: list[str], printed: str) -> None:
    """prepare's argparse types only convert text; the range is `prepare_options`'s to check (one place), and its
    `ConfigError` reads as one line naming the flag, exit 2, before a cluster starts."""
    assert main(["prepare", "belady", "--dataset", str(tiny_store), "--out", str(tmp_path / "packed"), *flags]) == 2
    assert capsys.readouterr().err == f"diskflow prepare: error: {printed}\n"
    assert not (tmp_path / "packed").exists()
