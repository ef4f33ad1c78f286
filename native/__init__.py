"""Thin Python binding over the C++ kernels in `_native` (built by `pip install`).

Kernels: `NativeNeighborSampler` (sampler.cpp; use it through `diskflow.operators.sample`).
"""
from __future__ import annotations

from . import _native

NativeNeighborSampler = _native.NeighborSampler
