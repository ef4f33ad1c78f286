"""`threadbuffers`: each thread's kept buffers, its own until dropped."""
from __future__ import annotations

import numpy as np
from diskflow.operators.formats import threadbuffers


def test_thread_buffers_are_kept_per_thread_until_dropped() -> None:
    """`thread_buffer` hands a thread back its own buffer (grown when asked for more), never another
    thread's; `drop_thread_buffers`, called from any thread, lets every thread's go (their bytes), and a
    buffer still held stays intact while the thread's next call makes a new one."""
    import threading


    threadbuffers.drop_thread_buffers()
    mine = threadbuffers.thread_buffer("test-a", 10_000)
    assert mine.ctypes.data % 4096 == 0 and mine.shape[0] >= 10_000
    assert threadbuffers.thread_buffer("test-a", 5_000).ctypes.data == mine.ctypes.data       # the same, kept
    grown = threadbuffers.thread_buffer("test-a", 3 << 20)
    assert grown.ctypes.data != mine.ctypes.data and threadbuffers.thread_buffer("test-a", 8).ctypes.data == grown.ctypes.data
    big = [threadbuffers.thread_buffer("test-big", 1 << 20, limit=4096) for _ in range(2)]
    assert big[0].ctypes.data != big[1].ctypes.data                                # over its limit: not kept
    theirs: list[np.ndarray] = []
    go = threading.Event()

    def other() -> None:
        theirs.append(threadbuffers.thread_buffer("test-a", 10_000))
        go.wait()

    t = threading.Thread(target=other)
    t.start()
    while not theirs:
        go.wait(0.001)
    assert theirs[0].ctypes.data != grown.ctypes.data
    held = threadbuffers.thread_buffer("test-a", 8)
    held[:4] = [1, 2, 3, 4]
    assert threadbuffers.kept_thread_buffer_bytes() == grown.nbytes + theirs[0].nbytes
    assert threadbuffers.drop_thread_buffers() == grown.nbytes + theirs[0].nbytes        # this thread's and the other's
    assert threadbuffers.kept_thread_buffer_bytes() == 0
    assert list(held[:4]) == [1, 2, 3, 4]                                          # still the holder's
    assert threadbuffers.thread_buffer("test-a", 8).ctypes.data != held.ctypes.data
    go.set()
    t.join()
    threadbuffers.drop_thread_buffers()
