"""`flow.allocator.reuse_for_preparation`: large blocks come from the heap while a prepare runs, and are
mapped again once the last block ends (read from glibc's own counters, ``mallinfo2``).

Each case runs in a fresh process (this file run as a script, naming the case): the allocator's settings and
counters belong to the whole process, and a test process that ran other tests before may hold threads that
free mapped blocks between two readings, or a preparation still running on a leftover cluster's thread."""
from __future__ import annotations

import ctypes
import subprocess
import sys
import threading

import pytest
from diskflow.flow import allocator

LARGE = 48 << 20     # above glibc's largest mmap threshold (32 MiB): mapped unless mapping is off


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _libc() -> ctypes.CDLL:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        pytest.skip("not glibc >= 2.33 (no mallinfo2)")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


def _mapped_blocks_after_malloc(libc: ctypes.CDLL) -> int:
    """Mapped blocks (``hblks``) gained by one large malloc, made and freed on this thread."""
    before = libc.mallinfo2().hblks
    p = libc.malloc(LARGE)
    assert p
    try:
        return int(libc.mallinfo2().hblks - before)
    finally:
        libc.free(p)


def _in_a_fresh_process(case: str) -> None:
    """Run `case` (a function of this module) in a new interpreter; its assertion, if any, fails the test."""
    r = subprocess.run([sys.executable, __file__, case], capture_output=True, text=True, timeout=120, check=False)
    if r.returncode == 5:
        pytest.skip(r.stdout.strip())
    assert r.returncode == 0, r.stderr[-3000:]


def test_large_blocks_come_from_the_heap_only_inside_the_block() -> None:
    _in_a_fresh_process("large_blocks_come_from_the_heap_only_inside_the_block")


def test_concurrent_prepares_restore_once_the_last_ends() -> None:
    _in_a_fresh_process("concurrent_prepares_restore_once_the_last_ends")


def large_blocks_come_from_the_heap_only_inside_the_block() -> None:
    libc = _libc()
    assert _mapped_blocks_after_malloc(libc) == 1
    with allocator.reuse_for_preparation() as applied:
        assert applied
        assert _mapped_blocks_after_malloc(libc) == 0
        with allocator.reuse_for_preparation():          # nested: the inner end leaves the outer in force
            pass
        assert _mapped_blocks_after_malloc(libc) == 0
    assert _mapped_blocks_after_malloc(libc) == 1


def concurrent_prepares_restore_once_the_last_ends() -> None:
    libc = _libc()
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with allocator.reuse_for_preparation():
            entered.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    try:
        assert entered.wait(10)
        with allocator.reuse_for_preparation():
            pass
        assert _mapped_blocks_after_malloc(libc) == 0     # the other prepare still runs
    finally:
        release.set()
        t.join()
    assert _mapped_blocks_after_malloc(libc) == 1


if __name__ == "__main__":
    try:
        globals()[sys.argv[1]]()
    except pytest.skip.Exception as e:      # no mallinfo2 here
        print(e.msg)
        sys.exit(5)
