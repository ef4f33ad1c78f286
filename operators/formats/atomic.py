"""Writing so that a crash or a full disk never leaves a file that looks valid: temporary name, rename
into place.

Every file is written under a temporary sibling name (`tmp_name`, same filesystem, so the rename is
atomic) and renamed onto its final name only once complete (`atomic_path`); a whole output directory
is built under a temporary sibling and swapped into place (`staging_dir`). A directory is valid only
once its manifest is written, last (`manifest.write_manifest`).

A full disk (ENOSPC) met while writing through `atomic_path` or `staging_dir` leaves nothing under the
final name and is raised as `DiskFullError` naming that final name, which the CLI prints as one line;
`preallocate` reserves a file's blocks up front so a full disk fails there, not as a SIGBUS later.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import DiskFullError, InputError, is_disk_full

__all__ = ["atomic_path", "json_default", "preallocate", "raise_if_disk_full", "remove_path", "staging_dir",
           "tmp_name", "write_bytes", "write_json"]


def tmp_name(path: str | os.PathLike[str]) -> Path:
    """A unique temporary sibling of `path` (same filesystem, so rename is atomic)."""
    p = Path(path)
    return p.with_name(f".{p.name}.tmp-{uuid.uuid4().hex[:12]}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], durable: bool = True, parents: bool = True) -> Iterator[Path]:
    """Yield a temporary path to write; on success it is fsynced and renamed onto `path`.

    `durable=False` skips the fsync, for scratch files that live and die within one run (the
    rename still keeps a half-written file from ever carrying the final name).
    `parents=False` does not create the parent directory: a Dask task that outlives its failed
    run then fails instead of resurrecting the directory the run has just cleaned up.
    """
    final = Path(path)
    if parents:
        final.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(final)
    try:
        yield tmp
        if durable and tmp.is_file():
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException as e:
        with contextlib.suppress(FileNotFoundError):
            if tmp.is_dir():
                shutil.rmtree(tmp)
            else:
                tmp.unlink()
        raise_if_disk_full(e, final)
        raise


def write_json(path: str | os.PathLike[str], obj: Any, durable: bool = True) -> None:
    """Write JSON atomically (sorted keys, so identical content gives identical bytes); `durable`: see `atomic_path`."""
    with atomic_path(path, durable) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=json_default) + "\n")


def write_bytes(path: str | os.PathLike[str], data: Any, durable: bool = True, parents: bool = True) -> None:
    """Write a buffer (bytes, a uint8 array, an Arrow buffer) to `path` atomically; `durable`, `parents`: see
    `atomic_path`."""
    with atomic_path(path, durable, parents) as tmp, open(tmp, "wb") as f:
        f.write(memoryview(data))


def json_default(o: Any) -> Any:
    """`json.dumps`'s ``default`` for what configs and manifests hold besides JSON's own types: NumPy
    scalars and arrays, paths (`write_json`, and `hashing.config_hash`, which must agree with it)."""
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


@contextlib.contextmanager
def staging_dir(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Build a whole output directory under a temporary sibling, then swap it into place.

    The caller writes everything (manifest last) into the yielded directory. On success
    the old `final` (if any) is moved aside and removed; on failure the staging
    directory is deleted and `final` is left untouched. Whether `final` may be replaced
    at all is the caller's question (`outputs.check_replaceable`), asked before this.
    """
    final_p = Path(final)
    try:
        final_p.parent.mkdir(parents=True, exist_ok=True)
        stage = tmp_name(final_p)
        stage.mkdir()
    except OSError as e:
        raise_if_disk_full(e, final_p)
        raise InputError(final_p.parent, f"cannot create the output here ({e.strerror or e})") from e
    try:
        yield stage
    except BaseException as e:
        shutil.rmtree(stage, ignore_errors=True)
        raise_if_disk_full(e, final_p)
        raise
    trash = None
    if final_p.exists() or final_p.is_symlink():
        trash = tmp_name(final_p)
        os.replace(final_p, trash)
    os.replace(stage, final_p)
    if trash is not None:
        remove_path(trash)


def remove_path(path: str | os.PathLike[str]) -> None:
    """Remove a file, a symlink or a directory tree, whichever `path` is (missing is fine)."""
    p = Path(path)
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def raise_if_disk_full(exc: BaseException, path: str | os.PathLike[str]) -> None:
    """If `exc` means a full disk, raise it again as one `DiskFullError` naming `path`; else return.

    Each layer that writes names its own path, so the outermost one the user knows wins:
    `atomic_path` names the file, `staging_dir` the output directory (the temporary names
    inside are gone by then). A free-space check's error (bytes needed and free known) is
    left as it is.
    """
    if isinstance(exc, DiskFullError) and exc.needed is not None:
        return
    if is_disk_full(exc):
        raise DiskFullError(path, "no space left on device; nothing was published there (free some space, "
                                  "or choose another filesystem)") from exc


def preallocate(fd: int, nbytes: int) -> None:
    """Reserve `nbytes` of disk for the open file `fd` (zero-filled), so a full disk fails here.

    A sparse file that is later filled through a memory map gets SIGBUS, not ENOSPC, when the
    disk runs out (the worker process dies without a word); reserving the blocks up front turns
    that into an `OSError` at allocation time. Filesystems that cannot reserve fall back to a
    sparse size (as before).
    """
    if nbytes <= 0:
        return
    try:
        os.posix_fallocate(fd, 0, nbytes)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, nbytes)
    except AttributeError:      # no posix_fallocate on this platform
        os.ftruncate(fd, nbytes)
