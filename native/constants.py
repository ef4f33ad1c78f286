"""The native engine's named constants, defined once in C++ (`native/constants.h`) and read here.

Python code takes these numbers from here instead of restating them: the reader's defaults
(`native/reader.py`), the loader's row-read buffers and memory budget (`operators/train/loader.py`,
`operators/train/memory.py`), the on-disk formats' padding (`operators/formats/npyio.py`, `directwrite.py`).
"""
from __future__ import annotations

from . import _native

ALIGN: int = int(_native.ALIGN)
"""O_DIRECT granularity: offsets, lengths and buffer addresses of direct reads are multiples of it,
and the on-disk formats pad their array data to it."""

SECTOR: int = int(_native.SECTOR)
"""The smallest unit `read_rows` may read in (a reader's `unit_bytes`): a 512-byte sector, where the
device's direct-I/O alignment allows it."""

MAX_REQUEST_BYTES: int = int(_native.MAX_REQUEST_BYTES)
"""The reader splits larger requests (io_uring's length field is 32 bits)."""

DEFAULT_QUEUE_DEPTH: int = int(_native.DEFAULT_QUEUE_DEPTH)
"""Requests in flight with io_uring (the ring size) unless a reader is told otherwise."""

DEFAULT_THREADS: int = int(_native.DEFAULT_THREADS)
"""pread threads (requests in flight with the pread fallback) unless a reader is told otherwise."""

DEFAULT_MERGE_BYTES: int = int(_native.DEFAULT_MERGE_BYTES)
"""`read_rows` merges adjacent pages into requests of at most this many bytes."""

DEFAULT_BOUNCE_BYTES: int = int(_native.DEFAULT_BOUNCE_BYTES)
"""`read_rows`' staging buffer; larger page sets are read in several rounds. Memory budgets count it."""

BELADY_NO_USE: int = int(_native.BELADY_NO_USE)
"""A Belady trace's int32 `next_use` / `first_use` of a node with no use in the window (2**31 - 1)."""

__all__ = ["ALIGN", "BELADY_NO_USE", "DEFAULT_BOUNCE_BYTES", "DEFAULT_MERGE_BYTES", "DEFAULT_QUEUE_DEPTH",
           "DEFAULT_THREADS", "MAX_REQUEST_BYTES", "SECTOR"]
