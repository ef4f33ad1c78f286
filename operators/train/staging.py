"""The staging buffers of a `PackedLoader`: fixed, page-aligned host buffers the load stage reads disk rows
into (pieces of at most ``staging_piece_bytes``), and on the device path one more that CPU-tier rows
reach the device through; pinned with ``cudaHostRegister`` on CUDA, so copies from them are
asynchronous. Their number and size are the memory plan's (`memory.memory_plan`), fixed when the
loader first iterates, so staging never grows with a batch.
"""
from __future__ import annotations

import contextlib

import numpy as np
import torch

from ...native.reader import aligned_empty

__all__ = ["PinnedBuffers"]


class PinnedBuffers:
    """Allocates aligned host buffers, pinned when the loader trains on CUDA, and unpins them all at once.

    Args:
        device: the loader's device (pinning only on CUDA).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pinned: list[int] = []        # data pointers registered with CUDA

    def new(self, nbytes: int) -> np.ndarray:
        """An aligned buffer of `nbytes`, pinned on CUDA."""
        buf = aligned_empty(nbytes)
        if self.device.type == "cuda" and buf.nbytes:
            torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(buf.ctypes.data, buf.nbytes, 0))
            self._pinned.append(buf.ctypes.data)
        return buf

    def unpin(self) -> None:
        """Unregister every buffer pinned so far (the caller drops them; unpinning never raises)."""
        for ptr in self._pinned:
            with contextlib.suppress(Exception):
                torch.cuda.cudart().cudaHostUnregister(ptr)
        self._pinned.clear()
