"""Checksums of a store's files: recorded by ingest as the bytes are written, checked by every reader.

Every file of a store (topology, feature shards, labels, splits, and whatever else ingest writes there)
has one crc32 per fixed-size block of `BLOCK_BYTES` (the last block may be short), in the manifest::

    "checksums": {"algorithm": "crc32", "block_bytes": 1048576,
                  "files": {"indices.npy": {"bytes": 12345, "blocks": [crc, ...]}, ...}}

Blocks, not one crc per file, so that a fault is located and a reader checks only what it reads: a
loader that reads a few rows of a shard checks the blocks those rows lie in, each block once per
process (`StoreChecks`). The checksum is the native one packed segments use (`checksum.crc32`).

Writing. Ingest's tasks write their files in pieces (a CSC task writes its slice of ``indices`` at an
offset), so each writer reports the crc32 of what it wrote, split at block boundaries (`add_pieces`),
while the bytes are in its hands; the manifest task merges the pieces into block crcs with
``crc32_combine`` (`merge_blocks`), zeros where no writer wrote (a preallocated file reads as zeros
there). A file in the store that no writer reported is checksummed by reading it
(`record_checksums`), so that every file the store holds is covered.

Reading. `StoreChecks` is what `store.Store` checks its reads with. A store written before checksums
existed has none: it still works, unchecked, and `verify_store` says so and how to re-ingest.

Checks are on unless turned off: ``check_crc=False`` where a reader takes it, the command line's
``--no-crc``, or ``DISKFLOW_STORE_CRC=0`` in the environment of the processes that read (`store_checks`
sets it for a block, so the workers of an embedded cluster started inside inherit it).
"""
from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import InputError
from ...native.kernels import crc32, crc32_blocks, crc32_combine, crc32_zeros
from .manifest import MANIFEST

__all__ = ["BLOCK_BYTES", "CHECKSUMS", "ENV", "UNCHECKED", "Piece", "StoreChecks", "add_pieces", "crc_pieces",
           "merge_blocks", "record_checksums", "store_checks", "store_checks_enabled", "verify_store"]

BLOCK_BYTES = 1 << 20       # a checksum per MiB: a manifest entry per MiB of store, a reader's overread at most one
CHECKSUMS = "checksums"     # the manifest's key
ENV = "DISKFLOW_STORE_CRC"  # "0": store reads are not checked in this process (and the workers it starts)
_READ_CHUNK = 16 << 20      # bytes read per call when checking by reading (a multiple of BLOCK_BYTES)
_SKIP_DIRS = ("_spill",)    # ingest's scratch, removed before the manifest

Piece = tuple[str, int, int, int]   # (file relative to the store, byte offset, length, crc32), within one block


