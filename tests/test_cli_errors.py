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

from diskflow.errors import ConfigError


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


def test_a_nested_command_maps_its_own_flags(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench_command, "_run", _raises(ConfigError("batch_size", "must be >= 1")))
    assert main(["bench", "compare"]) == 2
    assert capsys.readouterr().err == "diskflow bench: error: --batch-size: must be >= 1\n"
