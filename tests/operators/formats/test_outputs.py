"""Output directories (`operators/outputs.py`) and the full-disk error path of `operators/formats/atomic.py`.

What may be replaced (missing, empty, our own kind, or anything with force), what a refusal
says, the free-space check, and ENOSPC turned into one `DiskFullError` naming the final path
with nothing left under it — on a real full filesystem (a small tmpfs) where it matters.
"""
from __future__ import annotations

import errno
import json
import pickle
from pathlib import Path

import numpy as np
import pytest
from diskflow.operators.formats.atomic import atomic_path, staging_dir, write_bytes
from diskflow.operators.formats.manifest import write_manifest
from diskflow.operators.formats.npyio import create_aligned_npy
from diskflow.operators.formats.outputs import (
    OutputKind,
    check_free_space,
    check_replaceable,
    replace_foreign,
)

from diskflow.errors import DiskFullError, InputError, is_disk_full

KIND = OutputKind("a diskflow thing", formats=("diskflow-thing",))
MARKED = OutputKind("a diskflow marked thing", markers=(".mark",), patterns=("cache-*", "route"))


def test_missing_empty_and_own_outputs_are_replaceable(tmp_path: Path) -> None:
    assert check_replaceable(tmp_path / "nope", False, KIND) is None
    (tmp_path / "empty").mkdir()
    assert check_replaceable(tmp_path / "empty", False, KIND) is None
    write_manifest(tmp_path / "mine", {"format": "diskflow-thing", "n": 3})
    assert check_replaceable(tmp_path / "mine", False, KIND) == {"format": "diskflow-thing", "n": 3}


def test_a_foreign_directory_is_refused_naming_it_and_what_it_holds(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    for name in ("thesis.tex", "a.txt", "b.txt", "c.txt"):
        (home / name).write_text("precious")
    with pytest.raises(InputError) as e:
        check_replaceable(home, False, KIND)
    msg = str(e.value)
    assert msg.startswith(f"{home}: holds 4 entries (a.txt, b.txt, c.txt, ...), not a diskflow thing")
    assert "--force" in msg and "\n" not in msg
    assert check_replaceable(home, True, KIND) is None      # force: the caller may replace it
    assert (home / "thesis.tex").read_text() == "precious"  # checking never deletes


def test_other_diskflow_outputs_files_and_bad_manifests_are_named(tmp_path: Path) -> None:
    write_manifest(tmp_path / "store", {"format": "diskflow-store"})
    with pytest.raises(InputError, match="is a diskflow store, not a diskflow thing"):
        check_replaceable(tmp_path / "store", False, KIND)
    (tmp_path / "f").write_text("x")
    with pytest.raises(InputError, match="is a file, not a diskflow thing"):
        check_replaceable(tmp_path / "f", False, KIND)
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "manifest.json").write_text("{not json")
    with pytest.raises(InputError, match="holds an unreadable manifest.json, not a diskflow thing"):
        check_replaceable(tmp_path / "bad", False, KIND)


def test_markers_and_entry_patterns_recognise_outputs_without_a_manifest(tmp_path: Path) -> None:
    marked = tmp_path / "marked"
    marked.mkdir()
    (marked / ".mark").write_text("{}")
    (marked / "anything").write_text("x")
    assert check_replaceable(marked, False, MARKED) == {}
    legacy = tmp_path / "legacy"
    (legacy / "cache-1").mkdir(parents=True)
    (legacy / "route").mkdir()
    assert check_replaceable(legacy, False, MARKED) == {}
    (legacy / "notes.txt").write_text("mine")       # one entry the kind never writes: not ours
    with pytest.raises(InputError, match="holds 3 entries"):
        check_replaceable(legacy, False, MARKED)


def test_replace_foreign_deletes_only_with_force(tmp_path: Path) -> None:
    d = tmp_path / "d"
    d.mkdir()
    (d / "x").write_text("x")
    with pytest.raises(InputError):
        replace_foreign(d, False, KIND)
    assert (d / "x").exists()
    assert replace_foreign(d, True, KIND) is None and not d.exists()
    (tmp_path / "f").write_text("x")
    replace_foreign(tmp_path / "f", True, KIND)
    assert not (tmp_path / "f").exists()
    (tmp_path / "empty").mkdir()
    for force in (False, True):
        assert replace_foreign(tmp_path / "empty", force, KIND) is None
        assert (tmp_path / "empty").is_dir(), "an empty directory is used as it is"


