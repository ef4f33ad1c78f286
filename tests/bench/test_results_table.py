"""The README's results table is built from docs/results/*.json by `python -m diskflow.bench.results`, never
typed by hand: the check fails when the two differ, and the rendering is what the JSONs say."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from diskflow.bench import results

ROOT = Path(__file__).resolve().parents[2]

HEADLINE = {"bench": "prepare", "what": "preparation next to its floor", "command": "diskflow bench prepare",
            "date": "2026-11-27", "machine": "2 cores, no GPU",
            "headline": {"metric": "prepare", "value": 10.2, "unit": "s",
                         "ratio": {"value": 1.24, "against": "its I/O floor (8.21 s)"}, "target": "≤ 1.5x"}}


def test_the_readme_table_is_what_the_jsons_give() -> None:
    r = subprocess.run([sys.executable, "-m", "diskflow.bench.results", "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_results_file_names_its_bench_date_machine_and_command() -> None:
    files = sorted((ROOT / "docs" / "results").glob("*.json"))
    assert files, "docs/results holds no results"
    for f in files:
        data = results.load(f)
        # NAME.json, or NAME.MACHINE.json for the same bench's figure on another kind of machine
        assert data["bench"] == f.stem.split(".", 1)[0] and data["command"].startswith("diskflow bench "), f


def _readme(tmp_path: Path, table: str = "old table") -> Path:
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\n{results.BEGIN}\n{table}\n{results.END}\n\nafter\n")
    return readme


def test_rendering_a_tmp_json_and_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "docs" / "results"
    folder.mkdir(parents=True)
    (folder / "prepare.json").write_text(json.dumps(HEADLINE))
    (folder / "sampler.json").write_text(json.dumps(
        {**HEADLINE, "bench": "sampler", "what": "a | b", "date": "2026-11-21",
         "headline": {"metric": "native", "value": 71.8e6, "unit": "edges/s", "note": "no ratio"}}))
    readme = _readme(tmp_path)

    assert results.main(["--readme", str(readme), "--check"]) == 1
    assert "old table" in readme.read_text()                 # --check changes nothing
    assert results.main(["--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("# title\n\n") and text.endswith(f"{results.END}\n\nafter\n")
    rows = text.split(results.BEGIN)[1].split(results.END)[0].strip().splitlines()
    assert rows[0] == "| bench | what it measures | headline | against | date | machine |"
    assert rows[2] == ("| [`prepare`](docs/results/prepare.json) | preparation next to its floor | prepare: **10.2 s** | "
                       "**1.24x** its I/O floor (8.21 s) (target: ≤ 1.5x) | 2026-11-27 | 2 cores, no GPU |")
    assert rows[3] == ("| [`sampler`](docs/results/sampler.json) | a \\| b | native: **71.8M edges/s** | no ratio | "
                       "2026-11-21 | 2 cores, no GPU |")              # after prepare: the table's order
    assert len(rows) == 4
    assert results.main(["--readme", str(readme), "--check"]) == 0

    (folder / "prepare.json").write_text(json.dumps({**HEADLINE, "date": "2026-11-28"}))
    capsys.readouterr()
    assert results.main(["--readme", str(readme), "--check"]) == 1
    assert "2026-11-28" in capsys.readouterr().err                   # the diff shows what moved


def test_a_bad_results_file_or_readme_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "docs" / "results"
    folder.mkdir(parents=True)
    bad = {k: v for k, v in HEADLINE.items() if k != "machine"}
    (folder / "prepare.json").write_text(json.dumps(bad))
    readme = _readme(tmp_path)
    assert results.main(["--readme", str(readme)]) == 2
    assert "prepare.json: missing machine" in capsys.readouterr().err
    (folder / "prepare.json").write_text(json.dumps(HEADLINE))
    readme.write_text("no markers here\n")
    assert results.main(["--readme", str(readme)]) == 2
    assert "expected one <!-- results:begin -->" in capsys.readouterr().err
