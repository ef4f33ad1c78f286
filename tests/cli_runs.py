"""Runs of the `diskflow` command line inside the test process, and the figures tests compare between runs."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
