"""crc32 of packed segments, shipped files and checkpoints: zlib's checksum, computed fast.

Every byte the system moves is checksummed when it is written and again when it is read
(DESIGN.md: a checksum per segment; a shipped file is verified on arrival). zlib's own crc32
runs at about 3 GB/s on this machine's cores, which made checksums a visible share of packing
and of the GPU worker's staging; ISA-L's (the `isal` package: carry-less multiply folding)
computes the same values at about 30 GB/s. Without `isal` the values come from zlib: the files
are the same either way.

``crc32(data, value=0)`` is zlib's signature: the running crc32 of a contiguous buffer.
"""
from __future__ import annotations

try:
    from isal.isal_zlib import crc32
    BACKEND = "isal"
except ImportError:         # pragma: no cover - isal is a dependency; zlib gives the same values
    from zlib import crc32
    BACKEND = "zlib"

__all__ = ["BACKEND", "crc32"]