def store_checks_enabled() -> bool:
    """Whether store reads are checked in this process (``DISKFLOW_STORE_CRC`` is not 0/off)."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "off", "false", "no")


@contextlib.contextmanager
def store_checks(enabled: bool) -> Iterator[None]:
    """Turn store checks on or off for the block, in this process and the processes it starts."""
    before = os.environ.get(ENV)
    os.environ[ENV] = "1" if enabled else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before


# ----------------------------------------------------------------------------- writing

def _bytes(data: Any) -> np.ndarray:
    return np.ascontiguousarray(data).reshape(-1).view(np.uint8)


def crc_pieces(offset: int, data: Any, block: int | None = None) -> list[tuple[int, int, int]]:
    """(offset, length, crc32) of the bytes `data` written at file offset `offset`, split at block
    boundaries (`BLOCK_BYTES` by default): a partial block at each end, every whole block between (one
    native call for them)."""
    block = block or BLOCK_BYTES
    view = _bytes(data)
    n = int(view.shape[0])
    if n == 0:
        return []
    out: list[tuple[int, int, int]] = []
    head = min(n, -offset % block)
    if head:
        out.append((offset, head, crc32(view[:head])))
    body = (n - head) // block * block
    if body:
        crcs = crc32_blocks(view[head:head + body], block)
        starts = offset + head + block * np.arange(crcs.shape[0], dtype=np.int64)
        out.extend(zip(starts.tolist(), [block] * crcs.shape[0], crcs.tolist()))
    if head + body < n:
        out.append((offset + head + body, n - head - body, crc32(view[head + body:])))
    return out


def add_pieces(pieces: list[Piece] | None, rel: str, offset: int, data: Any, block: int | None = None) -> None:
    """Append to `pieces` (when given) the crcs of `data` written at `offset` of the store file `rel`."""
    if pieces is not None:
        pieces.extend((rel, o, n, c) for o, n, c in crc_pieces(offset, data, block))


def merge_blocks(pieces: Sequence[tuple[int, int, int]], size: int, block: int | None = None) -> list[int]:
    """The block crcs of a file of `size` bytes from its writers' pieces (offset, length, crc), in the order
    they were written: a later piece at the same offset and length replaces an earlier one (a range written
    twice); bytes no piece covers are zeros.

    Raises:
        ValueError: pieces that overlap or pass the end of the file (a writer's bug, not the data's).
    """
    block = block or BLOCK_BYTES
    nblocks = -(-size // block)
    out = np.zeros(nblocks, dtype=np.int64)
    latest: dict[tuple[int, int], int] = {}
    for off, n, c in pieces:
        latest[(int(off), int(n))] = int(c)
    if not latest:
        return [crc32_zeros(0, min(block, size - k * block)) for k in range(nblocks)]
    arr = np.array([(o, n, c) for (o, n), c in sorted(latest.items())], dtype=np.int64)
    offs, lens, crcs = arr[:, 0], arr[:, 1], arr[:, 2]
    if (offs < 0).any() or int((offs + lens).max()) > size or (offs[1:] < offs[:-1] + lens[:-1]).any():
        raise ValueError(f"checksum pieces overlap or pass the end of a {size}-byte file")
    ids = offs // block
    sizes = np.minimum(block, size - np.arange(nblocks, dtype=np.int64) * block)
    whole = (offs % block == 0) & (lens == sizes[ids])
    out[ids[whole]] = crcs[whole]
    done = np.zeros(nblocks, dtype=bool)
    done[ids[whole]] = True
    rest = np.flatnonzero(~whole)
    for k in np.unique(ids[rest]).tolist():          # partial blocks: a loop per block, not per byte
        crc, at = 0, k * block
        for j in rest[ids[rest] == k].tolist():
            crc = crc32_zeros(crc, int(offs[j]) - at)
            crc = crc32_combine(crc, int(crcs[j]), int(lens[j]))
            at = int(offs[j] + lens[j])
        out[k] = crc32_zeros(crc, k * block + int(sizes[k]) - at)
        done[k] = True
    for k in np.flatnonzero(~done).tolist():        # blocks nobody wrote: zeros
        out[k] = crc32_zeros(0, int(sizes[k]))
    return [int(v) for v in out.tolist()]


def _read_blocks(path: Path, block: int, first: int = 0, count: int | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """(first block index, crcs) of blocks [first, first + count) of `path` (all to the end by default), read
    `_READ_CHUNK` at a time with pread."""
    chunk = max(block, _READ_CHUNK // block * block)
    buf = np.empty(chunk, np.uint8)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise InputError(path, f"cannot open ({e.strerror or e})") from e
    try:
        size = os.fstat(fd).st_size
        stop = -(-size // block) if count is None else min(first + count, -(-size // block))
        k = first
        while k < stop:
            lo = k * block
            want = min(chunk, stop * block - lo, size - lo)
            done = 0
            while done < want:
                n = os.preadv(fd, [buf[done:want].data], lo + done)
                if n <= 0:
                    break
                done += n
            crcs = crc32_blocks(buf[:done], block)
            yield k, crcs
            if done < want:
                return
            k += crcs.shape[0]
    except OSError as e:
        raise InputError(path, f"read failed ({e.strerror or e})") from e
    finally:
        os.close(fd)


def _store_files(stage: Path) -> list[str]:
    """Every file of a store directory, relative and with forward slashes, but its manifest and scratch."""
    return sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*")
                  if p.is_file() and p.relative_to(stage).parts[0] not in _SKIP_DIRS
                  and p.relative_to(stage).as_posix() != MANIFEST and ".tmp" not in p.name)


def record_checksums(stage: str | os.PathLike[str], manifest: dict[str, Any], pieces: Sequence[Piece],
                     block: int | None = None) -> dict[str, Any]:
    """`manifest` with its ``checksums``: every file in `stage` (but the manifest and scratch) from its
    writers' `pieces` (split at the same `block`); a file that no writer reported is read to checksum it."""
    block = block or BLOCK_BYTES
    root = Path(stage)
    by_file: dict[str, list[tuple[int, int, int]]] = {}
    for rel, off, n, c in pieces:
        by_file.setdefault(rel, []).append((off, n, c))
    files: dict[str, Any] = {}
    for rel in _store_files(root):
        size = (root / rel).stat().st_size
        if rel in by_file:
            blocks = merge_blocks(by_file[rel], size, block)
        else:
            blocks = [int(c) for _, crcs in _read_blocks(root / rel, block) for c in crcs.tolist()]
        files[rel] = {"bytes": int(size), "blocks": blocks}
    return {**manifest, CHECKSUMS: {"algorithm": "crc32", "block_bytes": int(block), "files": files}}


