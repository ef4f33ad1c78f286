"""A full disk ends `prepare` and `ingest` in one line naming the path, exit status 2, and nothing
left that looks valid: on a real 20 MiB tmpfs, through the CLI (an embedded LocalCluster, so the
ENOSPC happens inside a task on a worker process and is shipped back), and in-process for the
packing phase. The free-space check fails before anything big is written, naming bytes needed
and free.
"""
from __future__ import annotations

import re
from pathlib import Path

import dask
import pytest
from diskflow.cli import main
from diskflow.flow.prepare import PrepareConfig, prepare

from diskflow.errors import DiskFullError

# A round of samples and plans (~1.7 MB) and packed segments (~5 MB): with 3.5 MiB left free, the first fit and
# the second do not.
ROUND = ["--fanouts", "4,3", "--batch-size", "64", "--superbatch-size", "4", "--epochs", "2",
         "--cpu-memory", "3MiB", "--workers", "1", "--readahead", "0"]
CFG = PrepareConfig(fanouts=(4, 3), batch_size=64, superbatch_size=4, epochs=8, cpu_memory=int(1.0 * 2**20),
                    readahead=0)


def _one_error_line(err: str, command: str) -> str:
    """The stderr of a failed command: its one error line (the dashboard link aside), nothing else."""
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith(("Dask dashboard:", "diskflow page:"))]
    assert len(lines) == 1, f"expected one line, got:\n{err}"
    assert lines[0].startswith(f"diskflow {command}: error: ")
    assert "Traceback" not in err and "AssertionError" not in err
    return lines[0]


def _leftovers(root: Path) -> list[str]:
    """What is left on the disk besides the filler."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.name != "filler.bin")


def test_prepare_on_a_full_disk_fails_in_one_line(tiny_store: Path, small_disk, capfd: pytest.CaptureFixture) -> None:
    small_disk.fill(leave=16 << 10)     # the first samples file does not fit
    out = small_disk.root / "packed"
    assert main(["prepare", "belady", "--dataset", str(tiny_store), "--out", str(out), *ROUND]) == 2
    line = _one_error_line(capfd.readouterr().err, "prepare")
    assert f"{out}.work: no space left on device" in line
    assert not small_disk.manifests(), "nothing looks valid"
    assert _leftovers(small_disk.root) == [], "the cache this run created is removed again"


def test_prepare_checks_free_space_before_packing(tiny_store: Path, small_disk, capfd: pytest.CaptureFixture) -> None:
    small_disk.fill(leave=7 << 19)
    out = small_disk.root / "packed"
    assert main(["prepare", "belady", "--dataset", str(tiny_store), "--out", str(out), *ROUND]) == 2
    line = _one_error_line(capfd.readouterr().err, "prepare")
    m = re.search(r": not enough free space: .* \(([\d,]+) bytes\) to write there, .* \(([\d,]+) bytes\) free", line)
    assert m and line.startswith(f"diskflow prepare: error: {out}: "), line
    needed, free = (int(g.replace(",", "")) for g in m.groups())
    assert needed > free > 0 and needed > 7 << 19
    assert not out.exists() and not list(small_disk.root.glob(".packed.tmp-*")), "no staging directory"
    # the finished samples and plans stay as a cache (manifest inside the .work dir only) for a re-run
    assert all(p.parent.parent.name == "packed.work" for p in small_disk.manifests())


def test_enospc_while_packing_leaves_nothing_valid(tiny_store: Path, small_disk, monkeypatch: pytest.MonkeyPatch
                                                    ) -> None:
    """With the free-space check out of the way, the packing tasks themselves meet ENOSPC."""
    import diskflow.flow.prepare.phases as prep

    monkeypatch.setattr(prep, "check_free_space", lambda needs: None)
    monkeypatch.setattr(prep, "_check_room", lambda out, nbytes: None)
    out = small_disk.root / "packed"
    with dask.config.set(scheduler="sync"), pytest.raises(DiskFullError) as e:
        prepare(tiny_store, out, CFG, quiet=True)
    assert e.value.path == str(out) and "no space left on device" in str(e.value)
    assert not out.exists() and not list(small_disk.root.glob(".packed.tmp-*"))
    assert all(p.parent.parent.name == "packed.work" for p in small_disk.manifests())
    assert not (small_disk.root / "packed.work" / "route").exists()


def _ingest(raw: Path, out: Path) -> int:
    return main(["ingest", str(raw), str(out), "--workers", "1"])


def test_ingest_on_a_full_disk_fails_in_one_line(tiny_raw: Path, small_disk, capfd: pytest.CaptureFixture) -> None:
    small_disk.fill(leave=16 << 10)     # not even the labels fit
    out = small_disk.root / "store"
    assert _ingest(tiny_raw, out) == 2
    line = _one_error_line(capfd.readouterr().err, "ingest")
    assert f"{out}: no space left on device" in line
    assert _leftovers(small_disk.root) == [], "the staging directory is gone"


def test_ingest_checks_free_space_once_the_scans_know_the_bytes(tiny_raw: Path, small_disk,
                                                                capfd: pytest.CaptureFixture) -> None:
    small_disk.fill(leave=600 << 10)    # the scans' spills fit, the 773 KB of feature shards do not
    out = small_disk.root / "store"
    assert _ingest(tiny_raw, out) == 2
    line = _one_error_line(capfd.readouterr().err, "ingest")
    assert line.startswith(f"diskflow ingest: error: {out}: not enough free space: "), line
    assert "bytes) to write there" in line and "bytes) free on its filesystem" in line
    assert _leftovers(small_disk.root) == []
    # with room, the same command works and publishes a store
    (small_disk.root / "filler.bin").unlink()
    assert _ingest(tiny_raw, out) == 0
    assert small_disk.manifests() == [out / "manifest.json"]