def test_staging_dir_replaces_a_file_with_force_and_leaves_no_trash(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("a file the user forced over")
    with staging_dir(tmp_path / "out") as stage:
        write_manifest(stage, {"format": "diskflow-thing"})
    assert (tmp_path / "out" / "manifest.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# ---------------------------------------------------------------------------- free space

def test_free_space_check_names_path_bytes_needed_and_free(tmp_path: Path) -> None:
    check_free_space({tmp_path / "out": 1000}, free_of=lambda d: 1000)        # exactly fits
    with pytest.raises(DiskFullError) as e:
        check_free_space({tmp_path / "out": 5 << 20, tmp_path / "out.work": 1 << 20}, free_of=lambda d: 3 << 20)
    err = e.value
    assert err.path == str(tmp_path / "out") and err.needed == 6 << 20 and err.free == 3 << 20
    assert "6.00 MiB (6,291,456 bytes)" in str(err) and "3.00 MiB (3,145,728 bytes) free" in str(err)
    assert str(tmp_path / "out.work") in str(err), "both paths on the one filesystem are named"
    again = pickle.loads(pickle.dumps(err))   # as Dask ships it back from a worker
    assert (again.path, again.needed, again.free, str(again)) == (err.path, err.needed, err.free, str(err))


def test_free_space_check_on_a_real_small_disk(small_disk) -> None:
    out = small_disk.root / "deep" / "out"        # not created yet: its nearest existing parent decides
    check_free_space({out: 1 << 20})
    with pytest.raises(DiskFullError, match=r"not enough free space: 64\.00 MiB"):
        check_free_space({out: 64 << 20})
    assert not out.parent.exists()


# ---------------------------------------------------------------------------- ENOSPC

@pytest.mark.parametrize("exc", [
    OSError(errno.ENOSPC, "No space left on device"),
    OSError(errno.EDQUOT, "Disk quota exceeded"),
    OSError("Error writing bytes to file. Detail: [errno 28] No space left on device"),   # pyarrow, no errno
    OSError("20000 requested and 9712 written"),                                           # numpy tofile
    DiskFullError("x"),
])
def test_full_disk_errors_are_recognised(exc: BaseException) -> None:
    assert is_disk_full(exc)
    try:
        try:
            raise exc
        except BaseException as inner:
            raise RuntimeError("a task failed") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer), "found through __cause__"


@pytest.mark.parametrize("exc", [OSError(errno.EACCES, "Permission denied"), ValueError("no space"),
                                 OSError("10 requested")])
def test_other_errors_are_not_a_full_disk(exc: BaseException) -> None:
    assert not is_disk_full(exc)


def test_enospc_in_atomic_path_names_the_final_file_and_leaves_nothing(small_disk) -> None:
    small_disk.fill(leave=64 << 10)
    target = small_disk.root / "out.bin"
    with pytest.raises(DiskFullError) as e:
        write_bytes(target, np.zeros(1 << 20, np.uint8))
    assert e.value.path == str(target) and "no space left on device" in str(e.value)
    assert sorted(p.name for p in small_disk.root.iterdir()) == ["filler.bin"], "no temp file left"


def test_enospc_in_staging_dir_names_the_output_and_keeps_the_old_one(small_disk) -> None:
    out = small_disk.root / "out"
    write_manifest(out, {"format": "diskflow-thing", "old": True})
    small_disk.fill(leave=64 << 10)
    with pytest.raises(DiskFullError) as e, staging_dir(out) as stage:
        with atomic_path(stage / "big.bin") as tmp:
            tmp.write_bytes(b"\1" * (1 << 20))
        write_manifest(stage, {"format": "diskflow-thing", "old": False})
    assert e.value.path == str(out)
    assert json.loads((out / "manifest.json").read_text())["old"] is True, "the previous output is untouched"
    assert sorted(p.name for p in small_disk.root.iterdir()) == ["filler.bin", "out"], "the staging dir is gone"


def test_aligned_arrays_reserve_their_blocks_so_a_full_disk_fails_at_creation(small_disk) -> None:
    # Filled through a memory map, a sparse file would raise SIGBUS (the process dies) on a full
    # disk; reserving the blocks first makes it an ordinary ENOSPC here.
    small_disk.fill(leave=1 << 20)
    with pytest.raises(OSError) as e:
        create_aligned_npy(small_disk.root / "big.npy", np.float32, (4 << 20,))
    assert e.value.errno == errno.ENOSPC
    assert not (small_disk.root / "big.npy").exists()
    mm = create_aligned_npy(small_disk.root / "small.npy", np.float32, (1000,))
    mm[:] = 1.5
    mm.flush()
    del mm
    assert np.load(small_disk.root / "small.npy").sum() == 1500.0
