"""One CPU tier shared by the GPU workers of a machine (LSM-GNN's shared host cache), planned exactly.

With ``--cache shared`` the GPU workers of a data-parallel run on one machine keep one CPU tier in
shared memory instead of one each: the rows, in a file under ``/dev/shm`` that every worker's
loader maps. Belady plans that tier over the merged access stream, the superbatch's batches in
their order (worker r trains positions r, r + N, ...), so the plan of batch g may read a row that
batch g - 1, on another worker, inserted, or evict one that batch g - 1 read. The workers therefore
take turns at the tier in the stream's order: a *turn* counter in the file names the global batch
whose tier reads and inserts come next; a loader waits for its batch's turn before the batch's first
tier read and passes the turn on after its inserts (`PackedLoader`'s assemble stage). Only that
part of a batch is serialised; reading its packed rows from disk, building its graph and training
it overlap as before. A worker whose data-parallel step waits for another's gradient never holds a
turn the other needs: turns go in batch order, and step s needs batches sN .. sN + N - 1, whose
turns all come before any of step s + 1's.

Rank 0 fills the tier with its first content and then marks it ready; the others wait for that.
The control words are aligned int64 stores, which other processes see in program order on x86-64
(TSO) after the rows written before them; other architectures would need fences.
"""
from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

import numpy as np

from ...errors import ConfigError, DiskflowError
from ..formats.sizes import format_bytes

__all__ = ["HEADER", "SHM_DIR", "SharedTier", "TierTimeout", "shared_tier_path"]

HEADER = 4096                 # control words, then the rows (page-aligned)
_READY, _TURN, _SLOTS, _ROW_BYTES = 0, 1, 2, 3
SHM_DIR = Path("/dev/shm")


class TierTimeout(DiskflowError):
    """A GPU worker waited too long for its turn at the shared CPU tier (another worker stopped)."""


def shared_tier_path(run: str) -> Path:
    """Where run `run`'s shared tier lives (a file of the machine's shared memory)."""
    return SHM_DIR / f"diskflow-{run}.tier"


class SharedTier:
    """A CPU tier of `slots` rows of `dim` `dtype` values in the file `path`, mapped by every worker.

    Args:
        path: the file (created, or opened when another worker created it first).
        slots, dim, dtype: the tier's shape; every worker must agree (checked).
        rank: this worker's rank (0 fills the tier and marks it ready).
        timeout_s: how long `wait_turn` and `wait_ready` wait before a `TierTimeout`.
    """

    def __init__(self, path: str | os.PathLike[str], slots: int, dim: int, dtype: np.dtype, rank: int,
                 timeout_s: float = 600.0) -> None:
        self.path = Path(path)
        self.rank = rank
        self.timeout_s = timeout_s
        dtype = np.dtype(dtype)
        row_bytes = dim * dtype.itemsize
        size = HEADER + slots * row_bytes
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:    # allocated now, not on first touch: a full /dev/shm is an error here, not a SIGBUS later
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                raise ConfigError("cache", f"{self.path}: cannot allocate the shared CPU tier, {format_bytes(size)} "
                                           f"({e.strerror or e}); give {self.path.parent} more room or a smaller "
                                           "cpu_memory, or use cache='per-worker'") from e
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.ctl = np.frombuffer(self._map, np.int64, HEADER // 8)
        if rank == 0:
            self.ctl[_SLOTS], self.ctl[_ROW_BYTES] = slots, row_bytes
        self.rows = np.frombuffer(self._map, dtype, slots * dim, HEADER).reshape(slots, dim)
        self._shape = (slots, row_bytes)

    # ------------------------------------------------------------------ setup
    def publish(self, turn: int) -> None:
        """Rank 0, once the rows hold the tier's first content: the tier is ready, `turn` is the next batch."""
        self.ctl[_TURN] = turn
        self.ctl[_READY] = 1

    def wait_ready(self) -> None:
        self._wait(lambda: self.ctl[_READY] == 1, "rank 0 to fill the shared CPU tier")
        if (int(self.ctl[_SLOTS]), int(self.ctl[_ROW_BYTES])) != self._shape:
            raise DiskflowError(f"{self.path}: the shared CPU tier has {int(self.ctl[_SLOTS])} rows of "
                                f"{int(self.ctl[_ROW_BYTES])} bytes, this worker expects {self._shape}")

    # ------------------------------------------------------------------ turns
    @property
    def turn(self) -> int:
        return int(self.ctl[_TURN])

    def wait_turn(self, batch: int) -> None:
        """Wait until global batch `batch` may read and insert (every earlier batch has)."""
        if self.ctl[_READY] == 1 and self.ctl[_TURN] == batch:
            return
        self._wait(lambda: self.ctl[_READY] == 1 and self.ctl[_TURN] == batch,
                   f"its turn at the shared CPU tier for batch {batch}")

    def pass_turn(self, batch: int) -> None:
        """Global batch `batch`'s reads and inserts are done: the next batch's turn."""
        if self.ctl[_TURN] != batch:
            raise DiskflowError(f"{self.path}: batch {batch} passes a turn that is {int(self.ctl[_TURN])}'s")
        self.ctl[_TURN] = batch + 1

    def _wait(self, ready: object, what: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        pause = 1e-5
        while not ready():  # type: ignore[operator]
            if time.monotonic() > deadline:
                raise TierTimeout(f"GPU worker rank {self.rank} waited {self.timeout_s:.0f} s for {what} "
                                  f"(the turn is at batch {int(self.ctl[_TURN])}): another worker stopped")
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

    # ------------------------------------------------------------------ end
    def close(self, unlink: bool = False) -> None:
        """Unmap (views of the rows must be gone); `unlink`: remove the file too (rank 0, at the run's end)."""
        self.ctl = self.rows = None  # type: ignore[assignment]
        try:
            self._map.close()
        except BufferError:       # a view is still alive: the mapping goes with it
            pass
        if unlink:
            self.path.unlink(missing_ok=True)
