"""The benchmarks delete and rewrite parts of their --workdir (raw/, store/, packed/, scratch/), so a
directory that is not a benchmark work directory is refused unless --force."""
from __future__ import annotations

from pathlib import Path

import pytest
from diskflow.bench.common import BENCH_MARKER, claim_workdir
from diskflow.flow.cli import main
from diskflow.operators.errors import InputError


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


def test_claim_workdir_marks_new_ones_keeps_its_own_and_replaces_only_with_force(tmp_path: Path) -> None:
    new = claim_workdir(tmp_path / "new")
    assert (new / BENCH_MARKER).is_file()
    (new / "store").mkdir()
    (new / "mine.txt").write_text("x")
    assert claim_workdir(new) == new and (new / "mine.txt").exists(), "marked: ours, whatever it holds"

    legacy = tmp_path / "legacy"       # from before the marker: only what benchmarks write
    for name in ("raw", "store", "packed", "packed.work", "runs"):
        (legacy / name).mkdir(parents=True)
    (legacy / "max-batch-rows-0123456789abcdef.json").write_text("{}")
    assert claim_workdir(legacy) == legacy and (legacy / BENCH_MARKER).is_file() and (legacy / "store").is_dir()

    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("precious")
    with pytest.raises(InputError, match="not a diskflow benchmark work directory"):
        claim_workdir(home)
    assert claim_workdir(home, force=True) == home
    assert sorted(p.name for p in home.iterdir()) == [BENCH_MARKER]
