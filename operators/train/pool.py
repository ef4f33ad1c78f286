"""`MatrixPool`: the batch feature matrices a `PackedLoader` reuses from batch to batch.

A fresh matrix per batch costs the kernel zeroing its pages every time. A pooled matrix is lent
to the batch it is yielded in (`lend`) and handed out again only after the consumer gave it back
(`release`), so a batch the caller keeps is never written again; without releases every batch
gets a matrix of its own. The pool holds at most the assembled batches in flight (the memory
plan's ``assembled_batches``, of ``max_batch_rows`` rows each), which the budget counts.

The assemble thread takes and lends matrices while the consumer releases them, so every method
holds the pool's lock.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

__all__ = ["MatrixPool"]


class MatrixPool:
    """Reused [rows, dim] host matrices, each lent to one batch at a time (see the module docstring).

    Args:
        dim, dtype: the features' width and type.
        memory: the loader's memory plan (`memory.memory_plan`): ``max_batch_rows`` and
            ``assembled_batches`` size the pool; the loader sets a new one when it follows another
            directory (`PackedLoader.follow`).
    """

    def __init__(self, dim: int, dtype: np.dtype, memory: dict[str, Any]) -> None:
        self.dim, self.dtype, self.memory = dim, dtype, memory
        self._matrices: list[np.ndarray] = []
        self._free: list[np.ndarray] = []                           # pooled and not lent
        self._lent: dict[int, tuple[np.ndarray, torch.Tensor]] = {}  # data pointer -> (matrix, the batch's x)
        self._lock = threading.Lock()                               # the assemble thread lends, the consumer releases

    def take(self, n: int) -> np.ndarray:
        """An [n, dim] matrix for a batch's features: a pooled one not lent to any batch, else a fresh one (kept
        in the pool while it holds fewer than ``assembled_batches``)."""
        rows = int(self.memory["max_batch_rows"])
        with self._lock:
            if n <= rows and self._free:
                return self._free.pop()[:n]
            m = np.empty((max(n, rows), self.dim), dtype=self.dtype)
            if n <= rows and len(self._matrices) < int(self.memory["assembled_batches"]):
                self._matrices.append(m)
            return m[:n]

    def lend(self, x: torch.Tensor) -> None:
        """Record that the batch about to be yielded holds `x`'s matrix (if pooled) until `release`."""
        if x.device.type == "cpu":
            with self._lock:
                m = next((m for m in self._matrices if m.ctypes.data == x.data_ptr()), None)
                if m is not None:
                    self._lent[x.data_ptr()] = (m, x)

    def release(self, x: torch.Tensor) -> None:
        """Take back `x`'s matrix if `x` holds its lease (a later batch's lease, or none, is left alone)."""
        with self._lock:
            lease = self._lent.get(x.data_ptr())
            if lease is not None and lease[1] is x:     # this batch's own lease, not a later batch's
                del self._lent[x.data_ptr()]
                self._free.append(lease[0])

    def reclaim(self, x: np.ndarray | None = None) -> None:
        """Put back in the pool `x`'s matrix (a batch assembled but not yielded), or with None, once no
        stage runs, every pooled matrix that is neither free nor lent (batches a stopped pipeline dropped)."""
        with self._lock:
            out = [m for m in self._matrices if not any(m is f for f in self._free)
                   and not any(m is lent for lent, _ in self._lent.values())]
            self._free += [m for m in out if x is None or m.ctypes.data == x.ctypes.data]

    def drop(self) -> None:
        """Forget the pooled matrices (batches still lent keep theirs)."""
        with self._lock:
            self._matrices.clear()
            self._free.clear()
            self._lent.clear()
