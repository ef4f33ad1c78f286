"""Shipping: a bundle lands on the training machine's scratch disk, verified, within a byte quota.

`stage_bundle` writes a bundle's files (from its inline content, or copied from its fsspec URL)
into a staging directory next to the destination, checks every file's crc32 (of the bytes as
they arrived) and size on disk against the producer's, links the base tier files in, writes the
manifest last and only then renames the directory into place (the loader checks every packed
segment's own crc again when it reads it from disk): a superbatch directory either is complete and
verified, or does not exist. A mismatch raises `ShipVerifyError` naming the superbatch and the
file (the driver re-ships once, then stops).

A superbatch's index and samples (`held_files`) are verified the same way but held in memory
instead of written, while they fit the scratch space's memory budget (`ScratchSpace.try_hold`):
the loader reads them whole and exactly once, so a trip through the scratch disk (write, read
back, delete: three passes over some 18 MiB per superbatch of the bench's graph on the GPU
machine's cores) buys nothing. Only the packed segments, which the loader reads with direct I/O,
and the base tiers, memory-mapped by every superbatch, always go to disk; a superbatch whose
index and samples would take the held bytes over the budget stages them on disk as well.

`ScratchSpace` is the scratch disk's bookkeeping: bytes staged per run, the peak, and the quota
that staging must not exceed (exceeding it is an error, not a slowdown); and the bytes held in
memory instead, within their budget. A consumed superbatch is
handed to `ScratchSpace.discard`: renamed aside at once and deleted by a background thread, so the
trainer goes on with the next superbatch instead of waiting for the file system to unlink (on a
busy disk, or one mounted with ``discard``, that takes milliseconds per file). Its bytes stay
accounted until they are really gone, and the next `reserve` waits for pending deletions first,
so the quota and the window bound what is on disk exactly as a synchronous delete would.
"""
from __future__ import annotations

import itertools
import os
import shutil
import threading
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError, InputError
from ..formats.atomic import staging_dir
from ..formats.checksum import crc32
from ..formats.manifest import write_manifest
from ..formats.packed import ROUND_DIR
from ..formats.sizes import format_bytes
from .pack import BASE_FILES, Bundle

__all__ = ["CACHE_CHUNK", "COPY_CHUNK", "ScratchSpace", "ShipVerifyError", "disk_bytes", "drop_source",
           "held_files", "stage_bundle"]

COPY_CHUNK = 16 << 20
CACHE_CHUNK = 256 << 10     # inline files are checksummed and written in pieces that stay in the core's cache


class ShipVerifyError(InputError):
    """A shipped file arrived with the wrong size or checksum (names the superbatch and the file)."""


