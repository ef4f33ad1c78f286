"""Where a path lives: its file system's type, and whether `/proc/<pid>/io` counts the reads served from it.

``read_bytes`` of ``/proc/<pid>/io`` counts the bytes a process caused to be fetched from a block device. A
file system in memory (tmpfs, ramfs: e.g. ``TMPDIR=/dev/shm/...``) has none, so it reads 0 there however much
is read; a test that asserts disk traffic skips there, saying so.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

IN_MEMORY = ("tmpfs", "ramfs")


def fs_type(path: str | os.PathLike[str]) -> str:
    """The type of the file system holding `path` (the longest mount point above it in mountinfo)."""
    best, kind = "", "?"
    real = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            mount = fields[4]
            if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, kind = mount, fields[fields.index("-") + 1]
    return kind


def reads_are_counted(path: str | os.PathLike[str]) -> bool:
    """Whether reads from `path` reach a block device, so that ``/proc/<pid>/io`` read_bytes counts them."""
    return fs_type(path) not in IN_MEMORY


def skip_where_reads_are_not_counted(path: str | os.PathLike[str]) -> None:
    """Skip the test where `path` is on a file system in memory (its disk traffic reads 0 there)."""
    if not reads_are_counted(path):
        pytest.skip(f"{Path(path)} is on {fs_type(path)}: /proc/<pid>/io read_bytes counts no read from it "
                    "because no block device serves it")