# ----------------------------------------------------------------------------- reading

_CHECKED: dict[tuple[int, int, int, int], np.ndarray] = {}     # per file version: the blocks checked here
_CHECKED_LOCK = threading.Lock()

UNCHECKED = ("written before stores had checksums, so it cannot be checked; re-ingest it to add them "
             "(`diskflow ingest RAW STORE --force`)")


class StoreChecks:
    """The checksums of one store, and the checks of what is read from it (each block once per process
    and file version: a rewritten file is checked afresh)."""

    def __init__(self, root: str | os.PathLike[str], manifest: dict[str, Any], enabled: bool | None = None) -> None:
        self.root = Path(root)
        rec: dict[str, Any] = manifest.get(CHECKSUMS) or {}
        self.present = isinstance(rec, dict) and isinstance(rec.get("files"), dict)
        self.block = int(rec.get("block_bytes", BLOCK_BYTES)) if self.present else BLOCK_BYTES
        self.files: dict[str, Any] = dict(rec["files"]) if self.present else {}
        self.enabled = store_checks_enabled() if enabled is None else bool(enabled)

    @property
    def active(self) -> bool:
        """Whether reads are checked: checks on and the store has checksums."""
        return self.enabled and self.present

    def _rel(self, path: str | os.PathLike[str]) -> str:
        p = Path(path)
        if p.is_absolute() and p.as_posix() in self.files:    # a view's files (`store.edge_table_manifest`)
            return p.as_posix()
        return (p.relative_to(self.root) if p.is_relative_to(self.root) else p).as_posix()

    def _entry(self, rel: str) -> tuple[Path, np.ndarray]:
        entry = self.files.get(rel)
        path = self.root / rel
        if entry is None:
            raise InputError(path, "not in the store's checksums (a file the store manifest does not list)")
        return path, np.asarray(entry["blocks"], dtype=np.int64)

    def _seen(self, path: Path, nblocks: int) -> np.ndarray:
        """This process's checked-blocks flags of the file's current version."""
        try:
            st = os.stat(path)
        except OSError as e:
            raise InputError(path, f"missing store file ({e.strerror or e})") from e
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)     # the file, however a view names it
        with _CHECKED_LOCK:
            seen = _CHECKED.get(key)
            if seen is None:
                seen = _CHECKED[key] = np.zeros(nblocks, dtype=bool)
        return seen

    def _fault(self, path: Path, rel: str, k: int, want: np.ndarray, what: str) -> InputError:
        size = int(self.files[rel]["bytes"])
        lo, hi = k * self.block, min((k + 1) * self.block, size)
        by = f" (read by {what})" if what else ""
        return InputError(path, f"checksum mismatch in block {k} of {len(want)} (bytes {lo:,}..{hi - 1:,}){by}: "
                                "the file changed since ingest; re-ingest the store (`diskflow ingest --force`)")

    def _check_size(self, path: Path, rel: str) -> None:
        want = int(self.files[rel]["bytes"])
        try:
            size = path.stat().st_size
        except OSError as e:
            raise InputError(path, f"missing store file ({e.strerror or e})") from e
        if size != want:
            raise InputError(path, f"{'truncated' if size < want else 'oversized'}: {size:,} bytes, the store's "
                                   f"checksums record {want:,}")

    def check_blocks(self, rel: str, blocks: np.ndarray, what: str = "", fresh: bool = False) -> int:
        """Check blocks `blocks` of file `rel` (those not checked yet in this process unless `fresh`), reading
        them; the bytes checked.

        Raises:
            InputError: the first block whose crc differs (naming the file, the block and `what` read it).
        """
        if not self.active:
            return 0
        path, want = self._entry(rel)
        self._check_size(path, rel)
        seen = self._seen(path, len(want))
        todo = np.unique(np.asarray(blocks, dtype=np.int64))
        if not fresh:
            todo = todo[~seen[todo]]
        checked = 0
        if not todo.size:
            return 0
        cuts = np.flatnonzero(np.diff(todo) != 1) + 1          # runs of consecutive blocks: one read each
        for run in np.split(todo, cuts):
            for k, crcs in _read_blocks(path, self.block, int(run[0]), int(run.shape[0])):
                bad = np.flatnonzero(crcs.astype(np.int64) != want[k:k + crcs.shape[0]])
                if bad.size:
                    raise self._fault(path, rel, k + int(bad[0]), want, what)
                seen[k:k + crcs.shape[0]] = True
                checked += int(crcs.shape[0])
        return checked * self.block

    def check_file(self, path: str | os.PathLike[str], what: str = "", fresh: bool = False) -> int:
        """Check every block of a store file (a path under the store, or relative to it); the bytes checked."""
        if not self.active:
            return 0
        rel = self._rel(path)
        _, want = self._entry(rel)
        return self.check_blocks(rel, np.arange(len(want)), what, fresh)

    def check_range(self, path: str | os.PathLike[str], lo: int, hi: int, what: str = "") -> int:
        """Check the blocks of bytes [lo, hi) of a store file; the bytes checked."""
        if not self.active or hi <= lo:
            return 0
        return self.check_blocks(self._rel(path), np.arange(lo // self.block, (hi - 1) // self.block + 1), what)

    def check_offsets(self, path: str | os.PathLike[str], offsets: np.ndarray, nbytes: int, what: str = "") -> int:
        """Check the blocks of the byte ranges [offset, offset + nbytes) (rows of a shard; vectorised)."""
        if not self.active or not len(offsets):
            return 0
        off = np.asarray(offsets, dtype=np.int64)
        first, last = off // self.block, (off + max(nbytes, 1) - 1) // self.block
        span = int((last - first).max())          # blocks a range spans past its first: a loop per block of a row
        blocks = np.concatenate([np.minimum(first + i, last) for i in range(span + 1)])
        return self.check_blocks(self._rel(path), blocks, what)

    def check_view(self, path: str | os.PathLike[str], offset: int, data: Any, what: str = "") -> int:
        """Check the blocks of a store file that `data` (its bytes from `offset`, already read by the caller)
        covers whole, from `data` itself; the blocks it covers in part are read. The bytes checked."""
        if not self.active:
            return 0
        rel = self._rel(path)
        fpath, want = self._entry(rel)
        self._check_size(fpath, rel)
        view = _bytes(data)
        b = self.block
        first, end = -(-offset // b), (offset + view.shape[0]) // b      # blocks wholly inside
        size = int(self.files[rel]["bytes"])
        if offset + view.shape[0] == size and size % b:
            end = -(-size // b)                                            # the short last block too
        seen = self._seen(fpath, len(want))
        if end > first:
            lo = first * b - offset
            crcs = crc32_blocks(view[lo:min(view.shape[0], end * b - offset)], b).astype(np.int64)
            bad = np.flatnonzero(crcs != want[first:end])
            if bad.size:
                raise self._fault(fpath, rel, first + int(bad[0]), want, what)
            seen[first:end] = True
        edges = [k for k in (offset // b, (offset + view.shape[0] - 1) // b) if not first <= k < end]
        extra = self.check_blocks(rel, np.array(edges, dtype=np.int64), what) if edges and view.shape[0] else 0
        return max(0, end - first) * b + extra


def verify_store(path: str | os.PathLike[str], manifest: dict[str, Any]) -> dict[str, Any]:
    """Check every block of every file of a store against its checksums (always, whatever the switch).

    Returns:
        ``{"checked": bool, "files", "bytes", "blocks"}``; ``checked`` is False for a store written before
        checksums (nothing could be checked: `UNCHECKED` says why).

    Raises:
        InputError: a missing, resized or corrupt file, naming it and the first bad block; a file of the
        store that its checksums do not list.
    """
    checks = StoreChecks(path, manifest, enabled=True)
    if not checks.present:
        return {"checked": False, "files": 0, "bytes": 0, "blocks": 0}
    root = Path(path)
    extra = sorted(set(_store_files(root)) - set(checks.files))
    if extra:
        raise InputError(root / extra[0], "a file in the store that its checksums do not list")
    total = blocks = 0
    for rel in sorted(checks.files):
        total += int(checks.files[rel]["bytes"])
        blocks += len(checks.files[rel]["blocks"])
        checks.check_file(rel, fresh=True)
    return {"checked": True, "files": len(checks.files), "bytes": total, "blocks": blocks}
