"""Output directories: which ones a command may replace, and whether their disk has room.

Every command that writes a directory (synth, import, ingest, prepare and its ``.work``
cache, train's run directory, the benchmarks' work directories) asks `check_replaceable`
first: a missing path or an empty directory is fine, and so is a directory that is already
that command's kind of output (recognised by its manifest's ``format`` or by a marker
entry); anything else — a user's folder, a file, another kind of diskflow output — is
refused with one line naming the path and what is there, unless ``--force``.

`check_free_space` is the other half of "say when the disk is full": once a command knows
how many bytes it will write, it compares them with what the filesystems have free and
fails before writing, naming the path, the bytes needed and the bytes free.
"""
from __future__ import annotations

import fnmatch
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import DiskFullError, InputError
from .manifest import MANIFEST, read_manifest
from .sizes import format_bytes

__all__ = ["OutputKind", "check_free_space", "check_replaceable", "describe", "free_space", "replace_foreign"]

_SHOWN = 3   # entries named in a refusal


@dataclass(frozen=True)
class OutputKind:
    """What one command writes, and how to recognise it on disk.

    Attributes:
        what: the kind in words, with its article ("a diskflow store"), for messages.
        formats: manifest ``format`` values that mark it.
        markers: entry names whose presence marks it (for outputs without a manifest).
        patterns: `fnmatch` patterns; a directory whose every entry matches one is this kind
            (outputs written before they carried a marker).
    """

    what: str
    formats: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()
    patterns: tuple[str, ...] = field(default=())

    def owns(self, path: Path, manifest: Mapping[str, Any] | None, entries: list[str]) -> bool:
        """Whether the directory `path` (its manifest and entry names given) is this kind of output."""
        if manifest is not None and manifest.get("format") in self.formats:
            return True
        if any((path / m).exists() for m in self.markers):
            return True
        return bool(self.patterns) and bool(entries) and all(
            any(fnmatch.fnmatchcase(e, pat) for pat in self.patterns) for e in entries)


# Formats other commands write, so a refusal can say "is a diskflow store" rather than list files.
_KNOWN_FORMATS = {"diskflow-raw": "a diskflow raw dataset", "diskflow-store": "a diskflow store",
                  "diskflow-packed": "a diskflow packed dataset"}


def check_replaceable(out: str | os.PathLike[str], force: bool, kind: OutputKind) -> dict[str, Any] | None:
    """Refuse to replace `out` unless it is missing, empty or `kind`'s own output (or `force`).

    Writers build their output under a temporary name and swap it into place, so whatever
    `out` held is deleted: pointing ``--out`` at a home directory by mistake must fail, not
    delete it.

    Args:
        out: the output path a command is about to write (or replace).
        force: the user passed ``--force``: anything there may be replaced.
        kind: what the command writes.

    Returns:
        The manifest (``{}`` when it has none) when `out` already is `kind`'s output, so the
        caller can tell whether it is up to date; None when there is nothing of ours there
        (missing, empty, or anything at all with `force`).

    Raises:
        InputError: `out` holds something else, naming it and what is there.
    """
    p = Path(out)
    if not p.exists() and not p.is_symlink():
        return None
    refuse = "refusing to replace it (choose another path, or pass --force to replace it)"
    if not p.is_dir():
        if force:
            return None
        raise InputError(p, f"{'is a broken symlink' if not p.exists() else 'is a file'}, not {kind.what}; {refuse}")
    try:
        entries = sorted(e.name for e in os.scandir(p))
    except OSError as e:
        raise InputError(p, f"cannot list this directory ({e.strerror or e})") from e
    try:
        manifest = read_manifest(p)
        unreadable = False
    except InputError:
        manifest, unreadable = None, True
    if kind.owns(p, manifest, entries):
        return dict(manifest) if manifest is not None else {}
    if force or not entries:
        return None
    raise InputError(p, f"{describe(entries, manifest, unreadable)}, not {kind.what}; {refuse}")


def describe(entries: list[str], manifest: Mapping[str, Any] | None, unreadable: bool = False) -> str:
    """What a directory holds, in a few words: another diskflow output's kind, or its first entries."""
    if unreadable:
        return f"holds an unreadable {MANIFEST}"
    fmt = manifest.get("format") if manifest is not None else None
    if fmt is not None:
        return f"is {_KNOWN_FORMATS.get(str(fmt), f'a {fmt!s} output')}"
    shown = ", ".join(entries[:_SHOWN]) + (", ..." if len(entries) > _SHOWN else "")
    return f"holds {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} ({shown})"


def replace_foreign(path: str | os.PathLike[str], force: bool, kind: OutputKind) -> dict[str, Any] | None:
    """`check_replaceable`, then (with `force`) remove a foreign `path` so the caller starts from nothing.

    For writers that fill a directory in place (run and work directories) rather than swapping
    a finished one in: with ``--force`` what was there is deleted first, as a swap would.
    """
    mine = check_replaceable(path, force, kind)
    p = Path(path)
    if mine is not None or not force:
        return mine     # ours, or missing/empty (a foreign one was refused above)
    if p.is_dir() and not p.is_symlink():
        if any(p.iterdir()):
            shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()
    return None


# ---------------------------------------------------------------------------- free space

def _existing(path: Path) -> Path:
    """`path` or its nearest existing ancestor (what a not-yet-created output's filesystem is)."""
    p = path.absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def free_space(path: str | os.PathLike[str]) -> int:
    """Bytes free on the filesystem that holds `path` (created or not yet)."""
    return int(shutil.disk_usage(_existing(Path(path))).free)


def check_free_space(needs: Mapping[str | os.PathLike[str], int],
                     free_of: Callable[[str], int] | None = None) -> None:
    """Fail before writing when the filesystems lack room for what a command will write.

    Args:
        needs: bytes about to be written, per output path (created or not yet). Paths on the
            same filesystem are added up.
        free_of: bytes free on the filesystem of a directory (default `shutil.disk_usage`);
            for tests.

    Raises:
        DiskFullError: naming the (first) path whose filesystem is short, the bytes needed
            and the bytes free.
    """
    free_of = free_of or (lambda d: shutil.disk_usage(d).free)
    by_fs: dict[int, list[tuple[Path, int]]] = {}
    for path, nbytes in needs.items():
        if nbytes <= 0:
            continue
        anchor = _existing(Path(path))
        by_fs.setdefault(anchor.stat().st_dev, []).append((Path(path), int(nbytes)))
    for items in by_fs.values():
        total = sum(n for _, n in items)
        first = items[0][0]
        free = int(free_of(str(_existing(first))))
        if total > free:
            names = " and ".join(str(p) for p, _ in items)
            raise DiskFullError(first, f"not enough free space: {format_bytes(total)} ({total:,} bytes) to write "
                                       f"{'there' if len(items) == 1 else f'to {names}'}, {format_bytes(free)} "
                                       f"({free:,} bytes) free on its filesystem", needed=total, free=free)
