"""The demo end to end at tiny scale, `diskflow info`, and every subcommand's --help."""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pytest
from diskflow.flow.cli import COMMANDS, build_parser, main


def test_demo_end_to_end_at_tiny_scale(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        rc = main(["demo", "--workdir", str(tmp_path / "demo"), "--nodes", "6000", "--dim", "16", "--classes", "4",
                   "--epochs", "4", "--fanouts", "5,5", "--batch-size", "256", "--hidden", "32", "--workers", "1"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "Dask dashboard:" in out.err
    accs = dict(re.findall(r"^(sage|mlp)\s+([0-9.]+)", out.out, re.MULTILINE))
    sage, mlp = float(accs["sage"]), float(accs["mlp"])
    assert sage > 0.25 + 0.3 and sage > mlp + 0.1, out.out
    reports = sorted((tmp_path / "demo" / "runs").glob("*/report.json"))
    assert len(reports) == 2
    for r in reports:
        rep = json.loads(r.read_text())
        assert len(rep["epochs"]) == 4 and rep["final"]["test_acc"] > 0.25
    # info reads the store and a run directory
    assert main(["info", str(tmp_path / "demo" / "store")]) == 0
    assert "num_nodes" in capsys.readouterr().out
    assert main(["info", str(reports[0].parent)]) == 0
    assert "test_acc" in capsys.readouterr().out


def test_every_subcommand_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    names = set(sub.choices)
    assert len(names) >= len(COMMANDS)
    for name in names:
        with pytest.raises(SystemExit) as e:
            main([name, "--help"])
        assert e.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith(f"usage: diskflow {name}") and len(text.splitlines()) > 3, name


def test_info_on_a_directory_without_manifest_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tmp_path)]) == 2
    assert "no manifest.json or report.json" in capsys.readouterr().err
