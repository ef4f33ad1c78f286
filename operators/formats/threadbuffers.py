"""Each thread's kept byte buffers, by name: `thread_buffer` hands a thread back the page-aligned buffer it used
last (grown when asked for more), so a task that runs again on the same thread does not pay the kernel for
zeroing fresh pages; `drop_thread_buffers` lets every thread's go when a prepare ends.
"""
from __future__ import annotations

import threading
import weakref

import numpy as np

from ...native.constants import ALIGN

__all__ = ["drop_thread_buffers", "kept_thread_buffer_bytes", "thread_buffer"]

# Each thread's kept buffers by name, in a registry rather than thread-local storage, so that a
# prepare's end can let every thread's go (`drop_thread_buffers`); a thread's entry goes with it.
_BUFFERS: weakref.WeakKeyDictionary[threading.Thread, dict[str, np.ndarray]] = weakref.WeakKeyDictionary()
_BUFFERS_LOCK = threading.Lock()


def _own_buffers() -> dict[str, np.ndarray]:
    """The calling thread's entry of `_BUFFERS` (made on its first call)."""
    me = threading.current_thread()
    with _BUFFERS_LOCK:
        mine = _BUFFERS.get(me)
        if mine is None:
            mine = _BUFFERS[me] = {}
        return mine


def thread_buffer(name: str, nbytes: int, keep: np.ndarray | None = None, limit: int | None = None) -> np.ndarray:
    """This thread's page-aligned byte buffer `name`, at least `nbytes` long, kept for the thread's next use.

    A fresh buffer per task costs the kernel zeroing every page of it again, often more than the work done
    in it; a thread runs one task at a time, so a task that keeps nothing of the buffer may reuse it.
    `keep`: bytes a grown buffer starts with (the current buffer's). `limit`: a buffer larger than this is
    handed out but not kept. The buffers are kept until `drop_thread_buffers` or the thread's end.
    """
    from ...native.reader import aligned_empty

    mine = _own_buffers()
    buf = mine.get(name)
    if buf is None or buf.shape[0] < nbytes:
        kept = limit is None or nbytes <= limit
        # A kept buffer gets room to grow (up to `limit`): a task's sizes vary a little from one to the next
        # (a superbatch's window, its part files), and each regrowth would fault a whole buffer in afresh.
        # The room is address space only; its pages are mapped when first written.
        room = nbytes
        if kept:
            room = nbytes + nbytes // 2 if limit is None else min(nbytes + nbytes // 2, limit)
        buf = aligned_empty(-(-room // ALIGN) * ALIGN)
        if keep is not None:
            buf[:keep.shape[0]] = keep
        if kept:
            mine[name] = buf
    return buf


def kept_thread_buffer_bytes() -> int:
    """Bytes of the buffers `thread_buffer` keeps for this process's threads."""
    with _BUFFERS_LOCK:
        return sum(b.nbytes for mine in _BUFFERS.values() for b in list(mine.values()))


def drop_thread_buffers() -> int:
    """Let go of the buffers every thread of this process keeps (`thread_buffer`); return their bytes.

    A prepare's pack tasks keep a shard's worth and a few write buffers per thread (hundreds of MB on a
    few threads), which would otherwise stay with the scheduler's threads after the prepare. A buffer a
    running task holds stays its own until it drops it; its thread's next `thread_buffer` makes a new one.
    """
    with _BUFFERS_LOCK:
        kept = list(_BUFFERS.values())
    freed = 0
    for mine in kept:
        for name in list(mine):
            buf = mine.pop(name, None)
            freed += 0 if buf is None else buf.nbytes
    return freed
