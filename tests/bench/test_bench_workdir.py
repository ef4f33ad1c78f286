"""The benchmarks delete and rewrite parts of their --workdir (raw/, store/, packed/, scratch/), so a
directory that is not a benchmark work directory is refused unless --force."""
from __future__ import annotations

from pathlib import Path

import pytest
from diskflow.bench.common import BENCH_MARKER, check_workdir, mark_workdir
from diskflow.cli import main

from diskflow.errors import InputError


@pytest.mark.parametrize("argv", [["prepare", "--workdir"], ["ingest", "--workdir"], ["compare", "--workdir"],
                                  ["stream", "--work"]])
def test_each_bench_refuses_a_foreign_workdir(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    home = tmp_path / "home"
    (home / "packed").mkdir(parents=True)       # a name a benchmark would delete, in a user's folder
    (home / "thesis.tex").write_text("precious")
    assert main(["bench", argv[0], argv[1], str(home)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"diskflow bench: error: {home}: holds 2 entries (packed, thesis.tex), "
                                               "not a diskflow benchmark work directory; refusing")
    assert (home / "thesis.tex").read_text() == "precious" and (home / "packed").is_dir()


def test_workdirs_are_marked_once_used_kept_when_ours_and_replaced_only_with_force(tmp_path: Path) -> None:
    new = tmp_path / "new"
    check_workdir(new)                  # missing: fine, and nothing is created yet
    mark_workdir(new)
    assert not new.exists()
    (new / "store").mkdir(parents=True)
    (new / "mine.txt").write_text("x")
    mark_workdir(new)
    assert (new / BENCH_MARKER).is_file()
    check_workdir(new)
    assert (new / "mine.txt").exists(), "marked: ours, whatever it holds"

    legacy = tmp_path / "legacy"       # from before the marker: only what benchmarks write
    for name in ("raw", "store", "packed", "packed.work", "runs"):
        (legacy / name).mkdir(parents=True)
    (legacy / "max-batch-rows-0123456789abcdef.json").write_text("{}")
    check_workdir(legacy)
    assert (legacy / "store").is_dir()

    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("precious")
    with pytest.raises(InputError, match="not a diskflow benchmark work directory"):
        check_workdir(home)
    assert (home / "thesis.tex").exists()
    check_workdir(home, force=True)
    assert not home.exists()


def test_a_bad_option_marks_nothing(tmp_path: Path) -> None:
    assert main(["bench", "prepare", "--cpu-fraction", "1.5", "--workdir", str(tmp_path)]) == 2
    assert not list(tmp_path.iterdir())
