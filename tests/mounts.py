"""Where a path lives: its file system's type, and whether `/proc/<pid>/io` counts the I/O to and from it.

``read_bytes`` and ``write_bytes`` of ``/proc/<pid>/io`` count the bytes a process caused to be fetched from or
sent to a block device. A file system in memory (tmpfs, ramfs: e.g. ``TMPDIR=/dev/shm/...``) has none, so they
read 0 there however much is read or written, and its pages are the files themselves (never evicted, always
"cached"). A test that asserts disk traffic or page-cache residency skips there, saying so.
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
        pytest.skip(f"{Path(path)} is on {fs_type(path)}: /proc/<pid>/io counts no read from or write to it "
                    "because no block device serves it")


def skip_where_in_memory(path: str | os.PathLike[str], checks: str) -> None:
    """Skip a test of `checks` (e.g. "page-cache residency") where `path` is on a file system in memory."""
    if not reads_are_counted(path):
        pytest.skip(f"{Path(path)} is on {fs_type(path)}: {checks} means nothing there because its pages "
                    "are the files themselves")
