"""The native engine (C++17, built by `pip install` into `_native`) and its thin Python wrappers.

Layout: engine files over raw pointers with their headers (`reader`, `uring`, `sampler`,
`belady`, `rows`, `constants.h`), one binding file (`bindings.cpp`: array checks, GIL release,
errors mapped to Python's), and the wrappers below. Code outside `native/` imports the wrappers,
never `_native` (a test keeps it so).

Modules:
    kernels: the sampler, the Belady planner and the row copies.
    reader: the direct-I/O reader (`DirectReader`, `aligned_empty`, `ShortReadError`).
    constants: the engine's named constants (alignment, the reader's defaults).
"""
from __future__ import annotations

from . import constants
from .kernels import NeighborSampler, copy_rows

NativeNeighborSampler = NeighborSampler
"""The native sampler (operators use `diskflow.operators.prepare.sample.NeighborSampler`)."""

__all__ = ["NativeNeighborSampler", "NeighborSampler", "constants", "copy_rows"]
