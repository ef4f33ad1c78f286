"""A bench child that refuses its settings (a `DiskflowError`) says why in one line, in the bench's table and JSON,
with no traceback; the other runs go on. Here belady_outre's model run with a GCN, which its historical embedding
cache does not take, its children in this test's process (tests/bench_children.py): `harness.child_main` returns the
refusal's exit status instead of raising, which is what keeps a child process's traceback off the user's screen."""
from __future__ import annotations

import json
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest
from bench_children import compare_children_in_this_process
from diskflow.bench import child
from diskflow.cli import main

from diskflow.errors import ConfigError

TINY = ["--fanouts", "4,4", "--batch-size", "128", "--superbatch-size", "4", "--epochs", "1", "--hidden", "16",
        "--feature-budget", "3500KiB", "--threads", "1", "--bw-bytes", str(1 << 20), "--staleness-sweep", ""]
REASON = "model: a historical embedding cache works with sage, gat"


def test_a_refused_model_is_one_line_in_the_table_and_the_json(tiny_store: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "figures.json"
    printed = StringIO()
    argv = ["bench", "compare", "--dataset", str(tiny_store), *TINY, "--workdir", str(tmp_path / "w"),
            "--json", str(out), "--pipelines", "belady_outre", "--model", "gcn", "--no-cgroup"]
    with compare_children_in_this_process(), redirect_stdout(printed):
        assert main(argv) == 0
    text = printed.getvalue() + capsys.readouterr().err
    errors = json.loads(out.read_text())["pipelines"]["belady_outre"]["errors"]
    assert list(errors) == ["model (repeat 1)"], errors
    assert errors["model (repeat 1)"].startswith(f"refused: {REASON}") and "\n" not in errors["model (repeat 1)"]
    assert f"  belady_outre (model) failed: refused: {REASON}" in text
    row = next(line for line in text.splitlines() if line.startswith("| belady_outre "))
    assert f"model (repeat 1): refused: {REASON}" in row              # the table's note
    assert "Traceback" not in text and "exit status" not in text


def test_a_refusal_is_written_for_the_parent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = {"refused": str(tmp_path / "x.refused.txt")}
    assert child.refuse(spec, ConfigError("cpu_memory", "too small\nfor batch 0")) == child.REFUSED
    assert (tmp_path / "x.refused.txt").read_text() == "cpu_memory: too small for batch 0"
    assert child.refuse({}, ConfigError("cpu_memory", "too small")) == child.REFUSED     # no file: stderr
    assert capsys.readouterr().err == "cpu_memory: too small\n"