class ScratchSpace:
    """Bytes staged on a scratch disk, per run, against an optional quota (thread-safe).

    Args:
        root: the scratch directory (created if missing; must be writable).
        quota: bytes that staged bundles may take at once; None: no limit.
        hold_memory: bytes of index and samples that staged superbatches may hold in memory
            instead of on disk (`try_hold`); 0: none.
    """

    def __init__(self, root: str | os.PathLike[str], quota: int | None = None, hold_memory: int = 0) -> None:
        self.root = Path(root)
        if quota is not None and quota <= 0:
            raise ConfigError("quota", f"must be > 0 bytes, got {quota}")
        if hold_memory < 0:
            raise ConfigError("hold_memory", f"must be >= 0 bytes, got {hold_memory}")
        self.quota = quota
        self.hold_memory = hold_memory
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as e:
            raise InputError(self.root, f"scratch directory is not writable ({e.strerror or e})") from e
        self._lock = threading.Lock()
        self._deleted = threading.Condition(self._lock)     # notified when a pending deletion is done
        self._pending = 0
        self._seq = itertools.count()
        self.used = 0
        self.peak = 0
        self.peak_disk = 0
        self.peak_staged = 0
        self._held: dict[str, int] = {}
        self.memory = 0                 # bytes held in memory now (`try_hold`), and their peak
        self.peak_memory = 0
        self._memory: dict[str, int] = {}

    def reserve(self, name: str, nbytes: int) -> None:
        """Account `nbytes` for `name` before writing it; over the quota is a ConfigError naming it.

        Waits for pending deletions (`discard`) first: their bytes still count until they are gone.
        """
        with self._lock:
            while self._pending:
                self._deleted.wait()
            if self.quota is not None and self.used + nbytes > self.quota:
                raise ConfigError("quota", (
                    f"staging {name} ({format_bytes(nbytes)}) would take the scratch directory {self.root} to "
                    f"{format_bytes(self.used + nbytes)}, above its quota of {format_bytes(self.quota)} "
                    f"({len(self._held)} staged now); lower window or superbatch_size, or raise the quota"))
            self._held[name] = self._held.get(name, 0) + nbytes
            self.used += nbytes
            self.peak = max(self.peak, self.used)
            self.peak_staged = max(self.peak_staged, len(self._held))

    def try_hold(self, name: str, nbytes: int) -> bool:
        """Account `nbytes` of `name` as held in memory if they fit the budget; False (nothing
        accounted) if they do not, and the caller writes them to disk instead."""
        with self._lock:
            if self.memory + nbytes > self.hold_memory:
                return False
            self._memory[name] = self._memory.get(name, 0) + nbytes
            self.memory += nbytes
            self.peak_memory = max(self.peak_memory, self.memory)
            return True

    def release(self, name: str) -> None:
        """Give back what `name` held (after its files were deleted), on disk and in memory."""
        with self._lock:
            self.used -= self._held.pop(name, 0)
            self.memory -= self._memory.pop(name, 0)

    def discard(self, name: str, path: str | os.PathLike[str]) -> None:
        """Delete `name`'s directory `path` in the background, then give back what it held.

        The directory is renamed aside (a hidden sibling) before this returns, so its name is free
        at once; its bytes count against the quota until the deletion has finished. What it held
        in memory is given back at once (its consumer is done with it).
        """
        with self._lock:
            self.memory -= self._memory.pop(name, 0)
        path = Path(path)
        aside = path.with_name(f".{path.name}.deleting-{next(self._seq)}")
        try:
            path.rename(aside)
        except FileNotFoundError:
            self.release(name)
            return
        with self._lock:
            self._pending += 1
        threading.Thread(target=self._delete, args=(name, aside), name=f"diskflow-discard-{name}", daemon=True).start()

    def _delete(self, name: str, path: Path) -> None:
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            with self._lock:
                self.used -= self._held.pop(name, 0)
                self._pending -= 1
                self._deleted.notify_all()

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every `discard` has finished deleting; False if `timeout` seconds passed first."""
        with self._lock:
            return self._deleted.wait_for(lambda: not self._pending, timeout)

    def observe(self, path: str | os.PathLike[str] | None = None) -> int:
        """Bytes really on disk under `path` (default: the root); the peak of these is kept too."""
        total = disk_bytes(path if path is not None else self.root)
        with self._lock:
            self.peak_disk = max(self.peak_disk, total)
        return total

    def usage(self) -> dict[str, Any]:
        with self._lock:
            return {"root": str(self.root), "quota": self.quota, "used": self.used, "peak": self.peak,
                    "peak_disk": self.peak_disk, "peak_staged": self.peak_staged, "staged": sorted(self._held),
                    "deleting": self._pending, "hold_memory": self.hold_memory, "memory": self.memory,
                    "peak_memory": self.peak_memory}


def disk_bytes(path: str | os.PathLike[str]) -> int:
    """Sum of the sizes of the distinct files under `path` (hard links counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for dirpath, _, names in os.walk(path):
        for n in names:
            try:
                st = os.lstat(os.path.join(dirpath, n))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def held_files(bundle: Bundle) -> list[str]:
    """The files of `bundle` the training machine may hold in memory rather than on its scratch
    disk (`ScratchSpace.try_hold`): a superbatch's index and samples (read whole and once)."""
    heads = [f"{sub}{ROUND_DIR}/{kind}/" for sub in ["", *(f"{name}/" for name in bundle.nested)]
             for kind in ("index", "samples")]
    return [rel for rel in bundle.sizes if rel.startswith(tuple(heads))]


def _content(bundle: Bundle, rel: str) -> np.ndarray:
    """One file of the bundle in memory, as it arrived (inline: no copy; URL: read whole)."""
    if bundle.data is not None:
        return bundle.data[rel].reshape(-1).view(np.uint8)
    if bundle.url is None:
        raise ValueError(f"bundle {bundle.key} carries neither data nor a url")
    import fsspec

    fs, root = fsspec.core.url_to_fs(bundle.url)
    try:
        return np.frombuffer(fs.cat_file(f"{root.rstrip('/')}/{rel}"), np.uint8)
    except FileNotFoundError as e:
        raise ShipVerifyError(f"{bundle.url}/{rel}", f"superbatch {bundle.key}: file missing at the source") from e


def _check(bundle: Bundle, rel: str, where: Path, size: int, crc: int) -> None:
    """A file that arrived with another size or crc32 than the producer's is a ShipVerifyError naming it."""
    if size != bundle.sizes[rel]:
        raise ShipVerifyError(where, f"superbatch {bundle.key}: arrived with {size} bytes, the producer wrote "
                                     f"{bundle.sizes[rel]}")
    if crc != bundle.crcs[rel]:
        raise ShipVerifyError(where, f"superbatch {bundle.key}: checksum mismatch on arrival (crc32 {crc:#010x}, "
                                     f"the producer's {bundle.crcs[rel]:#010x})")


def _write(bundle: Bundle, rel: str, dest: Path) -> int:
    """Write one file of the bundle to `dest`; return the crc32 of the bytes as they arrived."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if bundle.data is not None:
        data = bundle.data[rel].reshape(-1).view(np.uint8).data
        crc = 0
        with open(dest, "wb") as f:     # checksum and write each chunk while it is in the cache: one pass
            for start in range(0, len(data), CACHE_CHUNK):
                chunk = data[start:start + CACHE_CHUNK]
                crc = crc32(chunk, crc)
                f.write(chunk)
        return crc
    if bundle.url is None:
        raise ValueError(f"bundle {bundle.key} carries neither data nor a url")
    import fsspec

    fs, root = fsspec.core.url_to_fs(bundle.url)
    src = f"{root.rstrip('/')}/{rel}"
    crc = 0
    try:
        with fs.open(src, "rb") as fin, open(dest, "wb") as fout:
            while chunk := fin.read(COPY_CHUNK):
                crc = crc32(chunk, crc)
                fout.write(chunk)
    except FileNotFoundError as e:
        raise ShipVerifyError(f"{bundle.url}/{rel}", f"superbatch {bundle.key}: file missing at the source") from e
    return crc


def _start_writeback(path: Path) -> None:
    """Hand a staged file read only with direct I/O to the kernel's writeback at once (POSIX_FADV_DONTNEED).

    Its dirty pages start going to disk and its clean ones leave the page cache: the loader's direct
    reads then find the bytes on disk instead of waiting for their writeback, and the staged
    segments take no page cache meanwhile (memory the GPU machine's budget pays for).
    """
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:     # a file system without it: the reads wait for the writeback instead
        pass
    finally:
        os.close(fd)


def stage_bundle(bundle: Bundle, dest: str | os.PathLike[str], base: str | os.PathLike[str] | None = None,
                 hold: Collection[str] = ()) -> dict[str, Any]:
    """Write `bundle` to directory `dest`, verified, manifest last, swapped into place atomically.

    Args:
        bundle: the files (inline or at a URL) with their sizes and crc32s.
        dest: the final directory (replaced if it exists).
        base: a directory holding the base tier files (`BASE_FILES`) to hard-link in (copied
            when links are not possible), so `dest` is a complete packed dataset; and those of each
            nested dataset (`Bundle.nested`, the edge rows') in its subdirectory of `base`.
        hold: files to verify and hold in memory instead of writing them (`held_files`); the
            loader gets them as ``held``.

    Returns:
        ``{"key", "dir", "bytes"}`` (all of the bundle's bytes), ``"held"`` (relative path ->
        content of the held files) and ``"held_bytes"`` (their size).

    Raises:
        ShipVerifyError: a file's size or crc32 differs from the producer's (nothing is left at `dest`).
    """
    dest = Path(dest)
    direct = {f["path"] for f in (bundle.manifest or {}).get("files", {}).get("parts", [])}
    direct |= {f"{name}/{f['path']}" for name, m in bundle.nested.items() for f in m.get("files", {}).get("parts", [])}
    held: dict[str, np.ndarray] = {}
    for rel in hold:
        data = _content(bundle, rel)
        _check(bundle, rel, dest / rel, data.size, crc32(data.data))
        held[rel] = data
    with staging_dir(dest) as stage:
        for rel in bundle.sizes:
            if rel in held:
                continue
            path = stage / rel
            crc = _write(bundle, rel, path)
            _check(bundle, rel, dest / rel, path.stat().st_size, crc)
            if rel in direct and bundle.sizes[rel]:
                _start_writeback(path)
        if base is not None:
            for sub in ["", *bundle.nested]:
                for name in BASE_FILES:
                    src = Path(base) / sub / name
                    if sub and not src.exists():     # (a table of rows alone has no labels)
                        continue
                    try:
                        os.link(src, stage / sub / name)
                    except OSError:
                        shutil.copyfile(src, stage / sub / name)
        # no fsync: a staged superbatch never outlives its run on this worker; nested datasets' manifests first
        for sub, manifest in sorted(bundle.nested.items(), key=lambda kv: -kv[0].count("/")):
            write_manifest(stage / sub, manifest, durable=False)
        if bundle.manifest is not None:
            write_manifest(stage, bundle.manifest, durable=False)
    return {"key": bundle.key, "dir": str(dest), "bytes": bundle.nbytes, "held": held,
            "held_bytes": sum(bundle.sizes[rel] for rel in held)}


def drop_source(bundle: Bundle) -> None:
    """Delete a URL bundle's files at their source once they are staged (inline bundles: nothing to do)."""
    if bundle.url is None:
        return
    import fsspec

    fs, root = fsspec.core.url_to_fs(bundle.url)
    try:
        fs.rm(root, recursive=True)
    except FileNotFoundError:
        pass
