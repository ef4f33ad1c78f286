"""Reading a store's feature rows with O_DIRECT into a row cache's slots: `RowReader`, and the sizes of its
staging rows and bounce buffer.

Rows are read from the store's feature shards by the native direct-I/O reader: the page cache is
bypassed, each distinct 512-byte sector read once where the device allows it, reads merged across
short gaps. Kept apart from the cache (`rowcache`) because reading is the disk's side (files, offsets,
units, gaps, a reader per process) and the cache never sees it: a read-through cache holds one reader,
the online loader's extractors one each.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import numpy as np

from ...errors import InputError
from ...native.constants import ALIGN, DEFAULT_MERGE_BYTES, SECTOR
from ...native.kernels import copy_rows
from ...native.reader import DirectReader
from ..formats.intwidth import byte_offsets

if TYPE_CHECKING:
    from .rowcache import RowCache

__all__ = ["DEFAULT_GAP_BYTES", "DEFAULT_UNIT_BYTES", "MAX_STAGING_BYTES", "MIN_STAGING_BYTES", "RowReader",
           "bounce_bytes", "staging_bytes_for"]

MAX_STAGING_BYTES = 2 << 20         # a reader's staging rows (misses go through in pieces) ...
MIN_STAGING_BYTES = 64 << 10        # ... sized to 1/16 of the budget over the readers, within these bounds
# Rows are read in 512-byte sectors where the device allows it (GNNDrive's request granularity;
# whole 4 KiB pages elsewhere), and reads go through runs of up to 12 KiB of untouched bytes between
# touched sectors. A request costs ~8 us of a virtio disk's time beside its bytes (fio, 64 in
# flight: 105k 512-byte, 97k 4 KiB, 53k 16 KiB reads/s), so on bench compare's default graph
# (512-byte rows, ~44% of pages touched per batch) the read through short gaps pays: page by page
# took 3.13 s a batch against 2.24 s through 16 KiB gaps (an earlier session); sectors through
# 12 KiB gaps read 2.10 GiB a batch in 129k requests against pages through 16 KiB gaps' 3.53 GiB
# in 47k, 2.85 s against 3.41 s a batch (medians of three alternated runs, on a 1.1 GiB/s day).
DEFAULT_GAP_BYTES = 12 << 10
DEFAULT_UNIT_BYTES = SECTOR


def staging_bytes_for(budget: int, readers: int) -> int:
    """Each reader's staging bytes for a cache of `budget` bytes: 1/16 of it over the readers, within
    [`MIN_STAGING_BYTES`, `MAX_STAGING_BYTES`], a multiple of 4 KiB."""
    share = int(budget) // (16 * max(1, readers))
    return max(MIN_STAGING_BYTES, min(MAX_STAGING_BYTES, share)) // ALIGN * ALIGN


def bounce_bytes(staging_bytes: int) -> int:
    """The page bounce buffer of a reader: as large as its staging, at least one merged request."""
    return max(int(staging_bytes), DEFAULT_MERGE_BYTES)


class RowReader:
    """Reads store rows into a cache's slots (and a caller's rows) with one native direct-I/O reader.

    Rows are read by `DirectReader.read_rows` (each distinct unit once: a 512-byte sector where the device
    allows it, else a 4 KiB page, `unit_bytes`; units merged into one request across gaps of up to
    `gap_bytes`), in shard runs and offset order, in pieces of at most `staging_bytes`. The reader is
    opened in the process that reads (a forked loader worker opens its own: rings and threads do not
    survive fork).
    """

    def __init__(self, store: Any, staging_bytes: int = MAX_STAGING_BYTES, gap_bytes: int = DEFAULT_GAP_BYTES,
                 unit_bytes: int = DEFAULT_UNIT_BYTES) -> None:
        self.store = store
        self.row_bytes = int(store.row_bytes)
        self.bounce_bytes = bounce_bytes(staging_bytes)
        self.gap_bytes, self.unit_bytes = int(gap_bytes), int(unit_bytes)
        self.piece = max(1, int(staging_bytes) // self.row_bytes)
        self.staging = np.empty((self.piece, self.row_bytes), np.uint8)
        self._identity = np.arange(self.piece, dtype=np.int64)
        self._reader: DirectReader | None = None
        self._pid = -1
        self._handles: dict[int, int] = {}

    @property
    def reader(self) -> DirectReader:
        """This process's native reader."""
        if self._reader is None or self._pid != os.getpid():
            self._reader = DirectReader(backend="auto", bounce_bytes=self.bounce_bytes, gap_bytes=self.gap_bytes,
                                        unit_bytes=self.unit_bytes)
            self._pid = os.getpid()
            self._handles = {}
        return self._reader

    def _handle(self, p: int) -> int:
        reader = self.reader
        h = self._handles.get(p)
        if h is None:
            path = self.store.shards[p].path
            try:
                h = self._handles[p] = int(reader.open(str(path)))
            except OSError as e:
                raise InputError(path, f"cannot open feature shard for reading ({e.strerror or e})") from e
        return h

    def read(self, ids: np.ndarray, slots: np.ndarray, cache: RowCache, batch: int | None = None,
             out: np.ndarray | None = None, pos: np.ndarray | None = None) -> None:
        """Rows of nodes `ids` into `cache` slots `slots` (none where a slot is -1) and, with `out`, into
        rows `pos` of `out`.

        Raises:
            InputError: a shard cannot be opened or read (names the shard file, the byte offset and
                `batch` where given).
        """
        if ids.shape[0] == 0:
            return
        if ids.shape[0] > 1 and not bool(np.all(ids[1:] >= ids[:-1])):
            order = np.argsort(ids, kind="stable")
            ids, slots = ids[order], slots[order]
            pos = None if pos is None else pos[order]
        st, rb = self.store, self.row_bytes
        raw = cache.raw
        out_raw = None if out is None else out.view(np.uint8).reshape(out.shape[0], rb)
        where = "" if batch is None else f"batch {batch}: "
        shard = ids // st.shard_rows
        cuts = np.flatnonzero(np.diff(shard)) + 1
        for lo, hi in zip(np.r_[0, cuts].tolist(), np.r_[cuts, ids.shape[0]].tolist(), strict=True):
            s = st.shards[int(shard[lo])]
            check = getattr(st, "check_rows", None)      # the store's checksums: each block once per process
            if check is not None:
                check(s.index, ids[lo:hi] - s.row_start, f"{where}the store's row reads")
            h = self._handle(s.index)
            offsets = byte_offsets(ids[lo:hi] - s.row_start, rb, s.offset)
            for a in range(0, hi - lo, self.piece):       # a loop per staging piece, not per row
                b = min(hi - lo, a + self.piece)
                buf = self.staging[: b - a]
                try:
                    self.reader.read_rows(h, offsets[a:b], rb, buf)
                except OSError as e:
                    raise InputError(s.path, f"{where}reading {b - a:,} feature rows from byte offset "
                                             f"{int(offsets[a]):,} failed: {e.strerror or e}") from e
                if out_raw is not None and pos is not None:
                    copy_rows(out_raw, pos[lo + a: lo + b], buf, self._identity[: b - a])
                d = slots[lo + a: lo + b]
                keep = np.flatnonzero(d >= 0)
                copy_rows(raw, d[keep].astype(np.int64, copy=False), buf, keep)

    @property
    def unit(self) -> int:
        """The unit the reader reads the store's shards in (512 bytes, or 4096 where the device needs it)."""
        return self.reader.unit_of(self._handle(self.store.shards[0].index))

    def counters(self) -> dict[str, float]:
        """The reader's counters in this process (``bytes_read``, ``requests``, ``seconds``); none before a read."""
        if self._reader is None or self._pid != os.getpid():
            return {}
        return self._reader.counters()

    def close(self) -> None:
        """Close the reader's files (a later read reopens them)."""
        if self._reader is not None and self._pid == os.getpid():
            self._reader.close()
        self._reader, self._handles = None, {}
