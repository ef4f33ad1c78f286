"""crc32 of packed segments, shipped files and checkpoints: zlib's checksum, computed natively.

Every byte the system moves is checksummed when it is written and again when it is read
(docs/design.md, "Formats": a checksum per segment; a shipped file is verified on arrival). zlib's own crc32
runs at about 3 GB/s on this machine's cores, which made checksums a visible share of packing
and of the GPU worker's staging. The native one (`native/crc32.cpp`) folds with carry-less
multiplication where the CPU has it (PCLMULQDQ, VPCLMULQDQ: tens of GB/s, checked at run time),
with the GIL released, and is the checksum packing folds into its gather
(`kernels.gather_rows_crc`); elsewhere a table computes the same values.

``crc32(data, value=0)`` is zlib's signature: the running crc32 of a contiguous buffer.
"""
from __future__ import annotations

from ...native.kernels import crc32, crc32_folds

BACKEND = "folded" if crc32_folds() else "table"

__all__ = ["BACKEND", "crc32"]
